"""The decoding engine on the GPU, decode only (issue 32): first that its compiled path is transformers' own (the
warm-started tiny model decoded greedily by the engine and by `generate` with the same static cache and compiled
forward, token for token, and the host syncs one engine call makes), then the decode table at a real shape: ms per
decoding step and the share of the 4-bit bandwidth bound, for each path and rows decoded at once.

Paths: `generate` (transformers' `generate` as TRL calls it: eager, dynamic cache, sampling), `engine` (vlrl's engine,
compiled, static cache), `engine-FORMAT` (the same after `vlrl.engine.weights.pack_for_decoding(model, FORMAT)`),
`engine-FORMAT-layerwise` (that, with each LoRA layer computed on its own: `vlrl.engine.fusion` off).

    python bench/gpu_engine_decode.py --tiny $VLRL_CACHE/tiny-... --size 8b --paths generate engine engine-int8 \
        --rows 16 32 --completion 256 --out $OUT/decode
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpu_engine import say
from gpu_gspo import SHAPES, build_checkpoint, copy_bandwidth, weight_bytes


def contexts(processor, count: int, size: int):
    from vlrl.base import synthetic
    from vlrl.model import prompts

    rows = [prompts.to_prompt(i) for i in synthetic.generate(count, seed=7, image_size=size)]
    texts = [processor.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False) for r in rows]
    return texts, [[r["image"]] for r in rows]


def tiny_agreement(path: str) -> dict:
    """The engine's compiled greedy tokens against `generate`'s with the same static cache length and compiled
    forward; the host syncs of a warm engine call (torch's sync debug mode)."""
    import torch

    from vlrl import engine
    from vlrl.model.loading import load_model

    policy, processor = load_model(path, backend="transformers")
    policy = policy.to("cuda")
    texts, images = contexts(processor, 8, 64)
    decoding = engine.decoding_for(policy, processor, max_new_tokens=48, static=True)
    ours = [c.ids for c in engine.complete(policy, processor, texts, images, decoding)]
    processor.tokenizer.padding_side = "left"
    inputs = processor(text=texts, images=[i for g in images for i in g], return_tensors="pt", padding=True).to("cuda")
    length = engine.cache_length(inputs["input_ids"].shape[1], 48)
    with torch.no_grad():
        out = policy.generate(**inputs, max_new_tokens=48, do_sample=False, top_p=None, top_k=None,
                              eos_token_id=list(decoding.stop_ids), pad_token_id=decoding.pad_id,
                              suppress_tokens=list(decoding.suppress_ids), cache_implementation="static",
                              max_cache_len=length, disable_compile=False)
    theirs = []
    for row in out[:, inputs["input_ids"].shape[1]:].tolist():
        end = next((i for i, t in enumerate(row) if t in decoding.stop_ids), None)
        theirs.append(row if end is None else row[:end + 1])
    torch.cuda.set_sync_debug_mode("warn")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine.complete(policy, processor, texts, images, decoding)
    torch.cuda.set_sync_debug_mode(0)
    syncs = [str(w.message)[:120] for w in caught if "synchroniz" in str(w.message).lower()]
    return {"rows": len(ours), "identical_rows": sum(a == b for a, b in zip(ours, theirs)),
            "ours": ours[:2], "theirs": theirs[:2], "host_syncs_in_a_call": len(syncs), "sync_examples": syncs[:5]}


def profile_steps(once, steps: int) -> dict:
    """Where a decoding step's time goes (`torch.profiler` over one warm call of `steps` tokens, the measured shape):
    the GPU's kernel time against the wall time, kernels launched per step, the 25 kernels with the most GPU time, and
    the graph breaks dynamo counted in this process (a break splits the step's CUDA graph and brings back Python)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        once(steps)
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    gpu_us = sum(e.device_time for e in kernels)
    by_name: dict = {}
    for e in kernels:
        total, count = by_name.get(e.name, (0.0, 0))
        by_name[e.name] = (total + e.device_time, count + 1)
    top = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:25]
    from torch._dynamo.utils import counters

    return {**host_profile(once, steps), "steps": steps, "wall_ms": round(1000 * wall, 1), "kernel_ms": round(gpu_us / 1000, 1),
            "gpu_busy_share": round(gpu_us / 1000 / (1000 * wall), 3),
            "kernels_per_step": round(len(kernels) / steps, 1),
            "top_kernels_ms_per_step": [[name[:90], round(t / 1000 / steps, 3), c // steps] for name, (t, c) in top],
            "graph_breaks": dict(list(counters["graph_break"].items())[:20]),
            "graph_break_count": sum(counters["graph_break"].values())}


def host_profile(once, steps: int) -> dict:
    """Where the host's time goes in one more warm call (`cProfile`, which slows Python itself: read the shares, not
    the totals): the wall time without any profiler, then the 15 functions with the most time of their own, per step.
    Time spent waiting on the GPU shows in the call that syncs (`tolist`, `item`, `synchronize`)."""
    import cProfile
    import pstats

    import torch

    torch.cuda.synchronize()
    start = time.perf_counter()
    once(steps)
    torch.cuda.synchronize()
    plain = time.perf_counter() - start
    profiler = cProfile.Profile()
    profiler.enable()
    once(steps)
    torch.cuda.synchronize()
    profiler.disable()
    stats = pstats.Stats(profiler).stats  # {(file, line, function): (calls, primitive, own, cumulative, callers)}
    top = sorted(stats.items(), key=lambda kv: -kv[1][2])[:15]
    return {"plain_wall_ms_per_step": round(1000 * plain / steps, 2),
            "host_top_own_ms_per_step": [[f"{Path(f).name}:{line} {name}"[:80], round(1000 * own / steps, 3),
                                          calls // steps] for (f, line, name), (calls, _, own, _, _) in top]}


REPEATS = 3  # timed calls of each length; the fastest counts


def decode_row(policy, processor, path: str, rows: int, completion: int, bound_ms: float,
               profiled: bool = False) -> dict:
    import torch

    from vlrl import engine

    texts, images = contexts(processor, rows, 512)
    if path == "generate":
        processor.tokenizer.padding_side = "left"
        inputs = processor(text=texts, images=[i for g in images for i in g], return_tensors="pt",
                           padding=True).to("cuda")

        def once(n):
            with torch.no_grad():
                policy.generate(**inputs, max_new_tokens=n, min_new_tokens=n, do_sample=True, temperature=1.0,
                                top_p=None, top_k=None)
    else:
        decoding = engine.decoding_for(policy, processor, max_new_tokens=completion, temperature=1.0, static=True)

        def once(n):
            # no stop token: every row decodes n tokens, as the bound assumes
            d = replace(decoding, max_new_tokens=n, stop_ids=())
            engine.complete(policy, processor, texts, images, d)

    def timed(n):
        torch.cuda.synchronize()
        start = time.perf_counter()
        once(n)
        torch.cuda.synchronize()
        return time.perf_counter() - start

    warmup = timed(completion)  # compiles this shape (the cache length depends on the completion budget)
    prefill = min(timed(1) for _ in range(REPEATS))  # the fastest of a few: a call's host side varies by 10-30%
    torch.cuda.reset_peak_memory_stats()
    whole = min(timed(completion) for _ in range(REPEATS))
    step_ms = 1000 * (whole - prefill) / (completion - 1)
    extra = {"profile": profile_steps(once, completion)} if profiled else {}
    return {**extra, "path": path, "rows": rows, "completion": completion, "warmup_s": round(warmup, 1),
            "seconds": round(whole, 2), "prefill_s": round(prefill, 3), "step_ms": round(step_ms, 2),
            "tokens_per_s": round(rows * completion / whole, 1), "decode_bound_share": round(bound_ms / step_ms, 4),
            "peak_reserved_gib": round(torch.cuda.max_memory_reserved() / 2**30, 2)}


def main() -> None:
    import torch

    from vlrl.engine import fusion
    from vlrl.model.loading import LoraSettings, load_model

    p = argparse.ArgumentParser()
    p.add_argument("--tiny", help="a warm-started tiny model directory: the agreement check")
    p.add_argument("--size", default="8b", choices=SHAPES, help="a gpu_gspo.SHAPES shape: 2b .. 8b, qwen3.5-2b .. 9b")
    p.add_argument("--paths", nargs="*", default=["generate", "engine"])
    p.add_argument("--rows", type=int, nargs="+", default=[16, 32])
    p.add_argument("--completion", type=int, default=256)
    p.add_argument("--checkpoints", default="/tmp/vlrl-bench")
    p.add_argument("--checkpoint", help="a saved checkpoint instead of building one (bf16: it is loaded in 4-bit)")
    p.add_argument("--out", default=os.environ.get("OUT", "bench/results") + "/decode")
    p.add_argument("--profile", action="store_true", help="also profile one warm call of each row")
    args = p.parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    if args.tiny:
        agreement = tiny_agreement(args.tiny)
        print("AGREEMENT", json.dumps(agreement), flush=True)
        (Path(args.out) / "engine_agreement.json").write_text(json.dumps(agreement, indent=2))
    if not args.paths:
        return
    checkpoint = Path(args.checkpoint) if args.checkpoint else build_checkpoint(args.size, Path(args.checkpoints))
    bandwidth = copy_bandwidth()
    table = []
    for path in args.paths:
        try:
            policy, processor = load_model(str(checkpoint), load_in_4bit=True, max_seq_length=2048,
                                           lora=LoraSettings(r=16, alpha=16), backend="transformers")
            bound_ms = 1000 * weight_bytes(policy) / (bandwidth / 2)
            if path.startswith("engine-"):
                from vlrl.engine.weights import pack_for_decoding

                print("PACKED", json.dumps(pack_for_decoding(policy, path.split("-")[1]), default=str))
                fusion.ENABLED = not path.endswith("-layerwise")  # every LoRA layer on its own, as before fusion
            policy.eval()
            for rows in args.rows:
                row = decode_row(policy, processor, path, rows, args.completion, bound_ms, args.profile)
                groups = fusion.groups(policy.get_base_model())
                row.update(gpu=torch.cuda.get_device_name(), bound_ms=round(bound_ms, 3), size=args.size,
                           input_groups=len(groups), fused_bases=sum(g.base is not None for g in groups))
                table.append(row)
                say(f"DECODE {json.dumps(row)}")
            del policy
            torch.cuda.empty_cache()
        except Exception as err:  # noqa: BLE001 - one path failing must not cost the others' rows
            import traceback

            traceback.print_exc()
            print("FAILED", path, type(err).__name__, str(err)[:500], flush=True)
    (Path(args.out) / f"decode_{args.size}_{args.completion}.json").write_text(json.dumps(table, indent=2))


if __name__ == "__main__":
    main()
