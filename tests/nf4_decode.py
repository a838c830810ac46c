"""Fused 4-bit decoding: one Triton kernel multiplies bf16 activations by bitsandbytes NF4 weights, reading the
packed 4-bit weights once and dequantizing them in registers, for up to 64 rows (a decoding step).

No run uses it (vlrl decodes a 4-bit base through `vlrl.engine.weights`; why: bench/results/gpu.md, "The fused 4-bit
kernel"), so it lives beside the test that checks it (tests/test_nf4_decode.py); `bench/gpu_nf4_kernel.py` times it.

The layout is bitsandbytes' `Params4bit`: the row-major [N, K] weight in blocks of 64 elements, each a 4-bit index
into the NF4 code book, two per byte, the first in the high nibble; element (n, k) is
`code[nibble] * absmax[(n * K + k) // 64]` in fp32, rounded once to bf16 as bitsandbytes rounds it. Double-quantized
scales are dequantized once per layer and cached. Programs split K as well as N (`launch_config`), so a 1024-wide
projection still fills the GPU; their partial sums meet in atomic adds (the last bit of an output can vary).

`fused_decode(model)` patches every `Linear4bit`; PEFT's LoRA layers call their `base_layer`, so the adapters stay
PEFT's. The kernel is a `torch.library.triton_op` that compiled decoding traces. A call falls back to bitsandbytes'
own forward where the kernel does not apply: gradients on, more than 64 rows, inputs off CUDA, a weight that is not
NF4 in blocks of 64, or bitsandbytes' CPU layout. Without a GPU, TRITON_INTERPRET=1 runs it on CPU tensors (the
tests; there the op is a plain `custom_op`, compiled with aot_eager).

    with fused_decode(policy):
        policy.generate(**inputs, max_new_tokens=1024)
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only torch builds ship without triton: available() says so, fused_decode falls back
    triton = None

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"  # triton's CPU interpreter: the tests' path without a GPU
MAX_ROWS = 64  # decode batches; beyond this bitsandbytes' dequantize + bf16 matmul is compute-bound and right
BLOCKSIZE = 64  # the only bitsandbytes blocksize the kernel reads: its scales align with BLOCK_K


def launch_config(n: int, k: int, programs: int, *, block_n: int = 64, block_k: int | None = None,
                  num_warps: int = 4) -> dict:
    """The kernel's tile sizes for an [n, k] weight, by rule rather than autotuned. Decoding reads each weight byte
    once, so what matters is that enough programs read at once: tiles of `block_n` (64) output columns, and K split
    (`SPLIT_K`, a power of two) until there are about `programs` of them. With two per SM on an H100 (264), the 8B's
    1024-wide k/v projections run 16 tiles x 16 splits. A rule also means Inductor compiles one kernel per outcome,
    where an autotuned kernel made it compile and time every candidate configuration. The tile sizes can be given
    (bench/gpu_nf4_kernel.py sweeps them); K is then split by the same rule."""
    block_k = block_k or (256 if k >= 256 else 128)
    tiles, chunks = -(-n // block_n), -(-k // block_k)
    split_k = 1
    while tiles * split_k < programs and split_k * 2 <= chunks:
        split_k *= 2
    return {"BLOCK_N": block_n, "BLOCK_K": block_k, "SPLIT_K": split_k, "num_warps": num_warps, "num_stages": 3}


def block_rows(m: int) -> int:
    """The kernel's BLOCK_M for m rows: 16, 32 or 64 (tl.dot needs at least 16)."""
    return 16 if m <= 16 else 32 if m <= 32 else 64


@functools.cache
def programs_wanted(device_index: int) -> int:
    """Two programs per SM of the GPU (in the interpreter: 8, which still splits the tests' small weights; tracing on
    fake CUDA tensors without a GPU: an H100's 132 SMs)."""
    if INTERPRET:
        return 8
    if not torch.cuda.is_available():
        return 2 * 132
    return 2 * torch.cuda.get_device_properties(device_index).multi_processor_count


def available() -> bool:
    """Whether the fused kernel can run here: a CUDA GPU and triton."""
    return triton is not None and torch.cuda.is_available()


if triton is not None:

    @triton.jit
    def _bf16_dot(acc, x, w, INTERPRET_DOT: tl.constexpr):
        """acc + x @ w.T, with the fp32 weight w rounded to bf16 first: bitsandbytes' dequantized weight, exactly.

        Triton's interpreter truncates fp32 -> bf16 casts and multiplies bf16 as raw integers, so there the rounding
        is done on the bits (round to nearest even) and the dot in fp32, which is exact for bf16 operands.
        """
        if INTERPRET_DOT:
            bits = w.to(tl.uint32, bitcast=True)
            w = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).to(tl.float32, bitcast=True)
            return tl.dot(x.to(tl.float32), tl.trans(w), acc, input_precision="ieee")
        return tl.dot(x, tl.trans(w.to(tl.bfloat16)), acc)

    @triton.jit
    def _nf4_matmul_kernel(x_ptr, packed_ptr, absmax_ptr, code_ptr, y_ptr, M, N, K, BLOCK_M: tl.constexpr,
                           BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
                           INTERPRET_DOT: tl.constexpr):
        """y[M, N] += x[M, K] @ W[N, K].T over this program's N tile and its share of K (every SPLIT_K-th chunk).

        Byte j of a weight row holds elements 2j (high nibble) and 2j + 1 (low), so the even and odd K positions
        are two dots: no interleaving in registers.
        """
        rows = tl.arange(0, BLOCK_M)
        cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        pairs = tl.arange(0, BLOCK_K // 2)
        row_ok = rows < M
        col_ok = cols < N
        # tl.full, not tl.zeros (triton's own @jit): the interpreter runs it even if triton was imported first
        acc = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)
        for k0 in range(tl.program_id(1) * BLOCK_K, K, SPLIT_K * BLOCK_K):
            even = k0 + 2 * pairs
            k_ok = even < K
            x_even = x_ptr + rows[:, None] * K + even[None, :]
            x_mask = row_ok[:, None] & k_ok[None, :]
            x_high = tl.load(x_even, mask=x_mask, other=0.0)
            x_low = tl.load(x_even + 1, mask=x_mask, other=0.0)
            w_mask = col_ok[:, None] & k_ok[None, :]
            byte = tl.load(packed_ptr + cols[:, None] * (K // 2) + (even // 2)[None, :], mask=w_mask, other=0)
            byte = byte.to(tl.int32)
            scale = tl.load(absmax_ptr + cols[:, None] * (K // 64) + (even // 64)[None, :], mask=w_mask, other=0.0)
            acc = _bf16_dot(acc, x_high, tl.load(code_ptr + (byte >> 4)) * scale, INTERPRET_DOT)
            acc = _bf16_dot(acc, x_low, tl.load(code_ptr + (byte & 15)) * scale, INTERPRET_DOT)
        tl.atomic_add(y_ptr + rows[:, None] * N + cols[None, :], acc, mask=row_ok[:, None] & col_ok[None, :])

    def _nf4_matmul(x: torch.Tensor, packed: torch.Tensor, absmax: torch.Tensor, code: torch.Tensor,
                    bias: torch.Tensor | None, n: int) -> torch.Tensor:
        """x [M, K] bf16 @ the NF4 weight [n, K].T (+ bias) -> [M, n] bf16; M <= 64.

        Args:
            x: contiguous bf16 activations.
            packed: the weight's bytes, flat uint8 (n * K / 2).
            absmax: fp32 scale of each 64-element block (n * K / 64), already dequantized.
            code: the 16 fp32 NF4 values.
            bias: bf16 [n] or None; added in fp32 before the one rounding to bf16, as a bf16 linear does.
        """
        m, k = x.shape
        y = torch.zeros((m, n), dtype=torch.float32, device=x.device)  # split-K programs add into it

        config = launch_config(n, k, programs_wanted(x.device.index or 0))
        grid = (triton.cdiv(n, config["BLOCK_N"]), config["SPLIT_K"])
        torch.library.wrap_triton(_nf4_matmul_kernel)[grid](x, packed, absmax, code, y, m, n, k,
                                                              BLOCK_M=block_rows(m), INTERPRET_DOT=INTERPRET, **config)
        if bias is not None:
            y = y + bias.float()
        return y.to(x.dtype)

    if INTERPRET:
        # torch launches an interpreted kernel as it is, fake tensors included, so triton_op cannot trace it: a plain
        # custom op with its own fake stands in, and the tests compile through that
        _op = torch.library.custom_op("vlrl::nf4_matmul", _nf4_matmul, mutates_args=())

        @_op.register_fake
        def _(x, packed, absmax, code, bias, n):
            return x.new_empty((x.shape[0], n))
    else:
        torch.library.triton_op("vlrl::nf4_matmul", _nf4_matmul, mutates_args=())


def block_scales(state) -> torch.Tensor:
    """The fp32 scale of each block of a 4-bit weight (its bitsandbytes `QuantState`), undoing double quantization
    the way `bitsandbytes.functional.dequantize_4bit` does."""
    from bitsandbytes.functional import dequantize_blockwise

    if not state.nested:
        return state.absmax.float()
    return (dequantize_blockwise(state.absmax, state.state2) + state.offset).float()


def _prepared(module) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The packed bytes, block scales and code book the kernel reads, cached on the module (the scales are
    1/64 of the weights' elements, and dequantizing them takes a kernel launch of its own)."""
    cached = module.__dict__.get("_vlrl_nf4")
    if cached is None:
        state = module.weight.quant_state
        packed = module.weight.data.view(torch.uint8).reshape(-1)  # also a bf16 quant_storage, as bitsandbytes reads
        cached = (packed, block_scales(state), state.code.float().contiguous())
        module._vlrl_nf4 = cached
    return cached


def _readable(state) -> bool:
    """Whether a weight is in the layout the kernel reads: NF4, blocks of 64, not repacked for bitsandbytes' CPU
    kernel, dequantizing to bf16 or fp32 (either rounds code * scale to bf16 once, as the kernel does)."""
    return (state is not None and state.quant_type == "nf4" and state.blocksize == BLOCKSIZE
            and state.dtype in (torch.bfloat16, torch.float32) and len(state.shape) == 2
            and state.shape[1] % BLOCKSIZE == 0 and not getattr(state, "packing_format_for_cpu", False))


def fits(x: torch.Tensor, module) -> bool:
    """Whether the fused kernel computes this call (see the module docstring for why each case falls back)."""
    state = module.weight.quant_state
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    return (triton is not None and (x.is_cuda or INTERPRET) and not torch.is_grad_enabled()
            and 0 < rows <= MAX_ROWS and _readable(state) and state.shape[1] == x.shape[-1]
            and (module.compute_dtype or x.dtype) == torch.bfloat16)


def nf4_linear(x: torch.Tensor, module, fallback: Callable | None = None) -> torch.Tensor:
    """A `bitsandbytes.nn.Linear4bit` forward through the fused kernel where it `fits`, else through `fallback`
    (the module's own forward by default).

    Args:
        x: [..., K] activations.
        module: the Linear4bit layer.
        fallback: what computes the calls the kernel does not.

    Returns:
        [..., N] in x's dtype, as the module's forward returns.
    """
    if not fits(x, module):
        return (fallback or module.forward)(x)
    packed, absmax, code = _prepared(module)
    n, k = module.weight.quant_state.shape
    bias = None if module.bias is None else module.bias.to(torch.bfloat16)  # bitsandbytes rounds it to bf16 too
    flat = x.reshape(-1, k).to(torch.bfloat16).contiguous()
    y = torch.ops.vlrl.nf4_matmul(flat, packed, absmax, code, bias, n)
    return y.reshape(*x.shape[:-1], n).to(x.dtype)


@contextlib.contextmanager
def fused_decode(model: torch.nn.Module) -> Iterator[int]:
    """Within the block, every bitsandbytes `Linear4bit` in `model` (LoRA base layers included) computes through
    `nf4_linear`; on exit, even by an exception, each gets its own forward back. Instances are patched, not the
    class, so other models in the process keep bitsandbytes' path.

    Yields:
        How many layers were patched.
    """
    from bitsandbytes.nn import Linear4bit

    layers = [m for m in model.modules() if isinstance(m, Linear4bit)]
    saved = [m.__dict__.get("forward") for m in layers]  # an instance forward (an accelerate hook) stays in use
    try:
        for layer in layers:
            if _readable(layer.weight.quant_state):
                _prepared(layer)  # now, outside any compiled graph
            layer.forward = functools.partial(nf4_linear, module=layer, fallback=layer.forward)
        yield len(layers)
    finally:
        for layer, forward in zip(layers, saved):
            layer.__dict__.pop("_vlrl_nf4", None)
            if forward is None:
                layer.__dict__.pop("forward", None)
            else:
                layer.forward = forward
