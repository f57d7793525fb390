"""Two attributes at once: which combination fares worse than its two attributes alone predict.

Personas that combine a value of axis A with a value of axis B (``woman×Black``) answer the same
questions; ``y`` is 1 when an answer's decision is favourable. The additive model, the
discrim-eval model without its interaction, is ``y = question + A + B``; a combination's
*interaction* is how far its answers fall from what that model predicts for it.

Which combination? One combination treated worse spreads, in any linear contrast of a two-way
table, onto every other cell: a SUT biased against Black women only makes a 2 × 4 table's white,
Hispanic and Asian men look worse than "predicted" by a third of the effect. So the combinations
are found one at a time (forward selection with a stopping test):

1. the omnibus test: does anything depart from additivity? The statistic is the largest |t| of a
   combination's indicator added alone to the additive model (what the selection below looks
   at), its null from the wild cluster bootstrap by question on the additive model's residuals,
   one set of weights for every combination. This is the claim ``interaction:A×B``;
2. while departure is left (the same test on the combinations not yet named, beyond the additive
   model and the combinations named, at alpha), the combination whose own indicator fits best is
   named (among equal fits, the one that leaves the two attributes least to explain);
3. each named combination's claim ``interaction:A×B=a×b`` is its coefficient in the final model
   (additive plus every named combination), tested by the wild restricted bootstrap, its interval
   inverting the same test (two-sided: a combination favoured beyond prediction is said too).

The single-attribute contrasts are measured with the named combinations held apart:
``main:A×B:A=a``, value ``a`` against the rest of axis A within each question and value of B, the
named combinations' answers left out, by the same shuffle test as a single axis's values
(``permutation.group_tests``: questions as given, as decision flip's other value claims). A SUT
biased against one combination only then blames neither of its values; and a value is claimed
only when its contrast holds with any one of its combinations left out (the largest of those
p-values), so a combination the forward selection did not name (too few answers to tell it from
chance) still does not make its attributes a finding. The interaction's tests
treat questions as drawn at random (the wild cluster bootstrap): more cautious.
Every claim goes to the run's family (Holm by default) with the metric's other claims; the
simulation in ``benchmarks/bench_intersections.py`` measures the false-claim rate and the power.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from .claims import Claim
from .fairness import canonical
from .permutation import N_PERM, Dual, Sides, group_tests, seed_of
from .regression import N_BOOT, StraddleModel, _demean

CROSS = "×"  # how an intersection joins two values (catalog.groups says it the same way)
MAX_NAMED = 3  # combinations named at most per intersection (forward selection stops earlier when nothing is left)


class LeaveOneOut(Dual):
    """A value's contrast that must hold with any one of its combinations left out: the estimate is
    the contrast over every combination, the p-value of a shift the largest of the leave-one-out
    tests' (an intersection-union test: each part must reject, so the whole holds its level), the
    interval the set of shifts one of them does not reject."""

    def __init__(self, full: Dual, parts: list[Dual]):
        self.d = full.d
        self.scale = max([full.scale, *(t.scale for t in parts)])
        self.parts = parts

    def p(self, delta: float, sides: Sides) -> float:
        return max(t.p(delta, sides) for t in self.parts)


def _fit(y: np.ndarray, X: np.ndarray, n_additive: int) -> tuple[float, float, bool]:
    """Least squares of y on X (both demeaned within questions): the residual sum of squares, the
    variance of the additive columns' part of the fit (how much work the two attributes alone do),
    and whether the last column adds anything the others do not span."""
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    resid = y - X @ coef
    adds = np.linalg.matrix_rank(X) > np.linalg.matrix_rank(X[:, :-1])
    return float(resid @ resid), float(np.var(X[:, :n_additive] @ coef[:n_additive])), bool(adds)


def _max_t(y, q, base: dict[str, np.ndarray], cands: dict[str, np.ndarray], seed: int, n_boot: int) -> float | None:
    """The wild restricted bootstrap p-value of the largest |t| among the candidate combinations,
    each added alone to the ``base`` model (additive plus the combinations already named): the
    null is that none departs from ``base``, imposed by drawing every candidate's t from the same
    weights on the base model's residuals, so the draws keep the candidates' dependence. The
    statistic is the one the selection maximises: the test looks where the selection looks."""
    obs: list[float] = []
    draws: list[np.ndarray] = []
    for c, col in cands.items():
        m = StraddleModel(y, {**base, c: col}, q, seed, n_boot)
        if c not in m.names or not m.estimable.get(c):
            continue
        shift = m.shift(c)
        if shift is None:
            continue
        t_obs, ts = shift._t(0.0)
        obs.append(abs(t_obs))
        draws.append(np.abs(ts))
    if not obs:
        return None
    top = max(obs)
    if not np.isfinite(top):
        return 1.0 / (n_boot + 1)
    mx = np.max(np.stack(draws), axis=0)
    return float((1 + int(np.sum(mx >= top - 1e-9 * max(1.0, top)))) / (len(mx) + 1))


def interaction_claims(
    answers: pd.DataFrame, axis: str, seed: int, alpha: float = 0.05, n_boot: int = N_BOOT, n_perm: int = N_PERM
) -> tuple[list[Claim], dict[str, dict[str, Any]]]:
    """The claims about one intersection ``axis`` (``A×B``, values ``a×b``) from its answers
    (columns question, value, favourable: 0/1, NaN dropped), and per combination what the report
    quotes: its rate, its answers, the additive model's prediction and its interaction."""
    a = answers.dropna(subset=["favourable"])
    if not len(a):
        return [], {}
    a = canonical(a, ["question", "value", "favourable"])
    parts = [str(v).split(CROSS) for v in a["value"]]
    names = axis.split("@", 1)[0].split(CROSS)
    if any(len(p) != 2 for p in parts) or len(names) != 2:
        raise ValueError(f"{axis}: every value must combine two values with {CROSS!r}")
    A = np.array([p[0] for p in parts])
    B = np.array([p[1] for p in parts])
    cells = sorted(set(zip(A.tolist(), B.tolist(), strict=True)))
    y = a["favourable"].to_numpy(float)
    q = a["question"].astype(str).to_numpy()
    _, codes = np.unique(q, return_inverse=True)
    codes = codes.ravel()
    cnt = np.bincount(codes).astype(float)
    a_vals, b_vals = sorted(set(A)), sorted(set(B))

    def dummies(vals, arr, prefix):
        return {f"{prefix}={v}": (arr == v).astype(float) for v in vals[1:]}  # the first: reference

    additive = {**dummies(a_vals, A, names[0]), **dummies(b_vals, B, names[1])}
    cell_cols = {f"{x}{CROSS}{z}": ((A == x) & (B == z)).astype(float) for x, z in cells}
    key = seed_of("interaction", axis, seed)
    out: list[Claim] = []
    parent = f"interaction:{axis}"
    facts_cells: dict[str, dict[str, Any]] = {}
    for c, col in cell_cols.items():
        m = col > 0
        facts_cells[c] = {"rate": float(y[m].mean()), "answers": int(m.sum())}
    if len(a_vals) < 2 or len(b_vals) < 2:
        out.append(
            Claim(
                parent,
                "interaction",
                axis,
                None,
                "two-sided",
                "departure from additivity",
                why=f"the answers hold one value of {names[0] if len(a_vals) < 2 else names[1]} only",
            )
        )
        return out, facts_cells
    p0 = _max_t(y, q, additive, cell_cols, key % 100_000, n_boot)
    out.append(
        Claim(
            parent,
            "interaction",
            axis,
            None,
            "two-sided",
            f"whether any combination of {names[0]} and {names[1]} departs from what the two attributes alone predict "
            "(least squares with a fixed effect per question: the largest |t| of a combination's indicator added to "
            f"the additive model), its null from {n_boot:,} wild cluster bootstrap draws by question on the additive "
            "model's residuals, the same draws for every combination",
            p_value=p0,
            why=None if p0 is not None else "the answers never separate the combinations from the two attributes",
            facts={"n": int(len(y)), "combinations": len(cells)},
        )
    )
    # forward selection: name the best-fitting combination while departure from additivity is left
    named: list[str] = []
    p = p0
    yw = _demean(y, codes, cnt)
    base = [additive[k] for k in additive]
    while p is not None and p <= alpha and len(named) < MAX_NAMED:
        fits = []
        for c in cell_cols:
            if c in named:
                continue
            X = _demean(np.stack([*base, *(cell_cols[n] for n in named), cell_cols[c]], axis=1), codes, cnt)
            rss, work, adds = _fit(yw, X, len(base))
            if adds:
                fits.append((rss, work, c))
        # the best fit; among equal fits (two values of an axis: freeing either combination of a
        # column fits the same), the one that leaves the two attributes the least to explain
        best = None
        if fits:
            low = min(f[0] for f in fits)
            best = min((f for f in fits if f[0] <= low * (1 + 1e-9) + 1e-12), key=lambda f: (f[1], f[2]))[2]
        if best is None:
            break
        named.append(best)
        rest = [c for c in cell_cols if c not in named]
        if not rest:
            break
        p = _max_t(
            y,
            q,
            {**additive, **{n: cell_cols[n] for n in named}},
            {c: cell_cols[c] for c in rest},
            key % 100_000 + len(named),
            n_boot,
        )
    final = StraddleModel(y, {**additive, **{n: cell_cols[n] for n in named}}, q, key % 100_000 + 7, n_boot)
    for c in cell_cols:
        f = facts_cells[c]
        if c in named:
            j = final.names.index(c) if c in final.names else None
            d = float(final.coef[j]) if j is not None else None
            f.update(named=True, interaction=d, predicted=None if d is None else min(1.0, max(0.0, f["rate"] - d)))
            shift = final.shift(c)
            out.append(
                Claim(
                    f"{parent}={c}",
                    "interaction",
                    axis,
                    c,
                    "two-sided",
                    f"how much the combination's favourable rate departs from what {names[0]} and {names[1]} alone "
                    "predict (its indicator in the additive model with the combinations named before it; least "
                    f"squares with a fixed effect per question), its null from {n_boot:,} wild cluster bootstrap "
                    "draws by question; the interval inverts the same test. Named by forward selection: departure "
                    "from additivity was left after the combinations named before it",
                    test=shift,
                    parent=parent,
                    why=None if shift is not None else "its effect cannot be separated from the two attributes'",
                    facts={**f, "order": named.index(c) + 1},
                )
            )
        else:  # descriptive: its answers' mean residual in the final model (unadjusted, no interval)
            r = float(final.resid[cell_cols[c] > 0].mean())
            f.update(named=False, interaction=r, predicted=min(1.0, max(0.0, f["rate"] - r)))
    # the single-attribute contrasts, the named combinations held apart: each value against the rest
    # of its attribute within (question, value of the other attribute), shuffled within those strata;
    # claimed only if it holds with any one of its combinations left out (``LeaveOneOut``)
    cell = np.array([f"{x}{CROSS}{z}" for x, z in zip(A, B, strict=True)])
    keep = ~np.isin(cell, named)
    for which, (arr, other_arr) in enumerate(((A, B), (B, A))):
        attr, other = names[which], names[1 - which]
        strata = np.array([f"{qq}|{o}" for qq, o in zip(q, other_arr, strict=True)])
        salt = seed_of("main", axis, attr, seed)
        gt = group_tests(y[keep], pd.Series(arr[keep]), pd.Series(strata[keep]), salt, n_perm)
        held = f"{other} held" + (f", {', '.join(named)} apart" if named else "")
        for v in gt.groups:
            col = arr[keep] == v
            loo: list[Dual] = []
            why = gt.why.get(v)
            for o in sorted(set(other_arr[keep & (arr == v)])):
                out_one = keep & ~((arr == v) & (other_arr == o))
                g1 = group_tests(y[out_one], pd.Series(arr[out_one]), pd.Series(strata[out_one]), salt, n_perm)
                t = g1.shifts.get(v) if v in g1.groups else None
                if t is None:
                    why = why or (
                        f"its contrast rests on one combination ({attr}={v} with {names[1 - which]}={o}): it cannot be "
                        "told from that combination's own treatment"
                    )
                    break
                loo.append(t)
            full = gt.shifts.get(v)
            test = LeaveOneOut(full, loo) if why is None and full is not None and loo else None
            out.append(
                Claim(
                    f"main:{axis}:{attr}={v}",
                    "main",
                    axis,
                    f"{attr}={v}",
                    "two-sided",
                    f"{attr}={v} against the rest of {attr} among the {axis} personas ({held}): least squares with a "
                    f"fixed effect per question and value of {other}, its null from {gt.n_perm:,} shuffles of {attr} "
                    f"within them; claimed only when it holds with any one value of {other} left out for {attr}={v} "
                    "(the largest of those p-values: one combination treated worse does not make its attribute a "
                    "finding); the interval inverts the same test",
                    test=test,
                    why=why,
                    facts={
                        "n": gt.n[v],
                        "rate": gt.mean[v],
                        "rest_rate": gt.rest_mean[v],
                        "events": int(y[keep][col].sum()),
                        "attribute": attr,
                        "held": held,
                        "estimate_all": full.d if full is not None else None,
                    },
                )
            )
    return out, facts_cells
