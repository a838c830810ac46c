"""The scripted Crafter player (vlrl.envs.crafter_player) and uniformly random actions, each on the held-out worlds
of bench/learning/crafter-learns.toml at its settings (a 32x32 world, 64 px, turns of 4 actions, 10 turns), scored
as the Crafter paper scores it (vlrl.envs.achievements): the teacher of that run's warm start, and the floor.

    python bench/crafter_player.py --worlds 64          # -> bench/results/crafter_player.{json,md}

Worlds 0..N-1 (the run's eval seeds); the player's noise and the random actions are seeded, so a rerun gives the same
numbers.
"""

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from results_io import write_results

from vlrl.envs.achievements import ACHIEVEMENTS, crafter_report
from vlrl.envs.crafter import ACTIONS, CrafterEnv
from vlrl.envs.crafter_player import CrafterPlayer
from vlrl.grammar.answers import FORMAT

SETTINGS = {"size": 64, "area": 32, "max_actions": 4, "max_turns": 10}  # crafter-learns.toml's [env]
NOISE = 0.2  # vlrl.envs.crafter_player's default: the warm start's teacher as the run uses it


def play(seed: int, choose) -> list[str]:
    env = CrafterEnv(**SETTINGS)
    env.reset(seed)
    while not env.step(choose(env)).done:
        pass
    return env.metrics()["achievements"]


def markdown(result: dict) -> str:
    lines = ["# The scripted Crafter player and random actions on crafter-learns' held-out worlds", "",
             f"`{result['command']}`: worlds 0..{result['worlds'] - 1}, {result['settings']}, {result['seconds']:.0f} s.",
             "", "| | Crafter score % (95% bootstrap) | achievements per episode |", "|---|---|---|"]
    for name in ("scripted", "scripted_no_noise", "random"):
        r = result[name]
        lines.append(f"| {name.replace('_', ' ')} | {r['score']:.2f} [{r['score_ci95'][0]:.2f}, {r['score_ci95'][1]:.2f}] "
                     f"| {r['achievements_per_episode']:.2f} |")
    lines += ["", "| achievement | scripted % | scripted, no noise % | random % |", "|---|---|---|---|"]
    for name in ACHIEVEMENTS:
        cells = [f"{result[k]['rates'][name]:.1f} [{result[k]['rates_ci95'][name][0]:.1f}, "
                 f"{result[k]['rates_ci95'][name][1]:.1f}]" for k in ("scripted", "scripted_no_noise", "random")]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", type=int, default=64)
    parser.add_argument("--output", default=str(Path(__file__).parent / "results" / "crafter_player"))
    args = parser.parse_args()
    started = time.time()
    rng = random.Random(0)
    players = {"scripted": CrafterPlayer(noise=NOISE, seed=0).reply,
               "scripted_no_noise": CrafterPlayer(noise=0.0, seed=0).reply,
               "random": lambda env: FORMAT.completion("I act.", ", ".join(rng.choice(ACTIONS) for _ in range(4)))}
    result = {"command": f"python bench/crafter_player.py --worlds {args.worlds}", "worlds": args.worlds,
              "settings": ", ".join(f"{k}={v}" for k, v in SETTINGS.items()), "noise": NOISE}
    for name, choose in players.items():
        episodes = [play(seed, choose) for seed in range(args.worlds)]
        report = crafter_report(episodes)
        report["achievements_per_episode"] = sum(map(len, episodes)) / len(episodes)
        result[name] = {**report, "per_episode": episodes}
        print(f"{name}: score {report['score']:.2f}%, {report['achievements_per_episode']:.2f} per episode", flush=True)
    result["seconds"] = time.time() - started
    write_results(result, args.output, markdown)


if __name__ == "__main__":
    main()
