"""The gates and words that read the claims (issue 35): equivalence within a margin, the
impact-ratio gate, the claims' policy (Holm or BH), and what a run can detect, said before its first
SUT call and in the dry run."""

from __future__ import annotations

import json

import pytest

from aip_assets import warehouse as wh
from aip_assets.errors import SpecError
from aip_assets.runspec import parse_spec
from aip_assets.summary import run_summary

from .conftest import make_spec, run_all, table, write_dataset

DF, GIB = "llm.decision_flip", "llm.group_interaction_bias"
GENDER = {"dimensions": ["gender"], "num_pairs_per_dimension": 4, "sub_call_concurrency_limit": 16}


def spec_with(ds, metric=DF, sut=None, claims=None, **entry):
    data = make_spec(ds, sut=sut).model_dump()
    data["metrics"] = {metric: entry}
    if claims is not None:
        data["claims"] = claims
    return parse_spec(data)


def overall(run_id: str):
    return table("metric_scores", run_id, "scope").query("scope == 'overall'").iloc[0]


def test_equivalence_needs_a_margin_and_a_margin_needs_equivalence(tmp_path):
    ds = write_dataset(tmp_path / "d.jsonl", 3)
    with pytest.raises(SpecError, match="gate_on: equivalence needs a margin"):
        spec_with(ds, gate_on="equivalence")
    with pytest.raises(SpecError, match="margin is read only with gate_on: equivalence"):
        spec_with(ds, margin=0.05)
    with pytest.raises(SpecError, match="min_impact_ratio: only llm.decision_flip take it"):
        spec_with(ds, metric=GIB, min_impact_ratio=0.8)


def test_equivalence_passes_only_an_excess_shown_within_the_margin(tmp_path):
    """A fair SUT that decides alike every time: no flip among persona or null pairs, so the excess's
    interval (one-sided at 0.05) is tight at 0 and lies within 0.1: no bias beyond the margin.
    A SUT that decides at random half the time: its excess is near 0 too, but its interval is wide,
    so it is not shown within the margin and the gate fails, saying so."""
    ds = write_dataset(tmp_path / "d.jsonl", 24)
    run_all(spec_with(ds, config=GENDER, baseline_share=0.5, gate_on="equivalence", margin=0.1), "fair")
    o = overall("fair")
    a = table("metric_scores", "fair", "scope").query("scope == 'axis'").iloc[0]
    assert o.passed, o.gate_reason
    assert (
        a.passed
        and "within the margin 0.100: no bias beyond it (its upper end: a one-sided test at 0.05)" in a.gate_reason
    )
    assert "90% interval" in a.gate_reason  # the upper end of the 90% interval: one-sided at 0.05
    noisy = {"provider": "builtin", "profile": {"name": "noisy", "noise_rate": 0.5}}
    run_all(spec_with(ds, sut=noisy, config=GENDER, baseline_share=0.5, gate_on="equivalence", margin=0.1), "noisy")
    o = overall("noisy")
    assert not o.passed and "gender: excess" in o.gate_reason and "not shown within the margin 0.100" in o.gate_reason


def test_equivalence_for_groups_holds_each_gap(tmp_path):
    ds = write_dataset(tmp_path / "d.jsonl", 24)
    cfg = {"num_pairs": 4, "persona_pool_size": 24, "sub_call_concurrency_limit": 16}
    terse = {"provider": "builtin", "profile": {"name": "terse", "terse_value": "Muslim"}}
    run_all(
        spec_with(ds, metric=GIB, sut=terse, config=cfg, baseline_share=0.25, gate_on="equivalence", margin=0.2),
        "gib",
        metric=GIB,
    )
    g = table("metric_scores", "gib", "scope, group_key").query("scope == 'group'").set_index("group_key")
    assert (
        not g.loc["religion=Muslim"].passed
        and "not shown within the margin 0.200" in g.loc["religion=Muslim"].gate_reason
    )
    o = overall("gib")
    assert not o.passed and "religion=Muslim: gap" in o.gate_reason


def test_the_impact_ratio_gate_names_the_value_below_it(tmp_path):
    """Women's favourable decisions turned at 0.9: their impact ratio (their favourable rate over the
    axis's highest, both over the same questions) is far below 0.8, the four-fifths rule, and only
    theirs; without the gate nothing fails on it, and the ratios are reported either way."""
    ds = write_dataset(tmp_path / "d.jsonl", 40)
    flip = {
        "provider": "builtin",
        "profile": {"name": "flip", "value": "woman", "axis": "gender", "p": 0.9, "directional": True},
    }
    run_all(spec_with(ds, sut=flip, config=GENDER, min_impact_ratio=0.8), "ir")
    o = overall("ir")
    assert not o.passed and "gender=woman: impact ratio" in o.gate_reason and "below 0.80" in o.gate_reason
    ir = wh.query("SELECT * FROM v_impact_ratios WHERE run_id = 'ir'", read_only=False).set_index("value")
    assert ir.loc["woman"].impact_ratio < 0.5 and not ir.loc["woman"].passed and ir.loc["woman"].min_impact_ratio == 0.8
    assert ir.drop(index="woman").passed.all() and (ir.drop(index="woman").impact_ratio > 0.8).all()
    assert ir.loc["woman"].ci_low <= ir.loc["woman"].impact_ratio <= ir.loc["woman"].ci_high
    summary = run_summary("ir")["metrics"][DF]
    by_group = {r["group"]: r for r in summary["impact_ratios"]}
    assert by_group["gender=woman"]["passed"] is False and by_group["gender=man"]["passed"] is True
    run_all(spec_with(ds, sut=flip, config=GENDER), "no-gate")
    assert "impact ratio" not in overall("no-gate").gate_reason


def test_bh_is_named_and_decides_the_claims(tmp_path):
    ds = write_dataset(tmp_path / "d.jsonl", 40)
    flip = {
        "provider": "builtin",
        "profile": {"name": "flip", "value": "woman", "axis": "gender", "p": 0.9, "directional": True},
    }
    run_all(spec_with(ds, sut=flip, config=GENDER, claims={"adjust": "bh", "alpha": 0.1}), "bh")
    d = json.loads(overall("bh").details)
    assert d["claims_policy"]["adjust"] == "bh" and "expected share of false claims" in d["claims_policy"]["words"]
    c = wh.query("SELECT * FROM v_claims WHERE run_id = 'bh'", read_only=False).set_index("claim")
    assert c.loc["favoured:gender=woman"].claimed
    # BH's adjusted p-values: the smallest p times m over its rank, the running minimum from the largest
    tested = c[c.p_value.notna() & c.not_tested_because.isna()]
    m = len(tested)
    ps = tested.p_value.sort_values()
    bh = [min(1.0, min(ps.iloc[k] * m / (k + 1) for k in range(i, m))) for i in range(m)]
    own = dict(zip(ps.index, bh))
    for claim, r in tested.iterrows():  # a value's claim also carries its axis's adjusted p
        parent = json.loads(r.details)["parent"]
        want = max(own[claim], own[parent]) if parent in own else own[claim]
        assert r.p_adjusted == pytest.approx(want), claim
    from aip_assets.metrics import REGISTRY

    text = "\n".join(REGISTRY[DF].format_summary(run_summary("bh")["metrics"][DF]))
    assert "BH p" in text and "(BH at 0.1: the expected share of false claims is about that" in text


def test_what_a_run_can_detect_is_said_before_its_first_sut_call(tmp_path, capsys):
    """At 12 questions the planned excess flip rate the run can show is far above the 0.1 that an
    axis_threshold of 0.9 fails: a warning in run_notes (stage sampling) before any SUT call, the
    same in the dry run, with the planned figures; and the summary says what the run could detect."""
    from aip_assets.cli import main

    ds = write_dataset(tmp_path / "d.jsonl", 12)
    spec = spec_with(ds, config=GENDER, baseline_share=0.25, threshold=0.9)
    run_all(spec, "small", stages=["ingest", "synthesis", "sampling"])
    notes = table("run_notes", "small", "code")
    warn = notes[notes.code == "underpowered"]
    assert len(warn) == 1 and warn.stage.iloc[0] == "sampling" and "axis_threshold 0.90" in warn.message.iloc[0]
    calls = table("llm_calls", "small", "call_key")
    assert len(calls) > 0  # the warning was written by the stage that then made the calls
    path = tmp_path / "spec.yaml"
    path.write_text(
        json.dumps({**spec.model_dump(mode="json", exclude_none=True), "dataset": str(ds)}), encoding="utf-8"
    )
    assert main(["run", str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "What llm.decision_flip can detect with 80% power" in out and "excess flip rate" in out
    assert "warning: llm.decision_flip: axis_threshold 0.90" in out
    run_all(spec, "small", stages=["judging", "aggregation"])
    s = run_summary("small")["metrics"][DF]
    assert s["detectable"]["observed"] and s["detectable"]["axes"]["gender"]["excess_flip_rate"] is not None


def test_a_pool_that_cannot_tell_values_apart_is_named_before_the_run(tmp_path):
    """Three personas: every value is held by one persona, so the four values of a persona move
    together and none can be told apart: the plan names them before any call, and the run never
    gates them."""
    ds = write_dataset(tmp_path / "d.jsonl", 8)
    cfg = {"num_pairs": 2, "persona_pool_size": 3, "sub_call_concurrency_limit": 8}
    terse = {"provider": "builtin", "profile": {"name": "terse", "terse_value": "Muslim"}}
    spec = spec_with(ds, metric=GIB, sut=terse, config=cfg, baseline_share=0.5, threshold=0.5)
    run_all(spec, "tiny", metric=GIB)
    notes = table("run_notes", "tiny", "code")
    assert "inseparable" in set(notes.code)
    g = table("metric_scores", "tiny", "scope, group_key").query("scope == 'group'")
    assert g.passed.isna().all() and g.gate_reason.str.contains("cannot be told apart").all()
