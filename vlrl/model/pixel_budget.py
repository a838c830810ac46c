"""The pixel budget per picture (`[data] min_pixels` / `max_pixels`), set on a processor as Qwen's own resizing takes
it, and what it costs: the image tokens per item.

Qwen-VL's image processor scales each picture, aspect kept, to a multiple of its merged patch (32 px for Qwen3-VL)
whose area lies between `size["shortest_edge"]` and `size["longest_edge"]` (transformers 5.x's names for qwen-vl-utils'
`min_pixels` and `max_pixels`; `smart_resize`). `set_pixel_budget` sets those two on the processor a run loads, so
every path that calls it (rollouts, the training forward, evals, the length filter, the exported processor) resizes
alike; `image_tokens_per_item` counts what a budget gives, for `vlrl data inspect`.

    >>> budget_problem(4096, 1024)
    '[data] min_pixels = 4096 is more than max_pixels = 1024: ...'
"""

from __future__ import annotations

import dataclasses
import statistics

MERGED_PATCH = 32  # Qwen3-VL's 16 px patches merged 2x2: the smallest step of a resized side


def budget_problem(min_pixels: int, max_pixels: int) -> str | None:
    """What is wrong with a budget, in one line a user can act on; None when it is usable (0 leaves a bound as the
    processor has it).

    >>> budget_problem(0, 0) is None, budget_problem(32 * 32, 512 * 512) is None
    (True, True)
    """
    if min_pixels < 0 or max_pixels < 0:
        return (f"[data] min_pixels = {min_pixels} and max_pixels = {max_pixels} must be 0 (the processor's own) or "
                "a number of pixels, e.g. max_pixels = 262144 (512 x 512).")
    if min_pixels and max_pixels and min_pixels > max_pixels:
        return (f"[data] min_pixels = {min_pixels} is more than max_pixels = {max_pixels}: no picture size lies "
                "between them; lower min_pixels or raise max_pixels.")
    if max_pixels and max_pixels < MERGED_PATCH ** 2:
        return (f"[data] max_pixels = {max_pixels} is less than one merged patch ({MERGED_PATCH} x {MERGED_PATCH} = "
                f"{MERGED_PATCH ** 2} pixels); every picture would still take one; use {MERGED_PATCH ** 2} or more.")
    return None


def set_pixel_budget(processor, min_pixels: int = 0, max_pixels: int = 0) -> dict:
    """Sets the budget on `processor`'s image processor (in place, once, right after loading it) and returns the
    bounds now in force, `{"min_pixels", "max_pixels"}`. A bound of 0 keeps the processor's own.

    Raises:
        ConfigError: the budget is unusable (`budget_problem`), or a bound given contradicts the processor's other.
    """
    from vlrl.base.errors import ConfigError

    problem = budget_problem(min_pixels, max_pixels)
    image_processor = getattr(processor, "image_processor", None)
    size = getattr(image_processor, "size", None)
    if problem is None and (min_pixels or max_pixels) and size is None:
        problem = (f"[data] min_pixels / max_pixels set, but {type(processor).__name__} has no image processor with "
                   "a size to set them on; leave them 0 for this model.")
    if problem:
        raise ConfigError(problem)
    if size is None:
        return {}
    low, high = min_pixels or _bound(size, "shortest_edge"), max_pixels or _bound(size, "longest_edge")
    if low and high and low > high:  # one bound given, past the processor's other
        raise ConfigError(f"[data] min_pixels / max_pixels give {low} .. {high} pixels with the processor's own other "
                          "bound: no picture size lies between them; set both.")
    if min_pixels or max_pixels:
        if dataclasses.is_dataclass(size):
            image_processor.size = dataclasses.replace(size, shortest_edge=low, longest_edge=high)
        else:
            image_processor.size = {**size, "shortest_edge": low, "longest_edge": high}
    return {"min_pixels": low, "max_pixels": high}


def _bound(size, key: str) -> int:
    value = size.get(key) if isinstance(size, dict) else getattr(size, key, None)
    return int(value or 0)


def image_tokens(processor, image) -> int:
    """The tokens one picture becomes in the prompt under the processor's budget: its patch grid, merged."""
    image_processor = processor.image_processor
    grid = image_processor(images=[image], return_tensors="pt")["image_grid_thw"][0]
    return int(grid.prod()) // int(getattr(image_processor, "merge_size", 2)) ** 2


def image_tokens_per_item(processor, rows) -> dict:
    """The image tokens of each item (all its pictures together) under the processor's budget, summarized: `{"items",
    "min", "median", "max", "min_pixels", "max_pixels"}` (the last two: the budget in force). A picture's count
    depends only on its size, read from its header, so each size is measured once.

    Args:
        processor: the model's processor (its budget set: `set_pixel_budget`).
        rows: canonical or TRL rows, their pictures decoded or not (`vlrl.model.prompts.row_images` reads them).
    """
    from vlrl.model.lengths import picture_size
    from vlrl.model.prompts import row_images

    by_size: dict[tuple, int] = {}
    per_item = []
    for row in rows:
        total = 0
        for image in row_images(row):
            size = picture_size(image)
            if size not in by_size:
                by_size[size] = image_tokens(processor, _decoded(image))
            total += by_size[size]
        per_item.append(total)
    size = getattr(getattr(processor, "image_processor", None), "size", None)
    bounds = {"min_pixels": _bound(size, "shortest_edge"), "max_pixels": _bound(size, "longest_edge")} if size else {}
    if not per_item:
        return {"items": 0, "min": 0, "median": 0, "max": 0, **bounds}
    median = statistics.median(per_item)  # a half between two counts, else a whole count
    return {"items": len(per_item), "min": min(per_item), "median": int(median) if median == int(median) else median,
            "max": max(per_item), **bounds}


def _decoded(image):
    from vlrl.base.images import load_image

    return image if hasattr(image, "size") else load_image(image)


def video_budget_problem(video_max_pixels: int) -> str | None:
    """What is wrong with `[data] video_max_pixels` (a clip's pixels, all its frames together), in one line; None
    when it is usable (0: the video processor's own).

    >>> video_budget_problem(0) is None, video_budget_problem(8 * 64 * 64) is None, video_budget_problem(1024)[:40]
    (True, True, '[data] video_max_pixels = 1024 is less t')
    """
    if video_max_pixels < 0:
        return (f"[data] video_max_pixels = {video_max_pixels} must be 0 (the video processor's own) or a number of "
                "pixels over a clip's frames, e.g. 16 frames of 256 x 256: 1048576.")
    if video_max_pixels and video_max_pixels < 2 * MERGED_PATCH ** 2:
        return (f"[data] video_max_pixels = {video_max_pixels} is less than one merged patch of two frames (2 x "
                f"{MERGED_PATCH} x {MERGED_PATCH} = {2 * MERGED_PATCH ** 2} pixels), the least a clip takes; use "
                f"{2 * MERGED_PATCH ** 2} or more.")
    return None


def set_video_budget(processor, video_max_pixels: int) -> dict:
    """Sets `video_max_pixels` on `processor`'s video processor (its `size["longest_edge"]`: Qwen-VL scales a clip,
    aspect kept, so that frames x height x width is at most that) and returns the bounds now in force,
    `{"video_min_pixels", "video_max_pixels"}` ({} for a processor without a video processor and no budget).

    Raises:
        ConfigError: the budget is unusable, below the processor's own lower bound, or set for a processor that
            takes no video.
    """
    from vlrl.base.errors import ConfigError

    problem = video_budget_problem(video_max_pixels)
    if problem:
        raise ConfigError(problem)
    video_processor = getattr(processor, "video_processor", None)
    size = getattr(video_processor, "size", None)
    if size is None:
        if video_max_pixels:
            raise ConfigError(f"[data] video_max_pixels is set, but {type(processor).__name__} has no video processor: "
                              "this model takes no video; leave it 0.")
        return {}
    low = _bound(size, "shortest_edge")
    if video_max_pixels and low > video_max_pixels:
        raise ConfigError(f"[data] video_max_pixels = {video_max_pixels} is below the video processor's own lower "
                          f"bound ({low} pixels a clip): no clip size lies between them; raise video_max_pixels.")
    if video_max_pixels:
        if dataclasses.is_dataclass(size):
            video_processor.size = dataclasses.replace(size, longest_edge=video_max_pixels)
        else:
            video_processor.size = {**size, "longest_edge": video_max_pixels}
    return {"video_min_pixels": low, "video_max_pixels": _bound(video_processor.size, "longest_edge")}


def check_takes_video(processor, what: str) -> None:
    """Refuses, in one line, videos for a processor without a video path (a family that takes none)."""
    if getattr(processor, "video_processor", None) is None:
        from vlrl.base.errors import ConfigError

        raise ConfigError(f"{what} holds videos, but {type(processor).__name__} has no video processor: this model "
                          "takes no video; use a family that does (Qwen3-VL, Qwen3.5, Qwen2.5-VL) or drop the video "
                          "column.")


def video_tokens(processor, video) -> int:
    """The tokens one clip ((frames, metadata), `vlrl.model.prompts.row_video`) becomes under the processor's video
    budget: its patch grid over time, merged (frame timestamps not counted)."""
    from vlrl.model.prompts import video_kwargs

    grid = processor.video_processor(**video_kwargs([video]), return_tensors="pt")["video_grid_thw"][0]
    return int(grid.prod()) // int(getattr(processor.video_processor, "merge_size", 2)) ** 2


def video_tokens_line(processor, rows) -> str:
    """What the clips of `rows` cost under the video budget, in one line (the data stage prints it): each clip's tokens
    (`video_tokens`), min, median and max, and the budget in force."""
    from vlrl.model.prompts import row_video

    counts = [video_tokens(processor, clip) for clip in map(row_video, rows) if clip]
    size = getattr(processor.video_processor, "size", None)
    median = statistics.median(counts) if counts else 0
    return (f"video tokens per clip: min {min(counts, default=0)}, median {median:g}, max {max(counts, default=0)} "
            f"({len(counts)} clips; video pixel budget {_bound(size, 'shortest_edge')} .. "
            f"{_bound(size, 'longest_edge')})")
