"""The GGUF structure check: the files llama.cpp's converters wrote, read back with gguf-py, hold the architecture,
the hyperparameters and every tensor (name and shape) that the HF checkpoints they came from imply.

    >>> gguf_name("model.language_model.norm.weight")  # the name llama.cpp gives an HF tensor
    ['output_norm.weight']
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from vlrl.base.errors import ExportError
from vlrl.export.adapter import adapter_config

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
    raise ExportError(f"vlrl does not know the GGUF name of {hf_name}; extend vlrl.export.gguf_structure.gguf_name.")


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


def _reader(gguf, path: Path):
    """gguf-py's GGUFReader over a plain array view of its memory map: it slices the file a few times per string of
    the model's 151,936-token vocabulary and merges, and each slice of an np.memmap pays for a memmap of its own
    (`__array_finalize__`). The same fields and tensors; the tiny model's f32 GGUF read in 6.5 s instead of 14-20 s."""
    import numpy as np

    class PlainReader(gguf.GGUFReader):
        @property
        def data(self):
            return self._array

        @data.setter
        def data(self, mapped):  # GGUFReader.__init__ assigns its np.memmap here, before it parses anything
            self._array = mapped.view(np.ndarray)

    return PlainReader(str(path))


def check_gguf_structure(files: dict, merged_dir: str | Path, adapter_dir: str | Path, tools: Path) -> dict:
    """Reads the three GGUF files back with gguf-py and checks architecture, hyperparameters, tensor names and
    shapes against the HF checkpoints they came from.

    Args:
        files: {"model": path, "mmproj": path, "adapter": path}, the GGUF files to check.
        merged_dir: the HF merged checkpoint the model and mmproj GGUFs were converted from.
        adapter_dir: the saved adapter the adapter GGUF was converted from.
        tools: `llama_cpp_tools()`, whose gguf-py reads the files.

    Returns:
        `gguf_tensors_checked`: the number of tensors checked in each file.

    Raises:
        ExportError: a metadata value, tensor name or shape differs from what the HF checkpoints imply.
    """
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
                    "adapter.lora.alpha": float(adapter_config(adapter_dir)["lora_alpha"])},
    }
    checked = {}
    for kind, path in files.items():
        reader = _reader(gguf, path)
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
