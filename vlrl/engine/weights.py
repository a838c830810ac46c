"""The frozen 4-bit base repacked once, at load, into 8-bit weights that decode at the hardware's pace.

Why: a LoRA policy on a bitsandbytes NF4 base dequantizes every base weight to bf16 in memory at every decoding step,
so at the 16-32 rows GSPO decodes at once the base's linears take several times the time of bf16 ones. The base never
changes under LoRA, so `pack_for_decoding` rewrites each `Linear4bit` once into int8 weights with one bf16 scale per
output channel (`q = round(w / s)`, computed with as `bf16(q * s)`), and gemlite's Triton kernels read those bytes once
per matmul, dequantizing in registers. Per channel rather than per NF4 block of 64: a block's 16 NF4 values land on
the same int8 points in every block, so their rounding errors add up instead of averaging out, and gemlite tiles K no
wider than a group. fp8 per channel (`fmt="fp8"`) reads the same bytes and is less accurate.

One format for everything: decoding goes through gemlite's kernel (at most `KERNEL_ROWS` rows, no gradient), prefill
and the training forward through the same `bf16(q * s)` dequantized + cuBLAS, so rollouts and training compute with
the same weights and differ by summation order only (split-K partial sums meet in fp32). Autograd flows to the input
only (LoRA sits beside the base layer); the backward dequantizes again rather than keeping a bf16 copy.

"auto" per card: int8 through gemlite on sm_80 and newer (fp8 on request from sm_89, refused on Ampere); older cards or
no gemlite: the NF4 base stays as it is, with the reason in the report; CPU: int8 through plain torch, so the tests
check the format everywhere. The measurements behind each choice: bench/results/kernels.md.

    from vlrl.engine.weights import pack_for_decoding, reference_logits, verify_packing
    policy = add_lora(base, settings)                   # the NF4 base under PEFT LoRA
    reference = reference_logits(policy, inputs)        # optional: one forward on the NF4 weights
    report = pack_for_decoding(policy)                  # {"format": "int8", "backend": "gemlite", "layers": 252, ...}
    verify_packing(policy, inputs, reference)           # ValueError past LOGIT_TOLERANCE / KL_TOLERANCE"""

from __future__ import annotations

import contextlib
import time

import torch

from vlrl.base.errors import ConfigError, MissingExtra

KERNEL_ROWS = 64  # rows up to which gemlite's kernels compute (decoding); beyond, dequantize + cuBLAS (prefill)
GEMV_ROWS = 2  # up to here gemlite's GEMV kernel, beyond it its split-K GEMM (its own rule for 8-bit weights)
KERNELS = True  # False inside `without_kernels`: every packed layer through its dequantized weight
FP32_SPLITK_SUMS = True  # gemlite's split-K sums in fp32: its output then equals the training path's (see above)
SPLITK_SETTING = "GEMLITE_USE_NATIVE_ATOMIC_BFP16"  # where gemlite 0.6 keeps that switch (its setter has no getter)
FORMATS = {"int8": torch.int8, "fp8": torch.float8_e4m3fn}  # weight dtype of each format
QMAX = {"int8": 127.0, "fp8": 448.0}  # largest magnitude each format stores
BACKENDS = ("auto", "gemlite", "torch")
# verify_packing's bounds on the packed model's logits against the NF4 model's. Relative error: RMS(difference) over
# the RMS spread of the reference logits. Measured on the tiny Qwen3-VL (tests): int8 1.2e-2, fp8 2.9e-2, while NF4
# itself is 0.14 from the bf16 weights it came from and a wrong layout (one layer's rows flipped) 0.45. Mean KL of the
# next-token distributions: int8 2e-6, fp8 1.1e-5 (NF4 from bf16: 2.5e-4); 1e-3 is the scale of the rollout/training
# mismatch the 8B preset tolerates today (rollout_train_kl 1.1e-3, issue 32), so a repack under it moves the policy
# less than that mismatch does.
LOGIT_TOLERANCE = 5e-2
KL_TOLERANCE = 1e-3
VISION_MARKERS = (".visual.", ".vision_tower.", ".vision_model.")  # never packed: it runs once per prompt, not per step


class PackedLinear(torch.nn.Module):
    """A frozen linear layer held as 8-bit weights with one bf16 scale per `group` inputs: `y = x @ bf16(q * s).T
    (+ bias)`. Made by `from_linear4bit`; computes through gemlite's kernel where it fits (CUDA, no gradient, at most
    `KERNEL_ROWS` rows), else through the dequantized weight, with gradients to the input only.

    Buffers: `qweight` [out, in] (int8 or float8_e4m3fn), `scales` [in / group, out] bf16 (gemlite's layout), `bias`.
    """

    def __init__(self, qweight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None, *,
                 group: int | None = None, backend: str = "torch"):
        super().__init__()
        self.out_features, self.in_features = qweight.shape
        self.group = group or self.in_features
        self.fmt = next(name for name, dtype in FORMATS.items() if dtype == qweight.dtype)
        self.backend = backend
        self.register_buffer("qweight", qweight)
        self.register_buffer("scales", scales)
        self.register_buffer("bias", bias)
        self._kernel_args = None
        self._build_kernel()

    @classmethod
    def from_linear4bit(cls, layer, fmt: str = "int8", *, group: int | None = None, backend: str = "torch"):
        """The packed copy of a bitsandbytes `Linear4bit` layer (its bias kept in bf16), quantized once from its
        NF4-dequantized weight: one scale per output channel, or per `group` inputs."""
        weight = nf4_weight(layer)
        qweight, scales = quantize(weight, fmt, group)
        bias = None if layer.bias is None else layer.bias.detach().to(torch.bfloat16)
        return cls(qweight, scales, bias, group=group, backend=backend)

    def dequantized(self, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        """The weight the layer computes with, [out, in]: `bf16(q * s)`, exactly what gemlite's kernel forms."""
        return _dequantize_fused(self.qweight, self.scales, self.group).to(dtype)

    def _build_kernel(self) -> None:
        """gemlite's arguments for this weight, sharing its storage (`qweight.T`, `scales` as they are)."""
        self._kernel_args = None
        if self.backend != "gemlite" or not self.qweight.is_cuda:
            return
        from gemlite.core import GEMLITE_MATMUL_TYPES_MAPPING, DType, GemLiteLinearTriton
        from gemlite.triton_kernels import utils as kernels

        if not hasattr(kernels, SPLITK_SETTING):  # `fp32_splitk_sums` reads and restores it there
            raise RuntimeError(f"this gemlite keeps no {SPLITK_SETTING} in gemlite.triton_kernels.utils; vlrl is "
                               "tested with gemlite 0.6.0.post2: pip install 'vlrl[gpu]'.")
        self._splitk = GEMLITE_MATMUL_TYPES_MAPPING["GEMM_SPLITK"]
        layer = GemLiteLinearTriton(8, group_size=self.group, in_features=self.in_features,
                                    out_features=self.out_features, input_dtype=DType.BF16, output_dtype=DType.BF16)
        layer.pack(self.qweight, self.scales.t(), zeros=None, bias=None)
        layer.W_group_mode, layer.channel_scale_mode = 2, 0  # bf16(q * s) inside the loop, per-channel scales too
        tensors = layer.get_tensor_args()
        assert tensors[0].data_ptr() == self.qweight.data_ptr() and tensors[1].data_ptr() == self.scales.data_ptr()
        self._kernel_args = (tensors, layer.get_meta_args())

    def _apply(self, fn, recurse=True):
        # a device move makes new buffers, which gemlite's arguments must point at; a dtype cast of the model
        # (`model.bfloat16()`, which would also cast fp8 weights) leaves the packed format as it is
        dtypes = {name: t.dtype for name, t in self._buffers.items() if t is not None}
        out = super()._apply(fn, recurse)
        for name, dtype in dtypes.items():
            self._buffers[name] = self._buffers[name].to(dtype)
        self._build_kernel()
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and x.requires_grad:
            if torch.compiler.is_compiling():  # a compiled training forward: AOTAutograd differentiates the dequantize
                return torch.nn.functional.linear(x, self.dequantized(x.dtype), self.bias)
            return _FrozenLinear.apply(x, self)
        return self._matmul(x)

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        if KERNELS and self._kernel_args is not None and 0 < rows <= KERNEL_ROWS and x.dtype == torch.bfloat16:
            tensors, meta = self._kernel_args
            # split-K up to 64 rows too (gemlite's own rule takes its full GEMM at 64, no faster there: kernels.md)
            kind = -1 if rows <= GEMV_ROWS else self._splitk
            if torch.compiler.is_compiling():  # traced inside a decode, which holds `fp32_splitk_sums` around it
                y = torch.ops.gemlite.forward_functional(x.contiguous(), None, tensors, meta, kind)
            else:
                with fp32_splitk_sums():
                    y = torch.ops.gemlite.forward_functional(x.contiguous(), None, tensors, meta, kind)
            return y if self.bias is None else y + self.bias
        weight = self.dequantized(x.dtype)
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return torch.nn.functional.linear(x, weight, bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, format={self.fmt}, "
                f"group={self.group}, backend={self.backend}, bias={self.bias is not None}")


@contextlib.contextmanager
def fp32_splitk_sums():
    """For the span of the block (a decode, or one kernel call), gemlite's split-K partial sums meet in an fp32
    buffer, rounded to bf16 once (gemlite's default on Hopper adds them in bf16: 3.5e-3 from the training path's
    result instead of 9e-5), when `FP32_SPLITK_SUMS`. gemlite keeps this setting process-wide, for every gemlite layer
    in the process, so it is put back as it was on the way out, an exception included. gemlite has a setter
    (`set_native_atomic_bfp16`) and no getter: the value is read where 0.6 keeps it (`SPLITK_SETTING`, checked when a
    layer is packed). Nothing to do when gemlite was never imported (no layer packed for it)."""
    import sys

    kernels = sys.modules.get("gemlite.triton_kernels.utils")
    if not FP32_SPLITK_SUMS or kernels is None:
        yield
        return
    before = getattr(kernels, SPLITK_SETTING)
    setattr(kernels, SPLITK_SETTING, False)
    try:
        yield
    finally:
        setattr(kernels, SPLITK_SETTING, before)


@contextlib.contextmanager
def without_kernels():
    """For the span of the block, every packed layer computes through its dequantized weight (one fused dequantize
    + cuBLAS, as prefill and training do), never through gemlite's kernel. For checks that compare two forwards of
    the same inputs (an adapter read back beside the trained one, `vlrl.export.check_reload`): the kernel's split-K
    partial sums may meet in another order from one call to the next, and the 8B Crafter runs' read-back check,
    which runs its short probe through the kernel, failed with a 2-3e-2 logit gap where bf16 bases give exactly 0
    (bench/results/engine.md; the cause is not measured yet: bench/gpu_reload_gap.py)."""
    global KERNELS
    before, KERNELS = KERNELS, False
    try:
        yield
    finally:
        KERNELS = before


class _FrozenLinear(torch.autograd.Function):
    """The packed layer under autograd: the gradient goes to the input (`grad @ W`, W dequantized again in the
    backward, as bitsandbytes does: no bf16 copy of each weight kept for it); the weight is frozen."""

    @staticmethod
    def forward(x, layer):
        return layer._matmul(x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.layer = inputs[1]

    @staticmethod
    def backward(ctx, grad):
        return grad @ ctx.layer.dequantized(grad.dtype), None


def nf4_weight(layer) -> torch.Tensor:
    """A bitsandbytes 4-bit layer's weight as bitsandbytes computes with it: dequantized, [out, in], in bf16 (its
    values are `bf16(code * absmax)`), on the layer's device."""
    from bitsandbytes import functional as bnbf

    data, state = layer.weight.data, layer.weight.quant_state
    if getattr(state, "packing_format_for_cpu", False):  # bitsandbytes' CPU kernel repacked it: undo that first
        data, state = bnbf._convert_weight_packed_for_cpu_inverse(data, state)
    return bnbf.dequantize_4bit(data, state).to(torch.bfloat16)


def quantize(weight: torch.Tensor, fmt: str = "int8", group: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`weight` [out, in] as (qweight [out, in] in the format's dtype, scales [in / group, out] bf16).

    Each group's scale is its absmax over the format's largest value, rounded up to bf16, and the weights are
    quantized against that stored scale, so its rounding costs nothing: |bf16(q * s) - w| <= s / 2 for int8.

    >>> q, s = quantize(torch.tensor([[1.0, -0.5] * 32]), "int8")
    >>> q[0, :2].tolist(), s.shape, dequantize(q, s, 64)[0, :2].tolist()
    ([126, -63], torch.Size([1, 1]), [1.0, -0.5])
    """
    if fmt not in FORMATS:
        raise ConfigError(f"unknown packed format {fmt!r}; choose one of {', '.join(FORMATS)}.")
    out_features, in_features = weight.shape
    group = group or in_features
    if in_features % group:
        raise ConfigError(f"a weight {in_features} wide does not split into groups of {group}; use a group that "
                          f"divides it (or group = {in_features}, one scale per output channel).")
    blocks = weight.float().reshape(out_features, in_features // group, group)
    absmax = blocks.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12)
    scales = _round_up_bf16(absmax / QMAX[fmt])
    ratio = (blocks / scales.float()).clamp(-QMAX[fmt], QMAX[fmt])
    qweight = ratio.round().to(torch.int8) if fmt == "int8" else ratio.to(torch.float8_e4m3fn)
    return qweight.reshape(out_features, in_features), scales.squeeze(-1).t().contiguous()


def _round_up_bf16(x: torch.Tensor) -> torch.Tensor:
    """The smallest bf16 value >= x (x positive, float32), so that absmax / scale stays within the format's range."""
    rounded = x.to(torch.bfloat16)
    low = rounded.float() < x
    return torch.where(low, torch.nextafter(rounded, torch.full_like(rounded, float("inf"))), rounded)


def dequantize(qweight: torch.Tensor, scales: torch.Tensor, group: int | None = None) -> torch.Tensor:
    """`bf16(q * s)` [out, in] from `quantize`'s pair: the product rounded once to bf16, as gemlite forms it."""
    out_features, in_features = qweight.shape
    group = group or in_features
    blocks = qweight.reshape(out_features, in_features // group, group).to(torch.bfloat16)
    return (blocks * scales.t().unsqueeze(-1)).reshape(out_features, in_features)


_FUSED = {}


def _dequantize_fused(qweight: torch.Tensor, scales: torch.Tensor, group: int) -> torch.Tensor:
    """`dequantize` as one fused kernel on a GPU (torch.compile: read 1 B, write 2 B per weight, where eager torch
    takes three passes and the prefill paid 2x bitsandbytes' dequantize); eager elsewhere."""
    if not qweight.is_cuda:
        return dequantize(qweight, scales, group)
    if "fn" not in _FUSED:
        _FUSED["fn"] = torch.compile(dequantize)  # shapes go dynamic after the first recompile: one or two graphs
    return _FUSED["fn"](qweight, scales, group)


def choose_format(device: torch.device | str | None = None, fmt: str = "auto", backend: str = "auto") -> dict:
    """What `pack_for_decoding` does on `device` (default: CUDA if present): {"format", "backend", "reason"}, format
    "nf4" meaning the layers stay as they are. See the module docstring for each card class and why.

    >>> choose_format("cpu")["format"], choose_format("cpu")["backend"]
    ('int8', 'torch')
    """
    import importlib.util

    if fmt != "auto" and fmt not in FORMATS:
        raise ConfigError(f"unknown packed format {fmt!r}; choose auto or one of {', '.join(FORMATS)}.")
    if backend not in BACKENDS:
        raise ConfigError(f"unknown packing backend {backend!r}; choose one of {', '.join(BACKENDS)}.")
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    gemlite = importlib.util.find_spec("gemlite") is not None
    if device.type != "cuda":
        if backend == "gemlite":
            raise ConfigError("backend 'gemlite' runs on CUDA GPUs only; use backend 'torch' (or 'auto') here.")
        return {"format": "int8" if fmt == "auto" else fmt, "backend": "torch",
                "reason": "no GPU: dequantize + F.linear, the same weights the GPU kernel reads"}
    capability = torch.cuda.get_device_capability(device)
    if fmt == "fp8" and capability < (8, 9):
        raise ConfigError(f"fp8 weights need an Ada or Hopper GPU (compute capability 8.9+); this one is "
                          f"{capability[0]}.{capability[1]}: use fmt 'int8'.")
    if backend == "gemlite" and not gemlite:
        raise MissingExtra("backend 'gemlite' needs the gemlite package: pip install 'vlrl[gpu]'.")
    if backend == "auto":
        if not gemlite or capability < (8, 0):
            if fmt == "auto":
                why = "gemlite is not installed" if not gemlite else f"compute capability {capability} is pre-Ampere"
                return {"format": "nf4", "backend": "bitsandbytes",
                        "reason": f"{why}: without its kernel int8 would cost memory and gain nothing"}
            backend = "torch"
        else:
            backend = "gemlite"
    return {"format": "int8" if fmt == "auto" else fmt, "backend": backend,
            "reason": "8-bit weights read once per matmul: 2-3x bitsandbytes' decoding speed (kernels.md)"}


def packable_layers(model, *, vision: bool = False) -> list[tuple[str, torch.nn.Module]]:
    """(name, layer) of every bitsandbytes 4-bit layer outside the vision tower (LoRA's base layers included); with
    `vision`, those inside it instead (which stay 4-bit)."""
    try:
        from bitsandbytes.nn import Linear4bit
    except ImportError:
        return []
    return [(name, m) for name, m in model.named_modules()
            if isinstance(m, Linear4bit) and any(v in f".{name}." for v in VISION_MARKERS) == vision]


def pack_for_decoding(model, fmt: str = "auto", *, backend: str = "auto", group: int | None = None) -> dict:
    """Replaces each frozen bitsandbytes 4-bit layer of `model`'s language model (a PEFT LoRA layer's `base_layer`
    too; never the vision tower, never a LoRA weight) by a `PackedLinear` made from its NF4 weights, in place.

    Args:
        model: a loaded model, LoRA-wrapped or not, on its final device (a later `.to()` keeps the kernel working).
        fmt: "auto" (`choose_format`), "int8" or "fp8".
        backend: "auto", "gemlite" (CUDA) or "torch" (dequantize + F.linear, anywhere).
        group: inputs per scale (None: one per output channel, the fast and unbiased choice; 64 matches NF4's
            blocks).

    Returns:
        {"format", "backend", "reason", "layers", "bytes_before", "bytes_after", "weight_error",
         "vision_layers_left", "seconds"}: bytes of the packed layers' weights (bias and scales included) before
        and after; the largest relative RMS error of a packed weight against its NF4 weight (int8: about 8e-3).

    Raises:
        ValueError: nothing to pack (no bitsandbytes 4-bit layer outside the vision tower), or an unknown format.
    """
    started = time.time()
    layers = packable_layers(model)
    if not layers:
        raise ConfigError(f"{type(model).__name__} has no bitsandbytes 4-bit layer outside its vision tower to pack: "
                          "load it with load_in_4bit=True (the 8B preset does), or leave decoding as it is.")
    device = layers[0][1].weight.device
    choice = choose_format(device, fmt, backend)
    report = {**choice, "layers": 0, "bytes_before": 0, "bytes_after": 0, "weight_error": 0.0,
              "vision_layers_left": len(packable_layers(model, vision=True))}
    if choice["format"] == "nf4":
        return {**report, "seconds": round(time.time() - started, 2)}
    modules = dict(model.named_modules())
    with torch.no_grad():
        for name, layer in layers:
            packed = PackedLinear.from_linear4bit(layer, choice["format"], group=group, backend=choice["backend"])
            report["weight_error"] = max(report["weight_error"], _weight_error(layer, packed))
            report["bytes_before"] += _bytes(layer)
            report["bytes_after"] += _bytes(packed)
            parent, _, child = name.rpartition(".")
            setattr(modules[parent] if parent else model, child, packed)
            report["layers"] += 1
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {**report, "weight_error": round(report["weight_error"], 6),
            "seconds": round(time.time() - started, 2)}


def _weight_error(layer, packed: PackedLinear) -> float:
    """RMS(packed weight - NF4 weight) / RMS(NF4 weight)."""
    reference = nf4_weight(layer).float()
    return float((packed.dequantized().float() - reference).norm() / reference.norm().clamp(min=1e-30))


def _bytes(module) -> int:
    """Bytes of a layer's weight storage: its parameters, buffers and bitsandbytes' quantization state."""
    tensors = list(module.parameters(recurse=False)) + list(module.buffers(recurse=False))
    total = sum(t.numel() * t.element_size() for t in tensors)
    state = getattr(getattr(module, "weight", None), "quant_state", None)
    if state is not None:
        total += state.absmax.numel() * state.absmax.element_size() + state.code.numel() * state.code.element_size()
        if state.nested:
            total += sum(t.numel() * t.element_size() for t in (state.state2.absmax, state.state2.code))
    return total


def reference_logits(model, inputs: dict) -> torch.Tensor:
    """The model's logits for `inputs` (a processor batch) in float32, without gradients: taken before packing,
    they are the NF4 reference `verify_packing` compares with."""
    with torch.no_grad():
        return model(**inputs).logits.float()


def verify_packing(model, inputs: dict, reference: torch.Tensor, *, tolerance: float = LOGIT_TOLERANCE,
                   kl_tolerance: float = KL_TOLERANCE) -> dict:
    """The packed model's logits for `inputs` against `reference` (`reference_logits` of the NF4 model, same inputs).

    Returns:
        {"relative_error": RMS(logits - reference) / RMS spread of the reference logits, "mean_kl" and "max_kl":
         KL(reference || packed) of the next-token distributions, "tolerance", "kl_tolerance", "positions"}.

    Raises:
        ValueError: relative_error over `tolerance` (LOGIT_TOLERANCE, 5e-2), mean_kl over `kl_tolerance`
        (KL_TOLERANCE, 1e-3), or a logit that is not finite.
    """
    logits = reference_logits(model, inputs)
    mask = inputs.get("attention_mask")
    keep = mask.bool() if mask is not None else torch.ones(logits.shape[:-1], dtype=torch.bool, device=logits.device)
    packed, ref = logits[keep], reference.to(logits.device)[keep]
    spread = (ref - ref.mean(dim=-1, keepdim=True)).pow(2).mean().sqrt()
    relative = float((packed - ref).pow(2).mean().sqrt() / spread)
    kl = torch.nn.functional.kl_div(packed.log_softmax(-1), ref.log_softmax(-1), log_target=True,
                                    reduction="none").sum(-1)
    result = {"relative_error": relative, "mean_kl": float(kl.mean()), "max_kl": float(kl.max()),
              "tolerance": tolerance, "kl_tolerance": kl_tolerance, "positions": int(keep.sum())}
    if not torch.isfinite(packed).all() or not relative <= tolerance or not result["mean_kl"] <= kl_tolerance:
        raise ConfigError(f"the packed model's logits are {relative:.2e} (relative RMS; tolerance {tolerance:.0e}) and "
                          f"{result['mean_kl']:.1e} (mean KL; tolerance {kl_tolerance:.0e}) from the NF4 model's: the "
                          'repack is wrong; set [model] decode_format = "nf4" to decode from the NF4 layers.')
    return result
