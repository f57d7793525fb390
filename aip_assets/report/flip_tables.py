"""Decision flip's tables built on its claims: who is favoured (each value against the rest of its axis),
two attributes at once (intersections, and names, which carry both), and the no-effect baseline (flips
beyond one persona asked twice). The pieces they are built of, and every claim's own table: ``claims``.
"""

from __future__ import annotations

from typing import Any

from ..catalog.groups import is_combination, parse_axis
from .claims import (
    _claim_attrs,
    _decision,
    _estimate_cells,
    _gate_cell,
    _interval,
    _p_cells,
    _x,
    claims_of,
    pname,
    policy_of,
)
from .values import _attrs, _e, _json, _v


def favoured_table(metric: str, rows: list[dict[str, Any]]) -> str:
    """Who is favoured (decision flip's ``favourable`` rows and ``favoured`` claims): per axis, whether
    the favourable decision depends on the value, then each value's favourable rate against the
    rest of its axis, the within-question difference with its interval at the claim's level, the
    decision, the odds ratio, the impact ratio with its 95% interval (unadjusted) and the
    ``min_impact_ratio`` gate when set."""
    fav = [r for r in rows if r["scope"] == "favourable"]
    if not fav:
        return ""
    claims = claims_of(rows)
    overall = next((r for r in rows if r["scope"] == "overall"), {})
    details = _json(overall.get("details")) or {}
    name = pname((details.get("claims_policy") or {}).get("adjust"))
    gated = any(_v(r.get("threshold")) is not None or _v(r.get("passed")) is not None for r in fav)
    on = details.get("gate_on") or "point"
    axes: dict[str, list[tuple[dict[str, Any], dict[str, Any]]]] = {}
    for r in fav:
        d = _json(r.get("details")) or {}
        if is_combination(str(d.get("axis"))) or parse_axis(str(d.get("axis")))[1] == "name":
            continue  # intersections_table: combinations, their interaction, and names with the other attribute held
        axes.setdefault(str(d.get("axis")), []).append((r, d))
    if not axes:
        return ""
    cols = 9 + gated
    out = [
        "<h4>Who is favoured: each value against the rest of its axis</h4>",
        '<p class="muted">Favourable: the share of its answers with a decision that give the favourable one '
        "(Wilson 95% intervals: the chart above). Difference: its favourable rate against the rest of the axis "
        "within questions (a fixed effect per question), the claim's estimate, its interval at the claim's matching "
        "level. Odds ratio: Mantel–Haenszel within questions (n/a: no finite value). Impact ratio: its favourable "
        "rate over the axis's highest, each standardised to the axis's mix of questions (so not the ratio of the "
        "raw rates shown), with a 95% interval from resampling questions, unadjusted: descriptive, not a claim."
        + (
            " Gate: <code>min_impact_ratio</code>"
            + (" on the impact ratio" if on == "point" else " on its 95% lower end")
            if gated
            else ""
        )
        + "</p>",
        '<table class="favoured"><tr><th>value</th><th class="num">answers</th><th class="num">favourable</th>'
        '<th class="num">rest of axis</th><th class="num">difference</th><th>interval (its level)</th>'
        f'<th class="num">{name} p</th><th>decision</th><th class="num">odds ratio</th><th>impact ratio (95%, '
        f"unadjusted)</th>{'<th>gate</th>' if gated else ''}</tr>",
    ]
    for axis in sorted(axes):
        omni = claims.get(f"favoured:{axis}")
        highest = next((d.get("highest") for _, d in axes[axis] if d.get("highest") is not None), None)
        if omni is None:
            verdict = '<span class="muted">not tested: fewer than two values with a decision</span>'
        else:
            verdict = (
                f"{_decision(omni, **_claim_attrs(metric, omni))} (p "
                f"{_x(omni.get('p_value'), '.2g', **_claim_attrs(metric, omni), data_field='details.p_value')}, "
                f"{name} p {_x(omni.get('p_adjusted'), '.2g', **_claim_attrs(metric, omni), data_field='details.p_adjusted')})"
            )
        out.append(
            f'<tr class="axis"{_attrs(data_metric=metric, data_axis=axis)}><td colspan="{cols}"><b>{_e(axis)}</b>: '
            f"does the favourable decision depend on the value? {verdict}"
            + ("" if highest is None else f"; impact ratios against <b>{_e(highest)}</b> (its highest)")
            + "</td></tr>"
        )
        values = sorted(
            axes[axis],
            key=lambda rd: (
                (claims.get(f"favoured:{rd[0]['group_key']}") or {}).get("estimate") is None,
                (claims.get(f"favoured:{rd[0]['group_key']}") or {}).get("estimate") or 0.0,
                str(rd[0]["group_key"]),
            ),
        )
        for r, d in values:
            key = str(r["group_key"])
            b = dict(data_metric=metric, data_scope="favourable", data_key=key)
            c = claims.get(f"favoured:{key}") or {"id": f"favoured:{key}", "status": None, "why": "no claim stored"}
            cb = _claim_attrs(metric, c)
            ir_lo, ir_hi = (d.get("impact_ratio_ci95") or [None, None])[:2]
            title = (
                f"{_v(r.get('n_events'))} of {_v(r.get('n'))}; Wilson 95% [{_fmt(r.get('rate_ci_low'))}, "
                f"{_fmt(r.get('rate_ci_high'))}]"
            )
            out.append(
                f"<tr{_attrs(**b, data_status=c.get('status'))}><td>{_e(d.get('value'))}</td>"
                f'<td class="num">{_x(r.get("n"), "d", **b, data_field="n")}</td>'
                f'<td class="num" title="{_e(title)}">{_x(r.get("rate"), ".3f", **b, data_field="rate")}</td>'
                f'<td class="num">{_x(c.get("rest_rate"), ".3f", **cb, data_field="details.rest_rate")}</td>'
                f"{_estimate_cells(metric, c)}{_p_cells(metric, c, raw=False)}<td>{_decision(c)}</td>"
                f'<td class="num">{_x(c.get("odds_ratio"), ".2f", **cb, data_field="details.odds_ratio")}</td>'
                f"<td>{_x(d.get('impact_ratio'), '.2f', **b, data_field='details.impact_ratio')} "
                f"{_interval(ir_lo, ir_hi, 0.95, '.2f', 'unadjusted', **b, data_field='details.impact_ratio_ci95')}</td>"
                + (f"<td>{_gate_cell(r, '.2f')}</td>" if gated else "")
                + "</tr>"
            )
    out.append("</table>")
    return "".join(out)


def intersections_table(metric: str, rows: list[dict[str, Any]]) -> str:
    """Decision flip's intersections (and its names, which carry gender and ethnicity at once): per
    intersection, whether any combination departs from what its two attributes alone predict; per
    combination its favourable rate, the additive model's prediction, its interaction (the claim's
    estimate and interval for a combination the analysis named) and the decision; each attribute's
    values with the named combinations held apart; and, with persona_form both, each value's
    explicit and name effects side by side."""
    import pandas as pd

    from ..metrics.decision_flip import words

    if not any(
        r["scope"] == "favourable" and is_combination(str((_json(r.get("details")) or {}).get("axis"))) for r in rows
    ):
        return ""
    frame = pd.DataFrame(rows)
    inter = words.intersections(frame)
    side = words.explicit_vs_name(frame)
    claims = claims_of(rows)
    overall = next((r for r in rows if r["scope"] == "overall"), {})
    name = pname(((_json(overall.get("details")) or {}).get("claims_policy") or {}).get("adjust"))
    out = [
        "<h4>Two attributes at once: combinations against what their attributes alone predict</h4>",
        '<p class="muted">Predicted: the additive model (a fixed effect per question, one per value of each '
        "attribute) for the combination. Interaction: its departure from that prediction, claimed for a "
        "combination the analysis names (forward selection while departure is left; the interval at the claim's "
        "level); for the others, the mean residual, descriptive. Attributes: each value against the rest within "
        "question and the other attribute's value, the named combinations apart, claimed only if it holds with "
        "any one of its combinations left out.</p>",
        '<table class="favoured"><tr><th>combination</th><th class="num">answers</th><th class="num">favourable</th>'
        '<th class="num">predicted</th><th class="num">interaction</th><th>interval (its level)</th>'
        f'<th class="num">{name} p</th><th>decision</th></tr>',
    ]
    for axis, it in inter.items():
        omni = claims.get(f"interaction:{axis}") or {"id": f"interaction:{axis}", "status": None}
        out.append(
            f'<tr class="axis"{_attrs(data_metric=metric, data_axis=axis)}><td colspan="8"><b>{_e(axis)}</b>: does '
            f"any combination depart from what {_e(' and '.join(it['attributes']))} alone predict? "
            f"{_decision(omni, **_claim_attrs(metric, omni))} ({name} p "
            f"{_x(omni.get('p_adjusted'), '.2g', **_claim_attrs(metric, omni), data_field='details.p_adjusted')})</td></tr>"
        )
        for v in sorted(it["combinations"], key=lambda v: (v["status"] != "claimed", v["favourable_rate"] or 0)):
            key = f"{axis}={v['value']}"
            b = dict(data_metric=metric, data_scope="favourable", data_key=key)
            c = claims.get(f"interaction:{key}")
            cells = (
                f"{_estimate_cells(metric, c)}{_p_cells(metric, c, raw=False)}<td>{_decision(c)}</td>"
                if c is not None
                else f'<td class="num">{_x(v.get("interaction"), "+.3f", **b, data_field="details.interaction")}</td>'
                '<td class="muted">descriptive</td><td></td><td class="muted">not named</td>'
            )
            out.append(
                f"<tr{_attrs(**b)}><td>{_e(v['group'])}</td>"
                f'<td class="num">{_x(v.get("answers"), "d", **b, data_field="n")}</td>'
                f'<td class="num">{_x(v.get("favourable_rate"), ".3f", **b, data_field="rate")}</td>'
                f'<td class="num">{_x(v.get("predicted_rate"), ".3f", **b, data_field="details.predicted_rate")}</td>'
                f"{cells}</tr>"
            )
        for m in it["main"]:
            c = claims.get(f"main:{axis}:{m['value']}") or {}
            if not c:
                continue
            out.append(
                f'<tr{_attrs(**_claim_attrs(metric, c))}><td>{_e(m["value"])} <span class="muted">({_e(m.get("held"))})'
                f"</span></td><td></td>"
                f'<td class="num">{_x(m.get("rate"), ".3f")}</td><td class="num">{_x(m.get("rest_rate"), ".3f")} rest</td>'
                f"{_estimate_cells(metric, c)}{_p_cells(metric, c, raw=False)}<td>{_decision(c)}</td></tr>"
            )
    out.append("</table>")
    if side:
        out += [
            "<h4>Explicit and by name, side by side</h4>",
            '<table class="favoured"><tr><th>value</th><th class="num">explicit: favourable</th>'
            '<th class="num">difference</th><th>decision</th><th class="num">by name: favourable</th>'
            '<th class="num">difference</th><th>decision</th></tr>',
        ]
        for axis, rs in side.items():
            for r in rs:
                e, nm = r["explicit"], r["name"]
                out.append(
                    f'<tr><td>{_e(axis)}={_e(r["value"])}</td><td class="num">{_x(e.get("favourable_rate"))}</td>'
                    f'<td class="num">{_x(e.get("difference"), "+.3f")}</td><td>{_e(e.get("status"))}</td>'
                    f'<td class="num">{_x(nm.get("favourable_rate"))}</td><td class="num">{_x(nm.get("difference"), "+.3f")}'
                    f"</td><td>{_e(nm.get('status'))}</td></tr>"
                )
        out.append("</table>")
    return "\n".join(out)


def _fmt(x: Any, spec: str = ".3f") -> str:
    x = _v(x)
    return "n/a" if x is None else format(x, spec)


def flip_baseline_table(metric: str, rows: list[dict[str, Any]]) -> str:
    """The no-effect baseline of decision flip: the null pairs' flip rate pooled (``baseline`` row
    ``all``) and whether the axes are held to it or each to its own, then per axis its flips beyond
    that baseline (the ``excess`` claims) beside its own null pairs."""
    base = {str(r["group_key"]): r for r in rows if r["scope"] == "baseline"}
    claims = claims_of(rows)
    excess = sorted(
        (c for c in claims.values() if c.get("kind") == "excess" and c.get("axis") is not None), key=lambda c: c["id"]
    )
    if not base and not excess:
        return ""
    overall = next((r for r in rows if r["scope"] == "overall"), {})
    name = pname(policy_of(overall).get("adjust"))
    out = ["<h4>No-effect baseline: flips beyond one persona asked twice</h4>"]
    pooled = base.get("all")
    if pooled is not None:
        d = _json(pooled.get("details")) or {}
        b = dict(data_metric=metric, data_scope="baseline", data_key="all")
        hp = d.get("homogeneity_p")
        if d.get("pooled", True):
            how = (
                "every axis is held to every null pair, pooled: their flip rates do not differ between axes beyond "
                "chance" + (f" (p {_x(hp, '.2g', **b, data_field='details.homogeneity_p')})" if hp is not None else "")
            )
        else:
            how = (
                "each axis is held to its own null pairs: their flip rates differ between axes (p "
                f"{_x(hp, '.2g', **b, data_field='details.homogeneity_p')})"
            )
        out.append(
            f"<p{_attrs(**b)}>The same persona asked twice (null pairs, shown to the judge as any pair) flips in "
            f"{_x(pooled.get('n_events'), 'd', **b, data_field='n_events')} of {_x(pooled.get('n'), 'd', **b, data_field='n')} "
            f"null pairs: {_x(pooled.get('rate'), '.3f', **b, data_field='rate')} "
            f"{_interval(pooled.get('rate_ci_low'), pooled.get('rate_ci_high'), 0.95, '.3f', 'Wilson', **b, data_field='rate_ci')}"
            f" ({_x(pooled.get('n_excluded'), 'd', **b, data_field='n_excluded')} excluded); {how}. Flips not beyond it "
            "are instability, not bias.</p>"
        )
    if excess:
        out.append(
            '<table class="baseline"><tr><th>axis</th><th class="num">persona pairs</th><th class="num">flip rate</th>'
            '<th>its own null pairs: flips (Wilson 95%)</th><th class="num">held against</th><th class="num">excess</th>'
            f'<th>interval (its level)</th><th class="num">p</th><th class="num">{name} p</th><th>decision</th></tr>'
        )
        for c in excess:
            cb = _claim_attrs(metric, c)
            own = base.get(str(c["axis"]))
            if own is None:
                mine = '<span class="muted">none</span>'
            else:
                ob = dict(data_metric=metric, data_scope="baseline", data_key=own["group_key"])
                mine = (
                    f"{_x(own.get('n_events'), 'd', **ob, data_field='n_events')} of "
                    f"{_x(own.get('n'), 'd', **ob, data_field='n')}: {_x(own.get('rate'), '.3f', **ob, data_field='rate')} "
                    f"{_interval(own.get('rate_ci_low'), own.get('rate_ci_high'), 0.95, '.3f', 'Wilson', **ob, data_field='rate_ci')}"
                )
            held = {"pooled": "every null pair", "axis": "its own"}.get(str(c.get("baseline")), str(c.get("baseline")))
            out.append(
                f"<tr{_attrs(**cb, data_status=c.get('status'))}><td>{_e(c['axis'])}</td>"
                f'<td class="num">{_x(c.get("n"), "d", **cb, data_field="details.n")}</td>'
                f'<td class="num">{_x(c.get("rate"), ".3f", **cb, data_field="details.rate")}</td><td>{mine}</td>'
                f'<td class="num">{_e(held)}: {_x(c.get("null_rate"), ".3f", **cb, data_field="details.null_rate")} '
                f"({_x(c.get('null_pairs'), 'd', **cb, data_field='details.null_pairs')})</td>"
                f"{_estimate_cells(metric, c)}{_p_cells(metric, c)}<td>{_decision(c)}</td></tr>"
            )
        out.append("</table>")
    return "".join(out)
