"""Run configuration: `RunConfig` read from TOML ([model] [data] [training] [eval] [export]), presets, command-line
overrides (`--set section.key=value`), and validation.

Everything is validated before any model loads, and every problem is reported in one pass: an unknown key, a wrong
type or an inconsistent combination is one line of a `ConfigError` that names the key, the value and the fix.

    >>> config = preset("tiny", overrides=["training.max_steps=2", "name=quick"])
    >>> config.name, config.training.max_steps
    ('quick', 2)
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
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
    # The reward set (vlrl.rewards.REWARD_SETS): "mathvista", MathVista's string and number rules; "symbolic" also
    # accepts an equivalent expression (math-verify), for geo3k-style answers such as 2\sqrt{3}.
    reward: str = "mathvista"
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
# The models vlrl builds and warm-starts itself (vlrl.tiny, vlrl.warmstart), by name -> size; tiny-small: the GPU
# learning demonstration's model.
LOCAL_MODELS = {"tiny": "tiny", "tiny-small": "small"}
EXPORT_FORMATS = ("lora", "merged16", "merged4", "gguf")
REWARDS = ("mathvista", "symbolic")  # the reward sets of vlrl.rewards.reward_funcs
# What transformers 5.17 accepts as report_to (its INTEGRATION_TO_CALLBACK, plus "all" and "none"); tests check it.
TRACKERS = ("none", "all", "tensorboard", "trackio", "wandb", "mlflow", "comet_ml", "azure_ml", "neptune",
            "codecarbon", "clearml", "dagshub", "flyte", "dvclive", "swanlab", "kubeflow")


def _did_you_mean(word: str, choices) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" Did you mean {close[0]!r}?" if close else ""


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, str)):
        return json.dumps(value)
    return repr(value)


def _coerce(where: str, key: str, value, expected: str, example):
    """`value` checked against the field's type (an int is accepted for a float); raises ConfigError naming the
    right form."""
    kind = {"int": int, "float": float, "bool": bool, "str": str}.get(expected, None)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind is not None and (type(value) is not kind):
        name = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}[kind]
        raise ConfigError(f"{where} {key} = {value!r} has the wrong type: {key} takes {name}; "
                          f"write it like {key} = {_toml_value(example)}.")
    if expected == "list[str]" and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
        raise ConfigError(f"{where} {key} = {value!r} must be a list of strings, e.g. {key} = [\"lora\"].")
    return value


# --- reading -------------------------------------------------------------------------------------------------------

def from_dict(data: dict, *, overrides=(), num_processes: int | None = None) -> RunConfig:
    """Builds and validates a RunConfig from a dict shaped like the TOML file, after applying `overrides`
    (`section.key=value` strings, see `apply_overrides`). Every problem is collected into one ConfigError.

    >>> from_dict({"training": {"num_generations": 3}})
    Traceback (most recent call last):
    ...
    vlrl.errors.ConfigError: the generation batch (per_device_train_batch_size 8 x 1 process x gradient_accumulation_steps 4 = 32) must be a multiple of [training] num_generations = 3, so every prompt's group is complete; set num_generations to a divisor of 32 (e.g. 4) or change the batch.
    """
    problems: list[str] = []
    data = apply_overrides(data, overrides)
    config = RunConfig()
    for key, value in data.items():
        try:
            if key == "name":
                config.name = _coerce("top level", "name", value, "str", "my-run")
            elif key not in _SECTIONS:
                raise ConfigError(f"unknown section [{key}]; a run file has name and the sections "
                                  f"{', '.join(f'[{s}]' for s in _SECTIONS)}.{_did_you_mean(key, _SECTIONS)}")
            elif not isinstance(value, dict):
                raise ConfigError(f"{key} = {value!r} must be a section [{key}] of settings, not a single value.")
            else:
                problems += _fill(getattr(config, key), key, value)
        except ConfigError as err:
            problems += err.problems
    problems += problems_of(config, num_processes=num_processes)
    if problems:
        raise ConfigError(problems)
    return config


def _fill(section, name: str, values: dict) -> list[str]:
    """Sets a section's fields from `values`; returns the problems (unknown keys, wrong types), leaving those fields
    at their defaults so the other checks still run."""
    problems = []
    fields = {f.name: f.type for f in dataclasses.fields(section)}
    for key, value in values.items():
        if key not in fields:
            problems.append(f"unknown key [{name}] {key} = {value!r}; [{name}] takes {', '.join(fields)}."
                            f"{_did_you_mean(key, fields)}")
            continue
        try:
            setattr(section, key, _coerce(f"[{name}]", key, value, fields[key], getattr(section, key)))
        except ConfigError as err:
            problems += err.problems
    return problems


def apply_overrides(data: dict, overrides) -> dict:
    """`data` (a run file's dict) with each `section.key=value` of `overrides` set, as `--set` gives them on the
    command line (nanoGPT's configurator is the model). The value is read as a TOML value when it is one (4, 1e-5,
    true, ["lora", "gguf"], "text"), else taken as a plain string; `name=...` sets the run's name.

    >>> apply_overrides({"training": {"max_steps": 8}}, ["training.max_steps=2", "data.tasks=['count']"])
    {'training': {'max_steps': 2}, 'data': {'tasks': ['count']}}
    """
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in data.items()}
    problems = []
    for text in overrides or ():
        key, sep, raw = str(text).partition("=")
        path = key.strip().split(".")
        if not sep or not all(path) or len(path) > 2:
            problems.append(f"--set {text!r} must look like section.key=value (e.g. training.max_steps=4) or "
                            "name=value.")
            continue
        try:
            value = tomllib.loads(f"v = {raw.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw.strip()  # a bare word: a string, as nanoGPT's configurator takes it
        if len(path) == 1:
            out[path[0]] = value
        elif not isinstance(out.get(path[0], {}), dict):
            problems.append(f"--set {text!r}: {path[0]} is not a section.")
        else:
            out.setdefault(path[0], {})[path[1]] = value
    if problems:
        raise ConfigError(problems)
    return out


def load(path: str | Path, *, overrides=(), num_processes: int | None = None) -> RunConfig:
    """Reads and validates a run file (TOML), with `--set` overrides applied first."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"no run file at {path}; give the path of a TOML run file, or --preset "
                          f"({', '.join(presets())}).") from None
    except IsADirectoryError:
        raise ConfigError(f"{path} is a directory, not a run file; a run directory's own file is "
                          f"{path / 'config.toml'}.") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path} is not valid TOML: {err}") from None
    return from_dict(data, overrides=overrides, num_processes=num_processes)


def presets() -> list[str]:
    return sorted(p.name.removesuffix(".toml") for p in resources.files("vlrl.presets").iterdir()
                  if p.name.endswith(".toml"))


def preset(name: str, *, overrides=(), num_processes: int | None = None) -> RunConfig:
    """A preset shipped with vlrl (`tiny`, `qwen3-vl-8b-mathvista`, ...), with `--set` overrides applied first."""
    if name not in presets():
        raise ConfigError(f"unknown preset {name!r}; choose one of {', '.join(presets())}."
                          f"{_did_you_mean(name, presets())}")
    text = resources.files("vlrl.presets").joinpath(f"{name}.toml").read_text()
    return from_dict(tomllib.loads(text), overrides=overrides, num_processes=num_processes)


def resolve(*, config: str | Path | None = None, preset_name: str | None = None, overrides=(),
            num_processes: int | None = None) -> RunConfig:
    """The configuration a command names: a run file (`--config`), a preset (`--preset`), or a file or preset name
    given alone (`vlrl validate`'s argument: a path that exists, else a preset)."""
    bare_name = config is not None and not Path(config).exists() and not str(config).endswith(".toml") \
        and "/" not in str(config)
    if bare_name and preset_name is None:  # `vlrl validate tiny`: a preset's name
        config, preset_name = None, str(config)
    if config is not None:
        return load(config, overrides=overrides, num_processes=num_processes)
    return preset(str(preset_name), overrides=overrides, num_processes=num_processes)


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


def to_toml(config: RunConfig) -> str:
    """The resolved configuration as TOML (what `config.toml` in a run directory holds)."""
    lines = [f"name = {_toml_value(config.name)}"]
    for section in _SECTIONS:
        lines.append(f"\n[{section}]")
        for key, value in dataclasses.asdict(getattr(config, section)).items():
            lines.append(f"{key} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"


# --- validation ----------------------------------------------------------------------------------------------------

def num_processes() -> int:
    """The processes training runs in: `accelerate launch` and torchrun set WORLD_SIZE in each; 1 otherwise."""
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1


def validate(config: RunConfig, *, num_processes: int | None = None) -> None:
    """Raises one ConfigError listing every problem of `config` (see `problems_of`); returns None when it is sound."""
    problems = problems_of(config, num_processes=num_processes)
    if problems:
        raise ConfigError(problems)


def problems_of(config: RunConfig, *, num_processes: int | None = None) -> list[str]:
    """Every problem of values and combinations, one line each with the rule, the values and the fix.

    Nothing here loads a model or touches the network, so a run file for a hub model validates offline.
    `num_processes` (default: this launch's, `num_processes()`) enters the batch rules.
    """
    from vlrl.recipe import RECIPES
    from vlrl.synthetic import ALL_TASKS

    processes = num_processes or globals()["num_processes"]()
    t, m, d, e = config.training, config.model, config.data, config.eval
    problems = []
    add = problems.append
    if not re.fullmatch(r"[A-Za-z0-9._-]+", config.name):
        add(f"name = {config.name!r} names the run directory (runs/<name>); use letters, digits, '.', '_' or '-' "
            "only, e.g. name = \"my-run\".")
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
            add(f"[{section}] {key} = {value} must be positive; set it to a number above 0.")
    for section, key, value in [("model", "warm_start_steps", m.warm_start_steps),
                                ("model", "warm_start_items", m.warm_start_items), ("data", "seed", d.seed),
                                ("training", "seed", t.seed),
                                ("training", "generation_batch_size", t.generation_batch_size)]:
        if value < 0:
            add(f"[{section}] {key} = {value} must be 0 or more.")
    if not m.name_or_path.strip():
        add('[model] name_or_path is empty; give a hub id (e.g. "unsloth/Qwen3-VL-8B-Instruct-unsloth-bnb-4bit"), '
            'a local checkpoint directory, or "tiny".')
    if m.backend not in BACKENDS:
        add(f"[model] backend = {m.backend!r} is unknown; choose one of {', '.join(BACKENDS)}."
            f"{_did_you_mean(m.backend, BACKENDS)}")
    if not 0 <= m.lora_dropout < 1:
        add(f"[model] lora_dropout = {m.lora_dropout} must be in [0, 1); 0 is the recipe's value.")
    for key in ("warm_start_steps", "warm_start_items"):
        if getattr(m, key) and m.name_or_path not in LOCAL_MODELS:
            add(f"[model] {key} = {getattr(m, key)} only applies to the models vlrl builds "
                f"({', '.join(LOCAL_MODELS)}), not {m.name_or_path!r}; set it to 0 and run `vlrl sft` first if "
                "this model needs a cold start.")
    problems += _batch_problems(t, processes)
    if not 0 < t.learning_rate < 1:
        add(f"[training] learning_rate = {t.learning_rate} must be in (0, 1); the recipe uses 5e-6.")
    if t.recipe not in RECIPES:
        add(f"[training] recipe = {t.recipe!r} is unknown; choose one of {', '.join(RECIPES)}."
            f"{_did_you_mean(t.recipe, RECIPES)}")
    if t.reward not in REWARDS:
        add(f"[training] reward = {t.reward!r} is unknown; choose \"mathvista\" (MathVista's string and number "
            f"rules) or \"symbolic\" (also equivalent expressions, for geo3k).{_did_you_mean(t.reward, REWARDS)}")
    if not 0 < t.temperature < 10:
        add(f"[training] temperature = {t.temperature} must be in (0, 10): 0 samples identical completions (no "
            "group to compare) and Unsloth refuses 10 or more; the recipe uses 1.0.")
    if t.max_steps == 0 or t.max_steps < -1:
        add(f"[training] max_steps = {t.max_steps}: use -1 to train num_train_epochs, or a positive number of "
            "optimizer steps.")
    if t.max_steps == -1 and t.num_train_epochs <= 0:
        add(f"[training] num_train_epochs = {t.num_train_epochs} must be positive when max_steps = -1; set "
            "num_train_epochs = 1 or a positive max_steps.")
    if not 0 <= t.stop_on_degeneration <= 1:
        add(f"[training] stop_on_degeneration = {t.stop_on_degeneration} is a share of completions: use 0 (never "
            "stop) or a value in (0, 1], e.g. 0.5.")
    if d.hold_out < 1:
        add(f"[data] hold_out = {d.hold_out} must be at least 1: the before/after eval needs items.")
    if d.image_size < 32:
        add(f"[data] image_size = {d.image_size} is smaller than one merged Qwen-VL patch (32 px); use 32 or more "
            "(64 for the tiny preset, 512 for real models).")
    if d.source == "synthetic":
        if 1 <= d.hold_out and d.hold_out >= d.num_items:
            add(f"[data] hold_out = {d.hold_out} must be smaller than num_items = {d.num_items}, or nothing is "
                "left to train on; raise num_items or lower hold_out.")
        if d.difficulty not in (1, 2, 3):
            add(f"[data] difficulty = {d.difficulty} must be 1, 2 or 3.")
        for task in d.tasks:
            if task not in ALL_TASKS:
                add(f"[data] tasks names {task!r}, which vlrl.synthetic does not generate; choose from "
                    f"{', '.join(ALL_TASKS)}.{_did_you_mean(task, ALL_TASKS)}")
    for budget, name in ((t.max_completion_length, "[training] max_completion_length"),
                         (e.max_new_tokens, "[eval] max_new_tokens")):
        if m.max_seq_length < d.max_prompt_tokens + budget:
            add(f"[model] max_seq_length = {m.max_seq_length} is shorter than [data] max_prompt_tokens "
                f"({d.max_prompt_tokens}) + {name} ({budget}); raise max_seq_length to at least "
                f"{d.max_prompt_tokens + budget} or lower {name.split()[-1]}.")
    problems += _tracker_problems(t.report_to)
    unknown = [f for f in config.export.formats if f not in EXPORT_FORMATS]
    if unknown:
        add(f"[export] formats = {config.export.formats} has unknown {unknown}; use any of "
            f"{', '.join(EXPORT_FORMATS)}.")
    return problems


def _tracker_problems(report_to) -> list[str]:
    """Names only: whether a tracker's package is installed is checked by transformers when the run starts, so a run
    file that names one validates offline on any machine."""
    trackers = [report_to] if isinstance(report_to, str) else report_to
    if not isinstance(trackers, list) or not all(isinstance(x, str) for x in trackers):
        return [(f'[training] report_to = {report_to!r} must be a tracker name or a list of them, e.g. report_to = '
                 '"tensorboard" or ["tensorboard", "trackio"]; "none" turns tracking off.')]
    problems = [f"[training] report_to names {tracker!r}, which transformers does not report to; choose from "
                f"{', '.join(TRACKERS)}.{_did_you_mean(tracker, TRACKERS)}" for tracker in trackers
                if tracker not in TRACKERS]
    if len(trackers) > 1 and {"none", "all"} & set(trackers):
        problems.append(f'[training] report_to = {report_to!r} mixes "none" or "all" with other trackers; write '
                        'report_to = "none", report_to = "all" (every installed tracker), or a list of names.')
    return problems


def _batch_problems(t: TrainingConfig, processes: int) -> list[str]:
    """GSPO compares completions of one prompt: every batch TRL forms must hold whole groups of num_generations."""
    if t.num_generations < 2:
        return [(f"[training] num_generations = {t.num_generations} must be at least 2: GSPO compares completions "
                 "of the same prompt, and one has no group to compare with.")]
    if t.per_device_train_batch_size <= 0 or t.gradient_accumulation_steps <= 0:
        return []  # reported as not positive
    problems = []
    unit = t.per_device_train_batch_size * processes  # one micro-batch across every process
    plural = "process" if processes == 1 else "processes"
    generation_batch = unit * t.gradient_accumulation_steps
    if generation_batch % t.num_generations:
        divisors = [g for g in range(2, generation_batch + 1) if generation_batch % g == 0]
        problems.append(
            f"the generation batch (per_device_train_batch_size {t.per_device_train_batch_size} x {processes} "
            f"{plural} x gradient_accumulation_steps {t.gradient_accumulation_steps} = {generation_batch}) must be a "
            f"multiple of [training] num_generations = {t.num_generations}, so every prompt's group is complete; "
            f"set num_generations to a divisor of {generation_batch} (e.g. {_nearest(divisors, t.num_generations)}) "
            "or change the batch.")
    if t.generation_batch_size:
        if t.recipe == "gspo-paper":
            problems.append(
                f"[training] generation_batch_size = {t.generation_batch_size} cannot be combined with recipe "
                '"gspo-paper", which sets the rollout size itself (batch x accumulation, split into optimizer '
                "steps); remove one of the two.")
        step = math.lcm(unit, t.num_generations)
        if t.generation_batch_size % step:
            problems.append(
                f"[training] generation_batch_size = {t.generation_batch_size} must be a multiple of both the "
                f"global micro-batch (per_device_train_batch_size {t.per_device_train_batch_size} x {processes} "
                f"{plural} = {unit}) and num_generations ({t.num_generations}), e.g. {step}; 0 decodes a whole "
                "optimizer step's rollouts at once.")
    return problems


def _nearest(values: list[int], target: int) -> int:
    return min(values, key=lambda v: (abs(v - target), -v)) if values else 2
