"""The model card of an exported adapter (README.md): base model, data, recipe, results, checks and how to load it.

Everything on the card is read from the files beside it: the adapter's adapter_config.json, and the run's
config.toml and comparison.json (through `vlrl.config.rundir.RunDir`). What is not recorded is said to be unknown rather
than guessed.
"""

from __future__ import annotations

import json
from pathlib import Path

from vlrl.config.rundir import RunDir
from vlrl.export.probe import TOLERANCE


def write_model_card(adapter_dir: str | Path, stats: dict, *, run_dir: str | Path | None = None) -> Path:
    """Writes README.md into the adapter folder: base model, data, recipe, metrics, checks and how to load it.

    Args:
        adapter_dir: the saved adapter (its adapter_config.json names the base model and the LoRA settings).
        stats: the checks `export_adapter` ran (lora_B counts, `reload_gap`, `adapter_effect`).
        run_dir: the run directory, whose config.toml and comparison.json fill the data, recipe and results.

    Returns:
        The path of the card.
    """
    adapter_dir = Path(adapter_dir)
    adapter = json.loads((adapter_dir / "adapter_config.json").read_text())
    base = adapter.get("base_model_name_or_path") or "unknown"
    config = comparison = None
    name = adapter_dir.name
    if run_dir is not None:
        run = RunDir(run_dir)
        name = run.name
        if run.config_file.exists():
            config = run.config.to_dict()
        if run.comparison.exists():
            comparison = json.loads(run.comparison.read_text())
    model_cfg = (config or {}).get("model", {})
    recipe = (config or {}).get("training", {}).get("recipe")
    local_base = Path(base).exists()
    lines = ["---", f"base_model: {base}" if not local_base else "base_model: null  # a local checkpoint, see below",
             "library_name: peft", f"tags: [vlrl, {recipe + ', ' if recipe else ''}lora, vision-language]", "---",
             "", f"# {name}: LoRA adapter trained with vlrl" + (f" ({recipe.upper()})" if recipe else ""), "",
             "## Base model", ""]
    if model_cfg.get("name_or_path") == "tiny":
        warm = model_cfg.get("warm_start_steps", 0)
        lines.append(f"`{base}`: vlrl's offline tiny Qwen3-VL (the real architecture at test sizes, random weights"
                     + (f", then {warm} supervised warm-start steps" if warm else "")
                     + "). A test model for checking the pipeline, not for use.")
    else:
        lines.append(f"`{base}`" + (" (a local checkpoint)" if local_base else ""))
    lines += ["", "## Data", ""]
    if config and "data" in config:
        lines += [f"- {k}: `{v}`" for k, v in config["data"].items()]
    else:
        lines.append("Not recorded: no run directory was given when this adapter was exported.")
    lines += ["", "## Recipe", ""]
    lines.append(f"- LoRA: r = {adapter.get('r')}, alpha = {adapter.get('lora_alpha')}, dropout = "
                 f"{adapter.get('lora_dropout')}, target modules `{adapter.get('target_modules')}`")
    if config and "training" in config:
        lines += [f"- {k}: `{v}`" for k, v in config["training"].items()]
        lines += [f"- model.{k}: `{v}`" for k, v in model_cfg.items() if k not in ("lora_r", "lora_alpha")]
    else:
        lines.append("- training settings: not recorded (no run directory was given)")
    lines += ["", "## Results on the held-out items", ""]
    if comparison:
        c = comparison
        lines += [
            f"{c.get('n_paired', '?')} held-out items, scored before and after training (the run's comparison.json).",
            "", "| | before | after |", "|---|---|---|",
            *(f"| {label} | {_rate(c, metric, 'before')} | {_rate(c, metric, 'after')} |"
              for label, metric in (("accuracy", "accuracy"), ("format", "format"))),
            f"| mean reward | {_number(c.get('reward_mean_before'))} | {_number(c.get('reward_mean_after'))} |", "",
            (f"McNemar exact p = {_number(c.get('mcnemar_p'))} ({len(c.get('wrong_to_right', []))} wrong -> "
             f"right, {len(c.get('right_to_wrong', []))} right -> wrong)."),
        ]
    else:
        lines.append("Not recorded: no comparison.json was found for this adapter.")
    tolerance = stats.get("reload_tolerance", TOLERANCE["adapter"])
    lines += ["", "## Checks at export", "",
              (f"- lora_B: {stats['nonzero_lora_B']} of {stats['lora_B_tensors']} non-zero, all finite: "
               f"{stats['all_finite']}"),
              (f"- read back from disk: logit gap {stats['reload_gap']:.1e} vs the trained model "
               f"(tolerance {tolerance:.0e}); base vs base + adapter: {stats['adapter_effect']:.2e}"
               if stats.get("adapter_effect") is not None else
               f"- read back from disk: equal to the LoRA weights gathered from every process (gap "
               f"{stats['reload_gap']:.1e}); trained sharded (FSDP), so no one process held the model for a logit "
               "check"), "",
              "## How to load", "", "```python", "from peft import PeftModel",
              "from transformers import AutoModelForImageTextToText, AutoProcessor", "",
              f'base = AutoModelForImageTextToText.from_pretrained("{base}")',
              'model = PeftModel.from_pretrained(base, "path/to/this/folder")',
              'processor = AutoProcessor.from_pretrained("path/to/this/folder")', "```", "",
              "Merged checkpoints and GGUF files for llama.cpp: `vlrl export RUN_DIR --format merged16|merged4|gguf`.",
              ""]
    path = adapter_dir / "README.md"
    path.write_text("\n".join(lines))
    return path


def _rate(comparison: dict, metric: str, side: str) -> str:
    """A rate with its confidence interval, as the card's results table shows it.

    >>> _rate({"accuracy_after": 0.25, "accuracy_after_ci95": [0.1, 0.4]}, "accuracy", "after")
    '25.0% (95% CI 10.0% to 40.0%)'
    """
    value, ci = comparison.get(f"{metric}_{side}"), comparison.get(f"{metric}_{side}_ci95")
    if value is None:
        return "n/a"
    return f"{value:.1%}" + (f" (95% CI {ci[0]:.1%} to {ci[1]:.1%})" if ci else "")


def _number(value) -> str:
    return "n/a" if value is None else f"{value:.3g}"
