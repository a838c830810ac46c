"""The vision placeholders (`VISION_TOKENS`): their ids in a processor's vocabulary, which decoding never produces, and
logits with them masked out, so the training forward scores the distribution rollouts sampled from.
"""

from __future__ import annotations

VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>")


def vision_token_ids(processor) -> list[int]:
    """The ids of `VISION_TOKENS` in the processor's vocabulary, which every rollout and eval suppresses
    (`suppress_tokens`). A reply holding an image placeholder breaks the next forward over prompt + reply: the model
    counts one more image token than the pictures give ("Image features and image tokens do not match", a GSPO step
    at the 8B shape on an H200, where random weights sampled one), and no answer needs one."""
    tokenizer = getattr(processor, "tokenizer", processor)
    unknown = tokenizer.unk_token_id
    ids = (tokenizer.convert_tokens_to_ids(token) for token in VISION_TOKENS)
    return sorted({i for i in ids if isinstance(i, int) and i >= 0 and i != unknown})


MASKED_LOGIT = -1e4  # far below any real logit, yet finite: entropies (p log p) stay 0 for a masked token, not NaN


def mask_tokens(logits, ids: list[int]):
    """`logits` with the tokens `ids` masked out (out of place): the training forward's distribution over the
    vocabulary rollouts sample from, which suppresses `vision_token_ids`, so the loss and the importance ratios score
    the policy that generated.

    >>> import torch
    >>> mask_tokens(torch.zeros(1, 4), [1, 3]).softmax(-1).tolist()
    [[0.5, 0.0, 0.5, 0.0]]
    """
    if not ids:
        return logits
    import torch

    return logits.index_fill(-1, torch.tensor(ids, device=logits.device), MASKED_LOGIT)
