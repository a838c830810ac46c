"""pass@k from sampled eval records (`vlrl eval --samples K`), and what a before/after pair of them says: did RL
sharpen answers the model could already reach, or teach it to solve items it never solved?

    curve = pass_at_k_curve(read_records("runs/demo/samples_before.jsonl"))   # k -> pass@k with a 95% CI
    change = compare_pass_at_k(before_records, after_records)
    print(describe(change))

Per item, K draws of which c are correct give the unbiased pass@k of Chen et al. (2021) for every k <= K
(`vlrl.base.stats.pass_at_k`); a set's pass@k is the mean over items, with a percentile bootstrap interval over items.
Paired by item id, the change in pass@1 is tested with the paired sign-flip permutation test on the per-item pass
rates c/K (exact: the rates lie on a grid of 1/K); the change in pass@k at each k gets a paired bootstrap interval.
Items move between three states (never solved: c = 0; sometimes: 0 < c < K; always: c = K): never -> sometimes
or always is *learning* (a new item within reach), sometimes -> always is *sharpening* (an item already within reach,
now reliably).

Why a permutation test rather than Wilcoxon's signed-rank test: pass@1 is a mean, and the sign-flip test asks
exactly whether the mean per-item change is zero, with no assumption of a symmetric distribution of ranks; the
per-item rates take few values (0, 1/K, ..., 1), so Wilcoxon's ranks are mostly ties, and its normal approximation
with tie corrections is least trustworthy there. The test is exact here, and SciPy's `permutation_test` agrees
(tests/test_passk.py).
"""

from __future__ import annotations

from vlrl.base.errors import EvalError
from vlrl.base.stats import bootstrap_ci, paired_permutation, pass_at_k, wilson

STATES = ("never", "sometimes", "always")


def counts(records: list[dict]) -> dict:
    """{id: (n, c)}: the draws per item and how many were correct.

    Raises:
        EvalError: a record without draws (a greedy eval: evaluate with `--samples K`), or sides of unequal K.

    >>> counts([{"id": "a", "draws": [{"correct": True}, {"correct": False}]}])
    {'a': (2, 1)}
    """
    out = {}
    for record in records:
        draws = record.get("draws")
        if not isinstance(draws, list) or not draws:
            raise EvalError(f"record {record.get('id')!r} has no sampled draws; pass@k needs an eval with "
                            "`--samples K` ([eval] samples = K), not a greedy one.")
        out[record["id"]] = (len(draws), sum(bool(d.get("correct")) for d in draws))
    sizes = {n for n, _ in out.values()}
    if len(sizes) > 1:
        raise EvalError(f"the records hold different numbers of draws per item ({sorted(sizes)}); evaluate every "
                        "item with the same --samples K.")
    return out


def is_sampled(records: list[dict]) -> bool:
    """Whether records come from a sampled eval with draws (pass@k applies)."""
    return bool(records) and all(isinstance(r.get("draws"), list) and r["draws"] for r in records)


def state(n: int, c: int) -> str:
    """"never", "sometimes" or "always": how an item's draws fared."""
    return "never" if c == 0 else "always" if c == n else "sometimes"


def pass_at_k_curve(records: list[dict], *, seed: int = 0) -> dict:
    """pass@k for k = 1..K over the records' items, each with a 95% bootstrap interval over items, the share of
    items solved by no draw and by every draw (with Wilson intervals), and each item's own pass@1..pass@K.

    >>> rec = lambda i, *ok: {"id": i, "draws": [{"correct": x} for x in ok]}
    >>> curve = pass_at_k_curve([rec("a", True, False), rec("b", False, False)])
    >>> curve["k"], curve["pass_at_k"], curve["never"], curve["always"]
    ([1, 2], [0.25, 0.5], 0.5, 0.0)
    """
    per_item = counts(records)
    if not per_item:
        raise EvalError("no records to compute pass@k from.")
    n = next(iter(per_item.values()))[0]
    ks = list(range(1, n + 1))
    values, cis = [], []
    for k in ks:
        scores = [pass_at_k(n, c, k) for n, c in per_item.values()]
        values.append(sum(scores) / len(scores))
        cis.append(list(bootstrap_ci(scores, seed=seed)))
    states = [state(n, c) for n, c in per_item.values()]
    return {"samples": n, "items": len(per_item), "k": ks, "pass_at_k": values, "ci95": cis,
            **{s: states.count(s) / len(states) for s in STATES},
            **{f"{s}_ci95": list(wilson(states.count(s), len(states))) for s in ("never", "always")},
            "per_item": {i: [pass_at_k(n, c, k) for k in ks] for i, (n, c) in per_item.items()}}


def compare_pass_at_k(before: list[dict], after: list[dict], *, seed: int = 0) -> dict:
    """Paired by id: pass@k before and after for every k (with paired bootstrap intervals of the change), the paired
    permutation test on pass@1, and the items' moves between never / sometimes / always.

    >>> rec = lambda i, *ok: {"id": i, "draws": [{"correct": x} for x in ok]}
    >>> before = [rec("a", False, False), rec("b", True, False), rec("c", True, True)]
    >>> after = [rec("a", True, False), rec("b", True, True), rec("c", True, True)]
    >>> c = compare_pass_at_k(before, after)
    >>> c["pass_at_1_before"], c["pass_at_1_after"], c["learned"], c["sharpened"]
    (0.5, 0.8333333333333334, ['a'], ['b'])
    """
    b, a = counts(before), counts(after)
    ids = [i for i in b if i in a]
    if not ids:
        raise EvalError("the two sampled evals share no item id; compare evals of the same items.")
    n_b, n_a = b[ids[0]][0], a[ids[0]][0]
    if n_b != n_a:
        raise EvalError(f"before has {n_b} draws per item and after {n_a}; compare evals with the same --samples K.")
    n = n_b
    ks = list(range(1, n + 1))
    paired = set(ids)
    sides = {}
    for side, records in (("before", before), ("after", after)):
        curve = pass_at_k_curve([r for r in records if r["id"] in paired], seed=seed)
        sides[side] = {key: curve[key] for key in ("pass_at_k", "ci95", "never", "always", "never_ci95",
                                                    "always_ci95")}
    deltas, delta_cis = [], []
    for k in ks:
        diffs = [pass_at_k(n, a[i][1], k) - pass_at_k(n, b[i][1], k) for i in ids]
        deltas.append(sum(diffs) / len(ids))
        delta_cis.append(list(bootstrap_ci(diffs, seed=seed)))
    moves = {i: (state(*b[i]), state(*a[i])) for i in ids}
    rate_diffs = [a[i][1] / n - b[i][1] / n for i in ids]
    before_k, after_k = sides["before"]["pass_at_k"], sides["after"]["pass_at_k"]
    return {
        "samples": n, "n_paired": len(ids), "k": ks,
        "pass_at_k_before": before_k, "pass_at_k_after": after_k,
        "pass_at_k_delta": deltas, "pass_at_k_delta_ci95": delta_cis,
        "pass_at_1_before": before_k[0], "pass_at_1_after": after_k[0],
        "pass_at_1_delta": deltas[0], "pass_at_1_p": paired_permutation(rate_diffs), **sides,
        "counts": {i: [b[i][1], a[i][1]] for i in ids},  # each item's correct draws, before and after
        "test": "paired sign-flip permutation test on per-item pass rates (exact)",
        "moves": {f"{s}_to_{t}": sum(m == (s, t) for m in moves.values()) for s in STATES for t in STATES},
        "learned": [i for i, (s, t) in moves.items() if s == "never" and t != "never"],
        "sharpened": [i for i, m in moves.items() if m == ("sometimes", "always")],
        "lost": [i for i, (s, t) in moves.items() if s != "never" and t == "never"],
        "dulled": [i for i, m in moves.items() if m == ("always", "sometimes")],
    }


def describe(change: dict, alpha: float = 0.05) -> str:
    """One sentence on what the pass@k curves mean for this run: learning, sharpening, both, or no clear change.

    >>> describe({"samples": 4, "n_paired": 50, "pass_at_1_delta": 0.12, "pass_at_1_p": 0.001,
    ...           "pass_at_k_delta": [0.12, 0.05, 0.02, 0.0], "pass_at_k_delta_ci95": [[.05, .2], [0, .1],
    ...           [-.02, .06], [-.04, .04]], "learned": [], "sharpened": list(range(9))})
    'pass@1 rose by 12.0 points (p = 0.001) while pass@4 did not change (+0.0, 95% CI [-4.0, +4.0]): RL sharpened answers the model could already reach (9 items sometimes -> always, 0 never -> solved).'
    """
    k = change["samples"]
    d1, p = change["pass_at_1_delta"], change["pass_at_1_p"]
    dk, (low, high) = change["pass_at_k_delta"][-1], change["pass_at_k_delta_ci95"][-1]
    learned, sharpened = len(change["learned"]), len(change["sharpened"])
    counts_text = f"{sharpened} items sometimes -> always, {learned} never -> solved"
    if k == 1:
        return f"pass@1 changed by {100 * d1:+.1f} points (p = {p:.3g}); with one draw per item pass@k is pass@1."
    top = f"pass@{k} {'rose' if dk > 0 else 'fell'} by {100 * abs(dk):.1f} points (95% CI [{100 * low:+.1f}, " \
          f"{100 * high:+.1f}])"
    k_moved = low > 0 or high < 0
    if p >= alpha and not k_moved:
        return (f"Neither pass@1 ({100 * d1:+.1f} points, p = {p:.3g}) nor pass@{k} ({100 * dk:+.1f}, 95% CI "
                f"[{100 * low:+.1f}, {100 * high:+.1f}]) changed beyond noise on {change['n_paired']} items "
                f"({counts_text}).")
    first = f"pass@1 {'rose' if d1 > 0 else 'fell'} by {100 * abs(d1):.1f} points (p = {p:.3g})"
    if not k_moved:
        verdict = ("RL sharpened answers the model could already reach" if d1 > 0 else
                   "the model answers less reliably what it could reach before")
        return (f"{first} while pass@{k} did not change ({100 * dk:+.1f}, 95% CI [{100 * low:+.1f}, "
                f"{100 * high:+.1f}]): {verdict} ({counts_text}).")
    if dk > 0:
        verdict = ("RL taught the model to solve items no draw solved before" + (", and sharpened others"
                   if d1 > 0 and sharpened else ""))
    else:
        verdict = "the model lost items it could reach before: its reachable set narrowed"
    return f"{first} and {top}: {verdict} ({counts_text})."


# --- episodes: success@k and achievements@k ----------------------------------------------------------------------
# An episode eval with K sampled episodes per held-out world (`vlrl.episodes.evaluate.sample`) writes one record per
# world whose draws are its episodes ({"correct": success, "achievements": [...]}): pass@k above is then success@k,
# the chance that at least one of k episodes of a world succeeds. achievements@k is its analogue for an open-ended
# game: the expected number of distinct achievements that at least one of k episodes unlocks, which by linearity is
# the sum over achievements of pass@k with c = the episodes that unlocked it (unbiased, as pass@k is). At k = 1 it
# is the mean achievements per episode.

def achievement_counts(records: list[dict]) -> dict:
    """{id: (n, {achievement: episodes that unlocked it})} from sampled episode records.

    >>> achievement_counts([{"id": "w", "draws": [{"achievements": ["a", "b"]}, {"achievements": ["a"]}]}])
    {'w': (2, {'a': 2, 'b': 1})}
    """
    out = {}
    for record in records:
        draws = record.get("draws") or []
        if not draws or any(not isinstance(d.get("achievements"), list) for d in draws):
            raise EvalError(f"record {record.get('id')!r} has no episodes with achievement lists; achievements@k "
                            "needs sampled episodes of an environment that reports achievements (Crafter).")
        unlocked: dict[str, int] = {}
        for draw in draws:
            for name in set(draw["achievements"]):
                unlocked[name] = unlocked.get(name, 0) + 1
        out[record["id"]] = (len(draws), dict(sorted(unlocked.items())))
    return out


def has_achievements(records: list[dict]) -> bool:
    """Whether sampled records carry each episode's achievements (achievements@k applies)."""
    return is_sampled(records) and all(isinstance(d.get("achievements"), list) for r in records for d in r["draws"])


def achievements_at_k(n: int, unlocked: dict, k: int) -> float:
    """One world's achievements@k: the expected number of distinct achievements at least one of k episodes unlocks,
    of n episodes where `unlocked[a]` unlocked achievement a.

    >>> achievements_at_k(4, {"collect_wood": 4, "place_table": 2}, 1), achievements_at_k(4, {"place_table": 2}, 2)
    (1.5, 0.8333333333333334)
    """
    return sum(pass_at_k(n, c, k) for c in unlocked.values())


def compare_achievements_at_k(before: list[dict], after: list[dict], *, seed: int = 0) -> dict:
    """Paired by world: achievements@k before and after for every k with bootstrap intervals over worlds and paired
    ones of the change, the paired permutation test on achievements@1 (achievements per episode), and per achievement
    the share of worlds where any of the K episodes unlocked it, before and after (what the scripted warm start never
    reached and training does shows here).

    >>> w = lambda i, *eps: {"id": i, "draws": [{"achievements": list(e)} for e in eps]}
    >>> c = compare_achievements_at_k([w("a", [], ["x"]), w("b", [], [])], [w("a", ["x"], ["x", "y"]), w("b", ["x"], [])])
    >>> c["achievements_at_k_before"], c["achievements_at_k_after"], c["reached_after"]["y"]
    ([0.25, 0.5], [1.0, 1.5], 0.5)
    """
    b, a = achievement_counts(before), achievement_counts(after)
    ids = [i for i in b if i in a]
    if not ids:
        raise EvalError("the two sampled evals share no world; compare evals of the same worlds.")
    n = b[ids[0]][0]
    if {b[i][0] for i in ids} | {a[i][0] for i in ids} != {n}:
        raise EvalError("the sampled evals hold different numbers of episodes per world; sample every world K times.")
    ks = list(range(1, n + 1))
    out = {"samples": n, "n_paired": len(ids), "k": ks}
    for side, counts_ in (("before", b), ("after", a)):
        per_k = [[achievements_at_k(n, counts_[i][1], k) for i in ids] for k in ks]
        out[f"achievements_at_k_{side}"] = [sum(v) / len(v) for v in per_k]
        out[f"achievements_at_k_{side}_ci95"] = [list(bootstrap_ci(v, seed=seed)) for v in per_k]
    deltas = [[achievements_at_k(n, a[i][1], k) - achievements_at_k(n, b[i][1], k) for i in ids] for k in ks]
    out["achievements_at_k_delta"] = [sum(d) / len(d) for d in deltas]
    out["achievements_at_k_delta_ci95"] = [list(bootstrap_ci(d, seed=seed)) for d in deltas]
    out["achievements_at_1_p"] = paired_permutation(deltas[0])
    names = sorted({name for counts_ in (b, a) for i in ids for name in counts_[i][1]})
    for side, counts_ in (("before", b), ("after", a)):
        out[f"reached_{side}"] = {name: sum(name in counts_[i][1] for i in ids) / len(ids) for name in names}
    out["test"] = "paired sign-flip permutation test on per-world achievements per episode"
    return out
