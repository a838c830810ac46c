"""The rollout/training mismatch: the log-probability each sampled token had where generation drew it, against the
one the loss trains with, measured every optimizer step and, when asked, corrected by truncated importance sampling.

vlrl decodes through another code path than its training forward (compiled static-cache decoding in bf16 on 4-bit
weights, against an eager forward with gradient checkpointing), while GSPO's on-policy ratio assumes both give the
same distribution. RLinf saw a Qwen3-VL GRPO run's reward collapse without truncated importance sampling (TIS), and
TRL corrects only vLLM rollouts. So on the transformers backend vlrl's trainer has `RolloutMismatch` mixed in, which

- decodes its rollouts through the decoding engine (`vlrl.engine`), which records each sampled token's
  log-probability under the distribution it was drawn from (the vision placeholders masked, the temperature and the
  thinking budget applied), one value per token: memory stays flat in completion length, and logs the seconds of
  each optimizer step spent generating (`rollout_time`, beside TRL's `step_time`; episode runs count their play);
- logs the mismatch against the training forward at the rollout's weights (`METRICS`), once per optimizer step;
- with `[training] importance_sampling_correction = "token"` or `"sequence"`, has the loss weight each token's loss
  by the truncated ratio min(pi_train / pi_rollout, importance_sampling_cap), detached (`tis_weights`, applied by
  `vlrl.training.loss.gspo_loss`).

    >>> train, rollout, mask = torch.tensor([[0.0, -1.0]]), torch.tensor([[-1.0, -1.0]]), torch.ones(1, 2)
    >>> tis_weights(train, rollout, mask, "token", cap=2.0)          # ratios e and 1; e is truncated to 2
    tensor([[2., 1.]])
    >>> tis_weights(train, rollout, mask, "sequence", cap=2.0)       # the geometric mean, e ** 0.5
    tensor([[1.6487]])
"""

from __future__ import annotations

import contextlib
import time

import torch

from vlrl import engine
from vlrl.model.vision_tokens import MASKED_LOGIT, mask_tokens

# What the trainer adds to each logged step; delta = log pi_train - log pi_rollout of a sampled completion token.
METRICS = {
    "sampling/rollout_train_kl": "KL(rollout || train), the k3 estimator exp(delta) - 1 - delta, mean over tokens",
    "sampling/sampling_logp_difference/mean": "mean |delta| over completion tokens (TRL's name for the same number)",
    "sampling/sampling_logp_difference/max": "largest |delta|",
    "sampling/train_rollout_ratio/mean": "mean per-token ratio pi_train / pi_rollout = exp(delta), before truncation",
    "sampling/train_rollout_ratio/min": "smallest per-token ratio",
    "sampling/train_rollout_ratio/max": "largest per-token ratio",
    "sampling/train_rollout_ratio/above_cap": "share of tokens whose ratio exceeds importance_sampling_cap",
    "sampling/importance_sampling_ratio/mean": "(correction on) mean weight applied: per token, or per sequence",
    "sampling/importance_sampling_ratio/min": "(correction on) smallest weight applied",
    "sampling/importance_sampling_ratio/max": "(correction on) largest weight applied (at most the cap)",
}


def tis_weights(train_logps: torch.Tensor, rollout_logps: torch.Tensor, mask: torch.Tensor, level: str,
                cap: float) -> torch.Tensor:
    """The TIS weight of each token, or of each sequence: the ratio pi_train / pi_rollout truncated at `cap`.

    Args:
        train_logps, rollout_logps: (B, T) log-probs of the sampled tokens: the training forward's at the rollout's
            weights, and generation's.
        mask: (B, T), 1 on completion tokens.
        level: "token" gives (B, T) weights; "sequence" gives (B, 1), from the geometric mean of the sequence's
            token ratios, as GSPO's own sequence ratio is (TRL's vLLM "sequence_truncate" multiplies them, which
            puts nearly every long completion at the cap or near 0).
        cap: the truncation C (>= 1, so on-policy tokens keep weight 1).

    Returns:
        The weights, without gradient.
    """
    log_ratio = ((train_logps - rollout_logps) * mask).detach()
    if level == "sequence":
        log_ratio = log_ratio.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)
    elif level != "token":
        raise ValueError(f"importance sampling level {level!r} is unknown; use 'token' or 'sequence'.")
    return log_ratio.exp().clamp(max=cap)


def mismatch_totals(train_logps: torch.Tensor, rollout_logps: torch.Tensor, mask: torch.Tensor, cap: float,
                    weights: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One micro-batch's sums and extremes, which add (sums) and max (extremes) over the micro-batches of an
    optimizer step and over processes; `mismatch_metrics` turns them into the logged numbers. In float64: the k3
    estimator of two nearly equal distributions is a difference of nearly equal numbers."""
    keep = mask.bool()
    delta = (train_logps.detach() - rollout_logps).double()[keep]
    ratio = delta.exp()
    applied = torch.zeros(0, dtype=torch.float64, device=delta.device)
    if weights is not None:
        applied = (weights[keep] if weights.shape == mask.shape else weights.flatten()).double()
    sums = torch.stack([_count(delta), (torch.expm1(delta) - delta).sum(), delta.abs().sum(), ratio.sum(),
                        (ratio > cap).sum().double(), applied.sum(), _count(applied)])
    extremes = torch.stack([_most(delta.abs()), _most(ratio), _most(-ratio), _most(applied), _most(-applied)])
    return sums, extremes


def _count(values: torch.Tensor) -> torch.Tensor:
    return torch.tensor(float(values.numel()), dtype=torch.float64, device=values.device)


def _most(values: torch.Tensor) -> torch.Tensor:
    return values.max() if values.numel() else torch.tensor(-torch.inf, dtype=values.dtype, device=values.device)


def mismatch_metrics(sums: torch.Tensor, extremes: torch.Tensor) -> dict[str, float]:
    """The logged numbers (`METRICS`) from the totals of `mismatch_totals`; {} when no token was seen.

    >>> sums, extremes = mismatch_totals(torch.tensor([[0.0, -1.0]]), torch.tensor([[-1.0, -1.0]]), torch.ones(1, 2),
    ...                                  cap=2.0)
    >>> m = mismatch_metrics(sums, extremes)
    >>> round(m["sampling/rollout_train_kl"], 4), m["sampling/train_rollout_ratio/above_cap"]
    (0.3591, 0.5)
    """
    tokens, kl, difference, ratio, above_cap, applied, weighted = sums.tolist()
    largest_difference, largest_ratio, smallest_ratio, largest_weight, smallest_weight = extremes.tolist()
    if not tokens:
        return {}
    metrics = {
        "sampling/rollout_train_kl": kl / tokens,
        "sampling/sampling_logp_difference/mean": difference / tokens,
        "sampling/sampling_logp_difference/max": largest_difference,
        "sampling/train_rollout_ratio/mean": ratio / tokens,
        "sampling/train_rollout_ratio/min": -smallest_ratio,
        "sampling/train_rollout_ratio/max": largest_ratio,
        "sampling/train_rollout_ratio/above_cap": above_cap / tokens,
    }
    if weighted:
        metrics.update({"sampling/importance_sampling_ratio/mean": applied / weighted,
                        "sampling/importance_sampling_ratio/min": -smallest_weight,
                        "sampling/importance_sampling_ratio/max": largest_weight})
    return metrics


class RolloutMismatch:
    """Mixed into vlrl's trainer (`vlrl.training.trl_bridge.trainer_class`), outermost: generation returns each
    sampled token's log-prob, and the loss's forward measures the mismatch. Its settings,
    `importance_sampling_correction` ("off", "token" or "sequence") truncated at `importance_sampling_cap`, are
    what the loss (`vlrl.training.loss.GspoLoss`) corrects with. With vLLM generation it stands aside: TRL records
    and corrects those rollouts itself.

    Where the training log-probs come from: TRL computes them at the rollout's weights (`old_per_token_logps`) only
    when a rollout spans optimizer steps; otherwise the loss's own forward runs at those weights, and its detached
    log-probs are the same numbers, without another forward pass. So the loss's forward is intercepted
    (`token_logps`) and measured there, once per micro-batch (or per pass of an episode run's micro-batch).
    """

    importance_sampling_correction = "off"
    importance_sampling_cap = 2.0
    rollout_decoding: engine.Decoding | None = None  # how rollouts decode (`vlrl.training.train.build_trainer` sets it)
    _loss_inputs = None  # the batch whose loss is being computed, until its forward has run
    _totals = None  # this optimizer step's (sums, extremes) so far
    _more_passes = False  # a micro-batch computed in several passes (episode runs): not its last pass yet
    _rollout_seconds = 0.0  # this optimizer step's time spent generating so far (`rollout_time`)
    _decode_parts = None  # this optimizer step's engine decodes so far: [prefill seconds, decoding seconds, steps]

    @property
    def suppressed_token_ids(self) -> tuple[int, ...]:
        """What rollouts never sample (image and video placeholders): the loss masks them too (`masked`)."""
        return self.rollout_decoding.suppress_ids if self.rollout_decoding is not None else ()

    def training_step(self, model, inputs, num_items_in_batch):
        """TRL's step, and at each optimizer step's end `rollout_time`: the seconds of that step spent generating
        (decoding rollouts, or playing episodes), beside TRL's `step_time`; for rollouts through vlrl's engine also
        `rollout/prefill_time` (the pictures' encoder and the contexts' forward) and `rollout/decode_ms_per_step`
        (one decoding step of the batch, timed on the device: what issue 50 compares with the weights' read bound)."""
        output = super().training_step(model, inputs, num_items_in_batch)
        if self.micro_step % self.current_gradient_accumulation_steps == 0:  # TRL's rule for its step_time
            self.log_metric("rollout_time", self._rollout_seconds)
            self._rollout_seconds = 0.0
            if self._decode_parts is not None:
                prefill_s, decode_s, steps = self._decode_parts
                self.log_metric("rollout/prefill_time", prefill_s)
                if steps:
                    self.log_metric("rollout/decode_ms_per_step", 1000 * decode_s / steps)
                self._decode_parts = None
        return output

    def generate_rollouts(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        started = time.perf_counter()
        try:
            return self._generate_timed(prompt_ids, images, multimodal_fields, num_generations, has_tool_images)
        finally:
            self._rollout_seconds += time.perf_counter() - started

    def _generate_timed(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images):
        if (self.use_vllm or self.use_transformers_continuous_batching or has_tool_images
                or self.rollout_decoding is None):  # TRL's own paths; None: not built by `vlrl.training.train.build_trainer`
            return super().generate_rollouts(prompt_ids, images, multimodal_fields, num_generations, has_tool_images)
        # onto the device, as TRL does (the Trainer's own preparation: GRPOTrainer's buffers whole generation batches)
        inputs = self.to_device(rollout_inputs(prompt_ids, multimodal_fields, self.rollout_decoding.pad_id))
        with self.policy_for_generation() as policy:
            out = engine.decode(policy, inputs, self.rollout_decoding)
        self.add_decode_parts(out.stats["prefill_s"], out.stats["decode_s"], out.stats["steps"])
        return out.tokens, out.logps

    def add_decode_parts(self, prefill_s: float, decode_s: float, steps: int) -> None:
        """Adds an engine decode's prefill and decoding-step times (`engine.Decoded.stats`, a `Session`'s counters)
        to this optimizer step's, logged at its end (`training_step`)."""
        parts = self._decode_parts or [0.0, 0.0, 0]
        self._decode_parts = [parts[0] + prefill_s, parts[1] + decode_s, parts[2] + steps]

    def policy_loss(self, model, inputs):
        if self.use_vllm or "sampling_per_token_logps" not in inputs:
            return super().policy_loss(model, inputs)
        self._loss_inputs = inputs  # measured against by the loss's forward (`token_logps`)
        try:
            return super().policy_loss(model, inputs)
        finally:
            self._loss_inputs = None

    def token_logps(self, model, *args, **kwargs):
        with masked(self.accelerator.unwrap_model(model), self.suppressed_token_ids):
            result = super().token_logps(model, *args, **kwargs)
        inputs, self._loss_inputs = self._loss_inputs, None
        if inputs is not None:  # the loss's own forward, at the current weights
            self._measure(inputs, result[0].detach())
        return result

    def _measure(self, inputs: dict, current_logps: torch.Tensor) -> None:
        """Adds the micro-batch's mismatch (and the weights the loss corrects it with) to the optimizer step's."""
        mask = inputs["completion_mask"] * inputs.get("tool_mask", 1)  # as TRL's loss masks (tool results out)
        old = inputs.get("old_per_token_logps")
        train = current_logps if old is None else old  # at the rollout's weights either way
        rollout = inputs["sampling_per_token_logps"]
        weights = None
        if self.importance_sampling_correction != "off":  # what `gspo_loss` multiplies each token's loss by
            weights = tis_weights(train, rollout, mask, self.importance_sampling_correction,
                                  self.importance_sampling_cap)
        if self.model.training:
            self._add(mismatch_totals(train, rollout, mask, self.importance_sampling_cap, weights))

    def _add(self, totals: tuple[torch.Tensor, torch.Tensor]) -> None:
        if self._totals is not None:
            totals = (self._totals[0] + totals[0], torch.maximum(self._totals[1], totals[1]))
        self._totals = totals
        if self.accelerator.sync_gradients and not self._more_passes:  # the step's last micro-batch: one value
            sums = self.accelerator.reduce(totals[0], reduction="sum")
            extremes = self.accelerator.gather(totals[1]).view(-1, totals[1].numel()).amax(dim=0)
            for name, value in mismatch_metrics(sums, extremes).items():
                self.log_metric(name, value)
            self._totals = None


def rollout_inputs(prompt_ids: list[list[int]], multimodal_fields: dict, pad_id: int) -> dict:
    """The rollout batch as TRL's own generation path builds it: prompts left-padded, the pictures' tensors as they
    are, per-token fields (mm_token_type_ids) left-padded like the ids."""
    import numpy as np
    from trl.trainer.utils import pad

    prompts = [torch.tensor(ids) for ids in prompt_ids]
    inputs = {"input_ids": pad(prompts, padding_value=pad_id, padding_side="left"),
              "attention_mask": pad([torch.ones_like(p) for p in prompts], padding_value=0, padding_side="left")}
    for key, value in multimodal_fields.items():
        if isinstance(value, torch.Tensor):
            inputs[key] = value
        elif isinstance(value, list) and value and isinstance(value[0], list):
            inputs[key] = pad([torch.tensor(x) for x in value], padding_value=0, padding_side="left")
        else:
            inputs[key] = torch.tensor(np.array(value))
    return inputs


@contextlib.contextmanager
def masked(model, ids):
    """While inside, `model`'s logits have the tokens `ids` masked (`vlrl.model.vision_tokens.mask_tokens`): the loss's forward
    then scores the distribution rollouts sampled from, which `suppress_tokens` cut them out of. Without it the
    masked tokens' probability mass (4e-4 at most on the tiny random model) would read as rollout/training mismatch."""
    if not ids:
        yield
        return
    head = model.get_output_embeddings()
    handle = head.register_forward_hook(lambda module, args, logits: mask_tokens(logits, list(ids)))
    # TRL >= 1.16 computes the loss's log-probs through a fused head that reads the head's weight and bias, not its
    # forward: a bias of MASKED_LOGIT at `ids` masks them there too (the hook's fill then gives the same logits)
    layer = getattr(head, "base_layer", head)  # under LoRA on the head, the frozen Linear it wraps
    biased = getattr(layer, "bias", True) is None
    if biased:
        bias = torch.zeros(layer.weight.shape[0], dtype=layer.weight.dtype, device=layer.weight.device)
        layer.bias = torch.nn.Parameter(bias.index_fill(0, torch.tensor(list(ids), device=bias.device),
                                                        MASKED_LOGIT), requires_grad=False)
    try:
        yield
    finally:
        handle.remove()
        if biased:
            layer.bias = None
