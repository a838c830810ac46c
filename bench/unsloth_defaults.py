"""Checks, on a machine with CUDA and the gpu extra, where Unsloth's GRPOConfig and TRL's disagree by default, and
that vlrl's recipe means the same under both.

It needs no model: it imports unsloth (which replaces `trl.GRPOConfig` with its `UnslothGRPOConfig`), then

1. reads the default of every field in `vlrl.config.runfile.BACKEND_DEFAULTS` from both classes' signatures and compares
   them with the table (Unsloth's None sentinels included),
2. shows the defaults Unsloth changes for a given loss (dr_grpo -> scale_rewards "none"; grpo -> beta 0.001),
3. builds `gspo_config()` for each recipe with both classes and checks that every value vlrl sets survives Unsloth.

    python bench/unsloth_defaults.py [OUTPUT.json]     # default: bench/results/unsloth_defaults.json

Exits 1 if any check fails; the JSON records every value compared.
"""

# ruff: noqa: I001  (unsloth must be imported before trl)
from __future__ import annotations

import inspect
import json
import sys
import tempfile
from pathlib import Path

import unsloth  # noqa: F401  (before trl: it replaces trl.GRPOConfig)
import trl

from vlrl.config import recipe as gspo


def signature_default(cls, field):
    parameter = inspect.signature(cls.__init__).parameters.get(field)
    if parameter is not None and parameter.default is not inspect.Parameter.empty:
        return parameter.default
    return cls.__dataclass_fields__[field].default


def plain(value):
    return getattr(value, "value", value)


def main(output: Path) -> int:
    unsloth_cls = trl.GRPOConfig
    trl_cls = next(c for c in unsloth_cls.__mro__[1:] if c.__name__ == "GRPOConfig")
    failures, report = [], {"unsloth_class": f"{unsloth_cls.__module__}.{unsloth_cls.__name__}", "defaults": {}}
    for field, (trl_expected, unsloth_expected) in gspo.BACKEND_DEFAULTS.items():
        found = {"trl": plain(signature_default(trl_cls, field)), "unsloth": plain(signature_default(unsloth_cls, field))}
        report["defaults"][field] = {**found, "table": [trl_expected, unsloth_expected]}
        if [found["trl"], found["unsloth"]] != [trl_expected, unsloth_expected]:
            failures.append(f"default of {field}: found {found}, table says TRL {trl_expected!r}, "
                            f"Unsloth {unsloth_expected!r}")

    with tempfile.TemporaryDirectory() as tmp:
        conditional = {
            "dr_grpo, scale_rewards unset": ("scale_rewards", {"loss_type": "dr_grpo"}, "group", "none"),
            "grpo, beta unset": ("beta", {"loss_type": "grpo"}, 0.0, 0.001),
        }
        report["conditional"] = {}
        for name, (field, kwargs, trl_expected, unsloth_expected) in conditional.items():
            got = {"trl": plain(getattr(trl_cls(output_dir=tmp, **kwargs), field)),
                   "unsloth": plain(getattr(unsloth_cls(output_dir=tmp, **kwargs), field))}
            report["conditional"][name] = got
            if got != {"trl": trl_expected, "unsloth": unsloth_expected}:
                failures.append(f"{name}: {field} resolved to {got}")

        report["recipes"] = {}
        for recipe in gspo.RECIPES:
            values = gspo.gspo_values(recipe, output_dir=tmp)
            built = {"trl": trl_cls(**values), "unsloth": unsloth_cls(**values)}
            differ = {k: {b: plain(getattr(c, k)) for b, c in built.items()} for k in values
                      if plain(getattr(built["trl"], k)) != plain(getattr(built["unsloth"], k))}
            report["recipes"][recipe] = {"fields_set": len(values), "differ": differ}
            if differ:
                failures.append(f"recipe {recipe}: Unsloth resolved {differ}")

    report["failures"] = failures
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=2, default=str))
    print(json.dumps(report, indent=2, default=str))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "bench/results/unsloth_defaults.json")))
