"""The warm start, decided in one place: which items it trains on, the cached warm-started local models (`tiny`,
`tiny-small`, `tiny-qwen3.5`, `tiny-qwen3.5-moe`), the checkpoint a run loads, and `vlrl sft` for any other 16-bit model.

One item policy serves every path, so a warm start never trains on what the run evaluates:
- a run on a local model warm-starts it on generated items of the run's own tasks, difficulty and image size (or
  those `[model] warm_start_tasks` and `warm_start_difficulty` name: a curriculum), drawn from other seeds than the
  run's (`seed + 10,000`); easy charts can still repeat a picture, so the held-out split
  leaves out every item that shows a warm-start picture (`held_out_exclusions`);
- `vlrl sft` draws the same items (for generated data) or the training part of the run's split (for a data set),
  minus any item that shows a held-out picture, since the later run only knows the checkpoint's path.

    >>> from vlrl import config
    >>> settings(config.preset("tiny"))["items"]
    512
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

from vlrl import data
from vlrl.base import cache, synthetic
from vlrl.base.errors import ConfigError
from vlrl.base.images import image_hash
from vlrl.config.runfile import LOCAL_FAMILIES, LOCAL_MODELS, RunConfig
from vlrl.model import prompts, tiny
from vlrl.training import sft

DEFAULT_ITEMS = {"tiny": 512, "small": 4096}  # generated items per warm start when [model] warm_start_items = 0
DEFAULT_STEPS = 150  # `vlrl sft` steps when neither --steps nor [model] warm_start_steps says
WARM_LR = {"tiny": 3e-3, "small": 1e-3}  # full fine-tuning of a random model: large steps; the wider model, smaller
FORMAT_START = {"warm_start_steps": 150, "warm_start_items": 512, "image_size": 64}  # the tiny preset's warm start
EPISODE_BATCH = 8  # turns per warm-start step of an episode run: its contexts are several observations long
# An episode run's warm start continues from FORMAT_START, which already writes the tags, so larger steps are safe and
# fewer are needed: on grid-tiny's turns, 60 steps at 6e-3 end at the loss floor (0.07) with 2 of 32 sampled replies
# invalid; at 3e-3, 50 steps left every reply invalid and 120 were needed (measured).
# The wider small model takes smaller steps, as its single-turn warm start does (WARM_LR); 2e-3 keeps the tiny's
# ratio of episode to single-turn rate (6e-3 : 3e-3), not measured on the small model's own turns
EPISODE_WARM_LR = {"tiny": 6e-3, "small": 2e-3}
# [env] fields the random-action turns do not depend on: a run with more eval seeds reuses the cached warm start
EPISODE_KEY_IGNORES = ("train_seeds", "eval_seeds", "eval_temperature", "updates_per_rollout")
SEED_OFFSET = 10_000  # warm-start items come from other seeds than the run's own items


def settings(config: RunConfig) -> dict:
    """The warm start a configuration asks for: model size, seed, steps, items and what they are drawn from."""
    m, d = config.model, config.data
    size = LOCAL_MODELS.get(m.name_or_path, "tiny")
    return {"size": size, "family": LOCAL_FAMILIES.get(m.name_or_path, "qwen3_vl"), "seed": d.seed,
            "steps": m.warm_start_steps,
            "items": m.warm_start_items or DEFAULT_ITEMS[size], "image_size": d.image_size,
            "difficulty": m.warm_start_difficulty or d.difficulty,
            "tasks": tuple(m.warm_start_tasks or d.tasks or synthetic.TASKS), "player": m.warm_start_player}


def generated_items(seed: int, n: int, image_size: int, difficulty: int = 1, tasks=None) -> list[dict]:
    """The generated items a warm start trains on: `n` items of the run's tasks from seeds disjoint from its own."""
    return synthetic.generate(n, seed=seed + SEED_OFFSET, image_size=image_size, difficulty=difficulty,
                              tasks=tasks or synthetic.TASKS)


def items(config: RunConfig, *, exclude_held_out: bool = False) -> list[dict]:
    """The warm start's items for a run (see the module docstring). With `exclude_held_out`, items showing a
    picture of the run's held-out set are dropped (what `vlrl sft` trains on)."""
    d = config.data
    if config.env.name:  # an episode run: turns of random-action episodes, from seeds no eval episode uses
        from vlrl.episodes.warm import items as episode_items

        env, rollout = episode_settings(config)
        return episode_items(env, rollout, n=settings(config)["items"], seed=d.seed,
                             player=config.model.warm_start_player)
    if d.source == "synthetic":
        s = settings(config)
        chosen = generated_items(s["seed"], s["items"], s["image_size"], s["difficulty"], s["tasks"])
        if not exclude_held_out:
            return chosen
        _, held_out = _train_and_eval(config)
    else:
        chosen, held_out = _train_and_eval(config)
    held = {image_hash(image) for row in held_out for image in prompts.row_images(row)}
    return [row for row in chosen if not held & {image_hash(image) for image in prompts.row_images(row)}]


def _train_and_eval(config: RunConfig):
    """[data]'s rows and the eval set, before the run's decontamination (which only ever drops training rows)."""
    d = config.data
    if config.eval.source:
        return data.load_rows(d), data.load_eval_rows(config.eval, d.image_size, max_images=d.max_images)
    return data.split_holdout(data.load_rows(d), d.hold_out, seed=d.seed)


def held_out_exclusions(config: RunConfig) -> set[str]:
    """Picture hashes the held-out set must not show: those of the warm start this run gives a local model, which
    are generated items whatever the run's [data] (`ensure_tiny`); a data set of one's own shares none with them."""
    m = config.model
    if m.name_or_path not in LOCAL_MODELS or not m.warm_start_steps or config.env.name:
        return set()
    s = settings(config)
    warm = generated_items(s["seed"], s["items"], s["image_size"], s["difficulty"], s["tasks"])
    return {image_hash(image) for item in warm for image in prompts.row_images(item)}


def model_path(config: RunConfig, log=print) -> str:
    """The checkpoint a run loads: a local model built (and warm-started) in the cache, else name_or_path as given."""
    m = config.model
    if m.name_or_path not in LOCAL_MODELS:
        return m.name_or_path
    s = settings(config)
    return str(ensure_tiny(seed=s["seed"], warm_start_steps=s["steps"], warm_start_items=s["items"],
                           image_size=s["image_size"], difficulty=s["difficulty"], tasks=s["tasks"], size=s["size"],
                           family=s["family"], episodes=episode_settings(config), player=s["player"], log=log))


def episode_settings(config: RunConfig):
    """(the run's [env], its rollout settings) for an episode run, whose warm start plays the environment with
    random actions (`vlrl.episodes.warm`); None for a single-turn run."""
    if not config.env.name:
        return None
    from vlrl.episodes.rollout import settings_for

    return config.env, settings_for(config, "train")


def _key(settings: dict) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]


def ensure_tiny(cache_dir: str | Path | None = None, *, seed: int = 0, warm_start_steps: int = 300,
                warm_start_items: int = 512, image_size: int = 128, difficulty: int = 1, tasks=None,
                size: str = "tiny", family: str = "qwen3_vl", episodes=None, player: str = "random",
                log=print) -> Path:
    """The warm-started tiny (or small) model's directory, built and cached on first use.

    Args:
        cache_dir: the cache root (default `vlrl.base.cache.cache_dir()`).
        seed: seeds the random weights, the generated items and the warm start.
        warm_start_steps: supervised steps that teach the answer format; 0 returns the random model.
        warm_start_items: generated items the warm start trains on (disjoint seeds from eval items).
        image_size: side of the generated images.
        difficulty: the generated items' difficulty (`vlrl.base.synthetic`): the run's own, or its warm_start_difficulty.
        tasks: the generated items' tasks (default `vlrl.base.synthetic.TASKS`): the run's own, or its warm_start_tasks.
            Each task's generator version past 1 (`synthetic.GENERATOR_VERSIONS`) enters the cache key.
        size: "tiny" or "small" (see `vlrl.model.tiny.SIZES`).
        family: "qwen3_vl", "qwen3_5" or "qwen3_5_moe" (`vlrl.model.tiny.FAMILIES`).
        episodes: for an episode run, (its [env], its rollout settings): the items are then turns of random-action
            episodes (`vlrl.episodes.warm`) instead of generated questions.
        player: who plays those episodes: "random" actions, or "scripted" (Crafter's scripted player).
    """
    cache_root = Path(cache_dir or cache.cache_dir())
    base = tiny.ensure_base(cache_root, seed=seed, size=size, family=family, log=log)
    if warm_start_steps <= 0:
        return base
    key = {"seed": seed, "steps": warm_start_steps, "items": warm_start_items, "image_size": image_size, "version": 1}
    if size != "tiny":  # the tiny model's key stays as it was, so existing caches stay valid
        key["size"] = size
    if difficulty != 1:
        key["difficulty"] = difficulty
    if tasks and tuple(tasks) != synthetic.TASKS:
        key["tasks"] = list(tasks)
    generators = {task: synthetic.GENERATOR_VERSIONS[task] for task in tasks or synthetic.TASKS
                  if synthetic.GENERATOR_VERSIONS.get(task, 1) != 1}
    if generators and episodes is None:  # version 1 everywhere keeps the key as it was (synthetic.GENERATOR_VERSIONS)
        key["generators"] = generators
    if episodes is not None:
        env = {k: v for k, v in dataclasses.asdict(episodes[0]).items() if k not in EPISODE_KEY_IGNORES}
        key = {"seed": seed, "steps": warm_start_steps, "items": warm_start_items, "size": size, "env": env,
               "settings": dataclasses.asdict(episodes[1]), "from": FORMAT_START, "lr": EPISODE_WARM_LR[size],
               "version": 2}
        if player != "random":  # random-action warm starts keep their key, so existing caches stay valid
            key["player"] = player
    warm = base.with_name(f"{base.name.removesuffix(f'-seed{seed}')}-warm-{_key(key)}")
    with tiny.build_once(warm) as missing:  # one process builds it, any other waits for it
        if not missing:
            return warm
        kind = f"{player}-action episode turns" if episodes is not None else "generated items"
        log(f"warm start: {warm_start_steps} supervised steps on {warm_start_items} {kind} -> {warm}")
        start = base
        if episodes is not None:
            from vlrl.episodes.warm import items as episode_items

            # from the model that already writes the answer tags (the tiny preset's own warm start, cached once): a few
            # steps then teach the action names, where a random model needs hundreds to learn the tags first
            start = ensure_tiny(cache_root, seed=seed, size=size, family=family, log=log, **FORMAT_START)
            chosen = episode_items(episodes[0], episodes[1], n=warm_start_items, seed=seed, player=player)
        else:
            chosen = generated_items(seed, warm_start_items, image_size, difficulty, tasks)
        tmp = tiny.tmp_dir(warm)
        lr = EPISODE_WARM_LR[size] if episodes is not None else WARM_LR[size]
        sft.sft(start, chosen, tmp, max_steps=warm_start_steps, seed=seed, learning_rate=lr,
                batch_size=EPISODE_BATCH if episodes is not None else 16, log_path=tmp / "sft_log.jsonl", log=log)
        (tmp / "warm_start.json").write_text(json.dumps(key, indent=2))
        tiny.replace_dir(tmp, warm)
    return warm


def sft_from_config(config: RunConfig, output_dir: str | Path, *, steps: int | None = None,
                    learning_rate: float | None = None, batch_size: int = 16, log=print) -> Path:
    """`vlrl sft`: the supervised warm start for the configured model, as a checkpoint RL can start from.

    A local model (`tiny`, `tiny-small`) starts from its random weights, built in the cache; any other model from
    `[model] name_or_path`. This is full fine-tuning in float32, meant for small models: 4-bit weights cannot train.

    Returns:
        `output_dir`, loadable with `[model] name_or_path = "<output_dir>"` (and warm_start_steps = 0).
    """
    m = config.model
    if m.load_in_4bit:
        raise ConfigError(f"vlrl sft fine-tunes every weight, which 4-bit weights cannot do; set [model] "
                          f"load_in_4bit = false and point name_or_path at a 16-bit checkpoint (not "
                          f"{m.name_or_path!r}).")
    size = LOCAL_MODELS.get(m.name_or_path)
    start = (tiny.ensure_base(seed=config.data.seed, size=size, family=LOCAL_FAMILIES.get(m.name_or_path, "qwen3_vl"),
                              log=log) if size else m.name_or_path)
    chosen = items(config, exclude_held_out=True)
    steps = steps or m.warm_start_steps or DEFAULT_STEPS
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    log(f"warm start: {steps} supervised steps on {len(chosen)} items from {start} -> {output_dir}")
    sft.sft(start, chosen, output_dir, max_steps=steps, learning_rate=learning_rate or WARM_LR[size or "tiny"],
            batch_size=batch_size, seed=config.training.seed, log_path=output_dir / "sft_log.jsonl", log=log)
    log(f'train from it with [model] name_or_path = "{output_dir}" and warm_start_steps = 0')
    return output_dir
