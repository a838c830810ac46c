"""A single-turn run's micro-batches trained in fewer, larger forward passes: `[training] pass_tokens`.

TRL trains a generation batch as `steps_per_generation` micro-batches of `per_device_train_batch_size` rows, one
forward and backward each, and a pass costs about the same whatever its rows: at the 8B shape on one H200 (256
tokens) the step's 32 completions trained in 8.49 s as 8 passes of 4, 5.66 s merged here into 4 of 8 and 3.17 s into
2 of 16 (docs/training.md, plan s53), the rows a pass can hold set by memory. With `pass_tokens = N`, consecutive
micro-batches of a generation batch whose padded tokens (rows x width) fit in N together are trained as one pass:
their rows concatenated, the loss weighted so that the gradient is the same as theirs one by one (`pass_weight`: a
reduction over rows divides by the pass's rows, so a pass of k micro-batches weighs k; dapo divides by the whole
batch's tokens, so 1). Only micro-batches of one optimizer step's accumulation window merge, and the window keeps
TRL's number of micro-steps: the ones left over come first and compute nothing, so the window's last micro-step,
where DDP synchronizes gradients, is always a real pass. 0: off.

Every pass, merged or not, also drops the completion columns that are padding in all of its rows (`trimmed`): TRL
pads each micro-batch to the longest completion of the whole generation batch, so a pass of short answers computed
the longest one's width. The same loss, fewer tokens where completions end early (a real model's; random weights
run every completion to its limit).

    >>> merge_plan(4, rows=4, width=700, budget=6000)   # 2 micro-batches of 2,800 tokens fit in 6,000
    [0, 0, 2, 2]
    >>> merge_plan(4, rows=4, width=1500, budget=6000)  # one does: nothing merges
    [1, 1, 1, 1]
"""

from __future__ import annotations

import torch

from vlrl.base.errors import ConfigError
from vlrl.training import dynamic_sampling
from vlrl.training.loss import REDUCTIONS

EMPTY = "vlrl_empty_pass"  # a micro-step whose rows another micro-step's pass trained


def merge_plan(micro_batches: int, *, rows: int, width: int, budget: int) -> list[int]:
    """How many micro-batches each micro-step trains (0: none), for `micro_batches` of `rows` x `width` tokens under
    a pass budget of `budget` tokens: full passes last, the leftover micro-steps empty and first."""
    per_pass = max(1, budget // max(1, rows * width))
    sizes = [per_pass] * (micro_batches // per_pass) + ([micro_batches % per_pass] if micro_batches % per_pass else [])
    return [0] * (micro_batches - len(sizes)) + sizes[::-1]  # a partial pass first among the real ones


def concatenated(batches: list[dict]) -> dict:
    """One batch of `batches`' rows in order (TRL's form, every micro-batch of a generation batch padded to the same
    widths): tensors joined on their first axis (rows, or the pictures' and clips' flat patches, which follow the rows'
    order), lists joined, a scalar kept once (the same in each)."""
    out = {}
    for key, value in batches[0].items():
        values = [b[key] for b in batches]
        if isinstance(value, torch.Tensor) and value.dim():
            out[key] = torch.cat(values)
        elif isinstance(value, list):
            out[key] = [item for v in values for item in v]
        else:
            out[key] = value
    return out


def trimmed(batch: dict) -> dict:
    """`batch` without the completion columns that are padding in every one of its rows: TRL pads every micro-batch
    to the longest completion of the whole generation batch, and a pass computes each column. Only trailing columns go,
    so every kept token sees what it saw (the model is causal) and the loss is the same (its divisors count masked
    tokens or the constant max_completion_length). A batch with a per-token field this does not know stays whole."""
    completion = batch["completion_ids"].size(1)
    used = batch["completion_mask"].any(0).nonzero()
    keep = int(used[-1]) + 1 if len(used) else 1
    known = {*dynamic_sampling.LEFT, *dynamic_sampling.RIGHT, *dynamic_sampling.SPANNING, *dynamic_sampling.ROWS}
    per_token = {k for k, v in batch.items() if isinstance(v, torch.Tensor) and v.dim() > 1 and v.size(1) > 1}
    if keep == completion or per_token - known:
        return batch
    out = dict(batch)
    for key in per_token & {*dynamic_sampling.RIGHT, *dynamic_sampling.SPANNING}:
        cut = keep if key in dynamic_sampling.RIGHT else batch[key].size(1) - completion + keep
        out[key] = batch[key][:, :cut]
    return out


class MergedPasses:
    """Mixed into vlrl's single-turn trainer, outermost: `step_inputs` hands each micro-step its pass (merged rows,
    with their `pass_weight`, or TRL's micro-batch as it is when `pass_tokens` is 0) without its trailing padding
    (`trimmed`), or an empty marker, and `policy_loss` of a marker is a zero loss with nothing to compute."""

    pass_tokens = 0
    _passes: list[dict] | None = None
    _passes_of = None  # (the buffered micro-batches `_passes` was made from, where they start in their window)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.pass_tokens and REDUCTIONS.get(self.loss_type) == "tokens":  # (another: GspoLoss refuses it)
            merged = [kind for kind, reduction in REDUCTIONS.items() if reduction != "tokens"]
            raise ConfigError(f"[training] pass_tokens merges micro-batches, and loss type {self.loss_type!r} "
                              "normalizes each micro-batch by its own tokens, which merging changes; set pass_tokens "
                              f"= 0 or a loss type among {', '.join(merged)}.")

    def step_inputs(self, generation_batch):
        inputs = super().step_inputs(generation_batch)
        if not self.model.training or self.buffered_batches is None:
            return inputs
        if self.pass_tokens:
            index = self.micro_step % self.args.steps_per_generation  # TRL's: which buffered micro-batch trains now
            offset = (self.micro_step - index) % self.current_gradient_accumulation_steps  # where the buffer starts
            made_of = self._passes_of or (None, None)
            if made_of[0] is not self.buffered_batches or made_of[1] != offset:  # a new buffer, or a new window place
                self._passes = self._merged(self.buffered_batches, offset)
                self._passes_of = (self.buffered_batches, offset)
            inputs = self._passes[index]
        return inputs if inputs.get(EMPTY) else trimmed(inputs)

    def _merged(self, batches: list[dict], offset: int) -> list[dict]:
        """One entry a buffered micro-batch: its micro-step's pass, or the empty marker. Micro-batches merge only
        within one optimizer step's accumulation window (the paper recipe steps the optimizer after each)."""
        first, window = batches[0], self.current_gradient_accumulation_steps
        rows, width = first["prompt_ids"].size(0), first["prompt_ids"].size(1) + first["completion_ids"].size(1)
        passes, start = [], 0
        while start < len(batches):
            count = min(window - (offset + start) % window, len(batches) - start)  # the rest of this window
            for size in merge_plan(count, rows=rows, width=width, budget=self.pass_tokens):
                if not size:
                    passes.append({EMPTY: True})
                    continue
                merged = concatenated(batches[start:start + size]) if size > 1 else batches[start]
                weight = float(size) if REDUCTIONS[self.loss_type] == "rows" else 1.0  # dapo: the batch's tokens
                passes.append({**merged, "pass_weight": weight * merged.get("pass_weight", 1.0)})
                start += size
        return passes

    def policy_loss(self, model, inputs: dict) -> torch.Tensor:
        if inputs.get(EMPTY):  # its rows train in a later micro-step's pass; backward of this touches no weight
            return torch.zeros((), device=self.accelerator.device, requires_grad=True)
        return super().policy_loss(model, inputs)
