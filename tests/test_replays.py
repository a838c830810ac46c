"""Replays are exact for every environment vlrl ships: the same seed and the same replies give the same episode,
frame for frame, over whole episodes of hundreds of steps; for Crafter also across processes (its creatures were
ordered by memory address, and a replay diverged in 5 of 8 episodes at steps 54-185 before vlrl ordered them)."""

import hashlib
import json
import random
import subprocess
import sys

import pytest

from vlrl.envs import make


def play(name: str, options: dict, seed: int, policy_seed: int, max_turns: int = 10_000) -> list[str]:
    """A whole episode of seeded random replies (4 actions a turn where the environment takes them): the digest of
    every frame, then the reward and end of every turn and the metrics."""
    env = make(name, **options)
    rng = random.Random(policy_seed)
    trace = [hashlib.sha1(env.reset(seed).image.tobytes()).hexdigest()]
    for _ in range(max_turns):
        reply = ", ".join(rng.choice(env.actions) for _ in range(env.max_actions))
        step = env.step(f"<SOLUTION>{reply}</SOLUTION>")
        trace.append(f"{hashlib.sha1(step.observation.image.tobytes()).hexdigest()} {step.reward} {step.done}")
        if step.done:
            break
    trace.append(json.dumps(env.metrics(), sort_keys=True, default=str))
    env.close()
    return trace


def test_grid_replays_whole_episodes():
    options = {"size": 12, "difficulty": 3, "max_turns": 300}
    for seed in range(3):
        first = play("grid", options, seed, seed)
        assert len(first) > 100 and first == play("grid", options, seed, seed)


def test_gymnasium_replays_whole_episodes():
    pytest.importorskip("gymnasium")
    for name, options in (("gymnasium:Taxi-v4", {"max_turns": 500}),  # 200 steps: Taxi's own time limit
                          ("gymnasium:FrozenLake-v1", {"map_name": "8x8", "is_slippery": True, "max_turns": 300})):
        traces = [play(name, options, seed, seed) for seed in range(2)]
        assert traces == [play(name, options, seed, seed) for seed in range(2)]
        if name == "gymnasium:Taxi-v4":
            assert len(traces[0]) == 202  # reset, 200 steps, metrics


CRAFTER = {"size": 64, "max_actions": 4, "max_turns": 2500}  # Crafter's own 64x64 world


def crafter_traces(seeds) -> dict:
    return {seed: play("crafter", CRAFTER, seed, seed) for seed in seeds}


@pytest.mark.slow
def test_crafter_replays_whole_episodes_in_this_and_another_process():
    pytest.importorskip("crafter")
    from vlrl.envs import crafter

    seeds = [0, 3, 5]
    crafter._fresh.clear()
    generated = crafter_traces(seeds)  # worlds generated from the seed
    copied = crafter_traces(seeds)     # the kept worlds, copied (new objects, new memory addresses)
    code = (f"import json, sys; sys.path[:0] = ['.', 'tests']; from test_replays import crafter_traces; "
            f"print(json.dumps(crafter_traces({seeds})))")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=True)
    elsewhere = {int(k): v for k, v in json.loads(other.stdout.splitlines()[-1]).items()}
    assert generated == copied == elsewhere
    steps = [json.loads(trace[-1])["steps"] for trace in generated.values()]
    assert sum(steps) >= 300 and max(steps) >= 150  # whole episodes: each played until the player died


def test_crafters_creatures_keep_one_order_through_a_copy():
    pytest.importorskip("crafter")
    import copy

    from vlrl.envs import crafter

    game, _ = crafter._fresh_world(1, 16, 64, 10000)
    chunks = game._world._chunks
    assert all(isinstance(objs, crafter.OrderedObjects) for objs in chunks.values())
    order = {key: [type(o).__name__ + str(o.pos.tolist()) for o in objs] for key, objs in chunks.items()}
    twin = copy.deepcopy(game, {id(game._textures): game._textures})
    assert {key: [type(o).__name__ + str(o.pos.tolist()) for o in objs]
            for key, objs in twin._world._chunks.items()} == order
