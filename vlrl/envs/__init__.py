"""Environments for episode runs: the interface (`base`), the environments vlrl ships, and `make()`.

    from vlrl.envs import make
    env = make("grid")                       # a procedurally generated grid: reach the goal (learnable on CPU)
    env = make("crafter", size=128)          # the Crafter game
    env = make("http://127.0.0.1:8765")      # an environment served by `vlrl serve-env` in another process
"""

from __future__ import annotations

import importlib
import inspect
import json

from vlrl.envs.base import Env, Observation, Step, parse_actions  # noqa: F401
from vlrl.errors import ConfigError

# name -> "module:class", imported on use (crafter's package is an optional extra).
ENVIRONMENTS = {"grid": "vlrl.envs.grid:GridEnv", "crafter": "vlrl.envs.crafter:CrafterEnv"}


def make(name: str, **options) -> Env:
    """The environment `name` (a key of ENVIRONMENTS, or the http:// URL of a `vlrl serve-env` server) built with
    `options` (its own keyword arguments, e.g. `size`)."""
    if name.startswith(("http://", "https://")):
        from vlrl.envs.remote import RemoteEnv

        return RemoteEnv(name, **options)
    if name not in ENVIRONMENTS:
        raise ConfigError(f"unknown environment {name!r}; choose one of {', '.join(ENVIRONMENTS)}, or the URL of a "
                          "`vlrl serve-env` server (http://127.0.0.1:PORT).")
    module, cls = ENVIRONMENTS[name].split(":")
    cls = getattr(importlib.import_module(module), cls)
    accepted = inspect.signature(cls).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in accepted.values()):
        unknown = sorted(set(options) - set(accepted))
        if unknown:
            raise ConfigError(f"environment {name!r} has no option {', '.join(map(repr, unknown))}; its options are "
                              f"{', '.join(accepted) or 'none'}.")
    return cls(**options)


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
