"""`load_model()`: a vision-language checkpoint + processor, LoRA-wrapped on the language model, vision frozen.

Backends: transformers + PEFT (+ bitsandbytes 4-bit and vlrl's compiled static-cache rollouts on CUDA) by default,
the fastest path measured on the GPU (bench/results/unsloth.md); Unsloth's `FastVisionModel` when asked for with
`backend="unsloth"` (`choose_backend` says which and why). Unsloth is imported before transformers and TRL are used
(`activate_backend`), as it requires. Where each family keeps its
vision tower, projector and language model is a small table (`FAMILIES`); an unknown family or a path that does not
exist is a ConfigError naming it, never a silent guess. Both backends get the same LoRA targets (`lora_target_regex`).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from vlrl.base import distributed
from vlrl.base.cache import hub_offline
from vlrl.base.errors import ConfigError, MissingExtra
from vlrl.model.memory_cap import cap_memory

# Where each supported family keeps its parts inside the Hugging Face model (`model_type` -> module paths, and the
# Linear leaves LoRA may adapt, as regexes relative to the vision tower or the language model). The language model's
# attention and MLP projections are the same names in every family here (LANGUAGE_TARGETS); a hybrid family names its
# other layer kind's projections too (`language_layers`: one regex per kind, relative to a decoder layer, each of
# which must match).
# Qwen3.5's Gated DeltaNet layers: LoRA adapts in_proj_qkv (queries, keys, values), in_proj_z (the output gate) and
# out_proj, the projections that carry the hidden state, as q/k/v/o do in attention. in_proj_a and in_proj_b map
# the hidden state to one scalar per value head (the decay and the write strength of the recurrence): their width
# (16-32 outputs at the real shapes) is below LoRA's rank 16, so an adapter there would be a full-rank rewrite of how
# fast every head forgets, the state's stability, rather than a low-rank correction; they stay frozen.
QWEN35_LINEAR_ATTENTION = r"linear_attn\.(in_proj_qkv|in_proj_z|out_proj)"
FAMILIES = {
    "qwen3_vl": {
        "language_model": "model.language_model",
        "vision_tower": "model.visual",
        "projector": r"(merger|deepstack_merger_list\.\d+)\.linear_fc[12]",  # the merger and the deepstack mergers
        "vision_layers": r"blocks\.\d+\.(attn\.(qkv|proj)|mlp\.linear_fc[12])",
    },
    "qwen3_5": {
        "language_model": "model.language_model",
        "vision_tower": "model.visual",
        "projector": r"merger\.linear_fc[12]",  # no deepstack mergers in Qwen3.5
        "vision_layers": r"blocks\.\d+\.(attn\.(qkv|proj)|mlp\.linear_fc[12])",
        "language_layers": (r"self_attn\.(q_proj|k_proj|v_proj|o_proj)", r"mlp\.(gate_proj|up_proj|down_proj)",
                            QWEN35_LINEAR_ATTENTION),
    },
    # Qwen3.5-MoE: the shared expert (an MLP every token passes through) is adapted; the routed experts and the
    # router are not. The routed experts are one fused 3-D parameter per layer (`experts.gate_up_proj`,
    # `experts.down_proj`), not Linear layers, so PEFT's module LoRA cannot wrap them, and a frozen router keeps the
    # experts a token is sent to the same in the engine's rollout and the training forward (a router that moves
    # between them is a known source of rollout/training mismatch in MoE RL).
    "qwen3_5_moe": {
        "language_model": "model.language_model",
        "vision_tower": "model.visual",
        "projector": r"merger\.linear_fc[12]",
        "vision_layers": r"blocks\.\d+\.(attn\.(qkv|proj)|mlp\.linear_fc[12])",
        "language_layers": (r"self_attn\.(q_proj|k_proj|v_proj|o_proj)",
                            r"mlp\.shared_expert\.(gate_proj|up_proj|down_proj)", QWEN35_LINEAR_ATTENTION),
    },
    "qwen2_5_vl": {
        "language_model": "model.language_model",
        "vision_tower": "model.visual",
        "projector": r"merger\.mlp\.[02]",
        "vision_layers": r"blocks\.\d+\.(attn\.(qkv|proj)|mlp\.(gate|up|down)_proj)",
    },
}
LANGUAGE_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
BACKENDS = ("auto", "unsloth", "transformers")


@dataclass
class LoraSettings:
    r: int = 16
    alpha: int = 16
    dropout: float = 0.0
    train_projector: bool = False  # also adapt the vision->language merger (off: the recipe keeps vision fixed)
    targets: str = "layers"  # the language model's: "layers" (attention + MLP), "head" (lm_head), "layers+head"
    seed: int = 0  # seeds lora_A's initialization, so one run file always starts from the same adapter


def family_of(model) -> str:
    """The model's family key in `FAMILIES` (its `config.model_type`); ConfigError for a family vlrl does not know."""
    family = getattr(model.config, "model_type", None)
    if family not in FAMILIES:
        raise ConfigError(f"unsupported model family {family!r} ({type(model).__name__}); vlrl knows "
                          f"{', '.join(FAMILIES)}. Add its module paths to vlrl.model.loading.FAMILIES.")
    return family


def lora_target_regex(model, *, train_projector: bool = False, finetune_vision_layers: bool = False,
                      language: str = "layers") -> str:
    """A PEFT `target_modules` regex: the language model's attention and MLP projections (and a hybrid family's
    linear-attention projections: `FAMILIES[...]["language_layers"]`) (+ projector / vision);
    `language` = "head" adapts its output projection (`lm_head`) instead, "layers+head" both.

    Both backends receive this same regex, so a run adapts the same modules on Unsloth and on transformers. Every
    part must match at least one Linear layer of `model`; a path in `FAMILIES` that does not is a ConfigError naming
    it, never a silent fallback to fewer targets.
    """
    import torch

    family = family_of(model)
    table = FAMILIES[family]
    names = {n for n, _ in model.named_modules()}
    for role in ("language_model", "vision_tower"):
        if table[role] not in names:
            raise ConfigError(f"{type(model).__name__} has no module {table[role]!r}, where vlrl.model.loading.FAMILIES says "
                              f"the {family} {role.replace('_', ' ')} is; fix FAMILIES[{family!r}][{role!r}].")
    vision = re.escape(table["vision_tower"])
    parts = {}
    if language in ("layers", "layers+head"):
        prefix = rf"{re.escape(table['language_model'])}\.layers\.\d+\."
        kinds = table.get("language_layers", (rf"(self_attn|mlp)\.({'|'.join(LANGUAGE_TARGETS)})",))
        parts["language_model"] = rf"{prefix}({'|'.join(kinds)})"
        if len(kinds) > 1:  # a hybrid family: every layer kind must be found, or one would silently go unadapted
            parts.update({f"language_model ({kind})": rf"{prefix}{kind}" for kind in kinds})
    if language in ("head", "layers+head"):
        parts["head"] = "lm_head"
    if not parts:
        raise ConfigError(f"language = {language!r}: choose layers, head or layers+head.")
    if train_projector:
        parts["projector"] = rf"{vision}\.{table['projector']}"
    if finetune_vision_layers:
        parts["vision_layers"] = rf"{vision}\.{table['vision_layers']}"
    linears = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    for role, part in parts.items():
        if not any(re.fullmatch(part, n) for n in linears):
            raise ConfigError(f"no Linear layer of {type(model).__name__} matches {part!r}, the {family} {role} "
                              f"targets in vlrl.model.loading.FAMILIES; fix FAMILIES[{family!r}].")
    return "|".join(f"(?:{p})" for role, p in parts.items() if not role.startswith("language_model ("))


def choose_backend(backend: str = "auto", *, cuda: bool | None = None, unsloth_installed: bool | None = None) -> str:
    """The backend a run uses: "unsloth" or "transformers".

    "auto" picks transformers (+ PEFT, bitsandbytes 4-bit and vlrl's compiled rollouts on CUDA), the fastest path
    measured at the Qwen3-VL-8B shape in 4-bit (bench/results/unsloth.md): 517 and 857 completion tokens/s at 256 and
    1,024 tokens, against Unsloth's own notebook configuration at 146 and vlrl on Unsloth at 59 (256 tokens). Unsloth
    stays one setting away (`backend = "unsloth"`). A named backend is used as given, or refused with the reason when it cannot run.
    `cuda` and `unsloth_installed` default to what this machine has.

    >>> choose_backend("auto", cuda=True, unsloth_installed=True), choose_backend("auto", cuda=False)
    ('transformers', 'transformers')
    >>> choose_backend("transformers", cuda=True, unsloth_installed=True)
    'transformers'
    """
    import importlib.util

    if backend not in BACKENDS:
        raise ConfigError(f"backend {backend!r} is unknown; choose one of {', '.join(BACKENDS)}.")
    if cuda is None:
        import torch

        cuda = torch.cuda.is_available()
    if unsloth_installed is None:
        unsloth_installed = importlib.util.find_spec("unsloth") is not None
    if backend == "auto":
        return "transformers"
    if backend == "unsloth" and not cuda:
        raise ConfigError("backend 'unsloth' needs a CUDA GPU and none is visible; set [model] backend = "
                          "\"transformers\" (or \"auto\") on this machine.")
    if backend == "unsloth" and not unsloth_installed:
        raise MissingExtra("backend 'unsloth' needs the GPU extra: pip install 'vlrl[gpu]' (or set [model] "
                           "backend = \"transformers\").")
    return backend


def activate_backend(backend: str = "auto") -> str:
    """Chooses the backend and, for Unsloth, imports it now: Unsloth patches transformers and TRL (its GRPOTrainer
    and GRPOConfig included), so it must be imported before they are used. Returns the chosen backend."""
    chosen = choose_backend(backend)
    if chosen == "unsloth":
        import sys

        if "trl" in sys.modules and not _unsloth_imported():
            print("vlrl: trl was imported before unsloth; Unsloth patches what it still can. Call "
                  "vlrl.model.loading.activate_backend() first for the full set of its optimizations.")
        import unsloth  # noqa: F401
    return chosen


def _unsloth_imported() -> bool:
    import sys

    return "unsloth" in sys.modules


def backend_of(model) -> str:
    """"unsloth" for a model loaded through Unsloth's FastVisionModel (it adds `for_training`), else "transformers"."""
    return "unsloth" if _unsloth_imported() and hasattr(model, "for_training") else "transformers"


def load_model(name_or_path: str, *, load_in_4bit: bool = False, max_seq_length: int = 2048,
               lora: LoraSettings | None = None, finetune_vision_layers: bool = False, backend: str = "auto",
               processor: bool = True, memory_cap_gib: float = 0.0):
    """Loads (model, processor), LoRA-wrapped when `lora` is given, the vision tower frozen unless asked.

    Args:
        name_or_path: a hub id (`unsloth/Qwen3-VL-8B-Instruct-unsloth-bnb-4bit`) or a local checkpoint directory.
        load_in_4bit: 4-bit NF4 base weights (bitsandbytes; CUDA only).
        max_seq_length: the longest prompt + completion (Unsloth sizes its buffers from it).
        lora: LoRA settings; None returns the plain model.
        finetune_vision_layers: also adapt the vision tower's attention and MLP (off by default).
        backend: "auto", "unsloth" or "transformers" (see `choose_backend`).
        processor: False: the transformers backend returns None for the processor, for a caller that loads another
            one (`vlrl.export.load_adapted`: the adapter's own), instead of parsing the base's tokenizer for nothing.
        memory_cap_gib: at most this many GiB of the GPU for this process from here on (`vlrl.model.memory_cap`);
            0: no cap.

    Returns:
        (model, processor); the processor pads on the left by default (`_pad_left_for_trl`); vlrl's own batched
        calls name their side each time (`vlrl.model.prompts.batch_inputs`), so nothing flips it afterwards.
    """
    from vlrl.model.source import model_source_problem

    problem = model_source_problem(str(name_or_path))  # at once, before transformers' download code and its retries
    if problem:
        raise ConfigError(f"[model] name_or_path = {str(name_or_path)!r}: {problem}")
    backend = activate_backend(backend)
    _expandable_segments()
    cap_memory(memory_cap_gib)
    try:
        if backend == "unsloth":
            model, processor = _load_unsloth(name_or_path, load_in_4bit, max_seq_length)
        else:
            model, processor = _load_transformers(name_or_path, load_in_4bit, processor)
    except OSError as err:  # no such directory, or a hub id that cannot be reached (offline) or does not exist
        offline = " (HF_HUB_OFFLINE is set: only local checkpoints load)" if hub_offline() else ""
        raise ConfigError(f"[model] name_or_path = {str(name_or_path)!r} could not be loaded{offline}: "
                          f"{str(err).splitlines()[0]} Give a local checkpoint directory, a reachable hub id, or "
                          '"tiny".') from None
    if lora is None:
        return model, processor
    return add_lora(model, lora, finetune_vision_layers=finetune_vision_layers, backend=backend), processor


def load_adapter(model, adapter_dir):
    """`model` with the LoRA adapter saved in `adapter_dir` applied (PEFT), for evaluating a trained run."""
    from peft import PeftModel

    require_adapter(adapter_dir)
    return PeftModel.from_pretrained(model, str(adapter_dir))


def require_adapter(adapter_dir) -> None:
    """RunDirError, with the fix, unless `adapter_dir` holds a PEFT adapter (checked before any model loads)."""
    from pathlib import Path

    if not (Path(adapter_dir) / "adapter_config.json").exists():
        from vlrl.base.errors import RunDirError

        raise RunDirError(f"no LoRA adapter at {adapter_dir} (adapter_config.json is missing); give a run's adapter "
                          "folder, e.g. RUN_DIR/adapter, written when `vlrl run` or `vlrl train` finishes.")


def _expandable_segments() -> None:
    """Lets PyTorch's CUDA allocator grow segments instead of caching fixed blocks, unless the user configured it.

    Rollouts and training steps of changing lengths otherwise strand memory between cached blocks: the 8B recipe at
    1024 completion tokens reserved 27.5 GiB without it and 22.2 GiB with it, for the same 18.6 GiB allocated
    (bench/results/gpu.md). Read once, when CUDA starts, so it only acts before the first CUDA allocation.
    """
    import torch

    configured = {"PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"} & set(os.environ)
    if not configured and torch.cuda.is_available() and not torch.cuda.is_initialized():
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"


def bnb_4bit_config(*, skip_modules: list[str] | None = None):
    """The one 4-bit quantization vlrl uses, for training on a 4-bit base and for the merged4 export: bitsandbytes
    NF4 with double quantization, computing in bf16.

    Args:
        skip_modules: modules left unquantized (merged4 keeps the vision tower and lm_head in 16 bits).

    Returns:
        A `transformers.BitsAndBytesConfig`.
    """
    import torch
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16,
                              bnb_4bit_use_double_quant=True, llm_int8_skip_modules=skip_modules)


def _load_transformers(name_or_path, load_in_4bit, with_processor=True):
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    kwargs = {}
    if load_in_4bit:
        if not torch.cuda.is_available():
            raise ConfigError("load_in_4bit needs a CUDA GPU (bitsandbytes); set [model] load_in_4bit = false on CPU.")
        kwargs["quantization_config"] = bnb_4bit_config()
        kwargs["device_map"] = {"": distributed.local_rank()}  # this process's GPU (a DDP launch: one copy each)
    if torch.cuda.is_available():
        # Under accelerate launch each process owns GPU LOCAL_RANK: "cuda" (and bitsandbytes' placement) means that
        # one from here on, instead of every process loading its copy onto GPU 0.
        torch.cuda.set_device(distributed.local_rank())
    dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32
    model = AutoModelForImageTextToText.from_pretrained(name_or_path, dtype=dtype, **kwargs)
    processor = AutoProcessor.from_pretrained(name_or_path) if with_processor else None
    if processor is not None:
        _pad_left_for_trl(processor)
    if torch.cuda.is_available() and not load_in_4bit:
        model = model.to("cuda")
    return model, processor


def _load_unsloth(name_or_path, load_in_4bit, max_seq_length):
    from unsloth import FastVisionModel  # activate_backend imported unsloth before transformers and TRL

    model, processor = FastVisionModel.from_pretrained(
        name_or_path, load_in_4bit=load_in_4bit, max_seq_length=max_seq_length,
        use_gradient_checkpointing="unsloth")
    _pad_left_for_trl(processor)
    return model, processor


def _pad_left_for_trl(processor) -> None:
    """Set once on a processor just loaded, before anything shares it: TRL 1.14.2's GRPOTrainer calls the processor
    for its images with padding=True and no side (grpo_trainer.py:2591), then lines its per-token
    mm_token_type_ids up with its left-padded prompt ids, so the default must be left."""
    getattr(processor, "tokenizer", processor).padding_side = "left"


def add_lora(model, lora: LoraSettings, *, finetune_vision_layers: bool = False, backend: str = "transformers"):
    """Wraps a model from `load_model(..., lora=None)` with LoRA: every other weight frozen, the vision tower
    included unless `finetune_vision_layers`. Both backends get the same targets (`lora_target_regex`).

    Args:
        model: the plain model, as `load_model` returns it without `lora`.
        lora: rank, alpha, dropout, projector, and the seed of lora_A's initialization.
        finetune_vision_layers: also adapt the vision tower's attention and MLP.
        backend: the backend the model was loaded with ("unsloth" wraps through Unsloth's `get_peft_model`).

    Returns:
        The PEFT-wrapped model.
    """
    import torch

    targets = lora_target_regex(model, train_projector=lora.train_projector,
                                finetune_vision_layers=finetune_vision_layers, language=lora.targets)
    if backend == "unsloth":
        from unsloth import FastVisionModel

        # vlrl's own regex rather than Unsloth's finetune_* flags, so both backends adapt exactly the same modules
        # (Unsloth uses a string target_modules as given: "a user-written regex is never widened").
        return FastVisionModel.get_peft_model(
            model, r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, bias="none", target_modules=targets,
            finetune_vision_layers=finetune_vision_layers, finetune_language_layers=True,
            finetune_attention_modules=True, finetune_mlp_modules=True, random_state=lora.seed,
            use_gradient_checkpointing="unsloth")
    from peft import LoraConfig, get_peft_model

    for param in model.parameters():
        param.requires_grad_(False)
    config = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, bias="none",
                        target_modules=targets)
    torch.manual_seed(lora.seed)  # lora_A's initialization draws from the global generator
    return get_peft_model(model, config)


def trainable_summary(model) -> dict:
    """Counts of trainable and total parameters, and whether any vision-tower or projector parameter trains."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad and ".visual." in n]
    projector = [n for n, _ in named if "merger" in n]
    return {"trainable": trainable, "total": total, "vision_trainable": len(named) > len(projector),
            "projector_trainable": bool(projector), "backend": backend_of(model)}


def describe(model) -> dict:
    """What a loaded model is, for people: family, backend, weight dtype, 4-bit or not, device, memory, parameters
    in the vision tower and in the language model, and (once LoRA-wrapped) the adapted layers and trainable share.

    4-bit weights are counted at their full size (bitsandbytes packs two into a byte).
    """
    import torch

    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    table = FAMILIES.get(getattr(inner.config, "model_type", None), {})
    vision, language = (f"{table[k]}." if k in table else "\0" for k in ("vision_tower", "language_model"))

    def count(p) -> int:
        state = getattr(p, "quant_state", None)
        return int(state.shape.numel()) if state is not None and hasattr(state, "shape") else p.numel()

    params = list(inner.named_parameters())
    weights = [p for n, p in params if "lora_" not in n]
    floats = [p.dtype for p in weights if p.is_floating_point()]
    summary = trainable_summary(model)
    out = {
        "family": getattr(inner.config, "model_type", None),
        "backend": summary["backend"],
        "dtype": str(max(set(floats), key=floats.count)).removeprefix("torch.") if floats else None,
        "load_in_4bit": any(getattr(p, "quant_state", None) is not None for p in weights),
        "device": str(next(model.parameters()).device),
        "memory_gib": round(sum(p.numel() * p.element_size() for _, p in params) / 2**30, 3),
        "parameters": sum(count(p) for p in weights),
        "vision_tower_parameters": sum(count(p) for n, p in params if n.startswith(vision) and "lora_" not in n),
        "language_model_parameters": sum(count(p) for n, p in params if n.startswith(language) and "lora_" not in n),
    }
    lora_layers = [n for n, m in inner.named_modules() if isinstance(getattr(m, "lora_A", None), torch.nn.ModuleDict)
                   and len(m.lora_A)]
    if lora_layers:
        out.update(lora_layers=len(lora_layers), trainable_parameters=summary["trainable"],
                   trainable_share=round(summary["trainable"] / max(1, out["parameters"]), 6),
                   vision_trainable=summary["vision_trainable"], projector_trainable=summary["projector_trainable"])
    return out


def environment(backend: str = "auto") -> dict:
    """What this machine offers a run: Python, the stack's versions, the device, the backend `choose_backend` picks
    for `backend` (or why it cannot), and whether the Hugging Face hub may be reached (HF_HUB_OFFLINE).

    Reads package versions from their metadata: imports torch, but neither transformers nor TRL (Unsloth must come
    first when it is the backend).
    """
    import importlib.metadata
    import platform

    import torch

    import vlrl

    versions = {"vlrl": vlrl.__version__}
    for name in ("torch", "transformers", "trl", "peft", "datasets", "unsloth", "bitsandbytes"):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        device = f"cuda: {props.name}, {props.total_memory / 2**30:.0f} GiB ({torch.cuda.device_count()} visible)"
    else:
        device = f"cpu ({torch.get_num_threads()} threads); no CUDA GPU"
    try:
        chosen = choose_backend(backend)
    except (ValueError, ImportError) as err:
        chosen = f"cannot run: {err}"
    return {"python": platform.python_version(), **versions, "device": device, "backend": chosen,
            "hub": "offline (HF_HUB_OFFLINE is set): local models and data only" if hub_offline() else "allowed"}
