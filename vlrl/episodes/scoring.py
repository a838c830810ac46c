"""An episode's turns scored in one forward wherever each turn's context extends the previous one.

Each turn stays one row of TRL's batch (its reply is one sequence of GSPO's sequence-level ratio), but the forward
that gives its reply tokens their log-probs need not be the turn's own. While an episode's context only grows
(turn t+1's context starts with turn t's context and reply, as `vlrl.episodes.tokens` builds them), one forward over
the last such turn's context and reply sees every earlier reply token on the very prefix it was generated after. A
run of such turns is a segment: one forward per segment replaces one per turn (prime-rl merges multi-turn samples
into one the same way), and each reply token's log-prob goes back to its turn's row, so TRL's loss, ratio and
clipping see the rows they did. An image dropped from the context starts a new segment; so does any turn whose
context, token for token, does not extend the previous one.

The forward runs the language model's backbone once per segment and the output layer only at the reply tokens, in
chunks over the vocabulary (`chunked`: TRL's chunked log-prob kernel, which recomputes them in the backward), so a 16-turn
Crafter episode scores 4,096 reply tokens without its [tokens x vocabulary] logits in memory. The tokens rollouts
never sample (image and video placeholders) are masked as `vlrl.training.mismatch.masked` masks them: far below any logit.
"""

from __future__ import annotations

import torch

from vlrl.engine.token_types import Tokenized, extends, token_batch
from vlrl.model.vision_tokens import MASKED_LOGIT, mask_tokens

VOCAB_CHUNK = 8192  # output-layer rows per chunk (TRL's own for its chunked log-probs)


def segments(rows: list[dict]) -> list[list[dict]]:
    """Consecutive turn rows (`vlrl.training.episode_trainer.turn_rows`: "episode", "prompt", "reply_ids") grouped into
    segments: each row of a segment is the same episode's next turn, its context extending the row before's.

    >>> t = [{"episode": 0, "prompt": Tokenized([1]), "reply_ids": [2]}, {"episode": 0, "prompt": Tokenized([1, 2, 5]),
    ...      "reply_ids": [6]}, {"episode": 0, "prompt": Tokenized([7]), "reply_ids": [8]}]
    >>> [len(s) for s in segments(t)]
    [2, 1]
    """
    out: list[list[dict]] = []
    for row in rows:
        last = out[-1][-1] if out else None
        if last is not None and last["episode"] == row["episode"] and extends(last["prompt"], last["reply_ids"],
                                                                             row["prompt"]):
            out[-1].append(row)
        else:
            out.append([row])
    return out


def tokens(segment: list[dict]) -> int:
    """The tokens of a segment's forward: its last turn's context and reply."""
    return len(segment[-1]["prompt"].ids) + len(segment[-1]["reply_ids"])


def merged_inputs(processor, chosen: list[list[dict]]) -> dict:
    """One forward's inputs for the segments `chosen` (rows right-padded: a pad after the last real token changes no
    earlier position, through attention or a linear-attention state), and where each turn's reply tokens are:
    `positions`, the flat index into (segment, position) of the hidden state that predicts each reply token, in
    turn order then token order, and `labels`, those tokens."""
    contexts, positions, labels = [], [], []
    width = max(tokens(s) for s in chosen)
    for s, segment in enumerate(chosen):
        last = segment[-1]
        contexts.append(Tokenized(last["prompt"].ids + list(last["reply_ids"]), last["prompt"].pixels,
                                  last["prompt"].grids, last["prompt"].type_ids))
        for row in segment:
            start = s * width + len(row["prompt"].ids) - 1  # the hidden state before each reply token predicts it
            positions.extend(range(start, start + len(row["reply_ids"])))
            labels.extend(row["reply_ids"])
    return {"forward": dict(token_batch(processor, contexts, padding_side="right")),
            "positions": torch.tensor(positions, dtype=torch.long), "labels": torch.tensor(labels, dtype=torch.long)}


def reply_logps(model, merged: dict, reply_mask: torch.Tensor, *, temperature: float, suppressed: tuple[int, ...],
                autocast, compute_entropy: bool, chunked) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Each turn's reply tokens' log-probs (and entropies) in TRL's layout ([turns, longest reply], zero after a
    reply's end: `reply_mask`), from one backbone forward over the merged segments. `model`: the unwrapped policy
    (PEFT or not); `autocast`: the trainer's mixed-precision context; `chunked`: the log-prob kernel over vocabulary
    chunks, `(hidden, weight, bias, labels, temperature, chunk_size, softcap, scale) -> (logps, entropies)` (TRL's,
    through `vlrl.training.trl_bridge.chunked_logps`)."""
    inner = model.base_model.model if hasattr(model, "peft_config") else model
    with autocast():
        hidden = inner.base_model(**merged["forward"], use_cache=False).last_hidden_state
    hidden = hidden.reshape(-1, hidden.shape[-1])[merged["positions"]]
    head, text = inner.get_output_embeddings(), inner.config.get_text_config()
    scale, cap = getattr(text, "logit_scale", None) or 1.0, getattr(text, "final_logit_softcapping", None)
    if type(head) is torch.nn.Linear:
        bias = head.bias
        if suppressed:  # as `vlrl.training.mismatch.masked`: the placeholders' logits far below any other (exp() of them is 0)
            bias = torch.zeros(head.weight.shape[0], device=hidden.device) if bias is None \
                else bias.detach().float().clone()  # never the layer's own bias, changed in place
            bias[list(suppressed)] += MASKED_LOGIT
        with autocast():
            logps, entropies = chunked(hidden, head.weight, bias, merged["labels"], temperature, VOCAB_CHUNK, cap,
                                       scale)
    else:  # an adapted output layer (LoRA on the head: the tiny presets) is run as the module it is, all at once
        with autocast():
            logits = mask_tokens(head(hidden).float(), list(suppressed)) * scale  # masked where the hook masks
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        logits = logits / temperature
        every = logits.log_softmax(-1)
        logps = every.gather(-1, merged["labels"][:, None]).squeeze(-1)
        entropies = -(every.exp() * every).sum(-1)
    mask = reply_mask.bool()
    out = logps.new_zeros(mask.shape).masked_scatter(mask, logps)
    return out, entropies.new_zeros(mask.shape).masked_scatter(mask, entropies) if compute_entropy else None
