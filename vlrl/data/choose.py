"""Which loader a source calls for, and a run's `[data]` table -> canonical rows.

`loader_name` is the one place a source's name picks its loader; `load_rows` loads what a `DataConfig` names
(generated items or a data set), and `load_synthetic` gives generated items the `DataReport` a loader would.

    >>> from vlrl.config import DataConfig
    >>> rows, report = load_rows(DataConfig(num_items=6, image_size=32), return_report=True)
    >>> len(rows), report.summary()
    (6, 'synthetic: kept 6 of 6 rows')
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from vlrl import synthetic
from vlrl.data.loaders import load_generic, load_geo3k, load_mathvista
from vlrl.data.report import DataReport
from vlrl.errors import DataError

if TYPE_CHECKING:
    from vlrl.config import DataConfig

# The loaders of a data source, by the names `loader_name` gives (and `vlrl data inspect --loader` takes). The generic
# loader is never guessed from a name, since it needs the source's column names.
LOADERS = {"mathvista": load_mathvista, "geo3k": load_geo3k, "generic": load_generic}


def loader_name(source) -> str:
    """The loader a source calls for: "synthetic" (generated items: `load_synthetic`), "geo3k" when its name mentions
    geometry3k or geo3k (the hub's hiyouga/geometry3k or a local copy), else "mathvista" (any other hub id or
    directory, in MathVista's hub or JSON layout). `LOADERS` maps the last two to their loaders.

    >>> [loader_name(s) for s in ("synthetic", "hiyouga/geometry3k", "data/Geo3K-copy", "AI4Math/MathVista")]
    ['synthetic', 'geo3k', 'geo3k', 'mathvista']
    """
    if source == "synthetic":
        return "synthetic"
    name = os.fspath(source).lower()
    return "geo3k" if "geometry3k" in name or "geo3k" in name else "mathvista"


def load_synthetic(num_items: int, *, seed: int = 0, image_size: int = 128, difficulty: int = 1,
                   tasks: tuple[str, ...] | str = synthetic.TASKS, return_report: bool = False):
    """Generated items (`vlrl.synthetic.generate`): a list of canonical rows, and with `return_report` the
    `DataReport` a loader would give (every row kept: generated items are valid by construction).

    >>> rows, report = load_synthetic(3, image_size=32, return_report=True)
    >>> rows[0]["id"], report.rows_kept
    ('synthetic-0-0', 3)
    """
    try:
        rows = synthetic.generate(num_items, seed=seed, image_size=image_size, difficulty=difficulty, tasks=tasks)
    except ValueError as err:  # an unknown task name: the user's input, said as such
        raise DataError(str(err)) from None
    if not return_report:
        return rows
    return rows, DataReport(source="synthetic", rows_read=len(rows), rows_kept=len(rows), image_size=image_size)


def load_rows(data_config: DataConfig, *, return_report: bool = False):
    """Canonical rows for a run's `[data]` table: generated items (a list), or MathVista / geo3k (a Dataset).

    The loader is the one `loader_name` picks for `data_config.source`. With `return_report`, also the
    `DataReport` of the load.
    """
    d = data_config
    name = loader_name(d.source)
    if name == "synthetic":
        rows, report = load_synthetic(d.num_items, seed=d.seed, image_size=d.image_size, difficulty=d.difficulty,
                                      tasks=d.tasks or synthetic.TASKS,  # empty: the default tasks
                                      return_report=True)
    else:
        rows, report = LOADERS[name](d.source, split=d.split, image_size=d.image_size, return_report=True)
    return (rows, report) if return_report else rows
