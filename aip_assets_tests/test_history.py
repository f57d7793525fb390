"""Recurring evaluations: each run of a spec is compared with the spec's previous completed run on
the same dataset (the regression check), its SUT's drift is measured on the same probes, and its
history is a view, a report section and Dagster metadata (aip_assets/history.py)."""

import json
import os
import shutil
from pathlib import Path

import pytest

from aip_assets import checks, history, pipeline
from aip_assets import warehouse as wh
from aip_assets.findings import run_findings
from aip_assets.report import build_report
from aip_assets.summary import run_summary

from .conftest import built_once, make_spec, run_all, write_dataset

CFG = {"num_pairs_per_dimension": 3, "dimensions": ["gender", "religion"]}
AGAINST_WOMEN = {
    "provider": "builtin",
    "profile": {"name": "flip", "value": "woman", "axis": "gender", "p": 0.9, "directional": True},
}
TWO_METRICS = {"llm.semantic_consistency": {"config": {"responses_per_query": 2}}}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """One warehouse, built once: spec `nightly` on dataset d.jsonl (40 rows): n-1 and n-2 fair, n-3
    against women with fail_on_regression (its spec lists a second metric, not run: the run's alpha
    is split in two), then x-1 on another dataset (e.jsonl) and n-4, fair again, on d.jsonl; spec
    `warn`: w-1 fair, w-2 against women without fail_on_regression."""

    def build(root):
        with pytest.MonkeyPatch.context() as mp:
            mp.chdir(root)
            mp.setenv("AIP_WAREHOUSE", str(root / "data" / "warehouse.duckdb"))
            mp.setenv("AIP_DATA_DIR", str(root / "data"))
            mp.delenv("DAGSTER_HOME", raising=False)
            d = write_dataset(root / "d.jsonl", 40)
            e = write_dataset(root / "e.jsonl", 20)
            fair = make_spec(d, name="nightly", config=CFG)
            run_all(fair, "n-1")
            run_all(fair, "n-2")
            bad = make_spec(d, name="nightly", sut=AGAINST_WOMEN, config=CFG, fail_on_regression=True)
            bad = bad.model_copy(update={"metrics": {**bad.metrics, **make_spec(d, metrics=TWO_METRICS).metrics}})
            run_all(bad, "n-3")
            run_all(make_spec(e, name="nightly", config=CFG), "x-1")
            run_all(fair, "n-4")
            run_all(make_spec(d, name="warn", config=CFG), "w-1")
            run_all(make_spec(d, name="warn", sut=AGAINST_WOMEN, config=CFG), "w-2")

    return built_once(tmp_path_factory, "history", build)


@pytest.fixture
def warehouse(built, isolated):
    """This test's own copy of the module's warehouse."""
    dst = Path(os.environ["AIP_WAREHOUSE"])
    dst.parent.mkdir(parents=True, exist_ok=True)
    wh.release()
    shutil.copy(built / "data" / "warehouse.duckdb", dst)
    return dst


def _rows(run_id: str) -> list[dict]:
    return history.stored(run_id).to_dict("records")


def _row(rows: list[dict], kind: str, scope: str, group: str = "all") -> dict:
    return next(r for r in rows if r["kind"] == kind and r["scope"] == scope and r["group_key"] == group)


def _overall(run_id: str) -> dict:
    return wh.query("SELECT * FROM metric_scores WHERE run_id = ? AND scope = 'overall'", [run_id]).iloc[0].to_dict()


def test_the_first_run_has_nothing_to_compare(warehouse):
    assert _rows("n-1") == []
    assert history.since_metadata("n-1", "llm.decision_flip")["previous_run"].startswith("none: the first")
    spec, _ = pipeline.load_run("n-1")
    res = next(
        r for r in checks.evaluate("aggregation", "n-1", "llm.decision_flip", spec) if r.check_name == "regression"
    )
    assert res.passed and "no earlier completed run of spec nightly" in res.description


def test_the_same_sut_again_changes_nothing_and_drifts_nowhere(warehouse):
    rows = _rows("n-2")
    assert {r["previous_run"] for r in rows} == {"n-1"}
    scored = [r for r in rows if r["kind"] == "score"]
    assert {(r["scope"], r["group_key"]) for r in scored} == {
        ("overall", "all"),
        ("axis", "gender"),
        ("axis", "religion"),
    }
    assert all(r["diff"] == 0 and not r["significant"] and not r["worse"] for r in scored)
    for scope in ("answers", "decisions", "verdicts"):  # the builtin SUT is a function of the request
        d = _row(rows, "drift", scope)
        assert d["score_b"] == 0 and d["n_b"] > 100, scope
    model = _row(rows, "drift", "model")
    assert model["score_b"] == 0 and json.loads(model["details"])["models_b"] == ["aip-builtin-fair"]
    assert "in both runs" in model["sentence"]
    assert bool(_overall("n-2")["passed"])
    assert not [f for f in run_findings("n-2") if f.scope == "drift" or "since n-1" in f.sentence]


def test_a_sut_turned_against_women_regresses_on_gender_and_fails_the_gate(warehouse):
    rows = _rows("n-3")
    assert {r["previous_run"] for r in rows} == {"n-2"}
    gender = _row(rows, "score", "axis", "gender")
    assert gender["worse"] and gender["significant"] and gender["diff"] > 0.1
    assert gender["ci_low"] > 0 and gender["ci_low"] <= gender["diff"] <= gender["ci_high"]
    assert gender["sentence"].startswith(f"gender flips rose from 0.0% to {gender['score_b']:.1%} since n-2, +")
    assert f"[{gender['ci_low'] * 100:+.1f}, {gender['ci_high'] * 100:+.1f}]" in gender["sentence"]
    assert not _row(rows, "score", "axis", "religion")["worse"]  # the other axis did not move
    # the run lists two metrics: each spends half the run's alpha (Bonferroni across metrics, Holm within)
    assert {(r["alpha"], r["alpha_run"]) for r in rows} == {(0.025, 0.05)}
    assert "Holm over 3 tests, interval at the Bonferroni level 0.9917" in gender["method"]  # 1 - 0.025 / 3
    # the SUT's drift: another model, and decisions that changed on the same probes
    model = _row(rows, "drift", "model")
    details = json.loads(model["details"])
    assert model["score_b"] == 1 and (details["models_a"], details["models_b"]) == (
        ["aip-builtin-fair"],
        ["aip-builtin-flip"],
    )
    assert model["sentence"] == "the SUT reported model aip-builtin-flip, where it reported aip-builtin-fair in n-2"
    decisions = _row(rows, "drift", "decisions")
    assert 0 < decisions["score_b"] < 0.5
    assert decisions["sentence"].startswith(f"{json.loads(decisions['details'])['changed']} of {decisions['n_b']} ")
    # fail_on_regression: the gate fails, saying what regressed; the check fails at ERROR
    ov = _overall("n-3")
    assert not ov["passed"] and "regressed: gender flips rose" in ov["gate_reason"]
    spec, _ = pipeline.load_run("n-3")
    res = next(
        r for r in checks.evaluate("aggregation", "n-3", "llm.decision_flip", spec) if r.check_name == "regression"
    )
    assert not res.passed and res.severity.value == "ERROR" and "gender flips rose" in res.description
    assert res.metadata["previous_run"].value == "n-2" and res.metadata["decision_flip worse"].value >= 1
    found = {f.sentence: f for f in run_findings("n-3")}
    assert found[gender["sentence"][0].upper() + gender["sentence"][1:]].gate_failed
    assert any(s.startswith("The SUT reported model aip-builtin-flip") for s in found)


def test_without_fail_on_regression_a_regression_is_a_warning(warehouse):
    rows = _rows("w-2")
    assert _row(rows, "score", "axis", "gender")["worse"]
    assert {r["alpha"] for r in rows} == {0.05}  # one metric: the run's whole alpha
    ov = _overall("w-2")
    assert "regressed" not in (ov["gate_reason"] or "")  # its own gate may fail (the flips), not for this
    spec, _ = pipeline.load_run("w-2")
    res = next(
        r for r in checks.evaluate("aggregation", "w-2", "llm.decision_flip", spec) if r.check_name == "regression"
    )
    assert not res.passed and res.severity.value == "WARN"
    gender = next(f for f in run_findings("w-2") if f.scope == "axis" and "since w-1" in f.sentence)
    assert not gender.gate_failed


def test_the_previous_run_is_the_latest_on_the_same_dataset(warehouse):
    assert _rows("x-1") == []  # another dataset: nothing to compare with, though n-1..n-3 came before
    rows = _rows("n-4")
    assert {r["previous_run"] for r in rows} == {"n-3"}  # x-1, later, read another dataset
    gender = _row(rows, "score", "axis", "gender")
    assert gender["significant"] and not gender["worse"] and gender["diff"] < 0
    assert gender["sentence"].startswith("gender flips fell from")
    with wh.connect(read_only=True) as con:
        assert history.previous_run(con, "n-2", "llm.decision_flip") == "n-1"
        assert history.previous_run(con, "n-1", "llm.decision_flip") is None
        assert history.previous_run(con, "n-4", "llm.semantic_consistency") is None  # never aggregated
        assert history.previous_run(con, "nope", "llm.decision_flip") is None


def test_the_spec_history_view_and_the_report_section(warehouse):
    hist = history.history("nightly")
    ov = hist[(hist["metric"] == "llm.decision_flip") & (hist["scope"] == "overall")]
    assert list(ov["run_id"]) == ["n-1", "n-2", "n-3", "x-1", "n-4"]
    assert list(ov["prev_run_id"].fillna("")) == ["", "n-1", "n-2", "n-3", "x-1"]
    assert set(ov["sut_models"]) == {"aip-builtin-fair", "aip-builtin-flip"}
    gender = hist[(hist["scope"] == "axis") & (hist["group_key"] == "gender")]
    assert gender["rate"].iloc[2] > 0.1 and gender["rate_change"].iloc[2] == gender["rate"].iloc[2]
    assert "claim" not in set(hist["scope"])

    html = build_report("n-3")
    assert 'id="history"' in html and "Since the previous run, <code>n-2</code>" in html
    assert html.count('<svg class="history"') >= 1
    assert 'data-run="n-1"' in html and 'data-run="n-2"' in html and 'data-run="n-3"' in html
    assert 'data-run="n-4"' not in html  # history up to the run the report is of
    gender_row = _row(_rows("n-3"), "score", "axis", "gender")
    assert gender_row["sentence"] in html
    assert "spec_name = &#x27;nightly&#x27;" in html or "spec_name = 'nightly'" in html
    assert 'id="history"' not in build_report("n-1")  # alone: no section


def test_the_aggregation_metadata_links_the_previous_run(warehouse):
    from aip_assets.assets.stages import aggregation_partition_path

    meta = history.since_metadata("n-3", "llm.decision_flip")
    assert meta["previous_run"] == "n-2" and meta["regressions"] >= 1
    assert meta["since_previous"].startswith("Since **n-2**:")
    assert "- **worse**: gender flips rose" in meta["since_previous"]
    assert "- drift: the SUT reported model aip-builtin-flip" in meta["since_previous"]
    assert aggregation_partition_path("n-2", "llm.decision_flip") == (
        "/assets/aggregation?view=partitions&partition=n-2%7Cllm.decision_flip"
    )


def test_reaggregating_replaces_the_partitions_regression_rows(warehouse):
    before = _rows("n-2")
    pipeline.run_stage("aggregation", "n-2", "llm.decision_flip")
    after = _rows("n-2")
    assert len(after) == len(before)
    assert [(r["kind"], r["scope"], r["group_key"]) for r in after] == [
        (r["kind"], r["scope"], r["group_key"]) for r in before
    ]


@pytest.mark.parametrize(
    "row, lower, expected",
    [
        (
            {"metric": "llm.decision_flip", "scope": "axis", "group_key": "gender", "score_a": 0.031, "score_b": 0.125}
            | {"diff": 0.094, "ci_low": 0.04, "ci_high": 0.142},
            True,
            "gender flips rose from 3.1% to 12.5% since demo-261202-0200, +9.4 points [+4.0, +14.2]",
        ),
        (
            {"metric": "llm.semantic_consistency", "scope": "overall", "group_key": "all", "score_a": 0.9}
            | {"score_b": 0.75, "diff": -0.15, "ci_low": -0.3, "ci_high": -0.01},
            False,
            "semantic consistency score fell from 0.900 to 0.750 since demo-261202-0200, -0.150 [-0.300, -0.010]",
        ),
        (
            {"metric": "llm.group_interaction_bias", "scope": "attribute", "group_key": "religion=Muslim"}
            | {"score_a": 0.5, "score_b": 0.625, "diff": 0.125, "ci_low": None, "ci_high": None},
            False,
            "group interaction bias score for attribute religion=Muslim rose from 0.500 to 0.625 since "
            "demo-261202-0200, +0.125",
        ),
        (
            {"metric": "llm.decision_flip", "scope": "axis", "group_key": "role", "score_a": 0.0, "score_b": 0.0}
            | {"diff": 0.0, "ci_low": 0.0, "ci_high": 0.0},
            True,
            "role flips stayed at 0.0% since demo-261202-0200",
        ),
    ],
)
def test_a_change_in_words(row, lower, expected):
    assert history.sentence(row, "demo-261202-0200", "flip rate", lower) == expected


def test_the_json_summary_says_what_changed_since_the_previous_run(warehouse):
    s = run_summary("n-3")["metrics"]["llm.decision_flip"]["since_previous"]
    assert s["previous_run"] == "n-2" and s["alpha"] == 0.025 and s["tests"] == 3
    gender = next(c for c in s["changes"] if c["group_key"] == "gender")
    assert gender["worse"] is True and gender["sentence"].startswith("gender flips rose")
    assert s["drift"]["model"]["details"]["models_b"] == ["aip-builtin-flip"]
    assert s["drift"]["decisions"]["changed_share"] > 0
    json.dumps(s)  # plain JSON values
    assert run_summary("n-1")["metrics"]["llm.decision_flip"]["since_previous"] is None


def test_in_a_lake_a_regression_fails_the_gate_as_in_a_file(tmp_path, lake):
    """Shared mode: the regression rows and the gate's update are one DuckLake transaction."""
    ds = write_dataset(tmp_path / "d.jsonl", 40)
    cfg = {"num_pairs_per_dimension": 4, "dimensions": ["gender"]}
    run_all(make_spec(ds, name="lk", config=cfg), "lk-1")
    run_all(make_spec(ds, name="lk", sut=AGAINST_WOMEN, config=cfg, fail_on_regression=True), "lk-2")
    gender = _row(_rows("lk-2"), "score", "axis", "gender")
    assert gender["worse"] and gender["previous_run"] == "lk-1"
    ov = _overall("lk-2")
    assert not ov["passed"] and "regressed: gender flips rose" in ov["gate_reason"]
    assert not wh.default_path().exists()  # all of it in the lake
