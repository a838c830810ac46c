"""Merged checkpoints: base + adapter folded into one checkpoint (merged16: bf16; merged4: bitsandbytes NF4 on
CUDA), read back from disk and verified.

    export_merged("runs/demo/adapter", "runs/demo/merged16", dtype="bf16")

The checkpoint read back gives base + adapter's logits on the fixed probe within the dtype's tolerance
(`TOLERANCE`), holds no LoRA tensor, and every tensor the adapter does not touch (the vision tower among them)
equals the base's, bit for bit.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from vlrl.errors import ExportError, MissingExtra
from vlrl.export.adapter import load_adapted, verify_adapter
from vlrl.export.probe import TOLERANCE, logits_gap, probe_inputs, probe_logits
from vlrl.model import bnb_4bit_config

MERGED_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "4bit": "bfloat16"}


def export_merged(adapter_dir: str | Path, output_dir: str | Path, *, dtype: str = "bf16",
                  base: str | Path | None = None, log=print) -> dict:
    """Folds the saved adapter into the base weights and saves one checkpoint, then verifies it read back from disk.

    Args:
        adapter_dir: the saved adapter (its processor files are copied too).
        output_dir: the merged checkpoint's folder (replaced if it exists).
        dtype: "bf16", "fp16" or "fp32" weights, or "4bit" (bitsandbytes NF4 language model, CUDA only; the
            vision tower stays bf16).
        base: the base checkpoint (see `load_adapted`).

    Returns:
        `logits_gap` (reloaded merged vs base + adapter, at most `TOLERANCE[dtype]`), for 4bit also
        `quantized_reload_gap` (read back vs the quantized weights in memory), `tensors_unchanged` /
        `vision_tensors_unchanged` (tensors the adapter does not touch, equal to the base's), `bytes`, `seconds`.

    Raises:
        ExportError: logits out of tolerance, a LoRA tensor left in the checkpoint, or a changed untouched tensor.
    """
    import torch
    from transformers import AutoModelForImageTextToText

    if dtype not in MERGED_DTYPES:
        raise ValueError(f"dtype {dtype!r}: choose one of {', '.join(MERGED_DTYPES)}.")
    if dtype == "4bit":
        _require_bitsandbytes_cuda()
    started = time.time()
    adapter_dir, output_dir = Path(adapter_dir), Path(output_dir)
    verify_adapter(adapter_dir)
    model, processor = load_adapted(adapter_dir, base=base)
    inputs = probe_inputs(processor)
    reference = probe_logits(model, inputs)
    # The tensors the merge must not change: everything that is not a LoRA-wrapped layer's weight.
    untouched = {name: t.detach().to("cpu", copy=True) for name, t in model.get_base_model().state_dict().items()
                 if "lora_" not in name and ".base_layer." not in name}
    merged = model.merge_and_unload()
    if output_dir.exists():
        shutil.rmtree(output_dir)
    save_dtype = getattr(torch, MERGED_DTYPES[dtype])
    if dtype == "4bit":
        quantized = _save_4bit(merged.to(save_dtype), processor, output_dir, inputs)
    else:
        merged.to(save_dtype).save_pretrained(str(output_dir))
        processor.save_pretrained(str(output_dir))
    del model, merged
    leftover = [k for k in _checkpoint_keys(output_dir) if "lora_" in k or "base_layer" in k]
    if leftover:
        raise ExportError(f"the merged checkpoint {output_dir} still holds LoRA tensors ({leftover[:3]}...).")

    compute_dtype = next(iter(untouched.values())).dtype  # the reference's: float32 on CPU, bf16 on CUDA
    kwargs = {"device_map": "cuda"} if dtype == "4bit" else {"dtype": compute_dtype}
    reloaded = AutoModelForImageTextToText.from_pretrained(str(output_dir), **kwargs)
    if torch.cuda.is_available() and dtype != "4bit":
        reloaded = reloaded.to("cuda")
    reloaded_logits = probe_logits(reloaded, inputs)
    gap = logits_gap(reference, reloaded_logits)
    extra = {}
    if dtype == "4bit":  # NF4 changes the numbers: the exact check is against the same quantized weights in memory
        extra["quantized_reload_gap"] = logits_gap(quantized, reloaded_logits)
        if not extra["quantized_reload_gap"] <= TOLERANCE["4bit-reload"]:
            raise ExportError(f"the 4-bit checkpoint {output_dir} read back gives logits "
                              f"{extra['quantized_reload_gap']:.2e} away from the quantized model it was saved from "
                              f"(tolerance {TOLERANCE['4bit-reload']:.0e}).")
    tolerance = max(TOLERANCE[dtype], TOLERANCE["bf16"] if compute_dtype == torch.bfloat16 else 0.0)
    if not gap <= tolerance:
        raise ExportError(f"the merged checkpoint {output_dir} gives logits {gap:.2e} away from base + adapter "
                          f"(tolerance {tolerance:.0e} for {dtype}): the merge or the save is wrong.")
    state = reloaded.state_dict()
    checked = vision = 0
    for name, before in untouched.items():
        after = state.get(name)
        if after is None or not after.dtype.is_floating_point:
            continue  # a tied copy not saved separately, or a weight bitsandbytes quantized (4bit)
        expected = before.to(save_dtype).to(after.dtype)
        if not torch.equal(expected, after.cpu()):
            raise ExportError(f"{name} differs from the base model's in the merged checkpoint {output_dir}, though "
                              "the adapter does not touch it.")
        checked += 1
        vision += ".visual." in name
    if vision == 0:
        raise ExportError(f"no vision-tower tensor of the merged checkpoint {output_dir} could be compared with the "
                          "base model's.")
    result = {"path": str(output_dir), "dtype": dtype, "logits_gap": gap, "tolerance": tolerance,
              **extra, "tensors_unchanged": checked, "vision_tensors_unchanged": vision,
              "bytes": disk_size(output_dir), "seconds": round(time.time() - started, 2)}
    log(f"merged ({dtype}): logit gap {gap:.1e} vs base + adapter (tolerance {tolerance:.0e}), {checked} untouched "
        f"tensors equal the base's ({vision} in the vision tower) -> {output_dir}")
    return result


def disk_size(path: str | Path) -> int:
    """Bytes on disk of a file, or of every file under a folder.

    >>> disk_size(__file__) > 0
    True
    """
    path = Path(path)
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _require_bitsandbytes_cuda() -> None:
    import importlib.util

    import torch

    if not torch.cuda.is_available():
        raise ExportError("merged4 (a 4-bit checkpoint) needs a CUDA GPU for bitsandbytes; on this machine export "
                          "merged16 instead, or run the 4-bit export on a GPU.")
    if importlib.util.find_spec("bitsandbytes") is None:
        raise MissingExtra("merged4 needs bitsandbytes: pip install 'vlrl[gpu]'")


def _save_4bit(merged, processor, output_dir: Path, inputs: dict):
    """Quantizes the merged 16-bit model's language layers to NF4 (bitsandbytes) and saves it; vision stays 16-bit,
    as the vision tower is small and most sensitive to quantization. Returns the quantized model's probe logits."""
    from transformers import AutoModelForImageTextToText

    with tempfile.TemporaryDirectory(dir=output_dir.parent) as tmp:
        merged.save_pretrained(tmp)
        quantized = AutoModelForImageTextToText.from_pretrained(
            tmp, quantization_config=bnb_4bit_config(skip_modules=["visual", "lm_head"]), device_map="cuda")
        logits = probe_logits(quantized, inputs)
        quantized.save_pretrained(str(output_dir))
    processor.save_pretrained(str(output_dir))
    return logits


def _checkpoint_keys(folder: Path) -> list[str]:
    from safetensors import safe_open

    keys = []
    for path in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            keys.extend(f.keys())
    return keys
