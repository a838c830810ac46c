"""Before/after statistics on episode records: success with Wilson intervals and the exact McNemar test on the
episodes that flipped, mean return with bootstrap intervals and the paired sign-flip permutation test on per-episode
return differences, and the abnormal ends of each side. The statistics are `vlrl.base.stats`'.

    comparison = compare("runs/g/eval_before.jsonl", "runs/g/eval_after.jsonl")
    print(summary(comparison))

`vlrl.evaluation.compare.compare` hands episode records here (`is_episodes`), so `vlrl compare A B` takes either kind.
Crafter episodes (records whose metrics list achievements) are also scored as the Crafter paper scores them:
per-achievement success rates and the Crafter score with intervals, and their paired change
(`vlrl.envs.achievements`), under `crafter`.
"""

from __future__ import annotations

from pathlib import Path

from vlrl.base.stats import bootstrap_ci, mcnemar_exact, paired_permutation, wilson
from vlrl.envs.achievements import paired_report, record_achievements
from vlrl.evaluation.records import by_id, read_records

REQUIRED = ("id", "seed", "success", "return", "turns")


def is_episodes(records) -> bool:
    """Whether records (a list or a JSONL path) are episode records (`kind: "episode"`)."""
    records = read_records(records) if isinstance(records, (str, Path)) else records
    return bool(records) and all(r.get("kind") == "episode" for r in records)


def side_stats(records: list[dict], side: str) -> dict:
    """One side: success rate (Wilson 95%), mean return (bootstrap 95%), mean length, and the counts of invalid
    actions, truncated and failed episodes and dropped images.

    >>> s = side_stats([{"success": True, "return": 1.0, "length": 3, "turns": [{}] * 3}], "after")
    >>> s["success_after"], s["return_mean_after"], s["truncated_after"]
    (1.0, 1.0, 0)
    """
    n = len(records)
    wins = sum(bool(r["success"]) for r in records)
    returns = [float(r["return"]) for r in records]
    return {f"success_{side}": wins / n if n else None, f"success_{side}_ci95": list(wilson(wins, n)),
            f"return_mean_{side}": sum(returns) / n if n else None,
            f"return_mean_{side}_ci95": list(bootstrap_ci(returns)) if n else None,
            f"length_mean_{side}": sum(r.get("length", len(r["turns"])) for r in records) / n if n else None,
            f"invalid_actions_{side}": sum(r.get("invalid_actions", 0) for r in records),
            f"turns_{side}": sum(len(r["turns"]) for r in records),
            f"truncated_{side}": sum(r.get("status") == "truncated" for r in records),
            f"failed_{side}": sum(r.get("status") == "failed" for r in records),
            f"dropped_images_{side}": sum(r.get("dropped_images", 0) for r in records)}


def compare(before, after) -> dict:
    """Before/after statistics on episode records (lists or JSONL paths), paired by id (the seed).

    Returns:
        A JSON-ready dict: `kind` ("episodes"), `n_before`, `n_after`, `n_paired`, `only_before` / `only_after`;
        per side `success_*` (+ `_ci95`), `return_mean_*` (+ `_ci95`), `length_mean_*`, `invalid_actions_*`,
        `turns_*`, `truncated_*`, `failed_*`, `dropped_images_*`; `success_delta`, `return_delta`; `table` (the
        paired 2x2 of success), `mcnemar_p`, `return_permutation_p`, `failure_to_success` / `success_to_failure`
        (ids of the flipped episodes).

    >>> ep = lambda seed, ok: {"id": f"seed-{seed}", "seed": seed, "success": ok, "return": float(ok), "turns": []}
    >>> c = compare([ep(i, False) for i in range(10)], [ep(i, i < 8) for i in range(10)])
    >>> c["table"]["failure_to_success"], round(c["mcnemar_p"], 4), round(c["return_permutation_p"], 4)
    (8, 0.0078, 0.0078)
    """
    b_by, a_by = by_id(before, "before", REQUIRED, kind="episode record", unit="episode", writer="vlrl.episodes.evaluate"), \
        by_id(after, "after", REQUIRED, kind="episode record", unit="episode", writer="vlrl.episodes.evaluate")
    paired = [i for i in b_by if i in a_by]
    b_rows, a_rows = [b_by[i] for i in paired], [a_by[i] for i in paired]
    result = {"kind": "episodes", "n_before": len(b_by), "n_after": len(a_by), "n_paired": len(paired),
              "only_before": [i for i in b_by if i not in a_by], "only_after": [i for i in a_by if i not in b_by]}
    result.update(side_stats(b_rows, "before"))
    result.update(side_stats(a_rows, "after"))
    result["success_delta"] = result["success_after"] - result["success_before"] if paired else None
    result["return_delta"] = result["return_mean_after"] - result["return_mean_before"] if paired else None
    gained = [b["id"] for b, a in zip(b_rows, a_rows) if not b["success"] and a["success"]]
    lost = [b["id"] for b, a in zip(b_rows, a_rows) if b["success"] and not a["success"]]
    both = sum(bool(b["success"]) and bool(a["success"]) for b, a in zip(b_rows, a_rows))
    result["table"] = {"both_success": both, "failure_to_success": len(gained), "success_to_failure": len(lost),
                       "both_failure": len(paired) - both - len(gained) - len(lost)}
    result["mcnemar_p"] = mcnemar_exact(len(gained), len(lost))
    result["return_permutation_p"] = paired_permutation([float(a["return"]) - float(b["return"])
                                                         for b, a in zip(b_rows, a_rows)])
    result.update(failure_to_success=gained, success_to_failure=lost)
    b_lists, a_lists = [record_achievements(r) for r in b_rows], [record_achievements(r) for r in a_rows]
    if paired and all(x is not None for x in b_lists + a_lists):
        result["crafter"] = paired_report(b_lists, a_lists)
    return result


def summary(comparison: dict, alpha: float = 0.05) -> str:
    """A few lines a person can read.

    >>> ep = lambda seed, ok: {"id": f"seed-{seed}", "seed": seed, "success": ok, "return": float(ok), "turns": []}
    >>> print(summary(compare([ep(i, i < 2) for i in range(20)], [ep(i, i < 12) for i in range(20)])))
    success 10.0% [2.8%, 30.1%] -> 60.0% [38.7%, 78.1%] on 20 paired episodes (10 failure->success, 0 success->failure)
    mean return 0.10 [0.00, 0.25] -> 0.60 [0.40, 0.80]
    McNemar exact p = 0.00195 on success; paired permutation p = 0.00195 on returns: a real change at 0.05
    """
    c = comparison

    def rate(side):
        low, high = c[f"success_{side}_ci95"]
        return "n/a" if c[f"success_{side}"] is None else f"{c[f'success_{side}']:.1%} [{low:.1%}, {high:.1%}]"

    def mean(side):
        if c[f"return_mean_{side}"] is None:
            return "n/a"
        low, high = c[f"return_mean_{side}_ci95"]
        return f"{c[f'return_mean_{side}']:.2f} [{low:.2f}, {high:.2f}]"

    real = min(c["mcnemar_p"], c["return_permutation_p"]) < alpha
    lines = [(f"success {rate('before')} -> {rate('after')} on {c['n_paired']} paired episodes "
              f"({len(c['failure_to_success'])} failure->success, {len(c['success_to_failure'])} success->failure)"),
             f"mean return {mean('before')} -> {mean('after')}",
             (f"McNemar exact p = {c['mcnemar_p']:.3g} on success; paired permutation p = "
              f"{c['return_permutation_p']:.3g} on returns: "
              + ("a real change" if real else "not distinguishable from noise") + f" at {alpha:g}")]
    abnormal = [f"{c[f'{k}_{side}']} {k.replace('_', ' ')} {side}" for k in ("invalid_actions", "truncated", "failed",
                                                                            "dropped_images")
                for side in ("before", "after") if c.get(f"{k}_{side}")]
    if abnormal:
        lines.append("counted: " + ", ".join(abnormal))
    if c["only_before"] or c["only_after"]:
        lines.append(f"unpaired: {len(c['only_before'])} episodes only before, {len(c['only_after'])} only after "
                     "(left out of the paired statistics)")
    if c.get("crafter"):
        lines += crafter_lines(c["crafter"])
    lines += at_k_lines(c)
    return "\n".join(lines)


def at_k_lines(c: dict) -> list[str]:
    """success@k and achievements@k of a comparison with sampled episodes (`[eval] samples = K`), in a few lines.

    >>> from vlrl.evaluation.passk import compare_achievements_at_k
    >>> w = lambda i, *eps: {"id": i, "draws": [{"achievements": list(e)} for e in eps]}
    >>> ak = compare_achievements_at_k([w("a", [], ["x"])], [w("a", ["x"], ["x", "y"])])
    >>> print("\\n".join(at_k_lines({"achievements_at_k": ak})))
    achievements@1 0.50 -> 1.50, achievements@2 1.00 -> 2.00 (2 episodes per world, 1 worlds; paired permutation p = 1 on achievements per episode)
    reached by any of 2 episodes, share of worlds: x 100% -> 100%, y 0% -> 100%
    """
    lines = []
    pk, ak = c.get("pass_at_k"), c.get("achievements_at_k")
    if pk:
        k = pk["samples"]
        lines.append(f"success@1 {pk['pass_at_1_before']:.1%} -> {pk['pass_at_1_after']:.1%}, success@{k} "
                     f"{pk['pass_at_k_before'][-1]:.1%} -> {pk['pass_at_k_after'][-1]:.1%} ({k} episodes per world; "
                     f"paired permutation p = {pk['pass_at_1_p']:.3g} on success@1)")
        lines.append(pk["meaning"])  # in worlds and success@k already (`vlrl.evaluation.compare.with_samples`)
    if ak:
        k = ak["samples"]
        if c.get("crafter_samples"):
            lines += [f"{k} sampled episodes of each of {c['crafter_samples']['worlds']} worlds: "
                      + crafter_lines(c["crafter_samples"])[0].replace(" points)", " points; worlds resampled)")]
        lines.append(f"achievements@1 {ak['achievements_at_k_before'][0]:.2f} -> {ak['achievements_at_k_after'][0]:.2f}"
                     f", achievements@{k} {ak['achievements_at_k_before'][-1]:.2f} -> "
                     f"{ak['achievements_at_k_after'][-1]:.2f} ({k} episodes per world, {ak['n_paired']} worlds; "
                     f"paired permutation p = {ak['achievements_at_1_p']:.3g} on achievements per episode)")
        lines.append(f"reached by any of {k} episodes, share of worlds: " + (", ".join(
            f"{name} {ak['reached_before'][name]:.0%} -> {ak['reached_after'][name]:.0%}" for name in ak["reached_after"])
            or "no achievement on either side"))
    return lines


def sampled_crafter(before: list[dict], after: list[dict]) -> dict:
    """Crafter's figures (`paired_report`) over the K sampled episodes of every world both sides played (`[eval]
    samples = K`, records with `draws`), the bootstrap drawing worlds with their K episodes; plus `samples` and
    `worlds`.

    >>> w = lambda i, *eps: {"id": i, "draws": [{"achievements": list(e)} for e in eps]}
    >>> r = sampled_crafter([w("a", [], []), w("b", [], [])], [w("a", ["collect_wood"], []), w("b", [], [])])
    >>> r["after"]["rates"]["collect_wood"], r["samples"], r["worlds"]
    (25.0, 2, 2)
    """
    b, a = ({r["id"]: r["draws"] for r in side} for side in (before, after))
    ids = [i for i in b if i in a]
    samples = len(b[ids[0]]) if ids else 0

    def unlocked(side):
        return [list(draw.get("achievements") or []) for i in ids for draw in side[i]]

    return {**paired_report(unlocked(b), unlocked(a), cluster=max(1, samples)), "samples": samples,
            "worlds": len(ids)}


def crafter_lines(crafter: dict) -> list[str]:
    """The Crafter paper's figures in a few lines: the score before and after with intervals, its paired change,
    and every achievement whose rate moved.

    >>> from vlrl.envs.achievements import paired_report
    >>> for line in crafter_lines(paired_report([[]] * 4, [["collect_wood"]] * 3 + [[]])):
    ...     print(line)
    Crafter score 0.00% [0.00, 0.00] -> 0.22% [0.16, 0.23] (paired change +0.22 [+0.16, +0.23] points)
    collect_wood 0.0% -> 75.0% (3 gained, 0 lost, McNemar p = 0.25)
    """
    b, a = crafter["before"], crafter["after"]
    if b["score"] is None:
        return []
    lines = [f"Crafter score {b['score']:.2f}% [{b['score_ci95'][0]:.2f}, {b['score_ci95'][1]:.2f}] -> "
             f"{a['score']:.2f}% [{a['score_ci95'][0]:.2f}, {a['score_ci95'][1]:.2f}]"
             + (f" (paired change {crafter['score_delta']:+.2f} [{crafter['score_delta_ci95'][0]:+.2f}, "
                f"{crafter['score_delta_ci95'][1]:+.2f}] points)" if crafter.get("score_delta") is not None else "")]
    for name, moved in crafter.get("achievements", {}).items():
        if moved["gained"] or moved["lost"]:
            lines.append(f"{name} {b['rates'][name]:.1f}% -> {a['rates'][name]:.1f}% ({moved['gained']} gained, "
                         f"{moved['lost']} lost, McNemar p = {moved['mcnemar_p']:.3g})")
    return lines
