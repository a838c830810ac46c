"""Does a gain need the picture? The held-out items re-scored with each picture taken away, and how much of the
before/after gain survives.

    vlrl eval --run-dir R --images blank                       # the base model   -> R/eval_base_blank.jsonl
    vlrl eval --run-dir R --adapter R/adapter --images blank   # the trained one  -> R/eval_adapter_blank.jsonl
    vlrl compare R/eval_before.jsonl R/eval_after.jsonl        # + "without the picture (blank)" when both are there

`blank` replaces every picture by a uniform mid-gray one of the same size (the same number of image tokens, no
content); `shuffled` gives each item another item's picture (a seeded derangement among the items with as many
pictures, so none keeps its own; an item alone with its count of pictures cannot be shuffled and is left out,
counted); `first` keeps each item's first picture and blanks the others (an item of several pictures seen through one
of them; not a coin flip for every task: `two_chart_compare`'s first chart alone predicts 88.9% of its answers,
`two_chart_same`'s none).

An item's video is taken away alike: `blank` grays every frame, `shuffled` gives it another item's clip (with that
clip's frame rate and indices, among the clips of as many frames), and `still` shows one frame: the clip's middle
frame (index (n - 1) // 2 of its n kept frames) held for the clip's whole length, so the clip keeps its frame count,
timestamps and video tokens and loses only its motion. `first` is for pictures and `still` for clips: each refuses
items of the other kind in one line. A gain that survives a blank or a wrong picture was learned from the text: the
answer format, the answer prior of the task, a guess that happens to fit. `picture_check` measures what survives: the
gain with and without the right picture, the exact McNemar test of the gain without it, and a paired sign-flip
permutation test of the per-item difference between the two gains (does the gain depend on the picture?).
"""

from __future__ import annotations

import random
from pathlib import Path

from vlrl.base.stats import mcnemar_exact, paired_permutation
from vlrl.evaluation.compare import by_id

MODES = ("blank", "shuffled", "first", "still")
# How `vlrl compare` names each mode's eval: what the model saw of an item's pictures, or of its clip
SEEN = {"blank": "without the picture (blank)", "shuffled": "without the picture (shuffled)",
        "first": "with the first picture alone (the others blank)"}
SEEN_CLIP = {"blank": "without the clip (every frame blank)", "shuffled": "without the clip (another item's)",
             "still": "with one frame of the clip (its middle frame held)"}
GRAY = (128, 128, 128)  # the blank picture's colour: no edges, no content, mid-range for any normalisation


def replace_pictures(dataset, mode: str, *, seed: int = 0, log=print):
    """`dataset` (TRL prompt rows with an `image`, `images` or `video` column) with every picture, or every clip,
    taken away as `mode` says (the module docstring).

    Returns the new dataset; with "shuffled", rows that cannot get another row's pictures (or clip) are left out and
    counted in one log line. A mode that does not fit the items (`first` on clips, `still` on pictures) is a
    ConfigError naming the one that does.

    >>> import datasets
    >>> from PIL import Image
    >>> rows = datasets.Dataset.from_list([{"id": str(i), "image": Image.new("RGB", (8, 4), (i, 0, 0))}
    ...                                    for i in range(3)])
    >>> blank = replace_pictures(rows, "blank")
    >>> blank[0]["image"].size, blank[0]["image"].getpixel((0, 0))
    ((8, 4), (128, 128, 128))
    >>> [row["image"].getpixel((0, 0))[0] for row in replace_pictures(rows, "shuffled", seed=1)]
    [1, 2, 0]
    >>> pairs = datasets.Dataset.from_list([{"id": "0", "images": [Image.new("RGB", (8, 4), c) for c in ("red", "blue")]}])
    >>> [im.getpixel((0, 0)) for im in replace_pictures(pairs, "first")[0]["images"]]
    [(255, 0, 0), (128, 128, 128)]
    >>> clip = datasets.Dataset.from_list([{"id": "0", "video": [Image.new("RGB", (8, 4), (k, 0, 0)) for k in range(4)],
    ...                                     "video_metadata": {"fps": 4.0}}])
    >>> [im.getpixel((0, 0))[0] for im in replace_pictures(clip, "still")[0]["video"]]
    [1, 1, 1, 1]
    """
    from PIL import Image

    from vlrl.base.errors import ConfigError
    from vlrl.base.images import load_image
    from vlrl.model.prompts import row_images, row_video

    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is not one of {MODES}")
    videos = [row_video(row) for row in dataset] if "video" in dataset.column_names else [None] * len(dataset)
    clips = any(video is not None for video in videos)
    if clips and any(row_images(row) for row in dataset):
        raise ConfigError("--images takes away the items' pictures or their clips, and these items mix both: "
                          "evaluate the items with pictures and those with clips as two data sets.")
    if clips and mode == "first":
        raise ConfigError("--images first keeps an item's first picture, and these items have clips: --images still "
                          "keeps one frame of each clip (its middle frame, held for the clip's length).")
    if not clips and mode == "still":
        raise ConfigError("--images still holds one frame of each item's clip, and these items have no clip: "
                          "--images first keeps an item's first picture alone.")
    column = "video" if clips else "images" if "images" in dataset.column_names else "image"
    pictures = ([[load_image(frame) for frame in video[0]] if video else [] for video in videos] if clips else
                [row_images(row, decode=True) for row in dataset])
    metadata = [video[1] if video else None for video in videos]
    if mode in ("blank", "first"):
        kept = 1 if mode == "first" else 0
        new = [images[:kept] + [Image.new("RGB", im.size, GRAY) for im in images[kept:]] for images in pictures]
        keep = list(range(len(pictures)))
    elif mode == "still":
        new = [[frames[(len(frames) - 1) // 2]] * len(frames) if frames else [] for frames in pictures]
        keep = list(range(len(pictures)))
    else:
        source = _derangement([len(images) for images in pictures], seed)
        keep = [i for i in range(len(pictures)) if source[i] is not None]
        left = len(pictures) - len(keep)
        what = "clips" if clips else "pictures"
        if left:
            log(f"shuffled {what}: {left} of {len(pictures)} items left out (no other item has as many "
                f"{'frames' if clips else 'pictures'})")
        new = [pictures[source[i]] if source[i] is not None else None for i in range(len(pictures))]
        # a clip moves with its frame rate and indices: the timestamps it was shot at
        metadata = [metadata[source[i]] if source[i] is not None else None for i in range(len(pictures))]
    dataset = dataset.select(keep)
    values = [{column: new[i] if column != "image" else (new[i][0] if new[i] else None)} for i in keep]
    if clips and mode == "shuffled":
        values = [{**v, "video_metadata": metadata[i]} for v, i in zip(values, keep)]
    # encoded by the column's own feature; a fingerprint of our own, so datasets does not hash every picture
    return dataset.map(lambda _, i: values[i], with_indices=True, load_from_cache_file=False,
                       new_fingerprint=f"{dataset._fingerprint}-pictures-{mode}-{seed}", desc=f"pictures: {mode}")


def _derangement(counts: list[int], seed: int) -> list[int | None]:
    """For each row, another row with as many pictures (never itself; None where no such row exists).

    >>> _derangement([1, 1, 2, 1], seed=0)[2] is None
    True
    """
    rng = random.Random(seed)
    source: list[int | None] = [None] * len(counts)
    groups: dict[int, list[int]] = {}
    for i, n in enumerate(counts):
        if n:
            groups.setdefault(n, []).append(i)
    for rows in groups.values():
        if len(rows) < 2:
            continue
        shifted = rows[:]
        rng.shuffle(shifted)
        for a, b in zip(shifted, shifted[1:] + shifted[:1]):  # a cycle through every row: nobody keeps its own
            source[a] = b
    return source


def picture_check(before, after, before_without, after_without, mode: str) -> dict:
    """How much of the before/after gain survives without the right picture.

    Args:
        before, after: the run's eval records (or JSONL paths) of the two models, with the pictures.
        before_without, after_without: the same models' records with the pictures taken away (`mode`).

    Returns:
        `mode`, `clip` (the items had clips), `seen` (what the model saw, as `vlrl compare` says it), `n_paired` (items in all four), `gain` and `gain_without` (accuracy after - before, with and without
        the picture), `surviving_share` (gain_without / gain; None when there was no gain), `p_without` (exact
        McNemar of the gain without the picture), `p_needs_picture` (paired sign-flip permutation test of each
        item's gain with the picture minus its gain without).

    >>> rec = lambda i, ok: {"id": i, "correct": ok, "format_ok": True}
    >>> before, after = [rec(i, False) for i in range(10)], [rec(i, True) for i in range(10)]
    >>> c = picture_check(before, after, before, [rec(i, i < 2) for i in range(10)], "blank")
    >>> c["gain"], c["gain_without"], c["surviving_share"], round(c["p_needs_picture"], 4)
    (1.0, 0.2, 0.2, 0.0078)
    """
    sides = [by_id(records, name) for records, name in ((before, "before"), (after, "after"),
                                                         (before_without, f"before ({mode})"),
                                                         (after_without, f"after ({mode})"))]
    ids = [i for i in sides[0] if all(i in side for side in sides[1:])]
    right = [[bool(side[i]["correct"]) for i in ids] for side in sides]
    n = len(ids)
    gain = (sum(right[1]) - sum(right[0])) / n if n else None
    gain_without = (sum(right[3]) - sum(right[2])) / n if n else None
    per_item = [(a - b) - (aw - bw) for b, a, bw, aw in zip(*right)]
    clip = any("video" in record for record in sides[0].values())  # the eval records of clips say which clip
    return {"mode": mode, "clip": clip, "seen": (SEEN_CLIP if clip else SEEN)[mode], "n_paired": n, "gain": gain,
            "gain_without": gain_without,
            "surviving_share": gain_without / gain if gain else None,
            "p_without": mcnemar_exact(sum(not b and a for b, a in zip(right[2], right[3])),
                                       sum(b and not a for b, a in zip(right[2], right[3]))),
            "p_needs_picture": paired_permutation(per_item)}


def with_picture_checks(comparison: dict, before: str | Path, after: str | Path) -> dict:
    """`comparison` with `without_picture` ({mode: `picture_check`}) for each mode whose two evals lie beside the
    after file (`eval_base_<mode>.jsonl` and `eval_adapter_<mode>.jsonl`, as `vlrl eval --images` writes them;
    beside a sampled `samples_after.jsonl`, `samples_base_<mode>.jsonl` and `samples_adapter_<mode>.jsonl`)."""
    if comparison.get("kind") == "episodes":
        return comparison
    folder = Path(after).parent
    prefix = "samples" if Path(after).name.startswith("samples_") else "eval"
    checks = {}
    for mode in MODES:
        base, adapter = folder / f"{prefix}_base_{mode}.jsonl", folder / f"{prefix}_adapter_{mode}.jsonl"
        if base.exists() and adapter.exists():
            checks[mode] = picture_check(before, after, base, adapter, mode)
    return {**comparison, "without_picture": checks} if checks else comparison


def summary_lines(comparison: dict) -> list[str]:
    """One line per picture check, as `vlrl compare` prints them."""
    lines = []
    for mode, c in comparison.get("without_picture", {}).items():
        share = "n/a (no gain)" if c["surviving_share"] is None else f"{c['surviving_share']:.0%}"
        seen, what = c.get("seen", SEEN.get(mode, mode)), "clip" if c.get("clip") else "picture"
        lines.append(f"{seen}: gain {c['gain_without']:+.1%} against {c['gain']:+.1%} with it on {c['n_paired']} "
                     f"items, {share} of it survives (McNemar p = {c['p_without']:.3g}); does the gain need the "
                     f"{what}? paired permutation p = {c['p_needs_picture']:.3g}: "
                     f"{'yes' if c['p_needs_picture'] < 0.05 else 'not shown'}")
    return lines
