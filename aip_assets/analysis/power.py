"""What a run can detect: the smallest effect each claim would be made for with 80% power.

Planned before the run (``aip-eval run --dry-run``, and a warning before the first SUT call when
a threshold asks for less than the run can show) from the synthesised design and stated
assumptions; said again after the run from what it observed. Normal approximations at the level a
claim must clear at Holm's first step (alpha over the number of claims tested: the strictest
step, so an effect this size is detected whatever else the run finds), ignoring the correlation
of units of one question: a planning figure, not a guarantee (``docs/concepts/claims.md`` shows
it against simulated runs).
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

POWER = 0.8
_N = NormalDist()


def z(p: float) -> float:
    return _N.inv_cdf(p)


def level(alpha: float, m: int, sides: str) -> float:
    """The critical z of one claim at Holm's first step (alpha / m), one- or two-sided."""
    a = alpha / max(1, m)
    return z(1 - (a / 2 if sides == "two-sided" else a))


def mde_rate_excess(n1: int, n0: int, p0: float, alpha: float, m: int) -> float | None:
    """The smallest excess d of a rate over a baseline p0 (n1 units against n0) that a one-sided
    test at alpha / m detects with 80% power: solves z_crit * sqrt(p0 q0 (1/n1 + 1/n0)) + z_power *
    sqrt(p1 q1 / n1 + p0 q0 / n0) = d, p1 = p0 + d. None when it exceeds 1 - p0 (nothing detectable)."""
    if n1 <= 0 or n0 <= 0:
        return None
    zc, zp = level(alpha, m, "greater"), z(POWER)
    p0 = min(max(p0, 1e-3), 1 - 1e-3)
    lo, hi = 0.0, 1.0 - p0

    def need(d):
        return zc * math.sqrt(p0 * (1 - p0) * (1 / n1 + 1 / n0)) + zp * math.sqrt(  # noqa: E731
            (p0 + d) * (1 - p0 - d) / n1 + p0 * (1 - p0) / n0
        )

    if need(hi) > hi:
        return None
    for _ in range(60):
        mid = (lo + hi) / 2
        if need(mid) <= mid:
            hi = mid
        else:
            lo = mid
    return hi


def mde_rate_drop(n1: int, n0: int, p: float, alpha: float, m: int) -> float | None:
    """The smallest drop d of one group's rate below the rest's p (n1 against n0) that a two-sided
    test at alpha / m detects with 80% power. None when even p itself would not be."""
    if n1 <= 0 or n0 <= 0:
        return None
    zc, zp = level(alpha, m, "two-sided"), z(POWER)
    p = min(max(p, 1e-3), 1 - 1e-3)
    need = lambda d: (zc + zp) * math.sqrt((p - d) * (1 - p + d) / n1 + p * (1 - p) / n0)  # noqa: E731
    lo, hi = 0.0, p
    if need(hi) > hi:
        return None
    for _ in range(60):
        mid = (lo + hi) / 2
        if need(mid) <= mid:
            hi = mid
        else:
            lo = mid
    return hi


def odds_ratio_of_drop(p: float, d: float | None) -> float | None:
    """The odds ratio of a rate p - d against p."""
    if d is None or p <= 0 or p >= 1 or p - d <= 0:
        return None
    q = p - d
    return (q / (1 - q)) / (p / (1 - p))


def mde_coefficients(X: np.ndarray, strata, sd: float, alpha: float, m: int) -> list[float | None]:
    """Per column of a regression design (a pair's straddle columns; null pairs as rows of zeros),
    the smallest coefficient a one-sided test at alpha / m detects with 80% power, errors of
    standard deviation ``sd`` (with a fixed effect per stratum): (z_crit + z_power) sd
    sqrt([(X'X)^-1]_jj). None for a column the design cannot estimate (its variance is infinite)."""
    X = np.asarray(X, dtype=float)
    if not X.size:
        return []
    _, codes = np.unique(np.asarray([str(s) for s in strata]), return_inverse=True)
    codes = codes.ravel()
    cnt = np.bincount(codes)
    means = (
        np.stack([np.bincount(codes, X[:, j], minlength=len(cnt)) for j in range(X.shape[1])], axis=1) / cnt[:, None]
    )
    Xw = X - means[codes]
    _, s, vt = np.linalg.svd(Xw, full_matrices=True)
    tol = 1e-6 * max(1.0, s.max(initial=0.0))
    null = vt[int(np.sum(s > tol)) :].T
    inv = np.linalg.pinv(Xw.T @ Xw, rcond=1e-10)
    k = level(alpha, m, "greater") + z(POWER)
    out: list[float | None] = []
    for j in range(X.shape[1]):
        if null.size and np.abs(null[j]).max() > 1e-6:
            out.append(None)
        else:
            out.append(float(k * sd * math.sqrt(max(inv[j, j], 0.0))))
    return out
