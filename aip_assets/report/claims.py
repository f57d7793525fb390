"""The report's tables of claims: everything a metric states as beyond chance (``metric_scores`` scope
``claim``, decided once by ``aip_assets.analysis``), every claim of a metric in one table, and what
the run could detect. The pieces the metrics' own tables are built of are here too (a number, an
interval, a decision, a gate); the tables built on the claims are each metric's: who is favoured and
the no-effect baseline (decision flip, ``flip_tables``), the groups with every other attribute held
(group interaction bias, ``group_tables``).

They read the rows the summary and ``--json`` read, and print each figure as stored: a claim's
interval always with its confidence level (the claim's matching level, never a plain 95%), a
descriptive interval labelled as such, and each decision in the words of its stored status.
"""

from __future__ import annotations

from typing import Any

from ..analysis.claims import confidence_words
from ..catalog.groups import group_words
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
