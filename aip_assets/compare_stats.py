"""The statistics of a run comparison (``compare``): Holm's adjustment, the two-proportion z-test and
Newcombe's interval, Student's t (two-sided p-value and quantile), and the bootstrap standard
error of a difference over resampled units (paired or not)."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

from .analysis.claims import adjusted
from .stats import newcombe as stats_newcombe


def holm(pvalues: list[float]) -> list[float]:
    """Holm–Bonferroni adjusted p-values (the analysis layer's, ``analysis.claims.adjusted``)."""
    return adjusted(list(pvalues), "holm")


N_BOOT = 2000


def two_proportion_p(ka: int, na: int, kb: int, nb: int) -> float:
    """Two-sided p-value of the pooled two-proportion z-test of kb/nb - ka/na."""
    pool = (ka + kb) / (na + nb)
    se = math.sqrt(pool * (1 - pool) * (1 / na + 1 / nb))
    diff = kb / nb - ka / na
    if se == 0:
        return 1.0 if diff == 0 else 0.0
    return math.erfc(abs(diff / se) / math.sqrt(2))


def newcombe(ka: int, na: int, kb: int, nb: int, z: float) -> tuple[float, float]:
    """Newcombe's hybrid Wilson score interval for kb/nb - ka/na (his method 10: ``stats.newcombe``)."""
    lo, hi = stats_newcombe(kb, nb, ka, na, z)
    assert lo is not None and hi is not None  # na, nb > 0
    return lo, hi


def t_two_sided_p(t: float, df: int) -> float:
    """P(|T| >= |t|) for Student's t with integer ``df`` (Abramowitz & Stegun 26.7.3-4); the normal
    distribution beyond 1000 df."""
    t = abs(t)
    if df > 1000:
        return math.erfc(t / math.sqrt(2))
    theta = math.atan(t / math.sqrt(df))
    c2, s = math.cos(theta) ** 2, math.sin(theta)
    term = acc = 1.0
    if df % 2:
        for k in range(3, df, 2):
            term *= (k - 1) / k * c2
            acc += term
        a = 2 / math.pi * (theta + (s * math.cos(theta) * acc if df > 1 else 0.0))
    else:
        for k in range(2, df - 1, 2):
            term *= (k - 1) / k * c2
            acc += term
        a = s * acc
    return min(1.0, max(0.0, 1.0 - a))


def t_quantile(q: float, df: int) -> float:
    """The q-quantile (q > 0.5) of Student's t with ``df`` degrees of freedom, by bisection."""
    if df > 1000:
        return NormalDist().inv_cdf(q)
    target, lo, hi = 2 * (1 - q), 0.0, 1.0
    while t_two_sided_p(hi, df) > target:
        hi *= 2
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_two_sided_p(mid, df) > target else (lo, mid)
    return (lo + hi) / 2


Units = dict[str, np.ndarray]  # unit (input id or perturbation group) -> sufficient sums


def bootstrap_se(
    units_a: Units, units_b: Units, stat, norm_a, norm_b, paired: bool, seed: int, n_boot: int = N_BOOT
) -> float:
    """Standard deviation of norm_b(stat(B*)) - norm_a(stat(A*)) over bootstrap resamples of the units.

    Paired: one multinomial draw over the union of units serves both runs (a unit a run did not
    score contributes nothing to that run). Unpaired: each run's units are drawn on their own.
    """
    rng = np.random.default_rng(seed)
    k = len(next(iter(units_a.values())))
    zero = np.zeros(k)
    diffs = []
    chunk = max(1, min(n_boot, 2_000_000 // max(1, len(units_a) + len(units_b))))
    if paired:
        keys = sorted(set(units_a) | set(units_b))
        ma = np.array([units_a.get(u, zero) for u in keys])
        mb = np.array([units_b.get(u, zero) for u in keys])
        n = len(keys)
        for start in range(0, n_boot, chunk):
            w = rng.multinomial(n, np.full(n, 1 / n), size=min(chunk, n_boot - start))
            diffs.append(norm_b(stat(w @ mb)) - norm_a(stat(w @ ma)))
    else:
        ma, mb = np.array(list(units_a.values())), np.array(list(units_b.values()))
        for start in range(0, n_boot, chunk):
            size = min(chunk, n_boot - start)
            wa = rng.multinomial(len(ma), np.full(len(ma), 1 / len(ma)), size=size)
            wb = rng.multinomial(len(mb), np.full(len(mb), 1 / len(mb)), size=size)
            diffs.append(norm_b(stat(wb @ mb)) - norm_a(stat(wa @ ma)))
    d = np.concatenate(diffs)
    d = d[~np.isnan(d)]
    return float(np.std(d, ddof=1)) if len(d) > 1 else float("nan")
