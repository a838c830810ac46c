"""Thinking models: Qwen3-VL "-Thinking" checkpoints write `<think>...</think>` before their answer, and
`thinking_budget` ([training] and [eval]) caps that block at generation time.

`ThinkingBudget` is a transformers LogitsProcessor. Per sequence it counts the thinking tokens generated since
`<think>` opened, in the completion or in the prompt (Qwen3-VL-Thinking's chat template ends the generation prompt
with "<think>\\n"), and when the count reaches the budget with the block still open it forces `</think>`, then
"\\n\\n"; the model writes its answer after that. Every step it reads the positions of the last `<think>` and
`</think>` from the ids so far, with no state between steps and no host sync, so it works batched, with
num_return_sequences, and under vlrl's static-cache compiled decoding.

Scoring is unchanged (`vlrl.answers.strip_think` removes the thinking): the answer after `</think>` earns the format
and correctness rewards by the same grammar as any completion. When the prompt opened the block, the completion is
scored as the assistant's whole turn, that opening included (`opening`), so thinking the length limit cut before
`</think>` is thinking, not an answer.

    processor = ThinkingBudget(256, prompt_length=inputs["input_ids"].shape[1], start_id=151667, end_id=151668)
    model.generate(**inputs, logits_processor=LogitsProcessorList([processor]))
"""

from __future__ import annotations

import functools

from vlrl.answers import THINK_END, THINK_START, as_text
from vlrl.errors import ConfigError

AFTER_CLOSE = "\n\n"  # what Qwen3's own turns put between </think> and the answer; forced after a budget close


def think_ids(tokenizer) -> tuple[int, int] | None:
    """The ids of `<think>` and `</think>` in `tokenizer` (151667, 151668 in Qwen3's), or None when it has none.

    >>> from vlrl.tiny import build_tokenizer
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


class ThinkingBudget:
    """Forces `</think>` (then "\\n\\n") when a sequence's open thinking block reaches `budget` generated tokens.

    Args:
        budget: the most thinking tokens per completion (> 0), `<think>` and `</think>` not counted.
        prompt_length: the prompt's length in the input ids (padding included): a block opened in the prompt counts
            from the first generated token.
        start_id, end_id: the ids of `<think>` and `</think>` (`think_ids`).
        after_id: the token forced right after a budget close (`AFTER_CLOSE`'s one token), or None.

    >>> import torch
    >>> budget = ThinkingBudget(2, prompt_length=1, start_id=7, end_id=8)
    >>> budget(torch.tensor([[7, 1, 2]]), torch.zeros(1, 10)).argmax(dim=1).tolist()
    [8]
    """

    def __init__(self, budget: int, *, prompt_length: int, start_id: int, end_id: int, after_id: int | None = None):
        if budget <= 0:
            raise ValueError(f"thinking budget {budget} must be positive (0 turns the budget off: pass no processor)")
        self.budget, self.prompt_length = budget, prompt_length
        self.start_id, self.end_id, self.after_id = start_id, end_id, after_id

    def __call__(self, input_ids, scores):
        import torch

        length = input_ids.shape[1]
        positions = torch.arange(length, device=input_ids.device)
        last_open = torch.where(input_ids == self.start_id, positions, -1).amax(dim=1)
        last_close = torch.where(input_ids == self.end_id, positions, -1).amax(dim=1)
        first = torch.clamp(last_open + 1, min=self.prompt_length)  # the block's first generated thinking token
        is_open = last_open > last_close
        close = is_open & (length - first >= self.budget)
        force, target = close, torch.full_like(last_open, self.end_id)
        if self.after_id is not None:
            # closed on the last step with `budget` tokens inside: the budget closed it (a natural close at exactly the
            # budget is forced "\n\n" too, which is what the model writes after </think> anyway)
            just_closed = (last_close == length - 1) & (last_open >= 0) & (last_close - first >= self.budget)
            force = close | just_closed
            target = torch.where(close, self.end_id, self.after_id)
        target = target.unsqueeze(1)
        kept = scores.gather(1, target)
        scores = scores.masked_fill(force.unsqueeze(1), float("-inf"))
        return scores.scatter(1, target, torch.where(force.unsqueeze(1), torch.zeros_like(kept), kept))


def budget_processor(tokenizer, budget: int, prompt_length: int) -> ThinkingBudget:
    """A `ThinkingBudget` with the tokenizer's ids; raises ConfigError when it has no `<think>` / `</think>`."""
    ids = think_ids(tokenizer)
    if ids is None:
        raise ConfigError(f"thinking_budget = {budget} needs a tokenizer with {THINK_START} and {THINK_END} tokens "
                         "(Qwen3's have them); this one has none. Set thinking_budget = 0 for this model.")
    tokenizer = getattr(tokenizer, "tokenizer", tokenizer)
    after = tokenizer.encode(AFTER_CLOSE, add_special_tokens=False)
    return ThinkingBudget(budget, prompt_length=prompt_length, start_id=ids[0], end_id=ids[1],
                          after_id=after[0] if len(after) == 1 else None)


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


def enable_budget(trainer, budget: int) -> None:
    """The trainer's rollouts under a thinking budget: TRL's GRPOTrainer takes no logits processor, so the policy's
    `generate` gets one per call (the prompt length is the call's). Works with vlrl's fast generation (the processor
    runs outside the compiled step) and through `accelerate launch` (each process's policy is patched)."""
    if not budget:
        return
    budget_processor(trainer.processing_class, budget, 0)  # no <think> token: refused now, not at the first rollout
    model = trainer.accelerator.unwrap_model(trainer.model)
    generate = model.generate

    @functools.wraps(generate)
    def generate_within_budget(*args, **kwargs):
        from transformers import LogitsProcessorList

        input_ids = kwargs["input_ids"] if "input_ids" in kwargs else args[0]
        processor = budget_processor(trainer.processing_class, budget, input_ids.shape[1])
        kwargs["logits_processor"] = LogitsProcessorList([*(kwargs.get("logits_processor") or []), processor])
        return generate(*args, **kwargs)

    model.generate = generate_within_budget
