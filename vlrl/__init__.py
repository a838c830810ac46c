"""vlrl: reinforcement learning of vision-language models (Qwen3-VL, GSPO) on one GPU, with auditable results.

Importing vlrl loads nothing heavy: no GPU, Unsloth or model is needed to `import vlrl` or `vlrl.rewards`.
The packages are the layers, lowest first (`LAYERS`; docs/design.md draws them and tests/test_layout.py holds the
code to them): a module imports only from its own layer and the layers below.
"""

__version__ = "0.1.0"

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

# The layers, lowest first, each with the packages (or modules standing flat in vlrl/) that belong to it.
LAYERS = (
    ("base", ("base",)),
    ("grammar", ("grammar",)),
    ("model", ("model",)),
    ("engine", ("engine",)),
    ("data", ("data",)),
    ("envs", ("envs",)),
    ("config", ("config",)),
    ("evaluation", ("evaluation",)),
    ("episodes", ("episodes",)),
    ("training", ("training",)),
    ("export", ("export",)),
    ("report", ("report",)),
    ("run", ("run", "run_episodes", "serve")),
    ("cli", ("cli_parser", "cli_data", "cli", "__main__")),
)

# Modules that stood flat in vlrl/ before the layers became packages: the old name imports the same module object.
# `vlrl.rewards` and `vlrl.recipe` are public names, kept for good; the others warn with the new name.
PUBLIC_NAMES = {"vlrl.rewards": "vlrl.grammar.rewards", "vlrl.recipe": "vlrl.config.recipe"}
MOVED = {
    **{f"vlrl.{m}": f"vlrl.base.{m}" for m in ("errors", "cache", "distributed", "progress", "images", "synthetic",
                                              "stats")},
    **{f"vlrl.{m}": f"vlrl.grammar.{m}" for m in ("values", "symbolic", "choices", "answers", "thinking")},
    "vlrl.tiny": "vlrl.model.tiny",
    "vlrl.prompts": "vlrl.model.prompts",
    **{f"vlrl.{m}": f"vlrl.config.{m}" for m in ("sections", "validation", "preflight", "rundir")},
    **{f"vlrl.{m}": f"vlrl.evaluation.{m}" for m in ("records", "evaluate", "sharded_eval", "passk", "compare")},
    "vlrl.episodes.compare": "vlrl.evaluation.episode_compare",
    **{f"vlrl.{m}": f"vlrl.training.{m}" for m in ("train", "mismatch", "dynamic_sampling", "callbacks", "sft",
                                                  "warmstart")},
    "vlrl.episodes.trainer": "vlrl.training.episode_trainer",
}


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old or public module name as the module it names now (the same object, so a patch reaches it)."""

    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if name in PUBLIC_NAMES or name in MOVED else None

    def create_module(self, spec):
        if spec.name in MOVED:
            warnings.warn(f"{spec.name} moved to {MOVED[spec.name]}: import it from there", DeprecationWarning,
                          stacklevel=2)
        return importlib.import_module(PUBLIC_NAMES.get(spec.name) or MOVED[spec.name])

    def exec_module(self, module):
        pass  # the module it names has run already


if not any(isinstance(finder, _Alias) for finder in sys.meta_path):
    sys.meta_path.insert(0, _Alias())


# Warnings of the libraries under vlrl that do not concern a vlrl user, silenced at their source (each library's own
# logger), by logger name -> words of the message, with the reason:
QUIET = {
    # bitsandbytes (imported by transformers and PEFT) on every model load: its optional `kernels` module for 4-bit
    # matmuls on CPU is missing; vlrl never runs 4-bit weights on a CPU
    "bitsandbytes.backends.cpu.ops": "Failed to load CPU gemm_4bit_forward",
    # TRL on every GSPO run: dr_grpo sums token losses under sequence-level ratios; the recipe chooses it knowingly
    # (vlrl.config.recipe says why)
    "trl.trainer.grpo_trainer": "When using `importance_sampling_level='sequence'`",
    # transformers when training starts: the tokenizer's special tokens copied into the generation config, as meant
    "transformers.trainer_utils": "The tokenizer has new PAD/BOS/EOS tokens",
}


def _quiet_third_party() -> None:
    import logging

    class Quiet(logging.Filter):
        def __init__(self, text: str):
            super().__init__()
            self.text = text

        def filter(self, record: logging.LogRecord) -> bool:
            return self.text not in record.getMessage()  # accelerate prefixes "[RANK 0] "

    for name, text in QUIET.items():
        logging.getLogger(name).addFilter(Quiet(text))


_quiet_third_party()
