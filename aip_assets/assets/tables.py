"""Lineage at table grain: the warehouse tables each stage writes, as assets beside the stage.

Each stage asset is a ``multi_asset`` whose other outputs are the tables it writes (one
transaction per partition, as before: the table assets are materialised by the same step, after
the write). A table asset's materialisation carries the partition's row count
(``dagster/row_count``), the table's columns (``dagster/column_schema``), its warehouse name, the
SQL that reads the partition, and a preview of a few rows: for judgements, the pairs that
matter most (decision flip: flipped pairs, both answers in persona order and the judge's
reasoning; group bias: the most biased pairs; the consistency and perturbation metrics: the
lowest-scored comparisons).

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


def table_key(table: str) -> AssetKey:
    return AssetKey([PREFIX, table])


def _cell(v: Any) -> str:
    if v is None or (isinstance(v, float) and v != v):
        return ""
    if isinstance(v, float):
        return f"{v:.3f}"
    text = " ".join(str(v).split())
    text = text if len(text) <= CELL else text[: CELL - 1] + "…"
    # model output is text here, never markup: no link, image, emphasis or HTML renders from it
    return "".join("\\" + ch if ch in MD_SPECIAL else ch for ch in text)


def markdown_table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    if not rows:
        return "(no rows)"
    out = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    out += ["| " + " | ".join(_cell(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(out)


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
        "preview": MetadataValue.md(f"first {PREVIEW_ROWS} of `{source}` for this partition\n\n{preview}"),
    }
