"""The report's history section: this run beside the spec's earlier runs (``v_spec_history``) and
what changed since the run before it (``regressions``, written by the aggregation's regression
check: ``history.py``).

One small line plot per metric (its score, each run a point with its 95% interval whisker, the
threshold dashed), and one per axis or group whose gate ever failed in the spec's runs (flip rates
for decision flip's axes). Then a table: each figure that changed significantly since the
previous run, and the SUT's drift (answers, decisions and verdicts that changed on the same
probes; the model ids and fingerprints it reported).
"""

from __future__ import annotations

from typing import Any

from .queries import _Reader
from .values import _e

MAX_RUNS = 30  # the latest runs a plot shows
MAX_GROUP_PLOTS = 12


def read(rd: _Reader) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(history rows of the run's spec up to this run, this run's regressions rows)."""
    hist = rd.records(
        "SELECT h.* FROM v_spec_history h, (SELECT spec_name, created_at FROM eval_runs WHERE run_id = ?) r "
        "WHERE h.spec_name = r.spec_name AND h.created_at <= r.created_at "
        "AND h.scope IN ('overall', 'axis', 'attribute', 'category', 'perturbation_type') "
        "ORDER BY h.created_at, h.run_id"
    )
    reg = rd.records("SELECT * FROM regressions WHERE run_id = ? ORDER BY metric, kind DESC, scope, group_key")
    return hist, reg


def _series(rows: list[dict[str, Any]], rate: bool) -> list[dict[str, Any]]:
    pts = []
    for r in rows[-MAX_RUNS:]:
        v, lo, hi = (
            (r["rate"], r["rate_ci_low"], r["rate_ci_high"]) if rate else (r["score"], r["ci_low"], r["ci_high"])
        )
        pts.append({"run_id": r["run_id"], "value": v, "lo": lo, "hi": hi, "passed": r["passed"]})
    return pts


def line_plot(title: str, points: list[dict[str, Any]], current: str, threshold: float | None, rate: bool) -> str:
    """A small SVG plot: one point per run (this run's filled dark), its interval as a whisker, a
    line through the points, the threshold dashed; values in [0, 1]."""
    w, h, left, right, top, bottom = 300, 120, 34, 8, 18, 18
    pw, ph = w - left - right, h - top - bottom
    n = len(points)
    sx = lambda i: left + (pw * (i + 0.5) / n)  # noqa: E731
    sy = lambda v: top + ph * (1 - max(0.0, min(1.0, float(v))))  # noqa: E731
    out = [
        f'<svg class="history" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img" aria-label="{_e(title)}">',
        f'<text class="tick" x="{left}" y="12">{_e(title)}</text>',
    ]
    for t in (0.0, 0.5, 1.0):
        out.append(f'<line x1="{left}" x2="{w - right}" y1="{sy(t):.1f}" y2="{sy(t):.1f}" stroke="#e6e6e6"/>')
        out.append(f'<text class="tick" x="{left - 4}" y="{sy(t) + 4:.1f}" text-anchor="end">{t:g}</text>')
    if threshold is not None:
        y = sy(threshold)
        out.append(
            f'<line x1="{left}" x2="{w - right}" y1="{y:.1f}" y2="{y:.1f}" stroke="#b03030" stroke-dasharray="4 3"/>'
        )
    path = [f"{sx(i):.1f},{sy(p['value']):.1f}" for i, p in enumerate(points) if p["value"] is not None]
    if len(path) > 1:
        out.append(f'<polyline fill="none" stroke="#4a78b5" stroke-width="1.5" points="{" ".join(path)}"/>')
    for i, p in enumerate(points):
        if p["value"] is None:
            continue
        x = sx(i)
        if p["lo"] is not None and p["hi"] is not None:
            out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{sy(p["lo"]):.1f}" y2="{sy(p["hi"]):.1f}" stroke="#999"/>')
        fill = "#1d3d6b" if p["run_id"] == current else ("#fff" if p["passed"] in (None, True) else "#b03030")
        shown = f"{p['value']:.1%}" if rate else f"{p['value']:.3f}"
        out.append(
            f'<circle cx="{x:.1f}" cy="{sy(p["value"]):.1f}" r="3.5" fill="{fill}" stroke="#1d3d6b" '
            f'data-run="{_e(p["run_id"])}" data-value="{p["value"]!r}"><title>{_e(p["run_id"])}: {shown}'
            f"{'' if p['passed'] in (None, True) else ' (gate failed)'}</title></circle>"
        )
    out.append("</svg>")
    return "".join(out)


def section(run_id: str, hist: list[dict[str, Any]], reg: list[dict[str, Any]]) -> str:
    """The history section's HTML (an empty string when the spec has only this run and nothing to compare)."""
    runs = list(dict.fromkeys(r["run_id"] for r in hist))
    if len(runs) < 2 and not reg:
        return ""
    from ..compare import lower_is_better

    out = [
        '<h2 id="history">History</h2>',
        f'<p class="muted">This run beside the spec\'s {len(runs) - 1} earlier run(s) (latest {MAX_RUNS} shown; '
        "dark: this run, red: a failed gate; whiskers: 95% intervals; dashed: the threshold). SQL: "
        f"<code>SELECT * FROM v_spec_history WHERE spec_name = '{_e(hist[0]['spec_name'] if hist else '')}'</code>.</p>",
        '<div class="history-plots">',
    ]
    by_key: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in hist:
        by_key.setdefault((r["metric"], r["scope"], r["group_key"]), []).append(r)
    plots = []
    for (metric, scope, group), rows in by_key.items():
        if scope == "overall":
            plots.append((0, metric, scope, group, rows))
        elif any(r["passed"] is False for r in rows):
            plots.append((1, metric, scope, group, rows))
    plots.sort(key=lambda p: (p[0], p[1], p[2], p[3]))
    shown_groups = 0
    for kind, metric, scope, group, rows in plots:
        if kind == 1:
            shown_groups += 1
            if shown_groups > MAX_GROUP_PLOTS:
                continue
        rate = lower_is_better(metric, scope)
        title = (
            f"{metric.removeprefix('llm.')} score" if scope == "overall" else f"{metric.removeprefix('llm.')} {group}"
        )
        title += " (flip rate)" if rate else ""
        threshold = None if rate else rows[-1]["threshold"]
        out.append(line_plot(title, _series(rows, rate), run_id, threshold, rate))
    out.append("</div>")
    if shown_groups > MAX_GROUP_PLOTS:
        out.append(f'<p class="muted">{shown_groups - MAX_GROUP_PLOTS} more failing groups not plotted.</p>')
    if reg:
        prev = reg[0]["previous_run"]
        sig = [r for r in reg if r["kind"] == "score" and r["significant"]]
        tested = sum(1 for r in reg if r["kind"] == "score" and r["p_value"] is not None)
        out.append(
            f"<h3>Since the previous run, <code>{_e(prev)}</code></h3>"
            f'<p class="muted">The same questions compared pair by pair ({tested} tests; each metric at the run\'s '
            "alpha divided by its number of metrics, Holm within it; intervals at the matching level).</p>"
        )
        out.append('<table class="notes"><tr><th></th><th>metric</th><th>what changed</th></tr>')
        for r in sig:
            mark = '<span class="badge fail">worse</span>' if r["worse"] else "better"
            out.append(f"<tr><td>{mark}</td><td><code>{_e(r['metric'])}</code></td><td>{_e(r['sentence'])}</td></tr>")
        if not sig:
            out.append("<tr><td></td><td></td><td>no significant change in any figure</td></tr>")
        for r in reg:
            if r["kind"] == "drift":
                out.append(
                    f"<tr><td>drift</td><td><code>{_e(r['metric'])}</code></td><td>{_e(r['sentence'])}</td></tr>"
                )
        out.append("</table>")
    return "".join(out)
