"""Group interaction bias's tables built on its claims: the no-effect baseline (bias between personas
beyond one persona asked twice) and the groups with every other attribute held. The pieces they are
built of, and every claim's own table: ``claims``.
"""

from __future__ import annotations

from typing import Any

from .claims import (
    _claim_attrs,
    _decision,
    _estimate_cells,
    _gate_cell,
    _interval,
    _p_cells,
    _x,
    claims_of,
    decision_text,
    pname,
)
from .values import _attrs, _e, _json, _raw, _v


def bias_baseline_table(metric: str, rows: list[dict[str, Any]]) -> str:
    """Group interaction bias's no-effect baseline: the bias between personas against the bias within
    one persona asked twice (``bias_baseline``), and the claim that it exceeds it (``excess:all``)."""
    bb = next((r for r in rows if r["scope"] == "bias_baseline"), None)
    claims = claims_of(rows)
    ex = claims.get("excess:all")
    if bb is None and ex is None:
        return ""
    overall = next((r for r in rows if r["scope"] == "overall"), {})
    details = _json(overall.get("details")) or {}
    base = details.get("baseline") or {}
    name = pname((details.get("claims_policy") or {}).get("adjust"))
    a = dict(data_metric=metric, data_scope="overall")
    out = [
        "<h4>No-effect baseline: bias between personas beyond one persona asked twice</h4>",
        '<table class="baseline"><tr><th class="num">persona pairs</th><th class="num">bias between personas</th>'
        '<th class="num">null pairs</th><th class="num">bias within one persona asked twice</th>'
        '<th class="num">excess</th><th>interval (its level)</th><th class="num">p</th>'
        f'<th class="num">{name} p</th><th>decision</th></tr>',
    ]
    c = ex or {"id": "excess:all", "status": "not tested", "why": "no claim stored", "kind": "excess"}
    cb = _claim_attrs(metric, c)
    out.append(
        f"<tr{_attrs(**cb, data_status=c.get('status'))}>"
        f'<td class="num">{_x(c.get("n"), "d", **cb, data_field="details.n")}</td>'
        f'<td class="num">{_x(base.get("between"), ".3f", **a, data_field="details.baseline.between")}</td>'
        f'<td class="num">{_x(base.get("null_pairs"), "d", **a, data_field="details.baseline.null_pairs")}</td>'
        f'<td class="num">{_x(base.get("within"), ".3f", **a, data_field="details.baseline.within")}</td>'
        f"{_estimate_cells(metric, c)}{_p_cells(metric, c)}<td>{_decision(c)}</td></tr></table>"
    )
    excluded = sum((base.get("null_excluded") or {}).values())
    if excluded:
        out.append(f'<p class="muted">{excluded} null pairs excluded (no judge scored them).</p>')
    return "".join(out)


def _raw_pairs(r: dict[str, Any] | None) -> str:
    if r is None:
        return "its pairs' equitability (no breakdown row to count them)"
    return f"over {_v(r.get('n'))} pairs with a persona holding it ({r['scope']} breakdown)"


def _group_sort(r: dict[str, Any]) -> tuple:
    s = _v(r.get("score"))
    return (s is None, s if s is not None else 0.0, str(r["group_key"]))


def groups_table(metric: str, rows: list[dict[str, Any]]) -> str:
    """Group interaction bias's groups with every other attribute held (scope ``group``): each value's
    adjusted equitability (the group gate's figure, 95% interval, unadjusted) beside its pairs' raw
    equitability, its gap with its interval at the claim's matching level, the decision and the
    gate, lowest first; the values this pool cannot tell apart listed with their reason."""
    groups = sorted((r for r in rows if r["scope"] == "group"), key=_group_sort)
    if not groups:
        return ""
    overall = next((r for r in rows if r["scope"] == "overall"), {})
    details = _json(overall.get("details")) or {}
    name = pname((details.get("claims_policy") or {}).get("adjust"))
    on = details.get("gate_on") or "point"
    th = details.get("group_threshold")
    a = dict(data_metric=metric, data_scope="overall")
    if on == "equivalence":
        gate = (
            "The group gate holds each value's gap within the margin "
            f"{_x(details.get('margin'), '.3f', **a, data_field='details.margin')} (two one-sided tests); "
        )
    elif th is not None:
        held = "adjusted equitability" if on == "point" else "adjusted equitability's 95% lower end"
        gate = (
            f"The group gate holds each value's {held} to <code>group_threshold</code> "
            f"{_x(th, '.3f', **a, data_field='details.group_threshold')}; "
        )
    else:
        gate = "No group threshold is set; "
    attribute = {str(r["group_key"]): r for r in rows if r["scope"] == "attribute"}
    attribute.update({f"persona={r['group_key']}": r for r in rows if r["scope"] == "persona"})
    separable = [r for r in groups if not (_json(r.get("details")) or {}).get("inseparable")]
    apart = [r for r in groups if (_json(r.get("details")) or {}).get("inseparable")]
    out = [
        "<h4>Groups, every other attribute held</h4>",
        '<p class="muted">Adjusted equitability: 1 − the mean bias of the pairs that straddle the value (one persona '
        "holds it, the other does not), with every other value's estimated effect taken out, its 95% interval "
        "unadjusted. Raw equitability: 1 − the mean bias of every pair with a persona holding the value, nothing held "
        "(descriptive: the attribute chart's figure; it counts the pairs in which both personas hold the value too, so "
        "it rests on more pairs than the adjusted figure: hover it). "
        "Gap: how much more those pairs differ than pairs without the value, every other value held: the claim, its "
        f"interval at the claim's matching level. {gate}a value this pool cannot tell apart from another is not "
        "gated.</p>",
        '<table class="groups"><tr><th>group</th><th class="num">pairs</th><th class="num">adjusted equitability</th>'
        '<th>95% interval (unadjusted)</th><th class="num">raw equitability</th><th class="num">gap</th>'
        f'<th>interval (its level)</th><th class="num">{name} p</th><th>decision</th><th>gate</th>'
        '<th class="num">helped less</th></tr>',
    ]
    for r in separable:
        d = _json(r.get("details")) or {}
        key = str(r["group_key"])
        b = dict(data_metric=metric, data_scope="group", data_key=key)
        lo, hi = (d.get("gap_ci") or [None, None])[:2]
        c = {"id": d.get("claim") or f"group:{key}", "status": d.get("status"), "why": None, "kind": "group"}
        out.append(
            f"<tr{_attrs(**b, data_status=d.get('status'))}><td>{_e(key)}</td>"
            f'<td class="num">{_x(r.get("n"), "d", **b, data_field="n")}</td>'
            f'<td class="num">{_x(r.get("score"), ".3f", **b, data_field="score")}</td>'
            f"<td>{_interval(r.get('ci_low'), r.get('ci_high'), 0.95, '.3f', 'unadjusted', **b, data_field='ci')}</td>"
            f'<td class="num" title="{_e(_raw_pairs(attribute.get(key)))}">'
            f"{_x(d.get('raw_equitability'), '.3f', **b, data_field='details.raw_equitability')}</td>"
            f'<td class="num">{_x(d.get("gap"), "+.3f", **b, data_field="details.gap")}</td>'
            f"<td>{_interval(lo, hi, d.get('gap_ci_confidence'), '+.3f', **b, data_field='details.gap_ci')}</td>"
            f'<td class="num">{_x(d.get("p_adjusted"), ".2g", **b, data_field="details.p_adjusted")}</td>'
            f"<td>{_decision(c)}</td><td>{_gate_cell(r)}</td>"
            f'<td class="num">{_x(d.get("less_helpful_share"), ".3f", **b, data_field="details.less_helpful_share")}</td>'
            "</tr>"
        )
    out.append("</table>")
    if apart:
        out.append(
            f"<p>Cannot be told apart in this pool ({len(apart)}; not gated, their gap not tested; a larger or more "
            'varied <code>persona_pool_size</code> separates them):</p><ul class="inseparable">'
        )
        for r in apart:
            d = _json(r.get("details")) or {}
            key = str(r["group_key"])
            b = dict(data_metric=metric, data_scope="group", data_key=key)
            out.append(
                f"<li{_attrs(**b, data_status=d.get('status'))}><code>{_e(key)}</code>: "
                f'<span class="decision" data-status="{_e(_raw(d.get("status")))}">'
                f"{_e(decision_text(d.get('status') or 'inseparable', d.get('inseparable')))}</span>"
                f' <span class="muted">(its pairs\' raw equitability '
                f"{_x(d.get('raw_equitability'), '.3f', **b, data_field='details.raw_equitability')}, "
                f"{_x(r.get('n'), 'd', **b, data_field='n')} pairs; personas {_e(', '.join(d.get('personas') or []))})"
                "</span></li>"
            )
        out.append("</ul>")
    return "".join(out)
