"""The training half of a GSPO step, pass by pass (issue 50 point 2): what one forward + backward over a micro-batch
costs as its rows grow, on the 8B 4-bit shape (random weights, one 512x512 picture an item), for the int8-packed base
vlrl trains on and the NF4 base plain TRL trains on.

Recorded GSPO steps say the update's time goes with the number of passes, not with their rows: at 256 tokens vlrl's
32 completions took 7.96 s in 8 passes of 4 and 3.87 s in 4 passes of 8 (engine_runs.json `gspo_step`). This script
times one pass (TRL's scoring forward: logits of the completion tokens, their log-softmax, then backward, with
gradient checkpointing on as TRL sets it) at 1, 2, 4 and 8 rows, fits seconds = fixed + per_row x rows, and profiles
one pass of 4 rows (the CUDA kernels and CPU ops that take the most time, the GPU's kernel time against the pass's wall
time, and the aten ops the host dispatched). The lead it tests: a pass costs about the same at 4 rows as at 8 because
the host dispatches its ops slower than an H200 runs them (the tiny model's 2-layer pass is ~5,600 aten ops at 4 rows;
the 8B's 36 layers and 27 vision blocks would be tens of thousands, at several microseconds each). It held (plan s53:
58,942 ops at 4 rows), and `--compiled both` times the same passes with the decoder layers eager and compiled as a
run compiles them (`vlrl.training.compiled_layers`; plan s54: 1.6-2.4x faster a pass).

    python bench/gpu_update.py --completion 256 --out $OUT/update     # one JSON per base: update_<base>_<tokens>.json
    python bench/gpu_update.py --completion 256 --bases int8 --compiled both --rows 1 4 8 16 --out $OUT/update
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_engine import dataset, load, say
from gpu_gspo import build_checkpoint

ROWS = (1, 2, 4, 8)


def batch(processor, rows: int, completion: int):
    """`rows` copies of one 512x512 picture's prompt with `completion` sampled-looking token ids after it."""
    import torch

    item = dataset(1)[0]
    text = processor.apply_chat_template(item["prompt"], add_generation_prompt=True, tokenize=False)
    inputs = processor(text=[text] * rows, images=[item["image"]] * rows, return_tensors="pt", padding=True)
    generator = torch.Generator().manual_seed(0)
    tail = torch.randint(1000, 100_000, (rows, completion), generator=generator)
    prompt = inputs["input_ids"].shape
    for key, value in list(inputs.items()):  # every per-token tensor grows by the completion: ids, mask, token types
        if value.shape == prompt:
            fill = tail if key == "input_ids" else torch.full_like(tail, int(key == "attention_mask"))
            inputs[key] = torch.cat([value, fill.to(value.dtype)], dim=1)
    return {k: v.to("cuda" if torch.cuda.is_available() else "cpu") for k, v in inputs.items()}


def one_pass(model, inputs: dict, completion: int) -> None:
    """TRL's scoring forward and the backward of a loss on its log-probs."""
    import torch

    logits = model(**inputs, logits_to_keep=completion + 1).logits[:, :-1].float()
    labels = inputs["input_ids"][:, -completion:]
    logps = torch.log_softmax(logits, dim=-1).gather(-1, labels[..., None]).squeeze(-1)
    (-logps.mean()).backward()


def measure(base: str, checkpoint: Path, completion: int, compiled: bool = False, rows_list=ROWS) -> dict:
    import torch

    torch.cuda.reset_peak_memory_stats()  # each mode's own peak (`--compiled both` measures two in one process)
    policy, processor, _, _ = load(checkpoint, "int8" if base == "int8" else None)
    policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    policy.enable_input_require_grads()
    policy.train()
    if compiled:  # as a run switches them ([training] compiled_layers); plan s54 timed each layer's own .compile()
        from vlrl.training.compiled_layers import compile_decoder_layers

        say(f"{base}: {compile_decoder_layers(policy)} decoder layers compiled")
    seconds = {}
    for rows in rows_list:
        inputs, times = batch(processor, rows, completion), []
        for _ in range(3):  # the first is a warm-up
            torch.cuda.synchronize()
            start = time.perf_counter()
            one_pass(policy, inputs, completion)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        seconds[rows] = min(times[1:])
        say(f"{base}: {rows} rows x {inputs['input_ids'].shape[1]} tokens: {seconds[rows]:.3f} s a pass")
    n, xs, ys = len(rows_list), list(rows_list), [seconds[r] for r in rows_list]
    slope = (n * sum(x * y for x, y in zip(xs, ys)) - sum(xs) * sum(ys)) / (n * sum(x * x for x in xs) - sum(xs) ** 2)
    fixed = (sum(ys) - slope * sum(xs)) / n
    inputs = batch(processor, 4, completion)
    start = time.perf_counter()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        one_pass(policy, inputs, completion)
        torch.cuda.synchronize()
    wall_ms = 1000 * (time.perf_counter() - start)
    table = prof.key_averages()
    top = lambda key, n=25: [{"name": e.key[:120], "ms": round(getattr(e, key) / 1000, 2), "calls": e.count}
                             for e in sorted(table, key=lambda e: -getattr(e, key))[:n]]
    # dispatch-bound or not: the pass's wall time (under the profiler) against the time the GPU spent in kernels,
    # and how many aten ops the host dispatched (the tiny model's 2-layer pass takes ~5,600 at 4 rows)
    busy_ms = sum(e.self_device_time_total for e in table) / 1000
    aten_calls = sum(e.count for e in table if e.key.startswith("aten::"))
    del policy
    torch.cuda.empty_cache()
    return {"base": base, "compiled_layers": compiled, "completion": completion, "prompt_and_completion_tokens": inputs["input_ids"].shape[1],
            "seconds_per_pass": seconds, "fixed_s": round(fixed, 3), "per_row_s": round(slope, 4),
            "profiled_pass": {"rows": 4, "wall_ms": round(wall_ms, 1), "gpu_kernels_ms": round(busy_ms, 1),
                              "aten_calls": aten_calls},
            "cuda_top": top("device_time_total"), "cpu_top": top("cpu_time_total"),
            "cuda_self_top": top("self_device_time_total", 40), "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
            "gpu": torch.cuda.get_device_name(), "torch": torch.__version__}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--completion", type=int, default=256)
    p.add_argument("--bases", nargs="+", default=["int8", "nf4"])
    p.add_argument("--checkpoints", default="/tmp/vlrl-bench")
    p.add_argument("--out", default="bench/results/update")
    p.add_argument("--rows", type=int, nargs="+", default=list(ROWS))
    p.add_argument("--compiled", choices=("no", "yes", "both"), default="no",
                   help="the language model's decoder layers compiled (yes), eager (no), or each in turn (both)")
    args = p.parse_args()
    checkpoint = build_checkpoint("8b", Path(args.checkpoints))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    modes = {"no": [False], "yes": [True], "both": [False, True]}[args.compiled]
    for base, compiled in itertools.product(args.bases, modes):
        result = measure(base, checkpoint, args.completion, compiled, tuple(args.rows))
        name = f"update_{base}{'_compiled' if compiled else ''}_{args.completion}.json"
        (Path(args.out) / name).write_text(json.dumps(result, indent=1))
        shown = {k: result[k] for k in ("seconds_per_pass", "fixed_s", "per_row_s", "profiled_pass", "peak_gib")}
        print("RESULT", base, "compiled" if compiled else "eager", json.dumps(shown), flush=True)


if __name__ == "__main__":
    main()
