"""A run's findings: what it found, in plain words, ranked (docs/concepts/findings.md).

Each metric says how its findings read (``Metric.findings``: a sentence with its numbers and
interval, two or three example rows); this module asks every metric of a run for them, over
short read-only warehouse connections, adds a finding for a failed gate that no finding of its
metric explains (its ``gate_reason``), and ranks them: failed gates first, then by effect size. A
metric with nothing notable gives no finding; a run with none says so where findings are shown.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from . import warehouse as wh
from .handover import Handover
from .metrics import get_metric
from .metrics.words import Evidence, Finding


@dataclass
class WarehouseEvidence:
    """The run's rows for one metric's findings, each query on its own short read-only connection."""

    run_id: str
    metric: str
    path: Path | None = None

    def query(self, sql: str, params: list[Any] | None = None) -> pd.DataFrame:
        df = wh.query(sql, params, self.path)
        return df.astype(object).where(df.notna(), None)


def rank(findings: list[Finding]) -> list[Finding]:
    """Failed gates first, then the larger effect, then by metric and sentence (a stable order)."""
    return sorted(findings, key=lambda f: (not f.gate_failed, -f.effect, f.metric, f.sentence))


def metric_findings(
    run_id: str, metric: str, scores: pd.DataFrame, path: Path | None = None, evidence: Evidence | None = None
) -> list[Finding]:
    """One metric's findings from its stored metric_scores (``scores``): its own
    (``Metric.findings``, reading its rows through ``evidence``, by default the warehouse at
    ``path``) and, when its gate failed and none of them is why, one naming the gate's reason. No
    overall row (not aggregated): no finding."""
    overall = scores[scores["scope"] == "overall"] if len(scores) else scores
    if not len(overall):
        return []
    out = list(get_metric(metric).findings(scores, evidence or WarehouseEvidence(run_id, metric, path)))
    ov = overall.iloc[0]
    passed = ov["passed"]
    out += since_previous(run_id, metric, ov, path)
    if (passed is None or pd.isna(passed) or not bool(passed)) and not any(f.gate_failed for f in out):
        out.append(
            Finding(
                metric,
                f"{metric} fails its gate: {ov['gate_reason'] or 'no gate recorded'}",
                True,
                0.0,
                {"score": ov.get("score"), "coverage": ov.get("coverage"), "threshold": ov.get("threshold")},
                scope="overall",
                group="all",
            )
        )
    return out


def since_previous(run_id: str, metric: str, overall, path: Path | None = None) -> list[Finding]:
    """The changes since the spec's previous run (``history``): each significant worsening (a failed
    gate when ``fail_on_regression`` failed it), and the SUT's drift: a model id or fingerprint
    that changed, decisions or verdicts that changed on the same probes."""
    from .history import stored

    if not wh.exists(path):  # findings of rows in memory (a metric's own tests)
        return []
    rows = stored(run_id, metric, path)
    if not len(rows):
        return []
    failed_by_it = "regressed:" in str(overall["gate_reason"] or "") and not bool(overall["passed"])
    out = []
    records = rows.to_dict("records")
    decided = any(r["kind"] == "drift" and r["scope"] == "decisions" for r in records)
    for r in records:
        if r["kind"] == "drift" and r["scope"] == "verdicts" and decided:
            continue  # the decisions say it (a changed verdict follows a changed decision)
        if r["kind"] == "score" and r["significant"]:  # worse (a failed gate with fail_on_regression), or better
            out.append(
                Finding(
                    metric,
                    r["sentence"][0].upper() + r["sentence"][1:] + ("" if r["worse"] else " (better)"),
                    failed_by_it and bool(r["worse"]),
                    abs(float(r["diff"])),
                    {"before": r["score_a"], "now": r["score_b"], "ci_low": r["ci_low"], "ci_high": r["ci_high"]},
                    scope=r["scope"],
                    group=r["group_key"],
                )
            )
        elif r["kind"] == "drift" and r["scope"] in ("model", "decisions", "verdicts") and r["score_b"]:
            out.append(
                Finding(
                    metric,
                    r["sentence"][0].upper() + r["sentence"][1:],
                    False,
                    0.0 if r["scope"] == "model" else float(r["score_b"]),
                    {"changed_share": r["score_b"]},
                    scope="drift",
                    group=r["scope"],
                )
            )
    return out


def run_findings(run_id: str, metrics: list[str] | None = None, path: Path | None = None) -> list[Finding]:
    """Every finding of a run (of ``metrics`` only, when given), ranked (:func:`rank`)."""
    scores = wh.query("SELECT * FROM metric_scores WHERE run_id = ? ORDER BY metric, scope, group_key", [run_id], path)
    scores = scores.astype(object).where(scores.notna(), None)
    out: list[Finding] = []
    for metric, part in scores.groupby("metric", sort=True) if len(scores) else ():
        if metrics is not None and metric not in metrics:
            continue
        out += metric_findings(run_id, str(metric), part.reset_index(drop=True), path)
    return rank(out)


# The findings an aggregation computed for its metadata in this process (assets.stages.score_metadata),
# by (run_id, metric): the warehouse they were read from (``source``) and the metric's findings,
# ranked. jobs._execute takes them for the metric's Outcome as its run ends, so that `aip-eval run`
# does not read them a third time (0.1 s of a small run) unless it has not every metric's.
_fresh = Handover()


def source(path: Path | None = None) -> str:
    """The warehouse a read of ``path`` (None: this process's default) reads: the lake, or the file."""
    from .warehouse import lake

    return lake.where() if lake.enabled() else str(Path(path or wh.default_path()).resolve())


def remember(run_id: str, metric: str, found: list[Finding]) -> None:
    """``found``: the findings of ``metric`` alone (``run_findings(run_id, [metric])``), just read
    from this process's default warehouse."""
    _fresh.put((run_id, metric), (source(), list(found)))


def take(run_id: str, metric: str) -> tuple[str, list[Finding]] | None:
    """The findings :func:`remember` kept for ``metric`` (and forgets them), or None."""
    return _fresh.take((run_id, metric))


def findings_of(
    run_id: str,
    metrics: list[str],
    path: Path | None = None,
    known: dict[str, tuple[str, list[Finding]]] | None = None,
) -> list[Finding]:
    """``run_findings(run_id, metrics, path)``: from ``known`` (metric -> its warehouse and its
    findings, as :func:`take` gives them) when it has every metric's, read from that warehouse, else
    read. The same list: each metric's findings are its own rows' (``metric_findings``), and
    :func:`rank` orders them by a key that names the metric (a stable sort: ties keep each metric's
    order)."""
    known = known or {}
    where = source(path) if metrics and all(m in known for m in metrics) else None
    if where is not None and all(known[m][0] == where for m in metrics):
        found = [f for m in metrics for f in known[m][1]]
        if all(math.isfinite(f.effect) for f in found):  # a NaN effect has no order: read them as always
            return rank(found)
    return run_findings(run_id, metrics, path)


def finding_lines(findings: list[dict[str, Any]]) -> list[str]:
    """The findings as text lines (the CLI summary's top, the aggregation's metadata): a numbered
    sentence each, ``FAIL`` on a failed gate, then its example rows."""
    if not findings:
        return ["Findings: none (no gate failed and no metric found an effect worth naming)"]
    lines = [f"Findings ({len(findings)}, failed gates first, then by effect size):"]
    for i, f in enumerate(findings, 1):
        mark = "FAIL" if f["severity"] == "fail" else "note"
        lines.append(f"{i:>3}. {mark}  {f['sentence']}  [{f['metric']}]")
        if f["examples"]:
            lines.append("       e.g. " + "; ".join(f"{e['input_id']} ({e['quote']})" for e in f["examples"]))
    return lines


def findings_markdown(findings: list[dict[str, Any]]) -> str:
    """The findings as a markdown list (Dagster metadata)."""
    if not findings:
        return "No findings: no gate failed and no effect worth naming."
    out = []
    for f in findings:
        mark = "**FAIL**" if f["severity"] == "fail" else "note"
        ex = "; ".join(f"`{e['input_id']}` ({e['quote']})" for e in f["examples"])
        out.append(f"- {mark} {f['sentence']}" + (f" — e.g. {ex}" if ex else ""))
    return "\n".join(out)
