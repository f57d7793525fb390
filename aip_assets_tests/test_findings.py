"""Findings (findings.py, ``Metric.findings``) on hand-made rows, and the wording of exclusions:
a row whose units were all excluded (a refusal, an unreadable answer) is excluded under its
reason, never "errored"; progress lines count exclusions apart from failures."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import duckdb
import pandas as pd
import pytest

from aip_assets.findings import finding_lines, findings_markdown, metric_findings, rank
from aip_assets.metrics.consistency import SemanticConsistency, SemanticConsistencyConfig
from aip_assets.metrics.running import Progress, worst_outcome
from aip_assets.metrics.words import Finding, not_scored_phrase, row_reason
from aip_assets.stats import wilson

from .conftest import aggregate_tables, make_spec, rows_table, write_dataset

METRIC = "llm.semantic_consistency"


@dataclass
class FrameEvidence:
    """The run's rows from in-memory tables, queried with DuckDB as the warehouse would be."""

    tables: dict[str, list[dict]]
    run_id: str = "r"
    metric: str = METRIC
    asked: list[str] = field(default_factory=list)

    def query(self, sql, params=None):
        self.asked.append(sql)
        con = duckdb.connect()
        for name, rows in self.tables.items():
            con.register(name, pd.DataFrame([{"run_id": self.run_id, "metric": self.metric, **r} for r in rows]))
        df = con.execute(sql, params or []).df()
        return df.astype(object).where(df.notna(), None)


def semantic(tmp_path, judged: dict[str, list], threshold=None):
    """Aggregate semantic consistency over hand-made comparisons: ``judged`` maps a row to its
    comparisons, each a score or an exclusion status."""
    J = [
        {
            "judgement_id": f"{r}|{k}",
            "input_id": r,
            "status": "ok" if isinstance(x, float) else x,
            "score": x if isinstance(x, float) else None,
            "error": None if isinstance(x, float) else f"judge: {x}: no stance",
        }
        for r, xs in judged.items()
        for k, x in enumerate(xs, 1)
    ]
    probes = [
        {
            "input_id": r,
            "role": "variant",
            "category": "casual",
            "template_id": "t",
            "wrapper_id": None,
            "query_text": f"reworded question of {r}",
        }
        for r in judged
    ]
    spec = make_spec(write_dataset(tmp_path / "d.jsonl", 2))
    out = aggregate_tables(
        SemanticConsistency(),
        SemanticConsistencyConfig(),
        {"judgements": J, "probes": probes, "dataset_rows": rows_table(len(judged))},
        spec,
        METRIC,
        threshold=threshold,
    )
    return out, probes


def test_uneven_rows_with_an_excluded_row_give_one_contradiction_finding(tmp_path):
    """Comparisons planned 9, judged 6. r0: 0.2, 0.4 -> 0.3 Contradictory; r1: 0.9 and one unjudgeable -> 0.9 Consistent; r2: both
    comparisons unjudgeable (a refusal) -> no score, excluded (unjudgeable), not an error; r3: 0.7,
    0.5, 0.9 -> 0.7 Slightly Inconsistent. Scored rows 3, of them Contradictory 1: 1/3 with
    Wilson's interval; the example is r0 with its variant question."""
    out, probes = semantic(
        tmp_path, {"r0": [0.2, 0.4], "r1": [0.9, "unjudgeable"], "r2": ["unjudgeable"] * 2, "r3": [0.7, 0.5, 0.9]}
    )
    scores = pd.DataFrame(out["metric_scores"])
    d = json.loads(scores[scores.scope == "overall"].iloc[0]["details"])
    assert d["rows_excluded"] == {"unjudgeable": 1} and d["rows_errored"] == 0  # a refusal is no error
    s = SemanticConsistency().summary(scores)
    line = SemanticConsistency().format_summary(s)[0]
    assert "rows excluded 1 (unjudgeable 1)" in line and "errored" not in line
    evidence = FrameEvidence({"row_scores": out["row_scores"], "probes": probes})
    found = rank(metric_findings("r", METRIC, scores, evidence=evidence))
    # coverage 6 / 9 is below min_coverage 0.9: the gate fails, and no contradiction is why, so its
    # reason is a finding of its own, ranked first
    assert len(found) == 2 and found[0].gate_failed and found[0].scope == "overall"
    assert "coverage 0.667 below min_coverage 0.900" in found[0].sentence
    f = found[1]
    lo, hi = wilson(1, 3)
    assert f.numbers["contradictory"] == 1 and f.numbers["rows"] == 3 and f.numbers["ci95"] == [lo, hi]
    assert f.sentence == (
        f"The SUT contradicts itself when the question is reworded in 1 of 3 rows (33.3% [{100 * lo:.1f}%, "
        f"{100 * hi:.1f}%])"
    )
    assert f.examples == ("r0",) and f.quotes == ("[casual] reworded question of r0",)
    assert not f.gate_failed and f.severity == "notice"  # no threshold: the gate did not fail on it
    assert f.to_dict()["examples"] == [{"input_id": "r0", "quote": "[casual] reworded question of r0"}]


def test_a_metric_with_nothing_to_report_gives_no_finding_and_a_failed_gate_always_gives_one(tmp_path):
    # every row consistent, gate passed: no finding (not a "passes" line)
    out, probes = semantic(tmp_path, {"r0": [0.9, 1.0], "r1": [0.95]})
    scores = pd.DataFrame(out["metric_scores"])
    assert bool(scores[scores.scope == "overall"].iloc[0]["passed"])
    assert (
        metric_findings(
            "r", METRIC, scores, evidence=FrameEvidence({"row_scores": out["row_scores"], "probes": probes})
        )
        == []
    )
    # the same rows held to 0.99: the gate fails, no contradiction explains it, so its reason is the finding
    out, probes = semantic(tmp_path, {"r0": [0.9, 1.0], "r1": [0.95]}, threshold=0.99)
    scores = pd.DataFrame(out["metric_scores"])
    found = metric_findings(
        "r", METRIC, scores, evidence=FrameEvidence({"row_scores": out["row_scores"], "probes": probes})
    )
    assert len(found) == 1 and found[0].gate_failed and found[0].scope == "overall"
    assert found[0].sentence.startswith(f"{METRIC} fails its gate: score 0.950 below threshold 0.990")
    # a contradiction under a failed threshold is why the gate failed: no second, generic finding
    out, probes = semantic(tmp_path, {"r0": [0.2, 0.4], "r1": [0.95]}, threshold=0.99)
    scores = pd.DataFrame(out["metric_scores"])
    found = metric_findings(
        "r", METRIC, scores, evidence=FrameEvidence({"row_scores": out["row_scores"], "probes": probes})
    )
    assert [f.gate_failed for f in found] == [True] and "1 of 2 rows" in found[0].sentence


def test_rank_puts_failed_gates_first_then_the_larger_effect():
    small_fail = Finding("m.a", "a gate", True, 0.01)
    big_note = Finding("m.b", "a big effect", False, 0.9)
    mid_note = Finding("m.c", "a mid effect", False, 0.4)
    big_fail = Finding("m.d", "a big gate", True, 0.3)
    assert rank([mid_note, small_fail, big_note, big_fail]) == [big_fail, small_fail, big_note, mid_note]
    lines = finding_lines([f.to_dict() for f in rank([big_note, small_fail])])
    assert lines[1].startswith("  1. FAIL  a gate") and lines[2].startswith("  2. note  a big effect")
    assert finding_lines([])[0].startswith("Findings: none")
    md = findings_markdown([Finding("m.a", "x", True, 0.1, examples=("r1",), quotes=("q",)).to_dict()])
    assert md == "- **FAIL** x — e.g. `r1` (q)"


def test_the_aggregations_findings_are_the_runs_only_when_every_metric_has_them_from_that_warehouse(
    tmp_path, monkeypatch
):
    import aip_assets.findings as fnd

    # two metrics' findings, each ranked by its aggregation; ties within a metric keep their order
    a = [Finding("m.a", "a gate", True, 0.2), Finding("m.a", "a tie", False, 0.3), Finding("m.a", "a tie", False, 0.3)]
    b = [Finding("m.b", "b effect", False, 0.5), Finding("m.b", "b gate", True, 0.2)]
    read = []
    monkeypatch.setattr(fnd, "run_findings", lambda run_id, metrics, path=None: read.append(metrics) or ["read"])
    monkeypatch.setattr(fnd, "source", lambda path=None: f"file {path}")
    known = {"m.a": ("file None", fnd.rank(a)), "m.b": ("file None", fnd.rank(b))}
    got = fnd.findings_of("r", ["m.b", "m.a"], None, known)
    assert got == rank(a + b) == [a[0], b[1], b[0], a[1], a[2]] and got[3] is a[1] and read == []
    assert fnd.findings_of("r", ["m.a", "m.c"], None, known) == ["read"]  # one metric's not kept: read
    assert fnd.findings_of("r", ["m.a"], tmp_path, known) == ["read"]  # another warehouse: read
    nan = {"m.a": ("file None", [Finding("m.a", "x", False, float("nan"))])}
    assert fnd.findings_of("r", ["m.a"], None, nan) == ["read"]  # no order for NaN: read
    assert fnd.findings_of("r", [], None, known) == ["read"] and len(read) == 4
    # kept by the aggregation of this process, taken once
    fnd.remember("r", "m.a", a)
    assert fnd.take("r", "m.a") == ("file None", a) and fnd.take("r", "m.a") is None


def test_a_row_is_excluded_under_its_reason_and_only_failures_are_errors():
    assert row_reason(["unjudgeable", "unjudgeable"]) == "unjudgeable"
    assert row_reason(["ok", "empty_answer", "unjudgeable", "empty_answer"]) == "empty_answer"  # the most frequent
    assert row_reason(["unjudgeable", "judge_failed"]) == "judge_failed"  # a failure first
    assert row_reason(["judge_failed", "sut_failed"]) == "sut_failed"
    assert row_reason([]) == "not_judged"
    assert not_scored_phrase("rows", {"unjudgeable": 1}) == "rows excluded 1 (unjudgeable 1)"
    # rows stored as error are failed, not excluded (issue 36)
    assert not_scored_phrase("groups", {"unjudgeable": 1, "judge_failed": 2, "sut_failed": 1}) == (
        "groups failed 3 (judge_failed 2, sut_failed 1), groups excluded 1 (unjudgeable 1)"
    )
    assert not_scored_phrase("rows", {"judge_failed": 2}) == "rows failed 2 (judge_failed 2)"
    assert not_scored_phrase("rows", None) == "rows excluded 0"


def test_progress_counts_exclusions_apart_from_failures():
    logged: list[str] = []
    p = Progress("judging", 5, logged.append, every_s=0)  # a line at every tick
    for outcome in ("unjudgeable", "empty", "ok", True, "judge_failed"):
        p.tick(outcome)
    assert logged[-1].startswith("judging: 5/5 done, 0 in flight, 1 failed, 2 excluded, ")
    q = Progress("SUT sampling", 2, logged.append, every_s=0)
    q.tick(False), q.tick("error")
    assert "2 failed, 0 excluded" in logged[-1]
    assert worst_outcome(["ok", "unjudgeable", "judge_failed"]) == "judge_failed"
    assert worst_outcome(["ok", "empty"]) == "empty" and worst_outcome(["ok"]) == "ok"
    assert worst_outcome(["unjudgeable", "ok"], any_ok=True) == "ok"


@pytest.mark.parametrize("status", ["unjudgeable", "empty_answer"])
def test_the_summary_never_calls_an_excluded_row_errored(tmp_path, status):
    out, _ = semantic(tmp_path, {"r0": [0.9], "r1": [status]})
    s = SemanticConsistency().summary(pd.DataFrame(out["metric_scores"]))
    assert s["rows_errored"] == 0 and s["rows_excluded"] == {status: 1}
    assert "errored" not in "\n".join(SemanticConsistency().format_summary(s))
    out, _ = semantic(tmp_path, {"r0": [0.9], "r1": ["judge_failed"]})
    s = SemanticConsistency().summary(pd.DataFrame(out["metric_scores"]))
    assert s["rows_errored"] == 1 and s["rows_excluded"] == {"judge_failed": 1}
