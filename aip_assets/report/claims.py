"""The report's tables of claims: everything a metric states as beyond chance (``metric_scores`` scope
``claim``, decided once by ``aip_assets.analysis``) and the tables built on them: who is favoured and
the no-effect baseline (decision flip), the groups with every other attribute held (group
interaction bias).

They read the rows the summary and ``--json`` read, and print each figure as stored: a claim's
interval always with its confidence level (the claim's matching level, never a plain 95%), a
descriptive interval labelled as such, and each decision in the words of its stored status.
"""

from __future__ import annotations

from typing import Any

from ..analysis.claims import confidence_words
from ..catalog.groups import group_words, is_combination, parse_axis
from .values import _attrs, _e, _json, _raw, _v

STATUS_ORDER = {"claimed": 0, "gated": 1, "not shown": 2, "not tested": 3, "inseparable": 4}
ADJUST_NAMES = {"holm": "Holm", "bh": "BH"}
OUTCOMES = {  # what a kind's omnibus claim says depends on the value
    "favoured": "the favourable decision",
    "refusal": "answering without a decision",
    "group": "how much a pair's answers differ",
}
INSEPARABLE = "cannot be told apart"


def pname(adjust: Any) -> str:
    """The adjustment's short name, as the summary prints it (``Holm p``, ``BH p``)."""
    return ADJUST_NAMES.get(str(adjust), "adjusted")


def policy_of(overall: dict[str, Any]) -> dict[str, Any]:
    return (_json(overall.get("details")) or {}).get("claims_policy") or {}


def claims_of(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The stored claims by id: each its details with its estimate and matched interval (as the
    metrics' ``words.claims_of`` reads them for the summary)."""
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        if r["scope"] != "claim":
            continue
        d = dict(_json(r.get("details")) or {})
        d.update(
            id=str(r["group_key"]), estimate=_v(r.get("raw_score")), ci=[_v(r.get("ci_low")), _v(r.get("ci_high"))]
        )
        out[d["id"]] = d
    return out


# --------------------------------------------------------------------------- numbers, intervals, decisions


def _x(x: Any, spec: str = ".3f", **attrs: Any) -> str:
    """A number as text in ``spec``, its exact value in ``data-value``."""
    x = _v(x)
    if spec == "d" and isinstance(x, float) and x.is_integer():
        x = int(x)  # a count stored as a float (a column with NULLs elsewhere, a JSON number)
    text = "n/a" if x is None else format(x, spec)
    return f'<span class="num"{_attrs(**attrs)} data-value="{_e(_raw(x))}">{_e(text)}</span>'


def _interval(lo: Any, hi: Any, confidence: Any, spec: str = "+.3f", note: str = "", **attrs: Any) -> str:
    """``[-0.526, -0.143] (99.93%)``: an interval, never without its confidence level (and ``note``:
    ``unadjusted``, ``Wilson``); the exact ends and level in ``data-low``, ``data-high``,
    ``data-confidence``."""
    lo, hi, confidence = _v(lo), _v(hi), _v(confidence)
    if lo is None and hi is None:
        return '<span class="muted">no interval</span>'
    f = lambda x: "n/a" if x is None else format(x, spec)  # noqa: E731
    level = "level not recorded" if confidence is None else confidence_words(confidence)
    return (
        f'<span class="ci"{_attrs(**attrs)} data-low="{_e(_raw(lo))}" data-high="{_e(_raw(hi))}" '
        f'data-confidence="{_e(_raw(confidence))}">[{f(lo)}, {f(hi)}] ({_e(level)}{", " + _e(note) if note else ""})</span>'
    )


def decision_text(status: Any, why: Any) -> str:
    """A stored claim's decision in words: ``beyond chance``, ``not shown``, ``not tested: <why>``,
    ``cannot be told apart: <why>``."""
    if status == "claimed":
        return "beyond chance"
    if status == "not shown":
        return "not shown"
    if status == "gated":
        return "not shown: beyond chance alone, but its axis as a whole is not"
    if status == "not tested":
        return f"not tested: {why or 'no test'}"
    if status == "inseparable":
        why = str(why or "the pool does not separate it from another value")
        return why if why.startswith(INSEPARABLE) else f"{INSEPARABLE}: {why}"
    return "no decision recorded" if status is None else str(status)


def _decision(c: dict[str, Any], **attrs: Any) -> str:
    """The decision as an element whose ``data-status`` is the stored status; a favoured value's
    direction and an equivalence shown beside it."""
    status = c.get("status")
    cls = {"claimed": "claimed", "inseparable": "muted", "not tested": "muted"}.get(str(status), "")
    out = (
        f'<span class="decision {cls}"{_attrs(**attrs)} data-status="{_e(_raw(status))}">'
        f"{_e(decision_text(status, c.get('why')))}</span>"
    )
    if status == "claimed" and c.get("kind") == "favoured" and c.get("value") is not None:
        out += f' <span class="muted">(decided {"against" if c.get("direction") == "less" else "for"})</span>'
    if c.get("equivalent"):
        out += ' <span class="muted">(shown within the margin: no bias beyond it, two one-sided tests)</span>'
    return out


def _claim_attrs(metric: str, c: dict[str, Any]) -> dict[str, Any]:
    return dict(data_metric=metric, data_scope="claim", data_key=c["id"])


def _claim_words(metric: str, c: dict[str, Any]) -> str:
    """What a claim names, with the figures it rests on."""
    kind, axis, value = c.get("kind"), c.get("axis"), c.get("value")
    b = _claim_attrs(metric, c)
    n = lambda k, spec=".3f": _x(c.get(k), spec, **b, data_field=f"details.{k}")  # noqa: E731
    if kind == "excess":
        where = _e(axis) if axis is not None else "every axis at once"
        held = {"pooled": ", every axis's", "axis": ", this axis's own"}.get(str(c.get("baseline")), "")
        return (
            f"{where}: persona pairs differ more than one persona asked twice ({n('rate')} vs {n('null_rate')}; "
            f"{n('null_pairs', 'd')} null pairs{held})"
        )
    if kind == "interaction":
        if value is None:
            return f"{_e(axis)}: some combination departs from what its two attributes alone predict"
        direction = "worse" if (_v(c.get("estimate")) or 0) < 0 else "better"
        return (
            f"{_e(group_words(str(axis), str(value)))} ({_e(axis)}={_e(value)}) fare {direction} than the two attributes "
            f"alone predict: favourable {n('rate')} vs {n('predicted')} predicted"
        )
    if kind == "main":
        attr = str(value).split("=", 1)[0]
        return (
            f"{_e(value)} against the rest of {_e(attr)} among the {_e(axis)} personas ({_e(c.get('held'))}): "
            f"favourable {n('rate')} vs {n('rest_rate')}"
        )
    if value is None:
        return f"{_e(axis)}: {_e(OUTCOMES.get(str(kind), kind))} depends on the value (every value at once)"
    rest = f"{n('rate')} vs {n('rest_rate')} for the rest of {_e(axis)}"
    if kind == "favoured":
        return f"{_e(axis)}={_e(value)} against the rest of its axis, within questions: favourable {rest}"
    if kind == "refusal":
        return f"{_e(axis)}={_e(value)} refused more than the rest of its axis (one-sided): no decision {rest}"
    if kind == "group":  # rate, rest_rate: the raw mean bias of the pairs that straddle it and of every other pair
        return (
            f"{_e(axis)}={_e(value)}: pairs that straddle it (one persona holds it) differ more than pairs that do not, "
            f"every other attribute held (one-sided; raw mean bias {n('rate')} vs {n('rest_rate')})"
        )
    return _e(c.get("method") or c["id"])


def _p_cells(metric: str, c: dict[str, Any], raw: bool = True) -> str:
    b = _claim_attrs(metric, c)
    cells = f'<td class="num">{_x(c.get("p_adjusted"), ".2g", **b, data_field="details.p_adjusted")}</td>'
    if raw:
        cells = f'<td class="num">{_x(c.get("p_value"), ".2g", **b, data_field="details.p_value")}</td>' + cells
    return cells


def _estimate_cells(metric: str, c: dict[str, Any], spec: str = "+.3f") -> str:
    """The estimate and its interval at the claim's matching level (an omnibus claim has neither)."""
    b = _claim_attrs(metric, c)
    if c.get("estimate") is None and c.get("value") is None and c.get("kind") != "excess":
        return '<td class="num muted">—</td><td class="muted">none: a test of every value at once</td>'
    lo, hi = (c.get("ci") or [None, None])[:2]
    if lo is None and hi is None:  # untested, or a test no shift moves (nothing to compare within its strata)
        ci = (
            '<span class="muted">none</span>'
            if c.get("status") in ("not tested", "inseparable")
            else ('<span class="muted">none: no shift of the effect moves the test (nothing to compare)</span>')
        )
    else:
        ci = _interval(lo, hi, c.get("ci_confidence"), spec, **b, data_field="ci")
    return f'<td class="num">{_x(c.get("estimate"), spec, **b, data_field="raw_score")}</td><td>{ci}</td>'


# --------------------------------------------------------------------------- every claim


def claims_table(metric: str, rows: list[dict[str, Any]], run_id: str) -> str:
    """Every claim of the metric in the run: what it names, its estimate, its interval at its matching
    level, its p-value raw and adjusted (named by the run's adjustment) and its decision; the claims
    made first, the others behind a fold."""
    claims = claims_of(rows)
    if not claims:
        return ""
    overall = next((r for r in rows if r["scope"] == "overall"), {})
    details = _json(overall.get("details")) or {}
    policy = details.get("claims_policy") or {}
    name = pname(policy.get("adjust"))
    a = dict(data_metric=metric, data_scope="overall")
    ordered = sorted(
        claims.values(),
        key=lambda c: (
            STATUS_ORDER.get(str(c.get("status")), len(STATUS_ORDER)),
            c.get("p_adjusted") if c.get("p_adjusted") is not None else 2.0,
            c["id"],
        ),
    )
    made = [c for c in ordered if c.get("status") == "claimed"]
    others = [c for c in ordered if c.get("status") != "claimed"]
    head = (
        '<table class="claims"{attrs}><tr><th>claim</th><th>what it names</th><th class="num">estimate</th>'
        f'<th>interval (its level)</th><th class="num">p</th><th class="num">{name} p</th><th>decision</th></tr>'
    )

    def table(cs: list[dict[str, Any]], which: str) -> str:
        out = [head.format(attrs=_attrs(data_metric=metric, data_claims=which))]
        for c in cs:
            out.append(
                f"<tr{_attrs(**_claim_attrs(metric, c), data_status=c.get('status'))}><td><code>{_e(c['id'])}</code></td>"
                f'<td title="{_e(c.get("method"))}">{_claim_words(metric, c)}</td>{_estimate_cells(metric, c)}'
                f"{_p_cells(metric, c)}<td>{_decision(c)}</td></tr>"
            )
        out.append("</table>")
        return "".join(out)

    words = policy.get("words") or f"{name}; the adjustment's words were not recorded"
    out = [
        f'<h4 id="claims-{_e(metric)}">Claims: what this run states beyond chance</h4>',
        f'<p class="muted">{_x(details.get("claims_made"), "d", **a, data_field="details.claims_made")} made of '
        f"{_x(details.get('claims_tested'), 'd', **a, data_field='details.claims_tested')} tested, decided as one "
        f"family at alpha {_x(policy.get('alpha'), 'g', **a, data_field='details.claims_policy.alpha')} "
        f"({_e(words)}). Each interval is at its claim's matching level, shown after it, so it excludes no effect "
        f"exactly when the claim is made; a value's claim needs its axis's too, so its {_e(name)} p is at least "
        "its axis's. The estimate is a difference: of flip rate or bias against null pairs (excess), of a rate "
        "against the rest of the axis within questions (favoured, refusal), of bias with every other attribute "
        "held (group).</p>",
    ]
    if made:
        out.append(table(made, "made"))
    else:
        out.append('<p data-claims="made">No claim made: nothing in this metric is shown beyond chance.</p>')
    if others:
        counts: dict[str, int] = {}
        for c in others:
            label = decision_text(c.get("status"), "").split(":")[0]
            counts[label] = counts.get(label, 0) + 1
        what = ", ".join(f"{n} {k}" for k, n in counts.items())
        out.append(f"<details><summary>the other {len(others)} claims ({_e(what)})</summary>{table(others, 'others')}")
        out.append("</details>")
    out.append(
        f"<p class=\"muted\"><code>SELECT * FROM v_claims WHERE run_id = '{_e(run_id)}' AND metric = '{_e(metric)}'"
        "</code> (the method of each: hover its words)</p>"
    )
    return "".join(out)


# --------------------------------------------------------------------------- decision flip


def _gate_cell(r: dict[str, Any], spec: str = ".3f") -> str:
    passed = _v(r.get("passed"))
    th = _v(r.get("threshold"))
    b = dict(data_metric=r["metric"], data_scope=r["scope"], data_key=r["group_key"])
    if passed is None:
        return f'<span class="muted" title="{_e(r.get("gate_reason"))}">not gated</span>'
    badge = (
        f'<span class="badge {"pass" if passed else "fail"}"{_attrs(**b, data_field="passed")} '
        f'data-value="{_raw(bool(passed))}" title="{_e(r.get("gate_reason"))}">{"PASS" if passed else "FAIL"}</span>'
    )
    return badge + ("" if th is None else f" ≥ {_x(th, spec, **b, data_field='threshold')}")


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


# --------------------------------------------------------------------------- group interaction bias


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


def detectable(metric: str, overall: dict[str, Any]) -> str:
    """What the run could detect (the overall row's ``detectable``), folded: each figure once."""
    d = (_json(overall.get("details")) or {}).get("detectable")
    if not isinstance(d, dict) or not d:
        return ""

    def flat(x: dict, prefix: str = ""):
        for k, v in x.items():
            if isinstance(v, dict):
                yield from flat(v, f"{prefix}{k}.")
            elif isinstance(v, (int, float)) and not isinstance(v, bool):
                yield f"{prefix}{k}", v

    a = dict(data_metric=metric, data_scope="overall")
    cells = "".join(
        f'<tr><td>{_e(k.replace("_", " ").replace(".", ": "))}</td><td class="num">'
        f"{_x(v, 'd' if isinstance(v, int) else '.3f', **a, data_field='details.detectable.' + k)}</td></tr>"
        for k, v in flat(d)
    )
    return (
        "<details><summary>what this run could detect (80% power, at the first step of the adjustment)</summary>"
        f'<table class="detectable">{cells}</table></details>'
    )
