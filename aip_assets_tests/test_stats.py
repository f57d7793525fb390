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


def test_fisher_exact_known_values():
    from aip_assets.stats import fisher_exact

    # R: fisher.test(matrix(c(1, 8, 11, 3), 2, byrow=TRUE))$p.value = 0.002759456
    assert fisher_exact(1, 9, 11, 14) == pytest.approx(0.002759456, rel=1e-6)
    # the lady tasting tea: 3 of 4 right both ways, two-sided p = 0.4857143
    assert fisher_exact(3, 4, 1, 4) == pytest.approx(0.4857143, rel=1e-6)
    assert fisher_exact(0, 16, 4, 16) == pytest.approx(0.1012236, rel=1e-5)
    assert fisher_exact(3, 10, 3, 10) == pytest.approx(1.0)
    assert fisher_exact(0, 0, 3, 10) == 1.0  # nothing observed on one side: no evidence
    assert fisher_exact(0, 30, 30, 30) < 1e-15


def test_holm_step_down():
    from aip_assets.stats import holm

    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([]) == [] and holm([0.7]) == [0.7] and holm([0.6, 0.6]) == [1.0, 1.0]
