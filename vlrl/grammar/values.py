"""Reading an answer's value, the bottom layer of vlrl's answer grammar (rewards/SPEC.md sections 1 and 6): which
characters are whitespace, any gold or prediction as stripped text (`as_answer`), and numbers (`parse_number`).

`vlrl.grammar.answers` (extraction and matching) and `vlrl.grammar.choices` (multi-choice options) build on it; answers re-exports
`as_answer` and `parse_number`, so `answers.parse_number` is the name to use. Like the rest of the grammar, every
function takes any input and never raises.

    >>> parse_number("1,250"), as_answer(3)
    (1250.0, '3')
"""

from __future__ import annotations

import math
import numbers
import re

# Stripped around answers. ASCII only, spelled out, so that the JavaScript port strips exactly the same
# characters (Python's str.strip() and JavaScript's trim() disagree on a few Unicode spaces).
WHITESPACE = " \t\n\r\v\f"

# A number: optional sign, digits with optional thousands separators ("1,250"), optional decimals (".5",
# "3."), optional exponent: Python's float() syntax minus inf/nan/underscores, plus thousands separators.
# ASCII digits only: Python's \d and float() also take "٣" and "３", which the JavaScript port would not.
_NUMBER = re.compile(
    r"[+-]?(?:(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"
)
MAX_NUMBER_CHARS = 100  # no real number answer is longer; keeps parsing cheap on garbage
# Decorations a number may carry whatever the item's unit: LaTeX math delimiters or a currency sign ($), and
# one percent or degree sign. A unit only counts when it is the item's `unit`.
_NUMBER_SUFFIXES = ("\\%", "%", "^{\\circ}", "^\\circ", "°")


def strip(text: str) -> str:
    """The text without `WHITESPACE` at either end."""
    return text.strip(WHITESPACE)


def parse_number(text, unit: str | None = None) -> float | None:
    """Parses a number: "3", "3.0", "-.5", "1,250", "1e3", "50%", "30°", "$3$", "12 cm" when `unit` is "cm".

    Args:
        text: the answer text (a finite int or float is returned as a float).
        unit: the item's unit; a trailing copy of it is ignored. Any other trailing word makes it no number.

    Returns:
        The value, or None when the text is not a number in this grammar (or is not finite).

    >>> parse_number("1,250")
    1250.0
    >>> parse_number("12 cm", unit="cm")
    12.0
    >>> parse_number("12 apples") is None
    True
    """
    if isinstance(text, bool):
        return None
    if isinstance(text, numbers.Real):
        try:
            value = float(text)
        except OverflowError:  # an int beyond the double range
            return None
        return value if math.isfinite(value) else None
    if not isinstance(text, str) or len(text) > MAX_NUMBER_CHARS:
        return None
    s = strip(text)
    unit = strip(unit) if isinstance(unit, str) else ""
    if unit and len(s) > len(unit) and s.endswith(unit):
        s = strip(s[: -len(unit)])
    s = s.removeprefix("$").removesuffix("$")
    for suffix in _NUMBER_SUFFIXES:
        if s.endswith(suffix):
            s = strip(s[: -len(suffix)])
            break
    if _NUMBER.fullmatch(s) is None:
        return None
    value = float(s.replace(",", ""))
    return value if math.isfinite(value) else None


def as_answer(value) -> str | None:
    """An answer (gold or predicted) as stripped text; None when it is missing or of a type no answer has.

    Text and bytes are stripped of `WHITESPACE`; a finite int or float becomes `str(value)`; None, NaN (a data
    frame's missing value), bools, lists and anything else are None.

    >>> as_answer(" 7 "), as_answer(3), as_answer(float("nan"))
    ('7', '3', None)
    """
    if isinstance(value, str):
        return strip(value)
    if isinstance(value, (bytes, bytearray)):
        return strip(bytes(value).decode("utf-8", errors="replace"))
    if isinstance(value, bool) or not isinstance(value, numbers.Real):  # numbers.Real takes numpy scalars too
        return None
    if isinstance(value, numbers.Integral):
        # No answer has 100 digits; str() of an int refuses more than 4300.
        return str(int(value)) if abs(value) < 10**100 else None
    value = float(value)
    return str(value) if math.isfinite(value) else None  # NaN is how a data frame spells a missing value
