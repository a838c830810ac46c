"""GSPO on the tiny model: real generation, real rewards, real optimizer steps that move the LoRA weights."""

import json

import pytest
import torch

from vlrl import config as cfg
from vlrl import data, model, synthetic, train


def tiny_config(**training) -> cfg.RunConfig:
    config = cfg.preset("tiny")
    for key, value in {"max_steps": 2, "save_steps": 1, "max_completion_length": 32, **training}.items():
        setattr(config.training, key, value)
    return config


@pytest.mark.slow
def test_gspo_steps_move_lora(tiny_dir, tmp_path):
    config = tiny_config()
    policy, processor = model.load_model(str(tiny_dir), lora=model.LoraSettings(r=8, alpha=16))
    before = {n: p.detach().clone() for n, p in policy.named_parameters() if "lora_B" in n}
    assert before and all(torch.count_nonzero(p) == 0 for p in before.values())  # PEFT starts lora_B at zero
    frozen = {n: p.detach().clone() for n, p in policy.named_parameters() if ".visual." in n}

    trainer = train.train(config, policy, processor, data.to_dataset(synthetic.generate(16, seed=5, image_size=64)),
                          tmp_path)

    after = dict(policy.named_parameters())
    assert any(torch.count_nonzero(after[n]) > 0 for n in before), "GSPO left every lora_B at zero"
    assert all(torch.equal(frozen[n], after[n]) for n in frozen), "the vision tower must stay frozen"
    args = trainer.args
    assert (args.importance_sampling_level, args.loss_type, args.beta) == ("sequence", "dr_grpo", 0.0)
    log = [json.loads(line) for line in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    steps = [r for r in log if "rewards/format_reward/mean" in r]
    assert len(steps) == 2 and all("rewards/correctness_reward/mean" in r for r in steps)
    assert (tmp_path / "checkpoints" / "checkpoint-2" / "adapter_model.safetensors").exists()


def test_lora_targets_language_model_only(tiny_base_dir):
    policy, _ = model.load_model(str(tiny_base_dir), lora=model.LoraSettings())
    lora = [n for n, _ in policy.named_parameters() if "lora_" in n]
    assert lora and all(".language_model." in n for n in lora)
    summary = model.trainable_summary(policy)
    assert not summary["vision_trainable"] and 0 < summary["trainable"] < summary["total"]


def test_sft_target_is_well_formed(items):
    from vlrl import rewards

    target = train.sft_target(items[0])
    assert rewards.format_reward([target]) == [2.0]
    assert rewards.correctness_reward([target], answer=[items[0]["answer"]]) == [2.0]
