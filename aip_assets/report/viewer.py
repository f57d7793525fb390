r"""The report's per-sample viewer: every scored row of every metric, with client-side filters,
search and sort; a row opens to its probes, the SUT's answers side by side (persona a | persona b,
original | variant, baseline | perturbed) and each judge's verdict and reasoning.

The data is read from the warehouse (``queries``, through the report's read-only query function)
and embedded in the page as JSON in a ``<script type="application/json">`` block; the script
``static/viewer.js``, inlined after it (``templates/viewer.html.j2``), renders it. No external
resource, so the file works offline. Every ``<`` inside the JSON is written as ``\\u003c``, so no
text from a dataset or a model can close the block, and the script only ever sets text
(``textContent``), never markup.

A verdict a person may check (a verdict of the judge that ``aip-eval label import`` takes: the
run × metric's ``human_labels.population``) carries its judgement id, the judge's category, its
allowed categories (an index into its metric's ``allowed`` lists) and the ``shown_hash`` export
would write for it, so the viewer can mark it right or wrong and write a file the import reads.

Large runs: at most ``rows_per_metric`` rows of each metric are embedded, the lowest scores first
(unscored rows before them), and no more than the metric's share of ``MAX_BYTES``; the viewer says
how many were left out and gives the SQL for all. The judge's prompts and raw answers come last:
the kept rows' calls, the lowest rows first, as far as the share left allows (a verdict without
its call in the file says so, with the SQL for it).
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd
from markupsafe import Markup

from .. import human_labels
from ..catalog.groups import group_words, parse_axis
from ..errors import AipError
from . import queries
from .queries import Query
from .templating import render, static

ROWS_PER_METRIC = 500
MAX_BYTES = (
    24_000_000  # the embedded data, shared evenly by the metrics (a decision-flip row with long answers is ~60 KB)
)
TEXT_LIMIT = 4000  # per text (prompt, answer, reasoning) in the embedded data


def _clip(s: Any) -> str | None:
    if s is None:
        return None
    s = str(s)
    return (
        s
        if len(s) <= TEXT_LIMIT
        else s[:TEXT_LIMIT].rstrip() + f"… [{len(s) - TEXT_LIMIT:,} more characters in the warehouse]"
    )


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


def read(
    q: Query,
    metrics: list[str],
    rows_per_metric: int = ROWS_PER_METRIC,
    run_id: str = "",
    max_bytes: int = MAX_BYTES,
    labels_dir: str = "",
) -> dict[str, Any]:
    """Everything the viewer shows for the run, as plain JSON-ready data (``labels_dir``: where
    ``aip-eval label export`` writes, named in the viewer's hint for a file of marks)."""
    meta = queries.viewer_metrics(q)
    rows = [r for r in queries.viewer_rows(q, rows_per_metric) if r["metric"] in metrics]
    probes, pairs, verdicts = queries.viewer_evidence(q, rows)
    calls = queries.viewer_judge_calls(q, [j["call_key"] for vs in verdicts.values() for j in vs if j.get("call_key")])
    checkable, allowed = _checkable(q, metrics, pairs, verdicts)

    persona_records = queries.viewer_personas(q)
    attrs = _persona_groups(persona_records)
    out_rows = []
    for r in rows:
        key = (r["metric"], r["input_id"])
        detail = _detail(
            probes.get(key, []), pairs.get(key, []), verdicts.get(key, []), calls, checkable.get(r["metric"])
        )
        answers_or_judges_failed = detail.pop("any_failed")
        # a group bias row's groups: its personas' attributes (``religion=Muslim``)
        mine = attrs.get(r["metric"], {})
        detail["groups"] = sorted(set(detail["groups"]).union(*(mine.get(p, ()) for p in detail["personas"])))
        out_rows.append(
            {
                "m": r["metric"],
                "id": r["input_id"],
                "score": r["score"],
                "raw": r["raw_score"],
                "label": r["label"],
                "status": r["status"],
                "error": _clip(r["error"]),
                "expl": _clip(r["explanation"]),
                "nj": r["n_judged"],
                "nf": r["n_failed"],
                "ne": r["n_events"],
                "flagged": bool(r["n_events"]),
                "excluded": r["score"] is None or bool(r["n_failed"]),
                "failed": r["status"] == "error" or answers_or_judges_failed,
                **detail,
            }
        )
    totals = {r["metric"]: int(r["total"]) for r in rows}
    # each metric gets an even share of the byte budget: its lowest rows first, at least one
    share = max_bytes // max(1, len({r["m"] for r in out_rows}))
    used: dict[str, int] = {}
    full: set[str] = set()
    kept = []
    calls_of: list[list[dict[str, Any]]] = []  # each kept row's judge calls, set aside
    for r in out_rows:  # in rank order: what is kept of a metric is its lowest rows
        if r["m"] in full:
            continue
        taken = _take_calls(r)
        size = len(json.dumps(r, ensure_ascii=False))
        if r["m"] in used and used[r["m"]] + size > share:
            full.add(r["m"])
            continue
        used[r["m"]] = used.get(r["m"], 0) + size
        kept.append(r)
        calls_of.append(taken)
    # then the judge's calls of the kept rows, the lowest rows first, in what is left of the share
    for r, taken in zip(kept, calls_of, strict=True):
        size = len(json.dumps(taken, ensure_ascii=False))
        if used[r["m"]] + size <= share:
            used[r["m"]] += size
            _give_calls(r, taken)
    return {
        "run_id": run_id,
        "metrics": [
            {
                "metric": m,
                "name": (meta.get(m) or {}).get("metric_name"),
                "facet": "perturbation type" if (meta.get(m) or {}).get("has_types") else "category",
                "shown": sum(1 for r in kept if r["m"] == m),
                "total": totals.get(m, 0),
                "allowed": allowed.get(m, []),
            }
            for m in metrics
        ],
        "rows_per_metric": rows_per_metric,
        # the file of a person's marks: export's columns (with the verdict shown), its guard against formulas
        "label_file": {
            "columns": human_labels.EXPORT_COLUMNS + human_labels.VERDICT_COLUMNS + human_labels.PERSON_COLUMNS,
            "formula_prefixes": list(human_labels.FORMULA_PREFIXES),
            "dir": labels_dir,
        },
        "personas": _personas(persona_records),
        "rows": kept,
    }


def _checkable(
    q: Query,
    metrics: list[str],
    pairs: dict[tuple[str, str], list[dict[str, Any]]],
    verdicts: dict[tuple[str, str], list[dict[str, Any]]],
) -> tuple[dict[str, dict[str, dict[str, Any]]], dict[str, list[list[str]]]]:
    """The verdicts of ``verdicts`` a person may mark: those ``aip-eval label import`` takes (the
    metric's ``human_labels.population``), by metric and judgement id (an id is one metric's: the
    consistency metrics share theirs), each ``{"j": judgement id, "jc": the judge's category, "la":
    index into its metric's allowed lists, "sh": the shown_hash export writes}``; and each metric's
    allowed lists (``{metric: [[category, ...], ...]}``). A metric whose verdicts have no
    categories for people has none."""
    from ..metrics import get_metric

    out: dict[str, dict[str, dict[str, Any]]] = {}
    allowed: dict[str, list[list[str]]] = {}
    for m in metrics:
        js = [j for (metric, _), vs in verdicts.items() if metric == m for j in vs]
        if not js:
            continue
        try:
            plugin = get_metric(m)
        except KeyError:  # a metric this install does not have: its verdicts are shown, not marked
            continue
        pp = pd.DataFrame(
            [p for (metric, _), ps in pairs.items() if metric == m for p in ps], columns=["pair_id", "kind"]
        )
        try:
            pop = human_labels.population(m, plugin, pd.DataFrame(js), pp)
        except AipError:  # its verdicts have no categories for people
            continue
        if not len(pop):
            continue
        shown = human_labels.shown_contents(m, list(pop["judgement_id"]), q)
        lists: list[list[str]] = []
        for r in pop.to_dict("records"):
            cats = list(r["allowed"])
            if cats not in lists:
                lists.append(cats)
            jid = str(r["judgement_id"])
            out.setdefault(m, {})[jid] = {
                "j": jid,
                "jc": r["judge_category"],
                "la": lists.index(cats),
                "sh": human_labels.shown_hash(shown.get(jid, {})),
            }
        allowed[m] = lists
    return out, allowed


def _verdicts(row: dict[str, Any]) -> list[dict[str, Any]]:
    return [v for it in row["items"] for v in it["v"]] + row["single"]


def _take_calls(row: dict[str, Any]) -> list[dict[str, Any]]:
    """The judge's prompts and raw answers of a row's verdicts, taken out of the row (``calls`` on
    each verdict False: not in the file), in the verdicts' order."""
    out: list[dict[str, Any]] = []
    for v in _verdicts(row):
        out.append({k: v.pop(k) for k in ("jp", "jr") if k in v})
        v["calls"] = False
    return out


def _give_calls(row: dict[str, Any], calls: list[dict[str, Any]]) -> None:
    """Put back what ``_take_calls`` took."""
    for v, c in zip(_verdicts(row), calls, strict=True):
        v.pop("calls")
        v.update(c)


def pair_title(p: dict[str, Any], persona_of: dict[str, Any]) -> str:
    """A pair as the viewer heads it: its two values, said as groups for an intersection or a name
    ("Black women vs Black men (by name: Lakisha Washington, Jermaine Jackson)")."""
    axis = str(p.get("axis") or "")
    axes, form = parse_axis(axis)
    va, vb = str(p.get("value_a")), str(p.get("value_b"))
    if len(axes) == 1 and form == "explicit":
        return f"{va} vs {vb}"
    title = f"{group_words(axis, va)} vs {group_words(axis, vb)}".replace(" (by name)", "")
    if form == "name":
        who = [persona_of.get(str(p.get(k))) for k in ("probe_a", "probe_b")]
        title += " (by name" + (f": {who[0]}, {who[1]})" if all(who) else ")")
    return title


def _personas(records: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    """What each persona id of each metric is, for the persona filter: ``{metric: {id: text}}``, the
    text its attribute values and its description (``p03``: "Muslim, woman, nurse: I am ...")."""
    out: dict[str, dict[str, str]] = {}
    for r in records:
        try:
            attrs = json.loads(r.get("attributes") or "{}")
        except ValueError:
            attrs = {}
        values = ", ".join(str(v) for _, v in sorted(attrs.items()) if v) if isinstance(attrs, dict) else ""
        desc = str(r.get("description") or "")
        out.setdefault(r["metric"], {})[str(r["persona_id"])] = ": ".join(x for x in (values, desc) if x)
    return out


def _persona_groups(records: list[dict[str, Any]]) -> dict[str, dict[str, list[str]]]:
    """Each persona's groups, ``attribute=value`` (``religion=Muslim``), by metric and persona id:
    what the viewer's group filter matches."""
    out: dict[str, dict[str, list[str]]] = {}
    for r in records:
        try:
            attrs = json.loads(r.get("attributes") or "{}")
        except ValueError:
            attrs = {}
        if isinstance(attrs, dict):
            out.setdefault(r["metric"], {})[str(r["persona_id"])] = [f"{k}={v}" for k, v in sorted(attrs.items()) if v]
    return out


def _prompt_text(request: Any) -> str | None:
    """A recorded request as the judge read it: each message as ``role:`` and its text."""
    if request is None:
        return None
    try:
        body = json.loads(request) if isinstance(request, str) else request
    except ValueError:
        return str(request)
    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list):
        return json.dumps(body, ensure_ascii=False)
    parts = []
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else m
        if isinstance(content, list):  # content parts: their text
            content = "\n".join(str(c.get("text", "")) if isinstance(c, dict) else str(c) for c in content)
        parts.append(f"{m.get('role', '?') if isinstance(m, dict) else '?'}:\n{content}")
    return "\n\n".join(parts)


def _detail(
    entries: list[dict[str, Any]],
    pairs: list[dict[str, Any]],
    judged: list[dict[str, Any]],
    calls: dict[str, dict[str, Any]] | None = None,
    checkable: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A row's probes (each with its answers by sample), its comparisons (two probe answers side by
    side with the verdicts on them) and the verdicts on a single answer; ``calls`` (by call key) give
    each verdict the judge's prompt and raw answer, ``checkable`` (by judgement id, ``_checkable``'s)
    what a person needs to mark it."""
    calls = calls or {}
    checkable = checkable or {}
    probes: list[dict[str, Any]] = []
    index: dict[str, int] = {}
    any_failed = False
    for e in entries:
        if e["probe_id"] not in index:
            index[e["probe_id"]] = len(probes)
            who = (
                e.get("attribute_value")
                or e.get("persona_id")
                or (e.get("category") if e.get("role") in ("variant", "baseline") else None)
                or e.get("role")
            )
            meta = " · ".join(
                str(x)
                for x in (
                    e.get("axis"),
                    e.get("role"),
                    e.get("category"),
                    e.get("template_id") and f"template {e['template_id']}",
                    e.get("wrapper_id") and f"wrapped: {e['wrapper_id']}",
                    e.get("exclusion") and f"excluded: {e['exclusion']}",
                )
                if x
            )
            probes.append(
                {
                    "id": e["probe_id"],
                    "role": e.get("role"),
                    "who": who,
                    "meta": meta,
                    "persona": _clip(e.get("persona")),
                    # what a perturbation judgement names: the variant's id (a variant that is its own
                    # row, as in the external metric, is named by its input_id)
                    "variant": e.get("variant_id") or e.get("input_id"),
                    "q": _clip(e.get("query_text")),
                    "ans": {},
                }
            )
        if e.get("sample_index") is not None:
            probes[index[e["probe_id"]]]["ans"][str(e["sample_index"])] = {
                "t": _clip(e.get("response")),
                "st": e.get("sut_status"),
                "e": _clip(e.get("sut_error")),
            }
            any_failed = any_failed or e.get("sut_status") != "ok"

    def verdict(j: dict[str, Any]) -> dict[str, Any]:
        call = calls.get(j.get("call_key") or "") or {}
        return {
            "k": j.get("judge_kind"),
            "c": j.get("category"),
            "l": j.get("label"),
            "s": j.get("score"),
            "da": j.get("decision_a"),
            "db": j.get("decision_b"),
            "f": j.get("flipped"),
            "at": j.get("attributable"),
            "sw": j.get("order_swapped"),
            "st": j.get("status"),
            "e": _clip(j.get("error")),
            "r": _clip(j.get("reasoning")),
            # the judge's own prompt and raw answer (its call in llm_calls); the key to look it up
            "ck": j.get("call_key"),
            "jp": _clip(_prompt_text(call.get("request"))),
            "jr": _clip(call.get("response_text")),
            **checkable.get(str(j.get("judgement_id")), {}),
        }

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
    persona_of = {e["probe_id"]: e.get("persona") for e in entries}
    for p in pairs:
        null = p.get("kind") == "null"  # the no-effect baseline: one persona's first answer and a fresh sample
        title = pair_title(p, persona_of)
        items.append(
            {
                "title": (
                    f"{title} (null pair: one persona asked twice, shown to the judge as {p.get('twin_of')})"
                    if null
                    else title
                ),
                "axis": p.get("axis"),
                "null": null,
                "a": {"p": index.get(p["probe_a"]), "s": "0", "who": p.get("value_a")},
                "b": {
                    "p": index.get(p["probe_b"]),
                    "s": str(int(p["sample_b"])) if null and p.get("sample_b") else "0",
                    "who": p.get("value_b"),
                },
                "v": by_pair.get(p["pair_id"], []),
            }
        )
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
        items.append(
            {
                "title": f"{base_who or 'original'} vs {who or 'variant'}"
                + (f" (sample {ident})" if kind == "s" else ""),
                "a": {"p": base, "s": "0", "who": base_who},
                "b": {"p": right, "s": sample, "who": who},
                "v": vs,
            }
        )
    items.sort(key=lambda it: (-max((_bad(v) for v in it["v"]), default=-1.0), it["title"]))
    used = {side["p"] for it in items for side in (it["a"], it["b"])}

    def distinct(values) -> list[str]:
        return sorted({str(v) for v in values if v is not None})

    return {
        "probes": probes,
        "items": items,
        "single": single,
        "other": [i for i in range(len(probes)) if i not in used],
        "any_failed": any_failed,
        # the filters' values: decision flip's axes and attribute values, group bias's personas, the
        # consistency template categories and the perturbation types
        "axes": distinct([e.get("axis") for e in entries] + [p.get("axis") for p in pairs]),
        "personas": distinct(
            [v for p in pairs for v in (p.get("value_a"), p.get("value_b"))]
            + [e.get("attribute_value") or e.get("persona_id") for e in entries if e.get("role") == "persona"]
        ),
        "cats": distinct(e.get("category") for e in entries if e.get("role") == "variant"),
        # the axes of the pairs a verdict flipped: flagged rows of an axis are the rows flipped on it
        "fax": distinct(it["axis"] for it in items if it.get("axis") and any(v.get("f") for v in it["v"])),
        # the group filter's values, ``axis=value`` (decision flip's ``gender=woman``); a group bias
        # row's come from its personas' attributes (``read``)
        "groups": distinct(
            f"{p['axis']}={v}" for p in pairs if p.get("axis") for v in (p.get("value_a"), p.get("value_b")) if v
        ),
    }


def data_block(data: dict[str, Any], element_id: str = "aip-viewer-data") -> str:
    """The data as a JSON script block (of id ``element_id``) that no text inside it can end early."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    text = text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    return f'<script type="application/json" id="{element_id}">{text}</script>'


def section(data: dict[str, Any]) -> str:
    """The viewer's section: a heading, a fallback for a browser without scripts, the data, the script."""
    return render(
        "viewer.html.j2",
        n=len(data["rows"]),
        data_block=Markup(data_block(data)),
        script=Markup(static("dom.js") + "\n" + static("viewer.js")),
    )
