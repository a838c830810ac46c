"""Symbolic answer matching for geometry-style answers (`2\\sqrt{3}`, `\\frac{4}{3}`), through math-verify.

The answer grammar (`vlrl.grammar.answers.match_kind`) asks here only when a run turns symbolic matching on
(`[training] reward = "symbolic"`, for geo3k); MathVista's rules are string and number rules. Parsing is cached
and bounded in time, since the same wrong answers come back across a group's generations.
"""

from __future__ import annotations

import functools
import logging
import threading

MAX_SYMBOLIC_CHARS = 200  # sympy parses it; geometry answers are short, and long hedges should not fit


@functools.lru_cache(maxsize=16384)  # verify costs ~0.1 s (sympy), and the same wrong answers come back
def equivalent(pred: str, gold: str) -> bool:
    r"""Whether math-verify shows `pred` equivalent to `gold` (gold first, as math-verify wants); False when either
    is too long, does not parse, or sympy gives up.

    >>> equivalent(r"\sqrt{12}", r"2\sqrt{3}"), equivalent("3", "4")
    (True, False)
    """
    if len(pred) > MAX_SYMBOLIC_CHARS or len(gold) > MAX_SYMBOLIC_CHARS:
        return False
    gold_parsed, pred_parsed = _parse_math(gold), _parse_math(pred)
    if not gold_parsed or not pred_parsed:
        return False
    from math_verify import verify

    try:
        return bool(verify(list(gold_parsed), list(pred_parsed), timeout_seconds=_timeout(5)))
    except Exception:  # noqa: BLE001 -- math-verify is sympy underneath: any failure means "not shown equal"
        return False


@functools.lru_cache(maxsize=4096)  # golds repeat across a group's generations, and predictions often do too
def _parse_math(text: str) -> tuple:
    try:
        from math_verify import parse
    except ImportError as error:
        raise ImportError("symbolic answer matching needs math-verify: pip install math-verify") from error

    # The SOLUTION value is bare LaTeX ("2\sqrt{3}"); math-verify reads LaTeX only between delimiters.
    wrapped = text if "$" in text else f"${text}$"
    try:
        return tuple(parse(wrapped, parsing_timeout=_timeout(5)))
    except Exception:  # noqa: BLE001 -- unparseable (sympy can fail in many ways): nothing to compare
        return ()


def _timeout(seconds: int) -> int | None:
    # math-verify times out with signal.alarm, which only works in the main thread (a trainer may score in
    # another).
    if threading.current_thread() is threading.main_thread():
        return seconds
    for name in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(name).setLevel(logging.ERROR)  # else it warns "timeout disabled" at every call
    return None
