"""`vlrl env play`: runs an environment without a model, so a person can look at it: a seeded random (or noop)
policy, every frame as a PNG, the steps as JSON lines, and a filmstrip of the episode.

    play("crafter", seed=3, policy="random", steps=20, output="play/crafter", options={"size": 128})
    # play/crafter/frame_000.png ... frame_020.png, episode.jsonl, metrics.json, filmstrip.png

`name` may be the URL of a `vlrl serve-env` server: the episode then runs there.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from vlrl.base.errors import ConfigError
from vlrl.grammar.answers import FORMAT

POLICIES = ("random", "noop")


def policy_reply(policy: str, actions, rng: random.Random) -> str:
    """The reply a model-free policy gives: one seeded random action, or `noop` (else the first action).

    >>> policy_reply("noop", ["noop", "left"], random.Random(0))
    '<SOLUTION>noop</SOLUTION>'
    """
    if policy == "random":
        return FORMAT.answer(rng.choice(list(actions)))
    return FORMAT.answer("noop" if "noop" in actions else actions[0])


def play(name: str, *, seed: int = 0, policy: str = "random", steps: int = 20, output: str | Path = "play",
         options: dict | None = None, log=None) -> dict:
    """Plays one episode of `name` (an environment name or a server URL) built with `options`, for at most `steps`
    turns, and writes what it saw under `output`.

    Args:
        seed: the episode's seed; it also seeds the random policy, so the same command gives the same files.
        policy: "random" (a random action each turn) or "noop".
        steps: the most turns to play (the episode may end sooner).
        output: the folder for frame_NNN.png, episode.jsonl (the reset, then one line a turn), metrics.json and
            filmstrip.png; earlier frames there are removed first.
        log: called with a line of progress (e.g. print).

    Returns:
        The episode's metrics.
    """
    from vlrl.envs import make
    from vlrl.envs.film import filmstrip

    if policy not in POLICIES:
        raise ConfigError(f"policy {policy!r} is not one of {', '.join(POLICIES)}.")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ConfigError(f"steps must be a whole number >= 0, got {steps!r}.")
    folder = Path(output)
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("frame_*.png"):
        old.unlink()
    env = make(name, **(options or {}))
    try:
        if not env.actions:
            raise ConfigError(f"environment {name!r} names no actions; a model-free policy needs some.")
        rng = random.Random(seed)
        frames, labels = [], []

        def keep(turn: int, observation, label: str) -> str | None:
            if observation.image is None:
                return None
            frames.append(observation.image)
            labels.append(f"t{turn} {label}")
            observation.image.save(folder / f"frame_{turn:03d}.png")
            return f"frame_{turn:03d}.png"

        observation = env.reset(seed)
        with open(folder / "episode.jsonl", "w") as out:
            out.write(json.dumps({"turn": 0, "reset": seed, "text": observation.text,
                                  "frame": keep(0, observation, "reset")}) + "\n")
            for turn in range(1, steps + 1):
                reply = policy_reply(policy, env.actions, rng)
                step = env.step(reply)
                frame = keep(turn, step.observation, ",".join(step.info.get("actions", [])) or "invalid")
                out.write(json.dumps({"turn": turn, "reply": reply, "reward": step.reward, "done": step.done,
                                      "info": step.info, "text": step.observation.text, "frame": frame},
                                     default=str) + "\n")
                if step.done:
                    break
        metrics = env.metrics()
    finally:
        env.close()
    (folder / "metrics.json").write_text(json.dumps(metrics, indent=2, default=str))
    if frames:
        filmstrip(frames, labels).save(folder / "filmstrip.png")
    if log:
        log(f"{name} seed {seed}, {policy} policy: {metrics.get('length', '?')} turns, return "
            f"{metrics.get('return', '?')}, success {metrics.get('success', '?')} -> {folder}/ "
            f"({len(frames)} frames, episode.jsonl, metrics.json{', filmstrip.png' if frames else ''})")
    return metrics
