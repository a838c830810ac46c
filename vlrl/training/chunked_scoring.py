"""The single-turn loss's log-probs without the [tokens x vocabulary] logits.

TRL 1.14's loss forward runs the whole model and keeps each micro-batch's logits: for 4 completions of 1,024 tokens
at Qwen3-VL's 151,936 vocabulary rows, 1.2 GB in bf16, then their scaled copy, their log-softmax and the gradient of
each (~5 GB at the peak), which is what bounds the presets' micro-batches at long completions, and so how many
training passes a step takes (issue 50: ~1 s a pass at the 8B's depth, whatever its rows). TRL 1.16 scores that
forward through its own fused head. vlrl scores it the same way on every TRL it supports: the backbone once, then
the output layer only at the completion tokens, `VOCAB_CHUNK` rows of it at a time (TRL's chunked log-prob kernel,
the one episode runs score with, `vlrl.episodes.scoring.reply_logps`, which recomputes the chunks in the backward).

Same numbers, up to rounding: the log-sum-exp accumulates in float32 (TRL 1.14 takes the bf16 log-softmax), the
placeholders rollouts never sample are masked through the head's bias (`vlrl.training.mismatch.masked` masks the
head's output on the full path), and the entropies are logged without a gradient (vlrl's loss has no entropy term).
TRL's own path stays where this one does not apply: a forward scored in chunks of rows (`batch_size`: the old and
reference log-probs, under no_grad), an output layer that is not a plain Linear (a LoRA on the head), a router's
auxiliary loss.
"""

from __future__ import annotations

import torch

from vlrl.episodes import scoring
from vlrl.training.loss import SCORER_INPUTS

# what the backbone itself takes of the scorer's inputs (TRL's own chunked path passes the same; num_images and
# num_tiles only split a batch into chunks of rows)
BACKBONE_INPUTS = tuple(key for key in SCORER_INPUTS if key not in ("num_images", "num_tiles"))


def completion_positions(attention_mask: torch.Tensor, completion: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Where the completion tokens of prompt + completion rows (`attention_mask`: [rows, width], the last
    `completion` columns the completions) are scored from: the completion mask, and the flat index into
    (row, position) of the hidden state before each of its tokens, row by row, which predicts it.

    >>> mask, positions = completion_positions(torch.tensor([[0, 1, 1, 1], [1, 1, 1, 0]]), 2)
    >>> mask.tolist(), positions.tolist()
    ([[True, True], [True, False]], [1, 2, 5])
    """
    width = attention_mask.size(1)
    mask = attention_mask[:, -completion:].bool()
    rows, columns = mask.nonzero(as_tuple=True)
    return mask, rows * width + (width - completion - 1) + columns


class ChunkedScoring:
    """Mixed into vlrl's single-turn trainer, innermost: the loss's forward (`token_logps` without `batch_size`)
    scored through the chunked head, in TRL's layout ([rows, completion], zero where the mask is)."""

    def token_logps(self, model, *args, **kwargs):
        unwrapped = self.accelerator.unwrap_model(model)
        inner = unwrapped.base_model.model if hasattr(unwrapped, "peft_config") else unwrapped
        if (len(args) != 3 or kwargs.get("batch_size") is not None or kwargs.get("compute_aux_loss")
                or type(inner.get_output_embeddings()) is not torch.nn.Linear):
            return super().token_logps(model, *args, **kwargs)
        input_ids, attention_mask, completion = args
        mask, positions = completion_positions(attention_mask, completion)
        forward = {"input_ids": input_ids, "attention_mask": attention_mask,
                   **{key: kwargs[key] for key in BACKBONE_INPUTS if kwargs.get(key) is not None}}
        merged = {"forward": forward, "positions": positions, "labels": input_ids[:, -completion:][mask]}
        entropy = bool(kwargs.get("compute_entropy"))

        def score(module):
            return scoring.reply_logps(module, merged, mask, temperature=self.temperature,
                                       suppressed=getattr(self, "suppressed_token_ids", ()),
                                       autocast=self.accelerator.autocast, compute_entropy=entropy,
                                       chunked=self.chunked_logps)

        logps, entropies = self.on_unwrapped(model, score)
        return logps, None if entropies is None else entropies.detach(), None
