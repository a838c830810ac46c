"""Before/after statistics on eval records: whether a change between two evals of the same items is real.

    comparison = compare("runs/demo/eval_before.jsonl", "runs/demo/eval_after.jsonl")
    print(summary(comparison))

Records are paired by item id. Each side gets its rates with 95% Wilson intervals (`side_stats`); the pair gets the
2x2 table of correctness, the exact McNemar test on its discordant cells and the ids of the flipped items
(`paired_stats`), overall and per metadata group (`breakdown`). The statistics of one side live in `side_stats`
alone, so a rate over several samples per item (pass@k) joins accuracy there.
"""

from __future__ import annotations

import collections
from pathlib import Path

from vlrl.base.errors import EvalError
from vlrl.base.stats import mcnemar_exact, wilson
from vlrl.evaluation import passk
from vlrl.evaluation.records import by_id as records_by_id
from vlrl.evaluation.records import read_records
from vlrl.grammar import answers
from vlrl.grammar.rewards import META_COLUMNS

# Metadata keys the comparison breaks accuracy down by (MathVista's and the synthetic generator's); a list value
# (MathVista's `skills`) puts the item in every group it names.
BREAKDOWN_KEYS = ("skills", "task", "context", "grade", "category", "source", "difficulty")
REQUIRED = ("id", "correct", "format_ok")  # what a record needs to be compared; the rest is optional
MEANS = ("reward", "format_reward", "correctness_reward", "completion_tokens")  # averaged per side when present
# An eval whose most common answer is given to at least ONE_ANSWER_SHARE of its items, and whose accuracy is within
# ONE_ANSWER_MARGIN of what that answer alone scores everywhere, is called out in the summary: a policy collapsed onto
# one answer scores what that answer scores, whatever it reads (a model that mostly says "Yes" on a yes-heavy set,
# and is right far more often than "Yes" alone would be, is not called out).
ONE_ANSWER_SHARE = 0.5
ONE_ANSWER_MARGIN = 0.1


# --- records -> items --------------------------------------------------------------------------------------------

def by_id(records: list[dict] | str | Path, name: str = "records") -> dict:
    """Records (a list or a JSONL path) -> {id: record}, checking that each has what a comparison needs
    (`vlrl.evaluation.records.by_id` with REQUIRED).

    Raises:
        EvalError: a record without id, correct or format_ok, or an id that appears twice.

    >>> by_id([{"id": "a", "correct": True, "format_ok": False}])["a"]["correct"]
    True
    """
    return records_by_id(records, name, REQUIRED)


# --- one side ----------------------------------------------------------------------------------------------------

def side_stats(records: list[dict], side: str) -> dict:
    """What one eval says on its own, each key suffixed with `side`: accuracy and format compliance with 95% Wilson
    intervals, the means of the reward parts and completion length, and the degenerate and truncated shares
    (None where no record holds the field).

    >>> stats = side_stats([{"id": 1, "correct": True, "format_ok": True, "reward": 2.6}], "after")
    >>> stats["accuracy_after"], stats["reward_mean_after"], stats["truncated_rate_after"]
    (1.0, 2.6, None)
    """
    out = {}
    for metric, key in (("accuracy", "correct"), ("format", "format_ok")):
        k = sum(bool(r[key]) for r in records)
        out[f"{metric}_{side}"] = k / len(records) if records else None
        out[f"{metric}_{side}_ci95"] = list(wilson(k, len(records)))
    for key in MEANS:
        values = [r[key] for r in records if isinstance(r.get(key), (int, float)) and not isinstance(r[key], bool)]
        out[f"{key}_mean_{side}"] = sum(values) / len(values) if values else None
    flags = {"degenerate": [r["degenerate"] for r in records if "degenerate" in r],
             "truncated": [r["finish_reason"] == "length" for r in records if "finish_reason" in r]}
    for name, values in flags.items():
        out[f"{name}_rate_{side}"] = sum(values) / len(values) if values else None
    return out


def answer_spread(records: list[dict]) -> dict:
    """How varied one side's answers are: its most common prediction (`top`), the share of the items given it
    (`top_share`), and `constant_accuracy`, what answering `top` on every item would score under the answer grammar.
    An accuracy near constant_accuracy with a top_share near 1 is a collapse onto one answer, not reading. Records
    without predictions give `top` None.

    >>> recs = [{"prediction": "9", "gold": g, "correct": g == "9"} for g in ("9", "3", "9", "4")]
    >>> answer_spread(recs)
    {'top': '9', 'top_share': 1.0, 'constant_accuracy': 0.5}
    """
    given = [str(r["prediction"]).strip() for r in records if r.get("prediction") is not None]
    counts = collections.Counter(p for p in given if p)
    if not counts:
        return {"top": None, "top_share": 0.0, "constant_accuracy": None}
    top, n = counts.most_common(1)[0]
    hits = sum(answers.is_correct(top, r["gold"], symbolic=bool(r.get("symbolic")),
                                  **{k: r.get(k) for k in META_COLUMNS}) for r in records if "gold" in r)
    return {"top": top, "top_share": n / len(records), "constant_accuracy": hits / len(records)}


# --- paired ------------------------------------------------------------------------------------------------------

def paired_stats(before: list[dict], after: list[dict]) -> dict:
    """Accuracy before/after, the 2x2 table, its McNemar p, and the flipped ids, for records paired by position.

    >>> rec = lambda i, ok: {"id": i, "correct": ok}
    >>> s = paired_stats([rec("a", False), rec("b", True)], [rec("a", True), rec("b", True)])
    >>> s["table"], s["wrong_to_right"]
    ({'both_right': 1, 'wrong_to_right': 1, 'right_to_wrong': 0, 'both_wrong': 0}, ['a'])
    """
    flips = {"wrong_to_right": [], "right_to_wrong": []}
    both_right = both_wrong = 0
    for b, a in zip(before, after):
        if b["correct"] and a["correct"]:
            both_right += 1
        elif not b["correct"] and not a["correct"]:
            both_wrong += 1
        else:
            flips["wrong_to_right" if a["correct"] else "right_to_wrong"].append(b["id"])
    n = len(before)
    return {"n": n,
            "accuracy_before": sum(bool(r["correct"]) for r in before) / n if n else None,
            "accuracy_after": sum(bool(r["correct"]) for r in after) / n if n else None,
            "table": {"both_right": both_right, "wrong_to_right": len(flips["wrong_to_right"]),
                      "right_to_wrong": len(flips["right_to_wrong"]), "both_wrong": both_wrong},
            "mcnemar_p": mcnemar_exact(len(flips["wrong_to_right"]), len(flips["right_to_wrong"])),
            **flips}


def _groups(records: list[dict], key: str) -> dict[str, list[int]]:
    """Metadata value -> positions of the records that have it (a list value counts for each of its elements)."""
    groups: dict[str, list[int]] = {}
    for position, record in enumerate(records):
        value = (record.get("metadata") or {}).get(key)
        values = value if isinstance(value, list) else [value]
        for v in values or [None]:
            groups.setdefault("(missing)" if v is None else str(v), []).append(position)
    return groups


def breakdown(before: list[dict], after: list[dict], keys=BREAKDOWN_KEYS) -> dict:
    """Paired accuracy per metadata group (MathVista's skills, context, grade...), for the keys that split the items
    into at least two groups.

    >>> rec = lambda i, ok, skill: {"id": i, "correct": ok, "format_ok": True, "metadata": {"skills": [skill]}}
    >>> out = breakdown([rec(1, False, "geometry"), rec(2, True, "counting")],
    ...                 [rec(1, True, "geometry"), rec(2, True, "counting")])
    >>> out["skills"]["geometry"]["wrong_to_right"], out["skills"]["counting"]["accuracy_before"]
    (1, 1.0)
    """
    result = {}
    for key in keys:
        if not any(key in (r.get("metadata") or {}) for r in before + after):
            continue
        groups = _groups(before, key)
        if len(groups) < 2:
            continue  # one group repeats the overall numbers
        result[key] = {}
        for value, positions in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            stats = paired_stats([before[p] for p in positions], [after[p] for p in positions])
            for flip in ("wrong_to_right", "right_to_wrong"):
                stats[flip] = len(stats[flip])  # counts here; the ids are in the overall flip lists
            del stats["table"]
            result[key][value] = stats
    return result


# --- the comparison ----------------------------------------------------------------------------------------------

def compare(before: list[dict] | str | Path, after: list[dict] | str | Path) -> dict:
    """Before/after statistics on per-item records, paired by id (episode records: `vlrl.evaluation.episode_compare`). The fields used are `id`, `correct`, `format_ok`
    (and, when present, the reward parts, `completion_tokens`, `finish_reason`, `degenerate` and `metadata`).

    Args:
        before: records (or a JSONL path) of the model before training.
        after: records (or a JSONL path) of the model after training.

    Returns:
        A JSON-ready dict: `n_before`, `n_after`, `n_paired`, `only_before` / `only_after` (ids evaluated on one
        side only: reported, and left out of the paired statistics); per side `accuracy_*` and `format_*` with
        `*_ci95` (Wilson), means of the reward parts and completion length, degenerate and truncated shares;
        `accuracy_delta` / `format_delta`; `table` (the paired 2x2 counts), `mcnemar_p` (exact, two-sided, on
        correctness), `wrong_to_right` / `right_to_wrong` (ids); `format_mcnemar_p`, `format_gained` /
        `format_lost`; `breakdown` by metadata; `answers_before` / `answers_after` (`answer_spread`: the most common
        answer, its share, what answering it everywhere scores). When both sides are sampled evals with K draws per item
        (`--samples K`), the accuracy fields describe each item's first draw, and `pass_at_k` holds
        `vlrl.evaluation.passk.compare_pass_at_k` (pass@k for every k, the paired test on pass@1, learned and sharpened
        items) with `meaning`, one sentence on what the curves say.

    Raises:
        EvalError: a record without id, correct or format_ok, an id twice on one side, a damaged record file, or
            no item paired (an empty side, or no id in common).

    >>> rec = lambda i, ok: {"id": i, "correct": ok, "format_ok": True}
    >>> before = [rec(i, False) for i in range(12)] + [rec(12, True), rec(13, True)]
    >>> after = [rec(i, i < 10) for i in range(12)] + [rec(12, False), rec(13, False)]
    >>> c = compare(before, after)
    >>> c["table"], round(c["mcnemar_p"], 4)
    ({'both_right': 0, 'wrong_to_right': 10, 'right_to_wrong': 2, 'both_wrong': 2}, 0.0386)
    """
    from vlrl.evaluation import episode_compare as episodes

    if episodes.is_episodes(before) or episodes.is_episodes(after):  # episode records: success and return
        return _paired(episodes.compare(before, after), before, after)
    return _paired(_compare_items(before, after), before, after)


def _paired(result: dict, before, after) -> dict:
    """`result`, when it pairs at least one item: statistics of no pairs are nulls that read like a result."""
    if result["n_paired"]:
        return result

    def name(side) -> str:
        return str(side) if isinstance(side, (str, Path)) else "the records"

    if not result["n_before"] or not result["n_after"]:
        empty = name(before) if not result["n_before"] else name(after)
        raise EvalError(f"{empty} holds no records, so nothing can be compared; give eval files that hold records "
                        "(`vlrl eval` or `vlrl run` writes them).")
    raise EvalError(f"{name(before)} ({result['n_before']} items) and {name(after)} ({result['n_after']} items) share "
                    "no item id, so nothing can be compared; give two evals of the same items, such as one run's "
                    "eval_before.jsonl and eval_after.jsonl.")


def _compare_items(before, after) -> dict:
    """`compare` of single-turn records."""
    b_by, a_by = by_id(before, "before"), by_id(after, "after")
    paired = [i for i in b_by if i in a_by]
    b_rows, a_rows = [b_by[i] for i in paired], [a_by[i] for i in paired]
    result = {"n_before": len(b_by), "n_after": len(a_by), "n_paired": len(paired),
              "only_before": [i for i in b_by if i not in a_by], "only_after": [i for i in a_by if i not in b_by]}
    result.update(side_stats(b_rows, "before"))
    result.update(side_stats(a_rows, "after"))
    for metric in ("accuracy", "format"):
        result[f"{metric}_delta"] = result[f"{metric}_after"] - result[f"{metric}_before"] if paired else None
    stats = paired_stats(b_rows, a_rows)
    result.update(table=stats["table"], mcnemar_p=stats["mcnemar_p"], wrong_to_right=stats["wrong_to_right"],
                  right_to_wrong=stats["right_to_wrong"])
    format_gained = [i for i in paired if not b_by[i]["format_ok"] and a_by[i]["format_ok"]]
    format_lost = [i for i in paired if b_by[i]["format_ok"] and not a_by[i]["format_ok"]]
    result.update(format_mcnemar_p=mcnemar_exact(len(format_gained), len(format_lost)),
                  format_gained=format_gained, format_lost=format_lost)
    result["breakdown"] = breakdown(b_rows, a_rows)
    result.update(answers_before=answer_spread(b_rows), answers_after=answer_spread(a_rows))
    if passk.is_sampled(b_rows) and passk.is_sampled(a_rows):  # `--samples K` on both sides: pass@k too
        result["pass_at_k"] = _pass_at_k(b_rows, a_rows)
    return result


def with_samples(comparison: dict, samples_before: str | Path, samples_after: str | Path) -> dict:
    """`comparison` (of greedy evals) with `pass_at_k` from a run's sampled evals, when both files exist: the greedy
    statistics stay as they are, and pass@k joins them.

    Raises:
        EvalError: a damaged sampled file, or sampled files without draws.
    """
    if Path(samples_before).exists() and Path(samples_after).exists():
        sides = [read_records(p) for p in (samples_before, samples_after)]
        if all(r.get("kind") == "episode_samples" for side in sides for r in side):  # worlds' sampled episodes
            b_rows, a_rows = ([*records_by_id(side, str(p), ("id", "draws"), unit="world").values()]
                              for side, p in zip(sides, (samples_before, samples_after)))
        else:
            b_rows, a_rows = (list(by_id(side, str(p)).values()) for side, p in zip(sides, (samples_before,
                                                                                          samples_after)))
        if not (passk.is_sampled(b_rows) and passk.is_sampled(a_rows)):
            raise EvalError(f"{samples_before} and {samples_after} hold no sampled draws; they come from "
                            "`[eval] samples = K`.")
        comparison = {**comparison, "pass_at_k": _pass_at_k(b_rows, a_rows)}
        if all(r.get("kind") == "episode_samples" for r in b_rows + a_rows):  # a draw is an episode: success@k
            pk = comparison["pass_at_k"]  # its sentences say so once, for the summary, the report and the notebook
            pk.update(measure="success", meaning=pk["meaning"].replace("pass@", "success@").replace("items", "worlds"),
                      test=pk["test"].replace("items", "worlds"))
        if passk.has_achievements(b_rows) and passk.has_achievements(a_rows):  # and Crafter's: achievements@k
            comparison["achievements_at_k"] = passk.compare_achievements_at_k(b_rows, a_rows)
            if comparison.get("crafter"):  # and Crafter's own measure over all the sampled episodes
                from vlrl.evaluation.episode_compare import sampled_crafter

                comparison["crafter_samples"] = sampled_crafter(b_rows, a_rows)
    return comparison


def _pass_at_k(before: list[dict], after: list[dict]) -> dict:
    """`vlrl.evaluation.passk.compare_pass_at_k` of two sampled sides, with `meaning`: one sentence on what it says."""
    change = passk.compare_pass_at_k(before, after)
    change["meaning"] = passk.describe(change)
    return change


def one_answer_notes(comparison: dict) -> list[str]:
    """A sentence for each side that gave one answer to at least ONE_ANSWER_SHARE of its items and scored within
    ONE_ANSWER_MARGIN of what that answer alone scores (`answer_spread`).

    >>> one_answer_notes({"answers_after": {"top": "9", "top_share": 1.0, "constant_accuracy": 0.238},
    ...                   "accuracy_after": 0.238})
    ["one answer after: 100% of the items get '9', and answering it everywhere scores 23.8% (accuracy 23.8%): read the items before trusting the rate"]
    """
    notes = []
    for side in ("before", "after"):
        spread = comparison.get(f"answers_{side}") or {}
        accuracy = comparison.get(f"accuracy_{side}")
        if (spread.get("top_share", 0) >= ONE_ANSWER_SHARE and accuracy is not None
                and accuracy <= spread["constant_accuracy"] + ONE_ANSWER_MARGIN):
            notes.append(f"one answer {side}: {spread['top_share']:.0%} of the items get {spread['top']!r}, and "
                         f"answering it everywhere scores {spread['constant_accuracy']:.1%} (accuracy "
                         f"{accuracy:.1%}): read the items before trusting the rate")
    return notes


def summary(comparison: dict, alpha: float = 0.05) -> str:
    """A few lines a person can read: the two rates with their intervals, the paired test and what it means.

    >>> rec = lambda i, ok: {"id": i, "correct": ok, "format_ok": True}
    >>> print(summary(compare([rec(i, i < 5) for i in range(100)], [rec(i, i < 6) for i in range(100)])))
    accuracy 5.0% [2.2%, 11.2%] -> 6.0% [2.8%, 12.5%] on 100 paired items (1 wrong->right, 0 right->wrong)
    format   100.0% [96.3%, 100.0%] -> 100.0% [96.3%, 100.0%] (0 gained, 0 lost)
    McNemar exact p = 1 for accuracy: not distinguishable from noise at 0.05; format p = 1
    """
    c = comparison
    if c.get("kind") == "episodes":
        from vlrl.evaluation.episode_compare import summary as episode_summary

        return episode_summary(c, alpha)

    def rate(metric, side):
        low, high = c[f"{metric}_{side}_ci95"]
        return "n/a" if c[f"{metric}_{side}"] is None else f"{c[f'{metric}_{side}']:.1%} [{low:.1%}, {high:.1%}]"

    verdict = ("a real change" if c["mcnemar_p"] < alpha else "not distinguishable from noise") + f" at {alpha:g}"
    lines = [
        (f"accuracy {rate('accuracy', 'before')} -> {rate('accuracy', 'after')} on {c['n_paired']} paired items "
         f"({len(c['wrong_to_right'])} wrong->right, {len(c['right_to_wrong'])} right->wrong)"),
        (f"format   {rate('format', 'before')} -> {rate('format', 'after')} "
         f"({len(c['format_gained'])} gained, {len(c['format_lost'])} lost)"),
        f"McNemar exact p = {c['mcnemar_p']:.3g} for accuracy: {verdict}; format p = {c['format_mcnemar_p']:.3g}",
    ]
    if c.get("pass_at_k"):
        pk = c["pass_at_k"]
        k = pk["samples"]
        lines.append(f"pass@1   {pk['pass_at_1_before']:.1%} -> {pk['pass_at_1_after']:.1%} over {k} draws per item "
                     f"(paired permutation p = {pk['pass_at_1_p']:.3g}); pass@{k} {pk['pass_at_k_before'][-1]:.1%} -> "
                     f"{pk['pass_at_k_after'][-1]:.1%}; {len(pk['learned'])} learned, {len(pk['sharpened'])} "
                     "sharpened")
        lines.append(pk["meaning"])
    lines += one_answer_notes(c)
    if c["only_before"] or c["only_after"]:
        lines.append(f"unpaired: {len(c['only_before'])} items only before, {len(c['only_after'])} only after "
                     "(left out of the paired statistics)")
    return "\n".join(lines)
