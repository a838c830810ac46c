"""GSPO on the tiny model: real generation, real rewards, real optimizer steps that move the LoRA weights;
checkpoints, kill-and-resume, the degeneration monitor, and the supervised warm start (`vlrl sft`)."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import TrainerControl, TrainerState, TrainingArguments

from vlrl import data
from vlrl.base import synthetic
from vlrl.cli import main
from vlrl.config import runfile as cfg
from vlrl.grammar import rewards
from vlrl.model import loading as model
from vlrl.model import prompts, vision_tokens
from vlrl.training import callbacks, sft, train, warmstart

ROOT = Path(__file__).resolve().parent.parent


def tiny_config(**training) -> cfg.RunConfig:
    config = cfg.preset("tiny")
    for key, value in {"max_steps": 2, "save_steps": 1, "max_completion_length": 32, **training}.items():
        setattr(config.training, key, value)
    return config


def read_log(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "train_log.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_gspo_steps_move_lora_and_log_every_step(tiny_dir, tmp_path):
    config = tiny_config()
    policy, processor = model.load_model(str(tiny_dir), lora=model.LoraSettings(r=8, alpha=16))
    before = {n: p.detach().clone() for n, p in policy.named_parameters() if "lora_B" in n}
    assert before and all(torch.count_nonzero(p) == 0 for p in before.values())  # PEFT starts lora_B at zero
    frozen = {n: p.detach().clone() for n, p in policy.named_parameters() if ".visual." in n}

    trainer = train.train(config, policy, processor, prompts.to_dataset(synthetic.generate(16, seed=5, image_size=64)),
                          tmp_path)

    after = dict(policy.named_parameters())
    assert any(torch.count_nonzero(after[n]) > 0 for n in before), "GSPO left every lora_B at zero"
    assert all(torch.equal(frozen[n], after[n]) for n in frozen), "the vision tower must stay frozen"
    args = trainer.args
    assert (args.importance_sampling_level, args.loss_type, args.beta) == ("sequence", "dr_grpo", 0.0)
    steps = [r for r in read_log(tmp_path) if "rewards/format_reward/mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for record in steps:  # the reward terms, and the degeneration monitor's numbers, every step
        assert {"rewards/correctness_reward/mean", "degeneration/rate", "degeneration/mean_ratio",
                "degeneration/clipped_ratio"} <= set(record)
        assert 0 <= record["degeneration/rate"] <= 1 and 0 <= record["degeneration/clipped_ratio"] <= 1
        assert 0 < record["rollout_time"] < record["step_time"]  # the step's decoding, within TRL's step time
        # its parts, from the engine's own marks: the prefill, and a decoding step (the tiny model's, well under 1 s)
        assert 0 < record["rollout/prefill_time"] < record["rollout_time"]
        assert 0 < record["rollout/decode_ms_per_step"] < 1000 * record["rollout_time"]
    assert (tmp_path / "checkpoints" / "checkpoint-2" / "adapter_model.safetensors").exists()
    resolved = json.loads((tmp_path / "grpo_config.json").read_text())  # what the trainer really ran with
    assert (resolved["loss_type"], resolved["scale_rewards"], resolved["beta"]) == ("dr_grpo", "none", 0.0)
    assert resolved["vlrl"]["backend"] == "transformers"
    assert resolved["vlrl"]["trainer_class"].endswith("GRPOTrainer")
    from vlrl.config.recipe import machine_choices

    assert resolved["vlrl"]["machine"] == machine_choices()  # the optimizer and precision taken, and why (CPU here)
    assert cfg.load(tmp_path / "config.toml") == config


@pytest.mark.slow
def test_generation_batch_size_decodes_each_micro_batch_just_before_its_step(tiny_dir, tmp_path):
    # One optimizer step of 4 x 4 = 16 completions, decoded 8 at a time: two generate calls, not one of 16.
    config = tiny_config(max_steps=1, per_device_train_batch_size=4, gradient_accumulation_steps=4,
                         num_generations=4, generation_batch_size=8)
    policy, processor = model.load_model(str(tiny_dir), lora=model.LoraSettings(r=8, alpha=16))
    trainer = train.build_trainer(config, policy, processor,
                                  prompts.to_dataset(synthetic.generate(16, seed=5, image_size=64)), tmp_path)
    calls, generate = [], trainer.generate_rollouts

    def counted(prompt_ids, *args, **kwargs):
        calls.append(len(prompt_ids))
        return generate(prompt_ids, *args, **kwargs)

    trainer.generate_rollouts = counted
    trainer.train()
    assert (trainer.args.generation_batch_size, trainer.args.steps_per_generation) == (8, 2)
    assert calls == [8, 8] and trainer.state.global_step == 1


@pytest.mark.slow
def test_rollouts_never_sample_an_image_placeholder(tiny_dir, tmp_path):
    """A completion holding <|image_pad|> broke the next forward over prompt + completion ("Image features and image
    tokens do not match": the 8B testmini-seed rehearsal on an H200, random weights). Here the policy prefers the
    placeholder at every step, by far; the step still runs, on completions that hold none."""
    policy, processor = model.load_model(str(tiny_dir), lora=model.LoraSettings(r=8, alpha=16))
    placeholder = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert placeholder in vision_tokens.vision_token_ids(processor)
    head = policy.get_base_model().lm_head

    def prefer_placeholder(module, args, logits):
        logits[..., placeholder] += 1000.0
        return logits

    hook = head.register_forward_hook(prefer_placeholder)
    try:
        trainer = train.build_trainer(tiny_config(max_steps=1), policy, processor,
                                      prompts.to_dataset(synthetic.generate(16, seed=5, image_size=64)), tmp_path)
        completions, generate = [], trainer.generate_rollouts

        def kept(*args, **kwargs):
            out = generate(*args, **kwargs)
            completions.extend(out[0])
            return out

        trainer.generate_rollouts = kept
        trainer.train()
    finally:
        hook.remove()
    assert trainer.state.global_step == 1 and completions
    assert not any(set(c) & set(vision_tokens.vision_token_ids(processor)) for c in completions)


def _adapter(run_dir: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(run_dir / "adapter" / "adapter_model.safetensors"))


RESUME_TOLERANCE = 1e-6  # measured: max |difference| 0.0 (bit-identical) on CPU; the margin is for other BLAS builds


@pytest.mark.slow
def test_killed_and_resumed_run_ends_with_the_same_adapter_as_an_uninterrupted_one(tiny_dir, tmp_path):
    run_file = tmp_path / "run.toml"
    run_file.write_text(cfg.to_toml(tiny_config(max_steps=2, save_steps=1, max_completion_length=24)))
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    assert main(["train", "--config", str(run_file), "--run-dir", str(whole)]) == 0

    # the same command in another process, which kills itself (SIGKILL) as soon as checkpoint-1 is saved
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.run([sys.executable, str(ROOT / "tests" / "killed_at_checkpoint.py"), "1", "train",
                              "--config", str(run_file), "--run-dir", str(killed)], cwd=ROOT, env=env,
                             capture_output=True, text=True, check=False)
    assert process.returncode == -signal.SIGKILL, process.stdout + process.stderr
    assert [p.name for p in (killed / "checkpoints").glob("checkpoint-*")] == ["checkpoint-1"]
    assert [r["step"] for r in read_log(killed) if "reward" in r] == [1] and not (killed / "adapter").exists()

    assert main(["train", "--run-dir", str(killed), "--resume"]) == 0  # its own config.toml, its checkpoint

    a, b = _adapter(whole), _adapter(killed)
    assert a.keys() == b.keys()
    difference = max((a[k] - b[k]).abs().max().item() for k in a)
    print(f"resume: max |adapter difference| = {difference:.3g} over {len(a)} tensors")
    assert difference <= RESUME_TOLERANCE, difference
    assert any(torch.count_nonzero(v) for k, v in a.items() if "lora_B" in k)
    # the same completions were sampled after the resume (RNG state restored): every logged number agrees
    logged = ("reward", "completions/mean_length", "rewards/format_reward/mean", "loss", "learning_rate")
    whole_log, killed_log = read_log(whole), read_log(killed)
    assert [r["step"] for r in killed_log if "reward" in r] == [1, 2]
    for x, y in zip([r for r in whole_log if "reward" in r], [r for r in killed_log if "reward" in r]):
        assert all(x[k] == pytest.approx(y[k], abs=RESUME_TOLERANCE) for k in logged), (x, y)


def test_resume_with_a_different_run_file_is_refused(tmp_path):
    from vlrl.base.errors import RunDirError
    from vlrl.run import train_only

    config = tiny_config()
    (tmp_path / "config.toml").write_text(cfg.to_toml(config))
    (tmp_path / "train_log.jsonl").write_text('{"step": 1}\n')  # a result: a directory of config.toml alone is taken over
    config.training.learning_rate = 1e-3
    with pytest.raises(RunDirError, match=r"\[training\] learning_rate: 0.002 -> 0.001"):  # before anything loads
        train_only(config, tmp_path, resume=True)


def test_resume_without_a_run_to_resume_is_an_error(tmp_path, capsys):
    assert main(["train", "--run-dir", str(tmp_path / "nothing"), "--resume"]) == 1
    assert "no run to resume" in capsys.readouterr().err


def test_last_checkpoint_skips_one_torn_by_a_kill_and_the_log_is_cut_back_to_it(tmp_path):
    for step, complete in ((2, True), (4, True), (6, False)):
        folder = tmp_path / "checkpoints" / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        if complete:
            (folder / "trainer_state.json").write_text("{}")
    last = train._last_checkpoint(tmp_path / "checkpoints")
    assert last.name == "checkpoint-4"
    log = tmp_path / "train_log.jsonl"
    log.write_text("".join(json.dumps({"step": s, "loss": 0.1}) + "\n" for s in range(1, 7)) + '{"step": 7, "lo')
    train._truncate_log(log, train._checkpoint_step(last))
    assert [json.loads(line)["step"] for line in log.read_text().splitlines()] == [1, 2, 3, 4]


def _log_step(monitor, step, logs):
    state, control = TrainerState(), TrainerControl()
    state.global_step = step
    monitor.on_log(TrainingArguments(output_dir="unused", use_cpu=True), state, control, logs=logs)
    return control


SPAM = "addCriterion\n" * 20
GOOD = "<REASONING>3+4=7</REASONING><SOLUTION>7</SOLUTION>"


def test_degeneration_monitor_logs_rates_without_changing_the_rewards():
    monitor = callbacks.DegenerationMonitor(max_completion_length=8)
    watched = monitor.watch(rewards.format_reward)
    completions = [SPAM, GOOD, [{"role": "assistant", "content": SPAM}], GOOD]  # Unsloth's strings, TRL's messages
    assert watched.__name__ == "format_reward"  # TRL names the logged reward after it
    assert watched(completions, completion_ids=[[1] * 8, [1] * 3, [1] * 8, [1] * 5]) == rewards.format_reward(
        completions)
    logs = {"loss": 0.0}
    control = _log_step(monitor, 1, logs)
    assert logs["degeneration/rate"] == 0.5 and logs["degeneration/clipped_ratio"] == 0.5
    assert logs["degeneration/mean_ratio"] == pytest.approx(0.5)
    assert not control.should_training_stop  # no early stop unless asked
    end = {"train_runtime": 1.0}
    _log_step(monitor, 1, end)  # nothing generated since the last log: the summary line gets no rates
    assert "degeneration/rate" not in end


def test_degeneration_monitor_prefers_the_trainers_clipped_ratio():
    monitor = callbacks.DegenerationMonitor(max_completion_length=8)
    monitor.observe([GOOD], completion_ids=[[1] * 8])
    logs = {"completions/clipped_ratio": 0.25}
    _log_step(monitor, 1, logs)
    assert logs["degeneration/clipped_ratio"] == 0.25


def test_degeneration_monitor_stops_training_when_asked(capsys):
    monitor = callbacks.DegenerationMonitor(stop_at=0.5, log=print)
    monitor.observe([GOOD, GOOD, GOOD, SPAM])  # 25%: keep going
    assert not _log_step(monitor, 3, {}).should_training_stop
    monitor.observe([SPAM, SPAM, GOOD, SPAM])  # 75%: stop, and save the state that degenerated
    logs = {}
    control = _log_step(monitor, 4, logs)
    assert control.should_training_stop and control.should_save
    assert logs["degeneration/early_stop"] == 1 and monitor.stopped_at_step == 4
    assert "stop_on_degeneration = 0.5" in capsys.readouterr().out


def test_sft_items_never_include_a_held_out_picture():
    config = cfg.preset("tiny")
    rows = synthetic.generate(config.data.num_items, seed=config.data.seed, image_size=config.data.image_size)
    _, held_out = data.split_holdout(rows, config.data.hold_out, seed=config.data.seed)
    items = warmstart.items(config, exclude_held_out=True)
    held = {data.image_hash(r["image"]) for r in held_out}
    assert len(items) > 400 and not held & {data.image_hash(r["image"]) for r in items}


@pytest.mark.slow
def test_sft_command_writes_a_warm_started_checkpoint(tiny_base_dir, tmp_path):
    from safetensors.torch import load_file

    out = tmp_path / "sft"  # the checkpoint goes to RUN_DIR/sft
    assert main(["sft", "--preset", "tiny", "--steps", "2", "--batch-size", "4", "--run-dir", str(tmp_path)]) == 0
    trained, base = load_file(str(out / "model.safetensors")), load_file(str(tiny_base_dir / "model.safetensors"))
    changed = [k for k in base if not torch.equal(base[k], trained[k])]
    assert changed and any("language_model" in k for k in changed)
    assert [json.loads(line)["step"] for line in (out / "sft_log.jsonl").read_text().splitlines()] == [2]
    warm = cfg.preset("tiny")
    warm.model.name_or_path, warm.model.warm_start_steps = str(out), 0
    policy, _ = model.load_model(warm.model.name_or_path, lora=model.LoraSettings())  # RL can start from it
    assert model.trainable_summary(policy)["trainable"] > 0


def test_lora_targets_language_model_only(tiny_base_dir):
    policy, _ = model.load_model(str(tiny_base_dir), lora=model.LoraSettings())
    lora = [n for n, _ in policy.named_parameters() if "lora_" in n]
    assert lora and all(".language_model." in n for n in lora)
    summary = model.trainable_summary(policy)
    assert not summary["vision_trainable"] and 0 < summary["trainable"] < summary["total"]


def test_sft_target_is_well_formed(items):
    target = sft.sft_target(items[0])
    assert rewards.format_reward([target]) == [2.0]
    assert rewards.correctness_reward([target], answer=[items[0]["answer"]]) == [2.0]
