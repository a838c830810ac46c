"""pass@k and its paired statistics: the estimator against brute force, the paired permutation test against SciPy,
the moves between never / sometimes / always, and the one-sentence reading of a before/after pair."""

import itertools
import math
import random

import pytest
from scipy import stats as scipy_stats

from vlrl.base.errors import EvalError
from vlrl.base.stats import bootstrap_ci, paired_permutation, pass_at_k
from vlrl.evaluation import passk
from vlrl.evaluation.compare import compare, summary


def brute_pass_at_k(outcomes: list[bool], k: int) -> float:
    """The share of the k-subsets of the draws that hold a correct one: what pass@k estimates, by enumeration."""
    subsets = list(itertools.combinations(outcomes, k))
    return sum(any(s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8])
def test_pass_at_k_equals_brute_force_on_every_small_case(n):
    for c in range(n + 1):
        outcomes = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(brute_pass_at_k(outcomes, k), abs=1e-12), (n, c, k)


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_achievements_at_k_is_the_mean_union_over_every_k_subset_of_episodes(n):
    rng = random.Random(n)
    names = ["collect_wood", "place_table", "collect_drink", "make_wood_pickaxe"]
    for _ in range(20):
        episodes = [[a for a in names if rng.random() < 0.4] for _ in range(n)]
        record = {"id": "w", "draws": [{"achievements": e} for e in episodes]}
        draws, unlocked = passk.achievement_counts([record])["w"]
        for k in range(1, n + 1):
            subsets = list(itertools.combinations(episodes, k))
            brute = sum(len(set().union(*s)) for s in subsets) / len(subsets)
            assert passk.achievements_at_k(draws, unlocked, k) == pytest.approx(brute, abs=1e-12), (episodes, k)
        assert passk.achievements_at_k(draws, unlocked, 1) == pytest.approx(sum(map(len, episodes)) / n)


def test_achievements_at_k_needs_achievement_lists_and_equal_k():
    with pytest.raises(EvalError, match="achievement lists"):
        passk.achievement_counts([{"id": "w", "draws": [{"correct": True}]}])
    w = lambda i, *eps: {"id": i, "draws": [{"achievements": list(e)} for e in eps]}
    with pytest.raises(EvalError, match="different numbers of episodes"):
        passk.compare_achievements_at_k([w("a", [], [])], [w("a", [])])


def test_pass_at_1_is_the_share_correct_and_bad_arguments_are_refused():
    assert pass_at_k(8, 3, 1) == pytest.approx(3 / 8)
    for bad in ((4, 5, 1), (4, 1, 0), (4, 1, 5), (4, -1, 1)):
        with pytest.raises(ValueError):
            pass_at_k(*bad)


def scipy_p(diffs: list[float]) -> float:
    """SciPy's exact paired (sign-flip) permutation test of the mean difference, two-sided."""
    nonzero = [d for d in diffs if d != 0]
    result = scipy_stats.permutation_test((nonzero,), lambda x, axis: x.mean(axis=axis), permutation_type="samples",
                                          n_resamples=math.inf, alternative="two-sided")
    return float(result.pvalue)


@pytest.mark.parametrize("seed", range(8))
def test_paired_permutation_matches_scipy_on_pass_rate_differences(seed):
    rng = random.Random(seed)
    k = rng.choice([2, 4, 8])
    items = rng.randint(3, 12)
    diffs = [(rng.randint(0, k) - rng.randint(0, k)) / k for _ in range(items)]
    if not any(diffs):
        diffs[0] = 1 / k
    assert paired_permutation(diffs) == pytest.approx(scipy_p(diffs), rel=1e-9, abs=1e-12)


def test_paired_permutation_monte_carlo_path_agrees_with_the_exact_one():
    diffs = [math.sqrt(2) * x for x in (1, 1, 1, -1, 1, 1, 0.5, 1, -0.5, 1, 1, 1)]  # irrational: no grid, sampled
    exact = paired_permutation([x / math.sqrt(2) for x in diffs])  # the same signs on a grid: counted exactly
    assert paired_permutation(diffs, resamples=40_000) == pytest.approx(exact, abs=0.01)
    assert paired_permutation([0, 0, 0]) == 1.0


def test_bootstrap_interval_is_seeded_and_covers_the_mean():
    rng = random.Random(1)
    values = [rng.random() for _ in range(60)]
    assert bootstrap_ci(values, seed=3) == bootstrap_ci(values, seed=3)
    low, high = bootstrap_ci(values)
    assert low < sum(values) / len(values) < high


def rec(item, *ok):
    return {"id": item, "correct": ok[0], "format_ok": True, "draws": [{"correct": x} for x in ok]}


def test_curve_states_and_compare_moves():
    before = [rec("a", False, False, False, False), rec("b", True, False, False, False), rec("c", True, True, True, True),
              rec("d", True, False, True, False)]
    after = [rec("a", True, False, False, False), rec("b", True, True, True, True), rec("c", True, True, True, True),
             rec("d", False, False, False, False)]
    curve = passk.pass_at_k_curve(before)
    assert curve["k"] == [1, 2, 3, 4] and curve["never"] == 0.25 and curve["always"] == 0.25
    assert curve["pass_at_k"][0] == pytest.approx((0 + 1 + 4 + 2) / 16)
    assert curve["per_item"]["b"] == pytest.approx([0.25, 0.5, 0.75, 1.0]) and curve["per_item"]["a"] == [0.0] * 4
    assert curve["never_ci95"][0] < 0.25 < curve["never_ci95"][1]
    change = passk.compare_pass_at_k(before, after)
    assert change["learned"] == ["a"] and change["sharpened"] == ["b"] and change["lost"] == ["d"]
    assert change["moves"]["always_to_always"] == 1 and sum(change["moves"].values()) == 4
    rates = [1 / 4 - 0, 1 - 1 / 4, 0, 0 - 2 / 4]
    assert change["pass_at_1_p"] == pytest.approx(scipy_p(rates))
    assert change["pass_at_k_before"][-1] == 0.75 and change["pass_at_k_after"][-1] == 0.75
    assert change["before"]["pass_at_k"] == change["pass_at_k_before"] and change["after"]["never"] == 0.25
    assert change["counts"]["b"] == [1, 4]


def test_compare_adds_pass_at_k_only_for_sampled_files_and_summary_says_it():
    greedy = [{"id": i, "correct": i < 3, "format_ok": True} for i in range(6)]
    assert "pass_at_k" not in compare(greedy, greedy)
    before = [rec(i, False, False) for i in range(6)]
    after = [rec(i, True, i < 3) for i in range(6)]
    result = compare(before, after)
    assert result["pass_at_k"]["learned"] == list(range(6)) and result["pass_at_k"]["sharpened"] == []
    text = summary(result)
    assert "pass@1" in text and result["pass_at_k"]["meaning"] in text


def test_unequal_draws_and_greedy_records_are_clear_errors():
    with pytest.raises(EvalError, match="--samples K"):
        passk.pass_at_k_curve([{"id": "a", "correct": True}])
    with pytest.raises(EvalError, match="same --samples K"):
        passk.compare_pass_at_k([rec("a", True, False)], [rec("a", True, False, True)])


@pytest.mark.parametrize("d1, p, dk, ci, learned, sharpened, expected", [
    (0.10, 0.001, 0.0, (-0.03, 0.03), 0, 8, "sharpened answers the model could already reach"),
    (0.10, 0.001, 0.08, (0.02, 0.14), 6, 3, "taught the model to solve items no draw solved before"),
    (0.01, 0.7, 0.0, (-0.03, 0.03), 1, 1, "Neither pass@1"),
    (-0.10, 0.002, -0.09, (-0.15, -0.03), 0, 0, "reachable set narrowed"),
])
def test_describe_names_the_kind_of_change(d1, p, dk, ci, learned, sharpened, expected):
    change = {"samples": 8, "n_paired": 100, "pass_at_1_delta": d1, "pass_at_1_p": p,
              "pass_at_k_delta": [d1] + [dk] * 7, "pass_at_k_delta_ci95": [[d1 - .02, d1 + .02]] + [list(ci)] * 7,
              "learned": list(range(learned)), "sharpened": list(range(sharpened))}
    assert expected in passk.describe(change)
