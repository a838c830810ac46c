"""The canonical schema, and one raw row -> one canonical row, or a counted skip that says why.

Every loader returns rows in one schema (`canonical_features`): `{id, question, image, answer, answer_type,
precision, question_type, choices, unit, metadata}`, + `images` when more than one image per item is kept, +
`system_prompt` when one is set. `Fields` says which raw columns hold what.

`canonical_row` never raises: a row it cannot use comes back empty, with the reason (a key of `SKIP_REASONS`) in its
`_skip` column, so one bad row never stops a `datasets.map` over thousands. `drop_skipped` then counts those
reasons into the `DataReport` and removes them.

    >>> from PIL import Image
    >>> raw = {"question": "How many bars?", "answer": "4", "image": Image.new("RGB", (40, 30))}
    >>> row = canonical_row(raw, 0, fields=Fields(), name="demo", split="train", root=None, numeric_only=True,
    ...                     image_size=32, keep_aspect=False, max_images=1, max_image_bytes=2**20, max_pixels=None,
    ...                     image_format="png", version=PREPROCESS_VERSION)
    >>> row["id"], row["answer_type"], row["_skip"]
    ('demo-train-0', 'integer', None)
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from vlrl.base.errors import DataError
from vlrl.base.images import BadItem, fit_image, load_image
from vlrl.data.report import DataReport
from vlrl.grammar import answers
from vlrl.model.prompts import IMAGE_PLACEHOLDER, VIDEO_PLACEHOLDER

PREPROCESS_VERSION = 3  # part of the datasets cache fingerprint: bump when preprocessing changes its output

# How preprocessed images are stored in the Arrow cache (bench/results/bench_data.md has the measured trade-off).
IMAGE_FORMATS = {
    "png": {"format": "PNG", "compress_level": 1},  # lossless and compact (~10-400 KiB at 512 px); slowest to write
    "bmp": {"format": "BMP"},  # lossless and fastest; 768 KiB per 512x512 image on disk
    "jpeg": {"format": "JPEG", "quality": 95, "subsampling": 0},  # fast and compact; lossy (no chroma subsampling)
}

# What canonical_row adds for drop_skipped: why a row is skipped, images dropped by the cap, modes converted.
_BOOKKEEPING = ["_skip", "_detail", "_dropped", "_modes"]


@dataclass(frozen=True)
class Fields:
    """Which columns of a source hold what (how RLinf and EasyR1 configure a data set).

    Args:
        prompt_key: the question text; `<image>` placeholders in it place the images.
        answer_key: the gold answer.
        image_keys: the column(s) holding the item's image(s): one image or a list of them each.
        id_key: the item id, or a tuple of alternatives (the first present wins); when absent,
            `<name>-<split>-<row index>`.
        first_image_key_only: the image keys are alternatives (the first non-empty wins), as MathVista's
            `decoded_image` (hub) and `image` (a path, in its JSON layout).
        system_prompt: an optional system turn for every prompt.
        choices_key: a multi-choice item's options (a list); absent or empty: a free-form item.
        answer_type_key: the answer's type ("integer", "float", "text"); absent: read from the answer.
        video_key: the column holding the item's video (a file path or a list of frames); None: no video. With one,
            every row needs a video and has no picture.
    """

    prompt_key: str = "question"
    answer_key: str = "answer"
    image_keys: tuple = ("image",)
    id_key: str | tuple | None = "id"
    first_image_key_only: bool = False
    system_prompt: str | None = None
    choices_key: str = "choices"
    answer_type_key: str = "answer_type"
    video_key: str | None = None


def canonical_features(max_images: int, with_system: bool, with_video: bool = False):
    """The `datasets.Features` of canonical rows as `canonical_row` returns them (bookkeeping columns included)."""
    import datasets

    columns = {
        "id": datasets.Value("string"), "question": datasets.Value("string"), "image": datasets.Image(),
        "answer": datasets.Value("string"), "answer_type": datasets.Value("string"),
        "precision": datasets.Value("float64"), "question_type": datasets.Value("string"),
        "choices": datasets.List(datasets.Value("string")), "unit": datasets.Value("string"),
        "metadata": datasets.Json(),
    }
    if max_images > 1:
        columns["images"] = datasets.List(datasets.Image())
    if with_system:
        columns["system_prompt"] = datasets.Value("string")
    if with_video:
        columns.update(video=datasets.List(datasets.Image()), video_metadata=datasets.Json())
    columns.update({"_skip": datasets.Value("string"), "_detail": datasets.Value("string"),
                    "_dropped": datasets.Value("int32"), "_modes": datasets.List(datasets.Value("string"))})
    return datasets.Features(columns)


def canonical_row(example: dict, index: int, *, fields: Fields, name: str, split: str, root, numeric_only: bool,
                  image_size, keep_aspect: bool, max_images: int, max_image_bytes: int, max_pixels,
                  image_format: str, version: int, video_fps: float = 2.0, max_frames: int = 16) -> dict:
    """One raw row -> one canonical row, or an empty row whose `_skip` says why (never an exception).

    The keyword arguments are `load_generic`'s settings; `version` is unused here but part of datasets' cache
    fingerprint of this call (PREPROCESS_VERSION).
    """
    if isinstance(example, Mapping) and not isinstance(example, dict):
        example = dict(example)  # datasets' LazyRow
    if isinstance(example, dict) and "record" in example and len(example) == 1:
        example = example["record"]  # the JSON layout's one-value rows
    if not isinstance(example, dict) or "__invalid__" in example:
        detail = example.get("__invalid__", "") if isinstance(example, dict) else f"a {type(example).__name__}"
        return _skipped(f"{name}-{split}-{index}", "invalid_record", detail, max_images, fields)
    id_keys = (fields.id_key,) if isinstance(fields.id_key, str) else (fields.id_key or ())
    raw_id = next((example[k] for k in id_keys if example.get(k) not in (None, "")), None)
    item_id = str(raw_id) if raw_id not in (None, "") else f"{Path(name).name or name}-{split}-{index}"
    modes: dict = {}
    try:
        row = _canonical_fields(example, fields, numeric_only)
        video = _canonical_video(example, row["question"], fields, root, image_size, video_fps, max_frames,
                                 image_format) if fields.video_key else None
        images, dropped = _canonical_images(example, row["question"], fields, root, image_size, keep_aspect,
                                            max_images, max_image_bytes, max_pixels, modes, image_format,
                                            beside_video=video is not None)
    except BadItem as bad:
        return _skipped(item_id, bad.reason, bad.detail, max_images, fields)
    if dropped:
        row["question"] = _drop_placeholders(row["question"], keep=max_images)
    out = {"id": item_id, **row, "image": images[0] if images else None, "_skip": None, "_detail": None, "_dropped": dropped,
           "_modes": [m for m, n in modes.items() for _ in range(n)]}
    if max_images > 1:
        out["images"] = images
    if fields.system_prompt is not None:
        out["system_prompt"] = fields.system_prompt
    if fields.video_key:
        out["video"], out["video_metadata"] = video
    return out


def _skipped(item_id: str, reason: str, detail: str, max_images: int, fields: Fields) -> dict:
    out = {"id": item_id, "question": None, "image": None, "answer": None, "answer_type": None, "precision": None,
           "question_type": None, "choices": None, "unit": None, "metadata": None, "_skip": reason,
           "_detail": detail, "_dropped": 0, "_modes": []}
    if max_images > 1:
        out["images"] = []
    if fields.system_prompt is not None:
        out["system_prompt"] = None
    if fields.video_key:
        out["video"], out["video_metadata"] = [], None
    return out


def _text(value) -> str | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    text = str(value).strip()
    return text or None


def _absent(example: dict, key: str) -> str:
    """Why `key` gave no text: its value, or, when the row has no such column, the columns it has."""
    if key in example:
        return f"{key!r} is {example[key]!r}"
    return f"no column {key!r} (its columns: {_columns(example)})"


def _columns(example: dict) -> str:
    return ", ".join(sorted(map(str, example))[:12])


def unboxed(answer: str | None) -> str | None:
    r"""A gold answer wholly inside one `\boxed{...}` (ViRL39K writes every answer so) without the box; any other
    answer as it is. Braces must balance, so `\boxed{a}+\boxed{b}` keeps its boxes.

    >>> unboxed(r"\boxed{17^\circ}"), unboxed(r"\boxed{\frac{1}{2}}"), unboxed(r"\boxed{a}+\boxed{b}"), unboxed("4")
    ('17^\\circ', '\\frac{1}{2}', '\\boxed{a}+\\boxed{b}', '4')
    """
    if answer is None or not answer.startswith("\\boxed{") or not answer.endswith("}"):
        return answer
    depth = 0
    for char in answer[len("\\boxed"):-1]:
        depth += {"{": 1, "}": -1}.get(char, 0)
        if depth == 0:  # the box closes before the end: more than one box, or text after it
            return answer
    return _text(answer[len("\\boxed{"):-1]) if depth == 1 else answer


def _canonical_fields(example: dict, fields: Fields, numeric_only: bool) -> dict:
    """The text columns of a canonical row; cheap checks first, so no image is decoded for a row that fails them."""
    question = _text(example.get(fields.prompt_key))
    if question is None:
        raise BadItem("missing_question", _absent(example, fields.prompt_key))
    answer = unboxed(_text(example.get(fields.answer_key)))
    if answer is None:
        raise BadItem("missing_answer", _absent(example, fields.answer_key))
    choices = example.get(fields.choices_key)
    choices = [str(c).strip() for c in choices] if isinstance(choices, (list, tuple)) and len(choices) else None
    question_type = _text(example.get("question_type")) or ("multi_choice" if choices else "free_form")
    unit = _text(example.get("unit"))
    precision = example.get("precision")
    try:
        precision = float(precision) if precision not in (None, "") and not math.isnan(float(precision)) else None
    except (TypeError, ValueError):
        precision = None
    if question_type == "multi_choice" and choices:
        letter = chr(ord("A") + choices.index(answer)) if answer in choices else None
        if letter is None or not answers.is_correct(letter, answer, question_type=question_type, choices=choices):
            raise BadItem("answer_not_in_choices", f"answer {answer!r} is none of {choices}")
    if numeric_only:
        if answers.parse_number(answer, unit) is None:
            raise BadItem("non_numeric_answer", f"answer {answer!r}")
        if question_type == "multi_choice" and choices:
            text_choices = [c for c in choices if answers.parse_number(c, unit) is None]
            if text_choices:
                raise BadItem("non_numeric_answer", f"choice {text_choices[0]!r} is not a number")
    answer_type = _text(example.get(fields.answer_type_key))
    if answer_type is None:
        number = answers.parse_number(answer, unit)
        answer_type = "text" if number is None else "integer" if float(number).is_integer() else "float"
    metadata = example.get("metadata")
    if isinstance(metadata, str):
        try:
            metadata = json.loads(metadata)
        except json.JSONDecodeError:
            metadata = {"text": metadata}
    return {"question": question, "answer": answer, "answer_type": answer_type, "precision": precision,
            "question_type": question_type, "choices": choices, "unit": unit,
            "metadata": metadata if isinstance(metadata, dict) else {}}


def _canonical_images(example: dict, question: str, fields: Fields, root, image_size, keep_aspect: bool,
                      max_images: int, max_bytes: int, max_pixels, modes: dict, image_format: str,
                      beside_video: bool = False) -> tuple[list, int]:
    """Gathers the item's images, checks them against the placeholders, decodes the first `max_images`; beside a
    video (`beside_video`) there must be none."""
    values = []
    for key in fields.image_keys:
        value = example.get(key)
        if value is None or (isinstance(value, (str, list, tuple, dict)) and not value):
            continue
        items = list(value) if isinstance(value, (list, tuple)) and not _is_nested_numbers(value) else [value]
        values.extend(v for v in items if v is not None)
        if fields.first_image_key_only and values:
            break
    if beside_video:  # the item has a video: it trains on its clip alone
        if values or IMAGE_PLACEHOLDER in question:
            raise BadItem("video_with_images", f"{len(values)} pictures and {question.count(IMAGE_PLACEHOLDER)} "
                          f"{IMAGE_PLACEHOLDER} markers beside the video")
        return [], 0
    if not values:
        raise BadItem("missing_image", f"no image under {', '.join(fields.image_keys)}"
                      + ("" if any(k in example for k in fields.image_keys) else f" (its columns: {_columns(example)})"))
    placeholders = question.count(IMAGE_PLACEHOLDER)
    if placeholders and placeholders != len(values):
        raise BadItem("image_placeholder_mismatch",
                      f"{placeholders} {IMAGE_PLACEHOLDER} placeholders for {len(values)} images")
    kept = values[:max_images]
    images = [fit_image(load_image(v, root=root, max_bytes=max_bytes, max_pixels=max_pixels,
                                   draft_size=image_size, modes=modes), image_size, keep_aspect=keep_aspect)
              for v in kept]
    return [_encode(image, image_format) for image in images], len(values) - len(kept)


def _canonical_video(example: dict, question: str, fields: Fields, root, image_size, video_fps: float,
                     max_frames: int, image_format: str) -> tuple[list, dict]:
    """The item's video (a file or a list of frames), sampled (`vlrl.base.video.read_video`), each frame no larger
    than `image_size` on its longest side (aspect kept), encoded for the Arrow table, with its metadata."""
    from vlrl.base import video

    value = example.get(fields.video_key)
    if value is None or (isinstance(value, (str, list, tuple)) and not value):
        raise BadItem("missing_video", _absent(example, fields.video_key) if value is None else
                      f"{fields.video_key!r} is {value!r}")
    if question.count(VIDEO_PLACEHOLDER) > 1:
        raise BadItem("video_placeholder_mismatch", f"{question.count(VIDEO_PLACEHOLDER)} {VIDEO_PLACEHOLDER} "
                      "placeholders for 1 video")
    frames, metadata = video.read_video(value, video_fps=video_fps, max_frames=max_frames, root=root)
    if image_size:
        for frame in frames:
            frame.thumbnail((image_size, image_size))
    return [_encode(frame, image_format) for frame in frames], metadata


def _is_nested_numbers(value) -> bool:
    """A nested list of numbers is one image (an array that went through Arrow), not a list of images."""
    return bool(value) and isinstance(value[0], (list, tuple)) and bool(value[0]) and \
        isinstance(value[0][0], (int, float, list, tuple))


def _encode(image, image_format: str) -> dict:
    """Encodes a preprocessed image for the Arrow table (datasets' `{"bytes", "path"}` form)."""
    buffer = io.BytesIO()
    image.save(buffer, **IMAGE_FORMATS[image_format])
    return {"bytes": buffer.getvalue(), "path": None}


def capped(row: dict, max_images: int) -> tuple[dict, int]:
    """A row whose pictures (`images`, in prompt order) are past `max_images`: the first `max_images` kept, the rest
    dropped with their `<image>` markers, and how many were dropped (the loaders count them in the DataReport). A row
    left with one picture holds it in `image` alone, as every one-picture row does.

    >>> row, dropped = capped({"question": "<image> then <image>?", "image": 1, "images": [1, 2]}, 1)
    >>> row, dropped
    ({'question': '<image> then ?', 'image': 1}, 1)
    """
    images = row.get("images") or []
    if len(images) <= max_images:
        return row, 0
    out = {**row, "question": _drop_placeholders(row["question"], keep=max_images), "image": images[0]}
    if max_images > 1:
        out["images"] = list(images[:max_images])
    else:
        out.pop("images")
    return out, len(images) - max_images


def _drop_placeholders(question: str, keep: int) -> str:
    """Removes the `<image>` placeholders past the first `keep` (their images were dropped by the cap)."""
    parts = question.split(IMAGE_PLACEHOLDER)
    if len(parts) - 1 <= keep:
        return question
    return IMAGE_PLACEHOLDER.join(parts[:keep + 1]) + "".join(parts[keep + 1:])


def _fix(skipped: dict) -> str:
    """What to do about a source whose every row was skipped, by the reasons they were."""
    fixes = []
    if {"missing_question", "missing_answer", "missing_image"} & set(skipped):
        fixes.append("Name its columns: [data] columns = {question = ..., answer = ..., image = ..., id = ...} with "
                     "loader = \"generic\" in a run file (vlrl data inspect: --prompt-key, --answer-key, --image-key)")
    if "non_numeric_answer" in skipped:
        fixes.append("Keep answers that are not numbers: [data] all_answers = true (vlrl data inspect: --all-answers)")
    return ". ".join(fixes + ["Every reason: vlrl.data.SKIP_REASONS; the layouts vlrl reads: docs/data.md."])


def drop_skipped(processed, report: DataReport):
    """Counts skips by reason, drops skipped rows and duplicate ids, and refuses a source with no usable row.

    Args:
        processed: a `datasets.Dataset` of `canonical_row` results (bookkeeping columns included).
        report: the load's DataReport: rows read and kept, skips by reason, dropped images, converted modes.

    Returns:
        The usable rows, without the bookkeeping columns.

    Raises:
        DataError: no row is usable; the message lists the skip reasons and an example of each.
    """
    columns = processed.select_columns(["id", *_BOOKKEEPING]).to_dict()
    report.rows_read = len(processed)
    keep, seen = [], set()
    for index, (item_id, reason, detail, dropped, modes) in enumerate(zip(
            columns["id"], columns["_skip"], columns["_detail"], columns["_dropped"], columns["_modes"])):
        if reason is None and item_id in seen:
            reason, detail = "duplicate_id", "an earlier row has the same id"
        if reason is not None:
            report.skip(reason, item_id, detail or "")
            continue
        seen.add(item_id)
        keep.append(index)
        if dropped:
            report.images_dropped += dropped
            report.items_with_dropped_images += 1
        for mode in modes:
            report.converted_modes[mode] = report.converted_modes.get(mode, 0) + 1
    report.rows_kept = len(keep)
    if not keep:
        reasons = ", ".join(f"{k} {v}" for k, v in report.skipped.items()) or "the source is empty"
        examples = "; ".join(e for shown in report.examples.values() for e in shown[:1])
        raise DataError(f"{report.source} (split {report.split!r}) has no usable row among {report.rows_read} "
                        f"({reasons}). E.g. {examples or '-'}. {_fix(report.skipped)}")
    dataset = processed if len(keep) == len(processed) else processed.select(keep)
    return dataset.remove_columns(_BOOKKEEPING)
