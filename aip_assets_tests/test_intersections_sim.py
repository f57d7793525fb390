"""The intersection analysis on simulated SUTs whose truth is known (a small, seeded version of
``benchmarks/bench_intersections.py``, with its simulator): a fair SUT rarely gets a claim; a SUT
that flips Black women's favourable decisions at p 0.9 gets that combination named first and,
when claimed, claimed the right way, and neither of its attributes blamed. The power is moderate
at this size (the benchmark measured it; see docs/benchmarks.md): the omnibus test of departure
from additivity gates the combination's claim and is itself in the Holm family, so the bounds
below are floors against regressions, not goals."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

import bench_intersections as bench  # noqa: E402

RUNS = 20
N_BOOT = 399


def _runs(scenario: str, p: float) -> list[dict]:
    return [bench.run_one("names", scenario, p, seed, questions=32, n_boot=N_BOOT) for seed in range(RUNS)]


def test_fair_sut_rarely_claims():
    rs = _runs("fair", 0.0)
    assert sum(1 for r in rs if r["claimed"]) <= 3, [r["claimed"] for r in rs if r["claimed"]]


def test_one_combination_is_named_and_claimed():
    rs = _runs("combo", 0.9)
    target = "interaction:gender×ethnicity@name=woman×Black"
    assert sum(1 for r in rs if r["power"]) >= 8  # 11 of these 20 when written
    assert sum(1 for r in rs if r["false"]) <= 2, [r["false"] for r in rs if r["false"]]  # 0 when written
    assert all(r["claimed"].get(target) in (None, "true") for r in rs)  # never the wrong sign
    assert sum(1 for r in rs if r["named"] and r["named"][0] != "woman×Black") <= 1
    assert sum(1 for r in rs if r["named"][:1] == ["woman×Black"]) >= 12
    ests = [r["estimate"] for r in rs if r["target_tested"]]
    assert -0.65 < sum(ests) / len(ests) < -0.25  # the truth: -0.9 * 0.5


def test_simulated_design_is_the_metrics():
    rng = bench.random.Random(0)
    plan = bench.draw_design(*bench.DESIGNS["explicit"][1:], rng, questions=5)
    for cells in plan:  # rectangles of 2 x 2 enough to hold (nearly) every one of the 35 combinations once
        assert 30 <= len(cells) <= 35 and len(set(cells)) == len(cells)
    answers, truth = bench.simulate("names", "combo", 0.5, 3, questions=8)
    assert set(answers.columns) == {"question", "value", "favourable"} and answers["question"].nunique() == 8
    assert -0.4 <= truth <= -0.1
