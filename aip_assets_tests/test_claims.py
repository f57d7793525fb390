"""The analysis layer (aip_assets/analysis): adjustment, decisions, the tests and their dual
intervals, on hand-derived uneven inputs; and a fast simulation of the analysis on counts (the
benchmark, benchmarks/bench_claims.py, runs the whole pipeline hundreds of times)."""

from __future__ import annotations

import contextlib
import itertools
import math
from statistics import NormalDist

import numpy as np
import pandas as pd
import pytest

from aip_assets.analysis import permutation
from aip_assets.analysis.claims import Claim, Policy, adjusted, confidence_words, decide
from aip_assets.analysis.fairness import (
    alias_words,
    answer_claims,
    excess_claims,
    group_claims,
    impact_ratios,
    mantel_haenszel,
    standardised_rates,
)
from aip_assets.analysis.permutation import Dual, excess_test, group_tests
from aip_assets.analysis.power import mde_coefficients, mde_rate_drop, mde_rate_excess, odds_ratio_of_drop
from aip_assets.analysis.regression import StraddleModel
from aip_assets.metrics.decision_flip.claims import make_claims

N = NormalDist()


# ------------------------------------------------------------------ adjustment and decisions
def test_holm_and_bh_by_hand_on_unsorted_pvalues():
    p = [0.01, 0.04, 0.03, 0.005]
    # Holm: sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 -> 0.02, 0.03, 0.06, 0.04 -> monotone 0.02, 0.03, 0.06, 0.06
    assert adjusted(p, "holm") == pytest.approx([0.03, 0.06, 0.06, 0.02])
    # BH: p m / rank -> 0.02, 0.02, 0.04, 0.04, the running minimum from the largest
    assert adjusted(p, "bh") == pytest.approx([0.02, 0.04, 0.04, 0.02])
    assert adjusted([0.9, 0.8], "holm") == pytest.approx([1.0, 1.0])  # capped at 1
    assert adjusted([], "holm") == []


class NormalShift(Dual):
    """A test whose p-value is the normal's: the interval is d +- z se, known in closed form."""

    def __init__(self, d: float, se: float):
        self.d, self.se, self.scale = d, se, se

    def p(self, delta, sides):
        z = (self.d - delta) / self.se
        ge, le = 1 - N.cdf(z), N.cdf(z)
        return ge if sides == "greater" else le if sides == "less" else min(1.0, 2 * min(ge, le))


def test_decide_matches_each_interval_to_its_adjusted_decision():
    claims = [
        Claim("a", "favoured", "ax", None, "two-sided", "m", test=NormalShift(0.30, 0.08)),  # p 1.8e-4
        Claim("b", "favoured", "ax", None, "two-sided", "m", test=NormalShift(0.10, 0.05)),  # p 0.0455
        Claim("c", "excess", "ax", None, "greater", "m", test=NormalShift(0.02, 0.05)),  # p 0.34
    ]
    decide(claims, Policy("holm", 0.05))
    a, b, c = claims
    assert a.claimed and not b.claimed and not c.claimed
    assert a.p_adjusted == pytest.approx(3 * a.p_value)
    assert b.p_adjusted == pytest.approx(max(2 * b.p_value, a.p_adjusted))
    for cl in claims:
        level = 0.05 * cl.p_value / cl.p_adjusted
        assert cl.level == pytest.approx(level)
        z = N.inv_cdf(1 - level / 2) if cl.sides == "two-sided" else N.inv_cdf(1 - level)
        assert cl.ci[0] == pytest.approx(cl.test.d - z * cl.test.se, abs=1e-6)
        assert cl.ci[1] == pytest.approx(cl.test.d + z * cl.test.se, abs=1e-6)
        # the interval excludes 0 exactly when the claim is made
        assert (cl.ci[0] > 0 or cl.ci[1] < 0) == cl.claimed
    # a one-sided claim's interval is 1 - 2 level; a two-sided one's 1 - level
    assert c.ci_confidence == pytest.approx(1 - 2 * c.level)
    assert a.ci_confidence == pytest.approx(1 - a.level)


def test_a_value_is_never_beyond_chance_when_its_axis_is_not():
    omni = Claim("favoured:ax", "favoured", "ax", None, "two-sided", "m", p_value=0.2)
    val = Claim(
        "favoured:ax=v", "favoured", "ax", "v", "two-sided", "m", test=NormalShift(0.5, 0.1), parent="favoured:ax"
    )
    other = Claim("excess:ax", "excess", "ax", None, "greater", "m", test=NormalShift(0.0, 0.1))
    decide([omni, val, other], Policy())
    assert val.p_value < 1e-5 and not val.claimed
    assert val.status == "gated" and val.p_adjusted == pytest.approx(omni.p_adjusted)
    assert val.ci[0] < 0 < val.ci[1] or val.ci[0] <= 0  # its interval, at the gated level, holds 0
    untested = Claim("favoured:ax=w", "favoured", "ax", "w", "two-sided", "m", why="no shared question")
    decide([untested], Policy())
    assert untested.status == "not tested" and not untested.claimed and untested.p_adjusted is None


def test_bh_makes_more_claims_than_holm_on_the_same_pvalues():
    ps = [0.001, 0.02, 0.021, 0.022, 0.5]

    def made(adjust):
        cl = [Claim(f"c{i}", "k", None, None, "two-sided", "m", p_value=p) for i, p in enumerate(ps)]
        return sum(c.claimed for c in decide(cl, Policy(adjust, 0.05)))

    assert made("holm") == 1 and made("bh") == 4  # Holm: 4 x 0.02 > 0.05; BH: 0.022 x 5 / 4 <= 0.05


def test_confidence_words():
    assert confidence_words(0.95) == "95%"
    assert confidence_words(0.9862) == "98.6%"
    assert confidence_words(0.99871) == "99.87%"
    assert confidence_words(None) == "n/a"


# ------------------------------------------------------------------ permutation tests
def test_group_tests_estimate_and_exact_pvalue_by_enumeration():
    # three questions, uneven: q1 asks a, b, c; q2 a, b; q3 a, c
    y = [1, 0, 0, 1, 0, 1, 1]
    v = ["a", "b", "c", "a", "b", "a", "c"]
    q = ["q1", "q1", "q1", "q2", "q2", "q3", "q3"]
    gt = group_tests(y, v, q, seed=3, n_perm=20000)
    # within-question difference of a from the rest: (2/3 + 1/2 + 0) / (6/9 + 1/2 + 1/2) = 0.7
    assert gt.shifts["a"].d == pytest.approx(0.7)
    import statsmodels.api as sm

    X = pd.get_dummies(pd.DataFrame({"a": [x == "a" for x in v], "q": q}), columns=["q"], dtype=float)
    assert sm.OLS(np.array(y, float), X.astype(float)).fit().params["a"] == pytest.approx(0.7)
    # exact: every within-question permutation of the values (3! * 2 * 2 = 24, equally likely)
    stats = []
    for p1 in itertools.permutations(v[0:3]):
        for p2 in itertools.permutations(v[3:5]):
            for p3 in itertools.permutations(v[5:7]):
                vv = list(p1) + list(p2) + list(p3)
                stats.append(group_tests(y, vv, q, seed=0, n_perm=1).shifts["a"].d)
    stats = np.array(stats)
    ge, le = np.mean(stats >= 0.7 - 1e-9), np.mean(stats <= 0.7 + 1e-9)
    exact = min(1.0, 2 * min(ge, le))
    assert gt.p("a", "two-sided") == pytest.approx(exact, abs=0.02)
    assert gt.p("a", "greater") == pytest.approx(ge, abs=0.01)


def test_group_tests_without_variation_or_a_shared_question():
    # every answer of a question is the same: nothing varies with the value, so p is 1
    gt = group_tests([1, 1, 0, 0], ["a", "b", "a", "b"], ["q1", "q1", "q2", "q2"], seed=1, n_perm=99)
    assert gt.p("a", "two-sided") == 1.0 and gt.omnibus_p == 1.0
    # c was asked only in a question of its own: it cannot be compared within a question
    gt = group_tests([1, 0, 1], ["a", "b", "c"], ["q1", "q1", "q2"], seed=1, n_perm=99)
    assert gt.shifts["c"] is None and "nothing to compare within a question" in gt.why["c"]


def test_excess_keeps_the_kinds_of_strata_with_one_kind_only():
    # r1: persona pairs 1, 1 and a null pair 0; r2: a persona pair only (0): its kind never moves
    s = excess_test([1, 1, 0, 0], [1, 1, 0, 1], ["r1", "r1", "r1", "r2"], seed=5, n_perm=30000)
    assert s.d == pytest.approx(2 / 3)  # persona mean 2/3 against null 0
    # the null label lands on one of r1's three units: on the 0 (as observed) in 1 of 3 shuffles
    assert s.p(0.0, "greater") == pytest.approx(1 / 3, abs=0.01)
    assert excess_test([1, 0], [1, 1], ["r1", "r1"], seed=1) is None  # no null pair


def test_shuffles_go_on_past_the_first_999_only_where_a_claim_may_rest():
    # 20 questions, each asking a, b, c once; a's answers are 1 everywhere, b's and c's 0: p ~ 1e-4
    q = [f"q{i}" for i in range(20) for _ in range(3)]
    v = ["a", "b", "c"] * 20
    strong = group_tests([1, 0, 0] * 20, v, q, seed=2)
    assert strong.n_perm == 9999 and strong.p("a", "greater") < 0.001
    # the same questions, one flip for a in 20 against one for b: nothing near 0.05, so 999 draws
    y = [0, 0, 0] * 20
    y[0], y[4] = 1, 1
    weak = group_tests(y, v, q, seed=2)
    assert weak.n_perm == 999 and weak.p("a", "two-sided") > 0.5 and weak.omnibus_p > 0.5
    assert len(weak.shifts["a"].a) == 999
    # the excess test: 30 rows, a persona pair flipping in 12, the null pair in none
    rows = [f"r{i}" for i in range(30) for _ in range(2)]
    first = [1, 0] * 30
    far = excess_test([x for i in range(30) for x in ((1 if i < 12 else 0), 0)], first, rows, seed=4)
    assert len(far.a) == 9999 and far.p(0.0, "greater") < 0.001
    near = excess_test([x for i in range(30) for x in ((1 if i < 1 else 0), 0)], first, rows, seed=4)
    assert len(near.a) == 999 and near.p(0.0, "greater") > 0.05


def _shuffles_at_once(codes, rng, k):
    """The within-stratum shuffles as they were first written: every draw's swaps at once (one
    k x strata x width table), each column's partners drawn as the swaps reach it."""
    n = len(codes)
    cnt = np.bincount(codes)
    width = int(cnt.max()) if len(cnt) else 0
    order = np.argsort(codes, kind="stable")
    start = np.concatenate([[0], np.cumsum(cnt)[:-1]])
    slot = np.arange(n) - start[codes[order]]
    table = np.full((len(cnt), width), -1, dtype=np.int64)
    table[codes[order], slot] = order
    valid = table >= 0
    drawn = np.broadcast_to(table, (k, *table.shape)).copy()
    rows = np.arange(k)[:, None]
    for j in range(width - 1, 0, -1):
        live = np.nonzero(cnt > j)[0]
        if not len(live):
            continue
        other = (rng.random((k, len(live))) * (j + 1)).astype(np.int64)
        here = drawn[:, live, j].copy()
        drawn[:, live, j] = drawn[rows, live[None, :], other]
        drawn[rows, live[None, :], other] = here
    out = np.empty((k, n), dtype=np.int64)
    out[:, table[valid]] = drawn[:, valid]
    return out


@pytest.mark.parametrize("cells", [1, 7, 1 << 16])
def test_shuffles_in_blocks_of_draws_are_the_shuffles_drawn_at_once(monkeypatch, cells):
    # the swaps done a block of draws at a time (in cache) give the very permutations of doing them
    # all at once: every p-value and interval repeats to the digit
    monkeypatch.setattr(permutation, "SWAP_CELLS", cells)
    rng = np.random.default_rng(11)
    for trial in range(25):
        strata = int(rng.integers(1, 30))
        codes = np.unique(rng.integers(0, strata, int(rng.integers(0, 300))), return_inverse=True)[1].ravel()
        k = int(rng.integers(1, 1500))
        got = permutation._shuffles(codes, np.random.default_rng(trial), k)
        want = _shuffles_at_once(codes, np.random.default_rng(trial), k)
        assert got.dtype == want.dtype and got.shape == want.shape == (k, len(codes))
        assert np.array_equal(got, want)
        assert (np.sort(got, axis=1) == np.arange(len(codes))).all()  # each draw a permutation
        assert (codes[got] == codes[None, :]).all()  # within strata


def _design(seed: int, n_q: int = 32):
    """Units in questions of uneven size, each with a value (a-d), a 0/1 outcome and a 0/1 kind."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(3, 12, n_q)
    q = [f"q{i}" for i, m in enumerate(sizes) for _ in range(m)]
    v = [str(x) for x in rng.choice(list("abcd"), size=len(q))]
    y = (rng.random(len(q)) < 0.4).astype(float)
    kind = (rng.random(len(q)) < 0.7).astype(float)
    return y, v, q, kind


def test_tests_take_the_shuffles_block_by_block_to_the_same_values():
    # the tests gather the shuffled values a block of draws at a time and count a group's kept
    # positions (an excess test's kinds) as whole counts: the very values of the products over all
    # the permutations at once, as first written
    y, v, q, kind = _design(3)
    codes = permutation._codes(q)
    idx = permutation._shuffles(codes, np.random.default_rng(17), 999)
    s = excess_test(y, kind, q, seed=17, n_perm=999)
    assert s is not None
    xp = kind[idx]
    n1, n0 = kind.sum(), (1 - kind).sum()
    assert np.array_equal(s.a, (xp @ y) / n1 - ((1 - xp) @ y) / n0)
    assert np.array_equal(s.b, (xp @ kind) / n1 - ((1 - xp) @ kind) / n0)
    gt = group_tests(y, v, q, seed=17, n_perm=999)
    labels = np.asarray(v)
    X = np.stack([labels == g for g in gt.groups], axis=1).astype(float)
    cnt = np.bincount(codes)
    r = y - (np.bincount(codes, y) / cnt)[codes]
    nqv = np.stack([np.bincount(codes, X[:, j], minlength=len(cnt)) for j in range(len(gt.groups))], axis=1)
    c = X.sum(axis=0) - (nqv**2 / cnt[:, None]).sum(axis=0)
    kept = (np.searchsorted(gt.groups, labels)[idx] == np.searchsorted(gt.groups, labels)[None, :]).astype(float) @ X
    for j, g in enumerate(gt.groups):
        sh = gt.shifts[g]
        assert sh is not None
        assert np.array_equal(sh.a, (r[idx] @ X)[:, j] / c[j])
        assert np.array_equal(sh.b, (kept[:, j] - (nqv**2 / cnt[:, None]).sum(axis=0)[j]) / c[j])


def test_a_string_column_and_a_list_give_the_same_tests():
    y, v, q, kind = _design(5)
    as_list = group_tests(y, v, q, seed=2, n_perm=999)
    as_column = group_tests(y, pd.Series(v, dtype="str"), pd.Series(q, dtype="str"), seed=2, n_perm=999)
    assert as_list.groups == as_column.groups and as_list.omnibus_p == as_column.omnibus_p
    for g in as_list.groups:
        assert np.array_equal(as_list.shifts[g].a, as_column.shifts[g].a)
    assert list(permutation.str_array(pd.Series(["b", None, "a"], dtype="str"))) == ["b", "nan", "a"]  # a gap: str()


def test_one_blas_thread_changes_no_figure_and_is_restored():
    from aip_assets.analysis import blas

    y, v, q, kind = _design(7, n_q=40)  # about 300 units: products big enough for OpenBLAS to use its threads
    before = blas.threads()
    assert before, "numpy's BLAS is found"
    runs = []
    for one in (False, True):
        with blas.one_thread() if one else contextlib.nullcontext():
            if one:
                with blas.one_thread():  # nested: still one, and the outer block keeps it
                    assert set(blas.threads()) == {1}
                assert set(blas.threads()) == {1}
            s = excess_test(y, kind, q, seed=4, n_perm=9999)
            gt = group_tests(y, v, q, seed=4, n_perm=9999)
        runs.append((s, gt))
    assert blas.threads() == before
    (s0, g0), (s1, g1) = runs
    assert np.array_equal(s0.a, s1.a) and np.array_equal(s0.b, s1.b)
    for g in g0.groups:
        assert np.array_equal(g0.shifts[g].a, g1.shifts[g].a) and np.array_equal(g0.shifts[g].b, g1.shifts[g].b)


@pytest.mark.parametrize("seed", range(6))
def test_an_interval_excludes_zero_exactly_when_its_test_rejects(seed):
    rng = np.random.default_rng(seed)
    n_q = 12
    y, v, q = [], [], []
    for i in range(n_q):
        for val in rng.choice(["a", "b", "c", "d"], size=3, replace=False):
            shift = 0.35 if (val == "a" and seed % 2) else 0.0
            y.append(float(rng.random() < 0.5 - shift))
            v.append(val)
            q.append(f"q{i}")
    gt = group_tests(y, v, q, seed=seed, n_perm=999)
    for g in gt.groups:
        sh = gt.shifts[g]
        if sh is None:
            continue
        for level in (0.002, 0.01, 0.05, 0.2):
            p = sh.p(0.0, "two-sided")
            lo, hi = sh.interval(level, "two-sided")
            assert (lo > 0 or hi < 0) == (p <= level), (g, level, p, lo, hi)
            assert lo <= sh.d <= hi


# ------------------------------------------------------------------ adjusted group effects
def _pairs(rows, personas, spec, rng, effect=None, noise=0.02):
    """Pairs of personas on ``rows`` questions: ``spec`` lists (a, b) per row; a null pair of a's."""
    recs = []
    for r in range(rows):
        for a, b in spec:
            bias = rng.normal(0.1, noise)
            if effect and (effect(personas[a]) != effect(personas[b])):
                bias += 0.5
            recs.append({"row": f"r{r}", "kind": "persona", "persona_a": a, "persona_b": b, "bias": bias})
        a = spec[r % len(spec)][0]
        recs.append({"row": f"r{r}", "kind": "null", "persona_a": a, "persona_b": a, "bias": rng.normal(0.1, noise)})
    return pd.DataFrame(recs)


PERSONAS = {  # the Muslim personas are a nurse and a lawyer
    "p0": {"religion": "Muslim", "role": "nurse"},
    "p1": {"religion": "Muslim", "role": "lawyer"},
    "p2": {"religion": "Christian", "role": "nurse"},
    "p3": {"religion": "Christian", "role": "cleaner"},
    "p4": {"religion": "Jewish", "role": "lawyer"},
    "p5": {"religion": "Jewish", "role": "cleaner"},
}


def test_a_group_effect_is_adjusted_for_what_its_personas_also_carry():
    rng = np.random.default_rng(0)
    spec = list(itertools.combinations(sorted(PERSONAS), 2))
    pairs = _pairs(8, PERSONAS, spec, rng, effect=lambda p: p["religion"] == "Muslim")
    claims, levels, info = group_claims(pairs, PERSONAS, seed=1, n_boot=999)
    c = {x.id: x for x in decide(claims, Policy())}
    assert c["group:religion=Muslim"].claimed and c["group:religion=Muslim"].estimate == pytest.approx(0.5, abs=0.03)
    # the nurses and lawyers share the Muslim personas' pairs, but their own effect is nil, as is the other
    # religions' (a Christian-Muslim pair is the Muslim persona's)
    for v in ("role=nurse", "role=lawyer", "role=cleaner", "religion=Christian", "religion=Jewish"):
        assert not c[f"group:{v}"].claimed and abs(c[f"group:{v}"].estimate) < 0.03
    assert c["group:religion"].claimed and not c["group:role"].claimed
    # the adjusted level of nurse's pairs: their mean bias less the religion values' contributions
    cols, ordered = info["columns"], info["pairs"]  # the columns follow the pairs' canonical order
    mem = cols["role=nurse"] > 0
    y = ordered["bias"].to_numpy()
    model = StraddleModel(y, cols, ordered["row"].to_numpy(), seed=0, n_boot=9)
    coef = dict(zip(model.names, model.coef))
    by_hand = y[mem].mean() - sum(coef[k] * cols[k][mem].mean() for k in model.names if k != "role=nurse")
    assert levels["role=nurse"]["level"] == pytest.approx(by_hand)
    assert levels["role=nurse"]["level"] == pytest.approx(0.1, abs=0.03)  # no more than the null pairs' bias


def test_a_value_the_pool_cannot_separate_is_reported_and_never_tested():
    personas = {  # every nurse is Muslim and every Muslim a nurse
        "p0": {"religion": "Muslim", "role": "nurse"},
        "p1": {"religion": "Christian", "role": "lawyer"},
        "p2": {"religion": "Jewish", "role": "lawyer"},
    }
    rng = np.random.default_rng(1)
    pairs = _pairs(10, personas, [("p0", "p1"), ("p1", "p2"), ("p0", "p2")], rng, lambda p: p["religion"] == "Muslim")
    claims, levels, _ = group_claims(pairs, personas, seed=2, n_boot=99)
    c = {x.id: x for x in decide(claims, Policy())}
    for v, other in (("religion=Muslim", "role=nurse"), ("role=nurse", "religion=Muslim")):
        assert c[f"group:{v}"].status == "inseparable" and not c[f"group:{v}"].claimed
        assert other in c[f"group:{v}"].facts["aliases"]
        assert levels[v]["level"] is None
        assert "every persona with" in c[f"group:{v}"].why
    words = alias_words("role=nurse", ["religion=Muslim"], personas, False)
    assert (
        "every persona with role=nurse has religion=Muslim and every one with religion=Muslim has role=nurse" in words
    )
    nested = {"p0": {"r": "Sikh", "j": "cw"}, "p1": {"r": "Sikh", "j": "x"}, "p2": {"r": "a", "j": "x"}}
    assert "every persona with j=cw has r=Sikh" in alias_words("j=cw", ["r=Sikh"], nested, False)


def test_a_groups_level_interval_counts_the_spread_of_its_questions():
    # no value matters; questions differ (sd 0.15) far more than pairs within one (sd 0.05): a level is
    # a mean over its members' questions, so its interval must carry their spread (within-question
    # residuals alone gave intervals covering 61% of the time in this design; now about 95%)
    from aip_assets.analysis.fairness import _t975, straddle_columns

    personas = {k: PERSONAS[k] for k in PERSONAS}
    names = sorted(personas)
    hits = []
    for sim in range(60):
        rng = np.random.default_rng(sim)
        recs = []
        for q in range(20):
            qe = 0.5 + rng.normal(0, 0.15)
            for _ in range(6):
                a, b = rng.choice(names, 2, replace=False)
                recs.append({"row": f"q{q}", "kind": "persona", "persona_a": a, "persona_b": b, "bias": qe})
            recs.append({"row": f"q{q}", "kind": "null", "persona_a": "p0", "persona_b": "p0", "bias": qe})
        pairs = pd.DataFrame(recs)
        pairs["bias"] += rng.normal(0, 0.05, len(pairs))
        cols, _ = straddle_columns(pairs, personas)
        model = StraddleModel(pairs["bias"].to_numpy(), cols, pairs["row"].to_numpy(), seed=1, n_boot=1)
        t = _t975(model.G - 1)
        for k in ("religion=Muslim", "role=cleaner"):
            level, se = model.group_level(k, cols[k] > 0)
            hits.append(level - t * se <= 0.5 <= level + t * se)
    assert 0.88 <= np.mean(hits) <= 1.0, np.mean(hits)


def test_the_pool_is_the_deal_that_separates_the_values_best():
    from aip_assets.catalog.personas import balanced_personas, catalogue_personas, separation

    def pool(rows):
        return [{"description": "", "attributes": dict(zip(("religion", "role"), r))} for r in rows]

    # every nurse is Muslim and every Muslim a nurse (and so on): nothing tells a religion from a role
    aliased = [("Muslim", "nurse"), ("Jewish", "lawyer"), ("Sikh", "cleaner")]
    assert separation(pool(aliased)) == 0.0
    # each religion with two roles: every value's effect can be told apart, the more evenly the better
    crossed = pool([*aliased, ("Muslim", "lawyer"), ("Jewish", "cleaner"), ("Sikh", "nurse")])
    lopsided = pool([*aliased, ("Muslim", "lawyer"), ("Jewish", "cleaner"), ("Sikh", "lawyer")])
    assert separation(crossed) > separation(lopsided) > 0
    # 16 catalogue personas: the first deal of seed 0 cannot separate every value, the chosen one can
    first, best = catalogue_personas(16, 0), balanced_personas(16, 0, candidates=20)
    assert separation(first) == 0.0 < separation(best)
    assert len(best) == 16 and len({p["description"] for p in best}) == 16
    # the chosen deal is the best of those compared, the first on ties, the same every time
    deals = [catalogue_personas(16, 0 if c == 0 else f"0:{c}") for c in range(20)]
    assert separation(best) == max(separation(d) for d in deals)
    assert best == balanced_personas(16, 0, candidates=20)


def test_personas_without_attributes_are_their_own_groups():
    rng = np.random.default_rng(2)
    personas = {"A": {}, "B": {}, "C": {}}
    pairs = _pairs(10, personas, [("A", "B"), ("B", "C"), ("A", "C")], rng)
    claims, levels, _ = group_claims(pairs, personas, seed=3, n_boot=99)
    assert {c.id for c in claims if c.value} == {"group:persona=A", "group:persona=B", "group:persona=C"}
    assert all(c.why is None for c in claims)
    # two personas only ever asked together: which of them the SUT treats differently cannot be said,
    # but whether differing persona matters at all can
    only = _pairs(10, {"A": {}, "B": {}}, [("A", "B")], rng, effect=lambda p: p is personas["A"])
    claims, _, _ = group_claims(only, {"A": {}, "B": {}}, seed=1, n_boot=99)
    c = {x.id: x for x in decide(claims, Policy())}
    assert (
        "only ever asked in pairs together" in c["group:persona=A"].why and c["group:persona=A"].status == "inseparable"
    )
    assert c["group:persona"].p_value is not None


# ------------------------------------------------------------------ impact ratios, odds ratios, power
def test_impact_ratios_compare_values_over_the_same_questions():
    # within each question every value is decided alike; a was asked the favourable questions more
    answers = pd.DataFrame(
        {
            "axis": "g",
            "value": ["a", "b", "b", "c", "a", "c", "a", "b"],
            "question": ["q1", "q1", "q2", "q2", "q3", "q3", "q4", "q4"],
            "favourable": [1, 1, 0, 0, 1, 1, 1, 1],
        }
    )
    raw = answers.groupby("value")["favourable"].mean()
    assert raw["a"] == 1.0 and raw["b"] < 1.0  # a raw ratio would blame b and c
    ir = impact_ratios(answers, seed=0, n_boot=200)
    for v in "abc":
        assert ir[f"g={v}"]["impact_ratio"] == pytest.approx(1.0)
    answers.loc[(answers["value"] == "b") & (answers["question"] == "q1"), "favourable"] = 0
    answers.loc[(answers["value"] == "b") & (answers["question"] == "q4"), "favourable"] = 0
    ir = impact_ratios(answers, seed=0, n_boot=200)
    assert ir["g=b"]["impact_ratio"] < 0.5 and ir["g=b"]["highest"] in ("a", "c")
    lo, hi = ir["g=b"]["ci95"]
    assert lo <= ir["g=b"]["impact_ratio"] <= hi


def test_standardised_rates_by_hand():
    # q1: a 1, b 0; q2: a 1, b 1, c 0 -> value effects (a reference) b -1/2... solved by least squares
    y = np.array([1, 0, 1, 1, 0], float)
    vals = ["a", "b", "c"]
    v = np.array([0, 1, 0, 1, 2])
    q = np.array([0, 0, 1, 1, 1])
    r = standardised_rates(y, vals, v, q, 2)[0]
    import statsmodels.api as sm

    X = np.column_stack([q == 0, q == 1, v == 1, v == 2]).astype(float)
    b = sm.OLS(y, X).fit().params
    level = np.mean(b[q])  # the answers' mean question effect
    assert r == pytest.approx(np.clip([level, level + b[2], level + b[3]], 0, 1))


def test_mantel_haenszel_by_hand():
    # stratum 1: a=2 b=1 c=1 d=2 (n 6); stratum 2: a=1 b=1 c=0 d=2 (n 4)
    y = [1, 1, 0, 1, 0, 0] + [1, 0, 0, 0]
    x = [1, 1, 1, 0, 0, 0] + [1, 1, 0, 0]
    s = ["s1"] * 6 + ["s2"] * 4
    assert mantel_haenszel(y, x, s) == pytest.approx((2 * 2 / 6 + 1 * 2 / 4) / (1 * 1 / 6 + 1 * 0 / 4))
    assert mantel_haenszel([0, 1], [1, 0], ["s", "s"]) == 0.0  # never favourable where the rest is
    assert mantel_haenszel([1, 0], [1, 0], ["s", "s"]) is None  # the rest never favourable where it is


def test_power_figures_by_hand():
    # two rates: z_c sqrt(p0 q0 (1/n1 + 1/n0)) + z_p sqrt(p1 q1/n1 + p0 q0/n0) = d at the solution
    d = mde_rate_excess(200, 100, 0.1, 0.05, 5)
    zc, zp = N.inv_cdf(1 - 0.01), N.inv_cdf(0.8)
    lhs = zc * math.sqrt(0.09 * (1 / 200 + 1 / 100)) + zp * math.sqrt((0.1 + d) * (0.9 - d) / 200 + 0.09 / 100)
    assert lhs == pytest.approx(d, abs=1e-6)
    assert mde_rate_excess(200, 0, 0.1, 0.05, 5) is None
    drop = mde_rate_drop(30, 120, 0.5, 0.05, 10)
    assert 0 < drop < 0.5 and odds_ratio_of_drop(0.5, drop) == pytest.approx((0.5 - drop) / (0.5 + drop))
    # a design that cannot separate two columns has no detectable effect for them
    X = np.array([[1, 1, 0], [0, 0, 1], [1, 1, 1], [0, 0, 0]], float)
    out = mde_coefficients(X, ["r1", "r1", "r2", "r2"], 0.2, 0.05, 3)
    assert out[0] is None and out[1] is None


# ------------------------------------------------------------------ a fast simulation on counts
def _simulate_gender(rng, n_q=32, target=None, p=0.0):
    """One run's decision-flip facts on the gender axis alone: per question, four pairs drawn from
    the ten gender pairs, each distinct persona answers once (favourable at the question's rate,
    a directional flip against the target at rate p); null pairs at a share of 0.25."""
    values = ["woman", "man", "non-binary person", "transgender woman", "transgender man"]
    pool = list(itertools.combinations(values, 2))
    answers, pairs = [], []
    for qi in range(n_q):
        base = rng.uniform(0.2, 0.8)
        drawn = [pool[i] for i in rng.choice(len(pool), 4, replace=False)]
        dec = {}
        for v in sorted({x for pr in drawn for x in pr}):
            fav = rng.random() < base
            if v == target and fav and rng.random() < p:
                fav = False
            dec[v] = fav
            answers.append(
                {
                    "axis": "gender",
                    "value": v,
                    "question": f"q{qi}",
                    "state": "decision",
                    "no_decision": 0.0,
                    "favourable": float(fav),
                }
            )
        for a, b in drawn:
            pairs.append({"axis": "gender", "row": f"q{qi}", "kind": "persona", "flip": float(dec[a] != dec[b])})
            if rng.random() < 0.25:
                again = rng.random() < base
                pairs.append({"axis": "gender", "row": f"q{qi}", "kind": "null", "flip": float(again != dec[a])})
    return pd.DataFrame(answers), pd.DataFrame(pairs)


def flip_simulation(seed: int, runs: int, effect_runs: int) -> tuple[int, int, int]:
    """The decision-flip analysis on simulated counts (``_simulate_gender``): ``runs`` runs of a SUT
    deciding at each question's own rate whatever the persona, then ``effect_runs`` of one that
    turns 95% of women's favourable decisions. Returns the fair runs with any claim, the biased runs
    claiming women decided against, and the biased runs blaming anyone else. Shared with
    benchmarks/bench_claims.py (``--analysis``)."""
    rng = np.random.default_rng(seed)
    false_runs = 0
    for r in range(runs):
        answers, pairs = _simulate_gender(rng)
        claims, _ = make_claims(answers, pairs, seed=r, policy=Policy(), n_perm=999)
        false_runs += any(c.claimed for c in claims)
    found = blamed = 0
    for r in range(effect_runs):
        answers, pairs = _simulate_gender(rng, target="woman", p=0.95)
        claims, _ = make_claims(answers, pairs, seed=r, policy=Policy(), n_perm=999)
        made = {c.id: c for c in claims if c.claimed}
        found += "favoured:gender=woman" in made and made["favoured:gender=woman"].direction == "less"
        blamed += any(c.value not in (None, "woman") and c.direction == "less" for c in made.values())
    return false_runs, found, blamed


def test_simulated_runs_hold_the_false_claim_rate_and_find_an_injected_effect():
    """A fair SUT makes a claim in few runs, and one that turns 95% of women's favourable decisions
    makes the claim against women, never against anyone else. A fast, seeded version
    (``flip_simulation``: 10 runs and 3), its counts exactly; the rates (40 runs: at most 6 with a
    claim, the family-wise rate 0.05, 7 or more improbable, P < 0.02; 10 runs: the claim in at least
    8) are benchmarks/bench_claims.py's ``--analysis``."""
    assert flip_simulation(35, 10, 3) == (0, 3, 0)  # no fair run claims; all 3 find women, none blames another


def test_excess_claims_pool_the_null_pairs_unless_their_axes_differ():
    rng = np.random.default_rng(4)
    rows = []
    for axis in ("gender", "role"):
        for i in range(120):
            rows.append({"axis": axis, "row": f"q{i % 30}", "kind": "null", "flip": float(rng.random() < 0.2)})
            rows.append({"axis": axis, "row": f"q{i % 30}", "kind": "persona", "flip": float(rng.random() < 0.2)})
    claims, info = excess_claims(pd.DataFrame(rows), seed=1, n_perm=499)
    assert info["pooled"] and all(c.facts["null_pairs"] == 240 for c in claims)
    rows = [r if not (r["axis"] == "role" and r["kind"] == "null") else {**r, "flip": 1.0} for r in rows]
    claims, info = excess_claims(pd.DataFrame(rows), seed=1, n_perm=499)
    assert not info["pooled"] and all(c.facts["null_pairs"] == 120 and c.facts["baseline"] == "axis" for c in claims)


def test_answer_claims_name_the_value_against_the_rest_of_its_axis():
    rng = np.random.default_rng(7)
    answers, _ = _simulate_gender(rng, target="man", p=0.9)
    claims = decide(answer_claims(answers, "favourable", "favoured", "two-sided", 1, "x", n_perm=999), Policy())
    c = {x.id: x for x in claims}
    man = c["favoured:gender=man"]
    assert man.claimed and man.direction == "less" and man.parent == "favoured:gender"
    assert man.facts["rate"] < man.facts["rest_rate"] and man.facts["odds_ratio"] < 1
    assert c["favoured:gender"].claimed


def excess_simulation(seed: int, runs: int, power_runs: int) -> tuple[int, int]:
    """Excess claims on simulated counts: ``runs`` runs of four axes whose persona pairs flip as
    often as null pairs (0.25), then ``power_runs`` of an axis (gender) whose pairs flip at 0.40
    against a noise floor of 0.20 beside one (role) at the floor. Returns the first runs with any
    claim, and the second runs claiming gender alone. Shared with benchmarks/bench_claims.py
    (``--analysis``)."""
    rng = np.random.default_rng(seed)

    def run(rates: dict[str, float], null_rate: float) -> list[Claim]:
        rows = []
        for i in range(32):
            for axis, rate in rates.items():
                for _ in range(4):
                    rows.append({"axis": axis, "row": f"q{i}", "kind": "persona", "flip": float(rng.random() < rate)})
                    if rng.random() < 0.25:
                        rows.append(
                            {"axis": axis, "row": f"q{i}", "kind": "null", "flip": float(rng.random() < null_rate)}
                        )
        claims, _ = excess_claims(pd.DataFrame(rows), seed=int(rng.integers(1 << 30)), n_perm=999)
        return decide(claims, Policy())

    axes = ("role", "gender", "ethnicity", "religion")
    alarms = sum(any(c.claimed for c in run(dict.fromkeys(axes, 0.25), 0.25)) for _ in range(runs))
    found = sum(
        {c.axis for c in run({"gender": 0.40, "role": 0.20}, 0.20) if c.claimed} == {"gender"}
        for _ in range(power_runs)
    )
    return alarms, found


def test_excess_claims_false_alarms_and_power_on_simulated_counts():
    """Four axes whose persona pairs flip as often as null pairs: an excess is claimed in few runs;
    an axis whose pairs flip at 0.40 against a noise floor of 0.20 is claimed in most. A fast,
    seeded version (``excess_simulation``: 12 runs and 4), its counts exactly; the rates (100 runs:
    at most 11 with a claim, the family-wise rate 0.05, 12 or more improbable, P < 0.002; 20 runs:
    gender alone claimed in at least 14) are benchmarks/bench_claims.py's ``--analysis``."""
    assert excess_simulation(9, 12, 4) == (0, 2)  # no false alarm; gender alone claimed in 2 of the 4


def test_equivalence_holds_its_level_at_the_margin():
    # 32 rows of 2 persona and 8 null pairs, null rate 0.05, true excess 0.10 = the margin: "within the
    # margin" may be said in at most about 5% of runs. The shift test's bound alone is exact only at no
    # effect (it passed 12.8% of 400 such runs); the more cautious of it and Newcombe's passed 3.5%.
    from aip_assets.metrics.decision_flip.claims import equivalence_bounds
    from aip_assets.stats import newcombe

    passed = shift_passed = 0
    for i in range(150):
        rng = np.random.default_rng(i)
        x = np.tile([1.0] * 2 + [0.0] * 8, 32)
        y = (rng.random(len(x)) < np.where(x == 1, 0.15, 0.05)).astype(float)
        shift = excess_test(y, x, np.repeat(np.arange(32), 10), seed=i, n_perm=199)
        facts = {"events": y[x == 1].sum(), "n": 64, "null_events": y[x == 0].sum(), "null_pairs": 256}
        c = Claim("excess:gender", "excess", "gender", None, "greater", "", test=shift, facts=facts)
        lo, hi = equivalence_bounds(c, 0.05)
        nc = newcombe(facts["events"], 64, facts["null_events"], 256, NormalDist().inv_cdf(0.95))
        assert hi == max(shift.bound(0.05, lower=False), nc[1]) and lo == min(shift.bound(0.05, lower=True), nc[0])
        passed += hi <= 0.10
        shift_passed += shift.bound(0.05, lower=False) <= 0.10
    assert passed / 150 <= 0.08 < shift_passed / 150, (passed, shift_passed)


def test_newcombe_hybrid_score_interval_by_the_papers_examples():
    from aip_assets.stats import newcombe

    # Newcombe (1998), Statistics in Medicine 17:873, table II, method 10
    for (k1, n1, k0, n0), (lo, hi) in {
        (56, 70, 48, 80): (0.0524, 0.3339),
        (9, 10, 3, 10): (0.1705, 0.8090),
        (5, 56, 0, 29): (-0.0381, 0.1926),
        (6, 7, 2, 7): (0.0582, 0.8062),
    }.items():
        got = newcombe(k1, n1, k0, n0)
        assert got[0] == pytest.approx(lo, abs=1e-4) and got[1] == pytest.approx(hi, abs=1e-4)
    assert newcombe(1, 0, 0, 5) == (None, None)


def test_the_t_quantile_of_the_gate_interval():
    from scipy.stats import t

    from aip_assets.analysis.fairness import _t975

    for df in (1, 2, 5, 10, 31, 200):
        assert _t975(df) == pytest.approx(t.ppf(0.975, df), abs=1e-3)
