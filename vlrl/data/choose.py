"""Which loader a source calls for, and a run's `[data]` table (or its `[eval] source`) -> canonical rows.

`loader_name` is the one place a source's name picks its loader; `load_rows` loads what a `DataConfig` names
(generated items or a data set, its report warning when that is a known test split), `load_eval_rows` every item of
an `[eval] source`, and `load_synthetic` gives generated items the `DataReport` a loader would.

    >>> from vlrl.config import DataConfig
    >>> rows, report = load_rows(DataConfig(num_items=6, image_size=32), return_report=True)
    >>> len(rows), report.summary()
    (6, 'synthetic: kept 6 of 6 rows')
"""

from __future__ import annotations

import os
from pathlib import Path

from vlrl.base import synthetic
from vlrl.base.errors import DataError
from vlrl.data.canonical import capped
from vlrl.data.loaders import load_generic, load_geo3k, load_mathvista, load_virl39k
from vlrl.data.report import DataReport
from vlrl.data.sources import VIRL39K_TABLE
from vlrl.data.splits import training_on_test_warning

# The loaders of a data source, by the names `loader_name` gives (and `vlrl data inspect --loader` takes). The generic
# loader is never guessed from a name, since it needs the source's column names.
LOADERS = {"mathvista": load_mathvista, "geo3k": load_geo3k, "virl39k": load_virl39k, "generic": load_generic}


def loader_name(source) -> str:
    """The loader a source calls for: "synthetic" (generated items: `load_synthetic`), "virl39k" for a directory
    holding 39Krelease.parquet, "mathvista" for a .json / .jsonl file or a directory of .jsonl files (MathVista's JSON
    layout, and a data set of one's own: docs/data.md) whatever their name; else "geo3k" when the name mentions
    geometry3k or geo3k (the hub's hiyouga/geometry3k or a local copy), "virl39k" when it mentions ViRL39K, else
    "mathvista" (any other hub id or directory, in MathVista's hub layout). `LOADERS` maps the last three to their
    loaders; `[data] loader` names one outright.

    >>> [loader_name(s) for s in ("synthetic", "hiyouga/geometry3k", "data/Geo3K-copy", "TIGER-Lab/ViRL39K",
    ...                           "AI4Math/MathVista")]
    ['synthetic', 'geo3k', 'geo3k', 'virl39k', 'mathvista']
    """
    if source == "synthetic":
        return "synthetic"
    name, path = os.fspath(source).lower(), Path(source)
    if (path / VIRL39K_TABLE).is_file():
        return "virl39k"
    # JSON files of one's own: read by their columns, whatever the directory is called (a name with "geo3k" in it
    # used to switch to geo3k's columns, and every row was skipped)
    if path.suffix in (".json", ".jsonl") and path.is_file() or path.is_dir() and any(path.glob("*.jsonl")):
        return "mathvista"
    if "virl39k" in name:
        return "virl39k"
    return "geo3k" if "geometry3k" in name or "geo3k" in name else "mathvista"


def load_synthetic(num_items: int, *, seed: int = 0, image_size: int = 128, difficulty: int = 1,
                   tasks: tuple[str, ...] | str = synthetic.TASKS, max_images: int | None = None,
                   video_fps: float = 2.0, max_frames: int = 16, video_dir: str | Path | None = None,
                   return_report: bool = False):
    """Generated items (`vlrl.base.synthetic.generate`): a list of canonical rows, and with `return_report` the
    `DataReport` a loader would give (every row kept: generated items are valid by construction).

    Args:
        max_images: pictures kept per item (two-picture tasks: `synthetic.MULTI_IMAGE_TASKS`); the rest are dropped
            with their markers and counted, as a loader does. None keeps every picture.
        video_fps, max_frames: how a video task's clips (`synthetic.VIDEO_TASKS`) are sampled: each clip is written
            as an mp4 under `video_dir` (default: the cache's synthetic-video/) and decoded back from it as a loader
            decodes a row's video file (`vlrl.base.video.read_video`).

    >>> rows, report = load_synthetic(3, image_size=32, return_report=True)
    >>> rows[0]["id"], report.rows_kept
    ('synthetic-0-0', 3)
    >>> rows, report = load_synthetic(2, image_size=32, tasks="two_chart_compare", max_images=1, return_report=True)
    >>> "images" in rows[0], report.images_dropped, report.items_with_dropped_images
    (False, 2, 2)
    """
    try:
        rows = synthetic.generate(num_items, seed=seed, image_size=image_size, difficulty=difficulty, tasks=tasks)
    except ValueError as err:  # an unknown task name: the user's input, said as such
        raise DataError(str(err)) from None
    if any(row.get("video") for row in rows):
        named = "+".join([tasks] if isinstance(tasks, str) else tasks)  # the ids repeat across tasks, the clips do not
        rows = _clips_through_mp4(rows, video_fps, max_frames, video_dir, f"{seed}-{image_size}-{difficulty}-{named}")
    report = DataReport(source="synthetic", rows_read=len(rows), rows_kept=len(rows), image_size=image_size,
                        max_images=max_images or 1)
    if max_images is not None:
        for index, row in enumerate(rows):
            rows[index], dropped = capped(row, max_images)
            report.images_dropped += dropped
            report.items_with_dropped_images += bool(dropped)
    return (rows, report) if return_report else rows


def _clips_through_mp4(rows: list[dict], video_fps: float, max_frames: int, video_dir, name: str) -> list[dict]:
    """Each generated clip written as an mp4 and read back, sampled (`vlrl.base.video`): rows hold what a video file
    of a data set gives, the file's path as the clip's source."""
    from vlrl.base import video
    from vlrl.base.cache import cache_dir

    folder = Path(video_dir) if video_dir else cache_dir() / "synthetic-video" / name
    out = []
    for row in rows:
        if not row.get("video"):
            out.append(row)
            continue
        path = video.write_video(row["video"], folder / f"{row['id']}.mp4", fps=row["video_metadata"]["fps"])
        frames, metadata = video.read_video(path.name, video_fps=video_fps, max_frames=max_frames, root=folder)
        out.append({**row, "video": frames, "video_metadata": {**metadata, "source": str(path)}})
    return out


def load_rows(data_config, *, return_report: bool = False):
    """Canonical rows for a run's `[data]` table (`data_config`: a `vlrl.config.DataConfig`, which sits in a layer
    above this one, hence no annotation): generated items (a list), or MathVista / geo3k / ViRL39K (a Dataset).

    The loader is `[data] loader`, or with "auto" the one `loader_name` picks for `data_config.source`; `[data]
    columns` names the source's own columns (`column_options`). With `return_report`, also the `DataReport` of the
    load (its `trains_on_test_split` says when the source is a known test split).
    """
    d = data_config
    name = loader_name(d.source) if d.loader == "auto" else d.loader
    if name == "synthetic":
        rows, report = load_synthetic(d.num_items, seed=d.seed, image_size=d.image_size, difficulty=d.difficulty,
                                      tasks=d.tasks or synthetic.TASKS,  # empty: the default tasks
                                      max_images=d.max_images, video_fps=d.video_fps, max_frames=d.max_frames,
                                      return_report=True)
    else:
        answers = {"numeric_only": False} if d.all_answers else {}  # else each loader's own default
        video = {"video_fps": d.video_fps, "max_frames": d.max_frames} if "video" in d.columns else {}
        rows, report = LOADERS[name](d.source, split=d.split, image_size=d.image_size or None, return_report=True,
                                     max_images=d.max_images, **answers, **video, **column_options(d.columns))
        report.trains_on_test_split = training_on_test_warning(d.source, d.split) or ""
    return (rows, report) if return_report else rows


def column_options(columns: dict) -> dict:
    """`[data] columns` ({question, answer, image, id, choices, answer_type} -> the source's column names) as
    `load_generic`'s keyword arguments.

    >>> column_options({"question": "prompt", "image": "picture", "id": "uid"})
    {'prompt_key': 'prompt', 'image_keys': ('picture',), 'id_key': 'uid'}
    """
    keys = {"question": "prompt_key", "answer": "answer_key", "image": "image_keys", "id": "id_key",
            "choices": "choices_key", "answer_type": "answer_type_key", "video": "video_key"}
    return {keys[k]: (v,) if k == "image" else v for k, v in columns.items()}


def load_eval_rows(eval_config, image_size: int, *, max_images: int = 1, return_report: bool = False):
    """Every item of a run's `[eval] source` / `split` (`eval_config`: a `vlrl.config.EvalConfig`) as a Dataset, answers of any kind kept (MathVista's
    multi-choice and text items count: the answer grammar scores them), pictures at the training `image_size` (0:
    their own), at most `max_images` per item as in training.

    Raises:
        DataError: no source set, or generated items named (hold them out of `[data]` instead).
    """
    name = loader_name(eval_config.source) if eval_config.source else "synthetic"
    if name == "synthetic":
        raise DataError(f"[eval] source = {eval_config.source!r} names no data set; give a hub id or a directory, "
                        "or leave it empty to evaluate on [data]'s held-out items.")
    rows, report = LOADERS[name](eval_config.source, split=eval_config.split, image_size=image_size or None,
                                 numeric_only=False, max_images=max_images, return_report=True)
    return (rows, report) if return_report else rows
