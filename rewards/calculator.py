"""The reward calculator's Python half: the page runs this file in the browser (Pyodide) on vlrl's own answers.py
and rewards.py, fetched from the server, so every number the page shows is computed by the code the trainer uses.

The page hands over its inputs as strings and shows what comes back, each value as Python's `repr` (`2.6`, `1.5`,
`None`, `'3'`). An empty input means the field is absent (None), as in a MathVista row without it.

    >>> import json
    >>> out = json.loads(calculate_json(json.dumps({"completion": "<SOLUTION>3.0</SOLUTION>", "answer": "3"})))
    >>> out["format"], out["correctness"], out["total"]
    ('1.0', '1.5', '1.8')
"""

from __future__ import annotations

import ast
import importlib.abc
import importlib.machinery
import json
import sys
from pathlib import Path


class _FetchVlrlModule(importlib.abc.MetaPathFinder):
    """In the browser: fetches a `vlrl...` module the page did not preload from the server's /vlrl/ tree (a module
    `vlrl/a/b.py`, or a package's `vlrl/a/__init__.py`)."""

    def find_spec(self, name, path=None, target=None):
        if not name.startswith("vlrl."):
            return None
        from js import XMLHttpRequest  # Pyodide's bridge to the page; synchronous, once per module

        parts = name.split(".")[1:]
        package_dir = Path(sys.modules["vlrl"].__file__).parent
        for relative in ("/".join(parts) + ".py", "/".join(parts) + "/__init__.py"):
            request = XMLHttpRequest.new()
            request.open("GET", f"../vlrl/{relative}", False)
            request.send(None)
            if request.status == 200:
                (package_dir / relative).parent.mkdir(parents=True, exist_ok=True)
                (package_dir / relative).write_text(request.responseText)
                return importlib.machinery.PathFinder.find_spec(name, path)
        return None


if sys.platform == "emscripten":
    sys.meta_path.append(_FetchVlrlModule())

from vlrl import rewards  # after the finder, which fetches any other vlrl module these import
from vlrl.grammar import answers

META_FIELDS = rewards.META_COLUMNS  # the item's scoring columns: what the rewards read, and what eval records keep


def meta_from_fields(fields: dict) -> tuple[dict, list[list[str]]]:
    """The keyword arguments `vlrl.grammar.rewards.correctness_parts` gets from the page's inputs, and any input problems.

    `choices` is a JSON list; `precision` is read as a JSON number (`2`, `2.0`), else passed on as typed.
    Problems are [message key, value] pairs the page translates.

    >>> meta_from_fields({"choices": '["3", "7"]', "precision": "2"})[0]["choices"]
    ['3', '7']
    >>> meta_from_fields({"choices": "3, 7"})[1]
    [['choices_not_list', '3, 7']]
    """
    meta, problems = {key: fields.get(key) or None for key in META_FIELDS}, []
    if meta["choices"] is not None:
        try:
            choices = json.loads(meta["choices"])
        except ValueError:
            choices = None
        if not isinstance(choices, list):
            problems.append(["choices_not_list", meta["choices"]])
            choices = None
        meta["choices"] = choices
    if meta["precision"] is not None:
        try:
            precision = json.loads(meta["precision"])
        except ValueError:
            precision = meta["precision"]
        if precision is not None and (isinstance(precision, bool) or not isinstance(precision, (int, float))):
            problems.append(["precision_not_number", meta["precision"]])
            precision = meta["precision"]
        meta["precision"] = precision
    return meta, problems


def calculate(fields: dict) -> dict:
    """Everything the page shows for one set of inputs: the three scores and each reward's parts, as reprs.

    Args:
        fields: the page's inputs as strings: completion, answer, question_type, choices, precision, unit,
            answer_type (missing or empty = absent).

    Returns:
        {"format", "correctness", "total"}: the scores; "format_parts" / "correctness_parts": [name, repr] pairs
        from vlrl.grammar.rewards; "details": how the match was read; "meta": what correctness got; "problems"; "rules".
    """
    completion = fields.get("completion") or ""
    answer = fields.get("answer") or None  # an empty gold field is a missing gold answer: correctness skips it
    meta, problems = meta_from_fields(fields)
    fmt = rewards.format_parts(completion)
    corr = rewards.correctness_parts(completion, answer, **meta)
    total = rewards.total_reward(fmt["score"], corr["score"])
    return {
        "format": repr(fmt["score"]), "correctness": repr(corr["score"]), "total": repr(total),
        "format_parts": [[k, repr(v)] for k, v in fmt.items() if k != "score"],
        "correctness_parts": [[k, repr(v)] for k, v in corr.items() if k != "score"],
        "details": _details(corr.get("prediction"), answer, meta),
        "meta": [[k, repr(v)] for k, v in meta.items()],
        "problems": problems,
        "weights": [repr(rewards.FORMAT_WEIGHT), repr(rewards.CORRECTNESS_WEIGHT)],
        "rules": {name: _first_line(getattr(rewards, name, None))
                  for name in ("format_reward", "correctness_reward", "total_reward")},
    }


def _details(prediction, answer, meta: dict) -> list[list[str]]:
    """How both answers read as numbers (`answers.parse_number`, with the item's unit)."""
    try:
        return [[name, repr(answers.parse_number(None if value is None else str(value), meta.get("unit")))]
                for name, value in (("prediction_number", prediction), ("gold_number", answer))]
    except Exception as err:  # noqa: BLE001  (a changed helper in answers.py must not hide the scores above)
        return [["details_unavailable", repr(f"{type(err).__name__}: {err}")]]


def _first_line(func) -> str:
    return (func.__doc__ or "").strip().splitlines()[0] if func is not None and func.__doc__ else ""


def calculate_json(fields_json: str) -> str:
    """`calculate` across the JavaScript boundary: JSON in, JSON out."""
    return json.dumps(calculate(json.loads(fields_json)))  # ASCII: lone surrogates cross as escapes


def record_fields(record: dict) -> dict:
    """The page's inputs for one eval record (gold and any MathVista fields it carries, top level or under meta).

    >>> record_fields({"completion": "x", "gold": "3", "precision": 2.0})["precision"]
    '2.0'
    """
    meta = {**(record.get("meta") or {}), **{k: record[k] for k in META_FIELDS if record.get(k) is not None}}
    fields = {"completion": answers.as_text(record.get("completion")), "answer": _field(record.get("gold",
                                                                                                  record.get("answer")))}
    for key in META_FIELDS:
        value = meta.get(key)
        fields[key] = json.dumps(value, ensure_ascii=False) if key in ("choices", "precision") and value is not None \
            else _field(value)
    return fields


def _field(value) -> str:
    return "" if value is None else str(value)


def read_records(text: str) -> list[dict]:
    """Parses an eval record file (JSONL) and rescores every record: what the page's record browser lists.

    Each entry keeps the stored reward fields and adds `fields` (the calculator inputs) and `now` (the scores
    recomputed by today's rules, as reprs) with `same`: whether they equal the stored ones (a rule change since the
    eval, or a record without its MathVista fields, shows here). A line that is not a JSON object becomes
    {"bad_line": n}, which the page counts.

    >>> entry = read_records('{"id": 1, "completion": "<SOLUTION>3</SOLUTION>", "gold": "3", "reward": 2.3}')[0]
    >>> entry["now"], entry["same"]
    (['1.0', '2.0', '2.3'], False)
    """
    entries = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if not isinstance(record, dict):
            entries.append({"bad_line": number})
            continue
        fields = record_fields(record)
        now = calculate(fields)
        stored = [record.get("format_reward"), record.get("correctness_reward"), record.get("reward")]
        entries.append({
            "id": record.get("id"), "question": _field(record.get("question")), "fields": fields,
            "stored": [repr(v) for v in stored], "correct": record.get("correct"), "match": record.get("match"),
            "prediction": repr(record.get("prediction")), "finish_reason": record.get("finish_reason"),
            "completion_tokens": record.get("completion_tokens"),
            "now": [now["format"], now["correctness"], now["total"]],
            "same": [ast.literal_eval(v) for v in (now["format"], now["correctness"], now["total"])] == stored,
        })
    return entries


def read_records_json(text: str) -> str:
    """`read_records` across the JavaScript boundary."""
    return json.dumps(read_records(text))
