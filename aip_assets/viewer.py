"""The report's per-sample viewer: every scored row of every metric, with client-side filters,
search and sort; a row opens to its probes, the SUT's answers side by side (persona a | persona b,
original | variant, baseline | perturbed) and each judge's verdict and reasoning.

The data is read here from the warehouse (through the report's read-only query function) and
embedded in the page as JSON in a ``<script type="application/json">`` block; a small inline script
renders it. No external resource, so the file works offline. Every ``<`` inside the JSON is written
as ``\\u003c``, so no text from a dataset or a model can close the block, and the script only ever
sets text (``textContent``), never markup.

Large runs: at most ``rows_per_metric`` rows of each metric are embedded, the lowest scores first
(unscored rows before them), and no more than the metric's share of ``MAX_BYTES``; the viewer says
how many were left out and gives the SQL for all.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from .warehouse import PERSONA_ORDER_REASONING

ROWS_PER_METRIC = 500
MAX_BYTES = 24_000_000  # the embedded data, shared evenly by the metrics (a decision-flip row with long answers is ~60 KB)
TEXT_LIMIT = 4000  # per text (prompt, answer, reasoning) in the embedded data

Query = Callable[..., list[dict[str, Any]]]  # (sql, params) -> records; run_id is the first parameter


def _clip(s: Any) -> str | None:
    if s is None:
        return None
    s = str(s)
    return s if len(s) <= TEXT_LIMIT else s[:TEXT_LIMIT].rstrip() + f"… [{len(s) - TEXT_LIMIT:,} more characters in the warehouse]"


def _bad(v: dict[str, Any]) -> float:
    """How telling a verdict is, for ordering a row's comparisons: flips, then failures, then the
    worst scores (similarity and correctness: low is bad; tone divergence and effort gap: high is bad)."""
    if v.get("f"):
        return 3.0
    if v.get("st") != "ok":
        return 2.0
    s = v.get("s")
    if s is None:
        return 0.0
    return float(s) if v.get("k") in ("tone", "effort") else 1.0 - float(s)


def read(q: Query, metrics: list[str], rows_per_metric: int = ROWS_PER_METRIC, run_id: str = "",
         max_bytes: int = MAX_BYTES) -> dict[str, Any]:
    """Everything the viewer shows for the run, as plain JSON-ready data."""
    meta = {r["metric"]: r for r in q("""
        SELECT metric, any_value(metric_name) FILTER (WHERE scope = 'overall') AS metric_name,
               bool_or(scope = 'perturbation_type') AS has_types
        FROM metric_scores WHERE run_id = ? GROUP BY metric""")}
    rows = q("""
        SELECT * FROM (
            SELECT metric, input_id, score, raw_score, label, status, error, explanation, n_judged, n_failed, n_events,
                   row_number() OVER (PARTITION BY metric ORDER BY score ASC NULLS FIRST, input_id) AS rank,
                   count(*) OVER (PARTITION BY metric) AS total
            FROM row_scores WHERE run_id = ?)
        WHERE rank <= ? ORDER BY metric, rank""", [rows_per_metric])
    rows = [r for r in rows if r["metric"] in metrics]
    keys = [f"{r['metric']}\x1f{r['input_id']}" for r in rows]
    in_keys = "{a}.metric || chr(31) || {a}.input_id IN (SELECT unnest(?::VARCHAR[]))"
    # the joined side filtered by the same keys first: a join's hash table of the run's every answer
    # took a gigabyte at 100,000 rows (numbered parameters: $1 the run, $2 the keys)
    in_keys2 = in_keys.replace("?", "$2")
    probes: dict[tuple[str, str], list[dict[str, Any]]] = {}
    pairs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    verdicts: dict[tuple[str, str], list[dict[str, Any]]] = {}
    if keys:
        for p in q(f"""
                SELECT p.metric, p.input_id, p.probe_id, p.role, p.axis, p.category, p.attribute_value, p.persona,
                       p.persona_id, p.template_id, p.variant_id, p.wrapper_id, p.exclusion, p.query_text, p.group_id,
                       r.sample_index, r.response, r.status AS sut_status, r.error AS sut_error
                FROM probes p
                LEFT JOIN (SELECT * FROM sut_responses r WHERE r.run_id = $1 AND {in_keys2.format(a='r')}) r
                       ON r.metric = p.metric AND r.probe_id = p.probe_id
                WHERE p.run_id = $1 AND {in_keys2.format(a='p')}
                ORDER BY p.metric, p.input_id, p.role, p.probe_id, r.sample_index""", [keys]):
            probes.setdefault((p["metric"], p["input_id"]), []).append(p)
        # a perturbation variant that is its own row (the external metric) has its group's baseline in
        # another row: bring it in, so the row opens to the baseline and the variant side by side
        groups: dict[str, list[tuple[str, str]]] = {}
        for key, entries in probes.items():
            if not any(e.get("role") in ("base", "baseline") for e in entries):
                for g in {e["group_id"] for e in entries if e.get("group_id")}:
                    groups.setdefault(f"{key[0]}\x1f{g}", []).append(key)
        if groups:
            for p in q("""
                    SELECT p.metric, p.input_id, p.probe_id, p.role, p.category, p.variant_id, p.query_text, p.group_id,
                           r.sample_index, r.response, r.status AS sut_status, r.error AS sut_error
                    FROM probes p
                    LEFT JOIN sut_responses r ON r.run_id = p.run_id AND r.metric = p.metric AND r.probe_id = p.probe_id
                    WHERE p.run_id = ? AND p.role = 'baseline'
                      AND p.metric || chr(31) || p.group_id IN (SELECT unnest(?::VARCHAR[]))
                    ORDER BY p.probe_id, r.sample_index""", [list(groups)]):
                for key in groups.get(f"{p['metric']}\x1f{p['group_id']}", []):
                    probes[key].append(p)
        for p in q(f"""
                SELECT pp.metric, pp.input_id, pp.pair_id, pp.axis, pp.value_a, pp.value_b, pp.probe_a, pp.probe_b,
                       pp.kind, pp.twin_of, pp.sample_b
                FROM probe_pairs pp WHERE pp.run_id = ? AND {in_keys.format(a='pp')}
                ORDER BY pp.metric, pp.input_id, pp.pair_id""", [keys]):
            pairs.setdefault((p["metric"], p["input_id"]), []).append(p)
        # the reasoning in persona order where the judge saw a pair in a randomised order; as written elsewhere
        for j in q(f"""
                SELECT j.metric, j.input_id, j.judgement_id, j.pair_id, j.judge_kind, j.category, j.sample_index,
                       j.variant_id, j.status, j.error, j.label, j.score, j.decision_a, j.decision_b, j.flipped,
                       j.attributable, j.order_swapped,
                       CASE WHEN j.order_swapped IS NULL THEN j.reasoning ELSE {PERSONA_ORDER_REASONING} END AS reasoning
                FROM judgements j WHERE j.run_id = ? AND {in_keys.format(a='j')}
                ORDER BY j.metric, j.input_id, j.pair_id, j.judge_kind, j.judgement_id""", [keys]):
            verdicts.setdefault((j["metric"], j["input_id"]), []).append(j)

    out_rows = []
    for r in rows:
        key = (r["metric"], r["input_id"])
        detail = _detail(probes.get(key, []), pairs.get(key, []), verdicts.get(key, []))
        answers_or_judges_failed = detail.pop("any_failed")
        out_rows.append({
            "m": r["metric"], "id": r["input_id"], "score": r["score"], "raw": r["raw_score"], "label": r["label"],
            "status": r["status"], "error": _clip(r["error"]), "expl": _clip(r["explanation"]),
            "nj": r["n_judged"], "nf": r["n_failed"], "ne": r["n_events"],
            "flagged": bool(r["n_events"]),
            "excluded": r["score"] is None or bool(r["n_failed"]),
            "failed": r["status"] != "ok" or answers_or_judges_failed,
            **detail})
    totals = {r["metric"]: int(r["total"]) for r in rows}
    # each metric gets an even share of the byte budget: its lowest rows first, at least one
    share = max_bytes // max(1, len({r["m"] for r in out_rows}))
    used: dict[str, int] = {}
    full: set[str] = set()
    kept = []
    for r in out_rows:  # in rank order: what is kept of a metric is its lowest rows
        if r["m"] in full:
            continue
        size = len(json.dumps(r, ensure_ascii=False))
        if r["m"] in used and used[r["m"]] + size > share:
            full.add(r["m"])
            continue
        used[r["m"]] = used.get(r["m"], 0) + size
        kept.append(r)
    return {"run_id": run_id,
            "metrics": [{"metric": m, "name": (meta.get(m) or {}).get("metric_name"),
                         "facet": "perturbation type" if (meta.get(m) or {}).get("has_types") else "category",
                         "shown": sum(1 for r in kept if r["m"] == m), "total": totals.get(m, 0)}
                        for m in metrics],
            "rows_per_metric": rows_per_metric, "rows": kept}


def _detail(entries: list[dict[str, Any]], pairs: list[dict[str, Any]],
            judged: list[dict[str, Any]]) -> dict[str, Any]:
    """A row's probes (each with its answers by sample), its comparisons (two probe answers side by
    side with the verdicts on them) and the verdicts on a single answer."""
    probes: list[dict[str, Any]] = []
    index: dict[str, int] = {}
    any_failed = False
    for e in entries:
        if e["probe_id"] not in index:
            index[e["probe_id"]] = len(probes)
            who = e.get("attribute_value") or e.get("persona_id") or (
                e.get("category") if e.get("role") in ("variant", "baseline") else None) or e.get("role")
            meta = " · ".join(str(x) for x in (e.get("axis"), e.get("role"), e.get("category"),
                                                e.get("template_id") and f"template {e['template_id']}",
                                                e.get("wrapper_id") and f"wrapped: {e['wrapper_id']}",
                                                e.get("exclusion") and f"excluded: {e['exclusion']}") if x)
            probes.append({"id": e["probe_id"], "role": e.get("role"), "who": who, "meta": meta,
                           "persona": _clip(e.get("persona")),
                           # what a perturbation judgement names: the variant's id (a variant that is its own
                           # row, as in the external metric, is named by its input_id)
                           "variant": e.get("variant_id") or e.get("input_id"),
                           "q": _clip(e.get("query_text")), "ans": {}})
        if e.get("sample_index") is not None:
            probes[index[e["probe_id"]]]["ans"][str(e["sample_index"])] = {
                "t": _clip(e.get("response")), "st": e.get("sut_status"), "e": _clip(e.get("sut_error"))}
            any_failed = any_failed or e.get("sut_status") != "ok"

    def verdict(j: dict[str, Any]) -> dict[str, Any]:
        return {"k": j.get("judge_kind"), "c": j.get("category"), "l": j.get("label"), "s": j.get("score"),
                "da": j.get("decision_a"), "db": j.get("decision_b"), "f": j.get("flipped"),
                "at": j.get("attributable"), "sw": j.get("order_swapped"), "st": j.get("status"),
                "e": _clip(j.get("error")), "r": _clip(j.get("reasoning"))}

    items: list[dict[str, Any]] = []
    single: list[dict[str, Any]] = []
    pair_ids = {p["pair_id"] for p in pairs}
    by_pair: dict[str, list[dict[str, Any]]] = {}
    by_key: dict[str, list[dict[str, Any]]] = {}
    for j in judged:
        any_failed = any_failed or j.get("status") != "ok"
        if j.get("pair_id") in pair_ids:
            by_pair.setdefault(j["pair_id"], []).append(verdict(j))
        elif j.get("variant_id"):  # perturbation: a variant's robustness and correctness
            by_key.setdefault(f"v:{j['variant_id']}", []).append(verdict(j))
        elif j.get("sample_index") is not None:  # consistency: the base answer against a sampled variant answer
            by_key.setdefault(f"s:{j['sample_index']}", []).append(verdict(j))
        else:  # a verdict on one answer (the perturbation baseline's correctness)
            single.append(verdict(j))
    for p in pairs:
        null = p.get("kind") == "null"  # the no-effect baseline: one persona's first answer and a fresh sample
        title = " vs ".join(str(x) for x in (p.get("value_a"), p.get("value_b")))
        items.append({"title": (f"{title} (null pair: one persona asked twice, shown to the judge as {p.get('twin_of')})"
                                if null else title),
                      "axis": p.get("axis"), "null": null,
                      "a": {"p": index.get(p["probe_a"]), "s": "0", "who": p.get("value_a")},
                      "b": {"p": index.get(p["probe_b"]), "s": str(int(p["sample_b"])) if null and p.get("sample_b") else "0",
                            "who": p.get("value_b")},
                      "v": by_pair.get(p["pair_id"], [])})
    base = next((i for i, p in enumerate(probes) if p["role"] in ("base", "baseline")), None)
    base_who = probes[base]["role"] if base is not None else None
    for key, vs in by_key.items():
        kind, _, ident = key.partition(":")
        if kind == "v":
            right = next((i for i, p in enumerate(probes) if p["variant"] == ident and p["role"] == "variant"), None)
            sample = "0"
        else:
            right = next((i for i, p in enumerate(probes) if p["role"] == "variant"), None)
            sample = ident
        who = probes[right]["who"] if right is not None else None
        items.append({"title": f"{base_who or 'original'} vs {who or 'variant'}" + (f" (sample {ident})" if kind == "s" else ""),
                      "a": {"p": base, "s": "0", "who": base_who}, "b": {"p": right, "s": sample, "who": who}, "v": vs})
    items.sort(key=lambda it: (-max((_bad(v) for v in it["v"]), default=-1.0), it["title"]))
    used = {side["p"] for it in items for side in (it["a"], it["b"])}

    def distinct(values) -> list[str]:
        return sorted({str(v) for v in values if v is not None})
    return {"probes": probes, "items": items, "single": single,
            "other": [i for i in range(len(probes)) if i not in used], "any_failed": any_failed,
            # the filters' values: decision flip's axes and attribute values, group bias's personas, the
            # consistency template categories and the perturbation types
            "axes": distinct([e.get("axis") for e in entries] + [p.get("axis") for p in pairs]),
            "personas": distinct([v for p in pairs for v in (p.get("value_a"), p.get("value_b"))]
                                 + [e.get("attribute_value") or e.get("persona_id") for e in entries
                                    if e.get("role") == "persona"]),
            "cats": distinct(e.get("category") for e in entries if e.get("role") == "variant")}


def data_block(data: dict[str, Any]) -> str:
    """The data as a JSON script block that no text inside it can end early."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    text = text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    return f'<script type="application/json" id="aip-viewer-data">{text}</script>'


CSS = """
#viewer .controls { display: flex; flex-wrap: wrap; gap: 6px 14px; align-items: center; margin: 8px 0;
  padding: 8px 10px; background: #f5f7fa; border: 1px solid #e0e4ea; border-radius: 6px; }
#viewer .controls label { white-space: nowrap; } #viewer select, #viewer input[type=search] { font: inherit; }
#viewer input[type=search] { width: 260px; } #viewer .count { color: #444; margin: 4px 0; }
#viewer table.rows { width: 100%; } #viewer table.rows tr.row { cursor: pointer; }
#viewer table.rows tr.row:hover td { background: #f0f5ff; } #viewer tr.row.open td { background: #e8f0fe; }
#viewer td.detail { background: #fbfbfd; padding: 8px 12px 14px; }
#viewer .pair { border: 1px solid #ddd; border-radius: 6px; margin: 8px 0; padding: 6px 10px; background: #fff; }
#viewer .side { display: grid; grid-template-columns: 1fr 1fr; gap: 10px; }
#viewer .side > div { min-width: 0; } #viewer .who { font-weight: 600; }
#viewer .txt { white-space: pre-wrap; word-wrap: break-word; font-size: 13px; background: #f7f7f7; padding: 4px 6px;
  border-radius: 4px; margin: 2px 0 6px; max-height: 320px; overflow-y: auto; }
#viewer .ans { background: #f1f8f1; } #viewer .verdict-box { border-top: 1px dashed #ccc; margin-top: 4px;
  padding-top: 4px; font-size: 13px; } #viewer .flag { color: #c62828; font-weight: 700; }
#viewer .tag { display: inline-block; margin: 0 4px 2px 0; padding: 0 6px; border-radius: 8px; background: #eef;
  font-size: 11px; } #viewer button { font: inherit; }
"""

SCRIPT = r"""
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("aip-viewer-data").textContent);
  var root = document.getElementById("viewer");
  var metaBy = {}; data.metrics.forEach(function (m) { metaBy[m.metric] = m; });
  var PAGE = 100, shown = PAGE;
  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    if (attrs) Object.keys(attrs).forEach(function (k) { if (attrs[k] !== null && attrs[k] !== undefined) e.setAttribute(k, attrs[k]); });
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function f3(x) { return x === null || x === undefined ? "n/a" : Number(x).toFixed(3); }
  function raw(x) { return x === null || x === undefined ? "" : String(x); }
  function uniq(a) { var s = new Set(); a.forEach(function (x) { if (x !== null && x !== undefined) s.add(String(x)); }); return Array.from(s).sort(); }
  data.rows.forEach(function (r, i) {
    r.i = i;
    var parts = [r.id, r.label, r.expl, r.error];
    r.probes.forEach(function (p) { parts.push(p.q, p.persona, p.who); Object.keys(p.ans).forEach(function (k) { parts.push(p.ans[k].t, p.ans[k].e); }); });
    r.items.forEach(function (it) { it.v.forEach(function (v) { parts.push(v.r, v.l, v.e); }); });
    r.single.forEach(function (v) { parts.push(v.r, v.l, v.e); });
    r.blob = parts.filter(function (x) { return x; }).join("\n").toLowerCase();
  });

  var c = {};
  function control(label, node) { var l = el("label", null, label + " "); l.appendChild(node); return l; }
  var bar = el("div", {"class": "controls"});
  c.metric = el("select", {"data-filter": "metric"});
  c.metric.appendChild(el("option", {value: ""}, "all metrics"));
  data.metrics.forEach(function (m) { c.metric.appendChild(el("option", {value: m.metric}, m.metric)); });
  c.axis = el("select", {"data-filter": "axis"}); c.persona = el("select", {"data-filter": "persona"});
  c.cat = el("select", {"data-filter": "category"}); c.label = el("select", {"data-filter": "label"});
  c.flagged = el("input", {type: "checkbox", "data-filter": "flagged"});
  c.failed = el("input", {type: "checkbox", "data-filter": "failed"});
  c.excluded = el("input", {type: "checkbox", "data-filter": "excluded"});
  c.search = el("input", {type: "search", placeholder: "search ids, prompts, answers, reasoning", "data-filter": "search"});
  c.sort = el("select", {"data-filter": "sort"});
  [["score-asc", "score, lowest first"], ["score-desc", "score, highest first"], ["id", "input id"], ["failed", "most excluded first"]]
    .forEach(function (o) { c.sort.appendChild(el("option", {value: o[0]}, o[1])); });
  bar.appendChild(control("metric", c.metric)); bar.appendChild(control("axis", c.axis));
  bar.appendChild(control("persona", c.persona)); c.catLabel = control("category / perturbation type", c.cat);
  bar.appendChild(c.catLabel); bar.appendChild(control("label", c.label));
  bar.appendChild(control("flipped / flagged", c.flagged)); bar.appendChild(control("failed", c.failed));
  bar.appendChild(control("excluded", c.excluded)); bar.appendChild(c.search); bar.appendChild(control("sort", c.sort));
  root.appendChild(bar);
  var count = el("p", {"class": "count", id: "viewer-count"}); root.appendChild(count);
  var note = el("p", {"class": "muted", id: "viewer-cap"}); root.appendChild(note);
  var table = el("table", {"class": "rows"}); root.appendChild(table);
  var more = el("button", {type: "button", id: "viewer-more"}, "show more"); root.appendChild(more);

  function fill(sel, values, all) {
    var cur = sel.value; sel.textContent = "";
    sel.appendChild(el("option", {value: ""}, all));
    values.forEach(function (v) { sel.appendChild(el("option", {value: v}, v)); });
    sel.value = values.indexOf(cur) >= 0 ? cur : "";
    sel.disabled = values.length === 0;
  }
  function inMetric() { var m = c.metric.value; return data.rows.filter(function (r) { return !m || r.m === m; }); }
  function refreshFacets() {
    var rs = inMetric(), m = c.metric.value;
    fill(c.axis, uniq([].concat.apply([], rs.map(function (r) { return r.axes; }))), "any axis");
    fill(c.persona, uniq([].concat.apply([], rs.map(function (r) { return r.personas; }))), "any persona");
    fill(c.cat, uniq([].concat.apply([], rs.map(function (r) { return r.cats; }))), "any");
    fill(c.label, uniq(rs.map(function (r) { return r.label; })), "any label");
    c.catLabel.firstChild.textContent = (m ? metaBy[m].facet : "category / perturbation type") + " ";
    var caps = data.metrics.filter(function (x) { return (!m || x.metric === m) && x.shown < x.total; });
    note.textContent = caps.length ? caps.map(function (x) {
      return x.metric + ": the " + x.shown + " lowest-scored of " + x.total + " rows are in this file; all of them: " +
        "SELECT * FROM v_weakest_rows WHERE run_id = '" + data.run_id + "' AND metric = '" + x.metric + "'"; }).join("; ") : "";
  }
  function matches(r) {
    var q = c.search.value.trim().toLowerCase();
    return (!c.metric.value || r.m === c.metric.value) && (!c.axis.value || r.axes.indexOf(c.axis.value) >= 0) &&
      (!c.persona.value || r.personas.indexOf(c.persona.value) >= 0) && (!c.cat.value || r.cats.indexOf(c.cat.value) >= 0) &&
      (!c.label.value || r.label === c.label.value) && (!c.flagged.checked || r.flagged) &&
      (!c.failed.checked || r.failed) && (!c.excluded.checked || r.excluded) && (!q || r.blob.indexOf(q) >= 0);
  }
  function cmp(a, b) {
    var s = c.sort.value, x, y;
    if (s === "id") return a.m < b.m ? -1 : a.m > b.m ? 1 : a.id < b.id ? -1 : a.id > b.id ? 1 : 0;
    if (s === "failed") { x = (b.nf || 0) - (a.nf || 0); if (x) return x; }
    x = a.score === null ? -Infinity : a.score; y = b.score === null ? -Infinity : b.score;
    if (x !== y) return s === "score-desc" ? y - x : x - y;
    return a.i - b.i;
  }
  function render() {
    var rs = data.rows.filter(matches).sort(cmp);
    count.textContent = rs.length + " of " + data.rows.length + " rows match";
    count.setAttribute("data-matching", rs.length);
    table.textContent = "";
    var head = el("tr");
    ["metric", "input id", "score", "label", "judged", "excluded units", "events", "status"].forEach(function (h) { head.appendChild(el("th", null, h)); });
    table.appendChild(head);
    rs.slice(0, shown).forEach(function (r) {
      var tr = el("tr", {"class": "row", "data-metric": r.m, "data-input-id": r.id});
      tr.appendChild(el("td", null, r.m.replace(/^llm\./, "")));
      tr.appendChild(el("td", null, r.id));
      tr.appendChild(el("td", {"class": "num", "data-field": "score", "data-value": raw(r.score)}, f3(r.score)));
      tr.appendChild(el("td", {"data-field": "label"}, r.label));
      tr.appendChild(el("td", {"class": "num", "data-field": "n_judged", "data-value": raw(r.nj)}, raw(r.nj)));
      tr.appendChild(el("td", {"class": "num", "data-field": "n_failed", "data-value": raw(r.nf)}, raw(r.nf)));
      tr.appendChild(el("td", {"class": "num", "data-field": "n_events", "data-value": raw(r.ne)}, raw(r.ne)));
      tr.appendChild(el("td", {"data-field": "status", "class": r.status === "ok" ? "" : "err"}, r.status));
      tr.addEventListener("click", function () { toggle(tr, r); });
      table.appendChild(tr);
    });
    more.style.display = rs.length > shown ? "" : "none";
    more.textContent = "show " + Math.min(PAGE, rs.length - shown) + " more";
  }
  function answerBox(r, side) {
    var d = el("div");
    var p = side.p === null || side.p === undefined ? null : r.probes[side.p];
    d.appendChild(el("div", {"class": "who"}, side.who || (p && p.who) || "—"));
    if (!p) { d.appendChild(el("div", {"class": "muted"}, "(probe not recorded)")); return d; }
    if (p.persona) d.appendChild(el("div", {"class": "muted"}, p.persona));
    d.appendChild(el("div", {"class": "muted"}, "asked:"));
    d.appendChild(el("div", {"class": "txt", "data-probe-id": p.id}, p.q));
    var a = p.ans[side.s];
    d.appendChild(el("div", {"class": "muted"}, "answered" + (side.s !== "0" ? " (sample " + side.s + ")" : "") + ":"));
    if (!a) d.appendChild(el("div", {"class": "muted"}, "(no answer recorded)"));
    else if (a.st !== "ok") d.appendChild(el("div", {"class": "txt err", "data-answer": p.id}, a.st + ": " + (a.e || "")));
    else d.appendChild(el("div", {"class": "txt ans", "data-answer": p.id}, a.t));
    return d;
  }
  function verdictBox(v) {
    var d = el("div", {"class": "verdict-box", "data-verdict": v.k});
    var head = (v.k || "judge") + (v.c && v.c !== "baseline" ? "" : v.c ? " (baseline)" : "") + ": ";
    if (v.st !== "ok") { d.appendChild(el("span", {"class": "err"}, head + v.st + (v.e ? " — " + v.e : ""))); return d; }
    var t = head + (v.l || "") + (v.s !== null && v.s !== undefined ? " score " + f3(v.s) : "");
    if (v.da !== null || v.db !== null) t += " · decisions a: " + (v.da || "none") + ", b: " + (v.db || "none");
    d.appendChild(el("span", null, t));
    if (v.f) d.appendChild(el("span", {"class": "flag"}, " · flipped, due to the persona"));
    else if (v.at === false && v.da !== v.db) d.appendChild(el("span", {"class": "muted"}, " · decisions differ, not due to the persona"));
    if (v.sw !== null && v.sw !== undefined) d.appendChild(el("span", {"class": "muted"}, v.sw ? " · judge saw b first" : " · judge saw a first"));
    if (v.r) d.appendChild(el("div", {"class": "txt", "data-reasoning": "1"}, v.r));
    return d;
  }
  function toggle(tr, r) {
    var next = tr.nextSibling;
    if (next && next.classList && next.classList.contains("detail-row")) { next.remove(); tr.classList.remove("open"); return; }
    tr.classList.add("open");
    var dr = el("tr", {"class": "detail-row"}), td = el("td", {colspan: 8, "class": "detail", "data-input-id": r.id});
    dr.appendChild(td);
    var info = [(metaBy[r.m].name || r.m), "score " + f3(r.score)];
    if (r.raw !== r.score) info.push("raw " + f3(r.raw));
    td.appendChild(el("div", null, info.join(" · ")));
    if (r.expl) td.appendChild(el("div", {"class": "muted"}, r.expl));
    if (r.error) td.appendChild(el("div", {"class": "err"}, r.error));
    r.items.forEach(function (it) {
      var box = el("div", {"class": "pair"});
      box.appendChild(el("div", {"class": "who"}, (it.axis ? it.axis + ": " : "") + it.title));
      var side = el("div", {"class": "side"});
      side.appendChild(answerBox(r, it.a)); side.appendChild(answerBox(r, it.b)); box.appendChild(side);
      if (!it.v.length) box.appendChild(el("div", {"class": "muted"}, "not judged"));
      it.v.forEach(function (v) { box.appendChild(verdictBox(v)); });
      td.appendChild(box);
    });
    if (r.single.length) {
      var sb = el("div", {"class": "pair"}); sb.appendChild(el("div", {"class": "who"}, "verdicts on one answer"));
      r.single.forEach(function (v) { sb.appendChild(verdictBox(v)); }); td.appendChild(sb);
    }
    if (r.other.length) {
      var ob = el("div", {"class": "pair"}); ob.appendChild(el("div", {"class": "who"}, "other probes"));
      r.other.forEach(function (i) {
        var p = r.probes[i];
        Object.keys(p.ans).length ? Object.keys(p.ans).forEach(function (s) { ob.appendChild(answerBox(r, {p: i, s: s, who: p.meta || p.who})); })
          : ob.appendChild(answerBox(r, {p: i, s: "0", who: p.meta || p.who}));
      });
      td.appendChild(ob);
    }
    tr.parentNode.insertBefore(dr, tr.nextSibling);
  }
  [c.metric].forEach(function (s) { s.addEventListener("change", function () { refreshFacets(); shown = PAGE; render(); }); });
  [c.axis, c.persona, c.cat, c.label, c.flagged, c.failed, c.excluded, c.sort].forEach(function (s) {
    s.addEventListener("change", function () { shown = PAGE; render(); }); });
  var typing = null;  // search as you type, once the typing pauses
  c.search.addEventListener("input", function () { clearTimeout(typing); typing = setTimeout(function () { shown = PAGE; render(); }, 150); });
  more.addEventListener("click", function () { shown += PAGE; render(); });
  refreshFacets(); render();
  root.setAttribute("data-ready", "1");
})();
"""


def section(data: dict[str, Any]) -> str:
    """The viewer's section: a heading, a fallback for a browser without scripts, the data, the script."""
    n = len(data["rows"])
    return ('<h2 id="samples">Samples</h2>'
            f'<p class="muted">Every row of every metric ({n:,} in this file, scored or not): filter, search and sort; click a '
            'row for its probes, the SUT\'s answers side by side (persona a | persona b, original | variant, baseline '
            '| perturbed) and each judge\'s verdict and reasoning. Reasoning is shown in persona order: where the '
            'judge saw the pair the other way round, its "Response 1 / 2" are rewritten to a / b.</p>'
            '<div id="viewer"><noscript><p class="muted">The sample viewer needs JavaScript; the weakest rows of each '
            'metric are listed below without it.</p></noscript></div>'
            f'{data_block(data)}<script>{SCRIPT}</script>')
