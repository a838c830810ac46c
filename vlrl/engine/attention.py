"""Decoding attention that reads each key/value head once.

transformers' SDPA attention repeats every key/value head for its group of query heads (`repeat_kv`) whenever it is
given a mask, and a static cache always has one: at the Qwen3-VL 8B shape (32 query heads over 8 key/value heads)
each decoding step copied every layer's whole cache four times over, 2.4 ms of a 15.5 ms step on an H200, and the
attention kernel then read the copies (2.2 ms; bench/results/engine.md, "Where a decoding step's time goes"). With
one query position, a group's query heads can take the query-length axis instead: the same dot products and the same
softmax for every head, each key/value head read once, nothing copied. Prefill and training forwards (more than one
query position) go through transformers' own function unchanged.

At few rows over long caches (an episode's kept cache: 4-8 rows, 2,000-8,000 slots) the masked SDPA call runs the
memory-efficient kernel, whose cost there is mostly fixed; FlexAttention's decoding kernel with the same mask (as a
block mask) took 0.5-0.8x its time replayed from a CUDA graph (bench/results/engine.md, s51), and 1.2x at 16 rows.
Here the mask is a score modification (no block mask to rebuild each step); s52's `engine_flex` column times it. `FLEX_ROWS` is the row count up to which a decoding step attends through it: 0 (never) until a whole Crafter
step has been measured with it (bench/rehearsal_cli.py's VLRL_FLEX_ROWS sets it for one run).

`grouped` switches a model's language model to this attention for the span of a decode and back.
"""

from __future__ import annotations

import contextlib

import torch

NAME = "vlrl_grouped_decode"
FLEX_ROWS = 0  # decoding steps of at most this many rows attend through FlexAttention (0: never; see above)


def grouped_decode_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                             is_causal=None, **kwargs):
    """transformers' attention-function signature (`AttentionInterface`): query (rows, heads, positions, dim), key and
    value (rows, kv heads, length, dim); returns (rows, positions, heads, dim) and no weights.

    >>> import torch
    >>> from transformers.integrations.sdpa_attention import sdpa_attention_forward
    >>> class Layer(torch.nn.Module):
    ...     num_key_value_groups = 4
    >>> q, k, v = torch.randn(2, 8, 1, 16), torch.randn(2, 2, 10, 16), torch.randn(2, 2, 10, 16)
    >>> mask = torch.ones(2, 1, 1, 10, dtype=torch.bool); mask[0, ..., :3] = False
    >>> ours, _ = grouped_decode_attention(Layer(), q, k, v, mask, scaling=0.25)
    >>> theirs, _ = sdpa_attention_forward(Layer(), q, k, v, mask, scaling=0.25)
    >>> ours.shape == theirs.shape, torch.allclose(ours, theirs, atol=1e-6)
    (True, True)
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    rows, heads, positions, dim = query.shape
    kv_heads = key.shape[1]
    if positions != 1 or heads == kv_heads or dropout or kwargs.get("position_bias") is not None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    if rows <= FLEX_ROWS and attention_mask is not None and attention_mask.dtype == torch.bool \
            and attention_mask.shape[1:3] == (1, 1):
        return flex_decode_attention(query, key, value, attention_mask[:, 0, 0, :], scaling), None
    # query head h reads key/value head h // groups (repeat_kv's order): heads (kv, group) -> kv heads x group queries
    grouped_query = query.reshape(rows, kv_heads, heads // kv_heads, dim)  # a view for the usual strides
    out = torch.nn.functional.scaled_dot_product_attention(grouped_query, key, value, attn_mask=attention_mask,
                                                           scale=scaling)
    return out.reshape(rows, 1, heads, dim), None


def flex_decode_attention(query, key, value, attend: torch.Tensor, scaling=None) -> torch.Tensor:
    """One query position per row through FlexAttention: `attend` (rows, length) bool, True where a row may attend
    (its own cache slots, not the left padding or the slots a turn skipped); returns (rows, 1, heads, dim).

    >>> q, k, v = torch.randn(2, 8, 1, 16), torch.randn(2, 2, 10, 16), torch.randn(2, 2, 10, 16)
    >>> attend = torch.ones(2, 10, dtype=torch.bool); attend[0, :3] = False; attend[1, 4:6] = False
    >>> ours = flex_decode_attention(q, k, v, attend, scaling=0.25)
    >>> theirs = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attend[:, None, None, :],
    ...                                                           scale=0.25, enable_gqa=True).transpose(1, 2)
    >>> ours.shape == theirs.shape, torch.allclose(ours, theirs, atol=1e-5)
    (True, True)
    """
    import warnings

    from torch.nn.attention.flex_attention import flex_attention

    def masked(score, b, h, q_idx, kv_idx):
        return torch.where(attend[b, kv_idx], score, -float("inf"))

    with warnings.catch_warnings():  # eager (CPU, tests): torch warns that the unfused implementation runs
        warnings.simplefilter("ignore", UserWarning)
        out = flex_attention(query, key, value, score_mod=masked, scale=scaling, enable_gqa=True)
    return out.transpose(1, 2)


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(NAME, grouped_decode_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)  # the masks SDPA takes, made as for SDPA


@contextlib.contextmanager
def grouped(base):
    """For the span of the block, the language model of `base` (a transformers model) attends through
    `grouped_decode_attention` if it attends through SDPA; otherwise nothing changes."""
    text = base.config.get_text_config()
    if getattr(text, "_attn_implementation", None) != "sdpa":
        yield
        return
    _register()
    text._attn_implementation = NAME
    try:
        yield
    finally:
        text._attn_implementation = "sdpa"
