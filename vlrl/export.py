"""Export what a run trained: the LoRA adapter, a merged checkpoint, and GGUF files for llama.cpp — each verified.

    vlrl export runs/demo --format lora | merged16 | merged4 | gguf

Every export is read back from disk and checked against the model it came from, so a file that exists is a file
that works:

- `lora` -> adapter/: the PEFT adapter, the processor files and a model card (README.md). Every lora_B is finite and
  at least one is non-zero (an untrained adapter is an error, not a file), and the adapter read back from disk gives
  the in-memory model's logits on a fixed probe (an image and a question).
- `merged16` / `merged4` -> merged16/, merged4/: base + adapter folded into one checkpoint (bf16, or bitsandbytes
  NF4 on CUDA). Its logits match base + adapter within the dtype's tolerance (`TOLERANCE`), no LoRA tensor is left,
  and every tensor the adapter does not touch (the vision tower among them) equals the base's.
- `gguf` -> gguf/: model-<type>.gguf (text) + mmproj-<type>.gguf (vision) from the merged model, and
  adapter-<type>.gguf (a llama.cpp LoRA adapter for the base model's GGUF), written by llama.cpp's own converters.
  llama.cpp itself (llama-cpp-python) then loads them: the merged GGUF, and the base GGUF with the adapter GGUF, give
  the HF merged model's next-token logits on a text prompt; the mmproj loads as a vision projector, and its image
  embeddings match the HF vision tower's.

Logit gaps are `max |a - b| / max |a|` over every position and vocabulary entry of the probe: 0 means identical,
and one number reads the same for the tiny model and an 8B one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from vlrl.errors import ExportError

# Tolerances on the logit gap, with the gap measured on the tiny model in brackets (CPU, float32 compute;
# bench/results/export.md): each leaves several times that margin, while a broken merge or conversion lands far
# above (the tiny base without its adapter: 0.21).
TOLERANCE = {
    "adapter": 1e-5,  # the same weights read back, float32 [0.0]
    "adapter-bf16": 1e-2,  # read back into a bf16 model: Unsloth's fused LoRA kernels vs PEFT's path [GPU: 3.0e-3]
    "adapter-fp16": 5e-3,  # likewise in float16 (not measured; fp16's 10-bit mantissa rounds finer than bf16's)
    "fp32": 1e-4,  # W + s*B@A folded into W vs the LoRA path beside W: float32 rounding [5e-7]
    "fp16": 5e-3,  # every merged weight rounded to float16 [5e-4]
    "bf16": 3e-2,  # every merged weight rounded to bfloat16, 8-bit mantissa [3e-3]
    "4bit": 0.5,  # NF4 (16 levels per weight) vs the 16-bit merge: a sanity bound only; measure on a GPU
    "4bit-reload": 1e-3,  # the exact check of merged4: the checkpoint read back vs the same weights in memory
    "gguf-f32": 1e-4,  # llama.cpp's float32 kernels vs PyTorch's, float32 KV cache [1.4e-6]
    "gguf-f16": 5e-3,  # [5.8e-4]
    "gguf-bf16": 3e-2,  # [7.4e-3]
    "gguf-q8_0": 5e-2,  # [8.3e-3]
    "mmproj": 1e-3,  # image embeddings, llama.cpp's vision encoder vs HF's; at least the GGUF type's [f32 1.9e-4]
}
MERGED_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "4bit": "bfloat16"}
GGUF_TYPES = ("f32", "f16", "bf16", "q8_0")  # k-quants need rows of 256: not for 64-wide tiny tensors
FORMATS = ("lora", "merged16", "merged4", "gguf")
LLAMA_CPP_PYTHON = "0.3.36"  # the llama-cpp-python release whose bundled llama.cpp converters vlrl runs
PROBE_QUESTION = "How many bars does the chart show? Answer inside <SOLUTION>...</SOLUTION>."
RELOADED = "vlrl_reloaded"  # the adapter name the read-back copy gets while it is compared


# --- the adapter ----------------------------------------------------------------------------------------------


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


def export_adapter(model, processor, output_dir: str | Path, *, run_dir: str | Path | None = None,
                   log=print) -> dict:
    """Saves the PEFT adapter, processor files and a model card, then verifies the adapter read back from disk.

    Args:
        model: the LoRA-wrapped model (a PEFT model) as trained.
        processor: its processor, saved beside the adapter so the folder loads on its own.
        output_dir: the adapter folder (created).
        run_dir: the run directory, whose config.toml and comparison.json fill the model card.

    Returns:
        The lora_B stats, `reload_gap` (logit gap of the read-back adapter vs the in-memory one, at most
        `TOLERANCE["adapter"]`), `adapter_effect` (gap of base vs base + adapter), `bytes` and `seconds`.

    Raises:
        ExportError: an untrained or non-finite adapter, or a read-back adapter whose logits differ.
    """
    started = time.time()
    output_dir = Path(output_dir)
    model.save_pretrained(str(output_dir))
    processor.save_pretrained(str(output_dir))
    stats = verify_adapter(output_dir)
    stats.update(_check_reload(model, processor, output_dir))
    stats["bytes"] = (output_dir / "adapter_model.safetensors").stat().st_size
    stats["seconds"] = round(time.time() - started, 2)
    write_model_card(output_dir, stats, run_dir=run_dir)
    log(f"adapter: {stats['nonzero_lora_B']}/{stats['lora_B_tensors']} lora_B non-zero, read-back logit gap "
        f"{stats['reload_gap']:.1e} (tolerance {reload_tolerance(model):.0e}) -> {output_dir}")
    return stats


def reload_tolerance(model) -> float:
    """The read-back tolerance for a model's precision: float32 reproduces the logits exactly; in bf16 on a GPU the
    trained model may run other kernels than the read-back one (Unsloth's fused LoRA: a 3.0e-3 gap measured)."""
    import torch

    dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()}
    if dtypes <= {torch.float32}:
        return TOLERANCE["adapter"]
    return TOLERANCE["adapter-fp16"] if dtypes <= {torch.float32, torch.float16} else TOLERANCE["adapter-bf16"]


def _check_reload(model, processor, adapter_dir: Path) -> dict:
    """Loads the saved adapter beside the trained one (no second base model) and compares their probe logits."""
    if not hasattr(model, "load_adapter") or not hasattr(model, "disable_adapter"):
        raise ExportError(f"{type(model).__name__} is not a PEFT model; export_adapter needs the LoRA-wrapped model.")
    inputs = probe_inputs(processor)
    flags = {name: p.requires_grad for name, p in model.named_parameters()}  # set_adapter changes them
    active = model.active_adapter
    reference = probe_logits(model, inputs)
    with model.disable_adapter():
        base = probe_logits(model, inputs)
    model.load_adapter(str(adapter_dir), adapter_name=RELOADED)
    try:
        model.set_adapter(RELOADED)
        reloaded = probe_logits(model, inputs)
    finally:
        model.set_adapter(active)
        model.delete_adapter(RELOADED)
        for name, p in model.named_parameters():
            p.requires_grad_(flags.get(name, False))
    gap, effect = logits_gap(reference, reloaded), logits_gap(reference, base)
    tolerance = reload_tolerance(model)
    if not gap <= tolerance:
        raise ExportError(f"the adapter read back from {adapter_dir} gives different logits than the trained model "
                          f"(gap {gap:.2e} > {tolerance:.0e}): the saved files do not reproduce it.")
    if effect == 0.0:
        raise ExportError(f"the adapter in {adapter_dir} does not change the model's logits at all: it is untrained.")
    return {"reload_gap": gap, "reload_tolerance": tolerance, "adapter_effect": effect}


# --- the probe and the logit gap ------------------------------------------------------------------------------


def probe_image(width: int = 128, height: int = 96):
    """A fixed bar-chart-like RGB image; 128x96 is a whole number of 32-pixel merged patches (4 x 3), so neither
    the HF processor nor llama.cpp resizes it."""
    import numpy as np
    from PIL import Image

    y, x = np.mgrid[0:height, 0:width]
    bars = ((x // 16) % 2 == 1) & (y > height - 12 * (1 + (x // 32)))
    rgb = np.stack([np.where(bars, 40, 230), np.where(bars, 90, 230 - y), (x * 255) // (width - 1)], axis=-1)
    return Image.fromarray(rgb.astype(np.uint8))


def probe_inputs(processor, *, image: bool = True) -> dict:
    """The fixed probe as model inputs: one user turn (the probe image, then `PROBE_QUESTION`), generation prompt on."""
    content = ([{"type": "image"}] if image else []) + [{"type": "text", "text": PROBE_QUESTION}]
    text = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                         tokenize=False)
    if image:
        return dict(processor(text=[text], images=[probe_image()], return_tensors="pt"))
    return dict(processor(text=[text], return_tensors="pt"))


def probe_logits(model, inputs: dict):
    """The model's float32 logits (positions x vocabulary) on `inputs`, in eval mode, on the CPU."""
    import torch

    device = next(model.parameters()).device
    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = model(**{k: v.to(device) for k, v in inputs.items()})
    finally:
        model.train(training)
    return out.logits[0].float().cpu()


def logits_gap(reference, other) -> float:
    """max |reference - other| / max |reference|: 0 for identical logits, comparable across model sizes.

    >>> import torch
    >>> logits_gap(torch.tensor([[2.0, -4.0]]), torch.tensor([[2.0, -3.0]]))
    0.25
    """
    import torch

    reference, other = torch.as_tensor(reference).float(), torch.as_tensor(other).float()
    if reference.shape != other.shape:
        raise ExportError(f"logits of shape {tuple(other.shape)} cannot be compared with {tuple(reference.shape)}.")
    return float((reference - other).abs().max() / reference.abs().max().clamp_min(1e-30))


# --- the model card -------------------------------------------------------------------------------------------


def write_model_card(adapter_dir: str | Path, stats: dict, *, run_dir: str | Path | None = None) -> Path:
    """Writes README.md into the adapter folder: base model, data, recipe, metrics, checks and how to load it.

    Everything on the card is read from the files beside it (adapter_config.json, the run's config.toml and
    comparison.json); what is not recorded is said to be unknown rather than guessed.
    """
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib

    adapter_dir = Path(adapter_dir)
    adapter = json.loads((adapter_dir / "adapter_config.json").read_text())
    base = adapter.get("base_model_name_or_path") or "unknown"
    config = comparison = None
    if run_dir is not None:
        run_dir = Path(run_dir)
        if (run_dir / "config.toml").exists():
            config = tomllib.loads((run_dir / "config.toml").read_text())
        if (run_dir / "comparison.json").exists():
            comparison = json.loads((run_dir / "comparison.json").read_text())
    model_cfg = (config or {}).get("model", {})
    name = (config or {}).get("name", adapter_dir.parent.name if run_dir else adapter_dir.name)
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
    lines += ["", "## Checks at export", "",
              (f"- lora_B: {stats['nonzero_lora_B']} of {stats['lora_B_tensors']} non-zero, all finite: "
               f"{stats['all_finite']}"),
              (f"- read back from disk: logit gap {stats['reload_gap']:.1e} vs the trained model "
               f"(tolerance {stats.get('reload_tolerance', TOLERANCE['adapter']):.0e}); base vs base + adapter: {stats['adapter_effect']:.2e}"), "",
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
    value, ci = comparison.get(f"{metric}_{side}"), comparison.get(f"{metric}_{side}_ci95")
    if value is None:
        return "n/a"
    return f"{value:.1%}" + (f" (95% CI {ci[0]:.1%} to {ci[1]:.1%})" if ci else "")


def _number(value) -> str:
    return "n/a" if value is None else f"{value:.3g}"


# --- merged checkpoints ---------------------------------------------------------------------------------------


def load_adapted(adapter_dir: str | Path, *, base: str | Path | None = None):
    """(PEFT model, processor): the base checkpoint with the saved adapter on top, float32 on CPU, bf16 on CUDA.

    Args:
        adapter_dir: a saved adapter (adapter_config.json + adapter_model.safetensors).
        base: the base checkpoint; default: the adapter's `base_model_name_or_path`. Give the 16-bit model here
            when the adapter was trained on a 4-bit one, so the merge is not done into quantized weights.
    """
    from peft import PeftModel

    from vlrl.model import load_model

    adapter_dir = Path(adapter_dir)
    base = str(base or _adapter_config(adapter_dir)["base_model_name_or_path"])
    model, processor = load_model(base, backend="transformers")
    if (adapter_dir / "processor_config.json").exists() or (adapter_dir / "preprocessor_config.json").exists():
        from transformers import AutoProcessor

        processor = AutoProcessor.from_pretrained(str(adapter_dir))
    return PeftModel.from_pretrained(model, str(adapter_dir)), processor


def _adapter_config(adapter_dir: Path) -> dict:
    path = Path(adapter_dir) / "adapter_config.json"
    if not path.exists():
        raise ExportError(f"no adapter at {adapter_dir} (adapter_config.json is missing); export the adapter first.")
    return json.loads(path.read_text())


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
              **extra, "tensors_unchanged": checked, "vision_tensors_unchanged": vision, "bytes": _size(output_dir),
              "seconds": round(time.time() - started, 2)}
    log(f"merged ({dtype}): logit gap {gap:.1e} vs base + adapter (tolerance {tolerance:.0e}), {checked} untouched "
        f"tensors equal the base's ({vision} in the vision tower) -> {output_dir}")
    return result


def _require_bitsandbytes_cuda() -> None:
    import importlib.util

    import torch

    if not torch.cuda.is_available():
        raise ExportError("merged4 (a 4-bit checkpoint) needs a CUDA GPU for bitsandbytes; on this machine export "
                          "merged16 instead, or run the 4-bit export on a GPU.")
    if importlib.util.find_spec("bitsandbytes") is None:
        raise ImportError("merged4 needs bitsandbytes: pip install 'vlrl[gpu]'")


def _save_4bit(merged, processor, output_dir: Path, inputs: dict):
    """Quantizes the merged 16-bit model's language layers to NF4 (bitsandbytes) and saves it; vision stays 16-bit,
    as the vision tower is small and most sensitive to quantization. Returns the quantized model's probe logits."""
    import torch
    from transformers import AutoModelForImageTextToText, BitsAndBytesConfig

    with tempfile.TemporaryDirectory(dir=output_dir.parent) as tmp:
        merged.save_pretrained(tmp)
        quantization = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16,
            bnb_4bit_use_double_quant=True, llm_int8_skip_modules=["visual", "lm_head"])
        quantized = AutoModelForImageTextToText.from_pretrained(tmp, quantization_config=quantization,
                                                                device_map="cuda")
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


def _size(path: Path) -> int:
    path = Path(path)
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# --- GGUF (llama.cpp) -----------------------------------------------------------------------------------------


def llama_cpp_tools(cache_dir: str | Path | None = None, *, log=print) -> Path:
    """The folder holding llama.cpp's converters (convert_hf_to_gguf.py, convert_lora_to_gguf.py, conversion/,
    gguf-py/), from the same llama.cpp that the installed llama-cpp-python runs.

    PyPI's `gguf` package lags behind llama.cpp's converter, so vlrl runs the converter and gguf-py that
    llama-cpp-python's source release bundles. In order: `$VLRL_LLAMA_CPP` (a llama.cpp checkout), the cache
    (`$VLRL_CACHE/llama.cpp-<version>`), else `pip download` of the llama-cpp-python source release, of which only
    those files (MIT licensed, about 2 MB) are kept.
    """
    if os.environ.get("VLRL_LLAMA_CPP"):
        folder = Path(os.environ["VLRL_LLAMA_CPP"])
        if not (folder / "convert_hf_to_gguf.py").exists():
            raise ExportError(f"VLRL_LLAMA_CPP={folder} holds no convert_hf_to_gguf.py; point it at a llama.cpp "
                              "checkout, or unset it to let vlrl fetch the converters.")
        return folder
    from vlrl.cache import cache_dir as default_cache

    version = _llama_cpp_version()
    folder = Path(cache_dir or default_cache()) / f"llama.cpp-{version}"
    if (folder / "convert_lora_to_gguf.py").exists():
        return folder
    log(f"fetching llama.cpp's converters from the llama-cpp-python {version} source release -> {folder}")
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent) as tmp:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
             f"llama-cpp-python=={version}", "--dest", tmp],
            capture_output=True, text=True, check=False)
        archives = list(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        if done.returncode or not archives:
            raise ExportError(f"could not download llama-cpp-python {version}'s source release to get llama.cpp's "
                              f"converters:\n{done.stderr[-2000:]}\nWith no network, set VLRL_LLAMA_CPP to a "
                              "llama.cpp checkout.")
        staging = Path(tmp) / "llama.cpp"
        _extract_converters(archives[0], staging)
        try:
            staging.rename(folder)
        except OSError:  # another process finished first: keep its copy
            if not (folder / "convert_lora_to_gguf.py").exists():
                raise
    return folder


def _llama_cpp_version() -> str:
    """The installed llama-cpp-python's version (so the converters match the runtime), else the pinned one."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("llama-cpp-python")
    except PackageNotFoundError:
        return LLAMA_CPP_PYTHON


def _extract_converters(archive: Path, target: Path) -> None:
    import tarfile

    keep = ("convert_hf_to_gguf.py", "convert_lora_to_gguf.py", "LICENSE", "conversion/", "gguf-py/gguf/",
            "gguf-py/LICENSE")
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            _, sep, inner = member.name.partition("/vendor/llama.cpp/")
            if not sep or not inner.startswith(keep) or not (member.isfile() or member.isdir()):
                continue
            member.name = inner
            tar.extract(member, target, filter="data")
    if not (target / "convert_hf_to_gguf.py").exists():
        raise ExportError(f"{archive.name} holds no vendor/llama.cpp/convert_hf_to_gguf.py.")


def export_gguf(adapter_dir: str | Path, output_dir: str | Path, *, outtype: str = "f16",
                base: str | Path | None = None, name: str | None = None, log=print) -> dict:
    """Writes model-<outtype>.gguf + mmproj-<outtype>.gguf (the merged model: text + vision) and
    adapter-<outtype>.gguf (a llama.cpp LoRA adapter for the base model's GGUF), then verifies them with llama.cpp.

    Checks: the GGUF reader finds the architecture (qwen3vl / clip with the qwen3vl_merger projector / a LoRA
    adapter), and every tensor name and shape the HF checkpoints imply. llama.cpp tokenizes the text probe as HF
    does, and its logits on it, from the merged GGUF and from the base GGUF with the adapter GGUF, are within
    `TOLERANCE["gguf-<outtype>"]` of the HF merged model's (the base GGUF alone must not be). The mmproj loads in
    llama.cpp's multimodal library, and its embeddings of the probe image (with the deepstack features) are within
    `TOLERANCE["mmproj"]` (or the GGUF type's, if larger) of the HF vision tower's.

    Args:
        adapter_dir: the saved adapter.
        output_dir: the folder for the three files (created).
        outtype: "f32", "f16", "bf16" or "q8_0".
        base: the base checkpoint (a local folder or a hub id in the local cache); default: the adapter's.
        name: the model name written into the GGUF metadata.

    Returns:
        the files with their sizes, the structural checks, the logit gaps, and the seconds each step took.
    """
    if outtype not in GGUF_TYPES:
        raise ValueError(f"outtype {outtype!r}: choose one of {', '.join(GGUF_TYPES)}.")
    llama_cpp = _require_llama_cpp()
    tools = llama_cpp_tools(log=log)
    started = time.time()
    adapter_dir, output_dir = Path(adapter_dir), Path(output_dir)
    verify_adapter(adapter_dir)
    base_dir = _local_checkpoint(base or _adapter_config(adapter_dir)["base_model_name_or_path"])
    output_dir.mkdir(parents=True, exist_ok=True)
    files = {kind: output_dir / f"{kind}-{outtype}.gguf" for kind in ("model", "mmproj", "adapter")}
    seconds = {}
    with tempfile.TemporaryDirectory(dir=output_dir) as tmp:
        tmp = Path(tmp)
        # Merge in the base's own precision (float32 for the tiny model), or bf16, so GGUF gets the merged numbers.
        merge_dtype = "fp32" if outtype == "f32" or _checkpoint_dtype(base_dir) == "float32" else "bf16"
        t = time.time()
        export_merged(adapter_dir, tmp / "merged", dtype=merge_dtype, base=base_dir, log=log)
        seconds["merge"] = time.time() - t
        base_gguf = tmp / f"base-{outtype}.gguf"
        extra = ["--model-name", name] if name else []
        for kind, script, args in (
                ("model", "convert_hf_to_gguf.py", [tmp / "merged", *extra]),
                ("mmproj", "convert_hf_to_gguf.py", [tmp / "merged", "--mmproj", *extra]),
                ("adapter", "convert_lora_to_gguf.py", [adapter_dir, "--base", base_dir]),
                ("base (for the adapter check)", "convert_hf_to_gguf.py", [base_dir])):
            t = time.time()
            _convert(tools, script, args, files.get(kind, base_gguf), outtype)
            seconds[f"convert {kind}"] = time.time() - t
        t = time.time()
        structure = check_gguf_structure(files, tmp / "merged", adapter_dir, tools)
        seconds["read back"] = time.time() - t
        t = time.time()
        numbers = _check_with_llama_cpp(llama_cpp, files, base_gguf, tmp / "merged", outtype)
        seconds["llama.cpp checks"] = time.time() - t
    result = {"files": {k: str(v) for k, v in files.items()}, "bytes": {k: _size(v) for k, v in files.items()},
              "outtype": outtype, **structure, **numbers,
              "seconds": {k: round(v, 2) for k, v in seconds.items()} | {"total": round(time.time() - started, 2)}}
    log(f"gguf ({outtype}): llama.cpp logit gaps {numbers['merged_gap']:.1e} (merged) and "
        f"{numbers['adapter_gap']:.1e} (base + adapter) vs HF, tolerance {numbers['tolerance']:.0e}; "
        f"mmproj image embeddings gap {numbers['mmproj_gap']:.1e} -> {output_dir}")
    return result


def _require_llama_cpp():
    try:
        import llama_cpp
    except ImportError as err:
        raise ImportError("GGUF export is verified with llama.cpp itself: pip install 'vlrl[gguf]' (builds "
                          "llama-cpp-python; a few minutes on first install).") from err
    return llama_cpp


def _local_checkpoint(name_or_path: str | Path) -> Path:
    """A local folder for the converter: the path itself, or the hub id's snapshot in the local HF cache."""
    path = Path(name_or_path)
    if (path / "config.json").exists():
        return path
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(str(name_or_path)))
    except Exception as err:  # offline and not cached, or not a hub id
        raise ExportError(f"the base checkpoint {name_or_path} is neither a local folder nor a downloadable hub id "
                          f"({err}); pass base= (--base) with the base model's folder.") from err


def _checkpoint_dtype(folder: Path) -> str | None:
    config = json.loads((Path(folder) / "config.json").read_text())
    return config.get("dtype") or config.get("torch_dtype") or config.get("text_config", {}).get("dtype")


def _convert(tools: Path, script: str, args: list, outfile: Path, outtype: str) -> None:
    """Runs one of llama.cpp's converters in a subprocess (it brings its own gguf-py); raises ExportError."""
    command = [sys.executable, str(tools / script), *map(str, args), "--outfile", str(outfile), "--outtype", outtype]
    done = subprocess.run(command, capture_output=True, text=True, check=False,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if done.returncode or not Path(outfile).exists():
        raise ExportError(f"llama.cpp's {script} failed (exit {done.returncode}):\n{done.stderr[-3000:]}\n"
                          f"command: {' '.join(command)}")


# HF tensor names -> the GGUF names llama.cpp's qwen3vl text model and qwen3vl_merger projector use. Written out
# here (not taken from gguf-py's own table) so the check does not trust the converter it checks.
TEXT_TENSORS = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}
VISION_TENSORS = {
    "norm1": "ln1", "norm2": "ln2", "attn.qkv": "attn_qkv", "attn.proj": "attn_out", "mlp.linear_fc1": "ffn_up",
    "mlp.linear_fc2": "ffn_down",
}
MERGER_TENSORS = {"norm": "post_ln", "linear_fc1": "0", "linear_fc2": "2"}  # merger.* -> v.post_ln / mm.0 / mm.2
DEEPSTACK_TENSORS = {"norm": "norm", "linear_fc1": "fc1", "linear_fc2": "fc2"}


def gguf_name(hf_name: str, deepstack_indexes: list[int] = ()) -> list[str]:
    """The GGUF tensor name(s) llama.cpp gives an HF Qwen3-VL tensor ([] for one it leaves out).

    >>> gguf_name("model.language_model.layers.1.self_attn.q_proj.weight")
    ['blk.1.attn_q.weight']
    >>> gguf_name("model.visual.patch_embed.proj.weight")  # a Conv3D split into two Conv2Ds along time
    ['v.patch_embd.weight', 'v.patch_embd.weight.1']
    """
    import re

    if hf_name == "lm_head.weight":
        return ["output.weight"]
    if m := re.fullmatch(r"model\.language_model\.(embed_tokens|norm)\.(weight)", hf_name):
        return [{"embed_tokens": "token_embd", "norm": "output_norm"}[m[1]] + ".weight"]
    if m := re.fullmatch(r"model\.language_model\.layers\.(\d+)\.(.+)\.(weight|bias)", hf_name):
        return [f"blk.{m[1]}.{TEXT_TENSORS[m[2]]}.{m[3]}"]
    if hf_name == "model.visual.patch_embed.proj.weight":
        return ["v.patch_embd.weight", "v.patch_embd.weight.1"]
    if m := re.fullmatch(r"model\.visual\.(patch_embed\.proj|pos_embed)\.(weight|bias)", hf_name):
        return [f"v.{'patch_embd' if m[1] == 'patch_embed.proj' else 'position_embd'}.{m[2]}"]
    if m := re.fullmatch(r"model\.visual\.blocks\.(\d+)\.(.+)\.(weight|bias)", hf_name):
        return [f"v.blk.{m[1]}.{VISION_TENSORS[m[2]]}.{m[3]}"]
    if m := re.fullmatch(r"model\.visual\.merger\.(.+)\.(weight|bias)", hf_name):
        part = MERGER_TENSORS[m[1]]
        return [f"v.{part}.{m[2]}" if part == "post_ln" else f"mm.{part}.{m[2]}"]
    if m := re.fullmatch(r"model\.visual\.deepstack_merger_list\.(\d+)\.(.+)\.(weight|bias)", hf_name):
        return [f"v.deepstack.{deepstack_indexes[int(m[1])]}.{DEEPSTACK_TENSORS[m[2]]}.{m[3]}"]
    raise ExportError(f"vlrl does not know the GGUF name of {hf_name}; extend vlrl.export.gguf_name.")


def _gguf_shape(hf_name: str, shape: tuple) -> list[int]:
    """GGUF lists dimensions innermost first (the reverse of PyTorch); the patch Conv3D loses its time axis."""
    if hf_name == "model.visual.patch_embed.proj.weight":
        shape = shape[:2] + shape[3:]
    return list(reversed(shape))


def _gguf_module(tools: Path):
    """llama.cpp's gguf-py from the converters' folder (PyPI's gguf lags behind the converter)."""
    path = str(tools / "gguf-py")
    if path not in sys.path:
        sys.path.insert(0, path)
    import gguf

    return gguf


def check_gguf_structure(files: dict, merged_dir: Path, adapter_dir: Path, tools: Path) -> dict:
    """Reads the three GGUF files back with gguf-py and checks architecture, hyperparameters, tensor names and
    shapes against the HF checkpoints they came from; raises ExportError on any mismatch."""
    from safetensors import safe_open

    gguf = _gguf_module(tools)
    config = json.loads((Path(merged_dir) / "config.json").read_text())
    text, vision = config["text_config"], config["vision_config"]
    deepstack = list(vision.get("deepstack_visual_indexes", []))
    hf = {}
    for path in sorted(Path(merged_dir).glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            hf.update({k: tuple(f.get_slice(k).get_shape()) for k in list(f.keys())})
    expected = {"model": {}, "mmproj": {}}
    for name, shape in hf.items():
        kind = "mmproj" if name.startswith("model.visual.") else "model"
        for gname in gguf_name(name, deepstack):
            expected[kind][gname] = _gguf_shape(name, shape)

    lora = {}
    with safe_open(str(Path(adapter_dir) / "adapter_model.safetensors"), framework="pt") as f:
        for key in list(f.keys()):
            base_name = key.replace("base_model.model.", "", 1).replace(".lora_A.weight", ".weight")
            base_name = base_name.replace(".lora_B.weight", ".weight")
            suffix = ".lora_a" if ".lora_A." in key else ".lora_b"
            for gname in gguf_name(base_name, deepstack):
                lora[gname + suffix] = list(reversed(f.get_slice(key).get_shape()))
    expected["adapter"] = lora

    metadata = {
        "model": {"general.architecture": "qwen3vl", "qwen3vl.block_count": text["num_hidden_layers"],
                  "qwen3vl.embedding_length": text["hidden_size"],
                  "qwen3vl.attention.head_count": text["num_attention_heads"],
                  "qwen3vl.attention.head_count_kv": text["num_key_value_heads"],
                  "qwen3vl.n_deepstack_layers": len(deepstack)},
        "mmproj": {"general.architecture": "clip", "clip.projector_type": "qwen3vl_merger",
                   "clip.has_vision_encoder": True, "clip.vision.block_count": vision["depth"],
                   "clip.vision.embedding_length": vision["hidden_size"],
                   "clip.vision.is_deepstack_layers": [i in deepstack for i in range(vision["depth"])]},
        "adapter": {"general.architecture": "qwen3vl", "general.type": "adapter", "adapter.type": "lora",
                    "adapter.lora.alpha": float(_adapter_config(adapter_dir)["lora_alpha"])},
    }
    checked = {}
    for kind, path in files.items():
        reader = gguf.GGUFReader(str(path))
        for key, want in metadata[kind].items():
            field = reader.fields.get(key)
            got = field.contents() if field is not None else None
            if got != want:
                raise ExportError(f"{path.name}: {key} is {got!r}, expected {want!r}.")
        tensors = {t.name: [int(d) for d in t.shape] for t in reader.tensors}
        if tensors != expected[kind]:
            missing = sorted(set(expected[kind]) - set(tensors))
            extra = sorted(set(tensors) - set(expected[kind]))
            wrong = sorted(k for k in set(tensors) & set(expected[kind]) if tensors[k] != expected[kind][k])
            raise ExportError(f"{path.name}: tensors differ from the HF checkpoint: missing {missing[:5]}, "
                              f"unexpected {extra[:5]}, wrong shape {wrong[:5]}.")
        checked[kind] = len(tensors)
    return {"gguf_tensors_checked": checked}


def _check_with_llama_cpp(llama_cpp, files: dict, base_gguf: Path, merged_dir: Path, outtype: str) -> dict:
    """llama.cpp's logits (merged GGUF; base GGUF + adapter GGUF; base GGUF alone) and image embeddings (mmproj)
    vs the HF merged model's, computed in float32 on the CPU."""
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(str(merged_dir))
    hf = AutoModelForImageTextToText.from_pretrained(str(merged_dir), dtype=torch.float32)
    inputs = probe_inputs(processor, image=False)
    reference = probe_logits(hf, inputs)
    ids = inputs["input_ids"][0].tolist()
    prompt = processor.tokenizer.decode(ids)
    image = processor(text=["<|vision_start|><|image_pad|><|vision_end|>"], images=[probe_image()],
                      return_tensors="pt")
    with torch.no_grad():
        features = hf.model.get_image_features(image["pixel_values"], image["image_grid_thw"])
    # llama.cpp's qwen3vl projector returns each image token's embedding followed by its deepstack features.
    hf_image = torch.cat([features.pooler_output[0], *features.deepstack_features], dim=-1).float()
    del hf

    tolerance = TOLERANCE[f"gguf-{outtype}"]
    llm = _llama(llama_cpp, files["model"])
    try:
        tokens = llm.tokenize(prompt.encode(), add_bos=False, special=True)
        if tokens != ids:
            raise ExportError(f"llama.cpp tokenizes the probe differently from HF ({tokens[:12]}... vs "
                              f"{ids[:12]}...): the GGUF vocabulary is wrong.")
        merged_gap = logits_gap(reference, _llama_logits(llm, ids))
        mmproj_gap = logits_gap(hf_image, _mmproj_embeddings(llm, files["mmproj"], hf_image.shape))
    finally:
        llm.close()
    adapted = _llama(llama_cpp, base_gguf, lora_path=files["adapter"])
    try:
        adapter_gap = logits_gap(reference, _llama_logits(adapted, ids))
    finally:
        adapted.close()
    plain = _llama(llama_cpp, base_gguf)
    try:
        base_gap = logits_gap(reference, _llama_logits(plain, ids))
    finally:
        plain.close()
    for what, gap in (("the merged GGUF", merged_gap), ("the base GGUF with the adapter GGUF", adapter_gap)):
        if not gap <= tolerance:
            raise ExportError(f"llama.cpp's logits from {what} are {gap:.2e} away from the HF merged model's "
                              f"(tolerance {tolerance:.0e} for {outtype}).")
    if not base_gap > tolerance:
        raise ExportError(f"the base GGUF without the adapter is as close to the merged model ({base_gap:.2e}) as "
                          "the tolerance: this check cannot see the adapter; the adapter is too small to verify.")
    mmproj_tolerance = max(TOLERANCE["mmproj"], tolerance)
    if not mmproj_gap <= mmproj_tolerance:
        raise ExportError(f"llama.cpp's image embeddings from {files['mmproj'].name} are {mmproj_gap:.2e} away from "
                          f"the HF vision tower's (tolerance {mmproj_tolerance:.0e}).")
    return {"tokenizer_match": True, "merged_gap": merged_gap, "adapter_gap": adapter_gap,
            "base_without_adapter_gap": base_gap, "tolerance": tolerance, "mmproj_gap": mmproj_gap,
            "mmproj_tolerance": mmproj_tolerance,
            "prompt_tokens": len(ids), "image_tokens": int(hf_image.shape[0])}


def _llama(llama_cpp, path: Path, lora_path: Path | None = None):
    # A float32 KV cache (llama.cpp's default is f16), so the gap measures the GGUF weights, not cache rounding.
    return llama_cpp.Llama(model_path=str(path), lora_path=str(lora_path) if lora_path else None, n_ctx=512,
                           n_batch=512, n_ubatch=512, logits_all=True, n_gpu_layers=0, n_threads=os.cpu_count(),
                           type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32, verbose=False)


def _llama_logits(llm, ids: list[int]):
    """llama.cpp's logits at every position of `ids` (positions x vocabulary)."""
    import numpy as np

    llm.reset()
    llm.eval(ids)
    return np.array(llm.scores[: len(ids)], dtype=np.float32, copy=True)


def _mmproj_embeddings(llm, mmproj: Path, shape):
    """The probe image through llama.cpp's multimodal library (libmtmd) with the mmproj: its output embeddings."""
    import ctypes

    import numpy as np
    from llama_cpp import mtmd_cpp as mtmd
    from llama_cpp._logger import llama_log_callback

    mtmd.mtmd_log_set(llama_log_callback, None)  # libmtmd logs like llama.cpp: errors only, as Llama(verbose=False)
    params = mtmd.mtmd_context_params_default()
    params.use_gpu, params.print_timings, params.warmup = False, False, False
    params.n_threads = os.cpu_count() or 1
    ctx = mtmd.mtmd_init_from_file(str(mmproj).encode(), llm.model, params)
    if not ctx:
        raise ExportError(f"llama.cpp could not load {mmproj} as a multimodal projector.")
    chunks = bitmap = None
    try:
        if not mtmd.mtmd_support_vision(ctx):
            raise ExportError(f"llama.cpp loaded {mmproj}, but it reports no vision support.")
        rgb = np.asarray(probe_image().convert("RGB"), dtype=np.uint8)
        data = (ctypes.c_uint8 * rgb.size).from_buffer_copy(rgb.tobytes())
        bitmap = mtmd.mtmd_bitmap_init(rgb.shape[1], rgb.shape[0], data)
        text = mtmd.mtmd_input_text()
        marker = mtmd.mtmd_default_marker()
        text.text, text.text_len, text.add_special, text.parse_special = marker, len(marker), False, True
        chunks = mtmd.mtmd_input_chunks_init()
        if mtmd.mtmd_tokenize(ctx, chunks, ctypes.byref(text), (mtmd.mtmd_bitmap_p_ctypes * 1)(bitmap), 1) != 0:
            raise ExportError(f"llama.cpp could not tokenize the probe image with {mmproj}.")
        for i in range(mtmd.mtmd_input_chunks_size(chunks)):
            chunk = mtmd.mtmd_input_chunks_get(chunks, i)
            if mtmd.mtmd_input_chunk_get_type(chunk) != mtmd.MTMD_INPUT_CHUNK_TYPE_IMAGE:
                continue
            n_tokens = mtmd.mtmd_input_chunk_get_n_tokens(chunk)
            if n_tokens != shape[0] or mtmd.mtmd_encode_chunk(ctx, chunk) != 0:
                raise ExportError(f"llama.cpp made {n_tokens} image tokens of the probe image with {mmproj}, the "
                                  f"HF processor {shape[0]}.")
            out = mtmd.mtmd_get_output_embd(ctx)
            return np.ctypeslib.as_array(out, shape=(shape[0] * shape[1],)).reshape(shape).copy()
        raise ExportError(f"llama.cpp produced no image chunk for the probe image with {mmproj}.")
    finally:
        if chunks:
            mtmd.mtmd_input_chunks_free(chunks)
        if bitmap:
            mtmd.mtmd_bitmap_free(bitmap)
        mtmd.mtmd_free(ctx)


# --- a run directory ------------------------------------------------------------------------------------------


def export_run(run_dir: str | Path, fmt: str, *, output_dir: str | Path | None = None,
               base: str | Path | None = None, outtype: str = "f16", log=print) -> dict:
    """Exports a finished run's adapter as `fmt` (lora, merged16, merged4 or gguf) and records the checks in the
    run's export.json. The default output folders are RUN_DIR/adapter, merged16, merged4 and gguf.

    Raises:
        ValueError: an unknown format. ExportError: no such run, no adapter, an untrained adapter, or an export
        that fails its verification.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}; choose one of {', '.join(FORMATS)}.")
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ExportError(f"no run directory at {run_dir}; give the --output-dir of a finished `vlrl run`.")
    adapter_dir = run_dir / "adapter"
    if not (adapter_dir / "adapter_config.json").exists():
        raise ExportError(f"{run_dir} holds no adapter (adapter/adapter_config.json): the run has not finished "
                          "training. Finish it with `vlrl run` first.")
    verify_adapter(adapter_dir)  # an untrained adapter stops here, before any model loads
    output_dir = Path(output_dir or run_dir / {"lora": "adapter"}.get(fmt, fmt))
    if fmt == "lora":
        model, processor = load_adapted(adapter_dir, base=base)
        result = export_adapter(model, processor, output_dir, run_dir=run_dir, log=log)
    elif fmt in ("merged16", "merged4"):
        result = export_merged(adapter_dir, output_dir, dtype="bf16" if fmt == "merged16" else "4bit", base=base,
                               log=log)
    else:
        result = export_gguf(adapter_dir, output_dir, outtype=outtype, base=base, name=_run_name(run_dir), log=log)
    record = run_dir / "export.json"
    exports = json.loads(record.read_text()) if record.exists() else {}
    exports[fmt] = {"path": str(output_dir), **result}
    record.write_text(json.dumps(exports, indent=2))
    return result


def _run_name(run_dir: Path) -> str:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib

    config = run_dir / "config.toml"
    return tomllib.loads(config.read_text()).get("name", run_dir.name) if config.exists() else run_dir.name
