r"""The comparison page: two runs side by side, the page form of `aip-eval compare`.

``aip-eval compare A B --html`` writes it (default ``<reports folder>/compare--<A>--<B>.html``), a
self-contained file like the run report: its CSS, data and scripts inline, no external resource.

- **Scores**: the rows of ``compare_runs`` exactly, as `aip-eval compare` prints them
  (``compare_table.table_cells``: 3 decimals), each value exactly as ``--json`` prints it in its cell's
  ``data-value``, then the warnings and what the marks mean.
- **Rows side by side**: the rows of each compared metric that both runs scored (the same metric
  and ``input_id``), each run's score, label, status and counts, the differences first (a changed
  label, then a row scored in one run only or whose status changed, then by |score B - score A|,
  then the unchanged rows); a row opens to its comparisons (a persona pair, an original and a
  variant), each with both runs' verdicts: label, score, decisions, reasoning. The rows that only
  one run has are listed apart and counted. Read as the report's viewer reads a run
  (``queries.viewer_rows`` and ``viewer_evidence``, ``viewer._detail``), so no SQL is written
  twice; a comparison is matched across the runs by its two probes (the same seed synthesises the
  same probe ids), else by its title.

Large runs: at most ``rows_per_metric`` rows of each metric are embedded, the differences first,
and their verdicts within the metric's share of ``MAX_BYTES`` (a row past it says its verdicts
are not in the file); the page says how many rows were left out. Text is set from the data only
as text, and the data block is escaped as the viewer's is (``viewer.data_block``).
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pandas as pd
from markupsafe import Markup

from .. import __version__, compare_table
from .. import warehouse as wh
from ..errors import AipError
from . import queries, viewer
from .build import default_out as report_path
from .links import viewer_link
from .queries import _Reader, _warehouse_path
from .templating import render, static
from .values import _raw

ROWS_PER_METRIC = 500
MAX_BYTES = 24_000_000  # the embedded verdicts, shared evenly by the metrics
ALL_ROWS = 10**12

# the order of a pair of rows: a changed label, a row scored in one run only (or whose status
# changed), a changed score, no change
KINDS = ("label", "scored", "score", "same")


def default_out(run_a: str, run_b: str, path: str | Path | None = None) -> Path:
    """Where the comparison page of ``run_a`` and ``run_b`` goes: beside the run reports."""
    safe = lambda s: re.sub(r"[^A-Za-z0-9._-]+", "_", s)  # noqa: E731 - as the reports' names
    return report_path("x", path).parent / f"compare--{safe(run_a)}--{safe(run_b)}.html"


def _side(r: dict[str, Any]) -> dict[str, Any]:
    return {
        "score": r.get("score"),
        "label": r.get("label"),
        "status": r.get("status"),
        "nj": r.get("n_judged"),
        "nf": r.get("n_failed"),
        "ne": r.get("n_events"),
    }


def _lower(x: Any) -> str | None:
    return None if x is None else str(x).lower()


def pair_rows(rows_a: list[dict[str, Any]], rows_b: list[dict[str, Any]], metrics: list[str]) -> dict[str, Any]:
    """The rows of two runs paired by (metric, input_id), the differences first.

    Args:
        rows_a: Run A's ``row_scores`` records (``metric``, ``input_id``, ``score``, ``label``,
            ``status``, ``n_judged``, ``n_failed``, ``n_events``).
        rows_b: Run B's, the same way.
        metrics: The compared metrics, in the order to show them; other metrics' rows are left out.

    Returns:
        ``pairs``: one record per row both runs have (``m``, ``id``, ``a``, ``b``: each run's score,
        label, status and counts; ``d``: score B - score A, None unless both are scored; ``kind``:
        ``label`` when the label changed (ignoring case), else ``scored`` when one run scored the
        row and the other did not or its status changed, else ``score`` when the score changed,
        else ``same``), in that order of kinds, then by |d| descending, then by metric and
        input_id; ``only``: the rows one run has (``side`` ``a`` or ``b``), by metric, side and
        input_id; ``counts``: per metric ``both``, ``changed`` (pairs not ``same``), ``label``
        (labels changed), ``only_a`` and ``only_b``.
    """
    order = {m: i for i, m in enumerate(metrics)}
    index_a = {(r["metric"], r["input_id"]): r for r in rows_a if r["metric"] in order}
    index_b = {(r["metric"], r["input_id"]): r for r in rows_b if r["metric"] in order}
    pairs = []
    for key, ra in index_a.items():
        rb = index_b.get(key)
        if rb is None:
            continue
        sa, sb = ra.get("score"), rb.get("score")
        d = None if sa is None or sb is None else sb - sa
        if _lower(ra.get("label")) != _lower(rb.get("label")):
            kind = "label"
        elif (sa is None) != (sb is None) or ra.get("status") != rb.get("status"):
            kind = "scored"
        elif d is not None and d != 0:
            kind = "score"
        else:
            kind = "same"
        pairs.append({"m": key[0], "id": key[1], "a": _side(ra), "b": _side(rb), "d": d, "kind": kind})
    pairs.sort(key=lambda p: (KINDS.index(p["kind"]), -abs(p["d"] or 0.0), order[p["m"]], p["id"]))
    only = [
        {"m": key[0], "id": key[1], "side": side, **_side(r)}
        for side, mine, other in (("a", index_a, index_b), ("b", index_b, index_a))
        for key, r in mine.items()
        if key not in other
    ]
    only.sort(key=lambda r: (order[r["m"]], r["side"], r["id"]))
    counts = {
        m: {
            "both": sum(1 for p in pairs if p["m"] == m),
            "changed": sum(1 for p in pairs if p["m"] == m and p["kind"] != "same"),
            "label": sum(1 for p in pairs if p["m"] == m and p["kind"] == "label"),
            "only_a": sum(1 for r in only if r["m"] == m and r["side"] == "a"),
            "only_b": sum(1 for r in only if r["m"] == m and r["side"] == "b"),
        }
        for m in metrics
    }
    return {"pairs": pairs, "only": only, "counts": counts}


def _verdict(v: dict[str, Any]) -> dict[str, Any]:
    """What the page shows of a verdict of the viewer's (``viewer._detail``)."""
    return {k: v.get(k) for k in ("k", "c", "l", "s", "da", "db", "f", "at", "st", "e", "r")}


def _sig(vs: list[dict[str, Any]] | None) -> Any:
    """What must match for two runs' verdicts on one comparison to read as the same."""
    if vs is None:
        return None
    return [(v["k"], _lower(v["l"]), v["s"], v["da"], v["db"], v["f"], v["st"]) for v in vs]


def _items(detail: dict[str, Any]) -> dict[tuple, dict[str, Any]]:
    """A row's comparisons (``viewer._detail``'s items, then its verdicts on one answer) by a key
    that names the same comparison in another run: its two probes and samples, else its title."""
    probes = detail["probes"]
    out: dict[tuple, dict[str, Any]] = {}

    def put(key: tuple, item: dict[str, Any]) -> None:
        k, n = key, 1
        while k in out:  # the same key twice in a row: the second is its own comparison
            k, n = (*key, n), n + 1
        out[k] = item

    for it in detail["items"]:
        pa, pb = it["a"]["p"], it["b"]["p"]
        key: tuple = (
            ("probes", probes[pa]["id"], probes[pb]["id"], it["a"]["s"], it["b"]["s"])
            if pa is not None and pb is not None
            else ("title", it["title"])
        )
        put(key, {"t": it["title"], "ax": it.get("axis"), "v": [_verdict(v) for v in it["v"]]})
    for v in detail["single"]:
        put(("single", v.get("k"), v.get("c")), {"t": "verdict on one answer", "ax": None, "v": [_verdict(v)]})
    return out


def align(detail_a: dict[str, Any] | None, detail_b: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The comparisons of one row in both runs: ``t`` (title), ``ax`` (axis), ``a`` and ``b`` (each
    run's verdicts, None where that run has no such comparison) and ``ch`` (the verdicts differ);
    the changed ones first, each group in run B's order (the most telling first), then A's."""
    ia = _items(detail_a) if detail_a else {}
    ib = _items(detail_b) if detail_b else {}
    keys = list(ib) + [k for k in ia if k not in ib]
    out = []
    for k in keys:
        a, b = ia.get(k), ib.get(k)
        head = b or a
        assert head is not None
        va, vb = (a or {}).get("v"), (b or {}).get("v")
        out.append({"t": head["t"], "ax": head["ax"], "a": va, "b": vb, "ch": _sig(va) != _sig(vb)})
    out.sort(key=lambda it: not it["ch"])  # stable: each group keeps its order
    return out


def _report_href(run_id: str, target: Path, db: Path) -> str | None:
    """The link from the page at ``target`` to the run's report, when that report is written: its
    name when it is in the page's folder (served or opened from disk alike), else its file URL."""
    rp = report_path(run_id, db)
    if not rp.is_file():
        return None
    return quote(rp.name) if rp.parent.resolve() == target.parent.resolve() else rp.resolve().as_uri()


def _row_link(report: str | None, metric: str, input_id: str) -> str | None:
    """A row opened in a run's report viewer (None without the report)."""
    return viewer_link(report, metric=metric, open=input_id) if report else None


def read(
    run_a: str,
    run_b: str,
    metrics: list[str],
    db: Path,
    target: Path,
    rows_per_metric: int = ROWS_PER_METRIC,
    max_bytes: int = MAX_BYTES,
) -> dict[str, Any]:
    """The side-by-side rows of ``metrics`` in both runs, as plain JSON-ready data (inside a session)."""
    rd = {"a": _Reader(run_a, db), "b": _Reader(run_b, db)}
    rows = {s: queries.viewer_rows(r.records, ALL_ROWS) for s, r in rd.items()}
    paired = pair_rows(rows["a"], rows["b"], metrics)
    kept: list[dict[str, Any]] = []
    taken: dict[str, int] = {}
    for p in paired["pairs"]:  # in order: what is kept of a metric is its differences first
        if taken.get(p["m"], 0) < rows_per_metric:
            taken[p["m"]] = taken.get(p["m"], 0) + 1
            kept.append(p)
    wanted = [{"metric": p["m"], "input_id": p["id"]} for p in kept]
    evidence = {s: queries.viewer_evidence(r.records, wanted) for s, r in rd.items()}
    href = {s: _report_href(run, target, db) for s, run in (("a", run_a), ("b", run_b))}

    def detail(side: str, key: tuple[str, str]) -> dict[str, Any]:
        probes, pairs, verdicts = evidence[side]
        return viewer._detail(probes.get(key, []), pairs.get(key, []), verdicts.get(key, []))

    share = max_bytes // max(1, len(metrics))
    used: dict[str, int] = {}
    for p in kept:
        key = (p["m"], p["id"])
        items = align(detail("a", key), detail("b", key))
        size = len(json.dumps(items, ensure_ascii=False))
        if used.get(p["m"], 0) + size <= share:
            used[p["m"]] = used.get(p["m"], 0) + size
            p["v"] = items
        else:
            p["v"] = False  # not in the file: the runs' reports have them
        p["la"], p["lb"] = (_row_link(href[s], p["m"], p["id"]) for s in ("a", "b"))
    for r in paired["only"]:
        r["link"] = _row_link(href[r["side"]], r["m"], r["id"])
    meta_a, meta_b = queries.viewer_metrics(rd["a"].records), queries.viewer_metrics(rd["b"].records)
    return {
        "run_a": run_a,
        "run_b": run_b,
        "reports": href,
        "rows_per_metric": rows_per_metric,
        "metrics": [
            {
                "metric": m,
                "name": (meta_b.get(m) or meta_a.get(m) or {}).get("metric_name"),
                "shown": sum(1 for p in kept if p["m"] == m),
                **paired["counts"][m],
            }
            for m in metrics
        ],
        "rows": kept,
        "only": paired["only"],
    }


def _score_rows(df: pd.DataFrame) -> list[dict[str, Any]]:
    """The compared scores as the page's table prints them: each row's cells as `aip-eval compare`
    prints them and its values exactly as ``--json`` does."""
    out = []
    for cells, values in zip(
        (compare_table.table_cells(r) for r in df.to_dict("records")), compare_table.json_rows(df)
    ):
        out.append({"cells": cells, "row": values, "raw": {k: _raw(v) for k, v in values.items()}})
    return out


def build_comparison(
    run_a: str,
    run_b: str,
    df: pd.DataFrame,
    warnings: list[str],
    alpha: float = 0.05,
    path: str | Path | None = None,
    out: str | Path | None = None,
    rows_per_metric: int = ROWS_PER_METRIC,
) -> str:
    """The comparison page of ``compare_runs(run_a, run_b)``'s result (``df``, ``warnings``) as one
    self-contained HTML document, to be written at ``out`` (default ``default_out``)."""
    db = _warehouse_path(path)
    if not wh.exists(db):
        raise AipError(f"{db}: no warehouse yet; run `aip-eval run <spec>` first")
    target = Path(out) if out else default_out(run_a, run_b, db)
    metrics = list(dict.fromkeys(df["metric"]))

    def build(config: dict[str, Any] | None) -> str:
        with wh.session(db, read_only=True, config=config):
            runs = {s: queries.run_record(_Reader(r, db)) for s, r in (("a", run_a), ("b", run_b))}
            data = read(run_a, run_b, metrics, db, target, rows_per_metric)
        return render(
            "compare.html.j2",
            run_a=run_a,
            run_b=run_b,
            runs=runs,
            reports=data["reports"],
            css=Markup(static("report.css")),
            compare_css=Markup(static("compare.css")),
            warnings=warnings,
            scores=_score_rows(df),
            columns=["", "metric", "scope", "group", "A", "B", "diff", "interval", "p", "p adj.", "n A", "n B"],
            footnote=compare_table.footnote(df, alpha) if len(df) else [],
            n_rows=len(data["rows"]),
            data_block=Markup(viewer.data_block(data, "aip-compare-data")),
            scripts=Markup(static("dom.js") + "\n" + static("compare.js")),
            generated=datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
            version=__version__,
        )

    return wh.lean_first(build)


def write_comparison(
    run_a: str,
    run_b: str,
    df: pd.DataFrame,
    warnings: list[str],
    alpha: float = 0.05,
    out: str | Path | None = None,
    path: str | Path | None = None,
    rows_per_metric: int = ROWS_PER_METRIC,
) -> Path:
    """Write the comparison page (default ``<warehouse dir>/reports/compare--<A>--<B>.html``) and
    return its path."""
    target = Path(out) if out else default_out(run_a, run_b, path)
    text = build_comparison(run_a, run_b, df, warnings, alpha, path, target, rows_per_metric)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8")
    return target.resolve()
