"""Run configuration: `RunConfig` read from TOML ([model] [data] [training] [eval] [export]), presets, and the
GSPO recipe as a `trl.GRPOConfig` (`gspo_config`).

Everything is validated before any model loads: an unknown key, a wrong type or an inconsistent combination is a
`ConfigError` that names the key, the value and the fix.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from vlrl.errors import ConfigError


@dataclass
class ModelConfig:
    name_or_path: str = "tiny"  # "tiny": the offline tiny Qwen3-VL, built and warm-started locally
    load_in_4bit: bool = False
    max_seq_length: int = 2048
    lora_r: int = 16
    lora_alpha: int = 16
    lora_dropout: float = 0.0
    train_projector: bool = False  # also LoRA on the vision->language merger (off: the recipe keeps vision fixed)
    finetune_vision_layers: bool = False  # the vision tower stays frozen: RL signal is too sparse to retrain it
    backend: str = "auto"  # auto | unsloth | transformers
    warm_start_steps: int = 0  # tiny / tiny-small only: supervised steps that teach the answer format before RL
    warm_start_items: int = 0  # tiny / tiny-small only: generated items the warm start draws from (0: 512 / 4096)


@dataclass
class DataConfig:
    source: str = "synthetic"  # synthetic | a MathVista hub id or local directory
    split: str = "testmini"
    num_items: int = 200  # synthetic only
    difficulty: int = 1  # synthetic only
    tasks: list[str] = field(default_factory=list)  # synthetic only: vlrl.synthetic task names; empty: the six default
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
    max_steps: int = -1  # -1: run num_train_epochs; a positive number caps the optimizer steps
    temperature: float = 1.0
    logging_steps: int = 1
    save_steps: int = 50  # a checkpoint (adapter, optimizer, scheduler, RNG) every this many steps; --resume uses it
    stop_on_degeneration: float = 0.0  # 0: never; else stop when this share of a step's completions degenerates
    # Completions decoded per generate call; 0: TRL's default, the whole optimizer step's rollouts (batch x
    # accumulation) at once. A multiple of the batch below it decodes each micro-batch's rollouts just before its
    # forward pass: the same on-policy step in less memory (the 8B recipe on 24 GB), at a lower decoding throughput.
    generation_batch_size: int = 0
    fast_generation: bool = True  # CUDA + transformers backend: static KV cache + compiled decoding (2.8x on 8B 4-bit)
    seed: int = 0
    # Experiment trackers, passed to TRL as report_to: "none", an integration name ("tensorboard", "trackio",
    # "wandb", ...; TRACKERS) or a list of them. train_log.jsonl is written either way.
    report_to: str | list[str] = "none"


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
BACKENDS = ("auto", "unsloth", "transformers")
# The models vlrl builds and warm-starts itself (vlrl.tiny), by name -> size; tiny-small: the GPU learning demo.
LOCAL_MODELS = {"tiny": "tiny", "tiny-small": "small"}
EXPORT_FORMATS = ("lora", "merged16", "merged4", "gguf")
# What transformers 5.17 accepts as report_to (its INTEGRATION_TO_CALLBACK, plus "all" and "none"); tests check it.
TRACKERS = ("none", "all", "tensorboard", "trackio", "wandb", "mlflow", "comet_ml", "azure_ml", "neptune",
            "codecarbon", "clearml", "dagshub", "flyte", "dvclive", "swanlab", "kubeflow")


def _did_you_mean(word: str, choices) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" Did you mean {close[0]!r}?" if close else ""


def _coerce(section: str, key: str, value, expected: str, example):
    """`value` checked against the field's type (an int is accepted for a float); `example` shows the right form."""
    kind = {"int": int, "float": float, "bool": bool, "str": str}.get(expected, None)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind is not None and (type(value) is not kind):
        name = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}[kind]
        raise ConfigError(f"[{section}] {key} = {value!r} has the wrong type: {key} takes {name}; "
                          f"write it like {key} = {_toml_value(example)}.")
    if expected == "list[str]" and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
        raise ConfigError(f"[{section}] {key} = {value!r} must be a list of strings, e.g. {key} = [\"lora\"].")
    return value


def from_dict(data: dict) -> RunConfig:
    """Builds and validates a RunConfig from a dict shaped like the TOML file.

    >>> from_dict({"training": {"num_generations": 3}})
    Traceback (most recent call last):
    ...
    vlrl.errors.ConfigError: the generation batch (per_device_train_batch_size 8 x gradient_accumulation_steps 4 = 32) must be a multiple of [training] num_generations = 3, so every prompt's group is complete; set num_generations to a divisor of 32 (e.g. 4) or change the batch.
    """
    config = RunConfig()
    for key, value in data.items():
        if key == "name":
            config.name = _coerce("top level", "name", value, "str", "my-run")
            continue
        if key not in _SECTIONS:
            raise ConfigError(f"unknown section [{key}]; a run file has name and the sections "
                              f"{', '.join(f'[{s}]' for s in _SECTIONS)}.{_did_you_mean(key, _SECTIONS)}")
        if not isinstance(value, dict):
            raise ConfigError(f"{key} = {value!r} must be a section [{key}] of settings, not a single value.")
        section = getattr(config, key)
        fields = {f.name: f.type for f in dataclasses.fields(section)}
        for k, v in value.items():
            if k not in fields:
                raise ConfigError(f"unknown key [{key}] {k} = {v!r}; [{key}] takes {', '.join(fields)}."
                                  f"{_did_you_mean(k, fields)}")
            setattr(section, k, _coerce(key, k, v, fields[k], getattr(section, k)))
    validate(config)
    return config


def validate(config: RunConfig) -> None:
    """Checks values and combinations; raises ConfigError with the rule, the values and the fix.

    Nothing here loads a model or touches the network, so a run file for a hub model validates offline.
    """
    t, m, d, e = config.training, config.model, config.data, config.eval
    if not re.fullmatch(r"[A-Za-z0-9._-]+", config.name):
        raise ConfigError(f"name = {config.name!r} names the run directory (runs/<name>); use letters, digits, "
                          "'.', '_' or '-' only, e.g. name = \"my-run\".")
    positive = [("training", "per_device_train_batch_size", t.per_device_train_batch_size),
                ("training", "gradient_accumulation_steps", t.gradient_accumulation_steps),
                ("training", "max_completion_length", t.max_completion_length),
                ("training", "logging_steps", t.logging_steps), ("training", "save_steps", t.save_steps),
                ("eval", "batch_size", e.batch_size), ("eval", "max_new_tokens", e.max_new_tokens),
                ("data", "max_prompt_tokens", d.max_prompt_tokens), ("data", "num_items", d.num_items),
                ("model", "lora_r", m.lora_r), ("model", "lora_alpha", m.lora_alpha),
                ("model", "max_seq_length", m.max_seq_length)]
    for section, key, value in positive:
        if value <= 0:
            raise ConfigError(f"[{section}] {key} = {value} must be positive; set it to a number above 0.")
    for section, key, value in [("model", "warm_start_steps", m.warm_start_steps),
                                ("model", "warm_start_items", m.warm_start_items), ("data", "seed", d.seed),
                                ("training", "seed", t.seed), ("training", "generation_batch_size",
                                                               t.generation_batch_size)]:
        if value < 0:
            raise ConfigError(f"[{section}] {key} = {value} must be 0 or more.")
    if not m.name_or_path.strip():
        raise ConfigError('[model] name_or_path is empty; give a hub id (e.g. "unsloth/Qwen3-VL-8B-Instruct-'
                          'unsloth-bnb-4bit"), a local checkpoint directory, or "tiny".')
    if m.backend not in BACKENDS:
        raise ConfigError(f"[model] backend = {m.backend!r} is unknown; choose one of {', '.join(BACKENDS)}."
                          f"{_did_you_mean(m.backend, BACKENDS)}")
    if not 0 <= m.lora_dropout < 1:
        raise ConfigError(f"[model] lora_dropout = {m.lora_dropout} must be in [0, 1); 0 is the recipe's value.")
    for key in ("warm_start_steps", "warm_start_items"):
        if getattr(m, key) and m.name_or_path not in LOCAL_MODELS:
            raise ConfigError(
                f"[model] {key} = {getattr(m, key)} only applies to the models vlrl builds ({', '.join(LOCAL_MODELS)}), "
                f"not {m.name_or_path!r}; set it to 0 and run `vlrl sft` first if this model needs a cold start.")
    if t.num_generations < 2:
        raise ConfigError(f"[training] num_generations = {t.num_generations} must be at least 2: GSPO compares "
                          "completions of the same prompt, and one has no group to compare with.")
    generation_batch = t.per_device_train_batch_size * t.gradient_accumulation_steps
    if generation_batch % t.num_generations:
        divisors = [g for g in range(2, generation_batch + 1) if generation_batch % g == 0]
        raise ConfigError(
            f"the generation batch (per_device_train_batch_size {t.per_device_train_batch_size} x "
            f"gradient_accumulation_steps {t.gradient_accumulation_steps} = {generation_batch}) must be a multiple of "
            f"[training] num_generations = {t.num_generations}, so every prompt's group is complete; set "
            f"num_generations to a divisor of {generation_batch} (e.g. {_nearest(divisors, t.num_generations)}) "
            "or change the batch.")
    if t.generation_batch_size:
        if t.recipe == "gspo-paper":
            raise ConfigError(f"[training] generation_batch_size = {t.generation_batch_size} cannot be combined with "
                              'recipe "gspo-paper", which sets the rollout size itself (batch x accumulation, split '
                              "into optimizer steps); remove one of the two.")
        unit = math.lcm(t.per_device_train_batch_size, t.num_generations)
        if t.generation_batch_size % unit:
            raise ConfigError(
                f"[training] generation_batch_size = {t.generation_batch_size} must be a multiple of both "
                f"per_device_train_batch_size ({t.per_device_train_batch_size}) and num_generations "
                f"({t.num_generations}), e.g. {unit}; 0 decodes a whole optimizer step's rollouts at once.")
    if not 0 < t.learning_rate < 1:
        raise ConfigError(f"[training] learning_rate = {t.learning_rate} must be in (0, 1); the recipe uses 5e-6.")
    if t.recipe not in RECIPES:
        raise ConfigError(f"[training] recipe = {t.recipe!r} is unknown; choose one of {', '.join(RECIPES)}."
                          f"{_did_you_mean(t.recipe, RECIPES)}")
    if not 0 < t.temperature < 10:
        raise ConfigError(f"[training] temperature = {t.temperature} must be in (0, 10): 0 samples identical "
                          "completions (no group to compare) and Unsloth refuses 10 or more; the recipe uses 1.0.")
    if t.max_steps == 0 or t.max_steps < -1:
        raise ConfigError(f"[training] max_steps = {t.max_steps}: use -1 to train num_train_epochs, or a positive "
                          "number of optimizer steps.")
    if t.max_steps == -1 and t.num_train_epochs <= 0:
        raise ConfigError(f"[training] num_train_epochs = {t.num_train_epochs} must be positive when max_steps = -1; "
                          "set num_train_epochs = 1 or a positive max_steps.")
    if not 0 <= t.stop_on_degeneration <= 1:
        raise ConfigError(f"[training] stop_on_degeneration = {t.stop_on_degeneration} is a share of completions: "
                          "use 0 (never stop) or a value in (0, 1], e.g. 0.5.")
    if d.hold_out < 1:
        raise ConfigError(f"[data] hold_out = {d.hold_out} must be at least 1: the before/after eval needs items.")
    if d.image_size < 32:
        raise ConfigError(f"[data] image_size = {d.image_size} is smaller than one merged Qwen-VL patch (32 px); "
                          "use 32 or more (64 for the tiny preset, 512 for real models).")
    if d.source == "synthetic":
        if d.hold_out >= d.num_items:
            raise ConfigError(f"[data] hold_out = {d.hold_out} must be smaller than num_items = {d.num_items}, "
                              "or nothing is left to train on; raise num_items or lower hold_out.")
        if d.difficulty not in (1, 2, 3):
            raise ConfigError(f"[data] difficulty = {d.difficulty} must be 1, 2 or 3.")
        from vlrl.synthetic import ALL_TASKS

        for task in d.tasks:
            if task not in ALL_TASKS:
                raise ConfigError(f"[data] tasks names {task!r}, which vlrl.synthetic does not generate; choose from "
                                  f"{', '.join(ALL_TASKS)}.{_did_you_mean(task, ALL_TASKS)}")
    if m.max_seq_length < d.max_prompt_tokens + t.max_completion_length:
        raise ConfigError(
            f"[model] max_seq_length = {m.max_seq_length} is shorter than [data] max_prompt_tokens "
            f"({d.max_prompt_tokens}) + [training] max_completion_length ({t.max_completion_length}); raise "
            f"max_seq_length to at least {d.max_prompt_tokens + t.max_completion_length}.")
    if m.max_seq_length < d.max_prompt_tokens + e.max_new_tokens:
        raise ConfigError(
            f"[model] max_seq_length = {m.max_seq_length} is shorter than [data] max_prompt_tokens "
            f"({d.max_prompt_tokens}) + [eval] max_new_tokens ({e.max_new_tokens}); raise max_seq_length to at "
            f"least {d.max_prompt_tokens + e.max_new_tokens} or lower max_new_tokens.")
    # Names only: whether a tracker's package is installed is checked by transformers when the run starts, so a
    # run file that names one validates offline on any machine.
    trackers = [t.report_to] if isinstance(t.report_to, str) else t.report_to
    if not isinstance(trackers, list) or not all(isinstance(x, str) for x in trackers):
        raise ConfigError(f'[training] report_to = {t.report_to!r} must be a tracker name or a list of them, e.g. '
                          'report_to = "tensorboard" or ["tensorboard", "trackio"]; "none" turns tracking off.')
    for tracker in trackers:
        if tracker not in TRACKERS:
            raise ConfigError(f"[training] report_to names {tracker!r}, which transformers does not report to; choose "
                              f"from {', '.join(TRACKERS)}.{_did_you_mean(tracker, TRACKERS)}")
    if len(trackers) > 1 and {"none", "all"} & set(trackers):
        raise ConfigError(f'[training] report_to = {t.report_to!r} mixes "none" or "all" with other trackers; write '
                          'report_to = "none", report_to = "all" (every installed tracker), or a list of names.')
    unknown = [f for f in config.export.formats if f not in EXPORT_FORMATS]
    if unknown:
        raise ConfigError(f"[export] formats = {config.export.formats} has unknown {unknown}; use any of "
                          f"{', '.join(EXPORT_FORMATS)}.")


def _nearest(values: list[int], target: int) -> int:
    return min(values, key=lambda v: (abs(v - target), -v)) if values else 2


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


def differences(config: RunConfig, path: str | Path) -> list[str]:
    """What differs between `config` and the run file at `path` (empty when it is absent or the same run):
    one "[section] key: before -> now" line per changed value, so a refusal can say what changed."""
    path = Path(path)
    if not path.exists():
        return []
    before, now = load(path).to_dict(), config.to_dict()
    changed = [f"[{section}] {key}: {before[section][key]!r} -> {now[section][key]!r}"
               for section in now if isinstance(now[section], dict)
               for key in now[section] if now[section][key] != before[section].get(key)]
    if before["name"] != now["name"]:
        changed.insert(0, f"name: {before['name']!r} -> {now['name']!r}")
    return changed


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


# The two objectives, side by side (docs/training.md explains the difference). Every value is passed explicitly,
# so TRL and Unsloth, whose defaults differ (BACKEND_DEFAULTS), optimize the same objective.
RECIPES = {
    # The recipe this project reproduces (Unsloth's GSPO notebook for Qwen-VL): sequence-level ratios, Dr. GRPO loss.
    "gspo": {
        "importance_sampling_level": "sequence",  # GSPO: one importance ratio per sequence
        # dr_grpo sums token losses over a constant (max_completion_length): TRL warns that under sequence-level
        # ratios this weights each sequence by its length; "gspo-paper" averages per sequence instead
        "loss_type": "dr_grpo",
        # Dr. GRPO: advantages are not divided by the group std. Unsloth forces this for dr_grpo; TRL's default
        # "group" would scale, so the two backends would train differently unless it is stated
        "scale_rewards": "none",
        "beta": 0.0,  # no KL term and no reference model: saves a forward pass and memory
        "epsilon": 0.2, "epsilon_high": 0.2,  # TRL's default clip range, stated (Unsloth widens epsilon_high for dapo)
        "mask_truncated_completions": False,  # cut-off completions still train (the recipe)
    },
    # TRL's documented GSPO setting (paper_index: "Group Sequence Policy Optimization"), GSPO paper v2 section 5.1.
    "gspo-paper": {
        "importance_sampling_level": "sequence",
        "loss_type": "grpo",  # each sequence's token losses are averaged: the per-sequence objective of the paper
        "scale_rewards": "group",  # the paper's group-normalized advantage (mean and std of each prompt's group)
        "beta": 0.0,  # "GSPO set KL regularization to zero"
        "epsilon": 3e-4, "epsilon_high": 4e-4,  # sequence ratios sit near 1: the paper's clip range is 1e-4 wide
        "mask_truncated_completions": False,
        # and each rollout is split into mini-batches, one optimizer step each (see gspo_values)
    },
}

# Where TRL 1.14.2's GRPOConfig and Unsloth 2026.10.9's (UnslothGRPOConfig, which replaces it once unsloth is
# imported) disagree by default: field -> (TRL default, Unsloth default). `gspo_values` sets every one of them, so a
# run file means the same on both backends; tests check the TRL column against the installed TRL, and
# `bench/unsloth_defaults.py` checks the Unsloth column on a GPU machine. None in the Unsloth column is a sentinel
# that Unsloth resolves itself, as noted.
BACKEND_DEFAULTS = {
    "learning_rate": (1e-6, 5e-5),
    "per_device_train_batch_size": (8, 4),
    "gradient_accumulation_steps": (1, 2),
    "weight_decay": (0.0, 0.001),
    "warmup_steps": (0, 0.1),
    "seed": (42, 3407),
    "optim": ("adamw_torch_fused", "adamw_8bit"),
    "logging_steps": (10, 1),
    "logging_nan_inf_filter": (True, False),
    "beta": (0.0, None),  # Unsloth: 0.0 for dapo / dr_grpo, 0.001 for any other loss_type (grpo included)
    "loss_type": ("dapo", None),  # Unsloth: None -> "dapo", with a note
    "scale_rewards": ("group", "group"),  # same default, but Unsloth turns "group" into "none" when dr_grpo
    "mask_truncated_completions": (False, None),  # Unsloth: None -> False, but True for an explicit loss "dapo"
    "epsilon_high": (None, None),  # both None -> epsilon, but Unsloth sets 0.28 for "dapo", 5.0 for "cispo"
    "vllm_importance_sampling_correction": (True, False),  # only acts with use_vllm; vlrl generates without vLLM
    "router_aux_loss_coef": (None, 0.0),  # TRL: the model's own coefficient; 0.0 for dense Qwen-VL
}


def gspo_values(recipe: str = "gspo", **overrides) -> dict:
    """The GSPO recipe as plain `GRPOConfig` keyword arguments (what `gspo_config` builds); keyword overrides win.

    >>> v = gspo_values()
    >>> v["loss_type"], v["scale_rewards"], v["importance_sampling_level"], v["max_grad_norm"]
    ('dr_grpo', 'none', 'sequence', 0.1)
    >>> v = gspo_values("gspo-paper", gradient_accumulation_steps=4)
    >>> v["loss_type"], v["epsilon"], v["gradient_accumulation_steps"], v["steps_per_generation"]
    ('grpo', 0.0003, 1, 4)
    """
    import torch

    from vlrl.rewards import REWARD_WEIGHTS

    if recipe not in RECIPES:
        raise ConfigError(f"recipe {recipe!r} is unknown; choose one of {', '.join(RECIPES)}.")
    cuda = torch.cuda.is_available()
    values = dict(
        output_dir="runs/gspo",
        learning_rate=5e-6,  # RL on a 4-bit base: small steps keep the policy near the instruct model
        lr_scheduler_type="cosine",
        warmup_steps=0.1,  # a fraction below 1 is a ratio of the total steps (transformers 5); Unsloth's default
        optim="adamw_8bit" if cuda and _has_bitsandbytes() else "adamw_torch",  # 8-bit states: ~6 bytes/param less
        weight_decay=0.1,  # Unsloth's GSPO notebook value (TRL 0.0, Unsloth 0.001: stated, so both agree)
        per_device_train_batch_size=8,
        gradient_accumulation_steps=4,  # 8 x 4 = 32 completions per optimizer step = 8 prompts x 4 generations
        num_generations=4,  # the group each advantage is relative to
        max_completion_length=1024,  # room for the reasoning block; longer ones are cut (and counted as clipped)
        num_train_epochs=1,
        max_grad_norm=0.1,  # RL gradients are noisy; clip hard
        reward_weights=list(REWARD_WEIGHTS),  # R = 0.3 * format + 1.0 * correctness
        temperature=1.0,  # sample from the policy itself: the importance ratios assume it
        seed=0,  # TRL 42, Unsloth 3407: stated, so both draw the same samples
        logging_steps=1,  # every step into train_log.jsonl
        logging_nan_inf_filter=False,  # a NaN loss must show in the log, not be averaged away
        router_aux_loss_coef=0.0,  # dense models: no MoE auxiliary loss (TRL resolves 0.0; Unsloth sets 0.0)
        vllm_importance_sampling_correction=False,  # vlrl generates with the policy itself, no vLLM mismatch
        save_only_model=False,  # checkpoints keep optimizer, scheduler and RNG state, so --resume is exact
        report_to="none",  # no experiment tracker unless asked ([training] report_to)
        trackio_static_space_id=False,  # with trackio: never publish the metrics as a Space on the Hub; they stay local
        bf16=cuda and torch.cuda.is_bf16_supported(),
        fp16=False,
        gradient_checkpointing=cuda,  # saves activation memory on GPU; on CPU (tiny model) it only costs time
        use_cpu=not cuda,
        **RECIPES[recipe],
    )
    values.update(overrides)
    if recipe == "gspo-paper" and not {"steps_per_generation", "generation_batch_size"} & set(overrides):
        # The paper splits each rollout into mini-batches, one optimizer step each, so the sequence ratios (and the
        # clip range) act on slightly off-policy data. Keep the rollout size (batch x accumulation) and make each
        # accumulation slice its own optimizer step, as TRL's documented setting does (accumulation 1, 4 steps).
        values["steps_per_generation"] = values["gradient_accumulation_steps"]
        values["gradient_accumulation_steps"] = 1
    return values


def gspo_config(output_dir: str = "runs/gspo", recipe: str = "gspo", **overrides):
    """The GSPO recipe as a `trl.GRPOConfig` (Unsloth's subclass once unsloth is imported); keyword overrides win.

    Defaults: learning_rate 5e-6, cosine schedule, adamw_8bit (adamw_torch without CUDA/bitsandbytes), batch 8 x 4
    accumulation, 4 generations, 1024 completion tokens, 1 epoch, max_grad_norm 0.1, sequence-level importance
    sampling, loss "dr_grpo", reward weights 0.3 / 1.0; every field in `BACKEND_DEFAULTS` stated explicitly.
    `recipe="gspo-paper"` is TRL's documented GSPO setting instead (loss "grpo", clip 3e-4 / 4e-4).

    >>> args = gspo_config("/tmp/vlrl-doctest")
    >>> args.loss_type, args.beta, args.mask_truncated_completions, args.num_generations
    ('dr_grpo', 0.0, False, 4)
    """
    from trl import GRPOConfig

    return GRPOConfig(**gspo_values(recipe, output_dir=output_dir, **overrides))


def _has_bitsandbytes() -> bool:
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        return False
    return True
