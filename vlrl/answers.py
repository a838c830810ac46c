"""The one answer grammar of vlrl: tags, solution extraction, number parsing and answer matching.

Rewards (`vlrl.rewards`), evaluation (`vlrl.evaluate`) and the browser reward calculator all go through this file,
so "the reward says correct" and "the eval says correct" cannot disagree. Two verbs, gold second:

    >>> extract_solution("<REASONING>2+1</REASONING><SOLUTION> 3 </SOLUTION>")
    '3'
    >>> is_correct("3.0", "3")
    True
"""

from __future__ import annotations

import math
import re

REASONING_START, REASONING_END = "<REASONING>", "</REASONING>"
SOLUTION_START, SOLUTION_END = "<SOLUTION>", "</SOLUTION>"
THINK_START, THINK_END = "<think>", "</think>"

# A plain decimal, optionally signed, with optional thousands separators ("1,250") or a leading dot (".5").
_NUMBER = re.compile(r"[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)?(?:\.\d+)?(?:[eE][+-]?\d+)?")


def as_text(completion) -> str:
    """Returns the text of a completion in any form a trainer passes.

    Plain strings (Unsloth's patched GRPOTrainer), TRL's conversational `[{"role": "assistant", "content": ...}]`,
    content given as a list of parts (`{"type": "text", "text": ...}`), bytes, or anything else (-> "").

    >>> as_text([{"role": "assistant", "content": [{"type": "text", "text": "hi"}]}])
    'hi'
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, (bytes, bytearray)):
        return bytes(completion).decode("utf-8", errors="replace")
    if isinstance(completion, dict):
        if "content" in completion:
            return as_text(completion["content"])
        if completion.get("type") == "text":
            return as_text(completion.get("text"))
        return ""
    if isinstance(completion, (list, tuple)):
        # Conversational: the assistant turns; a list of content parts: their text.
        return "".join(as_text(part) for part in completion if not _is_other_role(part))
    return ""


def _is_other_role(part) -> bool:
    return isinstance(part, dict) and part.get("role") not in (None, "assistant")


def strip_think(text: str) -> str:
    """Removes `<think>...</think>` blocks (Qwen3-VL "-Thinking" checkpoints), and an unclosed one's opening.

    >>> strip_think("<think>hmm</think><SOLUTION>1</SOLUTION>")
    '<SOLUTION>1</SOLUTION>'
    """
    out, pos = [], 0
    while True:
        start = text.find(THINK_START, pos)
        if start < 0:
            out.append(text[pos:])
            break
        out.append(text[pos:start])
        end = text.find(THINK_END, start + len(THINK_START))
        if end < 0:  # unclosed: everything after it is unfinished thinking
            break
        pos = end + len(THINK_END)
    text = "".join(out)
    # Qwen3 thinking templates put <think> in the prompt, so the completion may start with a bare "...</think>".
    close = text.rfind(THINK_END)
    return text[close + len(THINK_END):] if close >= 0 else text


def count_blocks(text: str, start_tag: str, end_tag: str) -> int:
    """Counts well-formed `start_tag ... end_tag` blocks, scanning once (linear time, no regex backtracking).

    >>> count_blocks("<SOLUTION>1</SOLUTION><SOLUTION>2</SOLUTION>", SOLUTION_START, SOLUTION_END)
    2
    """
    count, pos = 0, 0
    while True:
        start = text.find(start_tag, pos)
        if start < 0:
            return count
        end = text.find(end_tag, start + len(start_tag))
        if end < 0:
            return count
        count, pos = count + 1, end + len(end_tag)


def extract_solution(text) -> str | None:
    """Returns the stripped value inside the single `<SOLUTION>` block, or None unless there is exactly one.

    Args:
        text: a completion, in any form `as_text` accepts.

    Returns:
        The answer text, or None when there is no SOLUTION block, more than one, or stray tags.

    >>> extract_solution("<SOLUTION>1</SOLUTION><SOLUTION>2</SOLUTION>") is None
    True
    """
    text = strip_think(as_text(text))
    if text.count(SOLUTION_START) != 1 or text.count(SOLUTION_END) != 1:
        return None
    start = text.find(SOLUTION_START) + len(SOLUTION_START)
    end = text.find(SOLUTION_END, start)
    if end < 0:
        return None
    return text[start:end].strip()


def parse_number(text, unit: str | None = None) -> float | None:
    """Parses a plain number: "3", "3.0", "-0.5", "1,250", "12 cm" when `unit` is "cm", "50%". None otherwise.

    >>> parse_number("1,250")
    1250.0
    >>> parse_number("12 cm", unit="cm")
    12.0
    >>> parse_number("12 apples") is None
    True
    """
    if not isinstance(text, str):
        if isinstance(text, (int, float)) and not isinstance(text, bool) and math.isfinite(text):
            return float(text)
        return None
    s = text.strip()
    if len(s) > 64:  # no real answer is this long; keeps parsing cheap on garbage
        return None
    if unit and s.endswith(unit.strip()) and unit.strip():
        s = s[: -len(unit.strip())].strip()
    s = s.removeprefix("$").removesuffix("%").removesuffix("$").strip()
    if not s or _NUMBER.fullmatch(s) is None or not any(c.isdigit() for c in s):
        return None
    value = float(s.replace(",", ""))
    return value if math.isfinite(value) else None


def choice_letter_to_text(pred: str, choices) -> str:
    """Maps an option letter ("B", "(B)", "B.") to its choice text; anything else is returned unchanged.

    >>> choice_letter_to_text("(B)", ["3", "7"])
    '7'
    """
    if not choices:
        return pred
    s = pred.strip().strip("()").rstrip(".").strip()
    if len(s) == 1 and s.upper().isalpha():
        index = ord(s.upper()) - ord("A")
        if 0 <= index < len(choices):
            return str(choices[index])
    return pred


def is_correct(pred, gold, *, precision=None, question_type=None, choices=None, unit=None, **_) -> bool:
    """Whether a predicted answer matches the gold answer under MathVista's rules.

    Args:
        pred: the extracted prediction (from `extract_solution`), or None.
        gold: the gold answer.
        precision: decimals a float answer is compared at (MathVista's `precision`).
        question_type: "multi_choice" maps option letters to `choices`.
        choices: the options of a multi-choice item.
        unit: a trailing unit that may follow the number ("12 cm").

    Returns:
        True when the strings match exactly, or the numbers match (at `precision` decimals when given).

    >>> is_correct("B", "7", question_type="multi_choice", choices=["3", "7"])
    True
    >>> is_correct("3.14159", "3.14", precision=2)
    True
    """
    return match_kind(pred, gold, precision=precision, question_type=question_type, choices=choices, unit=unit) != "none"


def match_kind(pred, gold, *, precision=None, question_type=None, choices=None, unit=None, **_) -> str:
    """Which rule matched: "exact", "numeric" or "none" (also for a missing prediction or gold).

    >>> match_kind("3", "3"), match_kind("3.0", "3"), match_kind("4", "3")
    ('exact', 'numeric', 'none')
    """
    if pred is None or gold is None:
        return "none"
    pred, gold = str(pred).strip(), str(gold).strip()
    if question_type == "multi_choice":
        pred = choice_letter_to_text(pred, choices)
    if pred == gold:
        return "exact"
    p, g = parse_number(pred, unit), parse_number(gold, unit)
    if p is None or g is None:
        return "none"
    digits = _as_int(precision)
    if digits is not None:
        return "numeric" if round(p, digits) == round(g, digits) else "none"
    return "numeric" if math.isclose(p, g, rel_tol=1e-9, abs_tol=1e-9) else "none"


def _as_int(value) -> int | None:
    try:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return None
        return int(value)
    except (TypeError, ValueError):
        return None
