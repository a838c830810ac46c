"""A prompt's length in tokens as the model sees it, image tokens included, and the length filter that drops (never
cuts) the prompts that are too long.

`prompt_tokens()` measures one prompt with the processor; `LengthMeter` measures many fast, learning each image size's
token count once; `filter_by_length()` drops and counts the prompts past `[data] max_prompt_tokens` and records each
kept prompt's length (`LENGTH_COLUMN`), whose maximum `longest_prompt()` reads.
"""

from __future__ import annotations

import io

from vlrl.base.images import load_image, undecoded
from vlrl.model.prompts import render_prompt, row_images, row_video, video_kwargs


def prompt_tokens(processor, row: dict) -> int:
    """The prompt's length in tokens as the model sees it, image and video tokens included (the processor expands
    them, a video's frame timestamps too)."""
    text = processor.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
    images, video = row_images(row), row_video(row)
    inputs = processor(text=[text], images=images or None, return_tensors="pt",
                       **video_kwargs([video] if video else None))
    return int(inputs["input_ids"].shape[1])


LENGTH_COLUMN = "prompt_tokens"  # each prompt's measured length, set by filter_by_length


class LengthMeter:
    """`prompt_tokens`, fast: the processor runs on the first two prompts with each image size; after that a prompt
    costs one tokenizer call plus the image tokens learned for its sizes.

    A processor changes the text only by expanding each image placeholder into that image's tokens, and an image's
    token count depends on its size alone (for Qwen3-VL: its patch grid). The second measurement per size checks that
    this holds for the processor at hand; if it ever does not, every prompt is measured with the processor.
    """

    def __init__(self, processor):
        self.processor = processor
        self.tokenizer = getattr(processor, "tokenizer", processor)
        self.image_tokens: dict[tuple, int] = {}  # image size -> tokens it adds beyond its placeholder
        self.checked: set[tuple] = set()
        self.exact_only = False

    def __call__(self, row: dict) -> int:
        """The prompt length of a TRL row; its images may be PIL images or undecoded `{"bytes", "path"}` values."""
        if row_video(row) is not None:  # a video's tokens depend on its frames' count and size: measured each time
            return prompt_tokens(self.processor, row)
        text = render_prompt(row, self.processor)
        sizes = [picture_size(image) for image in row_images(row)]
        if self.exact_only or any(size not in self.checked for size in sizes):
            return self._measure(row, text, sizes)
        return len(self.tokenizer(text)["input_ids"]) + sum(self.image_tokens[s] for s in sizes)

    def _measure(self, row: dict, text: str, sizes: list) -> int:
        decoded = row_images(row, decode=True)
        exact = prompt_tokens(self.processor, {"prompt": row["prompt"], "images": decoded})
        if self.exact_only:
            return exact
        unknown = {s for s in sizes if s not in self.image_tokens}
        base = len(self.tokenizer(text)["input_ids"])
        if len(unknown) == 1 and sizes.count(next(iter(unknown))) == 1:
            size = unknown.pop()
            self.image_tokens[size] = exact - base - sum(self.image_tokens[s] for s in sizes if s != size)
        elif not unknown:  # a second look at known sizes: does the shortcut give the processor's count?
            if base + sum(self.image_tokens[s] for s in sizes) == exact:
                self.checked.update(sizes)
            else:
                self.exact_only = True
        return exact


def picture_size(image) -> tuple:
    """An image's (width, height); for an undecoded value, from its header alone (no pixels are decoded)."""
    if hasattr(image, "size"):
        return tuple(image.size)
    from PIL import Image

    if isinstance(image, dict) and image.get("bytes"):
        with Image.open(io.BytesIO(image["bytes"])) as opened:
            return opened.size
    return load_image(image).size


def filter_by_length(dataset, processor, max_prompt_tokens: int, *, report=None,
                     part: str = "train"):
    """Drops prompts longer than `max_prompt_tokens`, measured with the processor (image tokens included).

    TRL 1.x has no `max_prompt_length`, and truncating a multimodal prompt cuts through image tokens ("Image
    features and image tokens do not match"), so over-long prompts are dropped whole and counted, never cut.

    Args:
        dataset: TRL prompt rows (`to_dataset`).
        processor: the model's processor.
        max_prompt_tokens: the longest prompt kept.
        report: a `vlrl.data.DataReport` to count the drops in, under `part`.
        part: "train", "eval", ...

    Returns:
        (kept dataset, number dropped). A `datasets.Dataset` comes back with a `prompt_tokens` column: each kept
        prompt's measured length.
    """
    meter = LengthMeter(processor)
    keep, lengths = [], []
    rows = undecoded(dataset) if hasattr(dataset, "features") else dataset  # sizes come from headers: no decoding
    for index, row in enumerate(rows):
        length = meter(row)
        if length <= max_prompt_tokens:
            keep.append(index)
            lengths.append(length)
        elif report is not None:
            report.skip("too_long", row["id"], f"{length} prompt tokens > {max_prompt_tokens}")
    dropped = len(dataset) - len(keep)
    if report is not None:
        report.max_prompt_tokens = max_prompt_tokens
        report.too_long[part] = report.too_long.get(part, 0) + dropped
    kept = dataset if not dropped else dataset.select(keep)
    if hasattr(kept, "add_column"):
        if LENGTH_COLUMN in kept.column_names:  # filtered again: this measurement replaces the last
            kept = kept.remove_columns(LENGTH_COLUMN)
        kept = kept.add_column(LENGTH_COLUMN, lengths)
    return kept, dropped


def longest_prompt(dataset) -> int | None:
    """The longest prompt of a length-filtered dataset, in tokens (None before `filter_by_length`)."""
    if LENGTH_COLUMN not in getattr(dataset, "column_names", ()) or not len(dataset):
        return None
    return max(dataset[LENGTH_COLUMN])
