"""Intervals and score normalisation (DESIGN.md "Scores")."""

from __future__ import annotations

import math
from typing import Sequence

Z95 = 1.959963984540054


def wilson(k: int, n: int, z: float = Z95) -> tuple[float | None, float | None]:
    """Wilson score interval for a rate k/n; (None, None) when n == 0."""
    if n <= 0:
        return None, None
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    lo = 0.0 if k == 0 else max(0.0, centre - half)
    hi = 1.0 if k == n else min(1.0, centre + half)
    return lo, hi


def cluster_bootstrap_mean(values: Sequence[float], clusters: Sequence[str], n_boot: int = 2000,
                           seed: int = 0) -> tuple[float | None, float | None]:
    """95% percentile interval of the mean, resampling whole clusters (input rows).

    Vectorised (numpy), in chunks of resamples, so 100,000 clusters take seconds, not minutes."""
    import numpy as np

    if not values:
        return None, None
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for v, c in zip(values, clusters):
        sums[c] = sums.get(c, 0.0) + v
        counts[c] = counts.get(c, 0) + 1
    s = np.fromiter(sums.values(), dtype=float)
    n = np.fromiter((counts[c] for c in sums), dtype=float)
    g = len(s)
    if g == 1:
        m = float(s[0] / n[0])
        return m, m
    rng = np.random.default_rng(seed)
    chunk = max(1, min(n_boot, 5_000_000 // g))
    means = np.empty(n_boot)
    for start in range(0, n_boot, chunk):
        k = min(chunk, n_boot - start)
        idx = rng.integers(0, g, size=(k, g))
        means[start:start + k] = s[idx].sum(axis=1) / n[idx].sum(axis=1)
    means.sort()
    return float(means[int(0.025 * n_boot)]), float(means[min(n_boot - 1, int(0.975 * n_boot))])


def normalise(raw: float | None, lo: float, hi: float, inverted: bool) -> float | None:
    """clip((raw - min) / (max - min), 0, 1), then 1 - x when inverted."""
    if raw is None:
        return None
    if hi == lo:
        x = 1.0 if raw >= hi else 0.0
    else:
        x = min(1.0, max(0.0, (raw - lo) / (hi - lo)))
    return 1.0 - x if inverted else x


def normalise_interval(lo_raw, hi_raw, lo: float, hi: float, inverted: bool) -> tuple[float | None, float | None]:
    a, b = normalise(lo_raw, lo, hi, inverted), normalise(hi_raw, lo, hi, inverted)
    if a is None or b is None:
        return None, None
    return min(a, b), max(a, b)


def holm(pvalues: list[float]) -> list[float]:
    """Holm–Bonferroni adjusted p-values (step-down, monotone, capped at 1)."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adj = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        adj[i] = running
    return adj


def fisher_exact(k1: int, n1: int, k2: int, n2: int) -> float:
    """Two-sided p-value of Fisher's exact test that k1/n1 and k2/n2 share one rate: the
    probability, under the hypergeometric law with the margins fixed, of every table no more
    likely than the one observed. Exact at every sample size."""
    if n1 <= 0 or n2 <= 0:
        return 1.0
    k, n = k1 + k2, n1 + n2

    def lchoose(a: int, b: int) -> float:
        return math.lgamma(a + 1) - math.lgamma(b + 1) - math.lgamma(a - b + 1)

    base = lchoose(n, k)
    logp = lambda x: lchoose(n1, x) + lchoose(n2, k - x) - base  # noqa: E731
    observed = logp(k1)
    total = sum(math.exp(lp) for lp in (logp(x) for x in range(max(0, k - n2), min(k, n1) + 1))
                if lp <= observed + 1e-9)
    return min(1.0, total)


def third(score: float) -> str:
    """A 0-1 score as a category for agreement between judges: low [0, 1/3), mid, high [2/3, 1]."""
    return "low" if score < 1 / 3 else ("mid" if score < 2 / 3 else "high")
