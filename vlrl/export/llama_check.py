"""llama.cpp's own check of the GGUF files, through llama-cpp-python: its logits and image embeddings against the
HF models they were converted from.

Each GGUF is held to the HF model it was converted from, on the text probe's next-token logits within
`TOLERANCE["gguf-<type>"]`: the merged GGUF to the merged checkpoint; the base GGUF with the adapter GGUF to the base
with the adapter unmerged (PEFT), since llama.cpp also applies it unmerged, and a bf16 merge rounds W + BA where the
adapter GGUF does not (at the 2B shape that rounding alone moved the logits 2.7e-2, five times the f16 tolerance).
The base GGUF alone must not match, or the check could not see the adapter. The mmproj must load as a vision
projector in llama.cpp's multimodal library (libmtmd), and its embeddings of the probe image must match the HF
vision tower's. Everything runs in float32 on the CPU.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from vlrl.base.errors import ExportError, MissingExtra
from vlrl.export.probe import TOLERANCE, logits_gap, probe_image, probe_inputs, probe_logits


def require_llama_cpp():
    """The llama_cpp module (llama-cpp-python), or MissingExtra naming the extra that installs it."""
    try:
        import llama_cpp
    except ImportError as err:
        if importlib.util.find_spec("llama_cpp") is not None:  # installed, but one of its own imports fails
            raise MissingExtra(f"llama-cpp-python is installed but does not import ({err}); reinstall it with "
                               "pip install --force-reinstall 'vlrl[gguf]', which brings its dependencies.") from err
        raise MissingExtra("GGUF export is verified with llama.cpp itself: pip install 'vlrl[gguf]' (builds "
                           "llama-cpp-python; a few minutes on first install).") from err
    return llama_cpp


def check_with_llama_cpp(llama_cpp, files: dict, base_gguf: Path, merged_dir: Path, outtype: str, *,
                         adapter_dir: Path, base_dir: Path) -> dict:
    """llama.cpp's logits (merged GGUF vs the HF merged model; base GGUF + adapter GGUF, and base GGUF alone, vs the
    HF base + adapter) and image embeddings (mmproj vs the merged model's vision tower), in float32 on the CPU.

    Args:
        llama_cpp: `require_llama_cpp()`.
        files: {"model": path, "mmproj": path, "adapter": path}, the GGUF files to check.
        base_gguf: the base model's GGUF, which the adapter GGUF applies to.
        merged_dir: the HF merged checkpoint, the merged GGUF's and the mmproj's reference.
        outtype: the GGUF weight type, which picks the tolerance.
        adapter_dir, base_dir: the saved adapter and its base checkpoint, the adapter GGUF's reference.

    Returns:
        `merged_gap`, `adapter_gap`, `base_without_adapter_gap`, `mmproj_gap`, their tolerances, and the probe's
        token counts.

    Raises:
        ExportError: a different tokenization, a gap out of tolerance, or an mmproj llama.cpp cannot use.
    """
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
    from peft import PeftModel

    base = AutoModelForImageTextToText.from_pretrained(str(base_dir), dtype=torch.float32)
    adapted_reference = probe_logits(PeftModel.from_pretrained(base, str(adapter_dir)), inputs)
    del base

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
        adapter_gap = logits_gap(adapted_reference, _llama_logits(adapted, ids))
    finally:
        adapted.close()
    plain = _llama(llama_cpp, base_gguf)
    try:
        base_gap = logits_gap(adapted_reference, _llama_logits(plain, ids))
    finally:
        plain.close()
    for what, gap, hf_model in (("the merged GGUF", merged_gap, "the HF merged model's"),
                                ("the base GGUF with the adapter GGUF", adapter_gap, "HF base + adapter's")):
        if not gap <= tolerance:
            raise ExportError(f"llama.cpp's logits from {what} are {gap:.2e} away from {hf_model} "
                              f"(tolerance {tolerance:.0e} for {outtype}).")
    mmproj_tolerance = max(TOLERANCE["mmproj"], tolerance)
    if not mmproj_gap <= mmproj_tolerance:
        raise ExportError(f"llama.cpp's image embeddings from {files['mmproj'].name} are {mmproj_gap:.2e} away from "
                          f"the HF vision tower's (tolerance {mmproj_tolerance:.0e}).")
    if not base_gap > tolerance:  # every file passed; the check just cannot tell the adapter from none
        raise ExportError(f"the base GGUF without the adapter is as close to base + adapter ({base_gap:.2e}) as "
                          f"the tolerance ({tolerance:.0e}): this check cannot see the adapter; the adapter is too "
                          f"small to verify. The files themselves passed: tokenizer equal, merged GGUF "
                          f"{merged_gap:.2e}, base + adapter GGUF {adapter_gap:.2e}, mmproj {mmproj_gap:.2e}.")
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
