"""TRL-compatible reward functions for visual math, built on the answer grammar of `vlrl.answers`.

Each reward takes the completions a trainer passes (plain strings from Unsloth's patched GRPOTrainer, or TRL's
conversational message lists) and the data set's columns as keyword arguments, and returns one float per completion.
`None` means "skip this sample" (the gold answer is unusable); 0.0 means "wrong or badly formatted".

The combined reward is R = 0.3 * format + 1.0 * correctness (`REWARD_WEIGHTS`, used by `vlrl.config.gspo_config`).

    >>> format_reward(["<REASONING>4-1=3</REASONING><SOLUTION>3</SOLUTION>"])
    [2.0]
    >>> correctness_reward(["<SOLUTION>3.0</SOLUTION>"], answer=["3"])
    [1.5]
"""

from __future__ import annotations

from vlrl import answers

FORMAT_WEIGHT = 0.3
CORRECTNESS_WEIGHT = 1.0
DEGENERATE_PENALTY = -2.0
DEGENERATE_MARKER = "addCriterion"


def degeneration_ratio(text: str) -> float:
    """Share of the characters that are `addCriterion` occurrences or newlines (a known Qwen-VL failure mode).

    >>> degeneration_ratio("addCriterion\\naddCriterion\\n")
    1.0
    """
    if not text:
        return 0.0
    spam = text.count(DEGENERATE_MARKER) * len(DEGENERATE_MARKER) + text.count("\n")
    return spam / len(text)


def format_parts(completion) -> dict:
    """The pieces of the format reward for one completion, for logs, eval records and the reward calculator.

    >>> format_parts("<SOLUTION>1</SOLUTION>")["score"]
    1.0
    """
    text = answers.strip_think(answers.as_text(completion))
    reasoning = answers.count_blocks(text, answers.REASONING_START, answers.REASONING_END)
    solution = answers.count_blocks(text, answers.SOLUTION_START, answers.SOLUTION_END)
    ratio = degeneration_ratio(text)
    degenerate = ratio >= 0.5
    score = float(reasoning == 1) + float(solution == 1) + (DEGENERATE_PENALTY if degenerate else 0.0)
    return {"reasoning_blocks": reasoning, "solution_blocks": solution, "degeneration_ratio": ratio,
            "degenerate": degenerate, "score": score}


def format_reward(completions, **kwargs) -> list[float]:
    """+1 for exactly one REASONING block, +1 for exactly one SOLUTION block, -2 for `addCriterion` spam.

    Args:
        completions: plain strings or TRL conversational completions.
        **kwargs: data set columns (unused).

    Returns:
        One score in {-2, -1, 0, 1, 2} per completion.

    >>> format_reward([[{"role": "assistant", "content": "<REASONING>x</REASONING>"}]])
    [1.0]
    """
    return [format_parts(c)["score"] for c in completions]


def correctness_parts(completion, answer, **meta) -> dict:
    """The pieces of the correctness reward for one completion: prediction, matched rule, score (None = skip).

    >>> correctness_parts("<SOLUTION>B</SOLUTION>", "7", question_type="multi_choice", choices=["3", "7"])["score"]
    2.0
    """
    prediction = answers.extract_solution(completion)
    if answer is None or str(answer).strip() == "":
        return {"prediction": prediction, "match": "none", "score": None}  # unusable gold: TRL skips the sample
    kind = answers.match_kind(prediction, answer, **meta)
    return {"prediction": prediction, "match": kind, "score": {"exact": 2.0, "numeric": 1.5}.get(kind, 0.0)}


_META = ("precision", "question_type", "choices", "unit", "answer_type")


def correctness_reward(completions, answer, **kwargs) -> list[float | None]:
    """2.0 for an exact match with the gold answer, 1.5 for a numeric one, 0.0 otherwise, None without a gold.

    Args:
        completions: plain strings or TRL conversational completions.
        answer: the gold answers, one per completion.
        **kwargs: MathVista columns that refine the match, each a list: precision, question_type, choices, unit.

    Returns:
        One score per completion; None where the gold answer is missing.

    >>> correctness_reward(["<SOLUTION>1,250</SOLUTION>", "<SOLUTION>7</SOLUTION>"], answer=["1250", None])
    [1.5, None]
    """
    scores = []
    for i, completion in enumerate(completions):
        meta = {k: kwargs[k][i] for k in _META if isinstance(kwargs.get(k), (list, tuple)) and i < len(kwargs[k])}
        scores.append(correctness_parts(completion, answer[i] if i < len(answer) else None, **meta)["score"])
    return scores


REWARD_FUNCS = [format_reward, correctness_reward]
REWARD_WEIGHTS = [FORMAT_WEIGHT, CORRECTNESS_WEIGHT]


def total_reward(format_score: float, correctness_score: float | None) -> float:
    """The combined reward R = 0.3 * format + 1.0 * correctness (a skipped correctness counts 0).

    >>> total_reward(2.0, 2.0)
    2.6
    """
    return round(FORMAT_WEIGHT * format_score + CORRECTNESS_WEIGHT * (correctness_score or 0.0), 10)
