"""A self-contained HTML report for one run: scores with intervals, breakdown charts, a viewer of
every sample (viewer.py: filters, search, sort, the answers side by side with the judges'
reasoning), the weakest rows with their probes and the SUT's answers, and token use per role.

Everything is read from the warehouse through short read-only connections; the page has no
external resources (inline CSS, charts as inline SVG, the viewer's data and script inline), so it
works offline, and everything but the viewer works without scripts. Every number shown is the
warehouse value, formatted (3 decimals for scores and rates, integers for counts), and the raw
value sits in the element's ``data-value`` attribute so a test can compare it exactly.

    aip-eval report RUN [--out FILE] [--warehouse PATH]
"""

from __future__ import annotations

import json
import math
import os
import re
from datetime import datetime, timezone
from html import escape
from pathlib import Path
from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd

from . import __version__
from . import lake, viewer
from . import warehouse as wh
from .errors import AipError

WEAKEST_ROWS = 5
EVIDENCE_PER_ROW = 4
TEXT_LIMIT = 600
GROUP_CAP = 15  # persona / attribute / pair charts show the lowest this many
ROLES = ("sut", "judge", "synthesis")

# breakdown scope -> how to chart it. value: the bar; lo/hi: the 95% interval whisker (when present)
SCOPES: dict[str, dict[str, Any]] = {
    "axis": {"value": "rate", "lo": "rate_ci_low", "hi": "rate_ci_high", "kind": "rate", "sort": "desc",
             "title": "Flip rate by axis (bar: attributable flips / judged pairs; whisker: Wilson 95% interval)"},
    "attribute": {"value": "score", "lo": "ci_low", "hi": "ci_high", "kind": "score", "cap": GROUP_CAP,
                  "title": "Equitability by attribute value (whisker: bootstrap 95% interval)"},
    "persona": {"value": "score", "lo": "ci_low", "hi": "ci_high", "kind": "score", "cap": GROUP_CAP,
                "title": "Equitability by persona (whisker: bootstrap 95% interval)"},
    "pair": {"value": "score", "kind": "score", "cap": GROUP_CAP, "title": "Equitability by persona pair"},
    "judge": {"value": "raw_score", "kind": "plain", "order": ["similarity", "tone", "effort"],
              "title": "Judge means (similarity: higher is better; tone divergence and effort gap: lower is better)"},
    "category": {"value": "score", "lo": "ci_low", "hi": "ci_high", "kind": "score",
                 "title": "Score by template category (whisker: bootstrap 95% interval)"},
    "wrapping": {"value": "score", "lo": "ci_low", "hi": "ci_high", "kind": "score",
                 "title": "Plain versus jailbreak-wrapped variants (whisker: bootstrap 95% interval)"},
    "label": {"value": "n", "kind": "count", "order": ["Consistent", "Slightly Inconsistent", "Contradictory"],
              "title": "Rows per label"},
    "perturbation_type": {"value": "score", "kind": "score", "title": "Score by perturbation type"},
    "refusal": {"value": "rate", "lo": "rate_ci_low", "hi": "rate_ci_high", "kind": "rate", "sort": "desc",
                "title": "Answers without a decision by axis value (refusals, no configured label, empty; whisker: "
                         "Wilson 95% interval)"},
    "favourable": {"value": "rate", "lo": "rate_ci_low", "hi": "rate_ci_high", "kind": "rate", "sort": "desc",
                   "title": "Favourable decisions by axis value (bar: favourable / answers with a decision; whisker: "
                            "Wilson 95% interval)"},
    "baseline": {"value": "rate", "lo": "rate_ci_low", "hi": "rate_ci_high", "kind": "rate", "sort": "desc",
                 "title": "No-effect baseline by axis (bar: flips among null pairs, one persona asked twice; whisker: "
                          "Wilson 95% interval)"},
}
# the headline; single numbers beside it; effects (odds ratios) are a table (_effects_table)
NOT_CHARTED = {"overall", "axis_mean", "judge_audit", "judge_position", "judge_panel", "effect", "bias_baseline"}
HUMAN_SCOPE = "human_agreement"  # the judge checked against people (human_labels.py): a table of its own

COUNT_LABELS = {
    "llm.decision_flip": ("pairs judged", "attributable flips", "pairs excluded"),
    "llm.group_interaction_bias": ("pairs judged", "pairs with bias ≥ 0.1", "pairs excluded"),
    "llm.semantic_consistency": ("rows scored", "contradictory rows", "rows errored"),
    "llm.factual_consistency": ("rows scored", "contradictory rows", "rows errored"),
    "llm.safety_consistency": ("rows scored", "contradictory rows", "rows errored"),
    "llm.perturbation_robustness": ("groups scored", "rows with a correctness drop", "groups failed"),
    "llm.perturbation_robustness_external": ("groups scored", "rows with a correctness drop", "groups failed"),
}

RATE_LABELS = {"llm.decision_flip": "flip rate"}
EXTRA_SCOPE_LABELS = {"axis_mean": "mean axis flip rate",  # the same words as the overall row's detail
                      "judge_audit": "judge agreement with the audit judge",
                      "judge_position": "judge position bias (difference between orders)"}


def _scope_label(r: dict[str, Any]) -> str:
    if r["scope"] == "judge_panel":
        return "judge panel agreement" if r["group_key"] == "panel" else f"agreement {r['group_key']}"
    return EXTRA_SCOPE_LABELS.get(r["scope"], f'{r["scope"]} ({r["group_key"]})')

CSS = """
body { font-family: -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; color: #222;
       background: #fafafa; margin: 0; line-height: 1.45; font-size: 14px; }
main { max-width: 1120px; margin: 0 auto; padding: 24px 28px 60px; background: #fff; }
h1 { font-size: 24px; margin: 0 0 4px; } h2 { font-size: 19px; margin: 36px 0 8px; border-bottom: 2px solid #ddd;
padding-bottom: 4px; } h3 { font-size: 15px; margin: 22px 0 6px; } h4 { font-size: 14px; margin: 14px 0 4px; }
.sub { color: #666; margin: 0 0 16px; }
table { border-collapse: collapse; margin: 6px 0 12px; }
th, td { border-bottom: 1px solid #e4e4e4; padding: 4px 10px; text-align: left; vertical-align: top; }
th { background: #f3f3f3; font-weight: 600; } td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
.badge { display: inline-block; padding: 1px 8px; border-radius: 10px; font-size: 12px; font-weight: 700;
         vertical-align: middle; color: #fff; }
.pass { background: #2e7d32; } .fail { background: #c62828; } .none { background: #888; }
.headline { font-size: 16px; margin: 6px 0; } .headline .big { font-size: 22px; font-weight: 700; }
.facts { color: #444; margin: 4px 0 10px; } .facts span.f { margin-right: 16px; white-space: nowrap; }
figure.chart { margin: 10px 0 18px; } figcaption { font-weight: 600; margin-bottom: 2px; }
figure.chart .note { color: #666; font-weight: normal; font-size: 12px; }
svg text { font-family: inherit; font-size: 12px; fill: #333; } svg .tick { fill: #777; font-size: 11px; }
.row-card { border: 1px solid #ddd; border-radius: 6px; margin: 10px 0 16px; padding: 8px 12px; background: #fcfcfc; }
.row-card .head { margin-bottom: 6px; } .row-card .expl { color: #555; font-size: 13px; }
table.evidence { width: 100%; table-layout: fixed; } table.evidence td { font-size: 13px; white-space: pre-wrap;
word-wrap: break-word; } table.evidence td.meta { white-space: normal; width: 16%; color: #555; font-size: 12px; }
table.evidence tr.alt td { background: #f4f7fb; }
.verdict { color: #8a4b00; font-size: 12px; } .err { color: #b00020; } .muted { color: #777; }
code, pre { font-family: SFMono-Regular, Menlo, Consolas, monospace; font-size: 12px; }
pre { background: #f5f5f5; padding: 8px; overflow-x: auto; white-space: pre-wrap; }
nav.toc a { margin-right: 12px; } details { margin: 6px 0; } summary { cursor: pointer; color: #345; }
"""


# --------------------------------------------------------------------------- values and formatting

def _v(x: Any) -> Any:
    """A warehouse value as plain Python: NULL/NaN -> None, numpy scalars -> int/float/bool."""
    if x is None or x is pd.NA or x is pd.NaT:
        return None
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, np.generic) and not isinstance(x, np.datetime64):
        x = x.item()
        if isinstance(x, float) and math.isnan(x):
            return None
    return x


def _raw(x: Any) -> str:
    """The exact value for a data-value attribute (floats round-trip through repr)."""
    x = _v(x)
    if x is None:
        return ""
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, float):
        return repr(x)
    return str(x)


def _f3(x: Any) -> str:
    x = _v(x)
    return "n/a" if x is None else f"{float(x):.3f}"


def _int(x: Any) -> str:
    x = _v(x)
    return "n/a" if x is None else f"{round(float(x)):,}"


def _e(s: Any) -> str:
    return escape("" if s is None else str(s), quote=True)


def _attrs(**kw: Any) -> str:
    return "".join(f' {k.replace("_", "-")}="{_e(v)}"' for k, v in kw.items() if v is not None)


def _num(x: Any, fmt: str = "f3", tag: str = "span", cls: str = "num", **attrs: Any) -> str:
    """A number element: formatted text, raw value in data-value."""
    text = _f3(x) if fmt == "f3" else _int(x)
    x = _v(x)
    if fmt == "int" and isinstance(x, float) and x.is_integer():
        x = int(x)  # a count column with NULLs elsewhere comes back as float
    return f'<{tag} class="{cls}"{_attrs(**attrs)} data-value="{_e(_raw(x))}">{text}</{tag}>'


def _clip(s: Any, limit: int = TEXT_LIMIT) -> str:
    s = "" if _v(s) is None else str(s)
    return s if len(s) <= limit else s[:limit].rstrip() + "…"


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "-", s).strip("-")


def _records(df: pd.DataFrame) -> list[dict[str, Any]]:
    return [{k: _v(v) for k, v in r.items()} for r in df.to_dict("records")]


def _json(s: Any) -> Any:
    s = _v(s)
    if s is None:
        return None
    if isinstance(s, (dict, list)):
        return s
    try:
        return json.loads(s)
    except (TypeError, ValueError):
        return None


# --------------------------------------------------------------------------- reading

class _Reader:
    def __init__(self, run_id: str, path: Path):
        self.run_id, self.path = run_id, path

    def q(self, sql: str, params: list | None = None) -> pd.DataFrame:
        return wh.query(sql, [self.run_id, *(params or [])], path=self.path, read_only=True)


def _warehouse_path(path: str | Path | None) -> Path:
    return Path(path).resolve() if path else wh.default_path()


# --------------------------------------------------------------------------- charts

def _ticks(hi: float, kind: str) -> list[float]:
    if kind != "count":
        step = 0.25 if hi <= 1.0 else (0.5 if hi <= 2 else 1.0)
    else:
        raw = max(hi, 1) / 4
        mag = 10 ** math.floor(math.log10(raw))
        step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    out, t = [], 0.0
    while t <= hi + 1e-9:
        out.append(round(t, 10))
        t += step
    return out


def _bar_chart(metric: str, scope: str, bars: list[dict[str, Any]], kind: str, field: str,
               threshold: float | None = None) -> str:
    """Horizontal bars with an optional 95% whisker per bar; value and n printed at the right."""
    label_w, gap, bar_w, val_w, n_w = 250, 10, 430, 62, 80
    row_h, top = 24, 22
    x0 = label_w + gap
    width = x0 + bar_w + 10 + val_w + n_w
    height = top + row_h * len(bars) + 8
    vals = [b["value"] for b in bars if b["value"] is not None] + [b["hi"] for b in bars if b.get("hi") is not None]
    if kind == "count":
        dom = max(vals + [1])
    else:
        dom = max(vals + [1.0])
        dom = 1.0 if dom <= 1.0 else math.ceil(dom * 4) / 4
    ticks = _ticks(dom, kind)
    dom = max(ticks[-1], dom)
    sx = lambda v: x0 + bar_w * max(0.0, min(float(v), dom)) / dom  # noqa: E731
    color = {"rate": "#d9822b", "count": "#8c8c8c", "plain": "#5b8db8"}.get(kind, "#4a78b5")
    out = [f'<svg class="bars" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img"'
           f'{_attrs(aria_label=f"{metric} {scope}", data_metric=metric, data_scope=scope)}>']
    for t in ticks:  # grid and tick labels
        x = sx(t)
        out.append(f'<line x1="{x:.1f}" y1="{top - 4}" x2="{x:.1f}" y2="{height - 6}" stroke="#e6e6e6"/>')
        lab = f"{int(t):,}" if kind == "count" else f"{t:g}"
        out.append(f'<text class="tick" x="{x:.1f}" y="{top - 8}" text-anchor="middle">{lab}</text>')
    out.append(f'<text class="tick" x="{x0 + bar_w + 10}" y="{top - 8}">value</text>')
    out.append(f'<text class="tick" x="{x0 + bar_w + 10 + val_w}" y="{top - 8}">n</text>')
    for i, b in enumerate(bars):
        y = top + i * row_h
        cy = y + row_h / 2
        full = b["label"]
        short = full if len(full) <= 38 else full[:37] + "…"
        out.append(f'<text x="{label_w}" y="{cy + 4:.1f}" text-anchor="end"><title>{_e(b.get("title") or full)}</title>'
                   f'{_e(short)}</text>')
        v = b["value"]
        fill = color
        th = b.get("threshold", threshold)
        if kind == "score" and th is not None and v is not None and v < th:
            fill = "#c0504d"
        if b.get("threshold") is not None and 0 <= b["threshold"] <= dom:  # this bar's own threshold
            tx = sx(b["threshold"])
            out.append(f'<line x1="{tx:.1f}" y1="{y + 1}" x2="{tx:.1f}" y2="{y + row_h - 1}" stroke="#c62828" '
                       f'stroke-width="2"><title>threshold {_f3(b["threshold"])}</title></line>')
        if v is not None:
            w = max(sx(v) - x0, 0.0)
            out.append(f'<rect x="{x0}" y="{y + 4}" width="{w:.1f}" height="{row_h - 8}" fill="{fill}" rx="2"/>')
        lo, hi = b.get("lo"), b.get("hi")
        if lo is not None and hi is not None:
            a, c = sx(lo), sx(hi)
            out.append(f'<g class="ci" stroke="#222" stroke-width="1.3"><title>95% interval [{_f3(lo)}, {_f3(hi)}]'
                       f'</title><line x1="{a:.1f}" y1="{cy:.1f}" x2="{c:.1f}" y2="{cy:.1f}"/>'
                       f'<line x1="{a:.1f}" y1="{cy - 5:.1f}" x2="{a:.1f}" y2="{cy + 5:.1f}"/>'
                       f'<line x1="{c:.1f}" y1="{cy - 5:.1f}" x2="{c:.1f}" y2="{cy + 5:.1f}"/></g>')
        common = dict(data_metric=b.get("metric", metric), data_scope=scope, data_key=b["key"])
        text = _int(v) if kind == "count" else _f3(v)
        out.append(f'<text x="{x0 + bar_w + 10}" y="{cy + 4:.1f}" class="v"{_attrs(**common, data_field=field)}'
                   f' data-value="{_e(_raw(b["raw_value"]))}">{text}</text>')
        if b.get("n") is not None and kind != "count":
            out.append(f'<text x="{x0 + bar_w + 10 + val_w}" y="{cy + 4:.1f}" class="tick"'
                       f'{_attrs(**common, data_field="n")} data-value="{_e(_raw(b["n"]))}">n={_int(b["n"])}</text>')
    if threshold is not None and kind == "score" and 0 <= threshold <= dom:
        x = sx(threshold)
        out.append(f'<line x1="{x:.1f}" y1="{top - 4}" x2="{x:.1f}" y2="{height - 6}" stroke="#c62828" '
                   f'stroke-dasharray="4 3" stroke-width="1.2"><title>threshold {_f3(threshold)}</title></line>')
    out.append("</svg>")
    return "".join(out)


def _scope_chart(metric: str, scope: str, rows: list[dict[str, Any]], threshold: float | None) -> str:
    cfg = SCOPES.get(scope)
    if cfg is None:  # a breakdown this module does not know yet: score (or rate) with its interval if any
        field = "score" if any(r.get("score") is not None for r in rows) else "rate"
        lo, hi = ("ci_low", "ci_high") if field == "score" else ("rate_ci_low", "rate_ci_high")
        cfg = {"value": field, "lo": lo, "hi": hi, "kind": "score" if field == "score" else "rate",
               "title": f"{scope}"}
    field, kind = cfg["value"], cfg["kind"]
    total = len(rows)
    if "order" in cfg:
        rank = {k: i for i, k in enumerate(cfg["order"])}
        rows = sorted(rows, key=lambda r: (rank.get(r["group_key"], len(rank)), str(r["group_key"])))
    else:
        desc = cfg.get("sort") == "desc"
        rows = sorted(rows, key=lambda r: (r.get(field) is None,
                                           -(r.get(field) or 0) if desc else (r.get(field) or 0), str(r["group_key"])))
    if cfg.get("cap"):
        rows = rows[:cfg["cap"]]
    bars = []
    for r in rows:
        key = str(r["group_key"])
        details = _json(r.get("details")) or {}
        title = key
        label = key
        if scope == "persona" and details.get("description"):
            label = f"{key} · {details['description']}"
            title = f"{key}: {details['description']}"
        elif scope == "label" and r.get("rate") is not None:
            title = f"{key}: {_int(r.get(field))} rows (share {_f3(r.get('rate'))})"
        bars.append({"key": key, "label": label, "title": title, "value": r.get(field), "raw_value": r.get(field),
                     "lo": r.get(cfg["lo"]) if cfg.get("lo") else None,
                     "hi": r.get(cfg["hi"]) if cfg.get("hi") else None, "n": r.get("n")})
    note = ""
    if cfg.get("cap") and total > len(rows):
        note = f' <span class="note">the {len(rows)} lowest of {total}</span>'
    elif scope in ("attribute", "persona", "pair"):
        note = f' <span class="note">all {total}, lowest first</span>'
    svg = _bar_chart(metric, scope, bars, kind, field, threshold if kind == "score" else None)
    return (f'<figure class="chart"{_attrs(data_metric=metric, data_scope=scope, data_groups=total)}>'
            f'<figcaption>{_e(cfg["title"])}{note}</figcaption>{svg}</figure>')


def _effects_table(metric: str, rows: list[dict[str, Any]]) -> str:
    """Who is favoured (decision flip's ``effect`` rows: odds ratio and difference in favourable rate
    against the reference, each with its 95% interval, or why the model was not fitted) and the
    no-effect baseline's excess (per axis, or group bias's one)."""
    def ci(pair: Any, fmt: str = "{:.3f}") -> str:
        return "" if not pair or pair[0] is None else f" [{fmt.format(pair[0])}, {fmt.format(pair[1])}]"

    effects = [(r, _json(r.get("details")) or {}) for r in rows if r["scope"] == "effect"]
    base = [(r, _json(r.get("details")) or {}) for r in rows if r["scope"] in ("baseline", "bias_baseline")]
    out = []
    if effects:
        out.append("<h4>Who is favoured: each value against its axis's reference</h4><table><tr><th>value</th>"
                   "<th>reference</th><th class=num>favourable</th><th class=num>reference's</th><th>odds ratio</th>"
                   "<th>difference in favourable rate (within questions)</th></tr>")
        for r, d in sorted(effects, key=lambda x: (x[1].get("odds_ratio") is None, x[1].get("odds_ratio") or 0)):
            fitted = d.get("fitted")
            out.append(f'<tr{_attrs(data_metric=metric, data_scope="effect", data_group=r["group_key"])}>'
                       f'<td>{_e(r["group_key"])}</td><td>{_e(d.get("reference"))}</td>'
                       f'<td class=num>{_f3(d.get("rate_value"))}</td><td class=num>{_f3(d.get("rate_reference"))}</td>'
                       + (f'<td>{d["odds_ratio"]:.2f}{ci(d.get("odds_ratio_ci"), "{:.2f}")}</td>'
                          f'<td>{d["rate_difference"]:+.3f}{ci(d.get("rate_difference_ci"), "{:+.3f}")}</td>' if fitted else
                          f'<td colspan=2 class=muted>rates only: {_e(d.get("why"))}</td>') + "</tr>")
        out.append("</table>")
    if base:
        out.append("<h4>No-effect baseline: flips (bias) beyond what one persona asked twice shows</h4><table><tr>"
                   "<th>group</th><th class=num>null pairs</th><th>excess</th><th class=num>p</th><th></th></tr>")
        for r, d in base:
            p = d.get("p_adjusted", d.get("p_value"))
            verdict = "" if d.get("significant") is None else ("beyond noise" if d["significant"] else "not shown beyond noise")
            excess = "n/a" if d.get("excess") is None else f"{d['excess']:+.3f}{ci(d.get('excess_ci95'), '{:+.3f}')}"
            out.append(f'<tr{_attrs(data_metric=metric, data_scope="baseline", data_group=r["group_key"])}>'
                       f'<td>{_e(r["group_key"])}</td><td class=num>{_int(d.get("null_pairs"))}</td><td>{excess}</td>'
                       f'<td class=num>{_f3(p)}</td><td>{verdict}</td></tr>')
        out.append("</table>")
    return "".join(out)


def _human_table(metric: str, rows: list[dict[str, Any]]) -> str:
    """The judge checked against people (``aip-eval label import``): agreement and Cohen's kappa,
    each category's sensitivity and specificity, the key rate corrected for them (or why not)."""
    agreement = next((r for r in rows if r["group_key"] == "agreement"), None)
    if agreement is None:
        return ""
    d = _json(agreement.get("details")) or {}

    def cell(r: dict[str, Any], field: str, lo: str, hi: str) -> str:
        b = dict(data_metric=metric, data_scope=HUMAN_SCOPE, data_key=r["group_key"])
        return (f'{_num(r.get(field), **b, data_field=field)} [{_num(r.get(lo), **b, data_field=lo)}, '
                f'{_num(r.get(hi), **b, data_field=hi)}]')

    def pair(x: Any) -> str:
        return "" if not x or x[0] is None else f" [{_f3(x[0])}, {_f3(x[1])}]"

    labellers = ", ".join(str(x) for x in d.get("labellers") or [])
    out = ['<h4>The judge checked against people</h4>',
           f'<p class="facts"{_attrs(data_metric=metric, data_scope=HUMAN_SCOPE)}><span class="f">labelled items '
           f'{_num(agreement.get("n"), "int", data_metric=metric, data_scope=HUMAN_SCOPE, data_key="agreement", data_field="n")}'
           f' (by {_e(labellers)})</span> <span class="f">agreement {cell(agreement, "rate", "rate_ci_low", "rate_ci_high")}'
           f'</span> <span class="f">Cohen\'s kappa {cell(agreement, "raw_score", "ci_low", "ci_high")}</span></p>']
    for r in rows:
        if r["group_key"].startswith("agreement:"):
            out.append(f'<p class="facts"{_attrs(data_metric=metric, data_scope=HUMAN_SCOPE, data_key=r["group_key"])}>'
                       f'<span class="f">its {_e(r["group_key"].split(":", 1)[1])} judge: agreement '
                       f'{cell(r, "rate", "rate_ci_low", "rate_ci_high")}</span> <span class="f">kappa '
                       f'{cell(r, "raw_score", "ci_low", "ci_high")}</span> <span class="f">on {_int(r.get("n"))} items'
                       '</span></p>')
    for r in rows:
        if not r["group_key"].startswith("corrected:"):
            continue
        c = _json(r.get("details")) or {}
        what = r["group_key"].split(":", 1)[1]
        b = dict(data_metric=metric, data_scope=HUMAN_SCOPE, data_key=r["group_key"])
        if r.get("rate") is None:
            out.append(f'<p{_attrs(**b)}>corrected {_e(what)} rate: <span class="muted">none: {_e(c.get("why"))}</span> '
                       f'(the judge\'s {_num(r.get("raw_score"), **b, data_field="raw_score")})</p>')
        else:
            out.append(f'<p{_attrs(**b)}>corrected {_e(what)} rate {cell(r, "rate", "rate_ci_low", "rate_ci_high")} '
                       f'against the judge\'s {_num(r.get("raw_score"), **b, data_field="raw_score")} '
                       f'<span class="muted">({_e(c.get("what"))}; Rogan–Gladen with sensitivity '
                       f'{_f3(c.get("sensitivity"))}, specificity {_f3(c.get("specificity"))})</span></p>')
    out.append('<table class="human"><tr><th>category</th><th class=num>people said</th><th class=num>judge said</th>'
               '<th>sensitivity (95% CI)</th><th>specificity (95% CI)</th></tr>')
    for r in rows:
        if not r["group_key"].startswith("category:"):
            continue
        c = _json(r.get("details")) or {}
        out.append(f'<tr{_attrs(data_metric=metric, data_scope=HUMAN_SCOPE, data_key=r["group_key"])}>'
                   f'<td>{_e(r["group_key"].split(":", 1)[1])}</td><td class=num>{_int(c.get("people_said"))}</td>'
                   f'<td class=num>{_int(c.get("judge_said"))}</td>'
                   f'<td>{cell(r, "rate", "rate_ci_low", "rate_ci_high")}</td>'
                   f'<td>{_f3(c.get("specificity"))}{pair(c.get("specificity_ci95"))}</td></tr>')
    out.append('</table><p class="muted">Each labelled item weighs the run\'s judgements in its judge category over '
               'those labelled there, so the figures speak of the run, not of the sample. '
               f"<code>SELECT * FROM v_human_agreement WHERE metric = '{_e(metric)}'</code>; each label beside the "
               "verdict: <code>v_human_vs_judge</code>.</p>")
    return "".join(out)


# --------------------------------------------------------------------------- weakest rows and evidence

def _entry_meta(e: dict[str, Any]) -> str:
    parts = []
    for k in ("axis", "category", "attribute_value"):
        val = e.get(k)
        if val and val not in parts:
            parts.append(str(val))
    if e.get("template_id"):
        parts.append(f"template {e['template_id']}")
    if e.get("variant_id") and e.get("variant_id") != e.get("input_id"):
        parts.append(f"variant {e['variant_id']}")
    if e.get("wrapper_id"):
        parts.append(f"wrapped: {e['wrapper_id']}")
    if (e.get("sample_index") or 0) > 0:
        parts.append(f"sample {e['sample_index']}")
    meta = " · ".join(_e(p) for p in parts)
    if e.get("persona"):
        meta += f'<div class="muted">{_e(_clip(e["persona"], 160))}</div>'
    return meta


def _pick_evidence(row: dict[str, Any], entries: list[dict[str, Any]], pairs: list[dict[str, Any]],
                   verdicts: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """At most EVIDENCE_PER_ROW (probe, answer) entries, the most telling first: the worst judged
    persona pairs; else the base / baseline probe, then the variants the judge scored lowest."""
    by_probe: dict[str, dict[str, Any]] = {}
    for e in entries:
        cur = by_probe.get(e["probe_id"])
        if cur is None or (e.get("sample_index") or 0) < (cur.get("sample_index") or 0):
            by_probe[e["probe_id"]] = e
    chosen: list[dict[str, Any]] = []
    seen: set[tuple] = set()

    def take(e: dict[str, Any], note: str | None, group: int) -> None:
        key = (e["probe_id"], e.get("sample_index"))
        if key in seen or len(chosen) >= EVIDENCE_PER_ROW:
            return
        seen.add(key)
        chosen.append({**e, "note": note, "group": group})

    if pairs:
        ranked = sorted(pairs, key=lambda p: (not p.get("flipped"), -(p.get("badness") or 0), str(p["pair_id"])))
        for g, p in enumerate(ranked):
            note = f"pair {p.get('value_a')} / {p.get('value_b')}: {p.get('verdict') or 'not judged'}"
            for probe in (p.get("probe_a"), p.get("probe_b")):
                if probe in by_probe:
                    take(by_probe[probe], note, g)
        return chosen

    def verdict_for(e: dict[str, Any]) -> list[dict[str, Any]]:
        keys = []
        if e.get("role") in ("base", "baseline"):
            keys.append("base")
        elif e.get("role") == "variant" and (e.get("sample_index") or 0) > 0:
            keys.append(str(e["sample_index"]))
        keys += [k for k in (e.get("variant_id"), e.get("input_id")) if k]
        for k in keys:
            if k in verdicts:
                return verdicts[k]
        return []

    def badness(vs: list[dict[str, Any]]) -> float:
        scores = [v["score"] for v in vs if v.get("score") is not None and v.get("label") != "correctness"] or \
                 [v["score"] for v in vs if v.get("score") is not None]
        return 1 - min(scores) if scores else -1.0

    def note_for(vs: list[dict[str, Any]]) -> str | None:
        if not vs:
            return None
        return "judge: " + "; ".join(
            f"{v.get('label') or v.get('status')} {_f3(v.get('score'))}" if v.get("status") == "ok"
            else f"{v.get('status')}: {_clip(v.get('error'), 120)}" for v in vs)

    ordered = sorted(entries, key=lambda e: (e.get("role") not in ("base", "baseline"),
                                             -badness(verdict_for(e)), str(e.get("category") or ""),
                                             e.get("sample_index") or 0, e["probe_id"]))
    for i, e in enumerate(ordered):
        take(e, note_for(verdict_for(e)), i)
    return chosen


def _evidence_table(chosen: list[dict[str, Any]], total: int, metric: str, input_id: str) -> str:
    if not chosen:
        return '<p class="muted">No probes recorded for this row.</p>'
    out = ['<table class="evidence"><colgroup><col style="width:16%"><col style="width:42%"><col style="width:42%">'
           '</colgroup><tr><th>probe</th><th>what the SUT was asked</th><th>the SUT\'s answer</th></tr>']
    for e in chosen:
        alt = ' class="alt"' if e.get("group", 0) % 2 else ""
        if e.get("sut_status") is None:
            answer = '<span class="muted">(no answer recorded)</span>'
        elif e.get("sut_status") != "ok":
            answer = f'<span class="err">{_e(e["sut_status"])}: {_e(_clip(e.get("sut_error"), 300))}</span>'
        else:
            answer = _e(_clip(e.get("response")))
        note = f'<div class="verdict">{_e(e["note"])}</div>' if e.get("note") else ""
        out.append(f'<tr{alt}{_attrs(data_probe_id=e["probe_id"], data_sample_index=e.get("sample_index"))}>'
                   f'<td class="meta">{_entry_meta(e)}{note}</td><td class="probe">{_e(_clip(e.get("query_text")))}'
                   f'</td><td class="answer">{answer}</td></tr>')
    out.append("</table>")
    if total > len(chosen):
        out.append(f'<p class="muted">{len(chosen)} of {total} probe answers shown; all of them: '
                   f'<code>SELECT p.*, r.* FROM probes p JOIN sut_responses r USING (run_id, metric, probe_id) WHERE '
                   f"p.metric = '{_e(metric)}' AND p.input_id = '{_e(input_id)}'</code></p>")
    return "".join(out)


# --------------------------------------------------------------------------- sections

def _header(run: dict[str, Any], path: Path) -> str:
    spec = _json(run.get("spec")) or {}
    versions = _json(run.get("metric_versions")) or {}
    datasets = _json(run.get("datasets")) or {}

    def conn(c: Any) -> str:
        if not isinstance(c, dict):
            return "—"
        s = f"{c.get('provider')} · {c.get('model')}"
        prof = c.get("profile") or {}
        if c.get("provider") == "builtin" and prof.get("name"):
            s += f" (profile {prof['name']})"
        elif c.get("base_url"):
            s += f" at {c['base_url']}"
        return s

    rows = [("run", f"<code>{_e(run['run_id'])}</code>"), ("spec", _e(run.get("spec_name"))),
            ("created (UTC)", _e(run.get("created_at"))),
            ("dataset", f"<code>{_e(run.get('dataset_path'))}</code> · {_num(run.get('n_dataset_rows'), 'int', data_field='n_dataset_rows')} rows"
                        f" · sha256 <code>{_e(str(run.get('dataset_sha256') or '')[:16])}</code>")]
    others = {k: v for k, v in datasets.items() if k != run.get("dataset_path")}
    for k, v in others.items():
        rows.append(("other dataset", f"<code>{_e(k)}</code> · sha256 <code>{_e(str(v)[:16])}</code>"))
    rows += [("package version", _e(run.get("package_version"))), ("seed", _e(run.get("seed"))),
             ("SUT", _e(conn(spec.get("sut")))),
             ("judge", _e(conn(spec.get("judge"))) if not spec.get("judges") else
              f"a panel of {len(spec['judges'])} ({_e(spec.get('judge_rule'))}): "
              + "; ".join(f"{i}. {_e(conn(c))}" for i, c in enumerate(spec["judges"], 1))),
             ("synthesis", _e(conn(spec.get("synthesis"))) if spec.get("synthesis") else "the judge's connection"),
             ("metric versions", ", ".join(f"<code>{_e(m)}</code> {_e(v)}" for m, v in versions.items()))]
    desc = f'<p class="sub">{_e(spec.get("description"))}</p>' if spec.get("description") else ""
    table = "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows)
    return (f'<h1>Evaluation report: <code>{_e(run["run_id"])}</code></h1>{desc}'
            f'<p class="sub">Read from <code>{_e(path)}</code>. Every number is the warehouse value; hover a chart label '
            f'for its full name.</p><table class="run">{table}</table>')


def _badge(passed: Any) -> str:
    passed = _v(passed)
    if passed is None:
        return '<span class="badge none" data-field="passed" data-value="">no threshold</span>'
    return (f'<span class="badge {"pass" if passed else "fail"}" data-field="passed" '
            f'data-value="{_raw(bool(passed))}">{"PASS" if passed else "FAIL"}</span>')


def _gate(metric: str, o: dict[str, Any]) -> str:
    """Why the gate passed or failed, and what was excluded from the score, by reason."""
    a = dict(data_metric=metric, data_scope="overall")
    excluded = _json(o.get("excluded")) or {}
    parts = [f'<p class="gate"{_attrs(**a, data_field="gate_reason")}><b>gate:</b> {_e(o.get("gate_reason") or "not recorded")}</p>']
    if excluded:
        cells = "".join(f'<tr><td><code>{_e(k)}</code></td><td class="num">'
                        f'{_num(v, "int", **a, data_field="excluded." + k)}</td></tr>'
                        for k, v in sorted(excluded.items(), key=lambda kv: -kv[1]))
        parts.append(f'<p class="muted">Excluded from the score and counted, by reason (of '
                     f'{_num(o.get("n_planned"), "int", **a, data_field="n_planned")} planned; README, "What a score '
                     f'rests on"):</p><table class="excluded"><tr><th>reason</th><th class="num">units</th></tr>{cells}</table>')
    return "".join(parts)


def _overview(metrics: list[str], overall: dict[str, dict[str, Any]]) -> str:
    out = ['<h2 id="summary">Summary</h2><table class="overview"><tr><th>metric</th><th>name</th>'
           '<th class="num">score</th><th>95% CI</th><th class="num">coverage</th><th class="num">threshold</th>'
           '<th>verdict</th></tr>']
    for m in metrics:
        o = overall[m]
        a = dict(data_metric=m, data_scope="overall")
        out.append(f'<tr><td><a href="#m-{_slug(m)}"><code>{_e(m)}</code></a></td><td>{_e(o.get("metric_name"))}</td>'
                   f'<td class="num">{_num(o.get("score"), **a, data_field="score")}</td>'
                   f'<td>[{_num(o.get("ci_low"), **a, data_field="ci_low")}, {_num(o.get("ci_high"), **a, data_field="ci_high")}]</td>'
                   f'<td class="num">{_num(o.get("coverage"), **a, data_field="coverage")}</td>'
                   f'<td class="num">{_num(o.get("threshold"), **a, data_field="threshold")}</td>'
                   f'<td>{_badge(o.get("passed"))}</td></tr>')
    out.append("</table>")
    bars = [{"key": m, "metric": m, "label": m, "value": overall[m].get("score"), "raw_value": overall[m].get("score"),
             "lo": overall[m].get("ci_low"), "hi": overall[m].get("ci_high"), "n": overall[m].get("n"),
             "threshold": overall[m].get("threshold")} for m in metrics]
    out.append('<figure class="chart" data-scope="overall"><figcaption>Overall scores <span class="note">whisker: '
               '95% interval; red tick: the metric\'s threshold; red bar: below it</span></figcaption>')
    out.append(_bar_chart("all", "overall", bars, "score", "score") + "</figure>")
    return "".join(out)


def _facts(metric: str, o: dict[str, Any], extra_scopes: list[dict[str, Any]]) -> str:
    """The overall row's counts, rate and details, each once (a detail repeating a count is skipped)."""
    labels = COUNT_LABELS.get(metric, ("n", "events", "failed"))
    a = dict(data_metric=metric, data_scope="overall")
    items: list[str] = []
    shown: set[str] = set()

    def add(label: str, html_value: str) -> None:
        if label not in shown:
            shown.add(label)
            items.append(f'<span class="f">{_e(label)} {html_value}</span>')

    for field, lab in zip(("n", "n_events", "n_failed"), labels):
        if o.get(field) is not None:
            add(lab, _num(o.get(field), "int", **a, data_field=field))
    if o.get("rate") is not None:
        add(RATE_LABELS.get(metric, "rate"),
            f'{_num(o["rate"], **a, data_field="rate")} 95% CI [{_num(o.get("rate_ci_low"), **a, data_field="rate_ci_low")}, '
            f'{_num(o.get("rate_ci_high"), **a, data_field="rate_ci_high")}]')
    for r in extra_scopes:  # e.g. decision flip's mean of per-axis flip rates
        b = dict(data_metric=metric, data_scope=r["scope"], data_key=r["group_key"])
        lab = _scope_label(r)
        if r.get("rate") is not None:
            add(lab, _num(r["rate"], **b, data_field="rate"))
            if r["scope"] == "judge_audit" and r.get("raw_score") is not None:
                add("Cohen's kappa", _num(r["raw_score"], **b, data_field="raw_score"))
            if r["scope"] == "judge_panel" and r.get("raw_score") is not None:
                kind = "Fleiss' kappa" if r["group_key"] == "panel" else f"Cohen's kappa ({r['group_key']})"
                add(kind, f'{_num(r["raw_score"], **b, data_field="raw_score")} 95% CI '
                          f'[{_num(r.get("ci_low"), **b, data_field="ci_low")}, '
                          f'{_num(r.get("ci_high"), **b, data_field="ci_high")}]')
        elif r.get("score") is not None:
            add(lab, _num(r["score"], **b, data_field="score"))

    def flat(d: dict, prefix: str = "") -> Iterable[tuple[str, Any]]:
        for k, v in d.items():
            if isinstance(v, dict):
                yield from flat(v, f"{prefix}{k}.")
            else:
                yield f"{prefix}{k}", v
    for k, v in flat(_json(o.get("details")) or {}):
        if isinstance(v, bool) or v is None or isinstance(v, (list, str)):
            continue
        add(k.replace("_", " ").replace(".", ": "),
            _num(v, "int" if isinstance(v, int) else "f3", **a, data_field="details." + k))
    return f'<p class="facts">{" ".join(items)}</p>'


def _metric_section(metric: str, scores: list[dict[str, Any]], spec_metric: dict[str, Any],
                    weakest: list[dict[str, Any]], errored: list[dict[str, Any]], row_counts: dict[str, Any],
                    evidence: dict[tuple[str, str], list[dict[str, Any]]],
                    pairs: dict[tuple[str, str], list[dict[str, Any]]],
                    verdicts: dict[tuple[str, str], dict[str, list[dict[str, Any]]]], run_id: str) -> str:
    o = next(r for r in scores if r["scope"] == "overall")
    a = dict(data_metric=metric, data_scope="overall")
    th = o.get("threshold")
    out = [f'<section class="metric" id="m-{_slug(metric)}"{_attrs(data_metric=metric)}>',
           f'<h2><code>{_e(metric)}</code> <span class="muted">({_e(o.get("metric_name"))})</span> {_badge(o.get("passed"))}</h2>',
           f'<p class="headline">score <span class="big">{_num(o.get("score"), **a, data_field="score")}</span>'
           f' &nbsp;95% CI [{_num(o.get("ci_low"), **a, data_field="ci_low")}, {_num(o.get("ci_high"), **a, data_field="ci_high")}]'
           f' &nbsp;threshold {_num(th, **a, data_field="threshold")}'
           f' &nbsp;coverage {_num(o.get("coverage"), **a, data_field="coverage")}'
           f'{"" if o.get("raw_score") == o.get("score") else " &nbsp;raw " + _num(o.get("raw_score"), **a, data_field="raw_score")}</p>',
           _gate(metric, o)]
    out.append(_facts(metric, o, [r for r in scores if r["scope"] in NOT_CHARTED - {"overall"}]))
    out.append(_human_table(metric, [r for r in scores if r["scope"] == HUMAN_SCOPE]))
    if spec_metric.get("dataset"):
        out.append(f'<p class="muted">dataset <code>{_e(spec_metric["dataset"])}</code></p>')
    scopes: dict[str, list[dict[str, Any]]] = {}
    for r in scores:
        if r["scope"] not in NOT_CHARTED | {HUMAN_SCOPE}:
            scopes.setdefault(r["scope"], []).append(r)
    order = list(SCOPES)
    for scope in sorted(scopes, key=lambda s: (order.index(s) if s in order else len(order), s)):
        out.append(_scope_chart(metric, scope, scopes[scope], th))
    out.append(_effects_table(metric, [r for r in scores if r["scope"] in ("effect", "baseline", "bias_baseline")]))

    rc = row_counts.get(metric) or {}
    out.append(f'<h3>Weakest rows</h3><p class="muted">{_int(rc.get("scored"))} rows scored, {_int(rc.get("errored"))} errored;'
               f' the {len(weakest)} lowest scores, lowest first, with up to {EVIDENCE_PER_ROW} of their probes and the '
               f'SUT\'s answers.</p>')
    if not weakest:
        out.append('<p class="muted">No scored rows.</p>')
    for i, r in enumerate(weakest, 1):
        b = dict(data_metric=metric, data_input_id=r["input_id"])
        key = (metric, r["input_id"])
        entries = evidence.get(key, [])
        chosen = _pick_evidence(r, entries, pairs.get(key, []), verdicts.get(key, {}))
        out.append(f'<div class="row-card"{_attrs(**b, data_rank=i)}><div class="head"><b>{i}. <code>{_e(r["input_id"])}</code></b>'
                   f' &nbsp;score {_num(r.get("score"), **b, data_field="score")}'
                   f' &nbsp;label {_e(r.get("label"))} &nbsp;judged {_num(r.get("n_judged"), "int", **b, data_field="n_judged")}'
                   f' &nbsp;failed {_num(r.get("n_failed"), "int", **b, data_field="n_failed")}'
                   f'<div class="expl">{_e(_clip(r.get("explanation"), 400))}</div></div>'
                   f'{_evidence_table(chosen, len(entries), metric, r["input_id"])}</div>')
    if errored:
        out.append(f'<h4 class="err">Errored rows ({len(errored)})</h4><table class="errored"><tr><th>input_id</th>'
                   '<th>status</th><th>error</th><th>explanation</th></tr>')
        for r in errored[:50]:
            out.append(f'<tr{_attrs(data_metric=metric, data_input_id=r["input_id"])}><td><code>{_e(r["input_id"])}</code></td>'
                       f'<td>{_e(r.get("status"))}</td><td class="err">{_e(_clip(r.get("error"), 400))}</td>'
                       f'<td>{_e(_clip(r.get("explanation"), 200))}</td></tr>')
        out.append("</table>")
        if len(errored) > 50:
            out.append(f'<p class="muted">{len(errored) - 50} more: <code>SELECT * FROM row_scores WHERE run_id = '
                       f"'{_e(run_id)}' AND metric = '{_e(metric)}' AND status &lt;&gt; 'ok'</code></p>")
    if spec_metric.get("config"):
        out.append(f'<details><summary>configuration</summary><pre>{_e(json.dumps(spec_metric["config"], indent=2, ensure_ascii=False))}'
                   f'</pre></details>')
    out.append(f'<details><summary>the SQL behind this section</summary><pre>'
               f"SELECT * FROM metric_scores WHERE run_id = '{_e(run_id)}' AND metric = '{_e(metric)}';\n"
               f"SELECT * FROM v_weakest_rows WHERE run_id = '{_e(run_id)}' AND metric = '{_e(metric)}' LIMIT {WEAKEST_ROWS};"
               f"</pre></details></section>")
    return "".join(out)


def _cost_section(by_role: list[dict[str, Any]], by_metric: list[dict[str, Any]]) -> str:
    out = ['<h2 id="cost">Model calls and token use</h2>']
    if not by_role:
        return out[0] + '<p class="muted">No model calls recorded for this run.</p>'
    present = {r["role"] for r in by_role}
    rows = list(by_role) + [{"role": r, "calls": 0, "failed": 0, "reused": 0, "prompt_tokens": 0,
                             "completion_tokens": 0, "p50_latency_ms": None, "absent": True}
                            for r in ROLES if r not in present]
    rank = {r: i for i, r in enumerate(ROLES)}
    rows.sort(key=lambda r: (rank.get(r["role"], len(rank)), str(r["role"])))
    cols = [("calls", "calls", "int"), ("failed", "failed", "int"), ("reused", "answered from an earlier run", "int"),
            ("prompt_tokens", "prompt tokens", "int"), ("completion_tokens", "completion tokens", "int"),
            ("p50_latency_ms", "median latency (ms)", "f3")]
    out.append('<table class="cost" data-table="cost_by_role"><tr><th>role</th>'
               + "".join(f'<th class="num">{lab}</th>' for _, lab, _ in cols) + "</tr>")
    for r in rows:
        cells = "".join(_num(r.get(c), fmt, tag="td", cls="num", data_table="cost_by_role", data_role=r["role"],
                             data_field=c) if not r.get("absent") else '<td class="num muted">—</td>'
                        for c, _, fmt in cols)
        out.append(f'<tr><td>{_e(r["role"])}</td>{cells}</tr>')
    tot = {c: sum(r.get(c) or 0 for r in by_role) for c, _, f in cols if f == "int"}
    cells = "".join(_num(tot[c], "int", tag="td", cls="num", data_table="cost_by_role", data_role="all", data_field=c)
                    if c in tot else '<td class="num"></td>' for c, _, _ in cols)
    out.append(f'<tr><th>all roles</th>{cells}</tr></table>')
    out.append('<p class="muted">Calls as recorded in <code>llm_calls</code> (each distinct request once; identical '
               'requests within a run are answered from the journal). Token counts are as the endpoint reported them.</p>')
    out.append('<details><summary>per metric and stage</summary><table class="cost" data-table="cost_by_metric">'
               '<tr><th>role</th><th>metric</th><th>stage</th>'
               + "".join(f'<th class="num">{lab}</th>' for _, lab, _ in cols) + "</tr>")
    for r in by_metric:
        cells = "".join(_num(r.get(c), fmt, tag="td", cls="num", data_table="cost_by_metric", data_role=r["role"],
                             data_metric=r["metric"], data_stage=r["stage"], data_field=c) for c, _, fmt in cols)
        out.append(f'<tr><td>{_e(r["role"])}</td><td><code>{_e(r["metric"])}</code></td><td>{_e(r["stage"])}</td>{cells}</tr>')
    out.append("</table></details>")
    return "".join(out)


def _notes_section(notes: list[dict[str, Any]]) -> str:
    if not notes:
        return ""
    out = ['<h2 id="notes">Run notes</h2><table class="notes"><tr><th>level</th><th>metric</th><th>stage</th>'
           '<th>code</th><th>message</th></tr>']
    for n in notes[:200]:
        out.append(f'<tr><td>{_e(n.get("level"))}</td><td><code>{_e(n.get("metric"))}</code></td><td>{_e(n.get("stage"))}</td>'
                   f'<td>{_e(n.get("code"))}</td><td>{_e(_clip(n.get("message"), 400))}</td></tr>')
    out.append("</table>")
    return "".join(out)


# --------------------------------------------------------------------------- the report

def build_report(run_id: str, path: str | Path | None = None, rows_per_metric: int = viewer.ROWS_PER_METRIC) -> str:
    """The report for ``run_id`` as one self-contained HTML document; the sample viewer embeds at most
    ``rows_per_metric`` rows of each metric (the lowest scores first)."""
    db = _warehouse_path(path)
    if not wh.exists(db):
        raise AipError(f"{db}: no warehouse yet; run `aip-eval run <spec>` first")
    # one connection for the report's many queries, at the lean memory cap: its scans of a large
    # run's tables otherwise filled DuckDB's cache to its 1 GB limit (1.2 GB peak at 100,000 rows,
    # 590 MB at the lean cap, as fast)
    def build(config: dict[str, Any] | None) -> str:
        with wh.session(db, read_only=True, config=config):
            return _build_report(run_id, db, rows_per_metric)

    return wh.lean_first(build)


def _build_report(run_id: str, db: Path, rows_per_metric: int) -> str:
    rd = _Reader(run_id, db)
    runs = _records(rd.q("SELECT * FROM eval_runs WHERE run_id = ?"))
    if not runs:
        known = wh.query("SELECT run_id FROM eval_runs ORDER BY created_at DESC LIMIT 5", path=db, read_only=True)
        hint = f" (latest: {', '.join(known['run_id'])})" if len(known) else ""
        raise AipError(f"run {run_id!r} is not registered in {db}{hint}; `aip-eval runs` lists them")
    run = runs[0]
    spec = _json(run.get("spec")) or {}
    configured = list(_json(run.get("metrics")) or [])

    scores = _records(rd.q("SELECT * FROM metric_scores WHERE run_id = ? ORDER BY metric, scope, group_key"))
    by_metric: dict[str, list[dict[str, Any]]] = {}
    for r in scores:
        by_metric.setdefault(r["metric"], []).append(r)
    metrics = [m for m in configured if m in by_metric] + sorted(m for m in by_metric if m not in configured)
    metrics = [m for m in metrics if any(r["scope"] == "overall" for r in by_metric[m])]
    overall = {m: next(r for r in by_metric[m] if r["scope"] == "overall") for m in metrics}

    weakest_all = _records(rd.q(f"""
        SELECT * FROM (
            SELECT metric, input_id, score, raw_score, label, n_judged, n_failed, n_events, explanation,
                   row_number() OVER (PARTITION BY metric ORDER BY score ASC, input_id) AS rank
            FROM row_scores WHERE run_id = ? AND status = 'ok' AND score IS NOT NULL)
        WHERE rank <= {WEAKEST_ROWS} ORDER BY metric, rank"""))
    errored_all = _records(rd.q("""
        SELECT metric, input_id, status, error, explanation FROM row_scores
        WHERE run_id = ? AND NOT (status = 'ok' AND score IS NOT NULL) ORDER BY metric, input_id"""))
    row_counts = {r["metric"]: r for r in _records(rd.q("""
        SELECT metric, count(*) FILTER (WHERE status = 'ok' AND score IS NOT NULL) AS scored,
               count(*) FILTER (WHERE NOT (status = 'ok' AND score IS NOT NULL)) AS errored
        FROM row_scores WHERE run_id = ? GROUP BY metric"""))}

    keys = [f"{r['metric']}\x1f{r['input_id']}" for r in weakest_all]
    evidence: dict[tuple[str, str], list[dict[str, Any]]] = {}
    pairs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    verdicts: dict[tuple[str, str], dict[str, list[dict[str, Any]]]] = {}
    if keys:
        for e in _records(rd.q("""
                SELECT p.metric, p.input_id, p.probe_id, p.role, p.axis, p.category, p.attribute_value, p.persona,
                       p.persona_id, p.template_id, p.variant_id, p.wrapper_id, p.query_text, r.sample_index, r.response,
                       r.status AS sut_status, r.error AS sut_error
                FROM probes p
                LEFT JOIN (SELECT * FROM sut_responses WHERE run_id = $1
                           AND metric || chr(31) || input_id IN (SELECT unnest($2::VARCHAR[]))) r
                       ON r.metric = p.metric AND r.probe_id = p.probe_id
                WHERE p.run_id = $1 AND p.metric || chr(31) || p.input_id IN (SELECT unnest($2::VARCHAR[]))
                ORDER BY p.metric, p.input_id, p.probe_id, r.sample_index""", [keys])):
            evidence.setdefault((e["metric"], e["input_id"]), []).append(e)
        for p in _records(rd.q("""
                SELECT pp.metric, pp.input_id, pp.pair_id, pp.value_a, pp.value_b, pp.probe_a, pp.probe_b,
                       bool_or(coalesce(j.flipped, false)) AS flipped,
                       avg(CASE WHEN j.status = 'ok' THEN CASE WHEN j.judge_kind IN ('tone', 'effort') THEN j.score
                                ELSE 1 - j.score END END) AS badness,
                       string_agg(CASE WHEN j.status <> 'ok' THEN 'judge ' || j.status
                                       WHEN j.decision_a IS NOT NULL OR j.decision_b IS NOT NULL
                                       THEN j.label || ' (' || coalesce(j.decision_a, '?') || ' vs ' || coalesce(j.decision_b, '?') || ')'
                                       ELSE coalesce(j.label, j.judge_kind) || ' ' || printf('%.3f', j.score) END, '; '
                                  ORDER BY j.judge_kind) AS verdict
                FROM probe_pairs pp
                LEFT JOIN (SELECT * FROM judgements WHERE run_id = $1
                           AND metric || chr(31) || input_id IN (SELECT unnest($2::VARCHAR[]))) j
                       ON j.metric = pp.metric AND j.pair_id = pp.pair_id
                WHERE pp.run_id = $1 AND pp.metric || chr(31) || pp.input_id IN (SELECT unnest($2::VARCHAR[]))
                GROUP BY ALL""", [keys])):
            pairs.setdefault((p["metric"], p["input_id"]), []).append(p)
        for j in _records(rd.q("""
                SELECT j.metric, j.input_id,
                       coalesce(CAST(j.sample_index AS VARCHAR), CASE WHEN j.category = 'baseline' THEN 'base' END,
                                j.variant_id, j.input_id) AS key,
                       coalesce(j.label, j.judge_kind) AS label, j.score, j.status, j.error
                FROM judgements j
                WHERE j.run_id = ? AND j.metric || chr(31) || j.input_id IN (SELECT unnest(?::VARCHAR[]))
                  AND NOT EXISTS (SELECT 1 FROM probe_pairs pp WHERE pp.run_id = j.run_id AND pp.metric = j.metric
                                  AND pp.pair_id = j.pair_id)
                ORDER BY j.metric, j.input_id, key, j.label""", [keys])):
            verdicts.setdefault((j["metric"], j["input_id"]), {}).setdefault(str(j["key"]), []).append(j)

    by_role = _records(rd.q("""
        SELECT role, count(*) AS calls, count(*) FILTER (WHERE status <> 'ok') AS failed,
               count(*) FILTER (WHERE source = 'reused') AS reused,
               CAST(sum(prompt_tokens) AS BIGINT) AS prompt_tokens,
               CAST(sum(completion_tokens) AS BIGINT) AS completion_tokens, median(latency_ms) AS p50_latency_ms
        FROM llm_calls WHERE run_id = ? GROUP BY role ORDER BY role"""))
    by_metric_cost = _records(rd.q("""
        SELECT role, metric, stage, count(*) AS calls, count(*) FILTER (WHERE status <> 'ok') AS failed,
               count(*) FILTER (WHERE source = 'reused') AS reused,
               CAST(sum(prompt_tokens) AS BIGINT) AS prompt_tokens,
               CAST(sum(completion_tokens) AS BIGINT) AS completion_tokens, median(latency_ms) AS p50_latency_ms
        FROM llm_calls WHERE run_id = ? GROUP BY ALL ORDER BY role, metric, stage"""))
    notes = _records(rd.q("SELECT metric, stage, level, code, message FROM run_notes WHERE run_id = ? "
                          "ORDER BY level, metric, stage, code"))

    body = [_header(run, db)]
    toc = ['<nav class="toc"><a href="#summary">summary</a>', '<a href="#samples">samples</a>' if metrics else ""] + [
        f'<a href="#m-{_slug(m)}">{_e(m.removeprefix("llm."))}</a>' for m in metrics] + [
        '<a href="#cost">model calls</a>', '<a href="#notes">notes</a>' if notes else "", "</nav>"]
    body.append("".join(toc))
    missing = [m for m in configured if m not in metrics]
    if metrics:
        body.append(_overview(metrics, overall))
    else:
        body.append('<h2 id="summary">Summary</h2><p class="err">No metric of this run has been aggregated yet.</p>')
    if missing:
        body.append(f'<p class="muted">Configured but not aggregated: {", ".join(f"<code>{_e(m)}</code>" for m in missing)}</p>')
    if metrics:
        body.append(viewer.section(viewer.read(lambda sql, params=None: _records(rd.q(sql, params)), metrics,
                                               rows_per_metric, run_id)))
    spec_metrics = spec.get("metrics") or {}
    for m in metrics:
        body.append(_metric_section(m, by_metric[m], spec_metrics.get(m) or {},
                                    [r for r in weakest_all if r["metric"] == m],
                                    [r for r in errored_all if r["metric"] == m], row_counts, evidence, pairs,
                                    verdicts, run_id))
    body.append(_cost_section(by_role, by_metric_cost))
    body.append(_notes_section(notes))
    generated = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    body.append(f'<p class="muted" style="margin-top:40px">Generated {generated} by aip_assets {_e(__version__)}.</p>')
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>aip report · {_e(run_id)}</title><style>{CSS}{viewer.CSS}</style></head>"
            f"<body><main>{''.join(body)}</main></body></html>\n")


def default_out(run_id: str, path: str | Path | None = None) -> Path:
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", run_id)
    return _warehouse_path(path).parent / "reports" / f"{safe}.html"


def write_report(run_id: str, out: str | Path | None = None, path: str | Path | None = None,
                 rows_per_metric: int = viewer.ROWS_PER_METRIC) -> Path:
    """Write the report (default ``<warehouse dir>/reports/<run_id>.html``) and return its path. In
    a lake it is also kept in the lake's ``reports`` table under its file name (the report
    server's URL), replacing the one before, so every host's report server has it."""
    text = build_report(run_id, path, rows_per_metric)
    target = Path(out) if out else default_out(run_id, path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8")
    if lake.enabled() and not out:
        now = datetime.now(timezone.utc).replace(tzinfo=None)

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


REPORT_PORT = 8112  # `aip-eval report --serve` listens here; AIP_REPORT_PORT chooses another


def report_port() -> int:
    import os

    return int(os.environ.get("AIP_REPORT_PORT", REPORT_PORT))


def report_url(report: Path, port: int | None = None) -> str:
    """Where `aip-eval report --serve` serves ``report`` (a browser will not open a file:// link
    from a web page such as the Dagster UI)."""
    from urllib.parse import quote

    return f"http://127.0.0.1:{port or report_port()}/{quote(report.name)}"


class _NotServed(Exception):
    """A request the report server answers with a 404: ``missing`` when nothing is there (a lake
    may have it), else something that is there but is not served (a link, a FIFO, a device)."""

    def __init__(self, missing: bool = False):
        self.missing = missing


def _request_parts(raw: str) -> tuple[list[str], bool]:
    """The names below the reports folder a request's path asks for, and whether it asks for a
    folder (a trailing slash). Only plain names: a path with an empty name (``//``), ``.``, ``..``,
    a backslash or a NUL, once decoded, asks for nothing."""
    from urllib.parse import unquote

    path = raw.split("?", 1)[0].split("#", 1)[0]
    if not path.startswith("/"):
        raise _NotServed()
    names = unquote(path[1:]).split("/")
    folder = names[-1] == ""
    if folder:
        names.pop()
    if any(n in ("", ".", "..") or "\\" in n or "\0" in n for n in names):
        raise _NotServed()
    return names, folder


def _open_below(root: str, names: list[str]) -> tuple[int, os.stat_result]:
    """A regular file or a folder below ``root``, opened one name at a time from the folder above
    it, never following a symbolic link (O_NOFOLLOW) and never opening anything but a folder or a
    regular file of one link (a FIFO would hang the server; a hard link may be a file from
    elsewhere): (its descriptor, its stat). Raises _NotServed."""
    import stat

    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
    fd = os.open(root, os.O_RDONLY | os.O_CLOEXEC | os.O_DIRECTORY)
    try:
        for i, name in enumerate(names):
            try:
                seen = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                raise _NotServed(missing=True) from None
            last = i == len(names) - 1
            if not (stat.S_ISDIR(seen.st_mode) or (last and stat.S_ISREG(seen.st_mode) and seen.st_nlink == 1)):
                raise _NotServed()
            opened = os.open(name, flags | (0 if stat.S_ISREG(seen.st_mode) else os.O_DIRECTORY), dir_fd=fd)
            os.close(fd)
            fd = opened
            now = os.fstat(fd)
            if (now.st_dev, now.st_ino, stat.S_IFMT(now.st_mode)) != (seen.st_dev, seen.st_ino,
                                                                         stat.S_IFMT(seen.st_mode)):
                raise _NotServed()  # replaced between the look and the open
        return fd, os.fstat(fd)
    except BaseException:
        os.close(fd)
        raise


def _listing(fd: int, shown_as: str) -> bytes:
    """A folder's page: its folders and the regular files it would serve (no link, nothing else)."""
    import stat
    from urllib.parse import quote

    names = []
    with os.scandir(fd) as entries:
        for e in entries:
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                names.append(e.name + "/")
            elif stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
                names.append(e.name)
    items = "".join(f'<li><a href="{quote(n)}">{escape(n)}</a></li>\n' for n in sorted(names, key=str.lower))
    title = escape(f"Reports: {shown_as}")
    return (f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{title}</title></head>\n'
            f"<body><h1>{title}</h1>\n<ul>\n{items}</ul></body></html>\n").encode("utf-8")


def serve_reports(folder: Path, host: str = "127.0.0.1", port: int | None = None):
    """An HTTP server for the reports folder (read-only: files and a listing, nothing else); in a
    lake, a report the folder lacks is served from the lake (written by a worker elsewhere).
    It serves only regular files and folders inside the folder: a request whose path names a
    symbolic link at any step, a FIFO, a device or a socket, a file with another hard link, or
    that spells ``..``, ``//`` or a backslash in any encoding, is a 404 that names nothing.
    Returns the server; ``serve_forever()`` runs it, ``shutdown()`` stops it."""
    import io
    from http import HTTPStatus
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    folder.mkdir(parents=True, exist_ok=True)
    root = os.path.realpath(folder)

    class Reports(SimpleHTTPRequestHandler):
        def log_message(self, format, *args):  # noqa: A002 - the stdlib's name
            pass

        def _answer(self, body: bytes, ctype: str, modified: float | None = None) -> io.BytesIO:
            self.send_response(HTTPStatus.OK)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            if modified is not None:
                self.send_header("Last-Modified", self.date_time_string(modified))
            self.end_headers()
            return io.BytesIO(body)

        def _from_lake(self, name: str):
            """The lake's copy of a report the folder lacks (a file object, or None: answered)."""
            try:
                html = stored_report(name)
            except AipError:  # no lake made yet: no such report
                html = None
            except Exception as e:  # noqa: BLE001 - said to the browser, the server goes on
                self.send_error(HTTPStatus.SERVICE_UNAVAILABLE, f"the lake cannot be read: {type(e).__name__}")
                return None
            if html is None:
                self.send_error(HTTPStatus.NOT_FOUND, "File not found")
                return None
            return self._answer(html.encode("utf-8"), "text/html; charset=utf-8")

        def send_head(self):  # what GET and HEAD answer (the stdlib's, without following links)
            import stat

            names: list[str] = []
            want_folder = False
            try:
                names, want_folder = _request_parts(self.path)
                fd, st = _open_below(root, names)
            except _NotServed as e:
                if (e.missing and lake.enabled() and len(names) == 1 and names[0].endswith(".html")
                        and not want_folder):
                    return self._from_lake(names[0])
                self.send_error(HTTPStatus.NOT_FOUND, "File not found")
                return None
            except (OSError, ValueError):  # a name the system will not take, a link, a folder's file
                self.send_error(HTTPStatus.NOT_FOUND, "File not found")
                return None
            if stat.S_ISREG(st.st_mode):
                if want_folder:
                    os.close(fd)
                    self.send_error(HTTPStatus.NOT_FOUND, "File not found")
                    return None
                f = os.fdopen(fd, "rb")
                self.send_response(HTTPStatus.OK)
                self.send_header("Content-Type", self.guess_type(names[-1]))
                self.send_header("Content-Length", str(st.st_size))
                self.send_header("Last-Modified", self.date_time_string(st.st_mtime))
                self.end_headers()
                return f
            try:  # a folder
                if not want_folder:
                    self.send_response(HTTPStatus.MOVED_PERMANENTLY)
                    self.send_header("Location", self.path.split("?", 1)[0].split("#", 1)[0] + "/")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return None
                return self._answer(_listing(fd, "/" + "".join(n + "/" for n in names)), "text/html; charset=utf-8")
            finally:
                os.close(fd)

    return ThreadingHTTPServer((host, report_port() if port is None else port), Reports)

