"""The one answer grammar of vlrl: tags, solution extraction and answer matching.

Rewards (`vlrl.grammar.rewards`), evaluation (`vlrl.evaluation.evaluate`) and the browser reward calculator (which runs this file
in the page; the rules are in rewards/SPEC.md) all go through here, so "the reward says correct" and "the eval
says correct" cannot disagree. Numbers and answer text are read by `vlrl.grammar.values`, the options of a multi-choice
item by `vlrl.grammar.choices`; `parse_number`, `as_answer` and `choice_of` are used from here. Two verbs:

    >>> extract_solution("<REASONING>2+1</REASONING><SOLUTION> 3 </SOLUTION>")
    '3'
    >>> is_correct("3.0", "3")
    True

Every function here accepts any input and never raises: a completion or an answer of an unexpected type is
text "" or a missing answer (None), and every scan is linear in the input (no regex that can backtrack).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

from vlrl.grammar.choices import choice_of, gold_option, options_of, pick  # noqa: F401  (choice_of: re-exported)
from vlrl.grammar.values import as_answer, parse_number, strip


@dataclass(frozen=True)
class AnswerFormat:
    """The answer format in one place (verifiers' XMLParser is the model): its tags, the instruction that asks for
    them, and the completion that follows it. The prompts, the warm start's targets, the export probe, the parser
    and the format reward all read from `FORMAT`, so they cannot drift apart.

    >>> FORMAT.completion("2+1=3", 3)
    '<REASONING>2+1=3</REASONING><SOLUTION>3</SOLUTION>'
    >>> extract_solution(FORMAT.completion("2+1=3", 3))
    '3'
    """

    reasoning: tuple[str, str] = ("<REASONING>", "</REASONING>")
    solution: tuple[str, str] = ("<SOLUTION>", "</SOLUTION>")

    @property
    def instruction(self) -> str:
        """What every prompt ends with: reason in the reasoning tags, answer in the solution tags."""
        (r0, r1), (s0, s1) = self.reasoning, self.solution
        return f"Reason about the image inside {r0}...{r1}, then give only the final answer inside {s0}...{s1}."

    def completion(self, reasoning: str, answer) -> str:
        """A well-formed completion: what a warm start teaches, and what the format reward scores highest."""
        return f"{self.reasoning[0]}{reasoning}{self.reasoning[1]}{self.answer(answer)}"

    def answer(self, answer) -> str:
        """The answer in the solution tags alone: an environment's action as the prompt shows it, and the reply of
        a model-free policy (`vlrl env play`).

        >>> FORMAT.answer("move_left, do")
        '<SOLUTION>move_left, do</SOLUTION>'
        """
        return f"{self.solution[0]}{answer}{self.solution[1]}"


FORMAT = AnswerFormat()
(REASONING_START, REASONING_END), (SOLUTION_START, SOLUTION_END) = FORMAT.reasoning, FORMAT.solution
INSTRUCTION = FORMAT.instruction
THINK_START, THINK_END = "<think>", "</think>"

# Which rule matched, and what each is worth to the correctness reward (vlrl.grammar.rewards.MATCH_SCORES).
MATCH_KINDS = ("exact", "choice", "numeric", "symbolic", "none")

MAX_PRECISION = 15  # doubles hold ~15-17 significant digits; more decimals than that mean nothing
_MAX_NESTING = 32  # completions nest at most ~3 deep (list of messages, content parts); deeper is garbage


def as_text(completion) -> str:
    """Returns the text of a completion in any form a trainer passes.

    Plain strings (Unsloth's patched GRPOTrainer), TRL's conversational
    `[{"role": "assistant", "content": ...}]`, content given as a list of parts
    (`{"type": "text", "text": ...}`), bytes (decoded as UTF-8, bad bytes replaced). Messages of other roles,
    non-text parts and anything else contribute nothing.

    Args:
        completion: the completion, in any of those forms.

    Returns:
        The concatenated text, "" when there is none.

    >>> as_text([{"role": "assistant", "content": [{"type": "text", "text": "hi"}]}])
    'hi'
    >>> as_text(None)
    ''
    """
    parts, stack, seen = [], [(completion, 0)], set()
    # Iterative, with a depth cap and a seen-set: no RecursionError, no endless loop on a list holding itself.
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            parts.append(item)
        elif isinstance(item, (bytes, bytearray)):
            parts.append(bytes(item).decode("utf-8", errors="replace"))
        elif depth >= _MAX_NESTING or id(item) in seen:
            continue
        elif isinstance(item, dict):
            seen.add(id(item))
            role = item.get("role")
            if isinstance(role, str) and role != "assistant":
                continue  # the prompt's turns, if a caller passed the whole conversation
            if "content" in item:
                stack.append((item["content"], depth + 1))
            elif item.get("type") == "text":
                stack.append((item.get("text"), depth + 1))
        elif isinstance(item, (list, tuple)):
            seen.add(id(item))
            stack.extend((part, depth + 1) for part in reversed(item))
    return "".join(parts)


def strip_think(text: str) -> str:
    """Removes `<think>...</think>` blocks (Qwen3-VL "-Thinking" checkpoints) before anything is scored.

    An unclosed `<think>` is unfinished thinking: it and everything after it go. A `</think>` with no
    opening (the thinking chat template puts `<think>` in the prompt) ends the thinking: only what follows the
    last one stays.

    Args:
        text: the completion text.

    Returns:
        The text with the thinking removed.

    >>> strip_think("<think>hmm</think><SOLUTION>1</SOLUTION>")
    '<SOLUTION>1</SOLUTION>'
    >>> strip_think("the prompt opened it</think> 7")
    ' 7'
    """
    if not isinstance(text, str):
        return ""
    out, pos = [], 0
    while True:
        start = text.find(THINK_START, pos)
        if start < 0:
            out.append(text[pos:])
            break
        out.append(text[pos:start])
        end = text.find(THINK_END, start + len(THINK_START))
        if end < 0:
            break
        pos = end + len(THINK_END)
    text = "".join(out)
    close = text.rfind(THINK_END)
    return text[close + len(THINK_END):] if close >= 0 else text


def _block_spans(text: str, start_tag: str, end_tag: str, limit: int | None = None) -> list[tuple[int, int]]:
    # A block is a start tag and the nearest end tag after it; the scan resumes after that end tag. These are
    # the matches of re.findall(f"{start_tag}(.*?){end_tag}", text, re.DOTALL), found in linear time.
    spans, pos = [], 0
    while limit is None or len(spans) < limit:
        start = text.find(start_tag, pos)
        if start < 0:
            break
        end = text.find(end_tag, start + len(start_tag))
        if end < 0:  # no end tag after this start, so none after any later start either
            break
        spans.append((start + len(start_tag), end))
        pos = end + len(end_tag)
    return spans


def count_blocks(text: str, start_tag: str, end_tag: str) -> int:
    """Counts `start_tag ... end_tag` blocks: each start tag with the nearest end tag after it, scanning on.

    Args:
        text: the text to scan (already through `as_text` and `strip_think`).
        start_tag: e.g. `SOLUTION_START`.
        end_tag: e.g. `SOLUTION_END`.

    Returns:
        The number of blocks, as `len(re.findall(start + "(.*?)" + end, text, re.DOTALL))` would count them.

    >>> count_blocks("<SOLUTION>1</SOLUTION><SOLUTION>2</SOLUTION>", SOLUTION_START, SOLUTION_END)
    2
    >>> count_blocks("<SOLUTION><SOLUTION>1</SOLUTION>", SOLUTION_START, SOLUTION_END)
    1
    """
    tags = (start_tag, end_tag)
    if not isinstance(text, str) or not all(isinstance(tag, str) and tag for tag in tags):
        return 0  # (an empty tag would match everywhere)
    return len(_block_spans(text, start_tag, end_tag))


def extract_solution(completion) -> str | None:
    """Returns the value inside the single `<SOLUTION>` block, stripped; None unless there is exactly one.

    The same block rule as the format reward, so "one SOLUTION block" means the same thing to both rewards.

    Args:
        completion: a completion in any form `as_text` accepts; `<think>` blocks are removed first.

    Returns:
        The answer text ("" for an empty block), or None when there is no SOLUTION block or more than one.

    >>> extract_solution("<SOLUTION>1</SOLUTION><SOLUTION>2</SOLUTION>") is None
    True
    """
    text = strip_think(as_text(completion))
    spans = _block_spans(text, SOLUTION_START, SOLUTION_END, limit=2)
    if len(spans) != 1:
        return None
    start, end = spans[0]
    return strip(text[start:end])


def _as_precision(value) -> int | None:
    """MathVista's `precision` as decimals 0..15; anything else (None, NaN, 2.5, -1, "two") means none."""
    if isinstance(value, str):
        value = strip(value)
        digits = value.isascii() and value.isdigit() and len(value) <= 2  # "²".isdigit() is True too
        return int(value) if digits and int(value) <= MAX_PRECISION else None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    if not isinstance(value, numbers.Integral):
        value = float(value)
        if not value.is_integer():  # 2.5, NaN, inf
            return None
    return int(value) if 0 <= value <= MAX_PRECISION else None


def is_correct(pred, gold, **meta) -> bool:
    """Whether a predicted answer matches the gold answer: `match_kind(pred, gold, **meta) != "none"`.

    Args:
        pred: the extracted prediction (from `extract_solution`), or None.
        gold: the gold answer.
        **meta: the item's MathVista columns (precision, question_type, choices, unit, answer_type) and
            `symbolic`; see `match_kind`.

    Returns:
        True when a rule matched.

    >>> is_correct("B", "7", question_type="multi_choice", choices=["3", "7"])
    True
    >>> is_correct("3.14159", "3.14", precision=2)
    True
    """
    return match_kind(pred, gold, **meta) != "none"


def match_kind(pred, gold, *, precision=None, question_type=None, choices=None, unit=None, answer_type=None,
               symbolic: bool = False, **_) -> str:
    """Which rule matched a prediction to the gold answer: "exact", "choice", "numeric", "symbolic" or "none".

    The rules, tried in order (rewards/SPEC.md has the full table):
    1. multi-choice (`question_type="multi_choice"` with `choices`): when the prediction picks an option
       (`choice_of`), it is right if that option is the gold: "exact" when the text is the gold verbatim,
       "numeric" when it is the option's number written differently ("7.0", "40" for "40m", "1/3" for
       "\\frac{1}{3}"), else "choice"; a picked wrong option, or a prediction that fits several options, is
       "none".
    2. "exact": the stripped texts are equal.
    3. "numeric": both parse as numbers (`parse_number`, with the item's `unit`) and are equal; with a
       `precision`, equal once both are rounded to that many decimals (Python's round(), as MathVista rounds).
    4. "symbolic" (only with `symbolic=True`, off for MathVista): math-verify finds them equivalent, gold
       first.

    Args:
        pred: the prediction, or None.
        gold: the gold answer, or None.
        precision: decimals a float answer is compared at (MathVista's `precision`).
        question_type: "multi_choice" turns on rule 1.
        choices: the options of a multi-choice item.
        unit: a trailing unit the numbers may carry ("12 cm").
        answer_type: MathVista's answer type; accepted, but it changes nothing: `precision` carries the float
            rule, and MathVista's integer rule (truncate 3.7 to 3) is deliberately not applied.
        symbolic: also try math-verify (geometry answers like `2\\sqrt{3}`).

    Returns:
        The name of the rule that matched; "none" also for a missing prediction or gold.

    >>> match_kind("3", "3"), match_kind("3.0", "3"), match_kind("4", "3")
    ('exact', 'numeric', 'none')
    """
    pred, gold = as_answer(pred), as_answer(gold)
    if pred is None or not gold:
        return "none"
    options = options_of(choices) if question_type == "multi_choice" else None
    if options is not None:
        picked, gold_choice = pick(pred, options), gold_option(gold, options)
        if picked is not None:  # a pick of another option, or of several (option None), is wrong
            if picked.option != gold_choice:
                return "none"
            return "exact" if pred == gold else "numeric" if picked.by_number else "choice"
        gold = gold_choice  # a gold given as a letter is compared as its option's text from here on
    if pred == gold:
        return "exact"
    p, g = parse_number(pred, unit), parse_number(gold, unit)
    if p is not None and g is not None:
        digits = _as_precision(precision)
        if p == g or (digits is not None and round(p, digits) == round(g, digits)):
            return "numeric"
        return "none"  # two numbers that differ: no symbolic second opinion on plain numbers
    if symbolic:
        from vlrl.grammar.symbolic import equivalent

        if equivalent(pred, gold):
            return "symbolic"
    return "none"


def check_gold(answer, **meta) -> str | None:
    """Why a gold answer cannot score full marks against itself, or None when it can (validate data with it).

    The one known case: a multi-choice item whose options are letters in another order ("(A) B (B) A"): a gold
    "A" is read as option A, as MathVista's scorer reads it, so no prediction "A" can be right.

    >>> check_gold("7", question_type="multi_choice", choices=["3", "7"]) is None
    True
    >>> print(check_gold("A", question_type="multi_choice", choices=["B", "A"]))  # doctest: +ELLIPSIS
    gold 'A' does not score full marks against itself (match 'none'): ...
    """
    gold = as_answer(answer)
    if not gold:
        return "gold answer is missing"
    kind = match_kind(gold, gold, **meta)
    if kind != "exact":
        return (f"gold {gold!r} does not score full marks against itself (match {kind!r}): a bare option "
                "letter means that option; give multi-choice golds as the option's text, in choices that are "
                "not re-ordered letters")
    return None
