"""Eval throughput, batched vs one item at a time: `vlrl.evaluation.evaluate.evaluate` on the tiny preset's held-out items.

    VLRL_CACHE=/work/cache python bench/bench_eval.py                # batch 16 vs 1, 3 repeats, 32 items
    python bench/bench_eval.py --batch-sizes 16 4 1 --repeats 2

Same model (the warm-started tiny Qwen3-VL, LoRA-wrapped as `vlrl run` evaluates it), same items, greedy, the
preset's max_new_tokens. Runs alternate between batch sizes so a change in machine load hits all of them alike.
Writes bench/results/eval.json and eval.md: items/s per run, the median, the batched/unbatched ratio, and whether
the batched completions equal the one-at-a-time ones (left padding must not change greedy outputs).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from results_io import write_results  # bench/ is on sys.path when run as a script

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[16, 1])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--items", type=int, default=None, help="default: the tiny preset's hold_out (32)")
    parser.add_argument("--output", default=str(ROOT / "bench" / "results" / "eval"))
    args = parser.parse_args()

    import torch

    from vlrl import data, run
    from vlrl.config import runfile as config
    from vlrl.evaluation import evaluate
    from vlrl.model import prompts

    conf = config.preset("tiny")
    policy, processor = run.load_policy(conf, log=lambda *_: None)  # as `vlrl run` evaluates it
    _, held_out = data.split_holdout(data.load_rows(conf.data), conf.data.hold_out, seed=conf.data.seed)
    rows = prompts.to_dataset(held_out[: args.items] if args.items else held_out)
    max_new_tokens = conf.eval.max_new_tokens

    runs, completions = [], {}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        # one untimed warm-up pass (first-call allocations, lazy imports)
        evaluate.evaluate(policy, processor, rows.select(range(2)), Path(tmp) / "warmup.jsonl", batch_size=2,
                          max_new_tokens=max_new_tokens, progress=False)
        for repeat in range(args.repeats):
            for batch_size in args.batch_sizes:
                out = Path(tmp) / f"b{batch_size}-r{repeat}.jsonl"
                started = time.perf_counter()
                records = evaluate.evaluate(policy, processor, rows, out, batch_size=batch_size,
                                            max_new_tokens=max_new_tokens, progress=False)
                seconds = time.perf_counter() - started
                tokens = sum(r["completion_tokens"] for r in records)
                runs.append({"batch_size": batch_size, "repeat": repeat, "seconds": round(seconds, 3),
                             "items_per_s": round(len(records) / seconds, 3),
                             "completion_tokens_per_s": round(tokens / seconds, 1)})
                completions.setdefault(batch_size, [r["completion"] for r in records])
                print(json.dumps(runs[-1]), flush=True)
    load_after = os.getloadavg()

    median = {b: statistics.median(r["items_per_s"] for r in runs if r["batch_size"] == b) for b in args.batch_sizes}
    unbatched = min(args.batch_sizes)
    reference = completions[unbatched]
    result = {
        "what": "vlrl.evaluation.evaluate.evaluate throughput on the tiny preset's held-out items (greedy)",
        "command": " ".join(["VLRL_CACHE=/work/cache python bench/bench_eval.py", *sys.argv[1:]]),
        "items": len(rows), "max_new_tokens": max_new_tokens, "repeats": args.repeats,
        "median_items_per_s": {str(b): round(v, 3) for b, v in median.items()},
        "speedup_vs_batch_1": {str(b): round(v / median[unbatched], 2) for b, v in median.items()},
        "same_completions_as_batch_1": {str(b): sum(a == c for a, c in zip(completions[b], reference))
                                        for b in args.batch_sizes},
        "speedup_per_repeat": per_repeat_speedups(runs),
        "runs": runs,
        "machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
                    "python": platform.python_version(), "device": str(next(policy.parameters()).device),
                    "load_average_1_5_15_before": [round(x, 2) for x in load_before],
                    "load_average_1_5_15_after": [round(x, 2) for x in load_after]},
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    write_results(result, args.output, markdown)


def per_repeat_speedups(runs: list[dict]) -> dict[str, list[float]]:
    """items/s of each batch size over batch 1's in the same repeat (adjacent runs: the least load drift)."""
    unbatched = min(r["batch_size"] for r in runs)
    base = {r["repeat"]: r["items_per_s"] for r in runs if r["batch_size"] == unbatched}
    out: dict[str, list[float]] = {}
    for r in runs:
        out.setdefault(str(r["batch_size"]), []).append(round(r["items_per_s"] / base[r["repeat"]], 2))
    return out


def markdown(r: dict) -> str:
    m = r["machine"]
    setup = (f"{r['what']}: {r['items']} items, max_new_tokens {r['max_new_tokens']}, {r['repeats']} repeats per "
             f"batch size (alternating), on {m['device']} with {m['torch_threads']} torch threads / {m['cpus']} CPUs "
             f"(torch {m['torch']}).")
    header = ("| batch size | median items/s | speed-up vs batch 1 (medians) | per repeat | completions equal to "
              "batch 1 | runs (items/s) |")
    lines = [f"# Eval throughput: batched vs one item at a time ({r['date']})", "", f"`{r['command']}`", "", setup, "",
             header, "|---|---|---|---|---|---|"]
    for b, v in r["median_items_per_s"].items():
        per_run = ", ".join(str(x["items_per_s"]) for x in r["runs"] if str(x["batch_size"]) == b)
        per_repeat = ", ".join(f"{x}x" for x in r["speedup_per_repeat"][b])
        lines.append(f"| {b} | {v} | {r['speedup_vs_batch_1'][b]}x | {per_repeat} | "
                     f"{r['same_completions_as_batch_1'][b]}/{r['items']} | {per_run} |")
    noise = (f"Load average (1/5/15 min) before: {m['load_average_1_5_15_before']}, after: "
             f"{m['load_average_1_5_15_after']}. The CPU is shared with other jobs, so absolute numbers move with "
             "the load; the ratio, from runs interleaved in one process, is the number to read.")
    return "\n".join([*lines, "", noise, ""])

if __name__ == "__main__":
    main()
