"""The GSPO loss as one pure function (`gspo_loss`): log-probs, advantages and a mask in, the loss and its metrics out.

The objective is TRL's GRPOTrainer loss at the recipe's settings (no KL term, no entropy bonus, no entropy or
off-policy mask), written out so that what vlrl adds to it stands in the same place: the sequence-level ratio of GSPO
(one ratio a completion, exp of the mean over its tokens of logp - old_logp), the clip range, the reduction of the
recipe's `loss_type`, the truncated importance sampling that corrects for the rollout/training mismatch
(`vlrl.training.mismatch.tis_weights`), and an episode run's pass weights (`pass_weight`). prime-rl's
`trainer/rl/loss.py` is the model. tests/test_loss.py holds it to a reference written out from the definitions and
to TRL's own loss on the tiny model's tensors.

`GspoLoss`, mixed into vlrl's trainer (`vlrl.training.trl_bridge.trainer_class`), is the trainer's side: the
forward that scores the completions (through the bridge's `token_logps`, so the mismatch measurement and an episode
pass's segment forward apply), the function, and TRL's metrics of it logged under TRL's names.
"""

from __future__ import annotations

import math

import torch

from vlrl.base.errors import ConfigError
from vlrl.training.mismatch import tis_weights

# The loss types `gspo_loss` computes, by what their reduction divides by: each completion's loss averaged over the
# completions (rows), the micro-batch's completion tokens (tokens), or a count over the whole generation batch
# (batch). TRL's other types (cispo, sapo, vespo) have another per-token loss.
REDUCTIONS = {"grpo": "rows", "dr_grpo": "rows", "luspo": "rows", "bnpo": "tokens", "dapo": "batch"}
# TRL's GRPOConfig settings that `gspo_loss` leaves out, at the value that switches each off (the recipe's)
LEFT_OUT = {"beta": 0.0, "top_entropy_quantile": 1.0, "off_policy_mask_threshold": None, "delta": None,
            "entropy_coef": 0.0, "use_adaptive_entropy": False}
# What TRL's loss hands its per-token scorer besides the token ids (TRL 1.14.2's batch keys)
SCORER_INPUTS = ("pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes",
                 "num_tiles", "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids")
# ... and a video item's clip, which TRL's scorer does not take: given only when the batch has one, for
# `vlrl.training.video_inputs` to feed the forward
VIDEO_INPUTS = ("pixel_values_videos", "video_grid_thw")


def gspo_loss(logps: torch.Tensor, old_logps: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *,
              loss_type: str = "dr_grpo", level: str = "sequence", epsilon_low: float = 0.2,
              epsilon_high: float = 0.2, max_completion_length: int | None = None,
              batch_tokens: torch.Tensor | float | None = None, accumulation_steps: int = 1,
              sampler_logps: torch.Tensor | None = None, correction: str = "off", cap: float = 2.0,
              pass_weight: float = 1.0) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One micro-batch's loss, as TRL's GRPOTrainer computes it for `loss_type`, with vlrl's correction and weight.

    Args:
        logps: (B, T) log-probs of the completion tokens under the policy, with gradient.
        old_logps: (B, T) the same at the rollout's weights (`logps.detach()` when a rollout is one optimizer step).
        advantages: (B,) each completion's advantage ((B, T) is taken as it is).
        mask: (B, T) 1 on the completion tokens that train.
        loss_type: a key of `REDUCTIONS`. level: "sequence" (GSPO: one ratio a completion) or "token" (GRPO).
        epsilon_low, epsilon_high: the clip range [1 - epsilon_low, 1 + epsilon_high] of the ratio.
        max_completion_length: dr_grpo's constant divisor (a completion's whole budget).
        batch_tokens: dapo's divisor, TRL's `num_items_in_batch` rescaled to one process's accumulation window.
        accumulation_steps: micro-batches per optimizer step; the loss is divided by it (dapo's batch_tokens counts
            them already).
        sampler_logps, correction, cap: with correction "token" or "sequence", each token's loss times the truncated
            ratio min(exp(old_logps - sampler_logps), cap) of the token or of its sequence (`tis_weights`).
        pass_weight: the share of its micro-batch's loss this part is (an episode run's passes, `pass_weight`).

    Returns:
        (loss, metrics): the scalar loss, and TRL's clip ratios of the micro-batch, to be reduced over processes
        (`reduce_metrics`): a name ending in _min or _max holds one value a completion, any other [sum, count].

    >>> logps = torch.tensor([[-1.0, -2.0], [-0.5, -0.5]])
    >>> loss, m = gspo_loss(logps, logps, torch.tensor([1.0, -1.0]), torch.tensor([[1, 1], [1, 0]]),
    ...                     max_completion_length=4)
    >>> loss.item(), m["clip_ratio/region_mean"].tolist()     # ratio 1: -(2 x 1 - 1 x 1) / (2 x 4)
    (-0.125, [0.0, 2.0])
    """
    if loss_type not in REDUCTIONS:
        raise ConfigError(f"loss type {loss_type!r}: vlrl's loss computes {', '.join(REDUCTIONS)}; choose one of them.")
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    if sampler_logps is not None and correction != "off":
        advantages = advantages * tis_weights(old_logps, sampler_logps, mask, correction, cap)  # weights >= 0
    log_ratio = logps - old_logps
    if level == "sequence":
        log_ratio = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    elif level != "token":
        raise ConfigError(f"importance sampling level {level!r} is unknown; use 'sequence' or 'token'.")
    ratio = torch.exp(log_ratio)
    clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
    per_token = -torch.min(ratio * advantages, clipped * advantages)
    if loss_type == "grpo":
        loss = ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    elif loss_type == "luspo":
        loss = (per_token * mask).sum(-1).mean()
    elif loss_type == "bnpo":
        loss = (per_token * mask).sum() / mask.sum().clamp(min=1.0)
    elif loss_type == "dr_grpo":
        loss = (per_token * mask).sum() / (per_token.size(0) * _given(max_completion_length, "max_completion_length"))
    if loss_type == "dapo":
        loss = (per_token * mask).sum() / _given(batch_tokens, "batch_tokens")
    else:
        loss = loss / accumulation_steps
    low = (ratio < 1 - epsilon_low) & (advantages < 0)
    high = (ratio > 1 + epsilon_high) & (advantages > 0)
    metrics = {"clip_ratio/low_mean": masked_totals(low.float(), mask),
               "clip_ratio/high_mean": masked_totals(high.float(), mask),
               "clip_ratio/region_mean": masked_totals((low | high).float(), mask),
               "clip_ratio/low_min": _per_completion(low.float(), mask),
               "clip_ratio/high_max": _per_completion(high.float(), mask)}
    return loss * pass_weight, metrics


def scorer_args(inputs: dict) -> tuple[torch.Tensor, torch.Tensor, int, dict]:
    """What the per-token scorer (`token_logps`) takes for a batch of TRL's: prompt + completion ids, their attention
    mask, the completion length, and the batch's `SCORER_INPUTS` (None where the batch has none), with its
    `VIDEO_INPUTS` where it has them."""
    completion_ids = inputs["completion_ids"]
    return (torch.cat([inputs["prompt_ids"], completion_ids], dim=1),
            torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1), completion_ids.size(1),
            {**{key: inputs.get(key) for key in SCORER_INPUTS},
             **{key: inputs[key] for key in VIDEO_INPUTS if inputs.get(key) is not None}})


def _given(value, name: str):
    if value is None:
        raise ConfigError(f"gspo_loss needs {name} for this loss type.")
    return value


def masked_totals(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[sum, count] of `values` over the masked tokens, or over the completions when `values` has one a completion
    ((B, 1)): a mean that adds over micro-batches and processes."""
    if values.shape[1] == 1:
        return torch.stack([values.sum(), torch.tensor(float(values.shape[0]), device=values.device)])
    return torch.stack([(values * mask).sum(), mask.sum().float()])


def _per_completion(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    if values.shape[1] == 1:
        return values.squeeze(1)
    return (values * mask).sum(-1) / mask.sum(-1)  # NaN for a completion without a token: left out when reduced


def reduce_metrics(metrics: dict[str, torch.Tensor], reduce, gather) -> dict[str, float]:
    """The logged numbers of `metrics` (`gspo_loss`'s form) over processes: `reduce(tensor, "sum")` and
    `gather(tensor)` are the accelerator's. [sum, count] pairs give sum / count; per-completion values their smallest
    (_min) or largest (_max), NaN left out (NaN when nothing is left)."""
    out = {}
    for name, value in metrics.items():
        if name.endswith(("_min", "_max")):
            values = gather(value)
            values = values[~torch.isnan(values)]
            extreme = values.min() if name.endswith("_min") else values.max()
            out[name] = extreme.item() if values.numel() else math.nan
        else:
            total = reduce(value, "sum")
            out[name] = (total[0] / total[1].clamp(min=1.0)).item()
    return out


class GspoLoss:
    """Mixed into vlrl's trainer, innermost (`vlrl.training.train.build_trainer`): TRL's loss hook computes
    `gspo_loss` on the completions' forward and logs TRL's metrics of it (entropy, clip ratios). The correction reads
    `importance_sampling_correction` / `importance_sampling_cap`, `RolloutMismatch`'s settings; an episode pass's
    inputs carry its `pass_weight`. A GRPOConfig that asks for what `gspo_loss` leaves out (`LEFT_OUT`, a loss type
    outside `REDUCTIONS`, vLLM's own correction, a router's auxiliary loss) is refused when the trainer is built."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        asked = {k: getattr(self.args, k) for k, off in LEFT_OUT.items() if getattr(self.args, k, off) != off}
        if self.loss_type not in REDUCTIONS:
            asked["loss_type"] = self.loss_type
        if self.use_vllm and self.args.vllm_importance_sampling_correction:
            asked["vllm_importance_sampling_correction"] = True
        if self.aux_loss_enabled:
            asked["router_aux_loss_coef"] = self.router_aux_loss_coef
        if asked:
            raise ConfigError(f"vlrl's GSPO loss (vlrl.training.loss) does not compute {asked}; leave them at the "
                              f"recipe's values (vlrl.config.recipe), with a loss type among {', '.join(REDUCTIONS)}.")

    def policy_loss(self, model, inputs: dict) -> torch.Tensor:
        completion_mask = inputs["completion_mask"]
        mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]  # tools out
        input_ids, attention_mask, length, extra = scorer_args(inputs)
        logps, entropies, _ = self.token_logps(model, input_ids, attention_mask, length, compute_entropy=True, **extra)
        old_logps = inputs.get("old_per_token_logps")
        training = self.model.training
        accumulation = self.current_gradient_accumulation_steps if training else 1  # no accumulation in eval
        batch_tokens = None
        if self.loss_type == "dapo":  # TRL's count spans the generation batch: rescaled to one accumulation window
            batch_tokens = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes
            if training:
                batch_tokens = batch_tokens * accumulation / self.args.steps_per_generation
        loss, metrics = gspo_loss(
            logps, logps.detach() if old_logps is None else old_logps, inputs["advantages"], mask,
            loss_type=self.loss_type, level=self.importance_sampling_level, epsilon_low=self.epsilon_low,
            epsilon_high=self.epsilon_high, max_completion_length=self.max_completion_length,
            batch_tokens=batch_tokens, accumulation_steps=accumulation,
            sampler_logps=None if self.use_vllm else inputs.get("sampling_per_token_logps"),  # vLLM: TRL's own
            correction=self.importance_sampling_correction, cap=self.importance_sampling_cap,
            pass_weight=inputs.get("pass_weight", 1.0))
        if training:
            totals = {"entropy": masked_totals(entropies, mask), **metrics}
            for name, value in reduce_metrics(totals, self.accelerator.reduce, self.accelerator.gather).items():
                self.log_metric(name, value)
        return loss
