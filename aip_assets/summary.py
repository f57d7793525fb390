"""A run's results read back: each metric's headline numbers and its gate (``run_summary``, what
``aip-eval run`` prints and ``--json`` gives), with the change since the spec's previous run
(``since_previous_json``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from . import warehouse as wh
from .judge_exam import reading_checks
from .judge_exam import stored as stored_exam
from .metrics import get_metric
from .pipeline import builtin_judge_note, load_run, with_panel
from .preflight import structured_summary


def run_summary(run_id: str, path: Path | None = None, metrics: list[str] | None = None) -> dict[str, Any]:
    """Each metric's headline numbers and its gate: ``passed`` true or false with ``gate_reason``;
    a metric that was not aggregated has ``passed`` false too. ``metrics``: only these (``aip-eval
    run --metric``), else every metric of the run."""
    spec, rec = load_run(run_id, path)
    out: dict[str, Any] = {"run_id": run_id, "spec": spec.name, "dataset": spec.dataset, "metrics": {}}
    shown = [m for m in spec.metrics if metrics is None or m in metrics]
    notes = [builtin_judge_note(spec, get_metric(m)) for m in shown]
    if any(notes):
        out["judge_note"] = next(n for n in notes if n)
    forms = structured_summary(spec, run_id, path)
    if forms:
        out["structured_output"] = forms
    exams = [e for e in stored_exam(run_id, path) if e["metric"] in shown]
    if exams:
        out["judge_exam"] = exams
    for metric in shown:
        scores = wh.read_partition("metric_scores", run_id, metric, path)
        if scores.empty:
            out["metrics"][metric] = {
                "status": "not aggregated",
                "score": None,
                "passed": False,
                "gate_reason": "not aggregated: a stage failed or has not run",
            }
            continue
        s = with_panel(get_metric(metric).summary(scores), scores)
        ov = scores[scores["scope"] == "overall"].iloc[0]
        s["threshold"] = None if ov["threshold"] is None or pd.isna(ov["threshold"]) else float(ov["threshold"])
        s["passed"] = bool(ov["passed"]) if ov["passed"] is not None else False
        s["gate_reason"] = ov["gate_reason"] or "no gate recorded (aggregated by an older version): re-run aggregation"
        s["coverage"] = None if ov["coverage"] is None or pd.isna(ov["coverage"]) else float(ov["coverage"])
        s["n_planned"] = None if ov["n_planned"] is None else int(ov["n_planned"])
        s["excluded"] = json.loads(ov["excluded"]) if ov["excluded"] else {}
        s["metric_name"] = ov["metric_name"]
        if notes[shown.index(metric)]:
            s["judge"] = "builtin (heuristic reader for the offline rig)"
        if reading := reading_checks(run_id, metric, path):
            s["judge_reading"] = reading
        s["since_previous"] = since_previous_json(run_id, metric, path)
        out["metrics"][metric] = s
    return out


def since_previous_json(run_id: str, metric: str, path: Path | None = None) -> dict[str, Any] | None:
    """The metric against the spec's previous run (``history``), for ``--json``: which run, each
    significant change (its figures, interval, adjusted p, whether worse, the sentence) and the
    drift; None when there was no previous run."""
    from .history import stored

    rows = stored(run_id, metric, path)
    if not len(rows):
        return None
    recs = rows.to_dict("records")
    keep = ("scope", "group_key", "score_a", "score_b", "diff", "ci_low", "ci_high", "p_adjusted", "worse", "sentence")
    return {
        "previous_run": recs[0]["previous_run"],
        "alpha": recs[0]["alpha"],
        "tests": sum(1 for r in recs if r["kind"] == "score" and r["p_value"] is not None),
        "changes": [{k: r[k] for k in keep} for r in recs if r["kind"] == "score" and r["significant"]],
        "drift": {
            r["scope"]: {
                "changed_share": r["score_b"],
                "common": r["n_b"],
                "sentence": r["sentence"],
                **({"details": json.loads(r["details"] or "{}")} if r["scope"] == "model" else {}),
            }
            for r in recs
            if r["kind"] == "drift"
        },
    }
