"""Run comparison: identical runs show no change, a changed SUT shows a significant drop on the
right axis, differing metric versions are flagged, and `aip-eval compare` prints, exits and picks
the latest runs."""

import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import pytest

from aip_assets import compare, compare_stats, scoring
from aip_assets import warehouse as wh
from aip_assets.cli import main
from aip_assets.metrics import REGISTRY

from .conftest import built_once, make_spec, run_all, write_dataset

CFG = {"num_pairs_per_dimension": 1}
FLIP03 = {"provider": "builtin", "profile": {"name": "flip", "value": "woman", "axis": "gender", "p": 0.3}}
FLIP06 = {"provider": "builtin", "profile": {"name": "flip", "value": "woman", "axis": "gender", "p": 0.6}}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """One warehouse with four 200-row decision-flip runs, built once for the module:
    `same-1`, `same-2` (spec `same`, flip p 0.3 twice) and `fair`, `flip` (spec `sut-change`:
    the fair builtin SUT, then flips for women with p 0.6)."""

    def build(root):
        with pytest.MonkeyPatch.context() as mp:
            mp.chdir(root)
            mp.setenv("AIP_WAREHOUSE", str(root / "data" / "warehouse.duckdb"))
            mp.delenv("DAGSTER_HOME", raising=False)
            ds = write_dataset(root / "d.jsonl", 200)
            for run_id, name, sut in (
                ("same-1", "same", FLIP03),
                ("same-2", "same", FLIP03),
                ("fair", "sut-change", None),
                ("flip", "sut-change", FLIP06),
            ):
                run_all(make_spec(ds, name=name, sut=sut, config=CFG, batch_rows=200), run_id)

    return built_once(tmp_path_factory, "compare", build) / "data" / "warehouse.duckdb"


@pytest.fixture
def warehouse(built, isolated):
    """This test's own copy of the module's warehouse (AIP_WAREHOUSE points at it)."""
    dst = Path(os.environ["AIP_WAREHOUSE"])
    dst.parent.mkdir(parents=True, exist_ok=True)
    wh.release()  # the builder's last writes into the file itself, so the file alone holds them
    shutil.copy(built, dst)
    return dst


def _row(df, scope, key):
    return df[(df["scope"] == scope) & (df["group_key"] == key)].iloc[0]


def test_same_spec_same_sut_shows_zero_difference(warehouse):
    df, warnings = compare.compare_runs("same-1", "same-2")
    assert warnings == []
    assert set(zip(df["scope"], df["group_key"])) == {
        ("overall", "all"),
        ("axis", "role"),
        ("axis", "gender"),
        ("axis", "ethnicity"),
        ("axis", "religion"),
    }
    assert (df["diff"] == 0).all() and not df["significant"].any()
    assert (df["p_value"] == 1).all() and (df["p_adjusted"] == 1).all()
    assert _row(df, "axis", "gender")["score_a"] > 0.03  # the p 0.3 flips are there, in both runs alike
    overall = _row(df, "overall", "all")
    assert overall["ci_low"] == overall["ci_high"] == 0  # paired: every resample differs by exactly 0
    assert overall["method"].startswith("paired bootstrap over 200 input_ids")
    assert list(df.columns) == compare.COLUMNS


def test_changed_sut_profile_shows_significant_drop_on_gender(warehouse):
    df, warnings = compare.compare_runs("fair", "flip")
    assert warnings == []
    gender = _row(df, "axis", "gender")
    assert gender["score_a"] == 0 and gender["diff"] > 0.1  # the flip rate went up
    assert gender["significant"] and gender["p_adjusted"] < 1e-6 and gender["ci_low"] > 0
    assert gender["method"].startswith("paired bootstrap over 200 input_ids")  # the rows, not the pairs
    for axis in ("role", "ethnicity", "religion"):
        r = _row(df, "axis", axis)
        assert r["diff"] == 0 and not r["significant"]
    overall = _row(df, "overall", "all")
    assert overall["diff"] < 0 and overall["significant"] and overall["ci_high"] < 0
    assert overall["diff"] == pytest.approx(-gender["diff"] / 4)  # one pair per axis and row: a quarter of the pairs
    assert {r["group_key"] for r in df.to_dict("records") if compare.is_drop(r)} == {"all", "gender"}
    # persisted, and a re-comparison replaces the pair's rows
    compare.compare_runs("fair", "flip")
    stored = wh.query("SELECT * FROM run_comparisons WHERE run_a = 'fair' AND run_b = 'flip'", read_only=False)
    assert len(stored) == len(df) and set(stored["run_id"]) == {"flip"}
    assert stored["significant"].sum() == 2 and json.loads(stored["warnings"].iloc[0]) == []
    # the quick look without Python: each run against the previous run of its spec
    rr = wh.query("SELECT * FROM v_run_over_run ORDER BY spec_name", read_only=False)
    assert list(zip(rr["spec_name"], rr["prev_run_id"], rr["run_id"])) == [
        ("same", "same-1", "same-2"),
        ("sut-change", "fair", "flip"),
    ]
    assert rr["diff"].iloc[0] == 0 and rr["diff"].iloc[1] == pytest.approx(overall["diff"])
    assert not rr["version_changed"].any()


def test_differing_metric_versions_and_specs_are_flagged(warehouse, tmp_path, monkeypatch):
    ds = write_dataset(tmp_path / "small.jsonl", 12)
    spec = make_spec(ds, name="ver", config=CFG, batch_rows=50)
    run_all(spec, "v1")
    monkeypatch.setattr(type(REGISTRY["llm.decision_flip"]), "version", "2.1.0")
    run_all(spec, "v2")
    df, warnings = compare.compare_runs("v1", "v2")
    assert len(warnings) == 1 and "not the same measurement" in warnings[0]
    assert "2.0.0" in warnings[0] and "2.1.0" in warnings[0] and "llm.decision_flip" in warnings[0]
    assert len(df) == 5 and (df["diff"] == 0).all()  # still compared
    rr = wh.query("SELECT * FROM v_run_over_run WHERE spec_name = 'ver'", read_only=False)
    assert rr["version_changed"].tolist() == [True]
    # runs of different specs (and datasets): compared, with warnings; unpaired
    df, warnings = compare.compare_runs("v1", "fair")
    assert any("different specs" in w for w in warnings) and any("different datasets" in w for w in warnings)
    assert _row(df, "overall", "all")["method"].startswith("unpaired bootstrap over 12/200")


def test_cli_compare_table_json_latest_and_fail_on_drop(warehouse, capsys):
    assert main(["compare", "fair", "flip"]) == 0
    out = capsys.readouterr()
    assert "Run B flip vs run A fair" in out.out and "gender" in out.out and out.err == ""
    marked = [line for line in out.out.splitlines() if line.startswith("* drop")]
    assert len(marked) == 2 and any("gender" in line for line in marked)

    assert main(["compare", "fair", "flip", "--fail-on-drop"]) == 1
    capsys.readouterr()
    assert main(["compare", "same-1", "same-2", "--fail-on-drop"]) == 0
    capsys.readouterr()

    assert main(["compare", "--latest", "sut-change", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["run_a"], doc["run_b"]) == ("fair", "flip") and doc["significant_drops"] == 2
    assert {r["group_key"]: r["significant"] for r in doc["rows"]}["gender"] is True

    # warnings go to stderr, before the table
    wh.query(
        "UPDATE eval_runs SET metric_versions = '{\"llm.decision_flip\": \"9.9.9\"}' WHERE run_id = 'same-2'",
        read_only=False,
    )
    assert main(["compare", "--latest", "same"]) == 0
    out = capsys.readouterr()
    assert "not the same measurement" in out.err and "Run B same-2 vs run A same-1" in out.out

    assert main(["compare", "--latest", "no-such-spec"]) == 2
    assert "has 0 scored runs" in capsys.readouterr().err
    assert main(["compare", "fair"]) == 2
    assert "two run ids" in capsys.readouterr().err


def test_statistics_helpers():
    # Newcombe (1998), method 10: 56/70 vs 48/80 -> 0.2000, 95% CI 0.0524 to 0.3339
    lo, hi = compare_stats.newcombe(48, 80, 56, 70, 1.959963984540054)
    assert (round(lo, 4), round(hi, 4)) == (0.0524, 0.3339)
    assert compare_stats.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert compare_stats.two_proportion_p(0, 50, 0, 50) == 1.0
    assert compare_stats.t_two_sided_p(2.0, 10) == pytest.approx(0.07339, abs=1e-5)
    assert compare_stats.t_quantile(0.975, 10) == pytest.approx(2.228139, abs=1e-5)
    # the bootstrap SE of an unpaired difference of two means of 0/1 values with p = 0.5, n = 400 each
    rng = random.Random(1)
    a = {f"a{i}": np.array([float(rng.random() < 0.5), 1.0]) for i in range(400)}
    b = {f"b{i}": np.array([float(rng.random() < 0.5), 1.0]) for i in range(400)}
    ident = lambda x: x  # noqa: E731
    mean = scoring.statistic(scoring.MEAN_OF_ROW_MEANS)  # sum / count of (value, 1) vectors
    se = compare_stats.bootstrap_se(a, b, mean, ident, ident, paired=False, seed=0)
    assert se == pytest.approx((2 * 0.25 / 400) ** 0.5, rel=0.1)


def _metric_spec(ds, metric, sut=None, config=None, name="m"):
    from aip_assets.runspec import parse_spec

    data = make_spec(ds, name=name, sut=sut, batch_rows=60).model_dump()
    data["metrics"] = {metric: {"config": config or {}}}
    return parse_spec(data)


@pytest.mark.parametrize(
    "metric,sut,config,scope,key",
    [
        (
            "llm.group_interaction_bias",
            {"provider": "builtin", "profile": {"name": "terse", "terse_value": "Muslim"}},
            {"num_pairs": 4},
            "attribute",
            "religion=Muslim",
        ),
        (
            "llm.semantic_consistency",
            {"provider": "builtin", "profile": {"name": "inconsistent", "contradiction_rate": 0.5}},
            {},
            "category",
            None,
        ),
        (
            "llm.perturbation_robustness",
            {"provider": "builtin", "profile": {"name": "fragile", "fragile_to": "typos"}},
            {"perturbation_types": ["typos", "casing"]},
            "perturbation_type",
            "typos",
        ),
    ],
)
def test_every_metric_compares_through_the_engine(tmp_path, metric, sut, config, scope, key):
    """The same spec twice: no difference anywhere (paired, exactly 0). A SUT with the metric's
    known flaw: a significant drop overall, and on the breakdown group the flaw is in. The
    bootstrap reproduces each run's stored score from its stored units before it tests."""
    ds = write_dataset(tmp_path / "d.jsonl", 60)
    for run_id, s in (("a", None), ("b", None), ("flawed", sut)):
        run_all(_metric_spec(ds, metric, sut=s, config=config), run_id, metric=metric)
    same, warnings = compare.compare_runs("a", "b", persist=False)
    assert warnings == [] and (same["diff"].fillna(0) == 0).all() and not same["significant"].any()
    assert same["method"].str.contains("no test: the stored rows").sum() == 0
    drop, _ = compare.compare_runs("a", "flawed", persist=False)
    overall = _row(drop, "overall", "all")
    assert overall["diff"] < 0 and overall["significant"], overall["method"]
    assert overall["method"].startswith(f"paired bootstrap over 60 {REGISTRY[metric].formula.clusters}")
    rows = drop[drop["scope"] == scope]
    assert len(rows) > 0 and not rows["method"].str.startswith("no test: the stored").any()
    if key is not None:
        assert _row(drop, scope, key)["diff"] < 0 and _row(drop, scope, key)["significant"]


def test_a_flip_rate_is_tested_over_its_rows_not_as_independent_pairs():
    """Four pairs of a row share personas and answers: flips that come four at a time from 5 of 20
    rows are less sure than 20 independent flips among 80 pairs. The bootstrap over the rows gives
    the wider interval; stored units that do not add up to the counts fall back to two
    proportions, saying so."""
    from statistics import NormalDist

    from aip_assets.scoring import ONE_MINUS_FLIP_RATE

    ua = {f"q{i}": np.array([0.0, 4.0]) for i in range(20)}  # run A: no flip in 80 pairs
    ub = {f"q{i}": np.array([4.0 if i < 5 else 0.0, 4.0]) for i in range(20)}  # run B: 20 flips, all in 5 rows
    ctx = {"run_a": "a", "run_b": "b", "metric": "llm.decision_flip", "paired": True, "n_boot": 4000}
    row = {"diff": 0.25}
    compare._rate_test(ctx, row, "gender", (0, 80), (20, 80), ua, ub, ONE_MINUS_FLIP_RATE)
    assert row["method"].startswith("paired bootstrap over 20 input_ids (B=4000)")
    lo, hi = row["_ci"](0.975)
    nlo, nhi = compare_stats.newcombe(0, 80, 20, 80, NormalDist().inv_cdf(0.975))
    assert hi - lo > 1.5 * (nhi - nlo)  # the clustered flips: a much wider interval
    # by hand: the rows' flip shares are 1 (5 rows) and 0 (15); the rate's bootstrap SE is about
    # sqrt(p (1 - p) / 20) = 0.0968 (p = 0.25), scaled by sqrt(20/19), on Student's t with 19 df
    se = (hi - lo) / 2 / compare_stats.t_quantile(0.975, 19)
    assert se == pytest.approx((0.25 * 0.75 / 20) ** 0.5 * (20 / 19) ** 0.5, rel=0.05)
    assert row["p_value"] == pytest.approx(compare_stats.t_two_sided_p(0.25 / se, 19), rel=1e-6)

    row = {"diff": 0.25}  # units that do not reproduce the stored counts: two proportions, said so
    compare._rate_test(ctx, row, "gender", (0, 80), (21, 80), ua, ub, ONE_MINUS_FLIP_RATE)
    assert row["method"].startswith("two-proportion z-test (pooled), Newcombe") and "do not reproduce" in row["method"]
    assert row["p_value"] == compare_stats.two_proportion_p(0, 80, 21, 80)
