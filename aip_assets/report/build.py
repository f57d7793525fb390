"""The report for one run as one self-contained HTML document, written beside the warehouse (and
kept in a lake's ``reports`` table)."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from markupsafe import Markup

from .. import __version__
from .. import warehouse as wh
from ..errors import AipError
from ..findings import run_findings
from ..metrics.words import Finding
from ..warehouse import lake
from . import history, queries, viewer
from .queries import _Reader, _warehouse_path
from .sections import _findings, _header, _metric_section, _overview, cost
from .templating import render, static
from .values import _json

# a run's findings already computed for a set of metrics: (those metrics, their findings, ranked)
Findings = tuple[frozenset[str], list[Finding]]


def build_report(
    run_id: str,
    path: str | Path | None = None,
    rows_per_metric: int = viewer.ROWS_PER_METRIC,
    findings: Findings | None = None,
) -> str:
    """The report for ``run_id`` as one self-contained HTML document; the sample viewer embeds at most
    ``rows_per_metric`` rows of each metric (the lowest scores first). ``findings``: the run's
    findings of a set of metrics, computed a moment before from the same warehouse (the
    aggregation's, for its metadata): the report takes them when its metrics are that set."""
    db = _warehouse_path(path)
    if not wh.exists(db):
        raise AipError(f"{db}: no warehouse yet; run `aip-eval run <spec>` first")

    # one connection for the report's many queries, at the lean memory cap: its scans of a large
    # run's tables otherwise filled DuckDB's cache to its 1 GB limit (1.2 GB peak at 100,000 rows,
    # 590 MB at the lean cap, as fast)
    def build(config: dict[str, Any] | None) -> str:
        with wh.session(db, read_only=True, config=config):
            return _build_report(run_id, db, rows_per_metric, findings)

    return wh.lean_first(build)


def _build_report(run_id: str, db: Path, rows_per_metric: int, known: Findings | None = None) -> str:
    rd = _Reader(run_id, db)
    run = queries.run_record(rd)
    spec = _json(run.get("spec")) or {}
    configured = list(_json(run.get("metrics")) or [])

    by_metric: dict[str, list[dict[str, Any]]] = {}
    for r in queries.metric_scores(rd):
        by_metric.setdefault(r["metric"], []).append(r)
    metrics = [m for m in configured if m in by_metric] + sorted(m for m in by_metric if m not in configured)
    metrics = [m for m in metrics if any(r["scope"] == "overall" for r in by_metric[m])]
    overall = {m: next(r for r in by_metric[m] if r["scope"] == "overall") for m in metrics}

    weakest_all = queries.weakest_rows(rd)
    unscored_all = queries.unscored_rows(rd)
    row_counts = queries.row_counts(rd)
    evidence, pairs, verdicts = queries.evidence(rd, weakest_all)
    notes = queries.run_notes(rd)
    hist = history.section(run_id, *history.read(rd))
    spec_metrics = spec.get("metrics") or {}
    sections = [
        _metric_section(
            m,
            by_metric[m],
            spec_metrics.get(m) or {},
            [r for r in weakest_all if r["metric"] == m],
            [r for r in unscored_all if r["metric"] == m],
            row_counts,
            evidence,
            pairs,
            verdicts,
            run_id,
        )
        for m in metrics
    ]
    return render(
        "report.html.j2",
        run_id=run_id,
        css=Markup(static("report.css")),
        viewer_css=Markup(static("viewer.css")),
        header=Markup(_header(run, db)),
        metrics=metrics,
        missing=[m for m in configured if m not in metrics],
        overview=Markup(_overview(metrics, overall)) if metrics else None,
        findings=Markup(_findings([f.to_dict() for f in _run_findings(run_id, metrics, db, known)]))
        if metrics
        else None,
        viewer=Markup(
            viewer.section(
                viewer.read(rd.records, metrics, rows_per_metric, run_id, labels_dir=str(db.parent / "labels"))
            )
        )
        if metrics
        else None,
        sections=[Markup(s) for s in sections],
        history=Markup(hist) if hist else None,
        cost=cost(queries.calls_by_role(rd), queries.calls_by_metric(rd)),
        notes=notes,
        exams=queries.judge_exams(rd),
        generated=datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        version=__version__,
    )


def _run_findings(run_id: str, metrics: list[str], db: Path, known: Findings | None) -> list[Finding]:
    """The run's findings of ``metrics``: ``known`` when it has them (the same set), else read."""
    if known is not None and known[0] == frozenset(metrics):
        return known[1]
    return run_findings(run_id, metrics, db)


def default_out(run_id: str, path: str | Path | None = None) -> Path:
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", run_id)
    return _warehouse_path(path).parent / "reports" / f"{safe}.html"


def report_line(run_id: str, path: str | Path | None = None) -> str:
    """The summary's last line: where the run's report is (``""`` when it was not written there)."""
    out = default_out(run_id, path)
    return f"\nReport: {out.resolve()}" if out.exists() else ""


def write_report(
    run_id: str,
    out: str | Path | None = None,
    path: str | Path | None = None,
    rows_per_metric: int = viewer.ROWS_PER_METRIC,
    findings: Findings | None = None,
) -> Path:
    """Write the report (default ``<warehouse dir>/reports/<run_id>.html``) and return its path. In
    a lake it is also kept in the lake's ``reports`` table under its file name (the report
    server's URL), replacing the one before, so every host's report server has it. ``findings``:
    as :func:`build_report`."""
    text = build_report(run_id, path, rows_per_metric, findings)
    target = Path(out) if out else default_out(run_id, path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8")
    if lake.enabled() and not out:
        now = datetime.now(UTC).replace(tzinfo=None)

        def replace(con) -> None:
            con.execute("DELETE FROM reports WHERE name = ?", [target.name])
            con.execute("INSERT INTO reports VALUES (?, ?, ?, ?)", [run_id, target.name, text, now])

        with wh.connect(path) as con:
            wh.transaction(con, replace, f"the report of {run_id}")
    return target.resolve()


def stored_report(name: str) -> str | None:
    """The report a lake keeps under the file name ``name`` (None: none, or not a lake)."""
    if not lake.enabled():
        return None
    rows = wh.query("SELECT html FROM reports WHERE name = ? ORDER BY written_at DESC LIMIT 1", [name])
    return str(rows.html[0]) if len(rows) else None
