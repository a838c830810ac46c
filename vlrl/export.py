"""Export: the LoRA adapter (verified after writing), merged checkpoints and GGUF files.

Every export is loaded back from disk and checked; an untrained adapter (all lora_B zero) is an error, not a file.
"""

from __future__ import annotations

from pathlib import Path


class ExportError(RuntimeError):
    """An export that failed its verification; the message says what was wrong and what to do."""


def lora_b_stats(adapter_dir: str | Path) -> dict:
    """Reads the saved adapter's lora_B tensors from disk: how many, how many non-zero, and whether all are finite."""
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
            "completions of each prompt scored the same). Warm-start the model or check the rewards.")
    return stats


def export_adapter(model, processor, output_dir: str | Path) -> dict:
    """Saves the PEFT adapter and processor files to `output_dir`, then verifies the adapter read back from disk."""
    output_dir = Path(output_dir)
    model.save_pretrained(str(output_dir))
    processor.save_pretrained(str(output_dir))
    return verify_adapter(output_dir)
