"""`load_model()`: a vision-language checkpoint + processor, LoRA-wrapped on the language model, vision frozen.

Backends: Unsloth's `FastVisionModel` when CUDA and unsloth are present (the GPU fast path), transformers + PEFT
(+ bitsandbytes 4-bit on CUDA) otherwise; `backend=` forces one. Where each family keeps its vision tower and its
language model is a small table (`FAMILIES`); an unknown family is an error, never a silent guess.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# family -> (language-model module prefix, vision-tower prefix, projector/merger prefix) inside the HF model.
FAMILIES = {
    "qwen3_vl": ("model.language_model", "model.visual", "model.visual.merger"),
    "qwen2_5_vl": ("model.language_model", "model.visual", "model.visual.merger"),
}
LANGUAGE_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class LoraSettings:
    r: int = 16
    alpha: int = 16
    dropout: float = 0.0
    train_projector: bool = False  # also adapt the vision->language merger (off: the recipe keeps vision fixed)


def family_of(model) -> str:
    family = getattr(model.config, "model_type", None)
    if family not in FAMILIES:
        raise ValueError(f"unsupported model family {family!r}; vlrl knows {', '.join(FAMILIES)}. "
                         "Add its module paths to vlrl.model.FAMILIES.")
    return family


def lora_target_regex(model, *, train_projector: bool = False, finetune_vision_layers: bool = False) -> str:
    """A PEFT `target_modules` regex: the language model's attention and MLP projections (+ merger / vision)."""
    language, vision, merger = FAMILIES[family_of(model)]
    names = {n for n, _ in model.named_modules()}
    for prefix in (language, vision):
        if prefix not in names:
            raise ValueError(f"{type(model).__name__} has no module {prefix!r}, where vlrl.model.FAMILIES says "
                             f"the {family_of(model)} {'language model' if prefix == language else 'vision tower'} is.")
    parts = [rf"{re.escape(language)}\.layers\.\d+\.(self_attn|mlp)\.({'|'.join(LANGUAGE_TARGETS)})"]
    if train_projector:
        parts.append(rf"{re.escape(merger)}\.linear_fc\d")
    if finetune_vision_layers:
        parts.append(rf"{re.escape(vision)}\.blocks\.\d+\.(attn\.(qkv|proj)|mlp\.linear_fc\d)")
    return "|".join(f"(?:{p})" for p in parts)


def choose_backend(backend: str = "auto") -> str:
    """"unsloth" when asked, or on auto when CUDA and unsloth are both present; "transformers" otherwise."""
    import importlib.util

    import torch

    if backend not in ("auto", "unsloth", "transformers"):
        raise ValueError(f"backend {backend!r}: choose auto, unsloth or transformers.")
    if backend == "auto":
        has_unsloth = importlib.util.find_spec("unsloth") is not None
        return "unsloth" if torch.cuda.is_available() and has_unsloth else "transformers"
    if backend == "unsloth" and not torch.cuda.is_available():
        raise ValueError("backend 'unsloth' needs a CUDA GPU; use backend='transformers' on this machine.")
    return backend


def load_model(name_or_path: str, *, load_in_4bit: bool = False, max_seq_length: int = 2048,
               lora: LoraSettings | None = None, finetune_vision_layers: bool = False, backend: str = "auto"):
    """Loads (model, processor), LoRA-wrapped when `lora` is given.

    Args:
        name_or_path: a hub id (`Qwen/Qwen3-VL-8B-Instruct`) or a local checkpoint directory.
        load_in_4bit: 4-bit NF4 base weights (bitsandbytes; CUDA only).
        max_seq_length: the longest prompt + completion (Unsloth sizes its buffers from it).
        lora: LoRA settings; None returns the plain model.
        finetune_vision_layers: also adapt the vision tower (off by default).
        backend: "auto", "unsloth" or "transformers".
    """
    backend = choose_backend(backend)
    if backend == "unsloth":
        return _load_unsloth(name_or_path, load_in_4bit, max_seq_length, lora, finetune_vision_layers)
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    kwargs = {}
    if load_in_4bit:
        if not torch.cuda.is_available():
            raise ValueError("load_in_4bit needs a CUDA GPU (bitsandbytes); set load_in_4bit = false on CPU.")
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16,
            bnb_4bit_use_double_quant=True)
    dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32
    model = AutoModelForImageTextToText.from_pretrained(name_or_path, dtype=dtype, **kwargs)
    processor = AutoProcessor.from_pretrained(name_or_path)
    processor.tokenizer.padding_side = "left"  # batched generation
    if torch.cuda.is_available() and not load_in_4bit:
        model = model.to("cuda")
    if lora is None:
        return model, processor
    from peft import LoraConfig, get_peft_model

    for param in model.parameters():
        param.requires_grad_(False)
    config = LoraConfig(
        r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, bias="none",
        target_modules=lora_target_regex(model, train_projector=lora.train_projector,
                                         finetune_vision_layers=finetune_vision_layers),
    )
    return get_peft_model(model, config), processor


def _load_unsloth(name_or_path, load_in_4bit, max_seq_length, lora, finetune_vision_layers):
    try:
        import unsloth  # noqa: F401  (must come before transformers is used, as Unsloth patches it)
        from unsloth import FastVisionModel
    except ImportError as err:
        raise ImportError("the unsloth backend needs the GPU extra: pip install 'vlrl[gpu]'") from err
    model, processor = FastVisionModel.from_pretrained(
        name_or_path, load_in_4bit=load_in_4bit, max_seq_length=max_seq_length,
        use_gradient_checkpointing="unsloth")
    processor.tokenizer.padding_side = "left"
    if lora is None:
        return model, processor
    model = FastVisionModel.get_peft_model(
        model, r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, bias="none",
        finetune_vision_layers=finetune_vision_layers, finetune_language_layers=True,
        finetune_attention_modules=True, finetune_mlp_modules=True)
    return model, processor


def trainable_summary(model) -> dict:
    """Counts of trainable and total parameters, and whether any vision parameter trains."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    vision = any(p.requires_grad for n, p in model.named_parameters() if ".visual." in n and "merger" not in n)
    return {"trainable": trainable, "total": total, "vision_trainable": vision}
