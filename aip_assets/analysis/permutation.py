"""Stratified permutation tests, and the intervals that are their exact duals.

Units (answers, pairs) sit in strata (a question, a dataset row) and carry a group label (an
attribute value, or persona pair vs null pair). Under the hypothesis that the label does not
matter, the units of one stratum are exchangeable, so shuffling the labels within each stratum
draws from the statistic's exact null distribution whatever the number of strata: the test
holds its level with a handful of questions, where sandwich standard errors do not
(``docs/concepts/claims.md`` has the simulation).

The effect of group ``v`` is the within-stratum difference of its mean from the rest's (least
squares of y on the group's indicator with a fixed effect per stratum):
``d_v = S_v / c_v``, ``S_v = sum over v's units of (y - its stratum's mean)``, ``c_v`` the
indicator's within-stratum sum of squares, which no within-stratum shuffle changes. The
interval of ``d_v`` inverts the same test under a shift (``y - delta * x_v``): it is the set of
effects the test would not reject at the claim's level, so it excludes 0 exactly when the test
rejects at that level (the search starts from 0, so the two never disagree).

The excess of one kind of unit over another (an axis's persona pairs over null pairs) is the
same test with two groups and the pooled difference of means as its statistic (the difference
of the printed rates).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

Sides = Literal["greater", "less", "two-sided"]
N_PERM = 9999  # shuffles per test: p-values down to 1e-4, below a Holm step of 0.05 over 70 claims
FIRST = 999  # shuffles drawn first; the rest only for a test whose p-value is then below EXTEND_BELOW
EXTEND_BELOW = 0.05  # (at alpha <= 0.05 no claim rests on a larger raw p-value: an adjusted one is never smaller)
CELL_BUDGET = 20_000_000  # shuffled labels held at once (chunk x units); chunks never change a result
EPS = 1e-9  # ties count as at least as extreme
SWAP_CELLS = 1 << 16  # draws x table cells swapped at once (_shuffles): blocks never change a result


def seed_of(*parts: object) -> int:
    """A 63-bit seed from the parts (a claim's id and the run's seed): each test draws its own shuffles."""
    return int.from_bytes(hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()[:8], "big") >> 1


def str_array(values) -> np.ndarray:
    """Each value's ``str``, as one array (what the codes sort): a pandas column of strings without a
    missing value converted at once (the very strings), anything else one value at a time."""
    dtype = getattr(values, "dtype", None)
    if len(values) and str(dtype) in ("str", "string") and not values.isna().any():
        return values.to_numpy(dtype=str)
    return np.asarray([str(s) for s in values])


def _codes(strata) -> np.ndarray:
    _, inv = np.unique(str_array(strata), return_inverse=True)
    return inv.ravel()


def _shuffles(codes: np.ndarray, rng: np.random.Generator, k: int) -> np.ndarray:
    """``k`` within-stratum permutations of positions (k x n), ``_shuffle_blocks`` put together."""
    out = np.empty((k, len(codes)), dtype=np.int64)
    for b0, b1, drawn in _shuffle_blocks(codes, rng, k):
        out[b0:b1] = drawn
    return out


def _shuffle_blocks(codes: np.ndarray, rng: np.random.Generator, k: int) -> Iterator[tuple[int, int, np.ndarray]]:
    """``k`` within-stratum permutations of positions (k x n): row b, position i holds the unit
    whose value lands on i. Each stratum's positions sit in a row of a padded table, shuffled by
    Fisher and Yates's swaps run on every draw and stratum at once (one pass per column of the
    table, a stratum's swaps only within its own positions).

    The swap partners are drawn first, column by column for all ``k`` draws (the generator's
    numbers in the order they have always been drawn), then the swaps are done for a block of
    draws at a time, each block's table small enough to stay in the processor's cache: the same
    permutations as swapping all draws at once, about four times faster for 9,999 draws. The
    block's tables are one flat array and every swap's cells flat indices into it (a gather and
    a scatter of one index array each, not a row-and-column index pair): half the time again.
    Yields each block's draws ``b0:b1`` (rows b0 to b1 of the k x n permutations) while it is in
    cache: the tests take what they need of it there (the shuffled values, not the positions)."""
    n = len(codes)
    if n == 0:
        if k:
            yield 0, k, np.empty((k, 0), dtype=np.int64)
        return
    cnt = np.bincount(codes)
    width = int(cnt.max())
    order = np.argsort(codes, kind="stable")  # positions grouped by stratum
    start = np.concatenate([[0], np.cumsum(cnt)[:-1]])
    slot = np.arange(n) - start[codes[order]]  # each position's place within its stratum
    table = np.full((len(cnt), width), -1, dtype=np.int64)
    table[codes[order], slot] = order
    cells = table.size
    # per column j (last first): the strata with a position j swap it with one of their first j + 1
    steps = []
    for j in range(width - 1, 0, -1):
        live = np.nonzero(cnt > j)[0]
        if not len(live):
            continue
        other = rng.random((k, len(live)))
        other *= j + 1
        there = other.astype(np.int64)  # the partner's column, then its cell of the flattened table
        there += live * width
        steps.append((live * width + j, there))
    flat = table.reshape(-1)
    valid = np.nonzero(flat >= 0)[0]
    cell_of = np.empty(n, dtype=np.int64)
    cell_of[flat[valid]] = valid  # the cell each position's unit starts in
    units = flat.astype(np.int32 if n < 2**31 else np.int64)
    block = max(1, SWAP_CELLS // cells)
    for b0 in range(0, k, block):
        b1 = min(k, b0 + block)
        drawn = np.tile(units, b1 - b0)  # the block's tables, one after another
        base = np.arange(0, (b1 - b0) * cells, cells, dtype=np.int64)[:, None]
        for here_cells, there in steps:
            here = base + here_cells
            th = there[b0:b1] + base
            kept = drawn[here]
            drawn[here] = drawn[th]
            drawn[th] = kept
        yield b0, b1, drawn.reshape(b1 - b0, cells)[:, cell_of]  # position i receives the unit drawn into its cell


class Dual:
    """A test of an effect under a shift, and the interval that inverts it. A subclass gives the
    estimate ``d``, a natural step ``scale`` and ``p(delta, sides)``: the p-value of the
    hypothesis that the effect is ``delta``."""

    d: float
    scale: float

    def p(self, delta: float, sides: Sides) -> float:
        raise NotImplementedError

    def bound(self, level: float, lower: bool) -> float:
        """The interval's end at one-sided level ``level``: the lower end is the smallest effect the
        'greater' test does not reject at ``level`` (the upper end, the 'less' test). The search
        walks from the estimate through 0 outward, so 0 lies beyond the end exactly when the
        test of 0 rejects. Infinite when no shift is ever rejected on that side (too few shuffles
        move past the observed statistic to reach the level)."""
        sides: Sides = "greater" if lower else "less"
        step = (-1 if lower else 1) * max(self.scale, 1e-6)
        inside = self.d
        if self.p(inside, sides) <= level:
            return inside
        # the first point outside, walking outward from the estimate (0 first when it lies that way)
        outside = None
        if (lower and 0.0 < inside) or (not lower and 0.0 > inside):
            if self.p(0.0, sides) <= level:
                outside = 0.0
            else:
                inside = 0.0
        k = 1.0
        while outside is None:
            cand = inside + k * step
            if self.p(cand, sides) <= level:
                outside = cand
            else:
                inside, k = cand, k * 2
            if k > 2**40:  # too few shuffles ever move past the observed one: no end on this side
                return -math.inf if lower else math.inf
        for _ in range(60):
            mid = (inside + outside) / 2
            if self.p(mid, sides) <= level:
                outside = mid
            else:
                inside = mid
            if abs(outside - inside) <= 1e-9 * max(1.0, abs(inside)):
                break
        return inside

    def interval(self, level: float, sides: Sides) -> tuple[float, float]:
        """The dual interval: for a two-sided test at ``level`` its ends are the one-sided bounds at
        ``level / 2`` (confidence ``1 - level``); for a one-sided claim at ``level`` (its matching
        end), the other end at the same level (a ``1 - 2 level`` interval, as two one-sided tests
        give)."""
        one = level / 2 if sides == "two-sided" else level
        return self.bound(one, lower=True), self.bound(one, lower=False)


@dataclass
class Shift(Dual):
    """One group's observed effect and its shuffled counterparts: under the shift ``delta`` the
    observed statistic is ``d - delta`` and a shuffle's is ``a - delta * b``."""

    d: float
    a: np.ndarray
    b: np.ndarray
    scale: float  # a natural step for the interval search (the effect's permutation spread)

    def p(self, delta: float, sides: Sides) -> float:
        obs = self.d - delta
        sh = self.a - delta * self.b
        n = len(self.a)
        ge = (1 + int(np.count_nonzero(sh >= obs - EPS))) / (n + 1)
        if sides == "greater":
            return ge
        le = (1 + int(np.count_nonzero(sh <= obs + EPS))) / (n + 1)
        if sides == "less":
            return le
        return min(1.0, 2 * min(ge, le))


@dataclass
class GroupTests:
    """Per group: the effect (within-stratum difference from the rest), its shuffles; and the
    omnibus statistic's p-value (does the group matter at all?)."""

    groups: list[str]
    n: dict[str, int]
    mean: dict[str, float]
    rest_mean: dict[str, float]
    shifts: dict[str, Shift | None]
    omnibus_p: float | None
    omnibus_stat: float | None
    n_perm: int
    why: dict[str, str] = field(default_factory=dict)  # groups that cannot be compared, and why

    def p(self, group: str, sides: Sides) -> float | None:
        s = self.shifts.get(group)
        return None if s is None else s.p(0.0, sides)


def group_tests(y, groups, strata, seed: int, n_perm: int = N_PERM) -> GroupTests:
    """Within-stratum shuffle tests of every group against the rest of the units, and the
    omnibus test of all groups at once (a chi-square of each group's sum of residuals over its
    exact permutation variance). A group without a stratum shared with another group cannot be
    compared (``why``)."""
    y = np.asarray(y, dtype=float)
    labels = str_array(groups)
    codes = _codes(strata)
    names = sorted(set(labels.tolist()))
    n_units = len(y)
    cnt = np.bincount(codes)
    r = y - (np.bincount(codes, y) / cnt)[codes]
    X = np.stack([labels == g for g in names], axis=1).astype(float) if names else np.zeros((n_units, 0))
    codes_v = np.searchsorted(np.asarray(names), labels) if names else np.zeros(n_units, dtype=np.int64)
    # fixed under any within-stratum shuffle: each group's count per stratum
    nqv = np.stack([np.bincount(codes, X[:, j], minlength=len(cnt)) for j in range(len(names))], axis=1)
    c = X.sum(axis=0) - (nqv**2 / cnt[:, None]).sum(axis=0)
    S = r @ X
    # exact permutation variance of S_v: a without-replacement draw of n_qv of stratum q's residuals
    ss = np.bincount(codes, r * r, minlength=len(cnt))
    with np.errstate(divide="ignore", invalid="ignore"):
        per = np.where(cnt[:, None] > 1, nqv * (cnt[:, None] - nqv) / (cnt[:, None] * (cnt[:, None] - 1)), 0.0)
    var = (per * ss[:, None]).sum(axis=0)
    comparable = c > 1e-12  # asked within some question beside another group
    ok = comparable & (var > 1e-15)  # and something varies there (else its difference is exactly 0)
    rng = np.random.default_rng(seed)
    chunk = max(1, min(n_perm, CELL_BUDGET // max(1, n_units)))
    a_parts: list[np.ndarray] = []
    b_parts: list[np.ndarray] = []
    q_parts: list[np.ndarray] = []

    def draw(count: int) -> None:
        for start in range(0, count, chunk):
            k = min(chunk, count - start)
            rp = np.empty((k, n_units))
            kept = np.empty((k, len(names)))
            for b0, b1, idx in _shuffle_blocks(codes, rng, k):
                rp[b0:b1] = r[idx]
                # positions that kept their group: whole counts, the same sums in any order or block
                kept[b0:b1] = (codes_v[idx] == codes_v[None, :]).astype(float) @ X
            Sp = rp @ X  # each group's residual sum after the shuffle (one product of the chunk, as ever)
            a_parts.append(Sp)
            b_parts.append(kept)
            if ok.any():
                q_parts.append(((Sp[:, ok] ** 2) / var[ok]).sum(axis=1))

    def smallest_p() -> float:
        Sp = np.concatenate(a_parts)
        ps = [
            (1 + int(np.count_nonzero(np.abs(Sp[:, j] - 0) >= abs(S[j]) - EPS))) / (len(Sp) + 1)
            for j in range(len(names))
            if ok[j]
        ]
        if q_parts:
            omni = float(((S[ok] ** 2) / var[ok]).sum())
            qp = np.concatenate(q_parts)
            ps.append((1 + int(np.count_nonzero(qp >= omni - EPS * max(1.0, omni)))) / (len(qp) + 1))
        return min(ps, default=1.0)

    first = min(n_perm, FIRST)
    draw(first)
    # sequential: precision where a claim may rest (a one-sided claim's p is about half the two-sided one's)
    if n_perm > first and ok.any() and smallest_p() <= 2 * EXTEND_BELOW:
        draw(n_perm - first)
    n_perm = sum(len(x) for x in a_parts)
    Sp_all = np.concatenate(a_parts) if a_parts else np.zeros((0, len(names)))
    ov_all = np.concatenate(b_parts) if b_parts else np.zeros((0, len(names)))
    shifts: dict[str, Shift | None] = {}
    why: dict[str, str] = {}
    mean, rest_mean, n = {}, {}, {}
    sq = (nqv**2 / cnt[:, None]).sum(axis=0)
    for j, g in enumerate(names):
        mask = X[:, j] > 0
        n[g] = int(mask.sum())
        mean[g] = float(y[mask].mean()) if mask.any() else math.nan
        rest_mean[g] = float(y[~mask].mean()) if (~mask).any() else math.nan
        if not comparable[j]:
            shifts[g] = None
            why[g] = "no question was asked of it and of another value: nothing to compare within a question"
            continue
        a = Sp_all[:, j] / c[j]
        b = (ov_all[:, j] - sq[j]) / c[j]
        shifts[g] = Shift(float(S[j] / c[j]), a, b, float(np.std(a)) or 1.0 / max(1, n[g]))
    omni_p = omni = None
    if comparable.any() and not ok.any():
        omni_p, omni = 1.0, 0.0  # every answer equals its question's others: no value makes any difference
    elif ok.any() and q_parts:
        omni = float(((S[ok] ** 2) / var[ok]).sum())
        qp = np.concatenate(q_parts)
        omni_p = (1 + int(np.count_nonzero(qp >= omni - EPS * max(1.0, omni)))) / (len(qp) + 1)
    return GroupTests(names, n, mean, rest_mean, shifts, omni_p, omni, n_perm, why)


def excess_test(y, is_first, strata, seed: int, n_perm: int = N_PERM) -> Shift | None:
    """The excess of the first kind of unit's mean over the second's (pooled means: the difference
    of the rates printed), its null distribution from shuffling the kinds within strata. None
    without both kinds. Strata with one kind only keep their units' kind in every shuffle."""
    y = np.asarray(y, dtype=float)
    x = np.asarray(is_first, dtype=float)
    n1, n0 = x.sum(), (1 - x).sum()
    if n1 == 0 or n0 == 0:
        return None
    codes = _codes(strata)
    d = float(y[x == 1].mean() - y[x == 0].mean())
    binary = bool(np.isin(x, (0.0, 1.0)).all())
    ones = np.nonzero(x == 1)[0]
    n_ones = float(len(ones))
    rng = np.random.default_rng(seed)
    chunk = max(1, min(n_perm, CELL_BUDGET // max(1, len(y))))
    a_parts: list[np.ndarray] = []
    b_parts: list[np.ndarray] = []

    def draw(count: int) -> None:
        for start in range(0, count, chunk):
            k = min(chunk, count - start)
            xp = np.empty((k, len(x)))
            first = np.empty(k)  # per draw, the first kind's units that stayed where the first kind is
            for b0, b1, idx in _shuffle_blocks(codes, rng, k):
                xp[b0:b1] = x[idx]  # the kinds, shuffled within strata
                if binary:
                    first[b0:b1] = xp[b0:b1, ones].sum(axis=1)
            rest = 1 - xp
            # T(delta) = mean over shuffled-first of (y - delta x) - mean over shuffled-second of (y - delta x)
            a_parts.append((xp @ y) / n1 - (rest @ y) / n0)
            if binary:  # x's products with the shuffled kinds are whole counts: these very values
                b_parts.append(first / n1 - (n_ones - first) / n0)
            else:
                b_parts.append((xp @ x) / n1 - (rest @ x) / n0)

    first = min(n_perm, FIRST)
    draw(first)
    a = np.concatenate(a_parts)
    if n_perm > first and (1 + int(np.count_nonzero(a >= d - EPS))) / (len(a) + 1) <= EXTEND_BELOW:
        draw(n_perm - first)  # sequential: precision where a claim may rest
    a, b = np.concatenate(a_parts), np.concatenate(b_parts)
    return Shift(d, a, b, float(np.std(a)) or 1.0 / max(1.0, min(n1, n0)))
