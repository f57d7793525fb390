import pytest

from aip_assets.stats import cluster_bootstrap_mean, normalise, normalise_interval, wilson


def test_wilson_known_values():
    lo, hi = wilson(2, 16)
    assert lo == pytest.approx(0.0349, abs=1e-3) and hi == pytest.approx(0.3604, abs=1e-3)
    assert wilson(0, 10)[0] == 0.0 and wilson(10, 10)[1] == 1.0
    assert wilson(0, 0) == (None, None)


def test_normalise_clips_and_inverts():
    assert normalise(0.875, 0.0, 1.0, False) == 0.875
    assert normalise(0.875, 0.0, 1.0, True) == pytest.approx(0.125)
    assert normalise(0.5, 0.6, 1.0, False) == 0.0
    assert normalise(0.8, 0.6, 1.0, False) == pytest.approx(0.5)
    assert normalise_interval(0.2, 0.4, 0.0, 1.0, True) == pytest.approx((0.6, 0.8))


def test_cluster_bootstrap_covers_mean():
    vals = [1.0, 1.0, 0.0, 0.0, 1.0, 0.5] * 10
    clusters = [str(i // 3) for i in range(len(vals))]
    lo, hi = cluster_bootstrap_mean(vals, clusters, seed=1)
    assert lo < sum(vals) / len(vals) < hi


def test_wilson_coverage_is_near_95_percent_exactly_computed():
    """Coverage of the Wilson 95% interval, summed exactly over the binomial law (no simulation
    noise) for n in {20, 50, 200} x p in {0.02, 0.1, 0.3, 0.5}: mean in [0.93, 0.97], none below
    0.85. A 90% interval labelled 95% (z = 1.645) would fail the mean."""
    from math import comb

    cover = []
    for n in (20, 50, 200):
        for p in (0.02, 0.1, 0.3, 0.5):
            c = 0.0
            for k in range(n + 1):
                lo, hi = wilson(k, n)
                if lo <= p <= hi:
                    c += comb(n, k) * p**k * (1 - p) ** (n - k)
            cover.append(c)
    assert 0.93 <= sum(cover) / len(cover) <= 0.97, cover
    assert min(cover) >= 0.85, cover


def test_wilson_seeded_simulation_matches():
    """The same by simulation, 2,000 seeded draws per cell (the spec'd check)."""
    import numpy as np

    rng = np.random.default_rng(7)
    cover = []
    for n in (20, 50, 200):
        for p in (0.02, 0.1, 0.3, 0.5):
            ks = rng.binomial(n, p, size=2000)
            cover.append(sum(lo <= p <= hi for lo, hi in (wilson(int(k), n) for k in ks)) / 2000)
    assert 0.93 <= sum(cover) / len(cover) <= 0.97 and min(cover) >= 0.85, cover


def bootstrap_coverage(rows: int, reps: int, seed: int = 3) -> tuple[int, int]:
    """Rows of 4 pairs sharing a row effect (intra-row correlation 0.5), true mean 0, ``reps``
    seeded replications: how many times the percentile bootstrap over rows covers the truth, and how
    many times a bootstrap over pairs (ignoring the rows) does. Shared with
    benchmarks/bench_claims.py (``--analysis``)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    hit = naive_hit = 0
    for rep in range(reps):
        u = rng.normal(0, 1, rows)
        vals = (u[:, None] + rng.normal(0, 1, (rows, 4))).ravel()
        ids = [str(i) for i in np.repeat(np.arange(rows), 4)]
        lo, hi = cluster_bootstrap_mean(list(vals), ids, n_boot=1000, seed=rep)
        hit += lo <= 0.0 <= hi
        nlo, nhi = cluster_bootstrap_mean(list(vals), [str(i) for i in range(len(vals))], n_boot=1000, seed=rep)
        naive_hit += nlo <= 0.0 <= nhi
    return hit, naive_hit


def test_cluster_bootstrap_coverage_with_correlated_pairs():
    """The percentile bootstrap over rows covers the true mean of correlated pairs; a bootstrap over
    pairs, ignoring the rows, covers far less. A fast, seeded version (``bootstrap_coverage``: 40
    replications at 30 and 100 rows), its counts exactly; the coverage itself (150 replications at
    30, 100 and 300 rows: at least 90% over rows, under 88% over pairs; the percentile method
    under-covers slightly with few clusters) is benchmarks/bench_claims.py's ``--analysis``."""
    # over rows 39 and 38 of 40; over pairs 30 and 33
    assert [bootstrap_coverage(rows, 40) for rows in (30, 100)] == [(39, 30), (38, 33)]


def test_bootstrap_centres_on_the_pooled_mean_not_the_mean_of_row_means():
    """50 rows of four pairs scoring 1.0 and 50 rows of one pair scoring 0.0: the pooled mean the
    score reports is 200/250 = 0.8, the mean of row means 0.5. The interval is about 0.8."""
    vals = [1.0] * 200 + [0.0] * 50
    ids = [f"a{i // 4}" for i in range(200)] + [f"b{i}" for i in range(50)]
    lo, hi = cluster_bootstrap_mean(vals, ids, seed=1)
    assert 0.7 < lo < 0.8 < hi < 0.9


def test_normalise_edges():
    assert normalise(None, 0.0, 1.0, False) is None
    assert normalise(0.7, 0.7, 0.7, False) == 1.0 and normalise(0.69, 0.7, 0.7, False) == 0.0  # min == max: a step
    assert normalise(0.7, 0.7, 0.7, True) == 0.0
    assert normalise(1.5, 0.0, 1.0, False) == 1.0 and normalise(-0.5, 0.0, 1.0, False) == 0.0
    assert normalise(0.25, 0.2, 0.6, False) == pytest.approx(0.125)
    assert normalise_interval(None, 0.4, 0.0, 1.0, False) == (None, None)
    assert normalise_interval(0.2, 0.4, 0.0, 1.0, True) == pytest.approx((0.6, 0.8))  # swapped back into order


def test_wilson_edges():
    assert wilson(0, 1)[0] == 0.0 and wilson(1, 1)[1] == 1.0 and wilson(1, 1)[0] == pytest.approx(0.2065, abs=1e-4)
    lo, hi = wilson(1, 10)  # k = 1: the lower bound is above 0, not clipped to it
    assert lo == pytest.approx(0.01787, abs=1e-4) and hi == pytest.approx(0.4042, abs=1e-4)
    assert wilson(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)


def test_bootstrap_edges_and_chunking():
    """One cluster: its mean, no resampling. Many clusters: the resamples are drawn in chunks,
    and the result equals one draw of all resamples at once (the same random stream)."""
    import numpy as np

    from aip_assets.stats import bootstrap

    assert cluster_bootstrap_mean([0.2, 0.4], ["a", "a"]) == pytest.approx((0.3, 0.3))
    assert cluster_bootstrap_mean([], []) == (None, None)
    rng = np.random.default_rng(5)
    g, n_boot = 30_000, 200  # 5,000,000 // 30,000 = 166 resamples a chunk: two chunks
    vec = np.column_stack([rng.random(g), np.ones(g)])
    ratio = lambda s: s[..., 0] / s[..., 1]  # noqa: E731
    lo, hi = bootstrap(vec, ratio, seed=9, n_boot=n_boot)
    idx = np.random.default_rng(9).integers(0, g, size=(n_boot, g))
    means = np.sort(vec[idx].sum(axis=1)[:, 0] / g)
    assert (lo, hi) == (float(means[int(0.025 * n_boot)]), float(means[int(0.975 * n_boot)]))
    assert bootstrap(vec[:0], ratio) == (None, None)
    # the default: 2,000 resamples, seed 0 (a different seed or count gives another interval)
    v = vec[:50]
    assert bootstrap(v, ratio) == bootstrap(v, ratio, seed=0, n_boot=2000)
    assert bootstrap(v, ratio) != bootstrap(v, ratio, seed=1) and bootstrap(v, ratio) != bootstrap(
        v, ratio, n_boot=2001
    )


def test_cluster_bootstrap_mean_defaults():
    """2,000 resamples and seed 0 unless told (another count or seed gives another interval)."""
    import random

    rng = random.Random(3)
    v = [rng.random() for _ in range(120)]
    c = [f"r{i // 3}" for i in range(120)]  # 40 rows of three values
    got = cluster_bootstrap_mean(v, c)
    assert got == cluster_bootstrap_mean(v, c, n_boot=2000, seed=0)
    assert got != cluster_bootstrap_mean(v, c, n_boot=2001) and got != cluster_bootstrap_mean(v, c, seed=1)


def test_bootstrap_chunks_of_any_size_give_the_same_interval(monkeypatch):
    """Fewer cells than clusters (BOOT_CELLS // g == 0) still draws one resample a chunk; every
    chunk size gives the same interval (the same random stream); one cluster resamples to itself."""
    import numpy as np

    from aip_assets import stats

    vec = np.column_stack([np.random.default_rng(2).random(40), np.ones(40)])
    ratio = lambda s: s[..., 0] / s[..., 1]  # noqa: E731
    want = stats.bootstrap(vec, ratio, seed=4, n_boot=300)
    for cells in (10, 40, 41, 4000, 10**9):
        monkeypatch.setattr(stats, "BOOT_CELLS", cells)
        assert stats.bootstrap(vec, ratio, seed=4, n_boot=300) == want, cells
    assert stats.bootstrap(vec[:1], ratio, seed=4, n_boot=300) == (vec[0, 0], vec[0, 0])
    assert stats.bootstrap([[1.0, 0.0]], lambda s: np.where(s[..., 1] > 0, 1.0, np.nan)) == (None, None)


@pytest.mark.parametrize(
    "score,want",
    [(0.0, "low"), (0.3, "low"), (1 / 3, "mid"), (0.5, "mid"), (0.6, "mid"), (2 / 3, "high"), (1.0, "high")],
)
def test_third_splits_scores_at_one_and_two_thirds(score, want):
    from aip_assets.stats import third

    assert third(score) == want


def test_bootstrap_of_a_statistic_that_is_never_defined_gives_no_interval():
    """Clusters that carry no unit (count 0) give a ratio that is never defined: no interval."""
    import numpy as np

    from aip_assets.stats import bootstrap

    ratio = lambda s: np.where(s[..., 1] > 0, s[..., 0] / np.where(s[..., 1] > 0, s[..., 1], 1), np.nan)  # noqa: E731
    assert bootstrap([[0.0, 0.0], [0.0, 0.0], [0.0, 0.0]], ratio, seed=1, n_boot=50) == (None, None)


def test_cluster_bootstrap_mean_defaults_are_2000_resamples_and_seed_0():
    from aip_assets.stats import cluster_bootstrap_mean

    v, c = [0.1, 0.9, 0.4, 0.35, 0.8, 0.0, 1.0], ["a", "a", "b", "c", "c", "d", "e"]
    assert cluster_bootstrap_mean(v, c) == cluster_bootstrap_mean(v, c, n_boot=2000, seed=0)
    assert cluster_bootstrap_mean(v, c) != cluster_bootstrap_mean(v, c, n_boot=2000, seed=1)
