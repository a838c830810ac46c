"""The configuration layer: a run file read, checked and resolved before anything loads, the recipe, the run directory.

It owns the sections (`sections`: the run file's dataclasses and defaults), the rules (`validation`: every problem in
one pass), reading a run file (`runfile`: TOML, presets, `--set` overrides), the GSPO recipe as TRL arguments
(`recipe`), `vlrl validate`'s cheap checks beyond the rules (`preflight`) and the run directory (`rundir`). It may
import base, grammar, model, data and envs (to check an environment's options and a data source's first rows), never
evaluation, training, episodes or the stages. The run-file functions are re-exported here (`vlrl.config.preset`).
"""

from vlrl.config.runfile import (
    BACKENDS,
    EXPORT_FORMATS,
    FORMS,
    LOCAL_FAMILIES,
    LOCAL_MODELS,
    REWARDS,
    TRACKERS,
    DataConfig,
    EvalConfig,
    ExportConfig,
    ModelConfig,
    RunConfig,
    TrainingConfig,
    apply_overrides,
    did_you_mean,
    differences,
    from_dict,
    load,
    preset,
    preset_summaries,
    presets,
    problems_of,
    resolve,
    to_toml,
    validate,
)

__all__ = [
    "BACKENDS", "EXPORT_FORMATS", "FORMS", "LOCAL_FAMILIES", "LOCAL_MODELS", "REWARDS", "TRACKERS", "DataConfig",
    "EvalConfig", "ExportConfig", "ModelConfig", "RunConfig", "TrainingConfig", "apply_overrides", "did_you_mean",
    "differences", "from_dict", "load", "preset", "preset_summaries", "presets", "problems_of", "resolve", "to_toml",
    "validate",
]
