"""Thinking models: Qwen3-VL "-Thinking" checkpoints write `<think>...</think>` before their answer, and
`thinking_budget` ([training] and [eval]) caps that block at generation time.

The decoding engine enforces the budget (`vlrl.engine.sampling`): per sequence it counts the thinking tokens
generated since `<think>` opened, in the completion or in the prompt (Qwen3-VL-Thinking's chat template ends the
generation prompt with "<think>\\n"), and when the count reaches the budget with the block still open it forces
`</think>`, then "\\n\\n"; the model writes its answer after that. This module gives it the token ids
(`budget_ids`) and reads what a completion thought (`thinking_of`).

Scoring is unchanged (`vlrl.grammar.answers.strip_think` removes the thinking): the answer after `</think>` earns the format
and correctness rewards by the same grammar as any completion. When the prompt opened the block, the completion is
scored as the assistant's whole turn, that opening included (`opening`), so thinking the length limit cut before
`</think>` is thinking, not an answer.

    budget_ids(processor.tokenizer, 256)   # (151667, 151668, 271): <think>, </think>, "\\n\\n"
"""

from __future__ import annotations

import functools

from vlrl.base.errors import ConfigError
from vlrl.grammar.answers import THINK_END, THINK_START, as_text

AFTER_CLOSE = "\n\n"  # what Qwen3's own turns put between </think> and the answer; forced after a budget close


def think_ids(tokenizer) -> tuple[int, int] | None:
    """The ids of `<think>` and `</think>` in `tokenizer` (151667, 151668 in Qwen3's), or None when it has none.

    >>> from vlrl.model.tiny import build_tokenizer
    >>> think_ids(build_tokenizer())
    (151667, 151668)
    """
    tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # a processor holds its tokenizer
    ids = []
    for token in (THINK_START, THINK_END):
        found = tokenizer.convert_tokens_to_ids(token)
        if not isinstance(found, int) or found == tokenizer.unk_token_id or found < 0:
            return None
        ids.append(found)
    return ids[0], ids[1]


def opening(prompt_text: str) -> str:
    """The part of a rendered prompt that opens a thinking block left open for the completion ("<think>\\n" from
    Qwen3-VL-Thinking's template), "" when the prompt leaves no block open.

    >>> opening("<|im_start|>assistant\\n<think>\\n"), opening("<|im_start|>assistant\\n")
    ('<think>\\n', '')
    """
    start = prompt_text.rfind(THINK_START)
    return prompt_text[start:] if start >= 0 and prompt_text.rfind(THINK_END) < start else ""


def template_opening(processor) -> str:
    """`opening` of the processor's chat template: what its generation prompt leaves open (one text turn rendered)."""
    conversation = [{"role": "user", "content": [{"type": "text", "text": "1 + 1?"}]}]
    return opening(processor.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False))


def budget_ids(tokenizer, budget: int) -> tuple[int, int, int | None]:
    """The ids a thinking budget needs: `<think>`, `</think>` and the one token of `AFTER_CLOSE` (None when it is
    several); ConfigError when the tokenizer has no `<think>` / `</think>` or the budget is negative."""
    if budget < 0:
        raise ConfigError(f"thinking_budget ({budget}) must be >= 0 (0 turns the budget off).")
    ids = think_ids(tokenizer)
    if ids is None:
        raise ConfigError(f"thinking_budget = {budget} needs a tokenizer with {THINK_START} and {THINK_END} tokens "
                          "(Qwen3's have them); this one has none. Set thinking_budget = 0 for this model.")
    tokenizer = getattr(tokenizer, "tokenizer", tokenizer)
    after = tokenizer.encode(AFTER_CLOSE, add_special_tokens=False)
    return ids[0], ids[1], after[0] if len(after) == 1 else None


def thinking_of(tokens, ids: tuple[int, int] | None, *, opened: bool, budget: int = 0) -> dict:
    """How a completion (its token ids, end of turn excluded) thought: the record fields `thinking_tokens` (tokens
    inside the block), `thinking_closed` (`</think>` written) and `thinking_cut` (closed at the budget: the budget
    cut it). {} when the completion has no thinking block.

    Args:
        tokens: the completion's ids.
        ids: `think_ids` of the tokenizer (None: no thinking tokens, so no block).
        opened: the prompt opened the block (`opening`), so it starts at the first generated token.
        budget: the thinking budget it was generated under (0: none).

    >>> thinking_of([5, 5, 8, 3], (7, 8), opened=True, budget=2)
    {'thinking_tokens': 2, 'thinking_closed': True, 'thinking_cut': True}
    >>> thinking_of([3], (7, 8), opened=False)
    {}
    """
    tokens = list(tokens)
    if ids is None:
        return {}
    start_id, end_id = ids
    if opened:
        first = 0
    elif start_id in tokens:
        first = tokens.index(start_id) + 1
    else:
        return {}
    end = tokens.index(end_id, first) if end_id in tokens[first:] else None
    count = (len(tokens) if end is None else end) - first
    return {"thinking_tokens": count, "thinking_closed": end is not None,
            "thinking_cut": bool(budget) and end is not None and count >= budget}


def with_thinking(reward_funcs: list, processor, budget: int = 0) -> list:
    """The reward functions for a run whose template opens thinking in the prompt, or that has a budget: each
    scores the assistant's whole turn (the prompt's opening + the completion), and the first logs
    `thinking/tokens_mean`, `thinking/closed_rate` and `thinking/cut_rate` per step. Unchanged for other runs.
    """
    start = template_opening(processor)
    if not start and not budget:
        return reward_funcs
    ids = think_ids(processor)
    return [_scored_as_turn(f, start, ids, budget, log=i == 0) for i, f in enumerate(reward_funcs)]


def _scored_as_turn(reward_func, start: str, ids, budget: int, *, log: bool):
    @functools.wraps(reward_func)
    def scored(completions, **kwargs):
        log_metric, completion_ids = kwargs.get("log_metric"), kwargs.get("completion_ids")
        if log and callable(log_metric) and completion_ids:
            seen = [thinking_of(c, ids, opened=bool(start), budget=budget) for c in completion_ids]
            seen = [s for s in seen if s]
            if seen:
                log_metric("thinking/tokens_mean", sum(s["thinking_tokens"] for s in seen) / len(seen))
                log_metric("thinking/closed_rate", sum(s["thinking_closed"] for s in seen) / len(seen))
                log_metric("thinking/cut_rate", sum(s["thinking_cut"] for s in seen) / len(seen))
        if start:
            completions = [start + as_text(c) for c in completions]
        return reward_func(completions, **kwargs)

    return scored
