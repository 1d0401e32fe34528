"""Whether two sides' step times differ beyond run-to-run variation: a Mann-Whitney U test.

Step times are skewed (a slow first step, a busy neighbour), so a rank test is used rather than
a t-test on the means: the two-sided Mann-Whitney U test on each side's per-step times, exact
when both sides have at most `EXACT_MAX` steps and no ties, otherwise the normal approximation
with the tie correction and a continuity correction. Its effect sizes are the Hodges-Lehmann
shift (the median of every B step minus every A step, in ms, with its confidence interval
from the same U distribution) and the probability that a step of B is slower than a step of A
(ties count half; 0.5 is no difference).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from functools import cache
from typing import Any

ALPHA = 0.05
EXACT_MAX = 30
TEST = "Mann-Whitney U, two-sided"


@cache
def _counts(n: int, m: int) -> tuple[int, ...]:
    """How many orderings of n A-steps and m B-steps give each U (0..n*m)."""
    if n == 0 or m == 0:
        return (1,)
    # f(n, m, u) = f(n - 1, m, u - m) + f(n, m - 1, u)
    left, right = _counts(n - 1, m), _counts(n, m - 1)
    out = [0] * (n * m + 1)
    for u, c in enumerate(right):
        out[u] += c
    for u, c in enumerate(left):
        out[u + m] += c
    return tuple(out)


def _ranks(values: Sequence[float]) -> tuple[list[float], list[int]]:
    """Average ranks (1-based) of `values`, and the sizes of their tie groups."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    ties = []
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2.0 + 1.0
        ties.append(j - i + 1)
        i = j + 1
    return ranks, ties


def _normal_sf(z: float) -> float:
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def mann_whitney(a: Sequence[float], b: Sequence[float], alpha: float = ALPHA
                 ) -> dict[str, Any] | None:
    """The test of `b` against `a` (see the module docstring), or None with fewer than 3
    steps on a side. `u` is B's statistic: the number of (A, B) step pairs where B is slower."""
    n, m = len(a), len(b)
    if n < 3 or m < 3:
        return None
    ranks, ties = _ranks([*a, *b])
    u = sum(ranks[n:]) - m * (m + 1) / 2.0
    total = n * m
    exact = n <= EXACT_MAX and m <= EXACT_MAX and all(t == 1 for t in ties)
    if exact:
        counts = _counts(n, m)
        whole = sum(counts)
        k = int(round(u))
        low = sum(counts[: k + 1]) / whole
        high = sum(counts[k:]) / whole
        p = min(1.0, 2.0 * min(low, high))
        # The largest c with P(U <= c) <= alpha / 2: the interval drops c differences a side
        # (none reaches the level with very few steps: then no interval).
        below, c = 0, -1
        for value, count in enumerate(counts):
            if (below + count) / whole > alpha / 2.0:
                break
            below += count
            c = value
        drop = c
        method = "exact"
    else:
        mu = total / 2.0
        n_all = n + m
        tie_term = sum(t ** 3 - t for t in ties) / (n_all * (n_all - 1))
        sigma = math.sqrt(n * m / 12.0 * ((n_all + 1) - tie_term))
        z = (abs(u - mu) - 0.5) / sigma if sigma else 0.0
        p = min(1.0, 2.0 * _normal_sf(max(z, 0.0)))
        z_crit = statistics.NormalDist().inv_cdf(1.0 - alpha / 2.0)
        drop = max(int(math.floor(mu - z_crit * sigma)), 0)
        method = "normal approximation, tie-corrected"
    diffs = sorted(y - x for x in a for y in b)
    shift = statistics.median(diffs)
    ci = ([round(diffs[drop], 4), round(diffs[total - drop - 1], 4)]
          if 0 <= drop < total - drop else None)
    superiority = u / total
    return {
        "test": TEST, "method": method, "alpha": alpha,
        "a_steps": n, "b_steps": m, "u": round(u, 2), "p_value": _round_p(p),
        "significant": p < alpha,
        "effect": {
            "median_shift_ms": round(shift, 4),
            "median_shift_ci_ms": ci,
            "ci_level": round(1.0 - alpha, 4),
            "probability_b_slower": round(superiority, 4),
            "rank_biserial": round(2.0 * superiority - 1.0, 4),
        },
    }


def _round_p(p: float) -> float:
    return float(f"{p:.4g}")
