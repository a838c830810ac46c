"""Experiment tracking ([training] report_to): a few real GSPO steps on the tiny model reported to TensorBoard and to
trackio (one run reporting to both), read back with each tool's own reader, and compared with what
train_log.jsonl recorded."""

import json
from pathlib import Path

import pytest

from vlrl.base import synthetic
from vlrl.config import runfile as cfg
from vlrl.model import loading as model
from vlrl.model import prompts
from vlrl.training import train

# TRL's numbers, the reward terms and the degeneration monitor's: each tool gets them as train/<name>
METRICS = ("loss", "reward", "rewards/format_reward/mean", "rewards/correctness_reward/mean",
           "completions/mean_length", "degeneration/rate", "learning_rate")


@pytest.fixture(scope="module")
def tracked(tiny_dir, tmp_path_factory) -> tuple[Path, list[dict]]:
    """Two GSPO steps reported to both tools at once (one run for both tests: the steps cost far more than the
    reading); returns the run directory and train_log.jsonl's per-step records."""
    made = tmp_path_factory.mktemp("tracking")  # a name of its own: a second setup in this process is a second run
    run_dir = made / f"run-{made.name}"
    config = cfg.preset("tiny")
    for key, value in {"max_steps": 2, "save_steps": 100, "max_completion_length": 24,
                       "report_to": ["tensorboard", "trackio"]}.items():
        setattr(config.training, key, value)
    cfg.validate(config)
    policy, processor = model.load_model(str(tiny_dir), lora=model.LoraSettings(r=8, alpha=16))
    rows = prompts.to_dataset(synthetic.generate(16, seed=5, image_size=64))
    train.train(config, policy, processor, rows, run_dir)
    records = [json.loads(line) for line in (run_dir / "train_log.jsonl").read_text().splitlines()]
    steps = [r for r in records if "reward" in r]
    assert [r["step"] for r in steps] == [1, 2]
    return run_dir, steps


@pytest.mark.slow  # two real GSPO steps
def test_tensorboard_event_files_hold_every_logged_step(tracked):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir, logged = tracked
    events = EventAccumulator(str(run_dir / "tensorboard")).Reload()  # inside the run directory
    for name in METRICS:
        scalars = events.Scalars(f"train/{name}")
        assert [s.step for s in scalars] == [1, 2], name
        # TensorBoard stores 32-bit floats
        assert [s.value for s in scalars] == [pytest.approx(r[name], rel=1e-6, abs=1e-7) for r in logged], name


@pytest.mark.slow  # two real GSPO steps
def test_trackio_store_holds_every_logged_step(tracked):
    from trackio import Api
    from trackio.sqlite_storage import SQLiteStorage

    run_dir, logged = tracked
    assert run_dir.name in [run.name for run in Api().runs("vlrl")]  # project vlrl, run named after its directory
    rows = [r for r in SQLiteStorage.get_logs("vlrl", run_dir.name) if "train/reward" in r]
    assert [r["train/global_step"] for r in rows] == [1, 2]
    for name in METRICS:
        assert [r[f"train/{name}"] for r in rows] == [pytest.approx(r[name]) for r in logged], name
