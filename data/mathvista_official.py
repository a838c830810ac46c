"""MathVista's official scoring rule, transcribed from evaluation/calculate_score.py of the MathVista repository:
the one copy that the agreement test (tests/test_mathvista_agreement.py) and the agreement bench
(bench/mathvista_agreement.py) compare vlrl's answer grammar against.

    >>> official_prediction("(B)", {"question_type": "multi_choice", "choices": ["3", "7"]})
    '7'
"""

from __future__ import annotations

import re


def edit_distance(a: str, b: str) -> int:
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        previous, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (ca != cb))
    return row[-1]


def official_prediction(extraction, item: dict):
    """normalize_extracted_answer of calculate_score.py: option letter -> option, else the nearest option by
    edit distance; integer -> str(int(float(x))); float -> str(round(float(x), precision)); else str(x)."""
    if item["question_type"] == "multi_choice":
        text = extraction.strip() if isinstance(extraction, str) else str(extraction)
        letter = re.findall(r"\(([a-zA-Z])\)", text)
        if letter:
            text = letter[0].upper()
        letters = [chr(ord("A") + i) for i in range(len(item["choices"]))]
        if text in letters:
            return item["choices"][letters.index(text)]
        distances = [edit_distance(text, choice) for choice in item["choices"]]
        return item["choices"][distances.index(min(distances))]
    try:
        if item.get("answer_type") == "integer":
            return str(int(float(extraction)))
        if item.get("answer_type") == "float":
            return str(round(float(extraction), int(item["precision"])))
        return str(extraction)
    except (TypeError, ValueError, OverflowError):
        return None


def official_correct(extraction, answer: str, **item) -> bool:
    """Whether calculate_score.py counts `extraction` right for an item with this gold `answer`."""
    return official_prediction(extraction, item) == answer
