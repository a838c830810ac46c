"""Crafter scored the way its paper scores it (Hafner 2021, section 3): the success rate of each of the 22
achievements (the share of episodes that unlocked it at least once, in percent) and the Crafter score, the
geometric mean of those rates offset by one, exp(mean(ln(1 + s_i))) - 1, in percent. Needs no game: it reads the
achievement lists episodes report (`CrafterEnv.metrics()["achievements"]`, kept in each episode record).

    report = crafter_report([["collect_wood"], [], ["collect_wood", "place_table"]])
    report["score"], report["score_ci95"], report["rates"]["collect_wood"]   # 0.42..., [low, high], 66.66...

Intervals: Wilson 95% per achievement rate, a percentile bootstrap over episodes for the score (the episodes are
the sampled unit; their achievements stay together).
"""

from __future__ import annotations

import math

from vlrl.base.stats import wilson

# Crafter 1.8.3's 22 achievements (crafter/data.yaml), in its order; vlrl.envs.crafter checks them on first use.
ACHIEVEMENTS = ("collect_coal", "collect_diamond", "collect_drink", "collect_iron", "collect_sapling",
                "collect_stone", "collect_wood", "defeat_skeleton", "defeat_zombie", "eat_cow", "eat_plant",
                "make_iron_pickaxe", "make_iron_sword", "make_stone_pickaxe", "make_stone_sword",
                "make_wood_pickaxe", "make_wood_sword", "place_furnace", "place_plant", "place_stone",
                "place_table", "wake_up")
BOOTSTRAP = 2000  # resamples of the score's interval
PAPER_RANDOM_SCORE = 1.6  # percent: the random agent of the Crafter paper (Table 1)


def score(rates) -> float:
    """The Crafter score of success rates in percent (one per achievement, all 22): exp(mean(ln(1 + s))) - 1.

    >>> score([0.0] * 22), round(score([100.0] * 22), 6), round(score([100.0] + [0.0] * 21), 3)
    (0.0, 100.0, 0.233)
    """
    rates = list(rates)
    return math.exp(sum(math.log1p(r) for r in rates) / len(rates)) - 1


def unlocked_matrix(episodes) -> list[list[int]]:
    """Each episode's achievements (a list of names) as a row of 0/1 over ACHIEVEMENTS; unknown names are ignored."""
    return [[int(name in set(unlocked or ())) for name in ACHIEVEMENTS] for unlocked in episodes]


def crafter_report(episodes, *, resamples: int = BOOTSTRAP, seed: int = 0, cluster: int = 1) -> dict:
    """The paper's figures of some episodes, each given as the list of achievements it unlocked.

    Args:
        episodes: one list of achievement names per episode (order and repeats do not matter).
        resamples: bootstrap resamples for the score's interval; seeded, so the same episodes give the same one.
        cluster: episodes come in consecutive runs of this many from one world (K sampled episodes of each); the
            bootstrap draws worlds, their episodes together, since episodes of one world are not independent.

    Returns:
        {"episodes": n, "score": percent, "score_ci95": [low, high], "rates": {achievement: percent},
        "rates_ci95": {achievement: [low, high]}} (rates and intervals in percent); with no episodes, score None.

    >>> r = crafter_report([["collect_wood"], ["collect_wood", "wake_up"]])
    >>> r["rates"]["collect_wood"], r["rates"]["wake_up"], round(r["score"], 2)
    (100.0, 50.0, 0.47)
    """
    import numpy as np

    rows = np.asarray(unlocked_matrix(episodes), dtype=float).reshape(-1, len(ACHIEVEMENTS))
    n = len(rows)
    if n == 0:
        return {"episodes": 0, "score": None, "score_ci95": None, "rates": {}, "rates_ci95": {}}
    counts = rows.sum(axis=0)
    rates = {name: 100.0 * float(c) / n for name, c in zip(ACHIEVEMENTS, counts)}
    rates_ci = {name: [100.0 * bound for bound in wilson(int(c), n)] for name, c in zip(ACHIEVEMENTS, counts)}
    picks = _picks(n, cluster, resamples, seed)
    drawn = 100.0 * rows[picks].mean(axis=1)  # resamples x 22 rates, in percent
    scores = np.sort(np.expm1(np.log1p(drawn).mean(axis=1)))
    low, high = scores[int(0.025 * (resamples - 1))], scores[math.ceil(0.975 * (resamples - 1))]
    return {"episodes": n, "score": score(rates.values()), "score_ci95": [float(low), float(high)],
            "rates": rates, "rates_ci95": rates_ci}


def paired_report(before, after, *, resamples: int = BOOTSTRAP, seed: int = 0, cluster: int = 1) -> dict:
    """Before/after on the same worlds (episode i of each side played the same seed): both sides' reports, the
    change of the score with a paired bootstrap interval (the same episodes drawn on both sides), and per
    achievement the episodes that gained and lost it with the exact McNemar p. With `cluster` K > 1 (each world's
    K sampled episodes in a row, `crafter_report`) the bootstrap draws worlds, and the per-achievement pairs are left
    out: episode j before and episode j after share a world, not a draw, so no McNemar pairing exists.

    Returns:
        {"before": report, "after": report, "score_delta": points, "score_delta_ci95": [low, high],
        "achievements": {name: {"gained": g, "lost": l, "mcnemar_p": p}}}.

    >>> r = paired_report([[]] * 10, [["collect_wood"]] * 8 + [[]] * 2)
    >>> r["achievements"]["collect_wood"], round(r["score_delta"], 2)
    ({'gained': 8, 'lost': 0, 'mcnemar_p': 0.0078125}, 0.22)
    """
    import numpy as np

    from vlrl.base.stats import mcnemar_exact

    b = np.asarray(unlocked_matrix(before), dtype=float).reshape(-1, len(ACHIEVEMENTS))
    a = np.asarray(unlocked_matrix(after), dtype=float).reshape(-1, len(ACHIEVEMENTS))
    result = {"before": crafter_report(before, resamples=resamples, seed=seed, cluster=cluster),
              "after": crafter_report(after, resamples=resamples, seed=seed, cluster=cluster)}
    n = len(b)
    if n == 0 or len(a) != n:
        return {**result, "score_delta": None, "score_delta_ci95": None, "achievements": {}}
    picks = _picks(n, cluster, resamples, seed)

    def scores(rows):
        return np.expm1(np.log1p(100.0 * rows[picks].mean(axis=1)).mean(axis=1))

    deltas = np.sort(scores(a) - scores(b))
    result["score_delta"] = result["after"]["score"] - result["before"]["score"]
    result["score_delta_ci95"] = [float(deltas[int(0.025 * (resamples - 1))]),
                                  float(deltas[math.ceil(0.975 * (resamples - 1))])]
    if cluster > 1:
        result["achievements"] = {}
        return result
    gained, lost = ((a == 1) & (b == 0)).sum(axis=0), ((a == 0) & (b == 1)).sum(axis=0)
    result["achievements"] = {name: {"gained": int(g), "lost": int(lo), "mcnemar_p": mcnemar_exact(int(g), int(lo))}
                              for name, g, lo in zip(ACHIEVEMENTS, gained, lost)}
    return result


def _picks(n: int, cluster: int, resamples: int, seed: int):
    """Bootstrap resamples of n episode indices (resamples x n): whole runs of `cluster` consecutive episodes drawn
    with replacement (cluster 1: single episodes).

    >>> _picks(4, 2, 3, 0).shape, sorted({tuple(sorted({int(i) // 2 for i in row[:2]})) for row in _picks(4, 2, 50, 0)})
    ((3, 4), [(0,), (1,)])
    """
    import numpy as np

    cluster = max(1, cluster)
    if n % cluster:
        raise ValueError(f"{n} episodes do not come in worlds of {cluster}")
    worlds = np.random.default_rng(seed).integers(0, n // cluster, size=(resamples, n // cluster))
    return (worlds[:, :, None] * cluster + np.arange(cluster)).reshape(resamples, n)


def record_achievements(record: dict) -> list[str] | None:
    """The achievements an episode record (vlrl.episodes.evaluate) unlocked, or None when it is no Crafter
    episode (its metrics carry no achievement list)."""
    metrics = record.get("metrics") or {}
    found = metrics.get("achievements")
    return list(found) if isinstance(found, list) else None
