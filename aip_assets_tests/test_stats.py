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
