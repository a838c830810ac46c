"""The stages of an episode run, and `run()`, its whole loop: load -> baseline episodes -> GSPO over episodes ->
episodes after -> comparison and report -> adapter export. `vlrl run` comes here when the run file has an [env].

Each stage reads and writes the run directory (`vlrl.config.rundir.RunDir`), as a single-turn run's do, and the model
stages are `vlrl.run`'s own (a local model is warm-started on random-action turns: `vlrl.episodes.warm`). Training is
`vlrl.training.train`'s, as for a single-turn run; under `accelerate launch` every process trains on its share of each step's
episodes, and the main process alone plays the eval episodes and writes the run directory:

    config.toml  eval_before.jsonl  episode_frames/before/  train_log.jsonl  checkpoints/  eval_after.jsonl
    episode_frames/after/  comparison.json  plots/  report.html  adapter/

    run(config.preset("grid-tiny"))          # -> runs/grid-tiny, the comparison as a dict

The seeds: eval episodes use 0..eval_seeds-1, before and after alike; training episodes 1,000,000 + 0..train_seeds-1
(`vlrl.config.sections.ENV_SEEDS`), so no eval episode is ever a training episode.
"""

from __future__ import annotations

import time
from pathlib import Path

from vlrl import report
from vlrl import run as stages
from vlrl.base import distributed
from vlrl.config.rundir import RunDir
from vlrl.config.runfile import RunConfig
from vlrl.training import train
from vlrl.training.episode_trainer import checkpoint_activations


def train_episodes(config: RunConfig, policy, processor, run: str | Path | RunDir, log=print):
    """GSPO over episodes in the run directory, through the trainer single-turn runs use (`vlrl.training.train`, with
    `vlrl.training.episode_trainer`'s rollouts), continuing from its last checkpoint when there is one. Returns the trainer
    (None: training was already done)."""
    return train.train(config, policy, processor, stages.training_rows(config, processor, RunDir.of(run), log), run,
                       resume=True, log=log)


def run(config: RunConfig, run_dir: str | Path | None = None, *, log=print) -> dict:
    """Runs the whole episode loop into `run_dir` (default runs/<name>); returns the comparison."""
    started = time.time()
    rd = stages.start(config, run_dir)

    stages.banner(f"1/5 model: load (warm start) and wrap with LoRA; environment {config.env.name!r}", log)
    policy, processor = stages.load_policy(config, log)
    checkpoint_activations(policy)  # before any decoding: the compiled graphs then serve evals and training

    stages.banner("2/5 baseline episodes", log)
    stages.evaluate_policy(config, policy, processor, None, rd, "before", log)

    stages.banner("3/5 GSPO over episodes", log)
    trainer = train_episodes(config, policy, processor, rd, log)
    trained = trainer.model if trainer is not None else policy

    stages.banner("4/5 episodes after training", log)
    stages.evaluate_policy(config, policy, processor, None, rd, "after", log)
    comparison = distributed.on_main(stages.compare_run, rd, log)
    distributed.on_main(report.render, rd.path, log=log)

    stages.banner("5/5 export the adapter (verified from disk)", log)
    stages.export_policy(config, trained, processor, rd, log)
    distributed.on_main(stages.finish, rd, comparison, time.time() - started, log)
    return comparison
