"""Data: loaders to one canonical schema, safe image normalization, prompts, the length filter, the hold-out split.

Every loader returns rows in one canonical schema (a `datasets.Dataset`, or a list of dicts for generated items):
`{id, question, image, answer, answer_type, precision, question_type, choices, unit, metadata}` (+ `images` when
more than one image per item is kept, + `system_prompt` when one is set). `to_prompt()` turns a row into TRL's
conversational form (`prompt` + `image` + the scoring columns), which GRPOTrainer passes on to the reward functions
as keyword arguments.

    >>> rows, report = load_mathvista("data/mathvista_sample", return_report=True)   # doctest: +SKIP
    >>> train_rows, eval_rows = split_holdout(rows, n=10, seed=0)                     # doctest: +SKIP

Bad input never stops a load: each unusable row is skipped and counted by reason in a `DataReport` (see
`SKIP_REASONS`); a source with no usable row at all is a `DataError` naming the source and the reasons.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import math
import os
import random
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from vlrl import answers, synthetic
from vlrl.errors import DataError
from vlrl.images import MAX_IMAGE_BYTES, BadItem, fit_image, image_hash, load_image, undecoded
from vlrl.prompts import IMAGE_PLACEHOLDER, row_images

logger = logging.getLogger(__name__)

# The bundled sample in MathVista's JSON layout (a checkout's data/; `python data/make_mathvista_sample.py` redraws it)
SAMPLE_DIR = Path(__file__).resolve().parent.parent / "data" / "mathvista_sample"
PREPROCESS_VERSION = 1  # part of the datasets cache fingerprint: bump when preprocessing changes its output

# Every reason a row can be skipped for, with what it means. DataReport counts these.
SKIP_REASONS = {
    "invalid_record": "the record itself is unreadable (a JSON line that does not parse, not an object)",
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
    "too_long": "the prompt, image tokens included, is longer than max_prompt_tokens",
}


# --------------------------------------------------------------------------------------------------------------
# The data report


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

    def __str__(self) -> str:
        lines = [self.summary()]
        for reason, shown in self.examples.items():
            lines.append(f"  {reason} ({self.skipped.get(reason, 0)}): {SKIP_REASONS.get(reason, '')}")
            lines.extend(f"    e.g. {example}" for example in shown)
        if self.hold_out:
            lines.append(f"  hold-out: {self.hold_out}")
        return "\n".join(lines)


# --------------------------------------------------------------------------------------------------------------
# Loaders


@dataclass(frozen=True)
class Fields:
    """Which columns of a source hold what (how RLinf and EasyR1 configure a data set).

    Args:
        prompt_key: the question text; `<image>` placeholders in it place the images.
        answer_key: the gold answer.
        image_keys: the column(s) holding the item's image(s): one image or a list of them each.
        id_key: the item id (when absent, `<name>-<split>-<row index>`).
        first_image_key_only: the image keys are alternatives (the first non-empty wins), as MathVista's
            `decoded_image` (hub) and `image` (a path, in its JSON layout).
        system_prompt: an optional system turn for every prompt.
    """

    prompt_key: str = "question"
    answer_key: str = "answer"
    image_keys: tuple = ("image",)
    id_key: str | None = "id"
    first_image_key_only: bool = False
    system_prompt: str | None = None


MATHVISTA_FIELDS = Fields(prompt_key="question", answer_key="answer", image_keys=("decoded_image", "image"),
                          id_key="pid", first_image_key_only=True)
GEO3K_FIELDS = Fields(prompt_key="problem", answer_key="answer", image_keys=("images",), id_key=None)


def load_mathvista(source: str = "AI4Math/MathVista", split: str = "testmini", *, numeric_only: bool = True,
                   image_size: int | None = 512, keep_aspect: bool = False, return_report: bool = False, **options):
    """MathVista in the canonical schema: numeric items, 512x512 RGB images, from the hub or a local directory.

    Args:
        source: a hub id, a local directory of parquet files as on the hub (a `decoded_image` column), or a local
            directory in MathVista's own JSON layout (`<split>.json` keyed by pid, or `<split>.jsonl`, each record
            with `image: "images/<pid>.jpg"` relative to that directory).
        split: "testmini" (1,000 items with answers) or "test" (answers withheld: every row is skipped).
        numeric_only: keep only items whose answer is a number; a multi-choice item counts when all of its
            choices are numbers (its prompt shows the choices).
        image_size: the side of the square RGB images; None keeps each image's own size.
        keep_aspect: scale to fit and pad with white instead of stretching.
        return_report: also return the `DataReport`.
        **options: passed to `load_generic` (max_images, max_image_bytes, max_pixels, image_format, cache_dir,
            num_proc, log).

    Returns:
        A `datasets.Dataset` of canonical rows, and the `DataReport` when `return_report` is set.

    >>> ds = load_mathvista(SAMPLE_DIR, image_size=64)
    >>> ds[0]["image"].size, ds[0]["question_type"] in ("free_form", "multi_choice")
    ((64, 64), True)
    """
    return load_generic(source, split, fields=MATHVISTA_FIELDS, numeric_only=numeric_only, image_size=image_size,
                        keep_aspect=keep_aspect, return_report=return_report, **options)


def load_geo3k(source: str = "hiyouga/geometry3k", split: str = "train", *, numeric_only: bool = True,
               image_size: int | None = 512, return_report: bool = False, **options):
    """Geometry3K (EasyR1's layout: `problem` with an `<image>` placeholder, `answer`, `images`) in the canonical schema.

    Answers such as `2\\sqrt{3}` are not numbers: with `numeric_only` they are skipped and counted, since vlrl's
    answer grammar scores numbers and exact strings. From the hub (or, offline, a local copy's directory):

    >>> ds, report = load_geo3k(return_report=True)  # doctest: +SKIP
    """
    return load_generic(source, split, fields=GEO3K_FIELDS, numeric_only=numeric_only, image_size=image_size,
                        return_report=return_report, **options)


def load_generic(source, split: str = "train", *, fields: Fields | None = None, prompt_key: str | None = None,
                 answer_key: str | None = None, image_keys=None, id_key: str | None = None,
                 system_prompt: str | None = None, numeric_only: bool = True, image_size: int | None = 512,
                 keep_aspect: bool = False, max_images: int = 1, image_root: str | Path | None = None,
                 max_image_bytes: int = MAX_IMAGE_BYTES, max_pixels: int | None = None, image_format: str = "png",
                 cache_dir: str | None = None, num_proc: int | None = None, return_report: bool = False,
                 log=None):
    """Any visual-QA source -> canonical rows, configured by column names (the way RLinf and EasyR1 do it).

    Args:
        source: a hub id, a local directory (parquet/arrow files as on the hub, or `<split>.json` / `<split>.jsonl`
            with image paths relative to it), a single .json/.jsonl/.parquet file, a `datasets.Dataset`, or a list
            of dicts.
        split: the split to read.
        fields: a `Fields` preset (MATHVISTA_FIELDS, GEO3K_FIELDS); the keyword arguments below override it.
        prompt_key, answer_key, image_keys, id_key: column names (image_keys: one name or several); None takes
            the value of `fields` (default: question, answer, image, id). Rows without the id column get
            `<name>-<split>-<row index>`.
        system_prompt: an optional system turn for every prompt.
        numeric_only: skip (and count) items whose answer is not a number.
        image_size: the side of the square RGB images; None keeps each image's own size.
        keep_aspect: scale to fit and pad with white instead of stretching.
        max_images: images kept per item (Qwen3-VL RL recipes use 1); the rest are dropped and counted.
        image_root: the directory image paths are confined to (default: the source directory, else the current one).
        max_image_bytes: encoded images over this size are refused unread.
        max_pixels: images over this many pixels are refused (default: Pillow's decompression-bomb limit).
        image_format: how preprocessed images are cached: "png" (lossless, compact), "bmp" (lossless, fastest,
            large on disk) or "jpeg" (quality 95, fast, compact, lossy); see IMAGE_FORMATS.
        cache_dir: the datasets cache (default: HF_DATASETS_CACHE); preprocessing is cached there.
        num_proc: worker processes for preprocessing.
        return_report: also return the `DataReport`.
        log: a callable for the one-line summary (default: this module's logger).

    Returns:
        A `datasets.Dataset` of canonical rows (and the `DataReport` with `return_report`).

    Raises:
        DataError: the source cannot be read, or has no usable row (the message lists the skip reasons).

    >>> from PIL import Image
    >>> rows = [{"problem": "<image>Find x.", "answer": "3", "images": [Image.new("RGB", (40, 30))]},
    ...         {"problem": "<image>Find y.", "answer": "x + 1", "images": [Image.new("RGB", (40, 30))]}]
    >>> ds, report = load_generic(rows, prompt_key="problem", image_keys="images", image_size=32, return_report=True)
    >>> len(ds), report.skipped, ds[0]["image"].size
    (1, {'non_numeric_answer': 1}, (32, 32))
    """
    import datasets

    started = time.time()
    if isinstance(image_keys, str):
        image_keys = (image_keys,)
    changes = {"prompt_key": prompt_key, "answer_key": answer_key, "id_key": id_key, "system_prompt": system_prompt,
               "image_keys": tuple(image_keys) if image_keys is not None else None}
    spec = replace(fields or Fields(), **{k: v for k, v in changes.items() if v is not None})
    if max_images < 1:
        raise ValueError(f"max_images = {max_images} must be at least 1.")
    if image_format not in IMAGE_FORMATS:
        raise ValueError(f"image_format = {image_format!r}; choose one of {', '.join(IMAGE_FORMATS)}.")
    name = _source_name(source)
    raw, root = _read_source(source, split, cache_dir)
    root = Path(image_root).resolve() if image_root is not None else root
    options = {"fields": spec, "name": name, "split": split, "root": str(root) if root else None,
               "numeric_only": numeric_only, "image_size": image_size, "keep_aspect": keep_aspect,
               "max_images": max_images, "max_image_bytes": max_image_bytes, "max_pixels": max_pixels,
               "image_format": image_format, "version": PREPROCESS_VERSION}
    features = _canonical_features(max_images, spec.system_prompt is not None)
    if isinstance(raw, list):
        rows = [_canonical(example, index, **options) for index, example in enumerate(raw)]
        processed = datasets.Dataset.from_list(rows, features=features)
    else:
        raw = undecoded(raw)
        processed = raw.map(_canonical, with_indices=True, fn_kwargs=options, features=features,
                            remove_columns=raw.column_names, num_proc=num_proc,
                            desc=f"preprocessing {name}")
    report = DataReport(source=name, split=split, max_images=max_images, image_size=image_size,
                        keep_aspect=keep_aspect, numeric_only=numeric_only)
    dataset = _finish(processed, report)
    report.seconds = round(time.time() - started, 3)
    unexpected = set(report.skipped) - {"non_numeric_answer"}  # the numeric filter skips by design; the rest warn
    (log or (logger.warning if unexpected else logger.info))(f"data: {report.summary()}")
    return (dataset, report) if return_report else dataset


def _source_name(source) -> str:
    if isinstance(source, (str, os.PathLike)):
        return os.fspath(source)
    return f"<{type(source).__name__}>"


def _read_source(source, split: str, cache_dir):
    """The raw rows of a source and the directory its image paths are relative to.

    Returns a `datasets.Dataset` (disk-backed when it comes from files, so preprocessing is cached) or a list of
    dicts (in-memory rows, which may mix image forms Arrow cannot hold in one column).
    """
    import datasets

    if isinstance(source, datasets.Dataset):
        return source, None
    if isinstance(source, datasets.DatasetDict):
        if split not in source:
            raise DataError(f"the DatasetDict has no split {split!r}; its splits are {sorted(source)}.")
        return source[split], None
    if isinstance(source, (list, tuple)):
        return list(source), None
    if not isinstance(source, (str, os.PathLike)):
        raise DataError(f"a data source must be a hub id, a path, a datasets.Dataset or a list of dicts, "
                        f"not {type(source).__name__}.")
    path = Path(source)
    if path.is_file():
        if path.suffix in (".json", ".jsonl"):
            return _json_dataset(path, cache_dir), path.parent.resolve()
        return _load_dataset(path.suffix.lstrip("."), split, cache_dir, data_files={split: str(path)}), \
            path.parent.resolve()
    if path.is_dir():
        for candidate in (path / f"{split}.json", path / f"{split}.jsonl"):
            if candidate.is_file():  # MathVista's own layout
                return _json_dataset(candidate, cache_dir), path.resolve()
        return _load_dataset(str(path), split, cache_dir), path.resolve()
    text = os.fspath(source)
    if text.startswith((".", "/", "~")) or text.count("/") > 1 or text.endswith((".json", ".jsonl", ".parquet")):
        raise DataError(f"{text!r} is neither a directory nor a file; give a local path that exists "
                        "or a hub id such as 'AI4Math/MathVista'.")
    return _load_dataset(text, split, cache_dir), None  # a hub id


def _load_dataset(path: str, split: str, cache_dir, **kwargs):
    """`datasets.load_dataset`, with its errors turned into a DataError that says what to do."""
    import datasets

    try:
        return datasets.load_dataset(path, split=split, cache_dir=cache_dir, **kwargs)
    except Exception as err:
        local = Path(path).exists()
        hint = ("a local directory must hold <split>.json / <split>.jsonl (MathVista's layout) or data files named "
                f"like {split}-00000-of-00001.parquet (the hub's layout)" if local else
                "a hub id needs network access, or the data set in the datasets cache (HF_DATASETS_CACHE); "
                "offline, download it once elsewhere and pass its local directory")
        raise DataError(f"could not load {path!r} (split {split!r}): {type(err).__name__}: {err}. Note: {hint}.") \
            from err


def _json_dataset(path: Path, cache_dir):
    """MathVista's JSON layout (`<split>.json` keyed by pid, or a list; `<split>.jsonl`) as a cached Dataset.

    Each record is kept as one JSON value, so a record of odd types (an int answer among strings) or a line that
    does not parse becomes one counted skip instead of an Arrow type error that stops the load.
    """
    import datasets

    # The cache key covers the JSON file and every file beside it (the images): an edit invalidates the cache.
    stamp = hashlib.sha256()
    for entry in sorted(p for p in path.parent.rglob("*") if p.is_file()):
        info = entry.stat()
        stamp.update(f"{entry.relative_to(path.parent)}:{info.st_size}:{info.st_mtime_ns};".encode())
    return datasets.Dataset.from_generator(
        _json_records, gen_kwargs={"path": str(path.resolve()), "stamp": stamp.hexdigest()},
        features=datasets.Features({"record": datasets.Json()}), cache_dir=cache_dir)


def _json_records(path: str, stamp: str):
    text = Path(path).read_text(encoding="utf-8")
    if path.endswith(".jsonl"):
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    yield {"record": json.loads(line)}
                except json.JSONDecodeError as err:
                    yield {"record": {"__invalid__": f"line {number}: {err}"}}
        return
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise DataError(f"{path} is not valid JSON ({err}); MathVista's layout is one object keyed by pid.") from None
    if isinstance(data, dict):
        for pid, record in data.items():
            yield {"record": {"pid": pid, **record} if isinstance(record, dict) else {"__invalid__": f"pid {pid}"}}
    elif isinstance(data, list):
        for record in data:
            yield {"record": record}
    else:
        raise DataError(f"{path} holds a JSON {type(data).__name__}; expected an object keyed by pid or a list.")


def _canonical_features(max_images: int, with_system: bool):
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
    columns.update({"_skip": datasets.Value("string"), "_detail": datasets.Value("string"),
                    "_dropped": datasets.Value("int32"), "_modes": datasets.List(datasets.Value("string"))})
    return datasets.Features(columns)


def _canonical(example: dict, index: int, *, fields: Fields, name: str, split: str, root, numeric_only: bool,
               image_size, keep_aspect: bool, max_images: int, max_image_bytes: int, max_pixels, image_format: str,
               version: int) -> dict:
    """One raw row -> one canonical row, or an empty row whose `_skip` says why (never an exception)."""
    if isinstance(example, Mapping) and not isinstance(example, dict):
        example = dict(example)  # datasets' LazyRow
    if isinstance(example, dict) and "record" in example and len(example) == 1:
        example = example["record"]  # the JSON layout's one-value rows
    if not isinstance(example, dict) or "__invalid__" in example:
        detail = example.get("__invalid__", "") if isinstance(example, dict) else f"a {type(example).__name__}"
        return _skipped(f"{name}-{split}-{index}", "invalid_record", detail, max_images, fields)
    raw_id = example.get(fields.id_key) if fields.id_key else None
    item_id = str(raw_id) if raw_id not in (None, "") else f"{Path(name).name or name}-{split}-{index}"
    modes: dict = {}
    try:
        row = _canonical_fields(example, fields, numeric_only)
        images, dropped = _canonical_images(example, row["question"], fields, root, image_size, keep_aspect,
                                            max_images, max_image_bytes, max_pixels, modes, image_format)
    except BadItem as bad:
        return _skipped(item_id, bad.reason, bad.detail, max_images, fields)
    if dropped:
        row["question"] = _drop_placeholders(row["question"], keep=max_images)
    out = {"id": item_id, **row, "image": images[0], "_skip": None, "_detail": None, "_dropped": dropped,
           "_modes": [m for m, n in modes.items() for _ in range(n)]}
    if max_images > 1:
        out["images"] = images
    if fields.system_prompt is not None:
        out["system_prompt"] = fields.system_prompt
    return out


def _skipped(item_id: str, reason: str, detail: str, max_images: int, fields: Fields) -> dict:
    out = {"id": item_id, "question": None, "image": None, "answer": None, "answer_type": None, "precision": None,
           "question_type": None, "choices": None, "unit": None, "metadata": None, "_skip": reason,
           "_detail": detail, "_dropped": 0, "_modes": []}
    if max_images > 1:
        out["images"] = []
    if fields.system_prompt is not None:
        out["system_prompt"] = None
    return out


def _text(value) -> str | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    text = str(value).strip()
    return text or None


def _canonical_fields(example: dict, fields: Fields, numeric_only: bool) -> dict:
    """The text columns of a canonical row; cheap checks first, so no image is decoded for a row that fails them."""
    question = _text(example.get(fields.prompt_key))
    if question is None:
        raise BadItem("missing_question", f"{fields.prompt_key!r} is {example.get(fields.prompt_key)!r}")
    answer = _text(example.get(fields.answer_key))
    if answer is None:
        raise BadItem("missing_answer", f"{fields.answer_key!r} is {example.get(fields.answer_key)!r}")
    choices = example.get("choices")
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
    answer_type = _text(example.get("answer_type"))
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
                      max_images: int, max_bytes: int, max_pixels, modes: dict, image_format: str) -> tuple[list, int]:
    """Gathers the item's images, checks them against the placeholders, decodes the first `max_images`."""
    values = []
    for key in fields.image_keys:
        value = example.get(key)
        if value is None or (isinstance(value, (str, list, tuple, dict)) and not value):
            continue
        items = list(value) if isinstance(value, (list, tuple)) and not _is_nested_numbers(value) else [value]
        values.extend(v for v in items if v is not None)
        if fields.first_image_key_only and values:
            break
    if not values:
        raise BadItem("missing_image", f"no image under {', '.join(fields.image_keys)}")
    placeholders = question.count(IMAGE_PLACEHOLDER)
    if placeholders and placeholders != len(values):
        raise BadItem("image_placeholder_mismatch",
                      f"{placeholders} {IMAGE_PLACEHOLDER} placeholders for {len(values)} images")
    kept = values[:max_images]
    images = [fit_image(load_image(v, root=root, max_bytes=max_bytes, max_pixels=max_pixels,
                                   draft_size=image_size, modes=modes), image_size, keep_aspect=keep_aspect)
              for v in kept]
    return [_encode(image, image_format) for image in images], len(values) - len(kept)


def _is_nested_numbers(value) -> bool:
    """A nested list of numbers is one image (an array that went through Arrow), not a list of images."""
    return bool(value) and isinstance(value[0], (list, tuple)) and bool(value[0]) and \
        isinstance(value[0][0], (int, float, list, tuple))


# How preprocessed images are stored in the Arrow cache (bench/results/bench_data.md has the measured trade-off).
IMAGE_FORMATS = {
    "png": {"format": "PNG", "compress_level": 1},  # lossless and compact (~10-400 KiB at 512 px); slowest to write
    "bmp": {"format": "BMP"},  # lossless and fastest; 768 KiB per 512x512 image on disk
    "jpeg": {"format": "JPEG", "quality": 95, "subsampling": 0},  # fast and compact; lossy (no chroma subsampling)
}


def _encode(image, image_format: str) -> dict:
    """Encodes a preprocessed image for the Arrow table (datasets' `{"bytes", "path"}` form)."""
    buffer = io.BytesIO()
    image.save(buffer, **IMAGE_FORMATS[image_format])
    return {"bytes": buffer.getvalue(), "path": None}


def _drop_placeholders(question: str, keep: int) -> str:
    """Removes the `<image>` placeholders past the first `keep` (their images were dropped by the cap)."""
    parts = question.split(IMAGE_PLACEHOLDER)
    if len(parts) - 1 <= keep:
        return question
    return IMAGE_PLACEHOLDER.join(parts[:keep + 1]) + "".join(parts[keep + 1:])


def _finish(processed, report: DataReport):
    """Counts skips by reason, drops skipped rows and duplicate ids, and refuses a source with no usable row."""
    columns = processed.select_columns(["id", "_skip", "_detail", "_dropped", "_modes"]).to_dict()
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
                        f"({reasons}). E.g. {examples or '-'}. See vlrl.data.SKIP_REASONS; for non-numeric answers "
                        "pass numeric_only=False.")
    dataset = processed if len(keep) == len(processed) else processed.select(keep)
    return dataset.remove_columns(["_skip", "_detail", "_dropped", "_modes"])


# --------------------------------------------------------------------------------------------------------------
# Hold-out


def _row_hashes(row: dict) -> set[str]:
    return {image_hash(image) for image in row_images(row)}


def split_holdout(rows, n: int = 100, *, seed: int = 0, report: DataReport | None = None,
                  exclude_images: set[str] = frozenset()):
    """Splits rows into (train, held_out) with `n` held-out items, disjoint by id and by image content.

    Training rows whose id or picture also appears in the held-out set are dropped (and counted), so no eval item
    or eval picture is ever trained on.

    Args:
        rows: canonical rows, a list or a `datasets.Dataset` (the result has the same type).
        n: held-out items.
        seed: the shuffle seed.
        report: a DataReport to record the split in.
        exclude_images: picture hashes (`image_hash`) the model has already trained on (a warm start's): rows showing
            one are never held out, only trained on; counted as `eval_excluded_seen_image`.

    >>> from vlrl import synthetic
    >>> train, held = split_holdout(synthetic.generate(20, image_size=32), n=5)
    >>> len(held), {r["id"] for r in train} & {r["id"] for r in held}
    (5, set())
    """
    if not 0 < n < len(rows):
        raise ValueError(f"hold_out ({n}) must be at least 1 and smaller than the data set ({len(rows)} rows); "
                         "lower hold_out or load more items.")
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    ids = _ids(rows)
    hashes = [_row_hashes(row) for row in rows]  # one sequential pass: each picture decoded once
    seen = [i for i in order if hashes[i] & exclude_images]
    held_idx = [i for i in order if not hashes[i] & exclude_images][:n]
    if len(held_idx) < n:
        raise ValueError(f"hold_out ({n}) needs {n} rows whose pictures the model has not trained on, and only "
                         f"{len(held_idx)} of {len(rows)} are ({len(seen)} show a warm-start picture); load more "
                         "items or lower hold_out.")
    held = set(held_idx)
    order = held_idx + [i for i in order if i not in held]
    held_ids = {ids[i] for i in held_idx}
    held_images = set().union(*(hashes[i] for i in held_idx))
    train_idx, same_id, same_image = [], 0, 0
    for i in order[n:]:
        if ids[i] in held_ids:
            same_id += 1
        elif hashes[i] & held_images:
            same_image += 1
        else:
            train_idx.append(i)
    if report is not None:
        report.hold_out = {"n": n, "seed": seed, "train": len(train_idx), "eval": n,
                           "train_dropped_same_id": same_id, "train_dropped_same_image": same_image,
                           "eval_excluded_seen_image": len(seen)}
    if isinstance(rows, list):
        return [rows[i] for i in train_idx], [rows[i] for i in held_idx]
    return rows.select(train_idx), rows.select(held_idx)


def _ids(rows) -> list:
    return list(rows["id"]) if hasattr(rows, "column_names") else [r["id"] for r in rows]  # no image decoding


def check_disjoint(train_rows, eval_rows) -> None:
    """Refuses to train on eval items: raises ValueError naming the overlapping ids or pictures.

    >>> check_disjoint([{"id": "a"}], [{"id": "a"}])
    Traceback (most recent call last):
    ...
    ValueError: 1 training items are in the eval set (e.g. ['a']); ...
    """
    overlap = set(_ids(train_rows)) & set(_ids(eval_rows))
    if overlap:
        raise ValueError(f"{len(overlap)} training items are in the eval set (e.g. {sorted(overlap)[:3]}); "
                         "split with vlrl.data.split_holdout and train on its first part only.")
    eval_images = {}
    for row in eval_rows:
        for h in _row_hashes(row):
            eval_images.setdefault(h, row["id"])
    shared = [(r["id"], eval_images[h]) for r in train_rows for h in _row_hashes(r) if h in eval_images]
    if shared:
        raise ValueError(f"{len(shared)} training items show a picture of the eval set (e.g. train {shared[0][0]!r} = "
                         f"eval {shared[0][1]!r}); split with vlrl.data.split_holdout, which drops them from training.")


def loader_name(source) -> str:
    """Which loader reads a source: "synthetic", "geo3k" (a name that mentions geometry3k or geo3k) or "mathvista"
    (any other hub id or local directory). The one place this is decided.

    >>> loader_name("hiyouga/geometry3k"), loader_name("AI4Math/MathVista"), loader_name("synthetic")
    ('geo3k', 'mathvista', 'synthetic')
    """
    name = str(source).lower()
    if name == "synthetic":
        return "synthetic"
    return "geo3k" if ("geometry3k" in name or "geo3k" in name) else "mathvista"


DEFAULT_SPLITS = {"mathvista": "testmini", "geo3k": "train", "generic": "train"}


def load_source(source, *, split: str | None = None, loader: str = "auto", num_items: int = 12, seed: int = 0,
                difficulty: int = 1, tasks="all", image_size: int | None = 512, **options):
    """(rows, DataReport) of any source: generated items, or a data set read by its loader (`loader_name`, or
    "mathvista" / "geo3k" / "generic" as given). `num_items`, `seed`, `difficulty` and `tasks` are for generated
    items; `options` go to the loader (numeric_only, keep_aspect, max_images, the generic loader's keys, ...)."""
    name = loader_name(source) if loader == "auto" else loader
    if name == "synthetic":
        try:
            rows = synthetic.generate(num_items, seed=seed, image_size=image_size or 128, difficulty=difficulty,
                                      tasks=tasks or synthetic.TASKS)
        except ValueError as err:  # an unknown task name
            raise DataError(str(err)) from None
        return rows, DataReport(source="synthetic", rows_read=len(rows), rows_kept=len(rows), image_size=image_size)
    load = {"mathvista": load_mathvista, "geo3k": load_geo3k, "generic": load_generic}[name]
    options.setdefault("return_report", True)
    return load(source, split=split or DEFAULT_SPLITS[name], image_size=image_size, **options)


def load_rows(data_config, *, return_report: bool = False):
    """Canonical rows for a run's `[data]` (a `vlrl.config.DataConfig`): generated items (a list), or MathVista /
    geo3k (a Dataset), through `load_source`. With `return_report`, also the `DataReport` of the load."""
    d = data_config
    rows, report = load_source(d.source, split=d.split, num_items=d.num_items, seed=d.seed, difficulty=d.difficulty,
                               tasks=d.tasks or synthetic.TASKS, image_size=d.image_size)
    return (rows, report) if return_report else rows
