"""Environments for episode runs: the interface (`base`), the environments vlrl ships, and `make()`.

    from vlrl.envs import make
    env = make("grid")                       # a procedurally generated grid: reach the goal (learnable on CPU)
    env = make("crafter", size=128)          # the Crafter game
    env = make("http://127.0.0.1:8765")      # an environment served by `vlrl serve-env` in another process
    env = make("gymnasium:FrozenLake-v1")    # a Gymnasium environment, pictured, with named actions
    env = make("openenv:http://127.0.0.1:8000", action_field="message")   # any OpenEnv server
"""

from __future__ import annotations

import importlib
import inspect
import json

from vlrl.base.errors import ConfigError
from vlrl.envs.base import Env, Observation, Step, parse_actions  # noqa: F401
from vlrl.envs.base import option_problems as base_option_problems

# name -> "module:class", imported on use (crafter's package is an optional extra).
ENVIRONMENTS = {"grid": "vlrl.envs.grid:GridEnv", "crafter": "vlrl.envs.crafter:CrafterEnv"}
# name prefixes of environments from elsewhere: prefix -> "module:class", built with what follows the prefix.
PREFIXES = {"gymnasium:": "vlrl.envs.gymnasium_env:GymnasiumEnv", "openenv:": "vlrl.envs.openenv_client:OpenEnvEnv"}


def make(name: str, **options) -> Env:
    """The environment `name` built with `options` (its own keyword arguments, e.g. `size`), once `check` passes.

    Args:
        name: a key of ENVIRONMENTS, the http:// URL of a `vlrl serve-env` server, "gymnasium:ID" (a Gymnasium
            environment, options to gymnasium.make) or "openenv:URL" (an OpenEnv server).

    Returns:
        The environment, not yet reset.

    Raises:
        ConfigError: an unknown name, or options `check` refuses (every problem, one line each).
    """
    cls, argument = environment_class(name)
    check(name, options)
    return cls(argument, **options) if argument is not None else cls(**options)


def environment_class(name: str) -> tuple[type, str | None]:
    """(the class that builds `name`, the argument it takes before the options: a URL or a Gymnasium id, else
    None). Imports vlrl's own module only: Crafter, Gymnasium or a server are needed once it is built.

    Raises:
        ConfigError: `name` is no environment vlrl knows.
    """
    if name.startswith(("http://", "https://")):
        from vlrl.envs.remote import RemoteEnv

        return RemoteEnv, name
    for prefix, target in PREFIXES.items():
        if name.startswith(prefix) and len(name) > len(prefix):
            module, cls = target.split(":")
            return getattr(importlib.import_module(module), cls), name[len(prefix):]
    if name not in ENVIRONMENTS:
        raise ConfigError(f"unknown environment {name!r}; choose one of {', '.join(ENVIRONMENTS)}, "
                          "gymnasium:ID, openenv:URL, or the URL of a `vlrl serve-env` server "
                          "(http://127.0.0.1:PORT).")
    module, cls = ENVIRONMENTS[name].split(":")
    return getattr(importlib.import_module(module), cls), None


def option_problems(name: str, options) -> list[str]:
    """Every problem of an environment's options, one line each: an option it does not take, a value of the wrong
    type or out of its bounds (the class's `OPTIONS`). The one check of environment options: `make` calls it, so
    `vlrl run`, `vlrl env play` and `vlrl serve-env` (a refused option is its 400) do, and `vlrl validate` reads a
    run file's [env] options through it. Nothing is built or contacted; a server's own options are its to check.

    >>> option_problems("grid", {"size": "abc", "shaping": True})
    ["grid: size must be a whole number in 2..64, got 'abc'"]
    """
    cls, _ = environment_class(name)
    if not isinstance(options, dict) or not all(isinstance(key, str) for key in options):
        return [f"the options of {name!r} must be a table of settings, e.g. {{size = 5}}, got {options!r}"]
    problems = []
    accepted = inspect.signature(cls).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in accepted.values()):
        unknown = sorted(set(options) - set(accepted))
        if unknown:
            problems.append(f"environment {name!r} has no option {', '.join(map(repr, unknown))}; its options are "
                            f"{', '.join(accepted) or 'none'}.")
    return problems + base_option_problems(name, getattr(cls, "OPTIONS", {}), options)


def check(name: str, options) -> None:
    """Raises a ConfigError listing every problem `option_problems` finds in `options` for `name`."""
    problems = option_problems(name, options)
    if problems:
        raise ConfigError(problems)


def env_options(env_config) -> dict:
    """The options a run's [env] builds its environment with: `options`, and `actions` when the run names them.

    >>> from vlrl.config.sections import EnvConfig
    >>> env_options(EnvConfig(name="gymnasium:CarRacing-v3", options={"continuous": False}, actions=["a", "b"]))
    {'continuous': False, 'actions': ['a', 'b']}
    """
    options = dict(env_config.options)
    if getattr(env_config, "actions", None):
        options["actions"] = list(env_config.actions)
    return options


def parse_options(pairs) -> dict:
    """`--set key=value` pairs as environment options: each value read as JSON when it is (numbers, true/false,
    null), else kept as text.

    >>> parse_options(["size=128", "text=false", "target=collect_wood", "ratio=0.5"])
    {'size': 128, 'text': False, 'target': 'collect_wood', 'ratio': 0.5}
    """
    options = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"environment option {pair!r} is not key=value; write e.g. --set size=128.")
        try:
            options[key.strip()] = json.loads(value)
        except ValueError:
            options[key.strip()] = value
    return options
