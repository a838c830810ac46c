"""The random agent of the Crafter paper, played through vlrl's Crafter wrapper at Crafter's own settings (a 64x64
world, 64 px frames, episodes of up to 10,000 steps, one uniformly random action of the 17 a step), scored as the
paper scores it: per-achievement success rates and the Crafter score with 95% intervals (vlrl.envs.achievements).
The paper's random agent scores 1.6%; matching it says the wrapper plays Crafter's game, not another.

    python bench/crafter_random.py --episodes 100          # -> bench/results/crafter_random.{json,md}

Seeds 0..N-1; the policy's draws are seeded per episode, so a rerun gives the same numbers.
"""

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from results_io import write_results

from vlrl.envs import make
from vlrl.envs.achievements import ACHIEVEMENTS, PAPER_RANDOM_SCORE, crafter_report
from vlrl.envs.crafter import ACTIONS, SETTINGS


def play_random(seed: int) -> dict:
    """One episode of uniformly random actions; its achievements, length in steps and how it ended."""
    env = make("crafter", **SETTINGS, text=False)
    rng = random.Random(seed)
    env.reset(seed)
    while True:
        step = env.step(f"<SOLUTION>{rng.choice(ACTIONS)}</SOLUTION>")
        if step.done:
            metrics = env.metrics()
            return {"seed": seed, "achievements": metrics["achievements"], "steps": metrics["steps"],
                    "ended": step.info["ended"]}


def markdown(result: dict) -> str:
    low, high = result["score_ci95"]
    lines = ["# Crafter's random agent through vlrl's wrapper", "",
             (f"`{result['command']}`: {result['episodes']} episodes at Crafter's settings ({result['settings']}), "
              f"{result['seconds']:.0f} s."), "",
             (f"**Crafter score {result['score']:.2f}% [{low:.2f}, {high:.2f}]** (95% bootstrap over episodes); the "
              f"paper's random agent: {PAPER_RANDOM_SCORE}%. Mean episode length {result['mean_steps']:.0f} steps "
              f"({result['ended']})."), "", "| achievement | success rate % | 95% Wilson |", "|---|---|---|"]
    for name in ACHIEVEMENTS:
        r_low, r_high = result["rates_ci95"][name]
        lines.append(f"| {name} | {result['rates'][name]:.1f} | [{r_low:.1f}, {r_high:.1f}] |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=100)
    parser.add_argument("--output", default=str(Path(__file__).parent / "results" / "crafter_random"))
    args = parser.parse_args()
    started = time.time()
    episodes = []
    for seed in range(args.episodes):
        episodes.append(play_random(seed))
        print(f"seed {seed}: {episodes[-1]['steps']} steps, {len(episodes[-1]['achievements'])} achievements",
              flush=True)
    report = crafter_report([e["achievements"] for e in episodes])
    ended = {}
    for e in episodes:
        ended[e["ended"]] = ended.get(e["ended"], 0) + 1
    result = {**report, "command": f"python bench/crafter_random.py --episodes {args.episodes}",
              "settings": ", ".join(f"{k}={v}" for k, v in SETTINGS.items()),
              "seconds": time.time() - started, "mean_steps": sum(e["steps"] for e in episodes) / len(episodes),
              "ended": ", ".join(f"{v} {k}" for k, v in sorted(ended.items())),
              "paper_random_score": PAPER_RANDOM_SCORE, "per_episode": episodes}
    write_results(result, args.output, markdown)


if __name__ == "__main__":
    main()
