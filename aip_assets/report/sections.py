"""The report's sections as HTML: the run's header, the summary, each metric's section (gate,
facts, charts, the judge checked against people, who is favoured, the groups with every other
attribute held, the no-effect baseline and every claim (``flip_tables.py``, ``group_tables.py``,
``claims.py``), the weakest rows with their probes and answers, errored rows), model calls and token
use, and run notes."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..models.providers import stored_capabilities
from . import claims, flip_tables, group_tables
from .charts import _bar_chart, _scope_chart
from .labels import HUMAN_SCOPE, _scope_label, chart_order, count_labels, not_charted, rate_label
from .queries import WEAKEST_ROWS
from .values import _attrs, _clip, _e, _f3, _int, _json, _num, _raw, _slug, _v

EVIDENCE_PER_ROW = 4
# the overall row's details shown in tables of their own (report/claims.py, flip_tables.py, group_tables.py), not
# as facts beside the headline
OWN_TABLES = frozenset({"baseline", "claims_policy", "claims_tested", "claims_made", "detectable"})
ROLES = ("sut", "judge", "synthesis")


def _human_table(metric: str, rows: list[dict[str, Any]]) -> str:
    """The judge checked against people (``aip-eval label import``): agreement and Cohen's kappa,
    each category's sensitivity and specificity, the key rate corrected for them (or why not)."""
    agreement = next((r for r in rows if r["group_key"] == "agreement"), None)
    if agreement is None:
        return ""
    d = _json(agreement.get("details")) or {}

    def cell(r: dict[str, Any], field: str, lo: str, hi: str) -> str:
        b = dict(data_metric=metric, data_scope=HUMAN_SCOPE, data_key=r["group_key"])
        return (
            f"{_num(r.get(field), **b, data_field=field)} [{_num(r.get(lo), **b, data_field=lo)}, "
            f"{_num(r.get(hi), **b, data_field=hi)}]"
        )

    def pair(x: Any) -> str:
        return "" if not x or x[0] is None else f" [{_f3(x[0])}, {_f3(x[1])}]"

    labellers = ", ".join(str(x) for x in d.get("labellers") or [])
    out = [
        "<h4>The judge checked against people</h4>",
        f'<p class="facts"{_attrs(data_metric=metric, data_scope=HUMAN_SCOPE)}><span class="f">labelled items '
        f"{_num(agreement.get('n'), 'int', data_metric=metric, data_scope=HUMAN_SCOPE, data_key='agreement', data_field='n')}"
        f' (by {_e(labellers)})</span> <span class="f">agreement {cell(agreement, "rate", "rate_ci_low", "rate_ci_high")}'
        f'</span> <span class="f">Cohen\'s kappa {cell(agreement, "raw_score", "ci_low", "ci_high")}</span></p>',
    ]
    for r in rows:
        if r["group_key"].startswith("agreement:"):
            out.append(
                f'<p class="facts"{_attrs(data_metric=metric, data_scope=HUMAN_SCOPE, data_key=r["group_key"])}>'
                f'<span class="f">its {_e(r["group_key"].split(":", 1)[1])} judge: agreement '
                f'{cell(r, "rate", "rate_ci_low", "rate_ci_high")}</span> <span class="f">kappa '
                f'{cell(r, "raw_score", "ci_low", "ci_high")}</span> <span class="f">on {_int(r.get("n"))} items'
                "</span></p>"
            )
    for r in rows:
        if not r["group_key"].startswith("corrected:"):
            continue
        c = _json(r.get("details")) or {}
        what = r["group_key"].split(":", 1)[1]
        b = dict(data_metric=metric, data_scope=HUMAN_SCOPE, data_key=r["group_key"])
        if r.get("rate") is None:
            out.append(
                f'<p{_attrs(**b)}>corrected {_e(what)} rate: <span class="muted">none: {_e(c.get("why"))}</span> '
                f"(the judge's {_num(r.get('raw_score'), **b, data_field='raw_score')})</p>"
            )
        else:
            out.append(
                f"<p{_attrs(**b)}>corrected {_e(what)} rate {cell(r, 'rate', 'rate_ci_low', 'rate_ci_high')} "
                f"against the judge's {_num(r.get('raw_score'), **b, data_field='raw_score')} "
                f'<span class="muted">({_e(c.get("what"))}; Rogan–Gladen with sensitivity '
                f"{_f3(c.get('sensitivity'))}, specificity {_f3(c.get('specificity'))})</span></p>"
            )
    out.append(
        '<table class="human"><tr><th>category</th><th class=num>people said</th><th class=num>judge said</th>'
        "<th>sensitivity (95% CI)</th><th>specificity (95% CI)</th></tr>"
    )
    for r in rows:
        if not r["group_key"].startswith("category:"):
            continue
        c = _json(r.get("details")) or {}
        out.append(
            f"<tr{_attrs(data_metric=metric, data_scope=HUMAN_SCOPE, data_key=r['group_key'])}>"
            f"<td>{_e(r['group_key'].split(':', 1)[1])}</td><td class=num>{_int(c.get('people_said'))}</td>"
            f"<td class=num>{_int(c.get('judge_said'))}</td>"
            f"<td>{cell(r, 'rate', 'rate_ci_low', 'rate_ci_high')}</td>"
            f"<td>{_f3(c.get('specificity'))}{pair(c.get('specificity_ci95'))}</td></tr>"
        )
    out.append(
        '</table><p class="muted">Each labelled item weighs the run\'s judgements in its judge category over '
        "those labelled there, so the figures speak of the run, not of the sample. "
        f"<code>SELECT * FROM v_human_agreement WHERE metric = '{_e(metric)}'</code>; each label beside the "
        "verdict: <code>v_human_vs_judge</code>.</p>"
    )
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


def _pick_evidence(
    row: dict[str, Any],
    entries: list[dict[str, Any]],
    pairs: list[dict[str, Any]],
    verdicts: dict[str, list[dict[str, Any]]],
) -> list[dict[str, Any]]:
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
        scores = [v["score"] for v in vs if v.get("score") is not None and v.get("label") != "correctness"] or [
            v["score"] for v in vs if v.get("score") is not None
        ]
        return 1 - min(scores) if scores else -1.0

    def note_for(vs: list[dict[str, Any]]) -> str | None:
        if not vs:
            return None
        return "judge: " + "; ".join(
            f"{v.get('label') or v.get('status')} {_f3(v.get('score'))}"
            if v.get("status") == "ok"
            else f"{v.get('status')}: {_clip(v.get('error'), 120)}"
            for v in vs
        )

    ordered = sorted(
        entries,
        key=lambda e: (
            e.get("role") not in ("base", "baseline"),
            -badness(verdict_for(e)),
            str(e.get("category") or ""),
            e.get("sample_index") or 0,
            e["probe_id"],
        ),
    )
    for i, e in enumerate(ordered):
        take(e, note_for(verdict_for(e)), i)
    return chosen


def _evidence_table(chosen: list[dict[str, Any]], total: int, metric: str, input_id: str) -> str:
    if not chosen:
        return '<p class="muted">No probes recorded for this row.</p>'
    out = [
        '<table class="evidence"><colgroup><col style="width:16%"><col style="width:42%"><col style="width:42%">'
        "</colgroup><tr><th>probe</th><th>what the SUT was asked</th><th>the SUT's answer</th></tr>"
    ]
    for e in chosen:
        alt = ' class="alt"' if e.get("group", 0) % 2 else ""
        if e.get("sut_status") is None:
            answer = '<span class="muted">(no answer recorded)</span>'
        elif e.get("sut_status") != "ok":
            answer = f'<span class="err">{_e(e["sut_status"])}: {_e(_clip(e.get("sut_error"), 300))}</span>'
        else:
            answer = _e(_clip(e.get("response")))
        note = f'<div class="verdict">{_e(e["note"])}</div>' if e.get("note") else ""
        out.append(
            f"<tr{alt}{_attrs(data_probe_id=e['probe_id'], data_sample_index=e.get('sample_index'))}>"
            f'<td class="meta">{_entry_meta(e)}{note}</td><td class="probe">{_e(_clip(e.get("query_text")))}'
            f'</td><td class="answer">{answer}</td></tr>'
        )
    out.append("</table>")
    if total > len(chosen):
        out.append(
            f'<p class="muted">{len(chosen)} of {total} probe answers shown; all of them: '
            f"<code>SELECT p.*, r.* FROM probes p JOIN sut_responses r USING (run_id, metric, probe_id) WHERE "
            f"p.metric = '{_e(metric)}' AND p.input_id = '{_e(input_id)}'</code></p>"
        )
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
        caps = stored_capabilities(c)
        if caps is not None and caps.offline and prof.get("name"):
            s += f" (profile {prof['name']})"
        elif c.get("base_url"):
            s += f" at {c['base_url']}"
        return s

    rows = [
        ("run", f"<code>{_e(run['run_id'])}</code>"),
        ("spec", _e(run.get("spec_name"))),
        ("created (UTC)", _e(run.get("created_at"))),
        (
            "dataset",
            f"<code>{_e(run.get('dataset_path'))}</code> · {_num(run.get('n_dataset_rows'), 'int', data_field='n_dataset_rows')} rows"
            f" · sha256 <code>{_e(str(run.get('dataset_sha256') or '')[:16])}</code>",
        ),
    ]
    others = {k: v for k, v in datasets.items() if k != run.get("dataset_path")}
    for k, v in others.items():
        rows.append(("other dataset", f"<code>{_e(k)}</code> · sha256 <code>{_e(str(v)[:16])}</code>"))
    rows += [
        ("package version", _e(run.get("package_version"))),
        ("seed", _e(run.get("seed"))),
        ("SUT", _e(conn(spec.get("sut")))),
        (
            "judge",
            _e(conn(spec.get("judge")))
            if not spec.get("judges")
            else f"a panel of {len(spec['judges'])} ({_e(spec.get('judge_rule'))}): "
            + "; ".join(f"{i}. {_e(conn(c))}" for i, c in enumerate(spec["judges"], 1)),
        ),
        ("synthesis", _e(conn(spec.get("synthesis"))) if spec.get("synthesis") else "the judge's connection"),
        ("metric versions", ", ".join(f"<code>{_e(m)}</code> {_e(v)}" for m, v in versions.items())),
    ]
    desc = f'<p class="sub">{_e(spec.get("description"))}</p>' if spec.get("description") else ""
    table = "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows)
    return (
        f"<h1>Evaluation report: <code>{_e(run['run_id'])}</code></h1>{desc}"
        f'<p class="sub">Read from <code>{_e(path)}</code>. Every number is the warehouse value; hover a chart label '
        f'for its full name.</p><table class="run">{table}</table>'
    )


def _badge(passed: Any) -> str:
    passed = _v(passed)
    if passed is None:
        return '<span class="badge none" data-field="passed" data-value="">no threshold</span>'
    return (
        f'<span class="badge {"pass" if passed else "fail"}" data-field="passed" '
        f'data-value="{_raw(bool(passed))}">{"PASS" if passed else "FAIL"}</span>'
    )


def _gate(metric: str, o: dict[str, Any]) -> str:
    """Why the gate passed or failed, and what was excluded from the score, by reason."""
    a = dict(data_metric=metric, data_scope="overall")
    excluded = _json(o.get("excluded")) or {}
    parts = [
        f'<p class="gate"{_attrs(**a, data_field="gate_reason")}><b>gate:</b> {_e(o.get("gate_reason") or "not recorded")}</p>'
    ]
    if excluded:
        cells = "".join(
            f'<tr><td><code>{_e(k)}</code></td><td class="num">'
            f"{_num(v, 'int', **a, data_field='excluded.' + k)}</td></tr>"
            for k, v in sorted(excluded.items(), key=lambda kv: -kv[1])
        )
        parts.append(
            f'<p class="muted">Excluded from the score and counted, by reason (of '
            f"{_num(o.get('n_planned'), 'int', **a, data_field='n_planned')} planned; docs/concepts/gate.md, "
            f'"What a score rests on"):</p><table class="excluded"><tr><th>reason</th><th class="num">units</th></tr>{cells}</table>'
        )
    return "".join(parts)


def _findings(findings: list[dict[str, Any]]) -> str:
    """The run's findings, ranked (findings.py): each sentence, its verdict, its example rows
    linked into the viewer (the metric's rows, the example open)."""
    from .links import viewer_fragment

    out = ['<h2 id="findings">Findings</h2>']
    if not findings:
        out.append('<p class="muted">None: no gate failed and no metric found an effect worth naming.</p>')
        return "".join(out)
    out.append('<ol class="findings">')
    for f in findings:
        examples = "; ".join(
            f'<a href="{_e(viewer_fragment(metric=f["metric"], open=e["input_id"]))}"><code>{_e(e["input_id"])}'
            f"</code></a> {_e(e['quote'])}"
            for e in f["examples"]
        )
        out.append(
            f'<li class="finding {_e(f["severity"])}" data-metric="{_e(f["metric"])}">'
            + (
                '<span class="badge fail">FAIL</span> '
                if f["severity"] == "fail"
                else '<span class="muted">note</span> '
            )
            + f'{_e(f["sentence"])} <a href="#m-{_slug(f["metric"])}"><code>{_e(f["metric"])}</code></a>'
            + (f'<div class="muted">e.g. {examples}</div>' if examples else "")
            + "</li>"
        )
    out.append("</ol>")
    return "".join(out)


def _overview(metrics: list[str], overall: dict[str, dict[str, Any]]) -> str:
    out = [
        '<h2 id="summary">Summary</h2><table class="overview"><tr><th>metric</th><th>name</th>'
        '<th class="num">score</th><th>95% CI</th><th class="num">coverage</th><th class="num">threshold</th>'
        "<th>verdict</th></tr>"
    ]
    for m in metrics:
        o = overall[m]
        a = dict(data_metric=m, data_scope="overall")
        out.append(
            f'<tr><td><a href="#m-{_slug(m)}"><code>{_e(m)}</code></a></td><td>{_e(o.get("metric_name"))}</td>'
            f'<td class="num">{_num(o.get("score"), **a, data_field="score")}</td>'
            f"<td>[{_num(o.get('ci_low'), **a, data_field='ci_low')}, {_num(o.get('ci_high'), **a, data_field='ci_high')}]</td>"
            f'<td class="num">{_num(o.get("coverage"), **a, data_field="coverage")}</td>'
            f'<td class="num">{_num(o.get("threshold"), **a, data_field="threshold")}</td>'
            f"<td>{_badge(o.get('passed'))}</td></tr>"
        )
    out.append("</table>")
    bars = [
        {
            "key": m,
            "metric": m,
            "label": m,
            "value": overall[m].get("score"),
            "raw_value": overall[m].get("score"),
            "lo": overall[m].get("ci_low"),
            "hi": overall[m].get("ci_high"),
            "n": overall[m].get("n"),
            "threshold": overall[m].get("threshold"),
        }
        for m in metrics
    ]
    out.append(
        '<figure class="chart" data-scope="overall"><figcaption>Overall scores <span class="note">whisker: '
        "95% interval; red tick: the metric's threshold; red bar: below it</span></figcaption>"
    )
    out.append(_bar_chart("all", "overall", bars, "score", "score") + "</figure>")
    return "".join(out)


def _facts(metric: str, o: dict[str, Any], extra_scopes: list[dict[str, Any]]) -> str:
    """The overall row's counts, rate and details, each once (a detail repeating a count is skipped)."""
    labels = count_labels(metric)
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
        add(
            rate_label(metric),
            f"{_num(o['rate'], **a, data_field='rate')} 95% CI [{_num(o.get('rate_ci_low'), **a, data_field='rate_ci_low')}, "
            f"{_num(o.get('rate_ci_high'), **a, data_field='rate_ci_high')}]",
        )
    for r in extra_scopes:  # e.g. decision flip's mean of per-axis flip rates
        b = dict(data_metric=metric, data_scope=r["scope"], data_key=r["group_key"])
        lab = _scope_label(r)
        if r.get("rate") is not None:
            add(lab, _num(r["rate"], **b, data_field="rate"))
            if r["scope"] == "judge_audit" and r.get("raw_score") is not None:
                add("Cohen's kappa", _num(r["raw_score"], **b, data_field="raw_score"))
            if r["scope"] == "judge_panel" and r.get("raw_score") is not None:
                kind = "Fleiss' kappa" if r["group_key"] == "panel" else f"Cohen's kappa ({r['group_key']})"
                add(
                    kind,
                    f"{_num(r['raw_score'], **b, data_field='raw_score')} 95% CI "
                    f"[{_num(r.get('ci_low'), **b, data_field='ci_low')}, "
                    f"{_num(r.get('ci_high'), **b, data_field='ci_high')}]",
                )
                d = _json(r.get("details")) or {}
                if r["group_key"] == "panel" and d.get("n_eff") is not None:
                    n_judges = len(d.get("judges") or [])
                    lo, hi = (d.get("n_eff_ci95") or [None, None])[:2]
                    add(
                        "effective number of judges",
                        f"{_num(d['n_eff'], **b, data_field='details.n_eff')} 95% CI "
                        f"[{_num(lo, **b, data_field='details.n_eff_ci95.0')}, "
                        f"{_num(hi, **b, data_field='details.n_eff_ci95.1')}]: the {n_judges} judges agree like "
                        f"{d['n_eff']:.1f} independent ones"
                        + (f" ({_e(d['n_eff_note'])})" if d.get("n_eff_note") else ""),
                    )
        elif r.get("score") is not None:
            add(lab, _num(r["score"], **b, data_field="score"))

    def flat(d: dict, prefix: str = "") -> Iterable[tuple[str, Any]]:
        for k, v in d.items():
            if isinstance(v, dict):
                yield from flat(v, f"{prefix}{k}.")
            else:
                yield f"{prefix}{k}", v

    details = {k: v for k, v in (_json(o.get("details")) or {}).items() if k not in OWN_TABLES}
    for k, v in flat(details):
        if isinstance(v, bool) or v is None or isinstance(v, (list, str)):
            continue
        add(
            k.replace("_", " ").replace(".", ": "),
            _num(v, "int" if isinstance(v, int) else "f3", **a, data_field="details." + k),
        )
    return f'<p class="facts">{" ".join(items)}</p>'


def _metric_section(
    metric: str,
    scores: list[dict[str, Any]],
    spec_metric: dict[str, Any],
    weakest: list[dict[str, Any]],
    unscored: list[dict[str, Any]],
    row_counts: dict[str, Any],
    evidence: dict[tuple[str, str], list[dict[str, Any]]],
    pairs: dict[tuple[str, str], list[dict[str, Any]]],
    verdicts: dict[tuple[str, str], dict[str, list[dict[str, Any]]]],
    run_id: str,
) -> str:
    o = next(r for r in scores if r["scope"] == "overall")
    a = dict(data_metric=metric, data_scope="overall")
    th = o.get("threshold")
    out = [
        f'<section class="metric" id="m-{_slug(metric)}"{_attrs(data_metric=metric)}>',
        f'<h2><code>{_e(metric)}</code> <span class="muted">({_e(o.get("metric_name"))})</span> {_badge(o.get("passed"))}</h2>',
        f'<p class="headline">score <span class="big">{_num(o.get("score"), **a, data_field="score")}</span>'
        f" &nbsp;95% CI [{_num(o.get('ci_low'), **a, data_field='ci_low')}, {_num(o.get('ci_high'), **a, data_field='ci_high')}]"
        f" &nbsp;threshold {_num(th, **a, data_field='threshold')}"
        f" &nbsp;coverage {_num(o.get('coverage'), **a, data_field='coverage')}"
        f"{'' if o.get('raw_score') == o.get('score') else ' &nbsp;raw ' + _num(o.get('raw_score'), **a, data_field='raw_score')}</p>",
        _gate(metric, o),
    ]
    out.append(_facts(metric, o, [r for r in scores if r["scope"] in not_charted() - {"overall", "claim"}]))
    out.append(claims.detectable(metric, o))
    out.append(_human_table(metric, [r for r in scores if r["scope"] == HUMAN_SCOPE]))
    if spec_metric.get("dataset"):
        out.append(f'<p class="muted">dataset <code>{_e(spec_metric["dataset"])}</code></p>')
    scopes: dict[str, list[dict[str, Any]]] = {}
    uncharted = not_charted() | {HUMAN_SCOPE}
    for r in scores:
        if r["scope"] not in uncharted:
            scopes.setdefault(r["scope"], []).append(r)
    order = chart_order(metric)
    for scope in sorted(scopes, key=lambda s: (order.index(s) if s in order else len(order), s)):
        out.append(_scope_chart(metric, scope, scopes[scope], th))
    # who is favoured and the no-effect baseline (decision flip), the groups with every other attribute held
    # (group interaction bias), then every claim; each reads the stored claims (report/flip_tables.py,
    # group_tables.py, claims.py)
    out.append(flip_tables.favoured_table(metric, scores))
    out.append(flip_tables.intersections_table(metric, scores))
    out.append(flip_tables.flip_baseline_table(metric, scores))
    out.append(group_tables.groups_table(metric, scores))
    out.append(group_tables.bias_baseline_table(metric, scores))
    out.append(claims.claims_table(metric, scores, run_id))

    rc = row_counts.get(metric) or {}
    out.append(
        f'<h3>Weakest rows</h3><p class="muted">{_int(rc.get("scored"))} rows scored, {_int(rc.get("excluded"))} excluded, '
        f"{_int(rc.get('errored'))} errored;"
        f" the {len(weakest)} lowest scores, lowest first, with up to {EVIDENCE_PER_ROW} of their probes and the "
        f"SUT's answers.</p>"
    )
    if not weakest:
        out.append('<p class="muted">No scored rows.</p>')
    for i, r in enumerate(weakest, 1):
        b = dict(data_metric=metric, data_input_id=r["input_id"])
        key = (metric, r["input_id"])
        entries = evidence.get(key, [])
        chosen = _pick_evidence(r, entries, pairs.get(key, []), verdicts.get(key, {}))
        out.append(
            f'<div class="row-card"{_attrs(**b, data_rank=i)}><div class="head"><b>{i}. <code>{_e(r["input_id"])}</code></b>'
            f" &nbsp;score {_num(r.get('score'), **b, data_field='score')}"
            f" &nbsp;label {_e(r.get('label'))} &nbsp;judged {_num(r.get('n_judged'), 'int', **b, data_field='n_judged')}"
            f" &nbsp;failed {_num(r.get('n_failed'), 'int', **b, data_field='n_failed')}"
            f'<div class="expl">{_e(_clip(r.get("explanation"), 400))}</div></div>'
            f"{_evidence_table(chosen, len(entries), metric, r['input_id'])}</div>"
        )
    if unscored:
        failed = sum(1 for r in unscored if r.get("status") != "excluded")
        title = f"Rows without a score ({len(unscored)}: {len(unscored) - failed} excluded, {failed} errored)"
        out.append(
            f'<h4 class="{"err" if failed else "muted"}">{title}</h4><table class="errored"><tr><th>input_id</th>'
            "<th>status</th><th>why</th><th>explanation</th></tr>"
        )
        for r in unscored[:50]:
            why = "muted" if r.get("status") == "excluded" else "err"
            out.append(
                f"<tr{_attrs(data_metric=metric, data_input_id=r['input_id'], data_status=r.get('status'))}>"
                f"<td><code>{_e(r['input_id'])}</code></td>"
                f'<td>{_e(r.get("status"))}</td><td class="{why}">{_e(_clip(r.get("error"), 400))}</td>'
                f"<td>{_e(_clip(r.get('explanation'), 200))}</td></tr>"
            )
        out.append("</table>")
        if len(unscored) > 50:
            out.append(
                f'<p class="muted">{len(unscored) - 50} more: <code>SELECT * FROM row_scores WHERE run_id = '
                f"'{_e(run_id)}' AND metric = '{_e(metric)}' AND status &lt;&gt; 'ok'</code></p>"
            )
    if spec_metric.get("config"):
        out.append(
            f"<details><summary>configuration</summary><pre>{_e(json.dumps(spec_metric['config'], indent=2, ensure_ascii=False))}"
            f"</pre></details>"
        )
    out.append(
        f"<details><summary>the SQL behind this section</summary><pre>"
        f"SELECT * FROM metric_scores WHERE run_id = '{_e(run_id)}' AND metric = '{_e(metric)}';\n"
        f"SELECT * FROM v_weakest_rows WHERE run_id = '{_e(run_id)}' AND metric = '{_e(metric)}' LIMIT {WEAKEST_ROWS};"
        f"</pre></details></section>"
    )
    return "".join(out)


COST_COLUMNS = [
    ("calls", "calls", "int"),
    ("failed", "failed", "int"),
    ("reused", "answered from an earlier run", "int"),
    ("prompt_tokens", "prompt tokens", "int"),
    ("completion_tokens", "completion tokens", "int"),
    ("p50_latency_ms", "median latency (ms)", "f3"),
]


def cost(by_role: list[dict[str, Any]], by_metric: list[dict[str, Any]]) -> dict[str, Any]:
    """What ``templates/cost.html.j2`` shows: the calls of each role in ROLES order (a role without
    calls marked ``absent``), the totals of the counts, and the calls per metric and stage."""
    present = {r["role"] for r in by_role}
    rows = list(by_role) + [
        {
            "role": r,
            "calls": 0,
            "failed": 0,
            "reused": 0,
            "prompt_tokens": 0,
            "completion_tokens": 0,
            "p50_latency_ms": None,
            "absent": True,
        }
        for r in ROLES
        if r not in present
    ]
    rank = {r: i for i, r in enumerate(ROLES)}
    rows.sort(key=lambda r: (rank.get(r["role"], len(rank)), str(r["role"])))
    tot = {c: sum(r.get(c) or 0 for r in by_role) for c, _, f in COST_COLUMNS if f == "int"}
    return {"any": bool(by_role), "roles": rows, "totals": tot, "by_metric": by_metric, "columns": COST_COLUMNS}
