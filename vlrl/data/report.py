"""The data report: what a load kept, skipped (by reason, with examples), converted and dropped.

`SKIP_REASONS` names every reason a row can be skipped for; `DataReport` counts them, and a run saves it as
data_report.json. Every loader of this package fills one, so bad input is a counted skip, never a silent one.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

# Every reason a row can be skipped for, with what it means. DataReport counts these.
SKIP_REASONS = {
    "invalid_record": "the record itself is unreadable (a JSON line that does not parse or is not UTF-8, not an "
                      "object)",
    "missing_question": "no question text, or an empty one",
    "missing_answer": "no gold answer, or an empty one",
    "non_numeric_answer": "numeric_only: the answer (or a multi-choice option) is not a number",
    "answer_not_in_choices": "a multi-choice gold answer that is none of its choices (unscoreable)",
    "duplicate_id": "a second row with an id already seen",
    "missing_image": "no image at all",
    "image_placeholder_mismatch": "the prompt's <image> placeholders do not match the number of images",
    "image_not_found": "an image path that does not exist",
    "image_path_outside_dataset": "an image path that escapes the data set's directory (../, absolute, symlink)",
    "image_too_large": "an image over the byte cap or over Pillow's pixel limit (decompression bomb)",
    "image_truncated": "an image file cut short",
    "image_unreadable": "an image that no decoder reads (corrupt bytes, bad base64, unknown format)",
    "image_empty": "an image with zero width or height",
    "unsupported_image": "an image value of a type vlrl does not read (a URL, a number, ...)",
    "missing_video": "the video column is empty or absent",
    "video_placeholder_mismatch": "the prompt has more than one <video> placeholder for the item's one video",
    "video_not_found": "a video path that does not exist",
    "video_path_outside_dataset": "a video path that escapes the data set's directory (../, absolute, symlink)",
    "video_unreadable": "a video file no decoder reads (corrupt, cut short, not a video)",
    "video_no_frames": "a video (or list of frames) that decodes to no frame",
    "video_with_images": "an item with a video and pictures too (an item trains on its clip alone)",
    "too_long": "the prompt, image tokens included, is longer than max_prompt_tokens",
}

# Items a split drops after loading (`split_holdout`, `drop_eval_overlap`): the DataReport key -> what it means.
SPLIT_DROPS = {
    "train_dropped_same_id": "training items with a held-out item's id",
    "train_dropped_same_image": "training items that show a held-out item's picture (no eval picture is trained on)",
    "train_dropped_same_question": "training items that ask an eval item's question with its answer",
    "eval_excluded_seen_image": "the warm start trained on their picture, so they train only",
}


@dataclass
class DataReport:
    """What a load kept, skipped (by reason, with examples), converted and dropped; saved as data_report.json.

    >>> report = DataReport(source="demo", rows_read=3, rows_kept=2)
    >>> report.skip("missing_answer", "7", "'answer' is None")
    >>> report.skipped, report.examples["missing_answer"]
    ({'missing_answer': 1}, ["7: 'answer' is None"])
    """

    source: str
    split: str | None = None
    rows_read: int = 0
    rows_kept: int = 0
    skipped: dict = field(default_factory=dict)  # reason -> count
    examples: dict = field(default_factory=dict)  # reason -> the first few "id: detail"
    max_images: int = 1
    images_dropped: int = 0  # images beyond max_images, removed from items that were kept
    items_with_dropped_images: int = 0
    converted_modes: dict = field(default_factory=dict)  # Pillow mode -> images converted from it to RGB
    image_size: int | None = None
    keep_aspect: bool = False
    numeric_only: bool = True
    max_prompt_tokens: int | None = None
    too_long: dict = field(default_factory=dict)  # "train"/"eval"/... -> prompts dropped by the length filter
    hold_out: dict = field(default_factory=dict)  # what split_holdout did
    eval_source: dict = field(default_factory=dict)  # [eval] source: its load's report and what drop_eval_overlap did
    # The image tokens per item under the processor's pixel budget ({items, min, median, max}), measured when a
    # processor is at hand (`vlrl data inspect`, a run's data stage): what a budget costs, before a run
    image_tokens: dict = field(default_factory=dict)
    trains_on_test_split: str = ""  # the warning when the training source is a known test split (vlrl.data.splits)
    seconds: float = 0.0

    def skip(self, reason: str, item_id, detail: str = "", examples: int = 3) -> None:
        """Counts one skipped row under `reason` and keeps its id and detail among the first few examples."""
        self.skipped[reason] = self.skipped.get(reason, 0) + 1
        shown = self.examples.setdefault(reason, [])
        if len(shown) < examples:
            shown.append(f"{item_id}: {detail[:200]}" if detail else str(item_id))

    @property
    def total_skipped(self) -> int:
        return sum(self.skipped.values())

    def to_dict(self) -> dict:
        return asdict(self)

    def save(self, path: str | Path) -> Path:
        """Writes the report as JSON (in a run directory: data_report.json)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=2, default=str) + "\n")
        return path

    def summary(self) -> str:
        """One line: what was read, kept and skipped, by reason."""
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(self.skipped.items(), key=lambda kv: -kv[1]))
        text = f"{self.source}"
        if self.split:
            text += f" [{self.split}]"
        text += f": kept {self.rows_kept} of {self.rows_read} rows"
        if reasons:
            text += f"; skipped {self.total_skipped} ({reasons})"
        if self.images_dropped:
            text += f"; {self.images_dropped} images over the cap of {self.max_images} dropped"
        if self.converted_modes:
            text += "; converted to RGB: " + ", ".join(f"{k} {v}" for k, v in sorted(self.converted_modes.items()))
        if any(self.too_long.values()):
            text += f"; too long (> {self.max_prompt_tokens} tokens): " + ", ".join(
                f"{k} {v}" for k, v in self.too_long.items())
        return text

    def image_tokens_line(self) -> str:
        """The image tokens per item, in one line.

        >>> DataReport(source="demo", image_tokens={"items": 3, "min": 8, "median": 8, "max": 16}).image_tokens_line()
        'image tokens per item: min 8, median 8, max 16 (3 items)'
        """
        t = self.image_tokens
        budget = f"; pixel budget {t['min_pixels']} .. {t['max_pixels']}" if t.get("max_pixels") else ""
        return f"image tokens per item: min {t['min']}, median {t['median']}, max {t['max']} ({t['items']} items{budget})"

    def drops(self) -> list[str]:
        """Every item the load, the split and the length filter dropped, one line per reason with its count and
        meaning (what a run prints at the end of its data stage); empty when nothing was dropped.

        >>> report = DataReport(source="mine", rows_read=40, rows_kept=39, hold_out={"train_dropped_same_image": 24})
        >>> report.skip("missing_answer", "q7")
        >>> print("\\n".join(report.drops()))
        1 skipped as missing_answer: no gold answer, or an empty one (e.g. q7)
        24 dropped as train_dropped_same_image: training items that show a held-out item's picture (no eval picture is trained on)
        """
        lines = [f"{count} skipped as {reason}: {SKIP_REASONS.get(reason, reason)}"
                 + (f" (e.g. {self.examples[reason][0]})" if self.examples.get(reason) else "")
                 for reason, count in sorted(self.skipped.items(), key=lambda kv: -kv[1])]
        for part in (self.hold_out, self.eval_source.get("overlap") or {}):
            lines += [f"{part[key]} {'never held out' if key.startswith('eval_') else 'dropped'} as {key}: {meaning}"
                      for key, meaning in SPLIT_DROPS.items() if part.get(key)]
        lines += [f"{count} {part} items dropped as too_long: {SKIP_REASONS['too_long']} ({self.max_prompt_tokens})"
                  for part, count in self.too_long.items() if count]
        return lines

    def __str__(self) -> str:
        lines = [self.summary()]
        for reason, shown in self.examples.items():
            lines.append(f"  {reason} ({self.skipped.get(reason, 0)}): {SKIP_REASONS.get(reason, '')}")
            lines.extend(f"    e.g. {example}" for example in shown)
        if self.image_tokens:
            lines.append(f"  {self.image_tokens_line()}")
        if self.hold_out:
            lines.append(f"  hold-out: {self.hold_out}")
        if self.eval_source:
            lines.append(f"  eval source: {self.eval_source.get('summary')}; {self.eval_source.get('overlap')}")
        return "\n".join(lines)
