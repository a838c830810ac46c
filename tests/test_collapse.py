"""The collapse monitor (`vlrl.training.collapse`): each step's entropy, distinct share and flat share, the one line
when the policy has collapsed, and `[training] stop_on_collapse`: a forced collapse of the tiny model."""

import json

import pytest
from transformers import TrainerControl, TrainerState

from vlrl.base import synthetic
from vlrl.config import runfile as cfg
from vlrl.model import loading as model
from vlrl.model import prompts
from vlrl.training import collapse, train


def steps(monitor, logs_per_step):
    """Feeds `monitor` one training step's samples and logs at a time; returns the logs and the control."""
    state, control, out = TrainerState(), TrainerControl(), []
    for step, (samples, logs) in enumerate(logs_per_step, 1):
        state.global_step = step
        monitor.observe(samples)
        logs = dict(logs)
        monitor.on_log(None, state, control, logs=logs)
        out.append(logs)
    return out, control


def test_three_collapsed_steps_in_a_row_are_said_once_and_stop_the_run_when_asked():
    lines = []
    same, varied = ["<SOLUTION>9</SOLUTION>"] * 8, [f"<SOLUTION>{i}</SOLUTION>" for i in range(8)]
    flat, learning = {"frac_reward_zero_std": 1.0, "entropy": 0.02}, {"frac_reward_zero_std": 0.5, "entropy": 0.8}
    monitor = collapse.CollapseMonitor(stop=True, log=lines.append)
    logs, control = steps(monitor, [(varied, learning), (same, flat), (same, flat), (varied, flat), (same, flat),
                                    (same, flat), (same, flat)])
    assert [r["collapse/collapsed"] for r in logs] == [0, 1, 1, 1, 1, 1, 1]  # step 4: distinct, but no entropy left
    assert logs[1]["collapse/distinct_share"] == 1 / 8 and logs[0]["collapse/distinct_share"] == 1.0
    assert [r.get("collapse/since_step") for r in logs] == [None, None, None, 2, None, None, None]
    assert lines == [("collapse: the policy has collapsed since step 2 (entropy 0.02, distinct 100%, flat groups 100% "
                      "for 3 steps in a row): its groups are flat, so nothing is left to learn; stopping here")]
    assert monitor.stopped_at_step == 4 and control.should_training_stop and not control.should_save


def test_a_collapse_interrupted_starts_counting_again_and_without_stop_training_goes_on():
    lines = []
    same = ["a"] * 8
    flat, learning = {"frac_reward_zero_std": 1.0}, {"frac_reward_zero_std": 0.25}
    monitor = collapse.CollapseMonitor(log=lines.append)
    logs, control = steps(monitor, [(same, flat), (same, flat), (same, learning), (same, flat), (same, flat),
                                    (same, flat)])
    assert [r.get("collapse/since_step") for r in logs] == [None] * 5 + [4]
    assert "training goes on" in lines[0] and not control.should_training_stop
    assert "collapse/entropy" not in logs[0]  # not measured: left out, never a made-up number


@pytest.mark.slow
def test_a_forced_collapse_of_the_tiny_model_is_noticed_and_stops_the_run(tiny_dir, tmp_path):
    """Sampling at temperature 0.01 the completions of a group are (nearly) the same: every group is flat and the
    entropy near 0 from the first step (measured: 0.031, 0.018, 0.012 nats a token; 50%, 38%, 38% distinct)."""
    config = cfg.preset("tiny")
    for key, value in {"temperature": 0.01, "max_steps": 6, "save_steps": 1, "stop_on_collapse": True}.items():
        setattr(config.training, key, value)
    policy, processor = model.load_model(str(tiny_dir), lora=model.LoraSettings(r=8, alpha=16))
    lines = []
    trainer = train.train(config, policy, processor, prompts.to_dataset(synthetic.generate(16, seed=5, image_size=64)),
                          tmp_path, log=lines.append)
    log = [json.loads(line) for line in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    trained = [r for r in log if "collapse/flat_share" in r]
    assert [r["step"] for r in trained] == [1, 2, 3]  # stopped at the third collapsed step
    assert all(r["collapse/flat_share"] == 1.0 and r["collapse/entropy"] <= collapse.ENTROPY for r in trained)
    assert trained[-1]["collapse/since_step"] == 1 and trainer.state.global_step == 3
    said = [line for line in lines if line.startswith("collapse:")]
    assert said[0].startswith("collapse: the policy has collapsed since step 1 (")
    assert said[1].startswith("collapse: no checkpoint was saved before step 1")
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]
    from vlrl.report import render

    for name in ("eval_before.jsonl", "eval_after.jsonl"):  # the page needs the two evals; these say nothing else
        (tmp_path / name).write_text("".join(json.dumps({"id": str(i), "correct": False, "format_ok": True}) + "\n"
                                             for i in range(4)))
    page = render(tmp_path).read_text()
    assert "The policy collapsed from training step 1" in page


def test_the_checkpoint_before_a_collapse_is_the_last_complete_one_before_its_step(tmp_path):
    """What `stop_on_collapse` puts the policy back to: never a checkpoint of the collapse's steps, never one whose
    saving was cut off (trainer_state.json is written last)."""
    for step in (1, 2, 3, 5):
        (tmp_path / f"checkpoint-{step}").mkdir()
        if step != 2:
            (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text("{}")
    assert train._last_checkpoint(tmp_path, before=4).name == "checkpoint-3"
    assert train._last_checkpoint(tmp_path, before=3).name == "checkpoint-1"  # checkpoint-2 was cut off
    assert train._last_checkpoint(tmp_path, before=1) is None
    assert train._last_checkpoint(tmp_path).name == "checkpoint-5"
