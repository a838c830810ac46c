"""The statistics of vlrl's comparisons, in one place: proportions (Wilson intervals), paired tests (exact McNemar on
flips, a paired sign-flip permutation test on per-item scores), bootstrap intervals over items, and the unbiased
pass@k estimator. No SciPy at run time: the tests check each against a reference (SciPy, brute force).

    wilson(41, 100)                                 # 95% interval of 41/100
    mcnemar_exact(b=12, c=3)                        # wrong->right 12, right->wrong 3
    paired_permutation([0.25, 0.5, 0.0, -0.25])     # per-item differences after - before
    pass_at_k(n=8, c=2, k=4)                        # 8 samples, 2 correct: chance that 4 drawn hold one
"""

from __future__ import annotations

import math
import random
from fractions import Fraction

# --- proportions ---------------------------------------------------------------------------------------------------

def wilson(successes: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score interval for a proportion (95% by default): honest near 0% and 100%, unlike p +- 1.96 SE.

    >>> [round(x, 4) for x in wilson(5, 100)]
    [0.0215, 0.1118]
    >>> [round(x, 4) for x in wilson(0, 10)]
    [0.0, 0.2775]
    >>> wilson(10, 10)[1]  # exactly 1, not 0.9999999999999999: an interval always holds its own estimate
    1.0
    """
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    denom = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # the interval holds p in exact arithmetic; in floating point 10 of 10 gave an upper bound just below 1.0, which
    # a report's error bar (p - low, high - p) turned negative and matplotlib refused (seen on a 10-item eval)
    return (min(p, max(0.0, center - half)), max(p, min(1.0, center + half)))


# --- paired tests --------------------------------------------------------------------------------------------------

def mcnemar_exact(b: int, c: int) -> float:
    """Exact two-sided McNemar p-value from the discordant counts b (wrong->right) and c (right->wrong).

    Under "no change" each flip goes either way with probability 1/2, so min(b, c) ~ Binomial(b + c, 1/2);
    items that stay right or stay wrong carry no information about the change.

    >>> round(mcnemar_exact(10, 2), 4)
    0.0386
    >>> mcnemar_exact(3, 2)
    1.0
    """
    n = b + c
    if n == 0:
        return 1.0
    k = min(b, c)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n
    return min(1.0, 2 * tail)


EXACT_LIMIT = 200_000  # sign-flip distributions with more support points than this are sampled instead
RESAMPLES = 100_000    # Monte Carlo sign flips when the exact distribution is too large


def paired_permutation(differences, *, resamples: int = RESAMPLES, seed: int = 0) -> float:
    """Two-sided p-value of the paired sign-flip permutation test: under "no change", each item's difference
    (after - before) is as likely to have the other sign, so the observed sum is compared with the sums of every
    sign assignment. Items with no difference carry no information and drop out.

    Exact when the differences lie on a grid (per-item pass rates of K samples are multiples of 1/K; any finite
    decimals are): the sum's distribution is counted by dynamic programming, in time (items x grid points). Else
    (irrational steps, or more than EXACT_LIMIT grid points) `resamples` seeded random sign flips estimate it.
    SciPy's `permutation_test(..., permutation_type="samples")` and `wilcoxon` answer the same question; the tests
    compare with them.

    >>> paired_permutation([1, 1, 1, 1, 1])          # 5 gains: 2 of the 32 sign patterns are as extreme
    0.0625
    >>> paired_permutation([0.25, -0.25, 0.5, 0.0])  # |sum| >= 0.5 in 6 of the 8 sign patterns of 3 items
    0.75
    """
    diffs = [d for d in (float(x) for x in differences) if d != 0.0]
    if not diffs:
        return 1.0
    grid = _on_grid(diffs)
    if grid is not None:
        units, _ = grid
        return _exact_sign_flip(units)
    rng = random.Random(seed)
    observed = abs(sum(diffs))
    hits = sum(abs(sum(d if rng.random() < 0.5 else -d for d in diffs)) >= observed - 1e-12 for _ in range(resamples))
    return (hits + 1) / (resamples + 1)


def _on_grid(diffs: list[float]) -> tuple[list[int], Fraction] | None:
    """The differences as integer multiples of one step (their exact rational GCD), or None when that grid would
    have more than EXACT_LIMIT points."""
    fractions = [Fraction(d).limit_denominator(10 ** 6) for d in diffs]
    if any(abs(float(f) - d) > 1e-9 * max(1.0, abs(d)) for f, d in zip(fractions, diffs)):
        return None
    denominator = math.lcm(*(f.denominator for f in fractions))
    numerators = [int(f * denominator) for f in fractions]
    step = math.gcd(*numerators)
    units = [n // step for n in numerators]
    if sum(abs(u) for u in units) > EXACT_LIMIT:
        return None
    return units, Fraction(step, denominator)


def _exact_sign_flip(units: list[int]) -> float:
    """P(|sum of +-u_i| >= |observed sum|) over the 2^n equally likely sign patterns, by counting sums."""
    total = sum(abs(u) for u in units)
    counts = [0] * (2 * total + 1)  # index s + total: the number of sign patterns whose sum is s
    counts[total] = 1
    for u in (abs(u) for u in units):
        shifted = [0] * len(counts)
        for s, ways in enumerate(counts):
            if ways:
                if s + u < len(counts):
                    shifted[s + u] += ways
                if s - u >= 0:
                    shifted[s - u] += ways
        counts = shifted
    observed = abs(sum(units))
    extreme = sum(ways for s, ways in enumerate(counts) if abs(s - total) >= observed)
    return min(1.0, extreme / 2 ** len(units))


# --- intervals over items ------------------------------------------------------------------------------------------

BOOTSTRAP = 2000  # resamples of the items: enough for the 2.5% and 97.5% percentiles to settle to ~0.5 points


def bootstrap_ci(values, *, statistic=None, resamples: int = BOOTSTRAP, seed: int = 0,
                 level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of `statistic` (default: the mean) over items: the items are drawn with
    replacement `resamples` times, seeded, so the same values give the same interval (the mean is vectorized with
    numpy: 1,000 items x 2,000 resamples in milliseconds).

    >>> bootstrap_ci([1.0] * 10)
    (1.0, 1.0)
    >>> low, high = bootstrap_ci([0, 1] * 50)
    >>> 0.39 < low < 0.5 < high < 0.61
    True
    """
    import numpy as np

    values = [float(v) for v in values]
    if not values:
        return (0.0, 1.0)
    rng = np.random.default_rng(seed)
    n = len(values)
    picks = rng.integers(0, n, size=(resamples, n))
    if statistic is None:
        draws = np.sort(np.asarray(values)[picks].mean(axis=1))
    else:
        draws = np.sort([statistic([values[i] for i in row]) for row in picks])
    tail = (1 - level) / 2
    return (float(draws[int(tail * (resamples - 1))]), float(draws[math.ceil((1 - tail) * (resamples - 1))]))


# --- pass@k --------------------------------------------------------------------------------------------------------

def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimate of Chen et al. (2021) for one item: of `n` samples `c` are correct; the chance
    that `k` of them drawn without replacement hold at least one correct, 1 - C(n-c, k) / C(n, k).

    >>> pass_at_k(8, 0, 4), pass_at_k(8, 8, 1), pass_at_k(4, 1, 1)
    (0.0, 1.0, 0.25)
    >>> round(pass_at_k(8, 2, 4), 4)        # 1 - C(6,4)/C(8,4) = 1 - 15/70
    0.7857
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}.")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)
