"""Merged checkpoints: base + adapter folded into one checkpoint (merged16: bf16; merged4: bitsandbytes NF4 on
CUDA), read back from disk and verified.

    export_merged("runs/demo/adapter", "runs/demo/merged16", dtype="bf16")

Three checks, each exact where it can be. The merge: every merged weight is W + scale * B @ A (computed in float32)
within one rounding of the weight's dtype, layer by layer. The save: every tensor read back equals the one saved, bit
for bit, the vision tower and the other tensors the adapter does not touch equal to the base's, and no LoRA tensor
left. The logits: the checkpoint read back gives base + adapter's logits on the fixed probe within the dtype's
tolerance (`TOLERANCE`) where they are computed in float32 (CPU). In bf16 (a GPU) the probe's own rounding grows with
depth (3.8e-2 at the 2B shape after a 2-step run), so there the gap is measured and reported beside the adapter's own
effect, with a warning when bf16 keeps less than half of that effect, and the two exact checks above carry the proof.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
import time
from pathlib import Path

from vlrl.base.errors import ConfigError, ExportError, MissingExtra
from vlrl.export.adapter import load_adapted, verify_adapter
from vlrl.export.probe import TOLERANCE, logits_gap, probe_inputs, probe_logits
from vlrl.model.loading import bnb_4bit_config

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
        raise ConfigError(f"dtype {dtype!r}: choose one of {', '.join(MERGED_DTYPES)}.")
    if dtype == "4bit":
        _require_bitsandbytes_cuda()
    started = time.time()
    adapter_dir, output_dir = Path(adapter_dir), Path(output_dir)
    verify_adapter(adapter_dir)
    model, processor = load_adapted(adapter_dir, base=base)
    inputs = probe_inputs(processor)
    reference = probe_logits(model, inputs)
    with model.disable_adapter():
        effect = logits_gap(reference, probe_logits(model, inputs))
    # The tensors the merge must not change: everything that is not a LoRA-wrapped layer's weight.
    untouched = {name: t.detach().to("cpu", copy=True) for name, t in model.get_base_model().state_dict().items()
                 if "lora_" not in name and ".base_layer." not in name}
    merge = merge_checked(model)
    merged = model.unload()  # the LoRA wrappers off; their base weights already hold the merge
    if output_dir.exists():
        shutil.rmtree(output_dir)
    save_dtype = getattr(torch, MERGED_DTYPES[dtype])
    merged = merged.to(save_dtype)
    saved = {}
    if dtype == "4bit":
        quantized = _save_4bit(merged, processor, output_dir, inputs)
    else:
        saved = {name: _digest(t) for name, t in merged.state_dict().items() if name not in untouched}
        merged.save_pretrained(str(output_dir))
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
    tolerance = TOLERANCE[dtype]
    if compute_dtype == torch.float32 and not gap <= tolerance:
        raise ExportError(f"the merged checkpoint {output_dir} gives logits {gap:.2e} away from base + adapter "
                          f"(tolerance {tolerance:.0e} for {dtype}): the merge or the save is wrong.")
    if compute_dtype != torch.float32 and gap > effect / 2:
        log(f"warning: merged ({dtype}) moves the probe's logits {gap:.1e} from base + adapter, more than half the "
            f"adapter's own effect ({effect:.1e}): most of its updates are below {dtype}'s resolution (a short or "
            "low learning-rate run). The adapter, or a merged fp32 checkpoint, keeps them exactly.")
    state = reloaded.state_dict()
    differ = [name for name, digest in saved.items() if name not in state or _digest(state[name].to(save_dtype)) != digest]
    if differ:
        raise ExportError(f"the merged checkpoint {output_dir} read back differs from the weights saved: "
                          f"{differ[:3]}{'...' if len(differ) > 3 else ''}.")
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
    checked_by = "float32 logits" if compute_dtype == torch.float32 else "exact merge and save checks"
    result = {"path": str(output_dir), "dtype": dtype, "logits_gap": gap, "tolerance": tolerance,
              "adapter_effect": effect, "logits_checked_by": checked_by, **merge, **extra,
              "tensors_read_back_exact": len(saved), "tensors_unchanged": checked, "vision_tensors_unchanged": vision,
              "bytes": disk_size(output_dir), "seconds": round(time.time() - started, 2)}
    log(f"merged ({dtype}): {merge['layers_merged']} layers = W + BA within one rounding, logit gap {gap:.1e} vs base "
        f"+ adapter (adapter's effect {effect:.1e}; tolerance {tolerance:.0e} in float32), {checked} untouched "
        f"tensors equal the base's ({vision} in the vision tower) -> {output_dir}")
    return result


def merge_checked(model) -> dict:
    """Folds each LoRA layer of a PEFT model into its base weight, one layer at a time, and checks every merged
    element against W + delta computed in float32: within one rounding of the weight's dtype (|error| <= eps *
    (|W + delta| + |delta|), the delta itself rounded once). A 4-bit base layer is merged unchecked (re-quantizing
    moves every weight) and counted. Call `model.unload()` afterwards for the merged model.

    Returns:
        `layers_merged`, `layers_quantized` (merged, not checked), `merge_max_error_ulps` (the worst element's error
        in units of its bound) and `weights_changed` (the share of elements the merge changed: near 0 when the
        updates are below the dtype's resolution).

    Raises:
        ExportError: a merged element outside its bound (a wrong scale, transpose or adapter).
    """
    import torch
    from peft.tuners.lora import LoraLayer

    layers = quantized = changed = total = 0
    worst = 0.0
    with torch.no_grad():
        for name, module in model.named_modules():
            if not isinstance(module, LoraLayer) or module.merged:
                continue
            weight = module.get_base_layer().weight
            if not weight.is_floating_point():
                module.merge()
                quantized += 1
                continue
            before = weight.detach().float().clone()
            delta = sum(module.get_delta_weight(a).float() for a in module.active_adapters if a in module.lora_A)
            module.merge()
            after = module.get_base_layer().weight.detach().float()
            expected = before + delta
            bound = torch.finfo(weight.dtype).eps * (expected.abs() + delta.abs()) + torch.finfo(weight.dtype).tiny
            ratio = float(((after - expected).abs() / bound).max())
            if not ratio <= 1.0:
                raise ExportError(f"merging the adapter into {name} gives weights {ratio:.1f}x farther from W + BA than "
                                  f"{weight.dtype}'s rounding allows: the merge is wrong.")
            worst = max(worst, ratio)
            changed += int((after != before).sum())
            total += after.numel()
            layers += 1
    if layers + quantized == 0:
        raise ExportError("the model has no LoRA layer to merge.")
    return {"layers_merged": layers, "layers_quantized": quantized, "merge_max_error_ulps": worst,
            "weights_changed": changed / max(total, 1)}


def _digest(tensor) -> str:
    """A tensor's bytes, hashed: equal digests mean bit-identical tensors of one dtype and shape."""
    import torch

    t = tensor.detach().contiguous().cpu()
    data = t.reshape(-1).view(torch.uint8).numpy().tobytes()
    return hashlib.blake2b(data + f"{t.dtype}{tuple(t.shape)}".encode(), digest_size=16).hexdigest()


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
