"""TRL-compatible reward functions for visual math, built on the answer grammar of `vlrl.grammar.answers`.

Each reward takes the completions a trainer passes (plain strings from Unsloth's patched GRPOTrainer, or
TRL's conversational message lists) and the data set's columns as keyword arguments, and returns one float per
completion. `None` means "skip this sample" (the gold answer is unusable); 0.0 means "wrong or badly
formatted". No input makes them raise. rewards/SPEC.md states the rules; rewards/golden/*.jsonl holds the
cases every port must pass.

The combined reward is R = 0.3 * format + 1.0 * correctness (`REWARD_WEIGHTS`, which `vlrl.config.recipe.gspo_config`
passes to TRL as `reward_weights`):

    >>> format_reward(["<REASONING>4-1=3</REASONING><SOLUTION>3</SOLUTION>"])
    [2.0]
    >>> correctness_reward(["<SOLUTION>3.0</SOLUTION>"], answer=["3"])
    [1.5]

In your own TRL script: `GRPOTrainer(..., reward_funcs=REWARD_FUNCS,
args=GRPOConfig(..., reward_weights=REWARD_WEIGHTS))`.
"""

from __future__ import annotations

from vlrl.grammar import answers

FORMAT_WEIGHT = 0.3  # format is a means: two format points (0.6) never outweigh one correct answer (1.5-2.0)
CORRECTNESS_WEIGHT = 1.0
# What each matching rule of `answers.match_kind` is worth. The exact text (or the option, named by its
# letter) earns the most; an equal number written differently, or an equivalent expression, a little less, so
# the model learns to write the answer the way the data set does.
MATCH_SCORES = {"exact": 2.0, "choice": 2.0, "numeric": 1.5, "symbolic": 1.5, "none": 0.0}
DEGENERATE_PENALTY = -2.0
DEGENERATE_MARKER = "addCriterion"  # a known Qwen-VL failure: the model loops on this token and newlines
DEGENERATE_SHARE = 0.5  # penalized when the marker and newlines make up at least this share of the characters
META_COLUMNS = ("precision", "question_type", "choices", "unit", "answer_type")


def degeneration_ratio(text: str) -> float:
    """Share of the characters that belong to `addCriterion` occurrences or are newlines.

    Characters are Unicode code points (Python's len; in JavaScript, `[...text].length`).

    Args:
        text: the completion text.

    Returns:
        A share in [0, 1]; 0.0 for an empty text.

    >>> degeneration_ratio("addCriterion\\naddCriterion\\n")
    1.0
    """
    if not isinstance(text, str) or not text:
        return 0.0
    spam = text.count(DEGENERATE_MARKER) * len(DEGENERATE_MARKER) + text.count("\n")
    return spam / len(text)


def format_parts(completion) -> dict:
    """The pieces of the format reward for one completion, for logs, eval records and the reward calculator.

    Args:
        completion: one completion, in any form `answers.as_text` accepts.

    Returns:
        `{reasoning_blocks, solution_blocks, degeneration_ratio, degenerate, score}`, counted after `<think>`
        blocks are removed; `score` is what `format_reward` gives.

    >>> parts = format_parts("<SOLUTION>1</SOLUTION>")
    >>> parts["reasoning_blocks"], parts["solution_blocks"], parts["degenerate"], parts["score"]
    (0, 1, False, 1.0)
    """
    text = answers.strip_think(answers.as_text(completion))
    reasoning = answers.count_blocks(text, answers.REASONING_START, answers.REASONING_END)
    solution = answers.count_blocks(text, answers.SOLUTION_START, answers.SOLUTION_END)
    ratio = degeneration_ratio(text)
    degenerate = ratio >= DEGENERATE_SHARE
    score = float(reasoning == 1) + float(solution == 1) + (DEGENERATE_PENALTY if degenerate else 0.0)
    return {"reasoning_blocks": reasoning, "solution_blocks": solution, "degeneration_ratio": ratio,
            "degenerate": degenerate, "score": score}


def format_reward(completions, log_metric=None, **kwargs) -> list[float]:
    """+1 for exactly one REASONING block, +1 for exactly one SOLUTION block, -2 for `addCriterion` spam.

    Args:
        completions: plain strings or TRL conversational completions.
        log_metric: the trainer's metric logger (TRL passes it); logs `format/degenerate_rate`, the share of
            completions penalized for spam, so a collapse shows in the logs before it sinks the reward.
        **kwargs: data set columns (unused).

    Returns:
        One score in {-2, -1, 0, 1, 2} per completion.

    >>> format_reward([[{"role": "assistant", "content": "<REASONING>x</REASONING>"}], "addCriterion\\n" * 9])
    [1.0, -2.0]
    """
    parts = [format_parts(c) for c in _as_list(completions)]
    if callable(log_metric) and parts:
        log_metric("format/degenerate_rate", sum(p["degenerate"] for p in parts) / len(parts))
    return [p["score"] for p in parts]


def correctness_parts(completion, answer, **meta) -> dict:
    """The pieces of the correctness reward for one completion: prediction, matched rule, score (None = skip).

    Args:
        completion: one completion, in any form `answers.as_text` accepts.
        answer: the gold answer; None (or blank) means there is nothing to score against.
        **meta: the item's MathVista columns (precision, question_type, choices, unit, answer_type), and
            `symbolic=True` to let math-verify judge equivalence (see `answers.match_kind`).

    Returns:
        `{prediction, match, score}`: the SOLUTION value (None without exactly one block), the rule that
        matched (`answers.MATCH_KINDS`), and the reward (None when the gold is missing: TRL skips the sample).

    >>> correctness_parts("<SOLUTION>B</SOLUTION>", "7", question_type="multi_choice", choices=["3", "7"])
    {'prediction': 'B', 'match': 'choice', 'score': 2.0}
    """
    prediction = answers.extract_solution(completion)
    if not answers.as_answer(answer):  # no usable gold: None tells TRL to skip the sample
        return {"prediction": prediction, "match": "none", "score": None}
    kind = answers.match_kind(prediction, answer, **meta)
    return {"prediction": prediction, "match": kind, "score": MATCH_SCORES[kind]}


def correctness_reward(completions, answer, **kwargs) -> list[float | None]:
    """2.0 for an exact match with the gold answer, 1.5 for a numeric one, 0.0 otherwise, None without a gold.

    MathVista's rules: option letters pick their option, `precision` rounds float answers, a trailing `unit`
    is allowed. No symbolic matching (see `symbolic_correctness_reward`).

    Args:
        completions: plain strings or TRL conversational completions.
        answer: the gold answers, one per completion.
        **kwargs: MathVista columns that refine the match, one value per completion: precision,
            question_type, choices, unit, answer_type. TRL's `log_metric` logs `correctness/skipped_rate`.

    Returns:
        One score per completion; None where the gold answer is missing.

    >>> correctness_reward(["<SOLUTION>1,250</SOLUTION>", "<SOLUTION>7</SOLUTION>"], answer=["1250", None])
    [1.5, None]
    >>> correctness_reward(["<SOLUTION>3.14159</SOLUTION>"], answer=["3.14"], precision=[2])
    [1.5]
    """
    return _correctness(completions, answer, kwargs, symbolic=False)


def symbolic_correctness_reward(completions, answer, **kwargs) -> list[float | None]:
    """`correctness_reward`, plus 1.5 when math-verify finds the answer equivalent to the gold (geometry).

    For geo3k-style answers (`2\\sqrt{3}`, `\\frac{4}{3}`); off for MathVista, whose string and number rules
    are the official ones. Slower: each new answer is parsed with sympy.

    Args:
        completions: plain strings or TRL conversational completions.
        answer: the gold answers, one per completion.
        **kwargs: as for `correctness_reward`.

    Returns:
        One score per completion; None where the gold answer is missing.

    >>> symbolic_correctness_reward(["<SOLUTION>\\\\sqrt{12}</SOLUTION>"], answer=["2\\\\sqrt{3}"])
    [1.5]
    """
    return _correctness(completions, answer, kwargs, symbolic=True)


def _correctness(completions, answer, kwargs: dict, *, symbolic: bool) -> list[float | None]:
    completions = _as_list(completions)
    _check_columns(len(completions), {"answer": answer, **{k: kwargs.get(k) for k in META_COLUMNS}})
    scores = []
    for i, completion in enumerate(completions):
        meta = {key: _column(kwargs.get(key), i) for key in META_COLUMNS}
        scores.append(correctness_parts(completion, _column(answer, i), symbolic=symbolic, **meta)["score"])
    log_metric = kwargs.get("log_metric")
    if callable(log_metric) and scores:
        # A counted skip beats a silent one: a rising rate means the data lost its gold answers.
        log_metric("correctness/skipped_rate", sum(s is None for s in scores) / len(scores))
    return scores


def reward_funcs(symbolic: bool = False) -> list:
    """The reward functions, in the order of `REWARD_WEIGHTS`; `symbolic=True` for geometry data (geo3k).

    >>> [f.__name__ for f in reward_funcs(symbolic=True)]
    ['format_reward', 'symbolic_correctness_reward']
    """
    return [format_reward, symbolic_correctness_reward if symbolic else correctness_reward]


REWARD_FUNCS = reward_funcs()
REWARD_WEIGHTS = [FORMAT_WEIGHT, CORRECTNESS_WEIGHT]


def total_reward(format_score: float, correctness_score: float | None) -> float:
    """The combined reward R = 0.3 * format + 1.0 * correctness (a skipped correctness counts 0, as in TRL).

    >>> total_reward(2.0, 2.0)
    2.6
    """
    return round(FORMAT_WEIGHT * format_score + CORRECTNESS_WEIGHT * (correctness_score or 0.0), 10)


def _as_list(completions) -> list:
    # TRL passes a list; a lone completion (a string, one message) is a batch of one, and None an empty batch.
    if completions is None:
        return []
    if isinstance(completions, (str, bytes, bytearray, dict)):
        return [completions]
    try:
        return list(completions)
    except TypeError:  # not iterable: one odd completion
        return [completions]


def _check_columns(n: int, columns: dict) -> None:
    """A data set column must hold one value per completion, as TRL passes them: a column of another length would
    pair answers with the wrong completions, so it is an error, never a silent skip (a scalar holds for all)."""
    for name, value in columns.items():
        if isinstance(value, (list, tuple)) and len(value) != n:
            from vlrl.base.errors import DataError

            raise DataError(f"the {name!r} column has {len(value)} values for {n} completions; a reward needs one "
                            "value per completion (TRL repeats each prompt's columns num_generations times), or one "
                            "scalar for all. Pass the columns as the trainer does, or repeat them per generation.")


def _column(value, i: int):
    # The i-th value of a data set column (lengths checked by _check_columns); a scalar (answer="3", precision=2)
    # holds for every completion.
    if value is None or isinstance(value, (str, bytes, bool, int, float)):
        return value
    try:
        return value[i]
    except (LookupError, TypeError, ValueError):  # an odd column type (a dict, a set): no value for this completion
        return None
