"""Effects adjusted for everything else a persona carries: a regression of a pair measure on the
attribute values the pair's two personas do not share, with the question as a fixed effect,
tested by the wild cluster bootstrap.

A pair of personas (or one persona asked twice: a null pair) on one question has a measure ``y``
(group interaction bias's pair bias). Each attribute value ``v`` gives a column ``d_v``: 1 when
exactly one persona of the pair holds ``v`` (the pair straddles ``v``), else 0; a null pair
straddles nothing. The model ``y = question + sum_v gamma_v d_v + e`` reads ``gamma_v`` as how
much more two answers differ when one persona holds ``v`` and the other does not, with every
other value held: a group's own effect, apart from the values its personas happen to carry
(a pool whose only Muslim personas are nurses would otherwise blame nurses). The null pairs
anchor the level at which nothing differs.

A value's effect is estimable when its column is not a combination of the others in the pairs
judged; one that is not (every construction worker in the pool is Sikh) cannot be told apart
from the values it is aliased with, and is reported so, never tested.

Tests: the wild cluster restricted bootstrap (Cameron, Gelbach and Miller 2008; Rademacher
weights per question, Webb's six-point weights below 12 questions; the null imposed), of the t
statistic with CR1 standard errors: it holds its level with few questions where the sandwich's
normal or t reference does not. A value's
interval inverts the same bootstrap test (the set of effects it would not reject), so it
excludes 0 exactly when the test rejects at the claim's level.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .permutation import EPS, Dual, Sides

N_BOOT = 3999  # wild bootstrap draws per test: p-values down to 2.5e-4
BOOT_CELLS = 30_000_000  # draws x units held at once
TOL = 1e-8


def _demean(M: np.ndarray, codes: np.ndarray, cnt: np.ndarray) -> np.ndarray:
    if M.ndim == 1:
        return M - (np.bincount(codes, M, minlength=len(cnt)) / cnt)[codes]
    if not M.shape[1]:
        return M
    means = (
        np.stack([np.bincount(codes, M[:, j], minlength=len(cnt)) for j in range(M.shape[1])], axis=1) / cnt[:, None]
    )
    return M - means[codes]


@dataclass
class WildShift(Dual):
    """A coefficient's observed t and its bootstrap counterparts under the shift ``delta``:
    observed ``(d - delta) / se``; draw b ``(al_b - delta be_b) / sqrt(A2_b - 2 delta A1_b + delta^2 A0_b)``."""

    d: float  # the estimate
    se: float
    al: np.ndarray
    be: np.ndarray
    A0: np.ndarray
    A1: np.ndarray
    A2: np.ndarray
    scale: float = 0.0  # the interval search's step: the standard error

    def __post_init__(self):
        self.scale = self.se if self.se > 0 else max(abs(self.d), 1e-3)

    def _t(self, delta: float) -> tuple[float, np.ndarray]:
        num = self.al - delta * self.be
        q = np.maximum(self.A2 - 2 * delta * self.A1 + delta * delta * self.A0, 0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            ts = np.where(q > 1e-30, num / np.sqrt(q), np.where(np.abs(num) < 1e-15, 0.0, np.sign(num) * np.inf))
        if self.se > 0:
            obs = (self.d - delta) / self.se
        else:
            obs = 0.0 if abs(self.d - delta) < 1e-12 else math.copysign(math.inf, self.d - delta)
        return obs, ts

    def p(self, delta: float, sides: Sides) -> float:
        obs, ts = self._t(delta)
        n = len(ts)
        ge = (1 + int(np.sum(ts >= obs - EPS))) / (n + 1)
        if sides == "greater":
            return ge
        le = (1 + int(np.sum(ts <= obs + EPS))) / (n + 1)
        if sides == "less":
            return le
        return min(1.0, 2 * min(ge, le))


@dataclass
class Regression:
    """The fitted model and its tests. ``estimable[v]`` false: ``aliases[v]`` are the columns it
    cannot be told apart from in the pairs judged."""

    names: list[str]
    coef: dict[str, float]
    se: dict[str, float]
    estimable: dict[str, bool]
    aliases: dict[str, list[str]]
    n_units: int
    n_clusters: int
    shifts: dict[str, WildShift] = field(default_factory=dict)
    omnibus: dict[str, float | None] = field(default_factory=dict)  # a set of columns' joint test
    adjusted_level: dict[str, tuple[float, float]] = field(default_factory=dict)  # (level, its se) per column


class StraddleModel:
    """Least squares of ``y`` on columns with a fixed effect per stratum (question), CR1
    covariance clustered by stratum, and wild cluster restricted bootstrap tests."""

    def __init__(self, y, columns: dict[str, np.ndarray], strata, seed: int, n_boot: int = N_BOOT):
        self.y = np.asarray(y, dtype=float)
        _, codes = np.unique(np.asarray([str(s) for s in strata]), return_inverse=True)
        self.codes = codes.ravel()
        self.cnt = np.bincount(self.codes)
        self.G = len(self.cnt)
        names = [k for k, v in columns.items() if np.asarray(v).any()]
        self.names = names
        self.Xraw = np.stack([np.asarray(columns[k], dtype=float) for k in names], axis=1) if names else None
        n = len(self.y)
        self.X = _demean(self.Xraw, self.codes, self.cnt) if self.Xraw is not None else np.zeros((n, 0))
        self.yw = _demean(self.y, self.codes, self.cnt)
        self.pinv = np.linalg.pinv(self.X, rcond=TOL) if names else np.zeros((0, n))
        self.coef = self.pinv @ self.yw
        self.resid = self.yw - self.X @ self.coef
        k = np.linalg.matrix_rank(self.X, tol=TOL * max(1.0, float(np.abs(self.X).max(initial=0.0)))) if names else 0
        self.rank = int(k)
        # CR1: G/(G-1) (n-1)/(n-k), with the strata's fixed effects among k's parameters
        dof = max(1, n - self.rank - self.G)
        self.scale = (self.G / max(1, self.G - 1)) * ((n - 1) / dof)
        self.cl = np.zeros((n, self.G))
        self.cl[np.arange(n), self.codes] = 1.0
        self.seed, self.n_boot = seed, n_boot
        # estimability: a column is estimable when no null-space direction of X loads on it
        self.estimable: dict[str, bool] = {}
        self.aliases: dict[str, list[str]] = {}
        if names:
            # only V is needed: the full U (units x units) costs seconds from a few thousand units
            _, s, vt = np.linalg.svd(self.X, full_matrices=self.X.shape[0] < self.X.shape[1])
            tol = TOL * max(1.0, s.max(initial=0.0)) * 100
            null = vt[int(np.sum(s > tol)) :].T  # k x (k - rank)
            load = np.abs(null) > 1e-6
            for j, v in enumerate(names):
                self.estimable[v] = not load[j].any()
                if load[j].any():
                    partners = load[:, load[j]].any(axis=1)
                    self.aliases[v] = [names[i] for i in np.nonzero(partners)[0] if i != j]

    # ---------------------------------------------------------------- standard errors
    def _cr1_se(self, a: np.ndarray, resid: np.ndarray) -> float:
        s = (a * resid) @ self.cl
        return float(math.sqrt(self.scale * float((s * s).sum())))

    def se(self, v: str) -> float:
        j = self.names.index(v)
        return self._cr1_se(self.pinv[j], self.resid)

    def _weights(self, salt: int) -> np.ndarray:
        rng = np.random.default_rng((self.seed, salt))
        if self.G >= 12:
            return rng.choice(np.array([-1.0, 1.0]), size=(self.n_boot, self.G))
        # Webb's six-point weights: with few clusters Rademacher has too few distinct draws
        six = np.array([-math.sqrt(1.5), -1.0, -math.sqrt(0.5), math.sqrt(0.5), 1.0, math.sqrt(1.5)])
        return rng.choice(six, size=(self.n_boot, self.G))

    def _resid_of(self, U: np.ndarray) -> np.ndarray:
        """M U for rows of U (B x n): what the full model leaves of each."""
        return U - (U @ self.pinv.T) @ self.X.T

    def shift(self, v: str) -> WildShift | None:
        """The wild restricted bootstrap of column ``v``'s t statistic, with what the interval
        search needs. None when ``v`` is not estimable."""
        if not self.estimable.get(v):
            return None
        j = self.names.index(v)
        a = self.pinv[j]
        est, se = float(self.coef[j]), self._cr1_se(a, self.resid)
        # rounding: a contrast the data hold exactly (every question's difference 0) is 0 with no spread,
        # not 3e-16 over 1e-17, a t of 30
        tol = 1e-10 * max(1.0, float(np.abs(self.y).max(initial=0.0)))
        est, se = (0.0 if abs(est) < tol else est), (0.0 if se < tol else se)
        Xr = np.delete(self.X, j, axis=1)
        if Xr.shape[1]:
            pr = np.linalg.pinv(Xr, rcond=TOL)
            e0 = self.yw - Xr @ (pr @ self.yw)
            m = self.X[:, j] - Xr @ (pr @ self.X[:, j])
        else:
            e0, m = self.yw.copy(), self.X[:, j].copy()
        W = self._weights(j)
        # everything a draw needs lives in cluster space: with u = w[cluster] * e, the coefficient is
        # w . (per-cluster sums of a * e), and the full model's residual scores per cluster are
        # w * (sums of a * e) - (w @ per-cluster sums of e * pinv) @ (per-cluster sums of a * X)
        c0, c1 = (a * e0) @ self.cl, (a * m) @ self.cl  # G
        P0, P1 = self.cl.T @ (self.pinv.T * e0[:, None]), self.cl.T @ (self.pinv.T * m[:, None])  # G x k
        XaCl = (self.X * a[:, None]).T @ self.cl  # k x G
        s0 = W * c0 - (W @ P0) @ XaCl
        s1 = W * c1 - (W @ P1) @ XaCl
        al, be = W @ c0, W @ c1
        A2 = self.scale * (s0 * s0).sum(axis=1)
        A1 = self.scale * (s0 * s1).sum(axis=1)
        A0 = self.scale * (s1 * s1).sum(axis=1)
        return WildShift(est, se, al, be, A0, A1, A2)

    def joint(self, cols: list[str], salt: int) -> float | None:
        """The wild restricted bootstrap p-value of the joint hypothesis that ``cols`` add nothing to the
        fit (every combination of them the pairs can measure is 0): the statistic is the squared
        length of the data's projection on what the columns add beyond the others (the fall in the
        residual sum of squares), its null from the bootstrap with the columns left out. Defined
        whether or not each column is estimable on its own (an axis of two values, whose columns are
        equal, still has one combination: does differing on the axis matter?). None when the columns
        add nothing the others do not already span."""
        idx = [self.names.index(c) for c in cols if c in self.names]
        if not idx:
            return None
        keep = [i for i in range(len(self.names)) if i not in idx]
        Xr = self.X[:, keep]
        Xa = self.X[:, idx]
        if keep:
            pr = np.linalg.pinv(Xr, rcond=TOL)
            Xa = Xa - Xr @ (pr @ Xa)
            er = self.yw - Xr @ (pr @ self.yw)
        else:
            er = self.yw.copy()
        u, sv, _ = np.linalg.svd(Xa, full_matrices=False)
        q = u[:, sv > TOL * 100 * max(1.0, float(sv.max(initial=0.0)))]
        if not q.shape[1]:
            return None
        obs = float(((self.yw @ q) ** 2).sum())
        W = self._weights(10_000 + salt)
        n = len(self.y)
        chunk = max(1, min(self.n_boot, BOOT_CELLS // max(1, n)))
        draws = np.concatenate(
            [
                (((W[start : start + chunk][:, self.codes] * er) @ q) ** 2).sum(axis=1)
                for start in range(0, self.n_boot, chunk)
            ]
        )
        return (1 + int(np.sum(draws >= obs - EPS * max(1.0, abs(obs))))) / (len(draws) + 1)

    def group_level(self, v: str, members: np.ndarray) -> tuple[float, float] | None:
        """The mean measure of the units ``members`` (the pairs that straddle ``v``) with every
        other column's estimated contribution taken out, and its CR1 standard error: what those
        pairs would measure if nothing but ``v`` mattered. None when ``v`` is not estimable."""
        if not self.estimable.get(v) or not members.any():
            return None
        j = self.names.index(v)
        w = members.astype(float) / members.sum()
        others = self.Xraw[members].mean(axis=0).copy() if self.Xraw is not None else np.zeros(0)
        others[j] = 0.0
        # level = mean(y over members) - sum_{u != v} coef_u * mean(d_u over members): linear in y
        c = w - others @ self.pinv
        level = float(c @ self.y)
        # its variance, the questions drawn at random: the level is a mean over the members' questions,
        # so each unit's residual keeps its question's own effect (y - the grand level - X coef), and
        # the questions' spread counts (residuals within questions alone: 95% intervals covered 55-62% in simulation)
        e = self.y - (self.Xraw @ self.coef if self.Xraw is not None else 0.0)
        e = e - e.mean()
        s = (c * e) @ self.cl
        return level, float(math.sqrt(self.scale * float((s * s).sum())))
