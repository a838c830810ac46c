"""Known test splits: whether a run's training source is a benchmark's test split, and the warning that says so.

A score on items the model trained on measures recall, not skill, and some benchmarks' licences allow them only as
test sets (MathVista's note: commercial use as a test set, not as a training set). `vlrl run` and `vlrl train` log
`training_on_test_warning`'s line and write it into data_report.json, which report.html shows at its top.

    >>> training_on_test_warning("AI4Math/MathVista", "testmini")[:62]
    'warning: [data] trains on AI4Math/MathVista testmini, a test s'
    >>> training_on_test_warning("TIGER-Lab/ViRL39K", "train") is None, training_on_test_warning("synthetic", "testmini") is None
    (True, True)
"""

from __future__ import annotations

import os
from pathlib import Path

# Hub id (lower case) -> (its test splits, why training on them misleads). geo3k's validation split is a development
# set (300 items), not its reported test; MMMU reports its validation split, so that one counts as a test too.
KNOWN_TEST_SPLITS = {
    "ai4math/mathvista": (("testmini", "test"), ("MathVista was designed as a test set; its licence allows "
                                                  "commercial use as a test set, not as a training set")),
    "ai4math/mathverse": (("testmini", "test"), "MathVerse is a benchmark"),
    "mathllms/mathvision": (("testmini", "test"), "MATH-Vision is a benchmark"),
    "mmmu/mmmu": (("validation", "test", "dev"), "MMMU reports its validation and test splits"),
    "hiyouga/geometry3k": (("test",), "Geometry3K's test split is where geo3k results are reported"),
}
TEST_SPLIT_NAMES = ("test", "testmini")  # any source's split of these names


def known_test_split(source, split: str) -> str | None:
    """Why (`source`, `split`) is a known test split, or None when it is not one (generated items never are).

    >>> known_test_split("hiyouga/geometry3k", "validation") is None, known_test_split("data/mine", "test")
    (True, "a split named 'test'")
    """
    if not isinstance(source, (str, os.PathLike)) or source == "synthetic":
        return None
    name = os.fspath(source).strip().lower()
    known = KNOWN_TEST_SPLITS.get(name)
    if known is not None and split in known[0]:
        return known[1]
    if split in TEST_SPLIT_NAMES:
        local = Path(source) / f"{split}.json"
        return ("a directory in MathVista's layout: MathVista is a test set" if split == "testmini" and local.is_file()
                else f"a split named {split!r}")
    return None


def training_on_test_warning(source, split: str) -> str | None:
    """The one-line warning for training on a known test split, or None."""
    reason = known_test_split(source, split)
    if reason is None:
        return None
    return (f"warning: [data] trains on {os.fspath(source)} {split}, a test split ({reason}): its eval scores "
            "measure recall of trained items, not skill. Train on a training split (the qwen3-vl-*-mathvista presets "
            "train on TIGER-Lab/ViRL39K) and evaluate on the test split with [eval] source.")
