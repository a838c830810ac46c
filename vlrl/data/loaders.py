"""The loaders: a source -> canonical rows, with a `DataReport` of what was kept and skipped, and why.

`load_generic` reads any visual-QA source configured by column names (`Fields`); `load_mathvista`, `load_geo3k` and
`load_virl39k` are it with those data sets' columns (`MATHVISTA_FIELDS`, `GEO3K_FIELDS`, `VIRL39K_FIELDS`) and
defaults. Each returns a
`datasets.Dataset` of rows in the canonical schema (`vlrl.data.canonical`), preprocessed once and cached by datasets.

    >>> rows, report = load_mathvista("data/mathvista_sample", return_report=True)   # doctest: +SKIP

Bad input never stops a load: each unusable row is skipped and counted by reason in the `DataReport` (see
`SKIP_REASONS`); a source with no usable row at all is a `DataError` naming the source and the reasons.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import replace
from pathlib import Path

from vlrl.base.errors import ConfigError, DataError
from vlrl.base.images import MAX_IMAGE_BYTES, undecoded
from vlrl.data.canonical import (
    IMAGE_FORMATS,
    PREPROCESS_VERSION,
    Fields,
    canonical_features,
    canonical_row,
    drop_skipped,
)
from vlrl.data.report import DataReport
from vlrl.data.sources import VIRL39K_REPO, read_source, source_name, virl39k_files

logger = logging.getLogger(__name__)

# Preprocessing decodes, resizes and re-encodes every picture (~10 ms a row on one core): ViRL39K's 38,870 rows took
# about 6 minutes in one process. Sources this large are spread over worker processes (the cached result is the same).
PARALLEL_ROWS = 4096
MAX_WORKERS = 8


def preprocess_workers(rows: int) -> int | None:
    """Worker processes for preprocessing `rows` rows: None (this process) under PARALLEL_ROWS, else one per core,
    at most MAX_WORKERS.

    >>> preprocess_workers(300) is None, preprocess_workers(38_870) in range(1, MAX_WORKERS + 1)
    (True, True)
    """
    if rows < PARALLEL_ROWS:
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(MAX_WORKERS, cores))

# The bundled sample in MathVista's JSON layout (a checkout's data/; `python data/make_mathvista_sample.py` redraws it)
SAMPLE_DIR = Path(__file__).resolve().parents[2] / "data" / "mathvista_sample"
# ViRL39K's layout, made-up rows (`python data/make_virl39k_sample.py` redraws it)
VIRL39K_SAMPLE_DIR = SAMPLE_DIR.with_name("virl39k_sample")

# MathVista's layout names its ids `pid`; a data set of your own in that layout may name them `id`: both are kept
MATHVISTA_FIELDS = Fields(prompt_key="question", answer_key="answer", image_keys=("decoded_image", "image"),
                          id_key=("pid", "id"), first_image_key_only=True)
GEO3K_FIELDS = Fields(prompt_key="problem", answer_key="answer", image_keys=("images",), id_key=None)
VIRL39K_FIELDS = Fields(prompt_key="question", answer_key="answer", image_keys=("image",), id_key="qid")


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


def load_virl39k(source: str = VIRL39K_REPO, split: str = "train", *, numeric_only: bool = False,
                 image_size: int | None = 512, return_report: bool = False, **options):
    r"""ViRL39K (TIGER-Lab, MIT): 38,870 verifiable visual-reasoning questions for RL, in the canonical schema.

    Its layout: `39Krelease.parquet` (qid, question, answer as `\boxed{...}`, image: a list of paths such as
    `images/Processed-....jpg`, category, source, pass rates) beside `images.zip`, whose paths those are. The boxes
    are unwrapped (`canonical.unboxed`); text and expression answers are kept (score them with
    `[training] reward = "symbolic"`).

    Args:
        source: the hub id, or a local directory holding 39Krelease.parquet and the unzipped images/.
        split: "train", its one split.
        numeric_only: keep only numeric answers (off: ViRL39K's answers are often expressions or letters).
        image_size, return_report, **options: as `load_mathvista`.

    Raises:
        DataError: another split, no table, the pictures not unzipped, the hub not reachable.

    >>> ds = load_virl39k(VIRL39K_SAMPLE_DIR, image_size=64)
    >>> ds[0]["answer"], ds[0]["image"].size
    ('17^\\circ', (64, 64))
    """
    if split != "train":
        raise DataError(f"ViRL39K has one split, 'train', not {split!r}; set split = \"train\".")
    table, root = virl39k_files(source)
    return load_generic(str(table), split, fields=VIRL39K_FIELDS, numeric_only=numeric_only, image_size=image_size,
                        image_root=root, return_report=return_report, **options)


def load_generic(source, split: str = "train", *, fields: Fields | None = None, prompt_key: str | None = None,
                 answer_key: str | None = None, image_keys=None, id_key: str | None = None,
                 choices_key: str | None = None, answer_type_key: str | None = None, video_key: str | None = None,
                 video_fps: float = 2.0, max_frames: int = 16, system_prompt: str | None = None, numeric_only: bool = True, image_size: int | None = 512,
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
        prompt_key, answer_key, image_keys, id_key, choices_key, answer_type_key: column names (image_keys: one
            name or several); None takes the value of `fields` (default: question, answer, image, id, choices,
            answer_type). Rows without the id column get `<name>-<split>-<row index>`.
        video_key: the column holding each row's video (a path to an mp4 / webm, or a list of frames); frames kept
            one every 1 / `video_fps` seconds, at most `max_frames` (`vlrl.base.video.read_video`).
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
        num_proc: worker processes for preprocessing (default: `preprocess_workers` of the source's size).
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
               "image_keys": tuple(image_keys) if image_keys is not None else None, "choices_key": choices_key,
               "answer_type_key": answer_type_key, "video_key": video_key}
    spec = replace(fields or Fields(), **{k: v for k, v in changes.items() if v is not None})
    if max_images < 1:
        raise ConfigError(f"max_images = {max_images} must be at least 1.")
    if image_format not in IMAGE_FORMATS:
        raise ConfigError(f"image_format = {image_format!r}; choose one of {', '.join(IMAGE_FORMATS)}.")
    name = source_name(source)
    raw, root = read_source(source, split, cache_dir)
    root = Path(image_root).resolve() if image_root is not None else root
    options = {"fields": spec, "name": name, "split": split, "root": str(root) if root else None,
               "numeric_only": numeric_only, "image_size": image_size, "keep_aspect": keep_aspect,
               "max_images": max_images, "max_image_bytes": max_image_bytes, "max_pixels": max_pixels,
               "image_format": image_format, "version": PREPROCESS_VERSION}
    if spec.video_key:
        options.update(video_fps=float(video_fps), max_frames=int(max_frames))
    features = canonical_features(max_images, spec.system_prompt is not None, with_video=bool(spec.video_key))
    if isinstance(raw, list):
        rows = [canonical_row(example, index, **options) for index, example in enumerate(raw)]
        processed = datasets.Dataset.from_list(rows, features=features)
    else:
        raw = undecoded(raw)
        workers = num_proc if num_proc is not None else preprocess_workers(len(raw))
        processed = raw.map(canonical_row, with_indices=True, fn_kwargs=options, features=features,
                            remove_columns=raw.column_names, num_proc=workers if (workers or 1) > 1 else None,
                            desc=f"preprocessing {name}")
    report = DataReport(source=name, split=split, max_images=max_images, image_size=image_size,
                        keep_aspect=keep_aspect, numeric_only=numeric_only)
    dataset = drop_skipped(processed, report)
    report.seconds = round(time.time() - started, 3)
    unexpected = set(report.skipped) - {"non_numeric_answer"}  # the numeric filter skips by design; the rest warn
    (log or (logger.warning if unexpected else logger.info))(f"data: {report.summary()}")
    return (dataset, report) if return_report else dataset
