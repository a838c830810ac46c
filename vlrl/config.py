"""Run configuration: `RunConfig` read from TOML ([model] [data] [training] [eval] [export]), presets, and the
GSPO recipe as a `trl.GRPOConfig` (`gspo_config`).

Everything is validated before any model loads: an unknown key, a wrong type or an inconsistent combination is a
`ConfigError` that names the key, the value and the fix.
"""

from __future__ import annotations

import dataclasses
try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path


class ConfigError(ValueError):
    """A run configuration that cannot work; the message says which key, which value, and the fix."""


@dataclass
class ModelConfig:
    name_or_path: str = "tiny"  # "tiny": the offline tiny Qwen3-VL, built and warm-started locally
    load_in_4bit: bool = False
    max_seq_length: int = 2048
    lora_r: int = 16
    lora_alpha: int = 16
    lora_dropout: float = 0.0
    finetune_vision_layers: bool = False  # the vision tower stays frozen: RL signal is too sparse to retrain it
    backend: str = "auto"  # auto | unsloth | transformers
    warm_start_steps: int = 0  # tiny only: supervised steps that teach the answer format before RL


@dataclass
class DataConfig:
    source: str = "synthetic"  # synthetic | a MathVista hub id or local directory
    split: str = "testmini"
    num_items: int = 200  # synthetic only
    difficulty: int = 1  # synthetic only
    image_size: int = 512
    hold_out: int = 100
    max_prompt_tokens: int = 1024  # the recipe's max_prompt_length, enforced by measuring, never by truncation
    seed: int = 0


@dataclass
class TrainingConfig:
    recipe: str = "gspo"
    learning_rate: float = 5e-6
    per_device_train_batch_size: int = 8
    gradient_accumulation_steps: int = 4
    num_generations: int = 4
    max_completion_length: int = 1024
    num_train_epochs: float = 1.0
    max_steps: int = -1
    temperature: float = 1.0
    logging_steps: int = 1
    save_steps: int = 50
    seed: int = 0


@dataclass
class EvalConfig:
    batch_size: int = 8
    max_new_tokens: int = 1024


@dataclass
class ExportConfig:
    formats: list[str] = field(default_factory=lambda: ["lora"])


@dataclass
class RunConfig:
    name: str = "run"
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    export: ExportConfig = field(default_factory=ExportConfig)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


_SECTIONS = {"model": ModelConfig, "data": DataConfig, "training": TrainingConfig, "eval": EvalConfig,
             "export": ExportConfig}


def _coerce(section: str, key: str, value, expected):
    kind = {"int": int, "float": float, "bool": bool, "str": str}.get(expected, None)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind is not None and (type(value) is not kind):
        raise ConfigError(f"[{section}] {key} = {value!r} must be of type {kind.__name__}; "
                          f"write it as a TOML {kind.__name__}.")
    if expected == "list[str]" and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
        raise ConfigError(f"[{section}] {key} = {value!r} must be a list of strings, e.g. [\"lora\"].")
    return value


def from_dict(data: dict) -> RunConfig:
    """Builds and validates a RunConfig from a dict shaped like the TOML file."""
    config = RunConfig()
    for key, value in data.items():
        if key == "name":
            config.name = _coerce("run", "name", value, "str")
            continue
        if key not in _SECTIONS:
            raise ConfigError(f"unknown section [{key}]; the sections are name, {', '.join(_SECTIONS)}.")
        if not isinstance(value, dict):
            raise ConfigError(f"[{key}] must be a table of settings, got {value!r}.")
        section = getattr(config, key)
        fields = {f.name: f.type for f in dataclasses.fields(section)}
        for k, v in value.items():
            if k not in fields:
                raise ConfigError(f"unknown key [{key}] {k}; known keys: {', '.join(fields)}.")
            setattr(section, k, _coerce(key, k, v, fields[k]))
    validate(config)
    return config


def validate(config: RunConfig) -> None:
    """Checks values and combinations; raises ConfigError with the rule, the values and the fix."""
    t, m, d, e = config.training, config.model, config.data, config.eval
    positive = [("training", "per_device_train_batch_size", t.per_device_train_batch_size),
                ("training", "gradient_accumulation_steps", t.gradient_accumulation_steps),
                ("training", "max_completion_length", t.max_completion_length),
                ("training", "logging_steps", t.logging_steps), ("training", "save_steps", t.save_steps),
                ("eval", "batch_size", e.batch_size), ("eval", "max_new_tokens", e.max_new_tokens),
                ("data", "image_size", d.image_size), ("data", "max_prompt_tokens", d.max_prompt_tokens),
                ("model", "lora_r", m.lora_r), ("model", "lora_alpha", m.lora_alpha),
                ("model", "max_seq_length", m.max_seq_length)]
    for section, key, value in positive:
        if value <= 0:
            raise ConfigError(f"[{section}] {key} = {value} must be positive.")
    if t.num_generations < 2:
        raise ConfigError(f"[training] num_generations = {t.num_generations} must be at least 2: GSPO compares "
                          "completions of the same prompt, and one has no group to compare with.")
    generation_batch = t.per_device_train_batch_size * t.gradient_accumulation_steps
    if generation_batch % t.num_generations:
        raise ConfigError(
            f"the generation batch (per_device_train_batch_size {t.per_device_train_batch_size} x "
            f"gradient_accumulation_steps {t.gradient_accumulation_steps} = {generation_batch}) must be a multiple of "
            f"num_generations ({t.num_generations}); raise the batch or lower num_generations.")
    if not 0 < t.learning_rate < 1:
        raise ConfigError(f"[training] learning_rate = {t.learning_rate} must be in (0, 1).")
    if t.recipe not in RECIPES:
        raise ConfigError(f"[training] recipe = {t.recipe!r} is unknown; choose one of {', '.join(RECIPES)}.")
    if m.backend not in ("auto", "unsloth", "transformers"):
        raise ConfigError(f"[model] backend = {m.backend!r}; choose auto, unsloth or transformers.")
    if d.hold_out < 1:
        raise ConfigError(f"[data] hold_out = {d.hold_out} must be at least 1: the before/after eval needs items.")
    if d.source == "synthetic" and d.hold_out >= d.num_items:
        raise ConfigError(f"[data] hold_out ({d.hold_out}) must be smaller than num_items ({d.num_items}), "
                          "or nothing is left to train on.")
    if m.max_seq_length < d.max_prompt_tokens + t.max_completion_length:
        raise ConfigError(
            f"[model] max_seq_length ({m.max_seq_length}) is shorter than max_prompt_tokens "
            f"({d.max_prompt_tokens}) + max_completion_length ({t.max_completion_length}); raise max_seq_length.")
    unknown = set(config.export.formats) - {"lora", "merged16", "merged4", "gguf"}
    if unknown:
        raise ConfigError(f"[export] formats has unknown {sorted(unknown)}; use lora, merged16, merged4, gguf.")


def load(path: str | Path) -> RunConfig:
    """Reads and validates a run file (TOML)."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"no run file at {path}") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path} is not valid TOML: {err}") from None
    return from_dict(data)


def presets() -> list[str]:
    return sorted(p.name.removesuffix(".toml") for p in resources.files("vlrl.presets").iterdir()
                  if p.name.endswith(".toml"))


def preset(name: str) -> RunConfig:
    """A preset shipped with vlrl (`tiny`, `qwen3-vl-8b-mathvista`, ...)."""
    if name not in presets():
        raise ConfigError(f"unknown preset {name!r}; choose one of {', '.join(presets())}.")
    return from_dict(tomllib.loads(resources.files("vlrl.presets").joinpath(f"{name}.toml").read_text()))


def to_toml(config: RunConfig) -> str:
    """The resolved configuration as TOML (what `config.toml` in a run directory holds)."""
    lines = [f"name = {_toml_value(config.name)}"]
    for section in _SECTIONS:
        lines.append(f"\n[{section}]")
        for key, value in dataclasses.asdict(getattr(config, section)).items():
            lines.append(f"{key} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"


def _toml_value(value) -> str:
    import json

    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, str)):
        return json.dumps(value)
    return repr(value)


# The recipe, with the reason beside each value. Both are passed explicitly, so TRL and Unsloth (whose defaults
# differ) run the same objective.
RECIPES = {
    "gspo": dict(
        importance_sampling_level="sequence",  # GSPO: one importance ratio per sequence
        loss_type="dr_grpo",  # the recipe's loss; TRL warns it weights each sequence by its length
        scale_rewards="none",  # Dr. GRPO does not divide advantages by the std (Unsloth forces this for dr_grpo)
        beta=0.0,  # no KL term and no reference model: saves a forward pass and memory
        epsilon=0.2, epsilon_high=0.2,  # the recipe keeps TRL's default clip range, set explicitly
        mask_truncated_completions=False,
    ),
    "gspo-paper": dict(
        importance_sampling_level="sequence",
        loss_type="grpo",  # length-normalized per sequence, as in the GSPO paper
        scale_rewards="group",
        beta=0.0,
        epsilon=3e-4, epsilon_high=4e-4,  # TRL's documented GSPO clipping (sequence ratios sit near 1)
        mask_truncated_completions=False,
    ),
}


def gspo_config(output_dir: str = "runs/gspo", recipe: str = "gspo", **overrides):
    """The GSPO recipe as a `trl.GRPOConfig`; keyword overrides win.

    Defaults: learning_rate 5e-6, cosine schedule, adamw_8bit (adamw_torch without CUDA/bitsandbytes), batch 8 x 4
    accumulation, 4 generations, 1024 completion tokens, 1 epoch, max_grad_norm 0.1, reward weights 0.3 / 1.0.
    """
    import torch
    from trl import GRPOConfig

    from vlrl.rewards import REWARD_WEIGHTS

    if recipe not in RECIPES:
        raise ConfigError(f"recipe {recipe!r} is unknown; choose one of {', '.join(RECIPES)}.")
    eight_bit = torch.cuda.is_available() and _has_bitsandbytes()
    values = dict(
        output_dir=output_dir,
        learning_rate=5e-6,  # RL on a 4-bit base: small steps keep the policy near the instruct model
        lr_scheduler_type="cosine",
        warmup_steps=0.1,  # a fraction below 1 is a ratio of the total steps
        optim="adamw_8bit" if eight_bit else "adamw_torch",  # 8-bit states save ~2 bytes/param on GPU
        weight_decay=0.1,
        per_device_train_batch_size=8,
        gradient_accumulation_steps=4,
        num_generations=4,
        max_completion_length=1024,
        num_train_epochs=1,
        max_grad_norm=0.1,  # RL gradients are noisy; clip hard
        reward_weights=list(REWARD_WEIGHTS),
        temperature=1.0,
        logging_steps=1,
        report_to="none",
        bf16=torch.cuda.is_available() and torch.cuda.is_bf16_supported(),
        use_cpu=not torch.cuda.is_available(),
        **RECIPES[recipe],
    )
    values.update(overrides)
    return GRPOConfig(**values)


def _has_bitsandbytes() -> bool:
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        return False
    return True
