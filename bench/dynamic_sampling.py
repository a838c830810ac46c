"""What dynamic sampling changes on the tiny model: grid-tiny with a success-only reward (shaping off, so a group of
8 episodes of one seed is often all failures, a flat group), trained with and without `[training]
dynamic_sampling`, the same steps and seeds, then the same 48 held-out episodes after. Reports held-out success
before and after, the share of flat groups each step drew first and what trained, and the reply tokens generated
(redraws included): accuracy at the same number of steps, and at what cost in generated tokens.

    VLRL_CACHE=.cache/vlrl python bench/dynamic_sampling.py --output bench/results/dynamic_sampling [--draws 2]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_io import write_results

OVERRIDES = ["env.options={size=3, difficulty=1, max_turns=6, shaping=false}"]


def one_run(draws: int, root: Path) -> dict:
    run_dir = root / f"draws-{draws}"
    started = time.time()
    command = [sys.executable, "-m", "vlrl", "run", "--preset", "grid-tiny", "--run-dir", str(run_dir)]
    for override in (*OVERRIDES, f"training.dynamic_sampling={draws}"):
        command += ["--set", override]
    done = subprocess.run(command, check=False, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    rows = [r for r in map(json.loads, (run_dir / "train_log.jsonl").read_text().splitlines()) if "reward" in r]
    comparison = json.loads((run_dir / "comparison.json").read_text())
    return {"dynamic_sampling": draws, "seconds": round(time.time() - started, 1),
            "success_before": comparison["success_before"], "success_after": comparison["success_after"],
            "mcnemar_p": comparison.get("mcnemar_p"),
            "flat_first_draw": [r["frac_reward_zero_std"] for r in rows],
            "flat_trained": [r.get("dynamic_sampling/frac_zero_std_after", r["frac_reward_zero_std"]) for r in rows],
            "extra_groups": sum(r.get("dynamic_sampling/extra_groups", 0) for r in rows),
            "generated_tokens": sum(r["episodes/generated_tokens"] for r in rows),
            "train_success_per_step": [round(r["rewards/success/mean"], 3) for r in rows]}


def markdown(result: dict) -> str:
    lines = [f"# Dynamic sampling on grid-tiny, success-only reward\n\n`{result['command']}`; {result['machine']}\n",
             ("| dynamic_sampling | held-out success before -> after (48 seeds) | McNemar p | flat groups (first "
              "draw) | flat groups trained | extra groups drawn | reply tokens generated | wall s |"),
             "|---|---|---|---|---|---|---|---|"]
    for r in result["runs"]:
        lines.append(f"| {r['dynamic_sampling']} | {r['success_before']:.3f} -> {r['success_after']:.3f} | "
                     f"{r['mcnemar_p']} | {sum(r['flat_first_draw']) / len(r['flat_first_draw']):.2f} | "
                     f"{sum(r['flat_trained']) / len(r['flat_trained']):.2f} | {r['extra_groups']:.0f} | "
                     f"{r['generated_tokens']:.0f} | {r['seconds']} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="bench/results/dynamic_sampling")
    parser.add_argument("--draws", type=int, default=2)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        runs = [one_run(draws, Path(tmp)) for draws in (0, args.draws)]
    load = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else []
    result = {"command": f"python bench/dynamic_sampling.py --draws {args.draws}", "overrides": OVERRIDES,
              "machine": f"CPU, load average {' '.join(load)} at the end", "runs": runs}
    write_results(result, args.output, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
