"""Which option of a multi-choice item a prediction picks (rewards/SPEC.md section 7): the one job of this module.

`answers.match_kind` asks it on every multi-choice item; `choice_of` is the public question. A prediction picks
an option by its letter, by its text, or by writing it in another notation than the option (SPEC.md section 11:
`1/3` for `\\frac{1}{3}`, `40` for `40m`, `['Insects']` for `Insects`, `(0, 0)` for `(u1, u2) = (0, 0)`); the
last only when the prediction fits exactly one option, never when it also fits another.

    >>> choice_of("(B)", ["3", "7"]), choice_of("40", ["35m", "40m"]), choice_of("40", ["40m", "40cm"])
    ('7', '40m', None)

Like the rest of the answer grammar it takes any input, never raises, and runs in time linear in its input.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from vlrl.grammar.values import WHITESPACE, as_answer, parse_number, strip

MAX_OPTIONS = 26  # A..Z
# Units an option may carry after its value, which an answer may leave off when every option carries the same
# one ("40" for "40m"). A list, not a guess: a suffix all options share may be a variable ("2x", "3x") or a
# factor ("2π", "3π"), and no answer may drop those. Add a unit here when a data set needs it.
UNITS = ("°", "^\\circ", "^{\\circ}", "\\degree", "*\\degree", "%", "\\%",
         "mm", "cm", "dm", "m", "km", "cm2", "m2", "km2", "cm^2", "m^2", "cm²", "m²", "cm3", "m3", "cm^3", "m^3",
         "cm³", "m³", "ml", "mL", "kg", "毫米", "厘米", "米", "千米", "公里", "海里", "度")
_UNITS_LONGEST_FIRST = sorted(UNITS, key=len, reverse=True)  # "cm" before "m", "*\degree" before "\degree"
_FRACTIONS = ("\\frac", "\\dfrac", "\\tfrac")
_KEY = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz", WHITESPACE)
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


class Pick(NamedTuple):
    """What a prediction picks: `option` is the picked option's text, or None when the prediction fits several
    options in another notation (a hedge: wrong, whatever the gold); `by_number` is True when the pick read both
    as numbers (a number written differently, which the correctness reward scores as "numeric")."""

    option: str | None
    by_number: bool = False


def options_of(choices) -> list[str] | None:
    """The options of a multi-choice item as stripped text (a null option is ""), or None when there are none."""
    if not isinstance(choices, (list, tuple)) or not choices or len(choices) > MAX_OPTIONS:
        return None
    return [text if (text := as_answer(c)) is not None else "" for c in choices]


def _option_letter(text: str, n_options: int) -> tuple[int, str] | None:
    """Reads an option reference: "B", "(B)", "(b)", "B.", "B)", "B:", maybe followed by the option's text.

    Returns (index, the text after the letter) or None. Lower case counts only inside parentheses, as in
    MathVista's scorer.
    """
    if len(text) >= 3 and text[0] == "(" and text[2] == ")" and text[1].isascii() and text[1].isalpha():
        letter, rest = text[1].upper(), text[3:]
    elif text[:1].isascii() and text[:1].isupper() and (len(text) == 1 or text[1] in ".):"):
        letter, rest = text[0], text[2:]
    else:
        return None
    index = ord(letter) - ord("A")
    return (index, strip(rest)) if index < n_options else None


def _same_text_ignoring_case(a: str, b: str) -> bool:
    return a.translate(_ASCII_LOWER) == b.translate(_ASCII_LOWER)


def _one_item(text: str) -> str:
    """x of a one-item list `[x]`, `['x']`, `["x"]` (an extractor's list of one answer); any other text as is."""
    if len(text) < 2 or text[0] != "[" or text[-1] != "]":
        return text
    inner, depth = strip(text[1:-1]), 0
    for ch in inner:
        depth += (ch in "([{") - (ch in ")]}")
        if ch == "," and depth == 0:
            return text  # several items: a list, which is no one option
    if len(inner) >= 2 and inner[0] == inner[-1] and inner[0] in "'\"":
        inner = strip(inner[1:-1])
    return inner


def _without_unit(text: str, unit: str) -> str:
    """The value before a trailing `unit` ("40" of "40 m"), or "" when the text does not carry it after a value:
    the value must end like a number or an expression (a digit, "}", ")" or "π")."""
    if not unit or not text.endswith(unit):
        return ""
    value = strip(text[: -len(unit)])
    return value if value and (value[-1] in "0123456789})" or value.endswith("π")) else ""


def _common_unit(options: list[str]) -> str:
    """The unit of `UNITS` that every option carries after its value ("m" of 10m, 35m, (6+14√{3})m), or ""."""
    for unit in _UNITS_LONGEST_FIRST:
        if all(_without_unit(option, unit) for option in options):
            return unit
    return ""


def _right_side(option: str) -> str:
    """The right side of an option written as one equation ("(0, 0)" of "(u1, u2) = (0, 0)"), or ""."""
    left, sign, right = option.partition("=")
    if not sign or "=" in right or left[-1:] in "<>!" or not strip(left):
        return ""
    return strip(right)


def _fraction(text: str) -> float | None:
    """a/b, (a/b), \\frac{a}{b} (also \\dfrac, \\tfrac; spaces allowed) of two numbers, as a double."""
    if len(text) >= 2 and text[0] == "(" and text[-1] == ")":
        text = strip(text[1:-1])
    command = next((c for c in _FRACTIONS if text.startswith((c + "{", c + " "))), None)
    if command is not None:
        parts, rest = [], strip(text[len(command):])
        while rest.startswith("{") and len(parts) < 2:
            end = rest.find("}")
            if end < 0:
                return None
            parts, rest = [*parts, rest[1:end]], strip(rest[end + 1:])
        if rest:
            return None
    else:
        parts = text.split("/", 2)
    if len(parts) != 2:
        return None
    numerator, denominator = parse_number(parts[0]), parse_number(parts[1])
    if numerator is None or not denominator:
        return None
    value = numerator / denominator
    return value if math.isfinite(value) else None


def _key(text: str) -> float | str:
    """What a notation stands for: the double of a number or fraction, else the text without whitespace, with
    ASCII letters lowered ("10 \\sqrt { 3 }" and "10\\sqrt{3}" are one key)."""
    number = parse_number(text)
    if number is None:
        number = _fraction(text)
    return number if number is not None else text.translate(_KEY)


def _read(text: str, unit: str) -> str:
    """A prediction or option as rule 5 reads it: out of a one-item list, without the common unit."""
    text = _one_item(text)
    return _without_unit(text, unit) or text


def _in_other_notation(pred: str, options: list[str]) -> Pick | None:
    """The option `pred` writes in another notation (section 11); Pick(None) when it fits several."""
    unit = _common_unit(options)
    key = _key(_read(pred, unit))
    if key == "":
        return None
    fits = set()
    for option in options:
        value = _read(option, unit)
        right = _right_side(value)
        if key == _key(value) or (right and key == _key(right)):
            fits.add(option)
    if not fits:
        return None
    return Pick(fits.pop() if len(fits) == 1 else None, isinstance(key, float))


def pick(pred: str, options: list[str]) -> Pick | None:
    """What a prediction picks among the options of a multi-choice item; None when it picks none.

    Both are stripped text (`as_answer`, `options_of`). The rules, in order (rewards/SPEC.md section 7):
    1. a bare option letter ("B", "(B)", "(b)", "B.") picks its option, as in MathVista's scoring (so a letter
       wins over an option whose text is that letter);
    2. an option's text exactly;
    3. an option's text ignoring ASCII case, when only one option matches;
    4. a letter followed by its own option's text ("(B) 7");
    5. the option in another notation: a one-item list, the unit every option carries left off, the right
       side of an option written as an equation, a fraction or a number equal as a double, whitespace and
       ASCII case ignored (`_in_other_notation`). A prediction that fits several options this way picks
       `Pick(None)`: it is wrong, never rescued by another rule.

    >>> pick("B", ["3", "7"]), pick("7.0", ["3", "7"]), pick("0.5", ["1/2", "\\\\frac{2}{4}"])
    (Pick(option='7', by_number=False), Pick(option='7', by_number=True), Pick(option=None, by_number=True))
    """
    letter = _option_letter(pred, len(options))
    if letter is not None and letter[1] == "":
        return Pick(options[letter[0]])
    if pred in options:
        return Pick(pred)
    same = [c for c in options if _same_text_ignoring_case(pred, c)]
    if len(same) == 1:
        return Pick(same[0])
    if letter is not None and _same_text_ignoring_case(letter[1], options[letter[0]]):
        return Pick(options[letter[0]])
    return _in_other_notation(pred, options)  # None also for "B. 3" when option B is not 3: a contradiction


def choice_of(pred, choices) -> str | None:
    """The option a prediction picks on a multi-choice item (the rules of `pick`), or None when it picks none.

    Args:
        pred: the prediction.
        choices: the item's options (at most 26).

    Returns:
        The picked option's text (stripped), or None.

    >>> choice_of("yes", ["Yes", "No"]), choice_of("B. 3", ["3", "7"]), choice_of("1/3", ["\\\\frac{1}{3}", "3"])
    ('Yes', None, '\\\\frac{1}{3}')
    """
    pred, options = as_answer(pred), options_of(choices)
    if pred is None or options is None:
        return None
    picked = pick(pred, options)
    return picked.option if picked is not None else None


def gold_option(gold: str, options: list[str]) -> str:
    """The option a gold answer means: itself when it is an option's text (MathVista's golds are), else the option
    of a bare letter (other data sets give golds as letters), else the gold as it is."""
    if gold in options:
        return gold
    letter = _option_letter(gold, len(options))
    return options[letter[0]] if letter is not None and letter[1] == "" else gold
