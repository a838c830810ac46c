"""vlrl's rollouts and the rollout/training mismatch over Unsloth's patched GRPOTrainer.

Unsloth replaces TRL's `compute_loss` with its own chunked loss (`grpo_accumulated_loss`), so the transformers
backend's way of measuring the mismatch (`vlrl.training.mismatch`: intercept the loss's own forward) has nothing to
intercept there. On the Unsloth backend the trainer instead

- decodes its rollouts through the decoding engine, as on the transformers backend (`RolloutMismatch`): the image
  and video placeholders suppressed, each sampled token's log-prob recorded, `rollout_time` logged;
- scores each micro-batch once more, without gradient, through Unsloth's own per-token scorer (`token_logps`
  through `vlrl.training.trl_bridge`, the one its loss uses for old and reference log-probs) at the weights the
  rollout was drawn with, and logs `sampling/rollout_train_kl` and the other `mismatch.METRICS` from it. The extra
  forward costs time; the loss itself is Unsloth's, untouched. Unsloth's scorer applies the output head itself, so the
  placeholders' probability mass, which rollouts never sample, counts in the measured mismatch as it does in the loss
  Unsloth trains with (on the transformers backend the loss masks them: `mismatch.masked`).

Why the placeholders must never be sampled here: Unsloth rebuilds `mm_token_type_ids` from the token ids of prompt +
completion (`_unsloth_fix_mm_token_type_ids`), so a `<|video_pad|>` in a completion becomes a video span without a
`video_grid_thw`, and Qwen3-VL's `get_rope_index` fails on it (`TypeError: 'NoneType' object is not an iterator`);
an `<|image_pad|>` becomes one image too many. A random-weight 8B samples them (docs/training.md).
"""

from __future__ import annotations

import torch

from vlrl.training.loss import scorer_args
from vlrl.training.mismatch import RolloutMismatch


class UnslothRolloutMismatch(RolloutMismatch):
    """A mixin of Unsloth's GRPOTrainer (through `vlrl.training.trl_bridge.trainer_class`): the engine's rollouts and
    the measured mismatch, Unsloth's loss untouched."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if self.model.training and not self.use_vllm and "sampling_per_token_logps" in inputs:
            self._measure_mismatch(model, inputs)
        return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                    num_items_in_batch=num_items_in_batch)

    def policy_loss(self, model, inputs):
        """TRL's own loss as it is (Unsloth's `compute_loss` does not call it): the mismatch is measured once, in
        `compute_loss`, and never corrected here."""
        return super(RolloutMismatch, self).policy_loss(model, inputs)

    def _measure_mismatch(self, model, inputs: dict) -> None:
        """Scores the micro-batch's completions without gradient (Unsloth's scorer, current weights = the rollout's
        when each rollout is one optimizer step) and adds its mismatch to this optimizer step's totals."""
        input_ids, attention_mask, length, extra = scorer_args(inputs)
        vision = {k: v for k, v in extra.items() if v is not None}  # Unsloth's scorer: only what the batch has
        self._loss_inputs = dict(inputs)  # RolloutMismatch.token_logps measures against it
        try:
            with torch.no_grad():
                self.token_logps(model, input_ids, attention_mask, length,
                                 batch_size=self.args.per_device_train_batch_size, **vision)
        finally:
            self._loss_inputs = None
