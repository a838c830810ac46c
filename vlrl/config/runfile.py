"""Run configuration: `RunConfig` read from TOML ([model] [data] [training] [eval] [export]), presets, command-line
overrides (`--set section.key=value`) and the resolved configuration as TOML. The sections are `vlrl.config.sections`; the
checks are `vlrl.config.validation` (both re-exported here: `config.RunConfig`, `config.validate`).

Everything is validated before any model loads, and every problem is reported in one pass: an unknown key, a wrong
type or an inconsistent combination is one line of a `ConfigError` that names the key, the value and the fix.

    >>> config = preset("tiny", overrides=["training.max_steps=2", "name=quick"])
    >>> config.name, config.training.max_steps
    ('quick', 2)
"""

from __future__ import annotations

import dataclasses
import json

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib
from importlib import resources
from pathlib import Path

from vlrl.base.errors import ConfigError
from vlrl.config.sections import (  # noqa: F401
    _SECTIONS,
    BACKENDS,
    EXPORT_FORMATS,
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
    did_you_mean,
)
from vlrl.config.validation import problems_of, validate  # noqa: F401


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, str)):
        return json.dumps(value)
    if isinstance(value, dict):  # an inline table: [env] options
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in value.items()) + "}"
    return repr(value)


# How a table or list setting is written, for the message that refuses another form.
FORMS = {"options": "{size = 4, difficulty = 1}", "columns": '{question = "prompt", image = "picture"}',
         "tasks": '["count", "bar_value"]', "formats": '["lora"]', "actions": '["left", "right"]'}


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
    if expected == "dict" and not isinstance(value, dict):
        raise ConfigError(f"{where} {key} = {value!r} must be a table, e.g. {key} = {FORMS.get(key, '{...}')}.")
    if expected == "list[str]" and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
        raise ConfigError(f"{where} {key} = {value!r} must be a list of strings, e.g. {key} = "
                          f"{FORMS.get(key, '[...]')}.")
    return value


# --- reading -------------------------------------------------------------------------------------------------------

def from_dict(data: dict, *, overrides=(), num_processes: int | None = None) -> RunConfig:
    """Builds and validates a RunConfig from a dict shaped like the TOML file, after applying `overrides`
    (`section.key=value` strings, see `apply_overrides`). Every problem is collected into one ConfigError.

    >>> from_dict({"training": {"num_generations": 3}})
    Traceback (most recent call last):
    ...
    vlrl.base.errors.ConfigError: the generation batch (per_device_train_batch_size 8 x 1 process x gradient_accumulation_steps 4 = 32) must be a multiple of [training] num_generations = 3, so every prompt's group is complete; set num_generations to a divisor of 32 (e.g. 4) or change the batch.
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
                                  f"{', '.join(f'[{s}]' for s in _SECTIONS)}.{did_you_mean(key, _SECTIONS)}")
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
                            f"{did_you_mean(key, fields)}")
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
        raise ConfigError(f"no run file at {path}; give the path of a TOML run file, or a preset's name instead "
                          f"({', '.join(presets())}; `vlrl presets` describes them).") from None
    except IsADirectoryError:
        raise ConfigError(f"{path} is a directory, not a run file; a run directory's own file is "
                          f"{path / 'config.toml'}.") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path} is not valid TOML: {err}") from None
    return from_dict(data, overrides=overrides, num_processes=num_processes)


def presets() -> list[str]:
    return sorted(p.name.removesuffix(".toml") for p in resources.files("vlrl.presets").iterdir()
                  if p.name.endswith(".toml"))


def preset_summaries() -> list[dict]:
    """Each shipped preset as `{name, model, trains_on}` (`vlrl presets`): its model, and the data set or
    environment it trains on.

    >>> next(p for p in preset_summaries() if p["name"] == "tiny")
    {'name': 'tiny', 'model': 'tiny', 'trains_on': 'data synthetic (96 generated items)'}
    """
    return [{"name": name, "model": preset(name).model.name_or_path, "trains_on": trains_on(preset(name))}
            for name in presets()]


def trains_on(c: RunConfig) -> str:
    """The data set or environment a configuration trains on, in a few words."""
    if c.env.name:
        return f"environment {c.env.name} ({c.env.train_seeds} training seeds, {c.env.eval_seeds} eval seeds)"
    if c.data.source == "synthetic":
        return f"data synthetic ({c.data.num_items} generated items)"
    return f"data {c.data.source} [{c.data.split}]" + (f", eval {c.eval.source} [{c.eval.split}]" if c.eval.source
                                                        else "")


def empty_file_note(path: str | Path | None, config: RunConfig) -> str | None:
    """For a run file that sets nothing (empty, or comments only), what it runs: every default, said, since an empty
    file is more often a mistake than a choice. None for any other file."""
    if path is None or not Path(path).is_file() or tomllib.loads(Path(path).read_text()):
        return None
    steps = f"{config.training.max_steps} steps" if config.training.max_steps > 0 else \
        f"{config.training.num_train_epochs:g} epoch(s)"
    return (f"{path} sets nothing, so it runs every default: run {config.name!r}, model {config.model.name_or_path!r}, "
            f"{trains_on(config)}, {steps}; name a preset instead (`vlrl presets`) or set [model] and [data] in it.")


def preset(name: str, *, overrides=(), num_processes: int | None = None) -> RunConfig:
    """A preset shipped with vlrl (`tiny`, `qwen3-vl-8b-mathvista`, ...), with `--set` overrides applied first."""
    if name not in presets():
        raise ConfigError(f"unknown preset {name!r}; choose one of {', '.join(presets())}."
                          f"{did_you_mean(name, presets())}")
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
