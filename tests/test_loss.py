"""vlrl's GSPO loss (`vlrl.training.loss`): the pure function against a reference written out below from the
definitions (one completion and one token at a time), and vlrl's trainer against TRL's own loss on the tiny model's
tensors: the same loss, gradient and logged metrics for every loss type vlrl computes, with and without the
importance-sampling correction (which vlrl applied before by folding its weights into TRL's advantages)."""

import math
from dataclasses import replace

import pytest
import torch

from vlrl.base.errors import ConfigError
from vlrl.training.loss import REDUCTIONS, SCORER_INPUTS, gspo_loss, masked_totals, reduce_metrics
from vlrl.training.mismatch import tis_weights


def reference_loss(logps, old, advantages, mask, *, loss_type, level, low, high, max_length=None, batch_tokens=None,
                   accumulation=1, sampler=None, correction="off", cap=2.0, weight=1.0):
    """GSPO's (or GRPO's) clipped objective from its definition, in plain Python over completions and tokens."""
    rows = []
    for i in range(logps.shape[0]):
        tokens = [t for t in range(logps.shape[1]) if mask[i, t]]
        mean_log_ratio = sum(logps[i, t] - old[i, t] for t in tokens) / max(len(tokens), 1)
        mean_log_is = sum(old[i, t] - sampler[i, t] for t in tokens) / max(len(tokens), 1) if sampler is not None else 0
        losses = []
        for t in tokens:
            ratio = torch.exp(mean_log_ratio if level == "sequence" else logps[i, t] - old[i, t])
            a = advantages[i]
            if correction == "token":
                a = a * torch.clamp(torch.exp(old[i, t] - sampler[i, t]), max=cap)
            elif correction == "sequence":
                a = a * torch.clamp(torch.exp(mean_log_is), max=cap)
            losses.append(-torch.min(ratio * a, torch.clamp(ratio, 1 - low, 1 + high) * a))
        rows.append(losses)
    total = sum(sum(r) for r in rows)
    if loss_type == "grpo":  # each completion's mean, averaged over completions
        loss = sum(sum(r) / max(len(r), 1) for r in rows) / len(rows)
    elif loss_type == "luspo":  # each completion's sum, averaged
        loss = total / len(rows)
    elif loss_type == "bnpo":  # over the micro-batch's tokens
        loss = total / max(sum(len(r) for r in rows), 1)
    elif loss_type == "dr_grpo":  # over a constant: completions x the whole completion budget
        loss = total / (len(rows) * max_length)
    else:  # dapo: over the generation batch's tokens, counted outside
        return total / batch_tokens * weight
    return loss / accumulation * weight


def _tensors(seed=0, rows=5, width=7):
    generator = torch.Generator().manual_seed(seed)
    logps = -torch.rand(rows, width, generator=generator, dtype=torch.float64) * 3
    old = logps + torch.randn(rows, width, generator=generator, dtype=torch.float64) * 0.3  # a rollout some steps old
    sampler = old + torch.randn(rows, width, generator=generator, dtype=torch.float64) * 0.3
    mask = (torch.rand(rows, width, generator=generator) < 0.8).long()
    mask[-1] = 0  # a completion with no token that trains
    advantages = torch.randn(rows, generator=generator, dtype=torch.float64)
    return logps, old, sampler, mask, advantages


@pytest.mark.parametrize("loss_type", sorted(REDUCTIONS))
@pytest.mark.parametrize("level,correction", [("sequence", "off"), ("sequence", "token"), ("sequence", "sequence"),
                                              ("token", "off"), ("token", "token")])
def test_the_loss_is_its_definition(loss_type, level, correction):
    logps, old, sampler, mask, advantages = _tensors()
    logps.requires_grad_(True)
    settings = {"loss_type": loss_type, "level": level}
    sizes = {"max_completion_length": 9, "batch_tokens": 40.0, "accumulation_steps": 2}
    loss, _ = gspo_loss(logps, old, advantages, mask, epsilon_low=0.1, epsilon_high=0.15, sampler_logps=sampler,
                        correction=correction, cap=1.2, pass_weight=0.375, **settings, **sizes)
    expected = reference_loss(logps, old, advantages, mask, low=0.1, high=0.15, max_length=9, batch_tokens=40.0,
                              accumulation=2, sampler=sampler, correction=correction, cap=1.2, weight=0.375,
                              **settings)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-12, abs=1e-15) and loss.item() != 0
    grad, = torch.autograd.grad(loss, logps)
    expected_grad, = torch.autograd.grad(expected, logps)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-10, atol=1e-14)
    assert grad.abs().sum() > 0 and (grad[mask == 0] == 0).all()  # only the masked-in tokens train


def test_the_clip_ratios_count_the_clipped_completions():
    logps, old, _, mask, _ = _tensors()
    advantages = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0], dtype=torch.float64)
    _, metrics = gspo_loss(logps, old, advantages, mask, epsilon_low=0.05, epsilon_high=0.05,
                           max_completion_length=9)
    tokens = mask.sum(1).clamp(min=1)
    ratio = torch.exp(((logps - old) * mask).sum(1) / tokens)
    low = [float(r < 0.95 and a < 0) for r, a in zip(ratio, advantages)]  # a completion's ratio, the sign of its A
    high = [float(r > 1.05 and a > 0) for r, a in zip(ratio, advantages)]
    assert 0 < sum(low) + sum(high) < len(low)  # some clipped, some not
    logged = reduce_metrics(metrics, lambda t, _: t, lambda t: t)  # one process
    assert logged["clip_ratio/low_mean"] == pytest.approx(sum(low) / 5)
    assert logged["clip_ratio/high_mean"] == pytest.approx(sum(high) / 5)
    assert logged["clip_ratio/region_mean"] == pytest.approx((sum(low) + sum(high)) / 5)
    assert (logged["clip_ratio/low_min"], logged["clip_ratio/high_max"]) == (min(low), max(high))
    entropy = reduce_metrics({"entropy": masked_totals(torch.ones(2, 3), torch.tensor([[1, 1, 0], [0, 0, 0]]))},
                             lambda t, _: t, lambda t: t)
    assert entropy == {"entropy": 1.0}  # a mean over the masked tokens only


def test_what_the_loss_does_not_compute_is_said_in_one_line():
    logps, old, _, mask, advantages = _tensors()
    with pytest.raises(ConfigError, match="loss type 'cispo'"):
        gspo_loss(logps, old, advantages, mask, loss_type="cispo")
    with pytest.raises(ConfigError, match="needs max_completion_length"):
        gspo_loss(logps, old, advantages, mask, loss_type="dr_grpo")
    with pytest.raises(ConfigError, match="level 'tokens'"):
        gspo_loss(logps, old, advantages, mask, level="tokens", max_completion_length=4)


# --- vlrl's trainer against TRL's own loss, on the tiny model ---------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_trainer(tiny_dir, tmp_path_factory):
    """The tiny single-turn trainer and one generated batch of 2 groups of 4 (sampled at temperature 2, so the
    rollout's log-probs differ from the training forward's and the correction has something to correct)."""
    from vlrl.base import synthetic
    from vlrl.config import runfile as cfg
    from vlrl.model import loading, prompts
    from vlrl.training import train

    config = cfg.preset("tiny", overrides=["training.max_steps=1", "training.max_completion_length=24"])
    policy, processor = loading.load_model(str(tiny_dir), lora=loading.LoraSettings(r=8, alpha=16))
    rows = prompts.to_dataset(synthetic.generate(8, seed=5, image_size=64))
    trainer = train.build_trainer(config, policy, processor, rows, tmp_path_factory.mktemp("run"),
                                  log=lambda *_: None)
    trainer.rollout_decoding = replace(trainer.rollout_decoding, temperature=2.0)
    torch.manual_seed(0)
    batch = trainer.generate_and_score([rows[i] for i in (0, 1) for _ in range(4)])
    batch["advantages"] = torch.linspace(-1, 1.5, 8)  # any advantages (the tiny model's rewards may all tie)
    lengths = batch["completion_mask"].sum(1) - 2 * torch.arange(8)  # completions of 8 lengths, as if they stopped
    kept = torch.arange(batch["completion_mask"].size(1)) < lengths[:, None]
    batch["completion_mask"] = batch["completion_mask"] * kept
    policy.train()
    trainer.current_gradient_accumulation_steps = 2  # what the training loop sets
    trainer.epsilon_low = trainer.epsilon_high = 0.01  # a clip range the rollout's drift below crosses for some
    return trainer, batch


def _loss_and_logged(trainer, function, batch):
    """`function`'s loss, its gradient over the LoRA weights, and the metrics it logged."""
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    before = {k: len(v) for k, v in trainer.train_metrics.items()}
    loss = function(trainer.model, batch)
    grads = torch.autograd.grad(loss, params)
    logged = {k: v[before.get(k, 0):] for k, v in trainer.train_metrics.items() if v[before.get(k, 0):]}
    return loss, grads, logged


@pytest.mark.slow
@pytest.mark.parametrize("loss_type", sorted(REDUCTIONS))
@pytest.mark.parametrize("correction", ["off", "token", "sequence"])
def test_the_trainers_loss_is_trls_on_the_tiny_model(tiny_trainer, loss_type, correction):
    from vlrl.training.trl_bridge import TrlHooks

    trainer, batch = tiny_trainer
    trainer.loss_type, trainer.importance_sampling_correction = loss_type, correction
    batch = dict(batch)
    with torch.no_grad():  # the rollout policy a few updates back: ratios away from 1, so some completions clip
        current, *_ = trainer.token_logps(trainer.model, torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1),
                                          torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1),
                                          batch["completion_ids"].size(1),
                                          **{key: batch.get(key) for key in SCORER_INPUTS})
    batch["old_per_token_logps"] = current + 0.05 * torch.randn(current.shape, generator=torch.Generator().manual_seed(1))
    mask = batch["completion_mask"]
    if correction != "off":  # the cap at the median ratio: truncation acts on about half of the tokens (sequences)
        raw = tis_weights(batch["old_per_token_logps"], batch["sampling_per_token_logps"], mask, correction, math.inf)
        trainer.importance_sampling_cap = (raw[mask.bool()] if correction == "token" else raw).median().item()
    ours, our_grads, our_metrics = _loss_and_logged(trainer, trainer.policy_loss, batch)
    # TRL's own loss on the same inputs, the correction applied as vlrl did before: its weights folded into the
    # advantages TRL reads (TRL's per-token loss is linear in a non-negative advantage weight)
    folded = dict(batch)
    if correction != "off":
        cap = trainer.importance_sampling_cap
        weights = tis_weights(batch["old_per_token_logps"], batch["sampling_per_token_logps"], mask, correction, cap)
        assert (weights < cap).any() and (weights == cap).any()  # the cap acts on some, not all
        folded["advantages"] = batch["advantages"].unsqueeze(1) * weights
    theirs, their_grads, their_metrics = _loss_and_logged(trainer, lambda m, b: TrlHooks.policy_loss(trainer, m, b),
                                                          folded)
    print(f"{loss_type} {correction}: vlrl {ours.item():.9g}, TRL {theirs.item():.9g}")
    assert ours.item() == theirs.item() and ours.item() != 0
    for got, want in zip(our_grads, their_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-9)
    measured = {k for k in our_metrics if k.startswith("sampling/")}  # the mismatch, on the trainer's forward
    assert measured and {k: v for k, v in our_metrics.items() if k not in measured} == their_metrics
    assert {"entropy", "clip_ratio/region_mean"} <= set(their_metrics)
    assert 0 < our_metrics["clip_ratio/region_mean"][0] < 1  # some completions clipped, some not


@pytest.mark.slow
def test_the_loss_forward_scores_through_the_chunked_head_as_trls_full_logits_do(tiny_trainer):
    """`vlrl.training.chunked_scoring`: the loss's forward (no `batch_size`) never builds [tokens x vocabulary]
    logits, and gives TRL's full-logits numbers (log-probs, entropies, gradient) with the placeholders masked as the
    full path masks them; a forward scored in chunks of rows (the old log-probs') stays TRL's."""
    from vlrl.training import mismatch
    from vlrl.training.trl_bridge import TrlHooks

    trainer, batch = tiny_trainer
    args = (torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1),
            torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1), batch["completion_ids"].size(1))
    fields = {key: batch.get(key) for key in SCORER_INPUTS}
    head, params = trainer.model.get_output_embeddings(), [p for p in trainer.model.parameters() if p.requires_grad]
    shapes = []
    hook = head.register_forward_hook(lambda module, inputs, output: shapes.append(output.shape))
    try:
        with mismatch.masked(trainer.model, trainer.suppressed_token_ids):  # as RolloutMismatch scores the loss's
            ours, our_entropies, _ = trainer.token_logps(trainer.model, *args, compute_entropy=True, **fields)
            assert shapes == []  # the head's forward (the whole logits) never ran
            theirs, their_entropies, _ = TrlHooks.token_logps(trainer, trainer.model, *args, compute_entropy=True,
                                                              **fields)
            assert len(shapes) == 1 and shapes[0][-1] == head.weight.shape[0]
            rows, _ = trainer.token_logps(trainer.model, *args, batch_size=4, **fields)[:2]  # TRL's, 4 rows a chunk
    finally:
        hook.remove()
    mask = batch["completion_mask"].bool()
    assert ours.shape == theirs.shape == mask.shape and (ours[~mask] == 0).all()
    torch.testing.assert_close(ours[mask], theirs[mask], rtol=0, atol=2e-5)
    torch.testing.assert_close(our_entropies[mask], their_entropies[mask], rtol=1e-3, atol=1e-5)  # logged only
    assert not our_entropies.requires_grad and len(shapes) == 3  # two chunks of 4 rows through TRL's full path
    torch.testing.assert_close(rows[mask], theirs[mask].detach())
    weights = torch.linspace(-1, 1, mask.numel()).view(mask.shape) * mask  # any loss of the log-probs
    ours_grad = torch.autograd.grad((ours * weights).sum(), params)
    theirs_grad = torch.autograd.grad((theirs * weights).sum(), params)
    got, want = torch.cat([g.flatten() for g in ours_grad]), torch.cat([g.flatten() for g in theirs_grad])
    assert want.norm() > 0 and (got - want).norm() <= 1e-4 * want.norm()  # float32 rounding of two summation orders


@pytest.mark.slow
def test_what_vlrls_loss_leaves_out_is_refused_when_the_trainer_is_built(tiny_dir, tmp_path):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from vlrl.model import loading
    from vlrl.training import loss, mismatch, trl_bridge

    policy, processor = loading.load_model(str(tiny_dir), lora=loading.LoraSettings(r=8, alpha=16))
    built = trl_bridge.trainer_class(GRPOTrainer, (mismatch.RolloutMismatch, loss.GspoLoss))
    args = GRPOConfig(str(tmp_path), beta=0.04, loss_type="cispo", use_cpu=True, report_to="none",
                      per_device_train_batch_size=4, num_generations=4)
    with pytest.raises(ConfigError) as err:
        built(model=policy, reward_funcs=[lambda completions, **_: [0.0] * len(completions)], args=args,
              train_dataset=Dataset.from_list([{"prompt": "x"}]), processing_class=processor)
    assert "\n" not in str(err.value) and "'beta': 0.04" in str(err.value) and "'loss_type': 'cispo'" in str(err.value)
