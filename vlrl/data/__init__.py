"""Data: sources -> rows in one canonical schema, with a report of every skip, and the hold-out split.

Every loader returns rows in one canonical schema (a `datasets.Dataset`, or a list of dicts for generated items):
`{id, question, image, answer, answer_type, precision, question_type, choices, unit, metadata}` (+ `images` when
more than one image per item is kept, + `system_prompt` when one is set). `vlrl.model.prompts.to_prompt()` turns a row
into TRL's conversational form.

    >>> rows, report = load_mathvista("data/mathvista_sample", return_report=True)   # doctest: +SKIP
    >>> train_rows, eval_rows = split_holdout(rows, n=10, seed=0)                     # doctest: +SKIP

Bad input never stops a load: each unusable row is skipped and counted by reason in a `DataReport` (see
`SKIP_REASONS`); a source with no usable row at all is a `DataError` naming the source and the reasons.

The modules, in the order a load goes through them:

- `sources`: a hub id / directory / file / Dataset / list -> raw rows (MathVista's JSON layout included);
- `canonical`: one raw row -> one canonical row or a counted skip (the schema, `Fields`);
- `loaders`: `load_generic`, `load_mathvista`, `load_geo3k`, `load_virl39k` (the pipeline, with each data set's
  columns);
- `choose`: `loader_name` (which loader a source calls for), `load_synthetic`, `load_rows` (a run's `[data]`),
  `load_eval_rows` (its `[eval] source`);
- `splits`: `known_test_split`, `training_on_test_warning` (benchmarks' test splits, which no preset trains on);
- `split`: `split_holdout`, `drop_eval_overlap`, `check_disjoint` (nothing trains on an eval item or picture);
- `report`: `DataReport`, `SKIP_REASONS`.
"""

from vlrl.base.errors import DataError
from vlrl.base.images import image_hash
from vlrl.data.canonical import IMAGE_FORMATS, PREPROCESS_VERSION, Fields
from vlrl.data.choose import LOADERS, load_eval_rows, load_rows, load_synthetic, loader_name
from vlrl.data.loaders import (
    GEO3K_FIELDS,
    MATHVISTA_FIELDS,
    SAMPLE_DIR,
    VIRL39K_FIELDS,
    VIRL39K_SAMPLE_DIR,
    load_generic,
    load_geo3k,
    load_mathvista,
    load_virl39k,
)
from vlrl.data.report import SKIP_REASONS, DataReport
from vlrl.data.split import check_disjoint, drop_eval_overlap, picture_hashes, split_holdout
from vlrl.data.splits import known_test_split, training_on_test_warning

__all__ = [
    "GEO3K_FIELDS", "IMAGE_FORMATS", "LOADERS", "MATHVISTA_FIELDS", "PREPROCESS_VERSION", "SAMPLE_DIR",
    "SKIP_REASONS", "VIRL39K_FIELDS", "VIRL39K_SAMPLE_DIR", "DataError", "DataReport", "Fields", "check_disjoint",
    "drop_eval_overlap", "image_hash", "known_test_split", "load_eval_rows", "load_generic", "load_geo3k",
    "load_mathvista", "load_rows", "load_synthetic", "load_virl39k", "loader_name", "picture_hashes", "split_holdout",
    "training_on_test_warning",
]
