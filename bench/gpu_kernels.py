"""Kernel candidates for decoding from the 8B's frozen 4-bit base (issue 32, point 2), side by side in one process.

At the Qwen3-VL 8B's layer shapes (4096 -> 12288 gate/up, 12288 -> 4096 down, 4096 -> 4096 q/o, 4096 -> 1024 k/v)
and rows M = 1, 16, 32, 64 (decoding; 2048 for prefill and the training forward, on the candidates that serve it),
each candidate's matmul is timed in a CUDA graph that runs it over C different weights of that shape, back to back,
C chosen so that their bytes are several times the L2 cache (as a model's layers stream past it), replayed 30 times:
the median per matmul, and the spread (p10..p90) as a share of it. Inputs are fresh random bf16 rows for every
candidate and M. Accuracy: relative Frobenius error of the candidate's output against x @ W.T in float64, W the
NF4-dequantized weight bitsandbytes computes with (the reference every candidate is a copy of), on inputs drawn
apart from the timed ones; the graph's output is also checked against the eager call. Memory: bytes of each
format's weights (scales included) for the 8B language model's 252 linears.

Candidates (`CANDIDATES`, in run order; each in its own try/except, a failure recorded with its error): bf16 cuBLAS;
bitsandbytes NF4; vlrl's packed int8 and fp8 (vlrl.engine.weights: per output channel or per NF4 block of 64, gemlite
or plain torch) and its variants; gemlite A16W8 int8 / fp8 and int4 at groups 128 and 64; torchao 0.18 int8, int4 and
fp8 weight-only; torch._scaled_mm fp8; a torch.compile'd dequantize + matmul of the int8 weights. gemlite autotunes
briefly so the run fits one call; `--budget-s` stops starting new work past that many seconds and records what was
left out. `module_check` first checks vlrl.engine.weights on the GPU. Results: bench/results/kernels.md.

    python bench/gpu_kernels.py --out $OUT/kernels
    python bench/gpu_kernels.py --out $OUT/kernels --only "bf16 cuBLAS" "vlrl int8 (gemlite)" --rows 16 32
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SHAPES = [("gate_up", 4096, 12288), ("down", 12288, 4096), ("q_o", 4096, 4096), ("k_v", 4096, 1024)]  # name, in, out
PER_LAYER = {"gate_up": 2, "down": 1, "q_o": 2, "k_v": 2}  # how many of each shape one of the 8B's 36 layers holds
LAYERS = 36
DECODE_ROWS = [1, 16, 32, 64]
PREFILL_ROWS = 2048
COPY_BYTES = 160e6  # NF4 bytes of the weight copies one graph cycles through: ~6x an H100's 50 MB L2 at 8 bits
REPS = 30
START = time.time()


def say(text: str) -> None:
    print(f"T+{time.time() - START:6.1f}s {text}", flush=True)


def nf4_layer(k: int, n: int, seed: int):
    """A bitsandbytes NF4 layer (blocks of 64, double quantization, bf16 compute) of random N(0, 0.02) weights, and
    its dequantized bf16 weight, as the 8B preset loads them."""
    import bitsandbytes as bnb
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    layer = bnb.nn.Linear4bit(k, n, bias=False, compute_dtype=torch.bfloat16, quant_type="nf4",
                              compress_statistics=True, device="meta")
    w = (torch.randn(n, k, generator=g, device="cuda") * 0.02).to(torch.bfloat16)
    layer.weight = bnb.nn.Params4bit(w, requires_grad=False, compress_statistics=True, quant_type="nf4")
    layer = layer.cuda()  # quantizes: bitsandbytes packs a Params4bit when it first moves to a device
    from vlrl.engine.weights import nf4_weight

    return layer, nf4_weight(layer)


def tensor_bytes(*tensors) -> int:
    import torch

    total = 0
    for t in tensors:
        if isinstance(t, torch.Tensor):
            if type(t) not in (torch.Tensor, torch.nn.Parameter) and hasattr(t, "__tensor_flatten__"):
                names, _ = t.__tensor_flatten__()  # a torchao weight: the bytes of the tensors it holds
                total += tensor_bytes(*(getattr(t, name) for name in names))
            else:
                total += t.numel() * t.element_size()
    return total


def module_bytes(module) -> int:
    from vlrl.engine.weights import _bytes

    if type(module).__name__ == "Linear4bit" or hasattr(module, "qweight"):
        return _bytes(module)
    return tensor_bytes(*module.parameters(), *module.buffers())


# ---- candidates: build(layer, weight) -> (callable x -> y, weight bytes) ------------------------------------------

def c_bf16(layer, w):
    import torch

    w = w.clone()
    return (lambda x: torch.nn.functional.linear(x, w)), tensor_bytes(w)


def c_bnb(layer, w):
    return layer, module_bytes(layer)


def c_vlrl(fmt: str, backend: str, group: int | None = None, bf16_atomics: bool = False):
    def build(layer, w):
        from vlrl.engine.weights import PackedLinear

        packed = PackedLinear.from_linear4bit(layer, fmt, group=group, backend=backend)
        if not bf16_atomics:
            return packed, module_bytes(packed)
        from vlrl.engine import weights

        def run(x):  # gemlite's own default on Hopper: split-K partial sums added in bf16
            weights.FP32_SPLITK_SUMS = False
            try:
                return packed(x)
            finally:
                weights.FP32_SPLITK_SUMS = True
        return run, module_bytes(packed)
    return build


def c_gemlite_gemm(layer, w):
    """vlrl's int8 per-channel weights through gemlite's own choice of kernel at any row count (its full GEMM past
    64 rows): the alternative to dequantize + cuBLAS for prefill and the training forward."""
    import torch

    from vlrl.engine.weights import PackedLinear

    packed = PackedLinear.from_linear4bit(layer, "int8", backend="gemlite")
    tensors, meta = packed._kernel_args
    return (lambda x: torch.ops.gemlite.forward_functional(x, None, tensors, meta, -1)), module_bytes(packed)


def c_gemlite_a16w8(fp8: bool):
    def build(layer, w):
        from gemlite.helper import A16W8_FP8, A16W8_INT8

        helper = A16W8_FP8 if fp8 else A16W8_INT8
        g = helper(device="cuda:0").from_weights(w.clone())
        return g, tensor_bytes(g.W_q, g.scales)
    return build


def c_gemlite_int4(group: int):
    def build(layer, w):
        import torch
        from gemlite.helper import A16Wn

        n, k = w.shape
        blocks = w.float().reshape(n, k // group, group)
        low, high = blocks.amin(-1, keepdim=True), blocks.amax(-1, keepdim=True)
        scale = ((high - low) / 15).clamp(min=1e-8)
        zero = -low / scale
        q = (blocks / scale + zero).round().clamp(0, 15).to(torch.uint8).reshape(n, k)
        g = A16Wn(device="cuda:0").from_weights(q, scale.squeeze(-1).to(torch.bfloat16),
                                                zero.squeeze(-1).to(torch.bfloat16), W_nbits=4, group_size=group)
        return g, tensor_bytes(g.W_q, g.scales, g.zeros)
    return build


def torchao_linear(w, config):
    import torch
    from torchao.quantization import quantize_

    n, k = w.shape
    linear = torch.nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        linear.weight.copy_(w)
    quantize_(linear, config)
    return linear


def c_torchao(kind: str, compiled: bool = False):
    def build(layer, w):
        from torchao.quantization import (
            Float8WeightOnlyConfig,
            Int4WeightOnlyConfig,
            Int8WeightOnlyConfig,
            PerRow,
        )

        config = {"int8": lambda: Int8WeightOnlyConfig(granularity=PerRow(), set_inductor_config=False),
                  "int4": lambda: Int4WeightOnlyConfig(group_size=128, int4_packing_format="tile_packed_to_4d",
                                                       set_inductor_config=False),
                  "fp8": lambda: Float8WeightOnlyConfig(set_inductor_config=False)}[kind]()
        linear = torchao_linear(w, config)
        nbytes = tensor_bytes(linear.weight)
        if not compiled:
            return linear, nbytes
        weight = linear.weight
        return (lambda x: COMPILED["torchao"](x, weight)), nbytes
    return build


def c_inductor_int8(layer, w):
    from vlrl.engine.weights import PackedLinear

    packed = PackedLinear.from_linear4bit(layer, "int8", backend="torch")
    q, s = packed.qweight, packed.scales
    return (lambda x: COMPILED["dequant"](x, q, s)), module_bytes(packed)  # per channel: group = the whole row


def c_scaled_mm(layer, w):
    import torch

    scale_w = (w.float().abs().amax(dim=1, keepdim=True) / 448).clamp(min=1e-12)  # [N, 1]
    wq = (w.float() / scale_w).to(torch.float8_e4m3fn)
    scale_b = scale_w.t().contiguous()  # [1, N]

    def run(x):
        scale_a = (x.abs().amax(dim=-1, keepdim=True).float() / 448).clamp(min=1e-12)  # [M, 1], dynamic per row
        xq = (x.float() / scale_a).to(torch.float8_e4m3fn)
        return torch._scaled_mm(xq, wq.t(), scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16)
    return run, tensor_bytes(wq, scale_b)


COMPILED = {}


def compiled_fns():
    """torch.compile'd functions shared by every copy and shape (weights are inputs, so one compile per shape)."""
    import torch

    from vlrl.engine.weights import dequantize

    if not COMPILED:
        for limit in ("recompile_limit", "cache_size_limit"):  # one compile per shape and row count, never eager
            if hasattr(torch._dynamo.config, limit):
                setattr(torch._dynamo.config, limit, 64)
        COMPILED["dequant"] = torch.compile(lambda x, q, s: torch.nn.functional.linear(x, dequantize(q, s)),
                                            dynamic=False)
        COMPILED["torchao"] = torch.compile(lambda x, w: torch.nn.functional.linear(x, w), dynamic=False)
    return COMPILED


# name -> (builder, rows it serves: "decode" (M = 1..64), "both" (also prefill, M = 2048) or "prefill"). Listed in
# the order they run: the budget leaves out the last ones first. vlrl's packed formats are per output channel unless
# named g64 (one scale per NF4 block of 64).
CANDIDATES = {
    "bf16 cuBLAS": (c_bf16, "both"),
    "bitsandbytes NF4": (c_bnb, "both"),
    "vlrl int8 (gemlite)": (c_vlrl("int8", "gemlite"), "both"),
    "vlrl fp8 (gemlite)": (c_vlrl("fp8", "gemlite"), "both"),
    "gemlite int8 GEMM (prefill)": (c_gemlite_gemm, "prefill"),
    "vlrl int8 g64 (gemlite)": (c_vlrl("int8", "gemlite", 64), "both"),
    "vlrl int8 g64 (torch)": (c_vlrl("int8", "torch", 64), "decode"),
    "torch._scaled_mm fp8 rowwise (w8a8)": (c_scaled_mm, "both"),
    "torchao int4 tinygemm g128": (c_torchao("int4"), "decode"),
    "torchao int8 weight-only": (c_torchao("int8"), "decode"),
    "torchao fp8 weight-only": (c_torchao("fp8"), "decode"),
    "vlrl fp8 g64 (gemlite)": (c_vlrl("fp8", "gemlite", 64), "decode"),
    "gemlite fp8 per-channel": (c_gemlite_a16w8(True), "decode"),
    "gemlite int8 per-channel": (c_gemlite_a16w8(False), "decode"),
    "vlrl int8 (gemlite, bf16 atomics)": (c_vlrl("int8", "gemlite", bf16_atomics=True), "decode"),
    "gemlite int4 g128": (c_gemlite_int4(128), "decode"),
    "gemlite int4 g64": (c_gemlite_int4(64), "decode"),
    "inductor int8 dequant+matmul": (c_inductor_int8, "decode"),
    "torchao int8 weight-only (compiled)": (c_torchao("int8", compiled=True), "decode"),
}


# ---- timing -------------------------------------------------------------------------------------------------------

def graph_time(calls: list, reps: int = REPS) -> dict:
    """µs per call: the calls captured back to back in one CUDA graph, replayed `reps` times (median, spread)."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(2):
            [c() for c in calls]
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    method = "cuda graph"
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph), torch.no_grad():
            outs = [c() for c in calls]
        replay = graph.replay
    except Exception as error:  # noqa: BLE001  (a candidate that cannot be captured is timed eagerly, and says so)
        torch.cuda.synchronize()
        method = f"eager ({type(error).__name__})"
        outs = None

        def replay():
            with torch.no_grad():
                [c() for c in calls]
    for _ in range(3):
        replay()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for start, end in events:
        start.record()
        replay()
        end.record()
    torch.cuda.synchronize()
    per_call = sorted(1000 * s.elapsed_time(e) / len(calls) for s, e in events)
    median = statistics.median(per_call)
    spread = (per_call[int(0.9 * (reps - 1))] - per_call[int(0.1 * (reps - 1))]) / median
    result = {"us": round(median, 2), "spread": round(spread, 3), "timing": method, "calls_per_graph": len(calls)}
    if outs is not None:
        with torch.no_grad():
            eager = calls[0]()
        result["graph_vs_eager"] = float((outs[0].float() - eager.float()).norm() / eager.float().norm())
    return result


def relative_error(fn, w, m: int, k: int, shift: float = 0.0) -> float:
    """On fresh inputs: N(0, 1), or N(shift, 1) (an input of nonzero mean, as after an activation, sums each output
    channel's weight errors coherently: a biased format shows there)."""
    import torch

    x = (torch.randn(m, k, device="cuda") + shift).to(torch.bfloat16)
    with torch.no_grad():
        y = fn(x)
    reference = x.double() @ w.double().T
    if not torch.isfinite(y).all():
        return float("nan")
    return float((y.double() - reference).norm() / reference.norm())


def copy_bandwidth() -> float:
    import torch

    x = torch.empty(1024**3, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(10):
        y.copy_(x)
    end.record()
    torch.cuda.synchronize()
    return 2 * 1024**3 * 10 / (start.elapsed_time(end) / 1000)  # bytes read + written per second


def environment() -> dict:
    import importlib.metadata

    import torch
    import triton

    env = {"gpu": torch.cuda.get_device_name(), "capability": ".".join(map(str, torch.cuda.get_device_capability())),
           "torch": torch.__version__, "triton": triton.__version__}
    for package in ("gemlite", "torchao", "bitsandbytes"):
        try:
            env[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            env[package] = None
    return env


def probe() -> dict:
    """What imports and which torchao configurations exist, before anything is timed."""
    out = {}
    try:
        import gemlite
        from gemlite.core import GEMLITE_TRITON_CONFIG_CACHE

        out["gemlite"] = {"version": gemlite.__version__,
                          "preloaded_configs": {k: len(v) for k, v in GEMLITE_TRITON_CONFIG_CACHE.items()}}
    except Exception as error:  # noqa: BLE001
        out["gemlite"] = f"{type(error).__name__}: {error}"
    try:
        import torchao.quantization as q

        out["torchao_configs"] = sorted(n for n in dir(q) if n.endswith("Config"))
    except Exception as error:  # noqa: BLE001
        out["torchao_configs"] = f"{type(error).__name__}: {error}"
    return out


def quicker_gemlite_autotune() -> None:
    """gemlite's autotuners benchmark each configuration 5 + 25 ms instead of Triton's default 25 + 100."""
    import importlib

    import triton.testing
    from triton.runtime.autotuner import Autotuner

    def quick(kernel_call, quantiles):
        return triton.testing.do_bench(kernel_call, warmup=5, rep=25, quantiles=quantiles)

    tuned = 0
    for name in ("gemv_kernels", "gemv_splitK_kernels", "gemv_revsplitK_kernels", "gemm_splitK_kernels",
                 "gemm_kernels"):
        module = importlib.import_module(f"gemlite.triton_kernels.{name}")
        for value in vars(module).values():
            if isinstance(value, Autotuner):
                value._do_bench = quick
                value.__dict__.pop("do_bench", None)  # a cached_property, if it was read already
                tuned += 1
    say(f"gemlite autotuners set to 5 + 25 ms per configuration: {tuned}")


def check_module() -> dict:
    """vlrl.engine.weights on this GPU: the gemlite backend against the plain-torch one at decode and prefill row
    counts (same weights, so only rounding and summation order differ), the input gradient through the kernel's
    path, one compiled graph (fullgraph) of a packed layer, and pack_for_decoding on a PEFT LoRA model of NF4 layers
    with gradients reaching the adapters."""
    from collections import OrderedDict

    import torch
    from peft import LoraConfig, get_peft_model

    from vlrl.engine.weights import PackedLinear, pack_for_decoding

    out = {}
    layer, _ = nf4_layer(4096, 1024, seed=7)
    kernel = PackedLinear.from_linear4bit(layer, "int8", backend="gemlite")
    plain = PackedLinear.from_linear4bit(layer, "int8", backend="torch")
    assert torch.equal(kernel.qweight, plain.qweight)
    with torch.no_grad():
        for m in (1, 13, 16, 32, 64, 65, 300):
            x = torch.randn(m, 4096, device="cuda").to(torch.bfloat16)
            a, b = kernel(x).float(), plain(x).float()
            out[f"gemlite_vs_torch_m{m}"] = float((a - b).norm() / b.norm())
    x = torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(16, 1024, device="cuda", dtype=torch.bfloat16)
    kernel(x).backward(grad)
    expected = grad.float() @ plain.dequantized().float()
    out["input_grad_error"] = float((x.grad.float() - expected).norm() / expected.norm())
    compiled = torch.compile(kernel, fullgraph=True)
    with torch.no_grad():
        x = torch.randn(16, 4096, device="cuda").to(torch.bfloat16)
        out["compiled_vs_eager"] = float((compiled(x).float() - kernel(x).float()).norm() / kernel(x).float().norm())
    model = torch.nn.Sequential(OrderedDict(up=nf4_layer(1024, 4096, seed=8)[0], act=torch.nn.ReLU(),
                                            down=nf4_layer(4096, 1024, seed=9)[0]))
    model = get_peft_model(model, LoraConfig(target_modules=["up", "down"], r=8, init_lora_weights=False))
    x = torch.randn(4, 1024, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        before = model(x).float()
    report = pack_for_decoding(model)
    with torch.no_grad():
        after = model(x).float()
    model(x.requires_grad_()).float().pow(2).mean().backward()
    grads = [p.grad for n, p in model.named_parameters() if "lora_" in n]
    out.update(pack_report=report, packed_vs_nf4=float((after - before).norm() / before.norm()),
               lora_grads_nonzero=sum(int(g is not None and bool(g.abs().sum() > 0)) for g in grads),
               lora_params=len(grads))
    return out


def markdown(result: dict) -> str:
    rows = sorted({r["m"] for r in result["rows"]})
    env = result["env"]
    header = (f"{env['gpu']} (sm_{env['capability'].replace('.', '')}), torch {env['torch']}, triton {env['triton']}, "
              f"gemlite {env['gemlite']}, torchao {env['torchao']}, bitsandbytes {env['bitsandbytes']}; copy "
              f"bandwidth {result['copy_bandwidth_tb_s']} TB/s (read + write).")
    lines = [header, ""]
    for shape, k, n in SHAPES:
        title = f"### {shape}: {k} -> {n}, µs per matmul (relative error vs the NF4 weight: inputs of mean 0, mean 1)"
        lines += [title, "",
                  "| candidate | " + " | ".join(f"M={m}" for m in rows) + " | weight MB |",
                  "|---|" + "---|" * (len(rows) + 1)]
        for name in CANDIDATES:
            cells = {r["m"]: r for r in result["rows"] if r["candidate"] == name and r["shape"] == shape}
            if not cells:
                continue
            text = []
            for m in rows:
                r = cells.get(m)
                if r is None:
                    text.append("")
                elif "us" in r:
                    text.append(f"{r['us']:.1f} ({r['relative_error']:.1e}, {r.get('relative_error_mean1', 0):.1e})")
                else:
                    text.append(r.get("error", r.get("skipped", "?"))[:60])
            nbytes = next((r["weight_bytes"] for r in cells.values() if "weight_bytes" in r), None)
            lines.append(f"| {name} | " + " | ".join(text) + f" | {nbytes / 1e6:.1f} |" if nbytes else
                         f"| {name} | " + " | ".join(text) + " | |")
        lines.append("")
    lines += ["### The 8B language model's 252 linears, per format (GiB of weights, scales included)", "",
              "| candidate | GiB |", "|---|---|"]
    lines += [f"| {name} | {gib} |" for name, gib in result["memory_gib"].items()]
    return "\n".join(lines) + "\n"


def main() -> None:
    import torch

    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--only", nargs="+", help="candidates to run (default: all, in CANDIDATES' order)")
    p.add_argument("--shapes", nargs="+", default=[s[0] for s in SHAPES])
    p.add_argument("--rows", nargs="+", type=int, default=DECODE_ROWS)
    p.add_argument("--prefill", action=argparse.BooleanOptionalAction, default=True,
                   help=f"also M={PREFILL_ROWS} for the candidates that serve prefill and training")
    p.add_argument("--budget-s", type=float, default=400)
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = environment()
    say(f"ENV {json.dumps(env)}")
    found = probe()
    say(f"PROBE {json.dumps(found)}")
    try:
        quicker_gemlite_autotune()
    except Exception as error:  # noqa: BLE001
        say(f"gemlite autotune settings not changed: {error}")
    result = {"env": env, "probe": found, "copy_bandwidth_tb_s": round(copy_bandwidth() / 1e12, 3), "rows": [],
              "command": " ".join(sys.argv), "memory_gib": {}}
    read_bw = result["copy_bandwidth_tb_s"] * 1e12 / 2
    try:
        result["module_check"] = check_module()
    except Exception as error:  # noqa: BLE001
        result["module_check"] = {"error": f"{type(error).__name__}: {error}", "trace": traceback.format_exc()[-2000:]}
    say(f"MODULE_CHECK {json.dumps(result['module_check'])}")
    names = args.only or list(CANDIDATES)
    shapes = [s for s in SHAPES if s[0] in args.shapes]
    layers = {}
    for shape, k, n in shapes:
        copies = max(2, min(64, math.ceil(COPY_BYTES / (n * k * 0.52))))
        layers[shape] = [nf4_layer(k, n, seed=1000 * len(layers) + i) for i in range(copies)]
        say(f"{shape}: {copies} NF4 copies")
    per_shape_bytes = {}
    for name in names:
        build, serves = CANDIDATES[name]
        for shape, k, n in shapes:
            ms = ([] if serves == "prefill" else list(args.rows)) + \
                ([PREFILL_ROWS] if serves != "decode" and args.prefill else [])
            if time.time() - START > args.budget_s:
                result["rows"] += [{"candidate": name, "shape": shape, "m": m, "skipped": "time budget"} for m in ms]
                continue
            base = {"candidate": name, "shape": shape}
            try:
                if "compiled" in name or "inductor" in name:
                    compiled_fns()
                built = [build(layer, w) for layer, w in layers[shape]]
            except Exception as error:  # noqa: BLE001
                say(f"{name} {shape}: build failed: {error}")
                result["rows"] += [{**base, "m": m, "error": f"build: {type(error).__name__}: {str(error)[:300]}"}
                                   for m in ms]
                continue
            fns, nbytes = [b[0] for b in built], built[0][1]
            per_shape_bytes.setdefault(name, {})[shape] = nbytes
            for m in ms:
                row = {**base, "m": m, "weight_bytes": nbytes}
                try:
                    xs = [torch.randn(m, k, device="cuda").to(torch.bfloat16) for _ in fns]
                    calls = [lambda f=f, x=x: f(x) for f, x in zip(fns, xs)]
                    row.update(graph_time(calls))
                    row["relative_error"] = relative_error(fns[0], layers[shape][0][1], m, k)
                    row["relative_error_mean1"] = relative_error(fns[0], layers[shape][0][1], m, k, shift=1.0)
                    row["bound_share"] = round(1e6 * nbytes / read_bw / row["us"], 3)
                except Exception as error:  # noqa: BLE001
                    row["error"] = f"{type(error).__name__}: {str(error)[:300]}"
                    row["trace"] = traceback.format_exc()[-1500:]
                say(f"ROW {json.dumps({k_: v for k_, v in row.items() if k_ != 'trace'})}")
                result["rows"].append(row)
            del built, fns
            torch.cuda.empty_cache()
        (out / "kernels.json").write_text(json.dumps(result, indent=1))
    for name, sizes in per_shape_bytes.items():
        if len(sizes) == len(SHAPES):
            total = LAYERS * sum(PER_LAYER[s] * b for s, b in sizes.items())
            result["memory_gib"][name] = round(total / 2**30, 2)
    try:
        import gemlite

        gemlite.cache_config(str(out / f"gemlite_configs_{env['gpu'].split()[1].lower()}.json"))
    except Exception as error:  # noqa: BLE001
        say(f"gemlite configs not saved: {error}")
    (out / "kernels.json").write_text(json.dumps(result, indent=1))
    (out / "kernels.md").write_text(markdown(result))
    print(markdown(result))
    print("SHORT (µs at M=1/16/32/64, gate_up and down)")
    for name in names:
        cells = []
        for shape in ("gate_up", "down"):
            by_m = {r["m"]: r for r in result["rows"] if r["candidate"] == name and r["shape"] == shape}
            cells.append("/".join(f"{by_m[m]['us']:.0f}" if "us" in by_m.get(m, {}) else "x" for m in args.rows))
        err = next((r["relative_error"] for r in result["rows"] if r["candidate"] == name and "relative_error" in r),
                   float("nan"))
        print(f"{name:40s} {cells[0]:>20s} {cells[1]:>20s} err {err:.1e}")


if __name__ == "__main__":
    main()
