"""Episode decoding, eager against compiled, in one process (issue 19's Crafter presets): the same Crafter episodes
played greedily by a preset's policy through `vlrl.episodes.rollout.play`, first with a dynamic KV cache and eager
decoding (`[training] fast_generation = false`), then twice with the bucketed static cache and compiled decoding
(the first pass compiles each bucket's graph, the second is warm). Each pass: wall time, seconds per turn, the
allocator's peak reserved memory, and whether its replies are the eager pass's token for token.

    python bench/gpu_episodes.py --preset qwen3-vl-2b-crafter --checkpoint /tmp/ckpt/qwen3-vl-2b-random \
        --turns 4 --out $OUT/episodes

Random weights write every reply to its limit (256 tokens at the presets' settings): the worst case per turn.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def timed_play(policy, processor, make_env, seeds, settings) -> tuple[dict, list]:
    import torch

    from vlrl.episodes.rollout import play, summary

    cuda = torch.cuda.is_available()  # on a CPU (a smoke run) both passes are eager
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    started = time.time()
    episodes = play(policy, processor, make_env, seeds, settings)
    if cuda:
        torch.cuda.synchronize()
    seconds = time.time() - started
    turns = max(len(e.turns) for e in episodes)
    return {"seconds": round(seconds, 1), "turns": turns, "seconds_per_turn": round(seconds / max(1, turns), 2),
            "reply_tokens": sum(len(ids) for e in episodes for ids in e.reply_ids),
            "peak_reserved_gib": round(torch.cuda.max_memory_reserved() / 2**30, 2) if cuda else None,
            "summary": summary(episodes)}, [e.reply_ids for e in episodes]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="qwen3-vl-2b-crafter")
    parser.add_argument("--checkpoint", required=True, help="a random-weight checkpoint of the preset's shape")
    parser.add_argument("--turns", type=int, default=4, help="turns per episode (the preset's 16 take minutes eager)")
    parser.add_argument("--episodes", type=int, default=0, help="episodes at once (default: the preset's eval batch)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)

    from vlrl import run as stages
    from vlrl.config import runfile as cfg
    from vlrl.episodes.rollout import environment_for as environment
    from vlrl.episodes.rollout import settings_for

    config = cfg.preset(args.preset, overrides=[f"model.name_or_path={args.checkpoint}"])
    policy, processor = stages.load_policy(config, print)
    settings = dataclasses.replace(settings_for(config, "eval"), max_turns=args.turns, temperature=0.0)  # greedy
    seeds = list(range(args.episodes or config.eval.batch_size))
    make_env = environment(config)
    result = {"preset": args.preset, "episodes": len(seeds), "turns": args.turns,
              "max_new_tokens": settings.max_new_tokens, "passes": {}}
    eager, reference = timed_play(policy, processor, make_env, seeds,
                                  dataclasses.replace(settings, fast_generation=False))
    result["passes"]["eager"] = eager
    print("eager", json.dumps(eager), flush=True)
    for name in ("compiled_first", "compiled_warm"):
        out, replies = timed_play(policy, processor, make_env, seeds,
                                  dataclasses.replace(settings, fast_generation=True))
        out["replies_equal_eager"] = sum(a == b for a, b in zip(replies, reference))
        result["passes"][name] = out
        print(name, json.dumps(out), flush=True)
    result["speedup_warm"] = round(eager["seconds"] / result["passes"]["compiled_warm"]["seconds"], 2)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"episodes_{args.preset}.json"
    path.write_text(json.dumps(result, indent=2))
    print("RESULT", path, "speedup", result["speedup_warm"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
