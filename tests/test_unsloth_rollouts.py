"""vlrl on the Unsloth backend (`vlrl.training.unsloth_rollouts`), checked on the CPU with TRL's GRPOTrainer standing
in for Unsloth's patched one (Unsloth itself needs a CUDA GPU; bench/gpu_unsloth.py runs the real one): the trainer
`build_trainer` makes for an Unsloth model decodes its rollouts through the engine with the image and video
placeholders suppressed (a sampled `<|video_pad|>` is what broke Unsloth's loss: docs/training.md), and measures the
rollout/training mismatch with a separate forward, to the same numbers the transformers backend gets from the loss's
own forward. Real generation, real optimizer steps."""

import json
from dataclasses import replace

import pytest

from vlrl.base import synthetic
from vlrl.config import runfile as cfg
from vlrl.model import loading as model
from vlrl.model import prompts, vision_tokens
from vlrl.training import mismatch, train, unsloth_rollouts


def _trainer(tiny_dir, run_dir, monkeypatch, backend: str):
    """The tiny model's trainer as `build_trainer` makes it for `backend`; its rollouts sample at temperature 2 while
    the loss assumes 1, so the mismatch is far from 0 and the same on both backends."""
    monkeypatch.setattr(train, "backend_of", lambda _model: backend)
    config = cfg.preset("tiny")
    for key, value in {"max_steps": 1, "save_steps": 10, "max_completion_length": 24}.items():
        setattr(config.training, key, value)
    policy, processor = model.load_model(str(tiny_dir), lora=model.LoraSettings(r=8, alpha=16))
    rows = prompts.to_dataset(synthetic.generate(8, seed=5, image_size=64))
    trainer = train.build_trainer(config, policy, processor, rows, run_dir)
    trainer.rollout_decoding = replace(trainer.rollout_decoding, temperature=2.0)
    return trainer, processor


def _logged(run_dir) -> dict:
    records = [json.loads(line) for line in (run_dir / "train_log.jsonl").read_text().splitlines()]
    return next(r for r in records if "sampling/rollout_train_kl" in r)


@pytest.mark.slow
def test_unsloth_trainer_suppresses_placeholders_and_measures_the_mismatch(tiny_dir, tmp_path, monkeypatch):
    trainer, processor = _trainer(tiny_dir, tmp_path / "unsloth", monkeypatch, "unsloth")
    assert isinstance(trainer, unsloth_rollouts.UnslothRolloutMismatch)
    video_pad = processor.tokenizer.convert_tokens_to_ids("<|video_pad|>")
    assert video_pad in trainer.rollout_decoding.suppress_ids
    assert set(vision_tokens.vision_token_ids(processor)) <= set(trainer.rollout_decoding.suppress_ids)
    trainer.train()
    on_unsloth = _logged(tmp_path / "unsloth")

    reference, _ = _trainer(tiny_dir, tmp_path / "transformers", monkeypatch, "transformers")
    assert isinstance(reference, mismatch.RolloutMismatch)
    assert not isinstance(reference, unsloth_rollouts.UnslothRolloutMismatch)
    reference.train()
    on_transformers = _logged(tmp_path / "transformers")
    for name in ("rollout_train_kl", "sampling_logp_difference/mean", "sampling_logp_difference/max"):
        key = f"sampling/{name}"
        print(f"{key}: unsloth path {on_unsloth[key]:.6g}, transformers path {on_transformers[key]:.6g}")
        assert on_unsloth[key] == pytest.approx(on_transformers[key], rel=1e-4)
    assert on_unsloth["sampling/rollout_train_kl"] > 0.05  # temperature 2 against 1: clearly measured
    assert on_unsloth["rollout_time"] > 0
