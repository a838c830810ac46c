"""How an export is compared with the model it came from: a fixed probe (an image and a question), the logits a
model gives on it, the logit gap between two such logits, and the gap each kind of export may show (`TOLERANCE`).

The logit gap is `max |a - b| / max |a|` over every position and vocabulary entry of the probe: 0 means identical,
and one number reads the same for the tiny model and an 8B one.

    >>> import torch
    >>> logits_gap(torch.tensor([[1.0, 2.0]]), torch.tensor([[1.0, 2.0]]))
    0.0
"""

from __future__ import annotations

from vlrl.base.errors import ExportError
from vlrl.grammar.answers import FORMAT

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
# The answer tags come from the one answer grammar, so the probe asks in the format the adapter was trained on.
PROBE_QUESTION = f"How many bars does the chart show? Answer inside {FORMAT.solution[0]}...{FORMAT.solution[1]}."


def probe_image(width: int = 128, height: int = 96):
    """A fixed bar-chart-like RGB image; 128x96 is a whole number of 32-pixel merged patches (4 x 3), so neither
    the HF processor nor llama.cpp resizes it.

    >>> probe_image().size
    (128, 96)
    """
    import numpy as np
    from PIL import Image

    y, x = np.mgrid[0:height, 0:width]
    bars = ((x // 16) % 2 == 1) & (y > height - 12 * (1 + (x // 32)))
    rgb = np.stack([np.where(bars, 40, 230), np.where(bars, 90, 230 - y), (x * 255) // (width - 1)], axis=-1)
    return Image.fromarray(rgb.astype(np.uint8))


def probe_inputs(processor, *, image: bool = True) -> dict:
    """The fixed probe as model inputs: one user turn (the probe image, then `PROBE_QUESTION`), generation prompt on.

    Args:
        processor: the model's processor (chat template, tokenizer and image processor).
        image: False for the question alone (llama.cpp's text checks).

    Returns:
        The processor's tensors (input_ids, attention_mask, and pixel_values / image_grid_thw with the image).
    """
    content = ([{"type": "image"}] if image else []) + [{"type": "text", "text": PROBE_QUESTION}]
    text = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                         tokenize=False)
    if image:
        return dict(processor(text=[text], images=[probe_image()], return_tensors="pt"))
    return dict(processor(text=[text], return_tensors="pt"))


def probe_logits(model, inputs: dict):
    """The model's float32 logits (positions x vocabulary) on `inputs`, in eval mode, on the CPU.

    Args:
        model: any model that returns `.logits`; its training mode is restored afterwards.
        inputs: `probe_inputs(processor)`.
    """
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

    Args:
        reference, other: logits of the same shape (tensors or arrays).

    Raises:
        ExportError: the shapes differ.

    >>> import torch
    >>> logits_gap(torch.tensor([[2.0, -4.0]]), torch.tensor([[2.0, -3.0]]))
    0.25
    """
    import torch

    reference, other = torch.as_tensor(reference).float(), torch.as_tensor(other).float()
    if reference.shape != other.shape:
        raise ExportError(f"logits of shape {tuple(other.shape)} cannot be compared with {tuple(reference.shape)}.")
    return float((reference - other).abs().max() / reference.abs().max().clamp_min(1e-30))
