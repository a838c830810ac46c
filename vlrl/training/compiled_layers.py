"""The language model's decoder layers compiled for the training and scoring forwards: `[training] compiled_layers`.

A training pass at the Qwen3-VL-8B shape (int8 base, LoRA, gradient checkpointing) dispatched 58,942 aten ops at
4 rows, and cost about as much at 1 row as at 4 (bench/results/engine.md, plan s53): the host's dispatch and the
small kernels around each matmul (RMSNorm in float32, the rotary embedding, SwiGLU, LoRA's casts and adds, the
base's dequantize), not the matmuls, set its time. Each decoder layer's forward compiled by Inductor fuses those
(12,466 aten ops at 4 rows) and AOTAutograd's backward does the same for the gradient: 0.59 -> 0.25 s a pass at 1
row, 1.78 -> 1.12 s at 16 (`bench/gpu_update.py --compiled both`, plan s54, one H100). The same numbers up to
float rounding (tests/test_compiled_layers.py against the eager layers on the tiny model).

Only forwards without a KV cache take the compiled layer: the training passes and the log-prob forwards over whole
sequences. Decoding keeps its own path (`vlrl.engine`: a static cache and the whole model compiled with CUDA graphs,
within which a layer runs as written), as does a prefill into a cache. Shapes are dynamic from the first call, so a
run's passes of different widths and rows share a graph (a few graphs a run: with and without a gradient, a padding
mask or none). On one CUDA GPU and the transformers backend only: on a CPU compiling costs more than it saves,
Unsloth compiles its own layers, and runs of several processes (DDP, FSDP's wrapped layers) keep them eager until
measured so. Qwen3-VL's dense text layers over bf16 or int8-packed weights (measured); other families' layers and
layers over bitsandbytes' own 4-bit or 8-bit modules stay eager until measured. Should compiling a forward fail on
some model all the same, its layers go back to eager with a warning, and training goes on (AOTAutograd compiles the
backward at the first backward pass, outside that guard).
"""

from __future__ import annotations

import warnings

import torch

LAYER_CLASSES = ("Qwen3VLTextDecoderLayer",)  # measured: issue 50, plans s54-s55
_SUBCLASSES: dict[type, type] = {}
_FAILED: set[type] = set()  # classes whose compile failed: eager for the rest of the process


def for_run(model, enabled: bool) -> int:
    """`[training] compiled_layers` = `enabled` applied to a run's policy: its layers switched where they can be (one
    process, the transformers backend, a CUDA GPU); returns how many. Called at load, before any decoding (a
    compiled decoding graph guards on its layers' class, so a switch after the baseline eval would compile every
    decoding graph again), and again by `vlrl.training.train.build_trainer` for a trainer built directly."""
    from vlrl.base import distributed
    from vlrl.model.loading import backend_of

    if not enabled or distributed.world_size() > 1 or backend_of(model) != "transformers":
        return 0
    return compile_decoder_layers(model)


def compile_decoder_layers(model, *, cuda_only: bool = True) -> int:
    """Switch `model`'s decoder layers (LAYER_CLASSES, none over a bitsandbytes module) to compiled forwards for
    cache-free calls; returns how many layers take it (0 on a CPU with `cuda_only`, or for a model with none of those
    layers). Idempotent."""
    layers = [m for m in model.modules() if type(m).__name__ in LAYER_CLASSES or type(m) in _SUBCLASSES.values()]
    if not layers or (cuda_only and not next(layers[0].parameters()).is_cuda) or any(
            type(m).__module__.startswith("bitsandbytes") for layer in layers for m in layer.modules()):
        return 0
    for layer in layers:
        if type(layer) not in _SUBCLASSES.values():
            layer.__class__ = _compiled_class(type(layer))
    return len(layers)


def switched_layers(model) -> int:
    """How many of `model`'s layers `compile_decoder_layers` has switched (and not switched back)."""
    return sum(type(m) in _SUBCLASSES.values() for m in model.modules())


def eager_decoder_layers(model) -> int:
    """Undo `compile_decoder_layers`: every layer back to its own class; returns how many were switched back."""
    back = 0
    for module in model.modules():
        original = next((base for base, sub in _SUBCLASSES.items() if type(module) is sub), None)
        if original is not None:
            module.__class__, back = original, back + 1
    return back


def _compiled_class(cls: type) -> type:
    """`cls` with a forward that runs compiled when no KV cache is passed (a class swap rather than a bound forward
    in the instance, so a copied layer runs its own weights)."""
    if cls not in _SUBCLASSES:
        from torch._dynamo.exc import TorchDynamoException
        from torch._inductor.exc import InductorError
        from transformers.cache_utils import Cache

        compiled = torch.compile(cls.forward, dynamic=True)

        def forward(self, *args, **kwargs):
            # a KV cache (`past_key_values` in transformers 5.17, `cache` in 5.24): a decode, or a prefill into one
            cached = any(isinstance(value, Cache) for value in (*args, *kwargs.values()))
            if cls not in _FAILED and not cached and not torch.compiler.is_compiling():
                try:
                    return compiled(self, *args, **kwargs)
                except (TorchDynamoException, InductorError) as error:
                    _FAILED.add(cls)  # the layer's forward has no side effect: it runs again, eager
                    warnings.warn(f"vlrl: compiling {cls.__name__}'s training forward failed ({type(error).__name__}: "
                                  f"{str(error).splitlines()[0] if str(error) else ''}); its layers run eager from "
                                  "here on ([training] compiled_layers = false says so from the start).", stacklevel=2)
            return cls.forward(self, *args, **kwargs)

        _SUBCLASSES[cls] = type(cls.__name__, (cls,), {"forward": forward, "__module__": cls.__module__})
    return _SUBCLASSES[cls]
