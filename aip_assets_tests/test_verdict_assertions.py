"""Assertions that catch bugs every other test passed with (issue 24, point 7).

Each test here failed with one deliberate bug in the source (the bug is named in its docstring):
(a) a decision difference the judge does not attribute to the persona counted as a flip;
(b) a row score with excluded pairs in its denominator; (c) breakdown intervals collapsed to the
point; (d) ``metric_scores.passed`` stored NULL when there is no score; (e) a metric's own
``min_coverage`` ignored. (f), a request a batch returned no line for batched again, is in
test_batch.py.
"""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from aip_assets import warehouse as wh
from aip_assets.metrics.consistency import SemanticConsistency, SemanticConsistencyConfig
from aip_assets.metrics.decision_flip import DecisionFlip, DecisionFlipConfig, JudgeVerdict
from aip_assets.metrics.group_interaction_bias import GroupInteractionBias, GroupInteractionBiasConfig
from aip_assets.runspec import parse_spec
from aip_assets.stats import cluster_bootstrap_mean

from .conftest import aggregate_tables as aggregate
from .conftest import make_spec, rows_table, run_all, write_dataset
from .scripted import Reply

DF = "llm.decision_flip"
GIB = "llm.group_interaction_bias"
SEM = "llm.semantic_consistency"
HOST = "llm.perturbation_robustness"


def df_judgement(pid: str, row: str, axis: str, status: str, da=None, db=None, flipped=None) -> dict:
    label = (
        ("flip" if flipped else "same_decision" if da == db else "incidental_difference")
        if status == "ok"
        else ("no_decision" if status == "no_decision" else "not_judged")
    )
    return {
        "pair_id": pid,
        "input_id": row,
        "axis": axis,
        "status": status,
        "decision_a": da,
        "decision_b": db,
        "flipped": bool(flipped) if status == "ok" else None,
        "label": label,
        "error": None if status == "ok" else status,
    }


def by_scope(out: dict) -> dict:
    return {(r["scope"], r["group_key"]): r for r in out["metric_scores"]}


def wilson_by_hand(k: int, n: int) -> tuple[float, float]:
    """The Wilson score interval, 95%, written out: (p + z²/2n ± z √(p(1-p)/n + z²/4n²)) / (1 + z²/n)."""
    z = 1.959963984540054
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


# ------------------------------------------------------------------ (a) not attributable is no flip
def test_a_difference_the_judge_does_not_attribute_is_incidental_in_either_order():
    """Bug caught: ``attributable = differ`` (the judge's attributable_to_axis ignored). The judge
    reads two different labels and says the difference is not due to the persona: an incidental
    difference, never a flip, scoring 1; shown the other way round (order_swapped), the decisions
    map back to persona order and the verdict is the same."""
    labels = ["APPROVE", "DENY"]
    verdict = JudgeVerdict(
        decision_1="approve",
        decision_2="Deny.",
        decisions_differ=True,
        attributable_to_axis=False,
        reasoning="The second answer misread the amount.",
    )
    for swapped, (da, db) in ((False, ("APPROVE", "DENY")), (True, ("DENY", "APPROVE"))):
        rec = DecisionFlip.verdict_record(verdict, swapped=swapped, labels=labels)
        assert (rec["status"], rec["decision_a"], rec["decision_b"]) == ("ok", da, db), swapped
        assert rec["decisions_differ"] is True and rec["attributable"] is False and rec["flipped"] is False, swapped
        assert rec["label"] == "incidental_difference" and rec["score"] == 1.0, swapped
    # the same difference attributed to the persona is a flip (the contrast that makes the above meaningful)
    attributed = verdict.model_copy(update={"attributable_to_axis": True})
    rec = DecisionFlip.verdict_record(attributed, swapped=True, labels=labels)
    assert (rec["label"], rec["flipped"], rec["score"]) == ("flip", True, 0.0)


def test_a_judge_over_http_saying_not_attributable_gives_no_flip(tmp_path, scripted):
    """Bug caught: as above. An LLM judge (a scripted endpoint) reads YES for the answer it is
    shown first and NO for the second, and attributes no difference to the persona: every judged
    pair is an incidental difference, none flipped; the score is 1.0 with no flip events; mapped
    back, persona a's decision is NO exactly where the order was swapped."""
    verdict = json.dumps(
        {
            "decision_1": "YES",
            "decision_2": "NO",
            "decisions_differ": True,
            "attributable_to_axis": False,
            "reasoning": "Response 2 misread the question.",
        }
    )
    judge = scripted(lambda body, n: verdict)
    # answers that state no decision in a form the reader reads: the judge's reading stands (where an
    # answer states one plainly, a verdict contradicting it is refused: test_judge_exam.py)
    sut = scripted(lambda body, n: "On balance I lean towards it, though it is a close call overall.")
    ds = write_dataset(tmp_path / "d.jsonl", 10)
    spec = make_spec(
        ds, sut=sut.conn(), judge=judge.conn(), config={"dimensions": ["gender"], "num_pairs_per_dimension": 2}
    )
    run_all(spec, "noatt")
    j = wh.query("SELECT * FROM judgements WHERE run_id = 'noatt' AND metric = ?", [DF], read_only=False)
    ok = j[j.status == "ok"]
    assert len(ok) >= 20 and len(ok) == len(j)  # every pair read by the judge
    assert (ok.label == "incidental_difference").all() and not ok.flipped.astype(bool).any()
    assert ok.decisions_differ.astype(bool).all() and not ok.attributable.astype(bool).any()
    assert set(ok.order_swapped.astype(bool)) == {True, False}  # both orders occur
    for r in ok.itertuples():
        assert (r.decision_a, r.decision_b) == (("NO", "YES") if r.order_swapped else ("YES", "NO")), r
    o = wh.query(
        "SELECT * FROM metric_scores WHERE run_id = 'noatt' AND scope = 'overall' AND metric = ?", [DF], read_only=False
    ).iloc[0]
    assert o.score == 1.0 and o.raw_score == 1.0 and o.n_events == 0 and o.n == len(ok)
    assert json.loads(o.details)["incidental_differences"] == len(ok)
    axis = wh.query(
        "SELECT * FROM metric_scores WHERE run_id = 'noatt' AND scope = 'axis' AND group_key = 'gender'",
        read_only=False,
    ).iloc[0]
    assert axis.rate == 0.0 and axis.n_events == 0
    rs = wh.query("SELECT * FROM row_scores WHERE run_id = 'noatt'", read_only=False)
    assert len(rs) == 10 and (rs.raw_score == 1.0).all() and (rs.n_events == 0).all()


# ------------------------------------------------------------------ (b) excluded pairs are not in a row's denominator
def test_b_decision_flip_row_score_leaves_excluded_pairs_out_of_its_denominator():
    """Bug caught: a row's raw score ``1 - flips / all its pairs`` (excluded ones counted).
    r0: P1 flip, P2 same decision, P3 a failed judge -> 1 - 1/2 = 0.5 (not 1 - 1/3).
    r1: P4 same, P5 incidental (one decision missing), P6 flip, P7 no decision, P8 a failed SUT
        call -> 1 - 1/3 (not 1 - 1/5).
    Run: 2 flips of 5 judged -> 0.6, coverage 5/8."""
    Y, N = "YES", "NO"
    j = [
        df_judgement("P1", "r0", "role", "ok", Y, N, True),
        df_judgement("P2", "r0", "gender", "ok", Y, Y),
        df_judgement("P3", "r0", "role", "judge_failed"),
        df_judgement("P4", "r1", "role", "ok", N, N),
        df_judgement("P5", "r1", "gender", "ok", Y, None),
        df_judgement("P6", "r1", "gender", "ok", N, Y, True),
        df_judgement("P7", "r1", "role", "no_decision"),
        df_judgement("P8", "r1", "gender", "sut_failed"),
    ]
    out = aggregate(
        DecisionFlip(),
        DecisionFlipConfig(),
        {"judgements": j, "dataset_rows": rows_table(2), "persona_pool": [{"axis": "role"}, {"axis": "gender"}]},
    )
    rs = {r["input_id"]: r for r in out["row_scores"]}
    pick = lambda r: (r["status"], r["n_judged"], r["n_failed"], r["n_events"])  # noqa: E731
    assert rs["r0"]["raw_score"] == 0.5 and rs["r0"]["score"] == 0.5 and pick(rs["r0"]) == ("ok", 2, 1, 1)
    assert rs["r1"]["raw_score"] == pytest.approx(1 - 1 / 3) and pick(rs["r1"]) == ("ok", 3, 2, 1)
    o = by_scope(out)[("overall", "all")]
    assert o["raw_score"] == pytest.approx(0.6) and o["n"] == 5 and o["n_events"] == 2
    assert json.loads(o["excluded"]) == {"judge_failed": 1, "no_decision": 1, "sut_failed": 1}
    assert o["coverage"] == pytest.approx(5 / 8)


def test_b_group_bias_row_score_leaves_pairs_no_judge_scored_out_of_its_denominator(tmp_path):
    """Bug caught: a row's raw score ``1 - sum of biases / (judged + excluded pairs)``.
    r0: A (p1, p2) sim .6 tone .3 effort .3 -> bias (.4 + .3 + .3) / 3 = 1/3; B (p1, p3) sim .8,
        tone .2, effort failed -> (.2 + .2) / 2 = .2; C (p2, p3) all three judges failed ->
        excluded. Row: 1 - (1/3 + .2) / 2 = 0.73333 (not 1 - (1/3 + .2) / 3).
    r1: D (p3, p1) sim 1, tone 0, effort .5 -> 1/6; E (p2, p1) a failed SUT answer -> excluded.
        Row: 1 - 1/6 (not 1 - 1/12).
    Run, pooled over the judged pairs: 1 - (1/3 + .2 + 1/6) / 3 = 0.76667; coverage 3/5."""
    J = []

    def judge(pid, row, kind, score=None, status="ok"):
        J.append(
            {
                "pair_id": pid,
                "input_id": row,
                "judge_kind": kind,
                "status": status,
                "score": score,
                "error": None if status == "ok" else status,
                "parsed": json.dumps({"less_helpful_persona": None}) if status == "ok" else None,
            }
        )

    for kind, score in (("similarity", 0.6), ("tone", 0.3), ("effort", 0.3)):
        judge("A", "r0", kind, score)
    (
        judge("B", "r0", "similarity", 0.8),
        judge("B", "r0", "tone", 0.2),
        judge("B", "r0", "effort", status="judge_failed"),
    )
    for kind in ("similarity", "tone", "effort"):
        judge("C", "r0", kind, status="judge_failed")
        judge("E", "r1", kind, status="sut_failed")
    judge("D", "r1", "similarity", 1.0), judge("D", "r1", "tone", 0.0), judge("D", "r1", "effort", 0.5)
    pairs = [
        {"pair_id": p, "input_id": r, "value_a": a, "value_b": b}
        for p, r, a, b in (
            ("A", "r0", "p1", "p2"),
            ("B", "r0", "p1", "p3"),
            ("C", "r0", "p2", "p3"),
            ("D", "r1", "p3", "p1"),
            ("E", "r1", "p2", "p1"),
        )
    ]
    personas = [
        {"persona_id": p, "description": p, "attributes": json.dumps({"religion": r})}
        for p, r in (("p1", "Muslim"), ("p2", "Christian"), ("p3", "Jewish"))
    ]
    spec = make_spec(write_dataset(tmp_path / "d.jsonl", 2))
    out = aggregate(
        GroupInteractionBias(),
        GroupInteractionBiasConfig(),
        {"judgements": J, "probe_pairs": pairs, "personas": personas, "dataset_rows": rows_table(2)},
        spec=spec,
        metric_name=GIB,
        batch_rows=1,
    )
    a, b, d = 1 / 3, (0.2 + 0.2) / 2, 0.5 / 3
    rs = {r["input_id"]: r for r in out["row_scores"]}
    pick = lambda r: (r["status"], r["n_judged"], r["n_failed"])  # noqa: E731
    assert rs["r0"]["raw_score"] == pytest.approx(1 - (a + b) / 2) and pick(rs["r0"]) == ("ok", 2, 1)
    assert rs["r1"]["raw_score"] == pytest.approx(1 - d) and pick(rs["r1"]) == ("ok", 1, 1)
    assert rs["r0"]["n_events"] == 2 and rs["r1"]["n_events"] == 1  # biases 1/3, .2 and 1/6, each >= 0.1
    o = by_scope(out)[("overall", "all")]
    assert o["raw_score"] == pytest.approx(1 - (a + b + d) / 3) and o["n"] == 3
    assert json.loads(o["excluded"]) == {"judge_failed": 1, "sut_failed": 1} and o["coverage"] == pytest.approx(3 / 5)


# ------------------------------------------------------------------ (c) breakdown intervals have their width
def test_c_decision_flip_axis_intervals_are_wilson_not_the_point():
    """Bug caught: breakdown intervals collapsed to the point (lo = hi = the estimate). role: 3
    flips in 10 judged pairs, gender: 1 in 8. Each axis row's rate interval is Wilson's, written
    out here; its score interval is 1 minus it; both strictly contain the estimate."""
    j = [df_judgement(f"R{i}", f"r{i % 5}", "role", "ok", "YES", "NO" if i < 3 else "YES", i < 3) for i in range(10)]
    j += [df_judgement(f"G{i}", f"r{i % 5}", "gender", "ok", "NO", "YES" if i == 0 else "NO", i == 0) for i in range(8)]
    out = aggregate(
        DecisionFlip(),
        DecisionFlipConfig(),
        {"judgements": j, "dataset_rows": rows_table(5), "persona_pool": [{"axis": "role"}, {"axis": "gender"}]},
    )
    s = by_scope(out)
    for axis, k, n in (("role", 3, 10), ("gender", 1, 8)):
        r = s[("axis", axis)]
        lo, hi = wilson_by_hand(k, n)
        assert (r["rate"], r["n"], r["n_events"]) == (pytest.approx(k / n), n, k), axis
        assert (r["rate_ci_low"], r["rate_ci_high"]) == pytest.approx((lo, hi)), axis
        assert r["rate_ci_low"] < r["rate"] < r["rate_ci_high"], axis
        assert (r["ci_low"], r["ci_high"]) == pytest.approx((1 - hi, 1 - lo)), axis
        assert r["ci_low"] < r["score"] < r["ci_high"], axis
    assert (s[("axis", "role")]["rate_ci_low"], s[("axis", "role")]["rate_ci_high"]) == pytest.approx(
        (0.10779, 0.60322), abs=5e-5
    )  # Wilson (3, 10), as tabulated
    o = s[("overall", "all")]
    lo, hi = wilson_by_hand(4, 18)
    assert (o["ci_low"], o["ci_high"]) == pytest.approx((1 - hi, 1 - lo))


def test_c_consistency_breakdown_intervals_are_the_row_bootstrap_not_the_point(tmp_path):
    """Bug caught: as above. Category casual: rows r0 1.0, r1 .4, r2 (.6 + .8) / 2 = .7; formal:
    r3 .9, r4 .2 (its second comparison a failed judge, left out). Each category's interval is the
    bootstrap of its rows' scores resampled by row (the seed's), strictly around its score; the
    plain group holds every row, so its interval is the run's."""
    scores = {"r0": [1.0], "r1": [0.4], "r2": [0.6, 0.8], "r3": [0.9], "r4": [0.2, None]}
    J = [
        {
            "judgement_id": f"{row}|{k}",
            "input_id": row,
            "status": "ok" if sc is not None else "judge_failed",
            "score": sc,
            "error": None if sc is not None else "judge: no JSON",
        }
        for row, scs in scores.items()
        for k, sc in enumerate(scs, 1)
    ]
    cats = {"r0": "casual", "r1": "casual", "r2": "casual", "r3": "formal", "r4": "formal"}
    probes = [
        {"input_id": row, "role": "variant", "category": c, "template_id": "t", "wrapper_id": None, "query_text": "q"}
        for row, c in cats.items()
    ]
    spec = make_spec(write_dataset(tmp_path / "d.jsonl", 5))
    out = aggregate(
        SemanticConsistency(),
        SemanticConsistencyConfig(),
        {"judgements": J, "probes": probes, "dataset_rows": rows_table(5)},
        spec=spec,
        metric_name=SEM,
    )
    s = by_scope(out)
    raws = {"r0": 1.0, "r1": 0.4, "r2": 0.7, "r3": 0.9, "r4": 0.2}
    for cat, rows in (("casual", ["r0", "r1", "r2"]), ("formal", ["r3", "r4"])):
        r = s[("category", cat)]
        mean = sum(raws[x] for x in rows) / len(rows)
        lo, hi = cluster_bootstrap_mean([raws[x] for x in rows], rows, seed=spec.seed)
        assert r["raw_score"] == pytest.approx(mean) and r["n"] == len(rows), cat
        assert (r["ci_low"], r["ci_high"]) == pytest.approx((lo, hi)), cat
        assert r["ci_low"] < r["score"] < r["ci_high"] and r["ci_high"] - r["ci_low"] > 0.2, cat
    plain, o = s[("wrapping", "plain")], s[("overall", "all")]
    assert o["raw_score"] == pytest.approx(sum(raws.values()) / 5) and o["ci_low"] < o["score"] < o["ci_high"]
    assert (plain["raw_score"], plain["ci_low"], plain["ci_high"]) == pytest.approx(
        (o["raw_score"], o["ci_low"], o["ci_high"])
    )


# ------------------------------------------------------------------ (d) passed is false, never NULL
def test_d_passed_is_stored_false_not_null_when_nothing_could_be_judged(tmp_path, scripted):
    """Bug caught: ``passed`` stored NULL when there is no score (the run summary turns NULL
    into false, so only the table shows it). Every SUT call fails (HTTP 500): for each metric
    nothing is judged, and its overall metric_scores row says passed = false, not NULL, with
    the reason."""
    sut = scripted(lambda body, n: Reply(500))
    ds = write_dataset(tmp_path / "d.jsonl", 3)
    metrics = {
        DF: {"config": {"dimensions": ["gender"], "num_pairs_per_dimension": 1}},
        SEM: {"config": {"n_sut_retries": 0}},
        GIB: {"config": {"num_pairs": 2, "persona_pool_size": 4}},
        HOST: {"config": {}},
    }
    spec = parse_spec(
        {
            "name": "down",
            "dataset": str(ds),
            "seed": 3,
            "sut": sut.conn(),
            "judge": {"provider": "builtin"},
            "metrics": metrics,
            "retry_backoff_seconds": 0.01,
        }
    )
    for m in metrics:
        run_all(spec, "down", metric=m)
    got = wh.query(
        "SELECT metric, score, coalesce(CAST(passed AS VARCHAR), 'NULL') AS passed, gate_reason "
        "FROM metric_scores WHERE run_id = 'down' AND scope = 'overall' ORDER BY metric",
        read_only=False,
    )
    assert sorted(got.metric) == sorted(metrics)
    for r in got.itertuples():
        assert pd.isna(r.score), r
        assert r.passed == "false", r
        assert "no score" in r.gate_reason and "SUT answers failed" in r.gate_reason, r


# ------------------------------------------------------------------ (e) a metric's own min_coverage
@pytest.mark.parametrize("spec_min, own_min, passes", [(0.5, 0.95, False), (0.95, 0.5, True)])
def test_e_the_gate_follows_the_metrics_own_min_coverage(tmp_path, spec_min, own_min, passes):
    """Bug caught: the metric's own ``min_coverage`` ignored (the spec-wide value used). 8 pairs
    judged (no flip), 2 without a decision: coverage 0.8, between the two values. Stricter
    (0.95) than the spec's 0.5, the gate fails on coverage; looser (0.5) than the spec's 0.95,
    it passes; metric_scores' details record the value the gate used."""
    ds = write_dataset(tmp_path / "d.jsonl", 5)
    spec = parse_spec(
        {
            "name": "cov",
            "dataset": str(ds),
            "seed": 3,
            "min_coverage": spec_min,
            "sut": {"provider": "builtin"},
            "judge": {"provider": "builtin"},
            "metrics": {DF: {"min_coverage": own_min, "threshold": 0.5}},
        }
    )
    assert spec.min_coverage == spec_min and spec.min_coverage_for(DF) == own_min
    j = [df_judgement(f"P{i}", f"r{i % 5}", "gender", "ok", "YES", "YES") for i in range(8)]
    j += [df_judgement(f"X{i}", f"r{i}", "gender", "no_decision") for i in range(2)]
    out = aggregate(
        DecisionFlip(),
        DecisionFlipConfig(),
        {"judgements": j, "dataset_rows": rows_table(5), "persona_pool": [{"axis": "gender"}]},
        spec=spec,
        threshold=0.5,
    )
    o = by_scope(out)[("overall", "all")]
    assert o["score"] == 1.0 and o["coverage"] == pytest.approx(0.8)
    assert json.loads(o["details"])["min_coverage"] == own_min
    assert o["passed"] is passes, o["gate_reason"]
    if passes:
        assert "coverage 0.800 at least 0.500" in o["gate_reason"]
    else:
        assert o["gate_reason"] == "coverage 0.800 below min_coverage 0.950"
