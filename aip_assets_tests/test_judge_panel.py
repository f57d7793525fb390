"""Agreement between judges: Fleiss' and Cohen's kappa, and the bootstrap over input rows."""

from __future__ import annotations

import pytest

from aip_assets.stats import (bootstrap_sums, cluster_sums, cohen_kappa, fleiss_from_sums, fleiss_kappa,
                              fleiss_vectors)


# ------------------------------------------------------------------ formulas, by hand
def test_fleiss_and_pairwise_kappa_by_hand():
    """Three judges, five items, categories A B C (uneven: A 7 ratings, B 4, C 4):

        item   judge 1  judge 2  judge 3   n_A n_B n_C   P_i = (sum n_ij^2 - 3) / 6
        1      A        A        A          3   0   0    (9 - 3) / 6     = 1
        2      A        A        B          2   1   0    (4 + 1 - 3) / 6 = 1/3
        3      B        B        C          0   2   1    1/3
        4      A        B        C          1   1   1    (3 - 3) / 6     = 0
        5      A        C        C          1   0   2    1/3

    P-bar = (1 + 1/3 + 1/3 + 0 + 1/3) / 5 = 2/5; p = (7, 4, 4) / 15; P_e = (49 + 16 + 16) / 225 = 0.36;
    Fleiss' kappa = (0.4 - 0.36) / (1 - 0.36) = 0.04 / 0.64 = 1/16.
    Pairs (Cohen): 1/2 agree on items 1-3: p_o = 3/5, marginals A4 B1 C0 and A2 B2 C1, p_e = (8 + 2) / 25
    = 0.4, kappa = 0.2 / 0.6 = 1/3. 1/3 agree on item 1: p_o = 1/5, judge 3 A1 B1 C3, p_e = (4 + 1) / 25
    = 0.2, kappa = 0. 2/3 agree on items 1 and 5: p_o = 2/5, p_e = (2 + 2 + 3) / 25 = 0.28, kappa =
    0.12 / 0.72 = 1/6. The mean pairwise agreement (3/5 + 1/5 + 2/5) / 3 = 2/5 is P-bar."""
    j1, j2, j3 = list("AABAA"), list("AABBC"), list("ABCCC")
    counts = [[sum(j[i] == c for j in (j1, j2, j3)) for c in "ABC"] for i in range(5)]
    assert counts == [[3, 0, 0], [2, 1, 0], [0, 2, 1], [1, 1, 1], [1, 0, 2]]
    po, k = fleiss_kappa(counts)
    assert po == pytest.approx(2 / 5) and k == pytest.approx(1 / 16)
    assert cohen_kappa(j1, j2) == pytest.approx((3 / 5, 1 / 3))
    assert cohen_kappa(j1, j3) == pytest.approx((1 / 5, 0.0))
    assert cohen_kappa(j2, j3) == pytest.approx((2 / 5, 1 / 6))
    assert cohen_kappa(j2, j1)[1] == pytest.approx(1 / 3)  # either order
    # a sixth item judge 2 gave no verdict for: out of Fleiss (every judge), in pair 1/3 (both A):
    # p_o = 2/6, marginals A5 B1 C0 and A2 B1 C3, p_e = (10 + 1 + 0) / 36, kappa = (12 - 11) / (36 - 11) = 1/25
    assert cohen_kappa(j1 + ["A"], j3 + ["A"]) == pytest.approx((1 / 3, 1 / 25))
    # one category only: every rating agrees, kappa 1 (the audit's convention); a 2-rater Fleiss differs from Cohen
    assert fleiss_kappa([[2, 0], [2, 0]]) == (1.0, 1.0) and cohen_kappa(["A", "A"], ["A", "A"]) == (1.0, 1.0)
    # two judges, items A/A, A/B, B/B, B/B: P-bar = 3/4, p = (3, 5) / 8, P_e = 34/64, kappa = (48 - 34) / (64 - 34) = 7/15
    assert fleiss_kappa([[2, 0], [1, 1], [0, 2], [0, 2]]) == pytest.approx((3 / 4, 7 / 15))
    with pytest.raises(ValueError, match="same number"):
        fleiss_vectors([[3, 0], [1, 1]])
    assert fleiss_kappa([]) == (None, None) and cohen_kappa([], []) == (None, None)


def test_bootstrap_resamples_whole_clusters():
    """Two clusters (input rows) of summed (sum, count): [1, 1] and [0, 1]. A replicate draws each
    of the two 0, 1 or 2 times, so its mean is 1, 1/2 or 0 with chances 1/4, 1/2, 1/4: the percentile
    interval is [0, 1]. Identical clusters leave nothing to vary: the interval is the point."""
    mean = lambda s: (s[..., 0] / s[..., 1],)  # noqa: E731
    [(lo, hi)] = bootstrap_sums([[1.0, 1.0], [0.0, 1.0]], mean, seed=5)
    assert (lo, hi) == (0.0, 1.0)
    assert bootstrap_sums([[1.0, 2.0]] * 7, mean, seed=5) == [(0.5, 0.5)]
    vec = fleiss_vectors([[3, 0, 0], [2, 1, 0], [0, 2, 1], [1, 1, 1], [1, 0, 2]])
    sums = cluster_sums(vec, ["r1", "r1", "r2", "r3", "r3"])  # a row's items resampled together
    assert sums.shape == (3, 5) and sums[:, 1].tolist() == [2, 1, 2]
    a = bootstrap_sums(sums, fleiss_from_sums, seed=11)
    assert a == bootstrap_sums(sums, fleiss_from_sums, seed=11)  # seeded
    (plo, phi), (klo, khi) = a
    assert plo <= 0.4 <= phi and klo <= 1 / 16 <= khi
