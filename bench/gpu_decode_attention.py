"""One decoding step's attention at an episode's long contexts (issue 32): what each layer's attention costs when a
row's static cache holds thousands of tokens (a 16-turn Crafter episode reaches ~7,500), against the time to read
that cache once at the measured copy bandwidth.

Per (shape, rows, cache length): the engine's attention (`vlrl.engine.attention.grouped_decode_attention`: SDPA with
the static cache's boolean mask, each key/value head read once), SDPA without a mask (flash; it would attend to the
padding and the empty slots, so a bound, not a candidate), and FlexAttention with the same mask as a `mask_mod`
(compiled once per process with room for every shape's graph, so that it never falls back to eager; at one query
position torch runs its split-KV decoding kernel). Each time is the median of 50 calls after warm-up, one layer's
call; the step's attention is that times the layers. Two timings a path: `*_ms`, one call as the host launches it
(s45's table; a compiled call's host work shows there while the GPU idles), and `*_graph_ms`, the call replayed from a
CUDA graph, as the engine's compiled decoding step runs it (issue 50 point 4: s45's FlexAttention column had hit
dynamo's recompile limit at the 8B shapes and ran eager, 5 ms a call).

    python bench/gpu_decode_attention.py --out $OUT/attention
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SHAPES = {"2b": (16, 8, 128, 28), "8b": (32, 8, 128, 36)}  # query heads, key/value heads, head dim, layers


def timed(fn, repeats: int = 50) -> float:
    import torch

    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def graphed(fn, calls: int = 1):
    """`fn` captured `calls` times in one CUDA graph: its replay, what the calls cost the GPU without their launches
    (as a compiled decoding step runs them)."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return graph.replay


_FLEX = []


def compiled_flex():
    """flex_attention compiled once for the process, with room for every shape this script times."""
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    if not _FLEX:
        for name in ("recompile_limit", "cache_size_limit"):
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, 256)
        _FLEX.append(torch.compile(flex_attention, dynamic=False))
    return _FLEX[0]


def _with_flex(rows, fn):
    """`fn()` (the engine's decoding attention, compiled) with vlrl.engine.attention.FLEX_ROWS covering `rows`."""
    from vlrl.engine import attention

    before, attention.FLEX_ROWS = attention.FLEX_ROWS, rows
    try:
        return fn()
    finally:
        attention.FLEX_ROWS = before


def row(shape: str, rows: int, length: int, bandwidth: float) -> dict:
    import torch
    from torch.nn.attention.flex_attention import create_block_mask

    from vlrl.engine.attention import grouped_decode_attention

    heads, kv_heads, dim, layers = SHAPES[shape]
    dev, dt = "cuda", torch.bfloat16
    q = torch.randn(rows, heads, 1, dim, device=dev, dtype=dt)
    k = torch.randn(rows, kv_heads, length, dim, device=dev, dtype=dt)
    v = torch.randn_like(k)
    filled = length - 600  # the newest token's slot: a context a bit short of the cache's length, left padding below
    valid = torch.zeros(rows, length, dtype=torch.bool, device=dev)
    for r in range(rows):
        valid[r, 100 * (r % 4):filled + 1] = True
    mask = valid[:, None, None, :]

    class Layer(torch.nn.Module):
        num_key_value_groups = heads // kv_heads

    layer = Layer()
    out = {"shape": shape, "rows": rows, "cache_length": length, "layers": layers,
           "kv_read_bound_ms": round(1000 * 2 * k.numel() * 2 / (bandwidth / 2), 4)}
    paths = {"engine": lambda: grouped_decode_attention(layer, q, k, v, mask, scaling=dim ** -0.5),
             "sdpa_no_mask": lambda: torch.nn.functional.scaled_dot_product_attention(
                 q, k, v, scale=dim ** -0.5, enable_gqa=True),
             # vlrl's own FlexAttention path (attention.FLEX_ROWS), compiled as the decoding step compiles it
             "engine_flex": functools.partial(_with_flex, rows, torch.compile(functools.partial(
                 grouped_decode_attention, layer, q, k, v, mask, scaling=dim ** -0.5), dynamic=False))}
    reference = paths["engine"]()[0]  # what the other paths' outputs are checked against
    try:
        block = create_block_mask(lambda b, h, qi, ki: valid[b, ki], B=rows, H=None, Q_LEN=1, KV_LEN=length,
                                  device=dev)
        flex = compiled_flex()
        paths["flex"] = lambda: flex(q, k, v, block_mask=block, enable_gqa=True, scale=dim ** -0.5)
        out["flex_max_abs_diff"] = float((paths["flex"]().transpose(1, 2) - reference).abs().max())
    except Exception as err:  # noqa: BLE001 - the other columns still count
        out["flex_error"] = f"{type(err).__name__}: {str(err)[:300]}"
    try:
        out["engine_flex_max_abs_diff"] = float((paths["engine_flex"]()[0] - reference).abs().max())
    except Exception as err:  # noqa: BLE001 - the other columns still count
        out["engine_flex_error"] = f"{type(err).__name__}: {str(err)[:300]}"
        paths.pop("engine_flex")
    for name, fn in paths.items():
        out[f"{name}_ms"] = round(timed(fn), 4)
        try:
            out[f"{name}_graph_ms"] = round(timed(graphed(fn)), 4)
        except Exception as err:  # noqa: BLE001 - the call's own timing still counts
            out[f"{name}_graph_error"] = f"{type(err).__name__}: {str(err)[:300]}"
        best = out.get(f"{name}_graph_ms", out[f"{name}_ms"])
        out[f"{name}_step_ms"] = round(best * layers, 2)  # the layers' attention in one decoding step
    return out


def main() -> None:
    import torch
    from gpu_gspo import copy_bandwidth

    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", "bench/results") + "/attention")
    p.add_argument("--shapes", nargs="+", default=["2b", "8b"])
    p.add_argument("--rows", type=int, nargs="+", default=[4, 8, 16])
    p.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096, 8192])
    args = p.parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    bandwidth = copy_bandwidth()
    table = []
    for shape in args.shapes:
        for rows in args.rows:
            for length in args.lengths:
                table.append(row(shape, rows, length, bandwidth))
                print("ATTENTION", json.dumps(table[-1]), flush=True)
    (Path(args.out) / "decode_attention.json").write_text(json.dumps(
        {"gpu": torch.cuda.get_device_name(), "copy_bandwidth": bandwidth, "rows": table}, indent=2))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
