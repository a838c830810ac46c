"""The warm start of an episode run's local model: every turn of random-action episodes as a supervised item, so the
model learns to answer each observation with a well-formed action, and no more; or, for Crafter, every turn of the
scripted player's episodes (`player="scripted"`: `vlrl.envs.crafter_player`), so it learns a policy that can act.

With random actions the targets are drawn uniformly, so the warm-started policy acts validly but blindly: what it gains
in success afterwards is GSPO's. The scripted player's targets are its planned actions (wood, a table, a wood
pickaxe, water), with its own share of random ones: what the policy reaches beyond that is GSPO's. It starts from the
tiny preset's own warm start (`vlrl.training.warmstart.FORMAT_START`), which already writes the answer tags, so a few steps
teach the action names. The episodes come from their own seed range (`ENV_SEEDS["warm_start"]`), and each item is the
turn's context exactly as a rollout builds it (`vlrl.episodes.context`, the run's caps and image size).

    chosen = items(config.env, settings, n=256, seed=0)      # [{"prompt", "images", "target"}, ...]
    chosen = items(config.env, settings, n=2048, seed=0, player="scripted")   # Crafter's scripted player's turns
"""

from __future__ import annotations

import random

from vlrl.base.errors import DataError
from vlrl.config.sections import ENV_SEEDS
from vlrl.envs import env_options, make
from vlrl.episodes.context import assistant_message, cap_context, observation_message, opening, to_processor
from vlrl.grammar.answers import FORMAT

REASONING = "I act."  # short: fewer tokens for the warm start to teach


def items(env_config, settings, *, n: int, seed: int = 0, player: str = "random") -> list[dict]:
    """`n` warm-start items from episodes of the run's environment, played with random actions or a scripted player.

    Args:
        env_config: the run's `[env]` (`vlrl.config.sections.EnvConfig`).
        settings: the run's rollout `Settings` (turn cap, image caps, image size, text on or off).
        n: items wanted.
        seed: seeds the actions and the episodes' seeds.
        player: "random" (uniform actions) or "scripted" (Crafter's scripted player: `[model] warm_start_player`).
    """
    rng = random.Random(seed)
    if player == "scripted":
        from vlrl.envs.crafter_player import CrafterPlayer

        scripted = CrafterPlayer(seed=seed)

        def choose(env):
            return scripted.reply(env)
    else:
        def choose(env):
            return FORMAT.completion(REASONING, rng.choice(env.actions))
    out: list[dict] = []
    episode = 0
    while len(out) < n:
        env_seed = ENV_SEEDS["warm_start"] + seed * 10_000 + episode
        episode += 1
        env = make(env_config.name, **env_options(env_config))
        try:
            out += _episode_items(env, env_seed, settings, choose)
        except Exception as err:  # noqa: BLE001 - the warm start needs its environment: say which step failed and why
            raise DataError(f"warm start: environment {env_config.name!r} raised on seed {env_seed}: "
                            f"{type(err).__name__}: {err}") from None
        finally:
            env.close()
        if episode > 10 * n:
            raise DataError(f"warm start: {episode} episodes of {env_config.name!r} gave only {len(out)} turns.")
    return out[:n]


def _episode_items(env, env_seed: int, settings, choose) -> list[dict]:
    messages, _ = opening(env.describe(), env.reset(env_seed), settings)
    found = []
    for _ in range(settings.max_turns):
        context, _ = cap_context(messages, max_images=settings.max_images_in_context, step=settings.image_drop_step)
        prompt, images = to_processor(context)
        reply = choose(env)
        found.append({"prompt": prompt, "images": images, "target": reply})
        step = env.step(reply)
        messages.append(assistant_message(reply))
        if step.done:
            break
        messages.append(observation_message(step.observation, settings)[0])
    return found
