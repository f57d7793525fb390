"""Intervals and score normalisation (DESIGN.md "Scores")."""

from __future__ import annotations

import math
from typing import Sequence

Z95 = 1.959963984540054
BOOT_CELLS = 5_000_000  # cluster draws held in memory at once by the bootstrap (a chunk of resamples)


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


def bootstrap(vectors, stat, seed: int = 0, n_boot: int = 2000) -> tuple[float | None, float | None]:
    """95% percentile interval of ``stat`` of summed cluster vectors, resampling whole clusters
    (each a row: its units' summed values and count). Vectorised (numpy) in chunks of resamples,
    so 100,000 clusters take seconds, not minutes. The statistic is exactly the one the score
    reports (a pooled mean weighs each cluster by its units; see ``scoring``)."""
    import numpy as np

    vectors = np.asarray(vectors, dtype=float)
    g = len(vectors)
    if g == 0:
        return None, None
    rng = np.random.default_rng(seed)
    chunk = max(1, min(n_boot, BOOT_CELLS // g))  # the chunking never changes the interval, only memory
    out = np.empty(n_boot)
    for start in range(0, n_boot, chunk):
        k = min(chunk, n_boot - start)
        idx = rng.integers(0, g, size=(k, g))
        out[start:start + k] = stat(vectors[idx].sum(axis=1))
    out = np.sort(out[~np.isnan(out)])
    if not len(out):
        return None, None
    return float(out[int(0.025 * len(out))]), float(out[int(0.975 * len(out))])  # int(0.975 L) < L


def cluster_bootstrap_mean(values: Sequence[float], clusters: Sequence[str], n_boot: int = 2000,
                           seed: int = 0) -> tuple[float | None, float | None]:
    """95% percentile interval of the pooled mean of ``values``, resampling whole clusters (input
    rows): :func:`bootstrap` of each cluster's (sum, count)."""
    if not values:
        return None, None
    sums: dict[str, list[float]] = {}
    for v, c in zip(values, clusters):
        s = sums.setdefault(c, [0.0, 0.0])
        s[0] += v
        s[1] += 1
    return bootstrap(list(sums.values()), lambda x: x[..., 0] / x[..., 1], seed=seed, n_boot=n_boot)


def normalise_array(raw, lo: float, hi: float, inverted: bool):
    """clip((raw - min) / (max - min), 0, 1), then 1 - x when inverted; vectorised (NaN stays NaN).
    With min == max the normalised score is a step: 1 at or above it, else 0."""
    import numpy as np

    raw = np.asarray(raw, dtype=float)
    x = np.where(raw >= hi, 1.0, 0.0) if hi == lo else np.clip((raw - lo) / (hi - lo), 0.0, 1.0)
    x = np.where(np.isnan(raw), np.nan, x)
    return 1.0 - x if inverted else x


def normalise(raw: float | None, lo: float, hi: float, inverted: bool) -> float | None:
    """:func:`normalise_array` of one raw score (None stays None)."""
    return None if raw is None else float(normalise_array(raw, lo, hi, inverted))


def normalise_interval(lo_raw, hi_raw, lo: float, hi: float, inverted: bool) -> tuple[float | None, float | None]:
    a, b = normalise(lo_raw, lo, hi, inverted), normalise(hi_raw, lo, hi, inverted)
    if a is None or b is None:
        return None, None
    return min(a, b), max(a, b)


def holm(pvalues: list[float]) -> list[float]:
    """Holm–Bonferroni adjusted p-values (step-down, monotone, capped at 1)."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adj: dict[int, float] = {}
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        adj[i] = running
    return [adj[i] for i in range(m)]


def fisher_exact(k1: int, n1: int, k2: int, n2: int) -> float:
    """Two-sided p-value of Fisher's exact test that k1/n1 and k2/n2 share one rate: the
    probability, under the hypergeometric law with the margins fixed, of every table no more
    likely than the one observed. Exact at every sample size; an empty group gives 1.0 (the
    only table with its margins is the one observed)."""
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
