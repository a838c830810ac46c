"""The cost of pass@k: `vlrl eval --samples 8` against greedy on the tiny preset's held-out items.

    VLRL_CACHE=/work/cache python bench/bench_passk.py               # greedy vs 8 draws per item, 2 repeats
    python bench/bench_passk.py --samples 8 --repeats 3

Same model (the warm-started tiny Qwen3-VL, LoRA-wrapped as `vlrl run` evaluates it), same 32 items, the preset's
max_new_tokens. Three settings, alternating within each repeat so a change in machine load hits all alike: greedy
at the preset's batch size (16 sequences per generate call), K draws per item at the same 16 sequences per call (the
same memory: 16 // K items per call), and K draws at 16 x K sequences per call (the same items per call). Writes
bench/results/passk.json and passk.md: seconds per setting, the ratio to greedy, and pass@1 / pass@K of the draws.
"""

from __future__ import annotations

import argparse
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
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--output", default=str(ROOT / "bench" / "results" / "passk"))
    args = parser.parse_args()

    import torch

    from vlrl import run
    from vlrl.config import runfile as config
    from vlrl.evaluation import evaluate, passk

    conf = config.preset("tiny")
    policy, processor = run.load_policy(conf, log=lambda *_: None)  # as `vlrl run` evaluates it
    rows = run.held_out(conf, processor)
    k, batch = args.samples, conf.eval.batch_size
    settings = {"greedy": {"samples": 0, "batch_size": batch},
                f"{k} draws, {batch} sequences per call": {"samples": k, "batch_size": batch},
                f"{k} draws, {batch * k} sequences per call": {"samples": k, "batch_size": batch * k}}
    runs, curves = [], {}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        evaluate.evaluate(policy, processor, rows.select(range(2)), Path(tmp) / "warmup.jsonl", batch_size=2,
                          max_new_tokens=conf.eval.max_new_tokens, progress=False)  # untimed warm-up
        for repeat in range(args.repeats):
            for name, s in settings.items():
                started = time.perf_counter()
                records = evaluate.evaluate(policy, processor, rows, Path(tmp) / f"{repeat}-{len(runs)}.jsonl",
                                            max_new_tokens=conf.eval.max_new_tokens, progress=False, **s)
                seconds = time.perf_counter() - started
                runs.append({"setting": name, "repeat": repeat, "seconds": round(seconds, 2)})
                if s["samples"]:
                    curves[name] = passk.pass_at_k_curve(records)["pass_at_k"]
                print(runs[-1], flush=True)
    median = {name: statistics.median(r["seconds"] for r in runs if r["setting"] == name) for name in settings}
    result = {
        "what": f"vlrl.evaluation.evaluate.evaluate: greedy vs {k} draws per item on the tiny preset's held-out items",
        "command": " ".join(["VLRL_CACHE=/work/cache python bench/bench_passk.py", *sys.argv[1:]]),
        "items": len(rows), "max_new_tokens": conf.eval.max_new_tokens, "repeats": args.repeats, "samples": k,
        "median_seconds": median, "ratio_to_greedy": {n: round(v / median["greedy"], 2) for n, v in median.items()},
        "pass_at_k": {n: [round(x, 3) for x in c] for n, c in curves.items()}, "runs": runs,
        "machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
                    "python": platform.python_version(),
                    "load_average_1_5_15_before": [round(x, 2) for x in load_before],
                    "load_average_1_5_15_after": [round(x, 2) for x in os.getloadavg()]},
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    write_results(result, args.output, markdown)


def markdown(r: dict) -> str:
    m = r["machine"]
    lines = [f"# The cost of pass@k: greedy vs {r['samples']} draws per item ({r['date']})", "", f"`{r['command']}`", "",
             (f"{r['what']}: {r['items']} items, max_new_tokens {r['max_new_tokens']}, {r['repeats']} repeats "
             f"(settings alternating), {m['torch_threads']} torch threads / {m['cpus']} CPUs (torch {m['torch']})."), "",
             "| setting | median seconds | x greedy | runs (s) | pass@1 .. pass@K of the draws |", "|---|---|---|---|---|"]
    for name, seconds in r["median_seconds"].items():
        per_run = ", ".join(str(x["seconds"]) for x in r["runs"] if x["setting"] == name)
        curve = ", ".join(f"{x:.2f}" for x in r["pass_at_k"].get(name, [])) or "-"
        lines.append(f"| {name} | {seconds} | {r['ratio_to_greedy'][name]}x | {per_run} | {curve} |")
    lines += ["", (f"Load average (1/5/15 min) before: {m['load_average_1_5_15_before']}, after: "
              f"{m['load_average_1_5_15_after']}. The CPU is shared, so absolute seconds move with the load; the "
              "ratios come from runs interleaved in one process."), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
