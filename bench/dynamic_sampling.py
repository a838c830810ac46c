"""What dynamic sampling changes on the tiny model, where flat groups are common but not universal: grid-tiny on a 2x2
grid in 2 turns with a success-only reward (shaping off), so an episode succeeds only by playing `right, down` or
`down, right` (1 in 8 for random actions) and a group of 8 episodes of one seed (one group a step) is often all
failures. Three runs from the same warm start, seeds and 48 held-out episodes:

- `off`: `dynamic_sampling = 0`, `--steps` steps;
- `on`: `dynamic_sampling = --draws`, the same steps;
- `off, same tokens`: `dynamic_sampling = 0` given as many steps as it takes to generate about the reply tokens `on`
  generated (redraws included), so the two compare at the same generation cost (skipped when `on` drew nothing).

Reports held-out success before -> after for each (McNemar on the run's own 48 paired episodes), `on` against each
`off` run after training (paired by seed), the share of flat groups each step drew first and what trained, groups
drawn again, reply tokens generated, wall seconds and CPU seconds (user + sys of the run: on a shared machine the
load moves wall time by several times, CPU time much less).

    VLRL_CACHE=.cache/vlrl python bench/dynamic_sampling.py --output bench/results/dynamic_sampling [--draws 2]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_io import pack, write_results

# 2 moves to the goal and 2 turns to make them: the warm-started policy succeeds in ~6-12% of episodes, so a group of
# 8 is all failures about half the time (0.9^8 = 0.43) and, as training raises success, all successes now and then
SETTING = ["env.options={size=2, difficulty=1, max_turns=2, shaping=false}", "env.max_turns=2"]


def one_run(name: str, root: Path, steps: int, draws: int) -> dict:
    """`vlrl run --preset grid-tiny` with SETTING, `steps` GSPO steps and `draws` redraws; its numbers."""
    run_dir = root / name.replace(" ", "-").replace(",", "")
    command = [sys.executable, "-m", "vlrl", "run", "--preset", "grid-tiny", "--run-dir", str(run_dir)]
    for override in (*SETTING, f"training.max_steps={steps}", f"training.dynamic_sampling={draws}"):
        command += ["--set", override]
    started, cpu = time.time(), _children_cpu()
    done = subprocess.run(command, check=False, capture_output=True, text=True)
    cpu = _children_cpu() - cpu  # the shared machine's load moves wall time; the run's own CPU time much less
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    rows = [r for r in map(json.loads, (run_dir / "train_log.jsonl").read_text().splitlines()) if "reward" in r]
    comparison = json.loads((run_dir / "comparison.json").read_text())
    return {"name": name, "dynamic_sampling": draws, "steps": steps, "run_dir": str(run_dir),
            "seconds": round(time.time() - started, 1), "cpu_seconds": round(cpu, 1),
            "train_seconds": round(sum(r["step_time"] for r in rows), 1),
            "success_before": comparison["success_before"], "success_after": comparison["success_after"],
            "mcnemar_p": comparison["mcnemar_p"],
            "flat_first_draw": [r["frac_reward_zero_std"] for r in rows],
            # off, what trains is the first draw
            "flat_trained": [r.get("dynamic_sampling/frac_zero_std_after", r["frac_reward_zero_std"]) for r in rows],
            "extra_groups": [r.get("dynamic_sampling/extra_groups", 0.0) for r in rows],
            "generated_tokens": [r["episodes/generated_tokens"] for r in rows],
            "train_success": [round(r["rewards/success/mean"], 3) for r in rows]}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def after_vs(run: dict, other: dict) -> dict:
    """`run`'s held-out episodes after training against `other`'s, paired by seed (the same 48 worlds)."""
    from vlrl.evaluation import compare  # single-turn and episode records alike

    c = compare.compare(Path(other["run_dir"]) / "eval_after.jsonl", Path(run["run_dir"]) / "eval_after.jsonl")
    return {"against": other["name"], "success": [c["success_before"], c["success_after"]],
            "table": c["table"], "mcnemar_p": c["mcnemar_p"]}


def keep_logs(runs: list[dict], output: Path) -> None:
    """Each run's config.toml, train_log.jsonl and comparison.json packed as OUTPUT/<run>.json (a few kB each)."""
    for r in runs:
        kept = output / f"{Path(r['run_dir']).name}.json"
        kept.parent.mkdir(parents=True, exist_ok=True)
        pack(r["run_dir"], kept)
        r["run_dir"] = str(kept)


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


HEADER = ("| run | steps | held-out success before -> after (48 paired episodes) | McNemar p | flat groups, first draw "
          "(mean) | flat groups trained (mean) | groups drawn again | reply tokens generated | wall s (train s) | CPU s |\n"
          "|---|---|---|---|---|---|---|---|---|---|")


def markdown(result: dict) -> str:
    setting = "`, `".join(result["setting"])
    where = (f"{result['machine']}; {result['wall_seconds'] / 60:.1f} min wall in all. Settings: `{setting}` on the "
             "grid-tiny preset (1 group of 8 episodes a step).\n")
    lines = ["# Dynamic sampling on grid-tiny: 2x2 grid, 2 turns, success-only reward\n",
             f"    {result['command']}\n", where, HEADER]
    for r in result["runs"]:
        lines.append(f"| {r['name']} | {r['steps']} | {r['success_before']:.3f} -> {r['success_after']:.3f} | "
                     f"{r['mcnemar_p']:.3g} | {mean(r['flat_first_draw']):.2f} | {mean(r['flat_trained']):.2f} | "
                     f"{sum(r['extra_groups']):.0f} | {sum(r['generated_tokens']):.0f} | "
                     f"{r['seconds']:.0f} ({r['train_seconds']:.0f}) | {r['cpu_seconds']:.0f} |")
    lines += ["", "`on` against each `off` run after training, paired by seed:", "",
              "| against | success: that run -> on | McNemar p |", "|---|---|---|"]
    for c in result["on_vs_off"]:
        lines.append(f"| {c['against']} | {c['success'][0]:.3f} -> {c['success'][1]:.3f} | {c['mcnemar_p']:.3g} |")
    lines += ["", "Per step (flat: 1 = the step's one group had all-equal returns):", ""]
    for r in result["runs"]:
        per_step = {"flat first draw": r["flat_first_draw"], "flat trained": r["flat_trained"],
                    "drawn again": r["extra_groups"], "reply tokens": r["generated_tokens"]}
        described = ", ".join(f"{k} {[round(x) for x in v]}" for k, v in per_step.items())
        lines.append(f"- {r['name']}: {described}, training success {r['train_success']}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="bench/results/dynamic_sampling")
    parser.add_argument("--draws", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args(argv)
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        off = one_run("off", Path(tmp), args.steps, 0)
        on = one_run("on", Path(tmp), args.steps, args.draws)
        runs = [off, on]
        # as many steps as `off` needs, at its own tokens a step, to generate what `on` generated
        matched = round(sum(on["generated_tokens"]) / mean(off["generated_tokens"]))
        if matched > args.steps:
            runs.append(one_run("off, same tokens", Path(tmp), matched, 0))
        on_vs_off = [after_vs(on, r) for r in runs if r is not on]
        keep_logs(runs, Path(args.output))
    load = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else []
    result = {"command": f"VLRL_CACHE=.cache/vlrl python bench/dynamic_sampling.py --draws {args.draws} "
                         f"--steps {args.steps}",
              "setting": SETTING, "machine": f"CPU ({os.cpu_count()} cores), load average {' '.join(load)} at the end",
              "wall_seconds": round(time.time() - started), "runs": runs, "on_vs_off": on_vs_off}
    write_results(result, args.output, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
