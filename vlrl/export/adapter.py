"""The LoRA adapter: saved with its processor files and model card, then verified, and loaded back onto its base.

    stats = export_adapter(model, processor, "runs/demo/adapter", run_dir="runs/demo")

An adapter that exists is one that works: every lora_B is finite and at least one is non-zero (an untrained adapter
is an error, not a file), and the adapter read back from disk through PEFT has the trained config's arithmetic, every
trained tensor bit for bit, and the in-memory model's logits on the fixed probe (`vlrl.export.probe`) within
`TOLERANCE["adapter"]`. `load_adapted` puts a saved adapter on its base model, which is
where the merged and GGUF exports start.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from vlrl.base.errors import ExportError
from vlrl.export.card import write_model_card
from vlrl.export.probe import TOLERANCE, logits_gap, probe_inputs, probe_logits
from vlrl.model.loading import load_model


def lora_b_stats(adapter_dir: str | Path) -> dict:
    """Reads the saved adapter's lora_B tensors from disk: how many, how many non-zero, and whether all are finite.

    Returns:
        `lora_B_tensors`, `nonzero_lora_B`, `all_finite` and `max_abs_lora_B`.

    Raises:
        ExportError: no adapter_model.safetensors in `adapter_dir`.
    """
    from safetensors.torch import load_file

    path = Path(adapter_dir) / "adapter_model.safetensors"
    if not path.exists():
        raise ExportError(f"no adapter weights at {path}")
    tensors = {k: v for k, v in load_file(str(path)).items() if "lora_B" in k}
    return {
        "lora_B_tensors": len(tensors),
        "nonzero_lora_B": sum(int(v.abs().sum().item() > 0) for v in tensors.values()),
        "all_finite": all(bool(v.isfinite().all()) for v in tensors.values()),
        "max_abs_lora_B": max((v.abs().max().item() for v in tensors.values()), default=0.0),
    }


def verify_adapter(adapter_dir: str | Path) -> dict:
    """Checks a saved adapter: lora_B present, finite, and not all zero. Returns the stats; raises ExportError."""
    stats = lora_b_stats(adapter_dir)
    if stats["lora_B_tensors"] == 0:
        raise ExportError(f"{adapter_dir} holds no lora_B tensors: it is not a LoRA adapter.")
    if not stats["all_finite"]:
        raise ExportError(f"{adapter_dir} has non-finite lora_B values: training diverged; lower the learning rate.")
    if stats["nonzero_lora_B"] == 0:
        raise ExportError(
            f"every lora_B in {adapter_dir} is zero: the adapter is untrained (GSPO had no reward signal: all "
            "completions of each prompt scored the same; train_log.jsonl's reward_std is 0). Give the model one: "
            "on the local tiny model raise [model] warm_start_steps (the tiny preset uses 150), on another run "
            "`vlrl sft` first; or raise [training] num_generations or temperature so its completions differ.")
    return stats


def export_adapter(model, processor, output_dir: str | Path, *, run_dir: str | Path | None = None,
                   gathered: dict | None = None, log=print) -> dict:
    """Saves the PEFT adapter, processor files and a model card, then verifies the adapter read back from disk.

    Args:
        model: the LoRA-wrapped model (a PEFT model) as trained.
        processor: its processor, saved beside the adapter so the folder loads on its own.
        output_dir: the adapter folder (created).
        run_dir: the run directory, whose config.toml and comparison.json fill the model card.
        gathered: under FSDP, the LoRA weights gathered whole from every process (`distributed.gathered_lora`):
            saved instead of the model's own shards, and the files read back are checked against them exactly
            (the logit check needs the whole model in one process).

    Returns:
        The lora_B stats, `reload_gap` (logit gap of the read-back adapter vs the in-memory one, at most
        `TOLERANCE["adapter"]`), `adapter_effect` (gap of base vs base + adapter), `bytes` and `seconds`.

    Raises:
        ExportError: an untrained or non-finite adapter, or a read-back adapter whose logits differ.
    """
    started = time.time()
    output_dir = Path(output_dir)
    model.save_pretrained(str(output_dir), state_dict=gathered)  # None: the model's own weights
    processor.save_pretrained(str(output_dir))
    stats = verify_adapter(output_dir)
    stats.update(check_reload(model, processor, output_dir) if gathered is None else
                 check_saved(model, output_dir, gathered))
    stats["bytes"] = (output_dir / "adapter_model.safetensors").stat().st_size
    stats["seconds"] = round(time.time() - started, 2)
    write_model_card(output_dir, stats, run_dir=run_dir)
    what = "logit gap" if gathered is None else "gap to the weights gathered from every process"
    log(f"adapter: {stats['nonzero_lora_B']}/{stats['lora_B_tensors']} lora_B non-zero, read-back {what} "
        f"{stats['reload_gap']:.1e} (tolerance {stats['reload_tolerance']:.0e}) -> {output_dir}")
    return stats


def reload_tolerance(model) -> float:
    """The read-back tolerance for a model's precision: float32 reproduces the logits exactly; in bf16 on a GPU the
    trained model may run other kernels than the read-back one (Unsloth's fused LoRA: a 3.0e-3 gap measured)."""
    import torch

    dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()}
    if dtypes <= {torch.float32}:
        return TOLERANCE["adapter"]
    return TOLERANCE["adapter-fp16"] if dtypes <= {torch.float32, torch.float16} else TOLERANCE["adapter-bf16"]


# The LoraConfig fields that change what an adapter computes: a saved config that differs in one of them loads into
# another model than the one trained, whatever its tensors hold.
ARITHMETIC_FIELDS = ("r", "lora_alpha", "use_rslora", "use_dora", "target_modules", "exclude_modules", "rank_pattern",
                     "alpha_pattern", "fan_in_fan_out", "layers_to_transform", "layers_pattern", "bias",
                     "modules_to_save")


def check_reload(model, processor, adapter_dir: str | Path) -> dict:
    """Reads the saved adapter back through PEFT into the trained model's own LoRA layers and compares: the config's
    arithmetic, every tensor bit for bit, and the probe logits; then puts the trained tensors back.

    The files go where the trained weights were (PEFT's `set_peft_model_state_dict`, its key mapping and casts), so
    both probes run the same modules, kernels and compiled graphs. A copy loaded beside under another adapter name
    runs other code on some stacks (Unsloth's compiled decoder blocks on the 8B shape: a 3.8e-2 logit gap for
    identical tensors, bench/results/unsloth.md), which would hide a wrong file inside that noise or fail a right one.

    Returns:
        `reload_gap`, `reload_tolerance`, `adapter_effect` (the gap of base vs base + adapter) and `reload_check`.

    Raises:
        ExportError: `model` is no PEFT model; the saved config changes the arithmetic; a tensor is missing, extra or
            different; the read-back logits differ; or the adapter changes nothing.
    """
    if not hasattr(model, "disable_adapter") or not hasattr(model, "peft_config"):
        raise ExportError(f"{type(model).__name__} is not a PEFT model; export_adapter needs the LoRA-wrapped model.")
    from peft import get_peft_model_state_dict, set_peft_model_state_dict
    from safetensors.torch import load_file

    from vlrl.engine.weights import without_kernels

    active = model.active_adapter
    check_config(model.peft_config[active], adapter_config(adapter_dir), adapter_dir)
    trained = {k: v.detach().clone() for k, v in get_peft_model_state_dict(model, adapter_name=active).items()}
    saved = load_file(str(Path(adapter_dir) / "adapter_model.safetensors"))
    same_names(saved, trained, adapter_dir, "the trained weights")
    inputs = probe_inputs(processor)
    with without_kernels():  # the same arithmetic in every probe: the files are what is checked
        reference = probe_logits(model, inputs)
        with model.disable_adapter():
            base = probe_logits(model, inputs)
        try:
            set_peft_model_state_dict(model, saved, adapter_name=active)
            reloaded = probe_logits(model, inputs)
        finally:
            set_peft_model_state_dict(model, trained, adapter_name=active)
    gap, effect = logits_gap(reference, reloaded), logits_gap(reference, base)
    tolerance = reload_tolerance(model)
    if not gap <= tolerance:
        raise ExportError(f"the adapter read back from {adapter_dir} gives different logits than the trained model "
                          f"(gap {gap:.2e} > {tolerance:.0e}): the saved files do not reproduce it.")
    same_values(saved, trained, adapter_dir, "the trained weights")
    if effect == 0.0:
        raise ExportError(f"the adapter in {adapter_dir} does not change the model's logits at all: it is untrained.")
    return {"reload_gap": gap, "reload_tolerance": tolerance, "adapter_effect": effect,
            "reload_check": "config, tensors and logits"}


def check_config(trained, saved: dict, adapter_dir: str | Path) -> None:
    """Raises ExportError when the saved adapter_config.json differs from the trained LoraConfig in a field of
    `ARITHMETIC_FIELDS` (a set and a list of the same module names are the same)."""
    def norm(value):
        return sorted(value) if isinstance(value, set | list | tuple) else value

    ours = trained.to_dict()
    differ = [f for f in ARITHMETIC_FIELDS if norm(ours.get(f)) != norm(saved.get(f))]
    if differ:
        f = differ[0]
        raise ExportError(f"the adapter_config.json in {adapter_dir} says {f} = {saved.get(f)!r} where the trained "
                          f"adapter has {ours.get(f)!r}: loaded elsewhere it would compute another model.")


def check_saved(model, adapter_dir: str | Path, gathered: dict) -> dict:
    """The saved adapter's tensors against the LoRA weights gathered from every process (FSDP): the same names, the
    same values, bit for bit.

    Raises:
        ExportError: a tensor missing, extra or different.
    """
    from peft import get_peft_model_state_dict
    from safetensors.torch import load_file

    expected = {k: v.detach().cpu() for k, v in get_peft_model_state_dict(model, state_dict=gathered).items()}
    saved = load_file(str(Path(adapter_dir) / "adapter_model.safetensors"))
    same_names(saved, expected, adapter_dir, "the gathered weights")
    same_values(saved, expected, adapter_dir, "the gathered weights")
    return {"reload_gap": 0.0, "reload_tolerance": 0.0, "adapter_effect": None, "reload_check": "gathered weights"}


def same_names(saved: dict, expected: dict, adapter_dir: str | Path, what: str) -> None:
    """ExportError unless the saved adapter's tensors are named as `expected`'s (PEFT's state-dict keys)."""
    if set(saved) != set(expected):
        raise ExportError(f"the adapter in {adapter_dir} holds other tensors than {what}: "
                          f"{sorted(set(saved) ^ set(expected))[:4]}")


def same_values(saved: dict, expected: dict, adapter_dir: str | Path, what: str) -> None:
    """ExportError unless every saved tensor equals `expected`'s of its name, bit for bit (compared in float32)."""
    gaps = {k: (saved[k].float().cpu() - expected[k].float().cpu()).abs().max().item() for k in expected}
    changed = [k for k, gap in gaps.items() if gap != 0.0]
    if changed:
        raise ExportError(f"the adapter read back from {adapter_dir} differs from {what} in {len(changed)} of "
                          f"{len(expected)} tensors (first: {changed[0]}; by up to {max(gaps.values()):.2e}): the "
                          "saved files do not reproduce it.")


def adapter_config(adapter_dir: str | Path) -> dict:
    """The saved adapter's adapter_config.json (base model, r, alpha, targets); ExportError when there is none."""
    path = Path(adapter_dir) / "adapter_config.json"
    if not path.exists():
        raise ExportError(f"no adapter at {adapter_dir} (adapter_config.json is missing); export the adapter first.")
    return json.loads(path.read_text())


def load_adapted(adapter_dir: str | Path, *, base: str | Path | None = None):
    """(PEFT model, processor): the base checkpoint with the saved adapter on top, float32 on CPU, bf16 on CUDA.

    Args:
        adapter_dir: a saved adapter (adapter_config.json + adapter_model.safetensors).
        base: the base checkpoint; default: the adapter's `base_model_name_or_path`. Give the 16-bit model here
            when the adapter was trained on a 4-bit one, so the merge is not done into quantized weights.
    """
    from peft import PeftModel

    adapter_dir = Path(adapter_dir)
    base = str(base or adapter_config(adapter_dir)["base_model_name_or_path"])
    saved = (adapter_dir / "processor_config.json").exists() or (adapter_dir / "preprocessor_config.json").exists()
    # the adapter's own processor when it holds one: the base's is then not loaded (2-3 s of tokenizer parsing)
    model, processor = load_model(base, backend="transformers", processor=not saved)
    if saved:
        from transformers import AutoProcessor

        processor = AutoProcessor.from_pretrained(str(adapter_dir))
    return PeftModel.from_pretrained(model, str(adapter_dir)), processor
