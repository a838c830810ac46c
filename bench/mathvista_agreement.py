"""Benchmark: does vlrl's answer grammar agree with MathVista's official verdicts on real model outputs?

    python bench/mathvista_agreement.py PATH/TO/MathVista/results --annotations testmini.jsonl.gz
    MATHVISTA_RESULTS=PATH/TO/MathVista/results python bench/mathvista_agreement.py

MathVista's repository (github.com/lupantech/MathVista) publishes, for 21 runs of 11 models on testmini,
`results/<model>/output_*.json`: for each item the answer its GPT extractor pulled from the model's response
(`extraction`) and the official verdict (`true_false`) of evaluation/calculate_score.py. This scores every
extraction with `answers.match_kind` and the item's columns (question_type, choices, precision, unit,
answer_type), counts how often vlrl and the official verdict agree, and puts every disagreement in a class:
the first check of `classify` that fits. Each class names the rewards/SPEC.md rule that decides it.

Annotations: `--annotations` (or $MATHVISTA_ANNOTATIONS), MathVista testmini's annotations as JSON lines
(gzipped or not); without it, the columns every output record carries are used. Nothing of MathVista's is
stored in this repository: fetch their repository and point this at its results/ folder. Writes
bench/results/mathvista_agreement.json and .md; `--baseline` puts an earlier JSON's counts beside the new ones.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import math
import os
import re
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from results_io import write_results

from data.mathvista_official import edit_distance, official_prediction
from vlrl.grammar import answers

META = ("question_type", "choices", "precision", "unit", "answer_type")
# Not model runs: a guess baseline and the leaderboard's template (a copy of the frequent guess).
NOT_MODEL_RUNS = ("random", "test_random", "leaderboad_submission_template")
EXAMPLES_PER_CLASS = 4
OFFICIAL, VLRL = "official right, vlrl wrong", "vlrl right, official wrong"

# class -> (direction, what it is, the rewards/SPEC.md rule that decides it)
FREE_TEXT = "section 10, multi-choice free text"
CLASSES = {
    "integer_truncated": (OFFICIAL, "integer item, a non-integer that truncates to the gold (1.5 for 1)",
                          "section 10, integer truncation"),
    "several_options": (OFFICIAL, "names several options (a list, 'B, C', two letters)",
                        "section 11, several options"),
    "letter_contradicts_text": (OFFICIAL, "an option letter followed by another option's or no option's text",
                                "section 10, letter contradicting its text"),
    "letter_in_sentence": (OFFICIAL, "`(X)` inside a sentence", "section 10, (X) inside a sentence"),
    "letter_past_options": (OFFICIAL, "a letter past the last option (E of four), snapped by edit distance",
                            "section 10, a letter past the last option"),
    "non_answer": (OFFICIAL, "a non-answer (N/A, None, cannot be determined), snapped by edit distance",
                   FREE_TEXT),
    "one_item_list": (OFFICIAL, "the gold option as a one-item list: ['Insects'], [14]",
                      "section 11, one-item list"),
    "equation_right_side": (OFFICIAL, "the right side of an option written as an equation: (0, 0)",
                            "section 11, right side of an equation"),
    "fraction_notation": (OFFICIAL, "the gold fraction in another notation: 1/3 for \\frac{1}{3}",
                          "section 11, fraction notation"),
    "unit_left_off": (OFFICIAL, "the gold option without the unit every option carries: 40 for 40m",
                      "section 11, unit left off"),
    "decimal_of_fraction": (OFFICIAL, "the gold fraction's value as a decimal: 0.8 for \\frac{4}{5}",
                            "section 11, decimal of a fraction option"),
    "decimal_of_irrational": (OFFICIAL, "a decimal for an irrational option: 2.8284271247461903 for 2√{2}",
                              "section 11, decimal of an irrational option"),
    "rounded_decimal": (OFFICIAL, "a decimal that only rounds to the gold option: 0.4 for \\frac{5}{12}",
                        "section 11, decimal that only rounds to it"),
    "near_miss_text": (OFFICIAL, "text a few edits from the gold option (a typo or paraphrase)",
                       "section 11, near-miss text"),
    "number_snapped": (OFFICIAL, "a different number, snapped to the nearest option by edit distance", FREE_TEXT),
    "text_snapped": (OFFICIAL, "other text, snapped to the nearest option by edit distance", FREE_TEXT),
    "official_other": (OFFICIAL, "anything else", "(unexplained)"),
    "stale_verdict": (VLRL, "5.0 on an integer item: published wrong, though int(float(x)) accepts it",
                      "section 10, published verdicts the scorer would not give"),
    "gold_snapped_away": (VLRL, "the gold option in another notation, snapped elsewhere: 2.0 for 2 among 2, 2.2",
                          "section 10, the option in another notation snapped"),
    "number_written_differently": (VLRL, "a free-form number float() cannot read: 1,250, 12 cm, 50%",
                                   "section 10, 1,250 and the item's unit"),
    "vlrl_other": (VLRL, "anything else", "(unexplained)"),
}

NON_ANSWER = ("n/a", "none", "cannot", "can't", "not provided", "not possible", "insufficient", "not enough",
              "no answer", "sorry", "unable", "inconclusive", "invalid", "incomplete", "not listed",
              "not in the", "missing", "please provide", "not determinable", "not clear", "mistake",
              "not valid", "not one of", "more information", "not sufficient", "no extracted", "?")


# --- MathVista's official rule, as evaluation/calculate_score.py writes it today --------------------------

# --- reading option notations, for the classes (the bench's own checks, not vlrl's rule) ---------------------

def _number(text: str) -> float | None:
    return answers.parse_number(text)


def exact_value(text: str) -> tuple[str, float] | None:
    """("fraction" | "irrational", value) of a/b, \\frac{a}{b}, a√{b}, a\\sqrt{b}; None for anything else."""
    s = text.strip()
    m = (re.fullmatch(r"\\[dt]?frac\s*\{\s*([^{}]+?)\s*\}\s*\{\s*([^{}]+?)\s*\}", s)
         or re.fullmatch(r"\(?\s*([-+]?[0-9.]+)\s*/\s*([0-9.]+)\s*\)?", s))
    if m and _number(m[1]) is not None and _number(m[2]):
        return "fraction", _number(m[1]) / _number(m[2])
    m = re.fullmatch(r"([0-9.]*)\s*(?:√|\\sqrt)\s*\{?\s*([0-9.]+)\s*\}?", s)
    if m and _number(m[2]) is not None:
        return "irrational", (_number(m[1]) if m[1] else 1.0) * math.sqrt(_number(m[2]))
    return None


def common_unit(options: list[str]) -> str:
    """The suffix every option carries that reads as a unit ('m' of 13m, 34m, (6+14√{3})m), or ''."""
    suffix = os.path.commonprefix([o[::-1] for o in options])[::-1]
    while suffix and (not re.fullmatch(r"[^0-9]*", suffix) or suffix[0] in " .})]"):
        suffix = suffix[1:]
    values = [o[: len(o) - len(suffix)].strip() for o in options]
    return suffix if suffix and all(v and v[-1] in "0123456789})" for v in values) else ""


def items_of(text: str) -> list[str] | None:
    """The items of a list written as `[a, b]` (commas inside brackets do not split), else None."""
    if not (text.startswith("[") and text.endswith("]")):
        return None
    parts, depth, current = [], 0, ""
    for ch in text[1:-1]:
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    return [p.strip().strip("'\"").strip() for p in [*parts, current]]


def denotes(pred: str, option: str, options: list[str]) -> str | None:
    """Which notation class makes `pred` the option `option`, or None."""
    unit = common_unit(options)
    bare = option[: len(option) - len(unit)].strip() if unit else option
    pred_bare = pred[: len(pred) - len(unit)].strip() if unit and pred.endswith(unit) else pred
    if "=" in option and pred.replace(" ", "") == option.rsplit("=", 1)[1].replace(" ", ""):
        return "equation_right_side"
    value, number = exact_value(bare), _number(pred_bare)
    if unit and (pred_bare == bare or (number is not None and number == _number(bare))):
        return "unit_left_off"
    written = exact_value(pred_bare)
    if value and written and value[0] == written[0] == "fraction" and math.isclose(value[1], written[1]):
        return "fraction_notation"
    if value and number is not None:
        if math.isclose(number, value[1], rel_tol=1e-12):
            return "decimal_of_fraction" if value[0] == "fraction" else "decimal_of_irrational"
        decimals = len(pred_bare.partition(".")[2])
        if decimals and abs(number - value[1]) <= 0.5 * 10 ** -decimals:
            return "rounded_decimal"
    return None


def classify(pred, item: dict, ours: bool, official: bool, current_official: bool) -> str:
    gold, options = item["answer"], item["choices"]
    text = pred.strip() if isinstance(pred, str) else ""
    if ours:
        if current_official:
            return "stale_verdict"
        if item["question_type"] == "multi_choice":
            return "gold_snapped_away"
        return "number_written_differently" if _number(text) is not None else "vlrl_other"
    if item["question_type"] != "multi_choice":
        number = _number(text)
        if item["answer_type"] == "integer" and number is not None and not number.is_integer():
            return "integer_truncated"
        return "official_other"
    gold_option = gold if gold in options else options[ord(gold) - ord("A")]
    listed = items_of(text)
    if listed is not None and len(listed) == 1:
        inner = listed[0]
        if inner == gold_option or denotes(inner, gold_option, options) or _number(inner) == _number(gold_option):
            return "one_item_list"
    parts = listed if listed is not None else re.split(r"[,;]\s*", text)
    if len(parts) > 1 and sum(answers.choice_of(p, options) is not None or p in options for p in parts) > 1:
        return "several_options"
    if re.match(r"\(?[A-Z][).:]\s*\S", text) and len(text) > 3:
        return "letter_contradicts_text"
    if re.search(r"\([a-zA-Z]\)", text):
        return "letter_in_sentence"
    if re.fullmatch(r"\(?[A-Za-z]\)?\.?", text):
        return "letter_past_options"
    if any(word in text.lower() for word in NON_ANSWER) or not text:
        return "non_answer"
    notation = denotes(text, gold_option, options)
    if notation:
        return notation
    near = edit_distance(text.lower(), gold_option.lower()) <= 0.2 * len(gold_option)
    if near and re.search("[a-zA-Z]{3}", gold_option):
        return "near_miss_text"
    if _number(text) is not None:
        return "number_snapped"
    return "text_snapped"


# --- the measurement ------------------------------------------------------------------------------------------

def load_annotations(path: str | None) -> dict[str, dict] | None:
    if not path:
        return None
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return {row["pid"]: row for row in map(json.loads, f)}


def run_files(results_dir: Path) -> list[Path]:
    return sorted(p for p in results_dir.glob("*/output_*.json") if p.parent.name not in NOT_MODEL_RUNS)


def short(value, limit: int = 90):
    if isinstance(value, str) and len(value) > limit:
        return value[: limit - 1] + "…"
    return value


def measure(results_dir: Path, annotations: dict[str, dict] | None) -> dict:
    runs, counts, examples = [], Counter(), defaultdict(list)
    total = Counter()
    for path in run_files(results_dir):
        records = json.loads(path.read_text("utf-8"))
        run = Counter()
        for pid, record in records.items():
            item = annotations[pid] if annotations is not None else record
            if annotations is not None and any(record.get(k) != item.get(k) for k in (*META, "answer")):
                run["columns_differ"] += 1
            meta = {k: item.get(k) for k in META}
            pred = record.get("extraction")
            kind = answers.match_kind(pred, item["answer"], **meta)
            ours, official = kind != "none", bool(record.get("true_false"))
            current_official = official_prediction(pred, item) == item["answer"]
            run["answers"] += 1
            run["agree"] += ours == official
            run["agree_current_official"] += ours == current_official
            run["published_differs_from_current"] += official != current_official
            run["official_right"] += official
            run["vlrl_right"] += ours
            run["vlrl_" + kind] += 1
            if ours != official:
                name = classify(pred, item, ours, official, current_official)
                counts[name] += 1
                seen = {(e["extraction"], e["answer"]) for e in examples[name]}
                if len(examples[name]) < EXAMPLES_PER_CLASS and (pred, item["answer"]) not in seen:
                    examples[name].append({"run": path.stem.removeprefix("output_"), "pid": pid,
                                           "extraction": short(pred), "answer": item["answer"],
                                           "choices": item["choices"], "vlrl": kind,
                                           "official_prediction": short(record.get("prediction"))})
        total.update(run)
        runs.append({"run": f"{path.parent.name}/{path.name}",
                     "sha256": hashlib.sha256(path.read_bytes()).hexdigest()[:16], **run})
    n = total["answers"]
    summary = {k: total[k] for k in ("answers", "agree", "official_right", "vlrl_right",
                                     "agree_current_official", "published_differs_from_current",
                                     "columns_differ")}
    summary.update(agreement=round(total["agree"] / n, 5),
                   agreement_current_official=round(total["agree_current_official"] / n, 5),
                   disagree=n - total["agree"],
                   match_kinds={k: total["vlrl_" + k] for k in answers.MATCH_KINDS})
    classes = [{"class": name, "direction": CLASSES[name][0], "what": CLASSES[name][1],
                "spec": CLASSES[name][2], "count": counts[name], "share": round(counts[name] / n, 5),
                "examples": examples[name]} for name in CLASSES if counts[name]]
    return {"total": summary, "classes": classes, "runs": runs}


def git_commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True, cwd=Path(__file__).parent).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "vlrl"], capture_output=True, text=True, check=True,
                               cwd=Path(__file__).parent.parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + (" + uncommitted changes to vlrl/" if dirty else "")


def pct(x: float) -> str:
    return f"{100 * x:.2f}%"


def markdown(r: dict) -> str:
    t = r["total"]

    def row(label: str, n: int) -> str:
        return f"| {label} | {n:,} | {pct(n / t['answers'])} |"

    lines = [
        "# vlrl against MathVista's official verdicts, on MathVista's published testmini outputs",
        "",
        (f"Command: `{r['command']}` (from the repository root; MathVista's results/ folder from "
         f"github.com/lupantech/MathVista at {r['mathvista_commit']}). vlrl at {r['vlrl_commit']}; item columns "
         f"from {r['annotations']}."),
        "",
        (f"{len(r['runs'])} runs, {t['answers']:,} extracted answers, each scored by `answers.match_kind` with "
         "the item's columns and compared with the run's published `true_false`."),
        "",
        "| | answers | share |",
        "|---|---|---|",
        row("vlrl agrees with the published verdict", t["agree"]),
        row("vlrl agrees with calculate_score.py as it is today (transcribed here)", t["agree_current_official"]),
        row("published verdicts that calculate_score.py today would change", t["published_differs_from_current"]),
        row("official right", t["official_right"]),
        row("vlrl right", t["vlrl_right"]),
        "",
        "vlrl's match kinds: " + ", ".join(f"{k} {v:,}" for k, v in t["match_kinds"].items()) + ".",
    ]
    if r.get("baseline"):
        b = r["baseline"]
        before = {c["class"]: c["count"] for c in b["classes"]}
        after = {c["class"]: c["count"] for c in r["classes"]}
        note = (f"Before and after: the baseline is the earlier {b['source']} (vlrl at {b['vlrl_commit']}). An "
                "answer can change class when vlrl reads it differently (a part of `2.0, 8.0` that now picks an "
                "option makes it name several options).")
        lines += ["", note, "",
                  "| | before | after |", "|---|---|---|",
                  (f"| agreement | {b['total']['agree']:,} ({pct(b['total']['agreement'])}) | "
                  f"{t['agree']:,} ({pct(t['agreement'])}) |"),
                  f"| vlrl right | {b['total']['vlrl_right']:,} | {t['vlrl_right']:,} |"]
        lines += [f"| {name} | {before.get(name, 0)} | {after.get(name, 0)} |"
                  for name in CLASSES if before.get(name) or after.get(name)]
    lines += ["", "## Disagreements by class", "",
              "Each disagreement is put in the first class whose check fits (`classify` in the script).", "",
              "| class | direction | what | answers | share | decided by rewards/SPEC.md |",
              "|---|---|---|---|---|---|"]
    lines += [f"| {c['class']} | {c['direction']} | {c['what']} | {c['count']} | {pct(c['share'])} | "
              f"{c['spec']} |" for c in r["classes"]]
    lines += ["", "Examples (extraction, gold, options, vlrl's match, the official normalized prediction):", ""]
    for c in r["classes"]:
        lines.append(f"- **{c['class']}**")
        lines += [f"  - `{json.dumps(e['extraction'], ensure_ascii=False)}` for gold "
                  f"`{json.dumps(e['answer'], ensure_ascii=False)}`"
                  + (f", options `{json.dumps(e['choices'], ensure_ascii=False)}`" if e["choices"] else "")
                  + f": vlrl {e['vlrl']}, official `{json.dumps(e['official_prediction'], ensure_ascii=False)}`"
                  f" ({e['run']}, pid {e['pid']})" for e in c["examples"]]
    lines += ["", "## Runs", "", "| run | answers | agree | official right | vlrl right |", "|---|---|---|---|---|"]
    lines += [f"| {run['run']} | {run['answers']} | {run['agree']} ({pct(run['agree'] / run['answers'])}) | "
              f"{run['official_right']} | {run['vlrl_right']} |" for run in r["runs"]]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="?", default=os.environ.get("MATHVISTA_RESULTS"),
                        help="MathVista's results/ folder (default: $MATHVISTA_RESULTS)")
    parser.add_argument("--annotations", default=os.environ.get("MATHVISTA_ANNOTATIONS"),
                        help="testmini annotations as JSON lines, .gz or not (default: $MATHVISTA_ANNOTATIONS; "
                             "without it, the columns each output record carries)")
    parser.add_argument("--mathvista-commit", default="unknown", help="the MathVista commit the results are from")
    parser.add_argument("--baseline", help="an earlier mathvista_agreement.json to compare with")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "mathvista_agreement"))
    args = parser.parse_args()
    if not args.results or not run_files(Path(args.results)):
        parser.error("give MathVista's results/ folder (with <model>/output_*.json), or set MATHVISTA_RESULTS")

    baseline = json.loads(Path(args.baseline).read_text()) if args.baseline else None
    result = measure(Path(args.results), load_annotations(args.annotations))
    result["command"] = " ".join(["python bench/mathvista_agreement.py", *sys.argv[1:]])
    result["vlrl_commit"] = git_commit()
    result["mathvista_commit"] = args.mathvista_commit
    result["annotations"] = Path(args.annotations).name if args.annotations else "each output record's columns"
    if baseline:
        result["baseline"] = {"source": Path(args.baseline).name, "vlrl_commit": baseline["vlrl_commit"],
                              "total": baseline["total"],
                              "classes": [{k: c[k] for k in ("class", "count")} for c in baseline["classes"]]}
    write_results(result, args.out, markdown)


if __name__ == "__main__":
    main()
