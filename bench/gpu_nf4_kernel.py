"""The fused NF4 kernel alone (`tests/nf4_decode.py`), layer by layer, against bitsandbytes' dequantize + bf16 matmul:
the Qwen3-VL-8B language model's four projection shapes at decode batches of 8 and 32, each call replayed from a CUDA
graph (as compiled decoding runs it), over a sweep of tile sizes, with `launch_config`'s rule marked.

    python bench/gpu_nf4_kernel.py --out $OUT/nf4_kernel.json      # on the device machine, with the wheel set
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the kernel lives beside its test
sys.path.insert(0, str(Path(__file__).resolve().parent))

SHAPES = {"q/o": (4096, 4096), "k/v": (1024, 4096), "gate/up": (12288, 4096), "down": (4096, 12288)}  # (N, K)


def graph_ms(fn, calls: int = 20, reps: int = 5) -> float:
    """Milliseconds per call of `fn`, captured `calls` times in one CUDA graph and replayed (launch cost excluded)."""
    from gpu_decode_attention import graphed

    replay = graphed(fn, calls)
    replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / (calls * reps)


def measure_layer(label: str, n: int, k: int, m: int, programs: int) -> dict:
    """bitsandbytes, the op as vlrl calls it, and every tile configuration of the sweep, on one random NF4 layer."""
    import nf4_decode  # tests/nf4_decode.py
    import triton
    from bitsandbytes.nn import Linear4bit, Params4bit

    layer = Linear4bit(k, n, bias=False, compute_dtype=torch.bfloat16, quant_type="nf4", compress_statistics=True)
    layer.weight = Params4bit((torch.randn(n, k) * 0.02).to(torch.bfloat16), requires_grad=False,
                              compress_statistics=True, quant_type="nf4")
    layer = layer.cuda()
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    packed, absmax, code = nf4_decode._prepared(layer)
    weight_bytes = packed.numel() + layer.weight.quant_state.absmax.numel()  # 4-bit codes + uint8 scales
    block_m = nf4_decode.block_rows(m)
    rule = nf4_decode.launch_config(n, k, programs)
    row = {"layer": label, "n": n, "k": k, "m": m, "weight_mb": round(weight_bytes / 1e6, 2), "rule": rule,
           "configs": []}
    with torch.no_grad():
        expected = layer(x).float()
        row["bitsandbytes_ms"] = round(graph_ms(lambda: layer(x)), 4)
        row["op_ms"] = round(graph_ms(lambda: nf4_decode.nf4_linear(x, layer)), 4)
        for block_n, block_k, warps in itertools.product([32, 64, 128], [64, 128, 256], [4, 8]):
            config = nf4_decode.launch_config(n, k, programs, block_n=block_n, block_k=block_k, num_warps=warps)
            y = torch.zeros(m, n, device="cuda")

            def fused(config=config, y=y):
                y.zero_()
                nf4_decode._nf4_matmul_kernel[(triton.cdiv(n, config["BLOCK_N"]), config["SPLIT_K"])](
                    x, packed, absmax, code, y, m, n, k, BLOCK_M=block_m, INTERPRET_DOT=False, **config)

            try:
                ms = graph_ms(fused)
                error = float((y - expected).abs().max() / expected.abs().max())
                row["configs"].append({**config, "ms": round(ms, 4), "gb_s": round(weight_bytes / ms / 1e6, 1),
                                       "max_rel_error": round(error, 5)})
            except Exception as e:  # noqa: BLE001  (a config that does not compile: recorded, the sweep goes on)
                row["configs"].append({**config, "error": f"{type(e).__name__}: {str(e)[:160]}"})
    timed = [c for c in row["configs"] if "ms" in c]
    row["best"] = min(timed, key=lambda c: c["ms"]) if timed else None
    ruled = next((c for c in timed if all(c[key] == rule[key] for key in rule)), None)
    row["rule_ms"] = ruled and ruled["ms"]
    best = row["best"] or {}
    print(f"{label:8} m={m:2}  bnb {row['bitsandbytes_ms']} ms  op {row['op_ms']} ms  rule {row['rule_ms']} ms  "
          f"best {best.get('ms')} ms {({key: best.get(key) for key in rule})}  ({row['weight_mb']} MB)", flush=True)
    return row


def main() -> None:
    import nf4_decode  # tests/nf4_decode.py

    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--rows", type=int, nargs="+", default=[8, 32])
    args = p.parse_args()
    programs = nf4_decode.programs_wanted(0)
    result = {"gpu": torch.cuda.get_device_name(), "programs_wanted": programs, "rows": []}
    torch.manual_seed(0)
    for (label, (n, k)), m in itertools.product(SHAPES.items(), args.rows):
        result["rows"].append(measure_layer(label, n, k, m, programs))
        Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
