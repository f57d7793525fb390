"""Lineage at table grain: the warehouse tables each stage writes, as assets beside the stage.

Each stage asset is a ``multi_asset`` whose other outputs are the tables it writes (one
transaction per partition, as before: the table assets are materialised by the same step, after
the write). A table asset's materialisation carries the partition's row count
(``dagster/row_count``), the table's columns (``dagster/column_schema``), its warehouse name, the
SQL that reads the partition, and a preview of a few rows: for judgements, the pairs that
matter most (decision flip: flipped pairs, both answers in persona order and the judge's
reasoning; group bias: the most biased pairs; the consistency and perturbation metrics: the
lowest-scored comparisons). Where a preview shows the two prompts of a pair (``query_a`` and
``query_b``; group bias's persona descriptions ``description_a`` and ``description_b``), the
words that differ between them are in **bold**, so a pair reads at a glance.

``llm_calls`` and ``run_notes`` are written by several stages, so they are no table asset of
one; each stage's own metadata counts its rows there.
"""

from __future__ import annotations

from typing import Any

from dagster import AssetKey, MetadataValue, TableColumn, TableSchema

from .. import warehouse as wh
from ..warehouse import lake

STAGE_TABLES: dict[str, list[str]] = {
    "ingest": ["dataset_rows"],
    "synthesis": ["persona_pool", "personas", "probes", "probe_pairs"],
    "sampling": ["sut_responses"],
    "judging": ["judgements", "judge_audits", "judge_panel"],
    "aggregation": ["score_units", "row_scores", "metric_scores"],
}
PREFIX = "warehouse"  # table assets are keyed warehouse/<table>
PREVIEW_ROWS = 5
MD_SPECIAL = set("\\`*_{}[]()<>#+!|~")
CELL = 160  # characters per preview cell
PROMPT_CELL = 400  # characters per prompt cell of a pair (its differing words are why it is shown)
# the columns of a preview that are the two prompts of a pair: their differing words are marked
MARKED_PAIRS = (("query_a", "query_b"), ("description_a", "description_b"))


def table_key(table: str) -> AssetKey:
    return AssetKey([PREFIX, table])


def _cell(v: Any) -> str:
    if v is None or (isinstance(v, float) and v != v):
        return ""
    if isinstance(v, float):
        return f"{v:.3f}"
    raw = str(v)
    cut = raw[: 8 * CELL]  # a cell shows CELL characters: a 5 MB prompt is not split whole for them
    text = " ".join(cut.split())
    text = text if len(text) <= CELL and len(cut) == len(raw) else text[: CELL - 1] + "…"
    # model output is text here, never markup: no link, image, emphasis or HTML renders from it
    return _escape(text)


def _escape(text: str) -> str:
    return "".join("\\" + ch if ch in MD_SPECIAL else ch for ch in text)


def mark_differences(a: Any, b: Any, limit: int = PROMPT_CELL) -> tuple[str, str]:
    """Two prompts as preview cells with the words that differ between them in **bold** (the
    words escaped, as every cell is); each cut at a word to about ``limit`` characters.

    Args:
        a: The pair's first prompt (None is empty).
        b: Its second prompt.
        limit: Characters of each prompt kept.

    Returns:
        The two cells, ``("As a **woman**, …", "As a **man**, …")``.
    """
    from difflib import SequenceMatcher

    # only what a cell can show is compared (in time independent of the prompts' size: two 5 MB
    # prompts compared whole, difflib's quadratic worst case, held an aggregation past 300 s)
    wa, wb = _shown_words(str(a or ""), limit), _shown_words(str(b or ""), limit)
    marked: tuple[list[tuple[str, bool]], list[tuple[str, bool]]] = ([], [])  # (word, differs)
    for op, i1, i2, j1, j2 in SequenceMatcher(a=wa, b=wb, autojunk=False).get_opcodes():
        marked[0].extend((w, op != "equal") for w in wa[i1:i2])
        marked[1].extend((w, op != "equal") for w in wb[j1:j2])

    def cell(words: list[tuple[str, bool]]) -> str:
        kept: list[tuple[str, bool]] = []
        n = 0
        for w, differs in words:
            if kept and n + len(w) > limit:
                kept.append(("…", False))
                break
            kept.append((_escape(w), differs))
            n += len(w) + 1
        runs: list[str] = []  # consecutive words that differ in one bold run
        for i, (w, differs) in enumerate(kept):
            opens = differs and (i == 0 or not kept[i - 1][1])
            closes = differs and (i == len(kept) - 1 or not kept[i + 1][1])
            runs.append(("**" if opens else "") + w + ("**" if closes else ""))
        return " ".join(runs)

    return cell(marked[0]), cell(marked[1])


def _shown_words(text: str, limit: int) -> list[str]:
    """The words of ``text`` a cell of ``limit`` characters can show, and as many again: a word
    cut by that bound is left out. A cell is never more, so nothing past it is split or compared."""
    bound = 2 * limit
    if len(text) <= bound:
        return text.split()
    words = text[:bound].split()
    if words and not text[bound].isspace():  # the last word runs past the bound
        words.pop()
    return words


def markdown_table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    """Rows as a markdown table of escaped, one-line cells; the two prompts of a pair
    (``MARKED_PAIRS``) with their differing words in bold."""
    if not rows:
        return "(no rows)"
    pairs = [(x, y) for x, y in MARKED_PAIRS if x in columns and y in columns]
    shown = []
    for r in rows:
        cells = {c: _cell(r.get(c)) for c in columns}
        for x, y in pairs:
            cells[x], cells[y] = mark_differences(r.get(x), r.get(y))
        shown.append(cells)
    return _table(shown, columns)


def _table(cells: list[dict[str, str]], columns: list[str]) -> str:
    """Cells made (escaped, marked) as a markdown table."""
    out = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return "\n".join(out + ["| " + " | ".join(r[c] for c in columns) + " |" for r in cells])


_GENERIC = (
    "judgements",
    ["judgement_id", "judge_kind", "status", "label", "score", "reasoning", "error"],
    "score ASC NULLS LAST, judgement_id",
    "TRUE",
)


def _preview_query(table: str, metric: str) -> list[tuple[str, list[str], str, str]]:
    """(view or table, columns, ORDER BY, WHERE) to preview, the first that has rows for the
    partition is shown: a metric's judgements as it declares (``Metric.judgement_previews``)."""
    if table == "judgements":
        from ..metrics import get_metric

        declared = get_metric(metric).judgement_previews
        return [(view, list(cols), order, where) for view, cols, order, where in declared] or [_GENERIC]
    cols = [c for c, _ in wh.TABLES[table] if c not in ("run_id", "metric", "messages", "request")][:8]
    return [(table, cols, "1", "TRUE")]


WEAKEST_PAIRS = 3  # pairs (or rows) whose probes the probes preview shows once they are scored
_PAIR_PROBES = f"""
    WITH w AS (
        SELECT pp.pair_id, pp.probe_a, pp.probe_b, min(j.score) AS worst, bool_or(coalesce(j.flipped, false)) AS flipped
        FROM probe_pairs pp
        JOIN judgements j ON j.run_id = pp.run_id AND j.metric = pp.metric AND j.pair_id = pp.pair_id
        WHERE pp.run_id = $run AND pp.metric = $metric AND coalesce(pp.kind, 'persona') <> 'null'
        GROUP BY ALL ORDER BY flipped DESC, worst ASC NULLS LAST, pair_id LIMIT {WEAKEST_PAIRS})
    SELECT w.pair_id, w.flipped, w.worst AS pair_score, p.probe_id, p.axis,
           coalesce(p.attribute_value, p.persona_id) AS persona, p.query_text
    FROM w JOIN probes p ON p.run_id = $run AND p.metric = $metric AND p.probe_id IN (w.probe_a, w.probe_b)
    ORDER BY w.flipped DESC, w.worst ASC NULLS LAST, w.pair_id, p.probe_id = w.probe_b
"""
_ROW_PROBES = f"""
    WITH w AS (
        SELECT input_id, score FROM row_scores WHERE run_id = $run AND metric = $metric
        ORDER BY score ASC NULLS LAST, input_id LIMIT {WEAKEST_PAIRS})
    SELECT w.input_id, w.score AS row_score, p.probe_id, p.role, p.category, p.query_text
    FROM w JOIN probes p ON p.run_id = $run AND p.metric = $metric AND p.input_id = w.input_id
    ORDER BY w.score ASC NULLS LAST, w.input_id, p.probe_id
"""


def weakest_probes_preview(con, run_id: str, metric: str) -> str | None:
    """The probes of a partition's flagged or weakest pairs as a preview, once they are judged:
    a paired metric's flipped pairs first, then its lowest-scored (both probes of each); another
    metric's lowest-scored rows' probes. None before anything is judged or scored."""
    for sql, what in ((_PAIR_PROBES, "flipped or lowest-scored pairs"), (_ROW_PROBES, "lowest-scored rows")):
        rows = con.execute(sql, {"run": run_id, "metric": metric}).df()
        if not len(rows):
            continue
        records, columns = rows.to_dict("records"), list(rows.columns)
        cells = [{c: _cell(r[c]) for c in columns} for r in records]
        if "pair_id" in columns:  # a pair's two probes, one after the other: their differing words in bold
            for i in range(len(records) - 1):
                if records[i]["pair_id"] == records[i + 1]["pair_id"]:
                    q = mark_differences(records[i]["query_text"], records[i + 1]["query_text"])
                    cells[i]["query_text"], cells[i + 1]["query_text"] = q
        head = f"the probes of the {rows.iloc[:, 0].nunique()} {what} of this partition"
        return f"{head}\n\n{_table(cells, columns)}"
    return None


def table_materialization_metadata(con, table: str, run_id: str, metric: str) -> dict[str, Any]:
    """Metadata of one table asset for one partition (read on the stage's connection)."""
    n = con.execute(f"SELECT count(*) FROM {table} WHERE run_id = ? AND metric = ?", [run_id, metric]).fetchone()[0]
    schema = TableSchema(columns=[TableColumn(name=c, type=t) for c, t in wh.TABLES[table]])
    preview, source = "(no rows)", table
    for view, cols, order, where in _preview_query(table, metric):
        rows = con.execute(
            f"SELECT {', '.join(cols)} FROM {view} WHERE run_id = ? AND metric = ? AND {where} "
            f"ORDER BY {order} LIMIT {PREVIEW_ROWS}",
            [run_id, metric],
        ).df()
        if len(rows):
            preview, source = markdown_table(rows.to_dict("records"), cols), view
            break
    quoted = lambda v: "'" + v.replace("'", "''") + "'"  # noqa: E731 - shown, never executed
    sql = f"SELECT * FROM {table} WHERE run_id = {quoted(run_id)} AND metric = {quoted(metric)}"
    return {
        "dagster/row_count": MetadataValue.int(int(n)),
        "dagster/column_schema": MetadataValue.table_schema(schema),
        "dagster/table_name": MetadataValue.text(f"{lake.ALIAS if lake.enabled() else 'warehouse'}.main.{table}"),
        "query": MetadataValue.md(f"```sql\n{sql}\n```"),
        "preview": MetadataValue.md(
            f"first {PREVIEW_ROWS} of `{source}` for this partition\n\n{preview}"
            + (
                "\n\n(once the partition is judged, its aggregation adds an observation here with the "
                "probes of the flagged or weakest pairs)"
                if table == "probes"
                else ""
            )
        ),
    }
