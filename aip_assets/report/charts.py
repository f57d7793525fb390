"""The report's charts: horizontal bars with 95% whiskers, drawn as inline SVG (no script, no
external resource)."""

from __future__ import annotations

import math
from typing import Any

from .labels import chart_config
from .values import _attrs, _e, _f3, _int, _json, _raw, _v


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


def _bar_chart(
    metric: str, scope: str, bars: list[dict[str, Any]], kind: str, field: str, threshold: float | None = None
) -> str:
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
    out = [
        f'<svg class="bars" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img"'
        f"{_attrs(aria_label=f'{metric} {scope}', data_metric=metric, data_scope=scope)}>"
    ]
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
        out.append(
            f'<text x="{label_w}" y="{cy + 4:.1f}" text-anchor="end"><title>{_e(b.get("title") or full)}</title>'
            f"{_e(short)}</text>"
        )
        v = b["value"]
        fill = color
        th = b.get("threshold", threshold)
        if kind == "score" and th is not None and v is not None and v < th:
            fill = "#c0504d"
        if b.get("threshold") is not None and 0 <= b["threshold"] <= dom:  # this bar's own threshold
            tx = sx(b["threshold"])
            out.append(
                f'<line x1="{tx:.1f}" y1="{y + 1}" x2="{tx:.1f}" y2="{y + row_h - 1}" stroke="#c62828" '
                f'stroke-width="2"><title>threshold {_f3(b["threshold"])}</title></line>'
            )
        if v is not None:
            w = max(sx(v) - x0, 0.0)
            out.append(f'<rect x="{x0}" y="{y + 4}" width="{w:.1f}" height="{row_h - 8}" fill="{fill}" rx="2"/>')
        lo, hi = b.get("lo"), b.get("hi")
        if lo is not None and hi is not None:
            a, c = sx(lo), sx(hi)
            out.append(
                f'<g class="ci" stroke="#222" stroke-width="1.3"><title>95% interval [{_f3(lo)}, {_f3(hi)}]'
                f'</title><line x1="{a:.1f}" y1="{cy:.1f}" x2="{c:.1f}" y2="{cy:.1f}"/>'
                f'<line x1="{a:.1f}" y1="{cy - 5:.1f}" x2="{a:.1f}" y2="{cy + 5:.1f}"/>'
                f'<line x1="{c:.1f}" y1="{cy - 5:.1f}" x2="{c:.1f}" y2="{cy + 5:.1f}"/></g>'
            )
        common = dict(data_metric=b.get("metric", metric), data_scope=scope, data_key=b["key"])
        text = _int(v) if kind == "count" else _f3(v)
        out.append(
            f'<text x="{x0 + bar_w + 10}" y="{cy + 4:.1f}" class="v"{_attrs(**common, data_field=field)}'
            f' data-value="{_e(_raw(b["raw_value"]))}">{text}</text>'
        )
        if b.get("n") is not None and kind != "count":
            out.append(
                f'<text x="{x0 + bar_w + 10 + val_w}" y="{cy + 4:.1f}" class="tick"'
                f'{_attrs(**common, data_field="n")} data-value="{_e(_raw(b["n"]))}">n={_int(b["n"])}</text>'
            )
    if threshold is not None and kind == "score" and 0 <= threshold <= dom:
        x = sx(threshold)
        out.append(
            f'<line x1="{x:.1f}" y1="{top - 4}" x2="{x:.1f}" y2="{height - 6}" stroke="#c62828" '
            f'stroke-dasharray="4 3" stroke-width="1.2"><title>threshold {_f3(threshold)}</title></line>'
        )
    out.append("</svg>")
    return "".join(out)


def _scope_chart(metric: str, scope: str, rows: list[dict[str, Any]], threshold: float | None) -> str:
    cfg = chart_config(metric, scope)
    if cfg is None:  # a breakdown this module does not know yet: score (or rate) with its interval if any
        field = "score" if any(r.get("score") is not None for r in rows) else "rate"
        lo, hi = ("ci_low", "ci_high") if field == "score" else ("rate_ci_low", "rate_ci_high")
        cfg = {"value": field, "lo": lo, "hi": hi, "kind": "score" if field == "score" else "rate", "title": f"{scope}"}
    field, kind = cfg["value"], cfg["kind"]
    total = len(rows)
    if "order" in cfg:
        rank = {k: i for i, k in enumerate(cfg["order"])}
        rows = sorted(rows, key=lambda r: (rank.get(r["group_key"], len(rank)), str(r["group_key"])))
    else:
        desc = cfg.get("sort") == "desc"
        rows = sorted(
            rows,
            key=lambda r: (
                r.get(field) is None,
                -(r.get(field) or 0) if desc else (r.get(field) or 0),
                str(r["group_key"]),
            ),
        )
    if cfg.get("cap"):
        rows = rows[: cfg["cap"]]
    # a breakdown gated row by row (group interaction bias's groups: group_threshold; a group the pool
    # cannot tell apart is not gated) draws each row's own threshold, not the metric's
    own_threshold = kind == "score" and any(_v(r.get("threshold")) is not None for r in rows)
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
        elif scope == "baseline" and key == "all":
            label = title = "all axes (every null pair)"
        elif scope == "group" and details.get("inseparable"):
            title = f"{key}: {details['inseparable']} (not gated)"
        bar: dict[str, Any] = {
            "key": key,
            "label": label,
            "title": title,
            "value": r.get(field),
            "raw_value": r.get(field),
            "lo": r.get(cfg["lo"]) if cfg.get("lo") else None,
            "hi": r.get(cfg["hi"]) if cfg.get("hi") else None,
            "n": r.get("n"),
        }
        if own_threshold:
            bar["threshold"] = _v(r.get("threshold"))
        bars.append(bar)
    note = ""
    if cfg.get("cap") and total > len(rows):
        note = f' <span class="note">the {len(rows)} lowest of {total}</span>'
    elif scope in ("attribute", "persona", "pair", "group"):
        note = f' <span class="note">all {total}, lowest first</span>'
    svg = _bar_chart(metric, scope, bars, kind, field, threshold if kind == "score" and not own_threshold else None)
    return (
        f'<figure class="chart"{_attrs(data_metric=metric, data_scope=scope, data_groups=total)}>'
        f"<figcaption>{_e(cfg['title'])}{note}</figcaption>{svg}</figure>"
    )
