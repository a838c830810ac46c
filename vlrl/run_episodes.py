"""The stages of an episode run, and `run()`, its whole loop: load -> baseline episodes -> GSPO over episodes ->
episodes after -> comparison and report -> adapter export. `vlrl run` comes here when the run file has an [env].

Each stage reads and writes the run directory (`vlrl.rundir.RunDir`), as a single-turn run's do, and the model
stages are `vlrl.run`'s own (a local model is warm-started on random-action turns: `vlrl.episodes.warm`):

    config.toml  eval_before.jsonl  episode_frames/before/  train_log.jsonl  checkpoints/  eval_after.jsonl
    episode_frames/after/  comparison.json  plots/  report.html  adapter/

    run(config.preset("grid-tiny"))          # -> runs/grid-tiny, the comparison as a dict

The seeds: eval episodes use 0..eval_seeds-1, before and after alike; training episodes 1,000,000 + 0..train_seeds-1
(`vlrl.sections.ENV_SEEDS`), so no eval episode is ever a training episode.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path

from vlrl import report
from vlrl import run as stages
from vlrl.config import RunConfig
from vlrl.envs import env_options, make
from vlrl.episodes import evaluate, gspo
from vlrl.episodes.rollout import settings_for
from vlrl.rundir import RunDir
from vlrl.sections import ENV_SEEDS


def environment(config: RunConfig):
    """A callable that builds a fresh environment of the run's [env] (name or URL, with its options)."""
    return functools.partial(make, config.env.name, **env_options(config.env))


def seeds(config: RunConfig, part: str) -> list[int]:
    """The run's seeds of `part`: "eval" (the same before and after) or "train" (disjoint from them).

    >>> from vlrl import config
    >>> c = config.from_dict({"env": {"name": "grid", "eval_seeds": 3, "train_seeds": 2}})
    >>> seeds(c, "eval"), seeds(c, "train")
    ([0, 1, 2], [1000000, 1000001])
    """
    count = config.env.eval_seeds if part == "eval" else config.env.train_seeds
    return [ENV_SEEDS[part] + i for i in range(count)]


def evaluate_episodes(config: RunConfig, policy, processor, run: str | Path | RunDir, when: str,
                      log=print) -> list[dict]:
    """The eval seeds' episodes into eval_<when>.jsonl and episode_frames/<when>/ ("before" resumes a partial file;
    "after" starts over: episodes of an earlier adapter must never be scored as this one's)."""
    run = RunDir.of(run)
    path = run.eval_file(f"eval_{when}")
    if when == "after":
        path.unlink(missing_ok=True)
    return evaluate.evaluate(policy, processor, environment(config), seeds(config, "eval"), path,
                             settings_for(config, "eval"), env_name=config.env.name,
                             frame_dir=run.episode_frames(when), batch_size=config.eval.batch_size, log=log)


def train_episodes(config: RunConfig, policy, processor, run: str | Path | RunDir, log=print) -> list[dict]:
    """GSPO over episodes in the run directory, continuing from its last checkpoint when there is one."""
    run = RunDir.of(run)
    return gspo.train(config, policy, processor, environment(config), run, seeds(config, "train"),
                      settings_for(config, "train"), log=log)


def run(config: RunConfig, run_dir: str | Path | None = None, *, log=print) -> dict:
    """Runs the whole episode loop into `run_dir` (default runs/<name>); returns the comparison."""
    started = time.time()
    rd = stages.start(config, run_dir)

    stages.banner(f"1/5 model: load (warm start) and wrap with LoRA; environment {config.env.name!r}", log)
    policy, processor = stages.load_policy(config, log)
    gspo.checkpoint_activations(policy)  # before any decoding: the compiled graphs then serve evals and training

    stages.banner("2/5 baseline episodes", log)
    evaluate_episodes(config, policy, processor, rd, "before", log)

    stages.banner("3/5 GSPO over episodes", log)
    train_episodes(config, policy, processor, rd, log)

    stages.banner("4/5 episodes after training", log)
    evaluate_episodes(config, policy, processor, rd, "after", log)
    comparison = stages.compare_run(rd, log)
    report.render(rd.path, log=log)

    stages.banner("5/5 export the adapter (verified from disk)", log)
    stages.export_policy(config, policy, processor, rd, log)
    stages.finish(rd, comparison, time.time() - started, log)
    return comparison
