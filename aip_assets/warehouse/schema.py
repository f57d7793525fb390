"""The warehouse's schema: every table's columns and types, the views, and making them.

Every table but ``eval_runs`` carries ``run_id`` and ``metric``; columns are named and typed
here, and :func:`frame` builds a DataFrame with exactly a table's columns. :func:`ensure_schema`
creates what is missing and adds the columns a newer version introduced (the warehouse's
migration, run once per process and file); ``SCHEMA_LEVEL`` orders the schemas of a lake.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import duckdb
import pandas as pd

from . import lake
from .transactions import transaction

logger = logging.getLogger("aip_assets")

# table -> ordered (column, type). Every table but eval_runs carries run_id and metric.
TABLES: dict[str, list[tuple[str, str]]] = {
    "eval_runs": [
        ("run_id", "VARCHAR PRIMARY KEY"),
        ("spec_name", "VARCHAR"),
        ("spec", "JSON"),
        ("metrics", "JSON"),
        ("metric_versions", "JSON"),
        ("dataset_path", "VARCHAR"),
        ("dataset_sha256", "VARCHAR"),
        ("datasets", "JSON"),
        ("n_dataset_rows", "INTEGER"),
        ("package_version", "VARCHAR"),
        ("seed", "BIGINT"),
        ("created_at", "TIMESTAMP"),
    ],
    "dataset_rows": [
        ("run_id", "VARCHAR"),
        ("metric", "VARCHAR"),
        ("row_index", "INTEGER"),
        ("input_id", "VARCHAR"),
        ("prompt", "VARCHAR"),
        ("prompt_is_turns", "BOOLEAN"),
        ("sut_response", "VARCHAR"),
        ("task_type", "VARCHAR"),
        ("context", "JSON"),
        ("metadata", "JSON"),
    ],
    "persona_pool": [
        ("run_id", "VARCHAR"),
        ("metric", "VARCHAR"),
        ("axis", "VARCHAR"),
        ("pool_index", "INTEGER"),
        ("value_a", "VARCHAR"),
        ("value_b", "VARCHAR"),
        ("persona_a", "VARCHAR"),
        ("persona_b", "VARCHAR"),
        ("source", "VARCHAR"),
        # explicit (a statement) or name (a name from the names catalogue, drawn per row); what each
        # persona carries ({"gender": "woman", "ethnicity": "Black"}): the pair's group and what it holds
        ("persona_form", "VARCHAR"),
        ("attributes_a", "JSON"),
        ("attributes_b", "JSON"),
    ],
    "personas": [
        ("run_id", "VARCHAR"),
        ("metric", "VARCHAR"),
        ("persona_id", "VARCHAR"),
        ("pool_index", "INTEGER"),
        ("description", "VARCHAR"),
        ("attributes", "JSON"),
        ("source", "VARCHAR"),
        ("language", "VARCHAR"),
    ],
    "probes": [
        ("run_id", "VARCHAR"),
        ("metric", "VARCHAR"),
        ("probe_id", "VARCHAR"),
        ("input_id", "VARCHAR"),
        ("axis", "VARCHAR"),
        ("category", "VARCHAR"),
        ("attribute_value", "VARCHAR"),
        ("persona", "VARCHAR"),
        ("query_text", "VARCHAR"),
        ("messages", "JSON"),
        ("template_version", "VARCHAR"),
        ("template_id", "VARCHAR"),
        ("wrapper_id", "VARCHAR"),
        # what the probe is: persona (decision flip, group bias), variant / base (consistency),
        # baseline / variant / excluded (perturbation); axis and attribute_value are decision flip's
        ("role", "VARCHAR"),
        ("persona_id", "VARCHAR"),
        ("group_id", "VARCHAR"),
        ("variant_id", "VARCHAR"),
        ("base_source", "VARCHAR"),
        ("exclusion", "VARCHAR"),
        # decision flip: how the persona is told (explicit, name), every attribute it carries, and the
        # name it gives (persona_form name)
        ("persona_form", "VARCHAR"),
        ("attributes", "JSON"),
        ("persona_name", "VARCHAR"),
    ],
    "probe_pairs": [
        ("run_id", "VARCHAR"),
        ("metric", "VARCHAR"),
        ("pair_id", "VARCHAR"),
        ("input_id", "VARCHAR"),
        ("axis", "VARCHAR"),
        ("pool_index", "INTEGER"),
        ("value_a", "VARCHAR"),
        ("value_b", "VARCHAR"),
        ("probe_a", "VARCHAR"),
        ("probe_b", "VARCHAR"),
        # persona (a real pair) or null (the no-effect baseline: one persona's first answer against
        # its fresh sample sample_b, shown to the judge as the pair twin_of is)
        ("kind", "VARCHAR"),
        ("twin_of", "VARCHAR"),
        ("sample_b", "INTEGER"),
    ],
    "sut_responses": [
        ("run_id", "VARCHAR"),
        ("metric", "VARCHAR"),
        ("probe_id", "VARCHAR"),
        ("input_id", "VARCHAR"),
        ("sample_index", "INTEGER"),
        ("response", "VARCHAR"),
        ("status", "VARCHAR"),
        ("error", "VARCHAR"),
        ("latency_ms", "DOUBLE"),
        ("prompt_tokens", "INTEGER"),
        ("completion_tokens", "INTEGER"),
        ("model", "VARCHAR"),
        ("fingerprint", "VARCHAR"),
        ("call_key", "VARCHAR"),
        ("cached", "BOOLEAN"),
    ],
    "judgements": [
        ("run_id", "VARCHAR"),
        ("metric", "VARCHAR"),
        ("judgement_id", "VARCHAR"),
        ("pair_id", "VARCHAR"),
        ("input_id", "VARCHAR"),
        ("axis", "VARCHAR"),
        ("order_swapped", "BOOLEAN"),
        ("status", "VARCHAR"),
        ("error", "VARCHAR"),
        ("raw_output", "VARCHAR"),
        ("parsed", "JSON"),
        ("decision_a", "VARCHAR"),
        ("decision_b", "VARCHAR"),
        ("decisions_differ", "BOOLEAN"),
        ("attributable", "BOOLEAN"),
        ("flipped", "BOOLEAN"),
        ("label", "VARCHAR"),
        ("score", "DOUBLE"),
        ("reasoning", "VARCHAR"),
        ("attempts", "INTEGER"),
        ("model", "VARCHAR"),
        ("call_key", "VARCHAR"),
        ("reasks", "INTEGER"),
        ("network_retries", "INTEGER"),
        ("rate_limit_waits", "INTEGER"),
        # which judge (decision, similarity / tone / effort, comparison, correctness / robustness), of what
        ("judge_kind", "VARCHAR"),
        ("category", "VARCHAR"),
        ("sample_index", "INTEGER"),
        ("group_id", "VARCHAR"),
        ("variant_id", "VARCHAR"),
    ],
    "judge_audits": [
        ("run_id", "VARCHAR"),
        ("metric", "VARCHAR"),
        ("judgement_id", "VARCHAR"),
        ("pair_id", "VARCHAR"),
        ("input_id", "VARCHAR"),
        ("axis", "VARCHAR"),
        ("status", "VARCHAR"),
        ("error", "VARCHAR"),
        ("primary_label", "VARCHAR"),
        ("audit_label", "VARCHAR"),
        ("agree", "BOOLEAN"),
        ("raw_output", "VARCHAR"),
        ("attempts", "INTEGER"),
        ("model", "VARCHAR"),
        ("call_key", "VARCHAR"),
    ],
    # a judge panel (spec judges: [...]): every judge's verdict of every judgement, its category (the
    # metric's reading, what the panel's rule compares) and its call; chosen: the verdict used
    "judge_panel": [
        ("run_id", "VARCHAR"),
        ("metric", "VARCHAR"),
        ("judgement_id", "VARCHAR"),
        ("pair_id", "VARCHAR"),
        ("input_id", "VARCHAR"),
        ("judge_kind", "VARCHAR"),
        ("judge", "INTEGER"),
        ("role", "VARCHAR"),
        ("endpoint", "VARCHAR"),
        ("model", "VARCHAR"),
        ("response_model", "VARCHAR"),
        ("status", "VARCHAR"),
        ("error", "VARCHAR"),
        ("category", "VARCHAR"),
        ("chosen", "BOOLEAN"),
        ("parsed", "JSON"),
        ("raw_output", "VARCHAR"),
        ("attempts", "INTEGER"),
        ("call_key", "VARCHAR"),
    ],
    # the judge exam before the run (judge_exam.py): each LLM judge's verdict on each exam item, whose
    # right verdict is known by construction; status right, wrong (why_wrong) or failed (error)
    "judge_exams": [
        ("run_id", "VARCHAR"),
        ("metric", "VARCHAR"),
        ("judge", "INTEGER"),
        ("role", "VARCHAR"),
        ("endpoint", "VARCHAR"),
        ("model", "VARCHAR"),
        ("item_id", "VARCHAR"),
        ("kind", "VARCHAR"),
        ("expected", "VARCHAR"),
        ("status", "VARCHAR"),
        ("why_wrong", "VARCHAR"),
        ("error", "VARCHAR"),
        ("parsed", "JSON"),
        ("raw_output", "VARCHAR"),
        ("attempts", "INTEGER"),
        ("reasks", "INTEGER"),
        ("call_key", "VARCHAR"),
        ("min_score", "DOUBLE"),
    ],
    # the units every score is computed from (scoring.py): a judged pair, comparison or variant pair
    "score_units": [
        ("run_id", "VARCHAR"),
        ("metric", "VARCHAR"),
        ("unit_id", "VARCHAR"),
        ("input_id", "VARCHAR"),
        ("score_row", "VARCHAR"),
        ("cluster", "VARCHAR"),
        ("groups", "JSON"),
        ("flip", "DOUBLE"),
        ("bias", "DOUBLE"),
        ("score", "DOUBLE"),
        ("robustness", "DOUBLE"),
        ("correctness_drop", "DOUBLE"),
    ],
    "row_scores": [
        ("run_id", "VARCHAR"),
        ("metric", "VARCHAR"),
        ("input_id", "VARCHAR"),
        ("raw_score", "DOUBLE"),
        ("score", "DOUBLE"),
        ("label", "VARCHAR"),
        ("n_judged", "INTEGER"),
        ("n_failed", "INTEGER"),
        ("n_events", "INTEGER"),
        ("status", "VARCHAR"),
        ("error", "VARCHAR"),
        ("explanation", "VARCHAR"),
    ],
    "metric_scores": [
        ("run_id", "VARCHAR"),
        ("metric", "VARCHAR"),
        ("metric_name", "VARCHAR"),
        ("scope", "VARCHAR"),
        ("group_key", "VARCHAR"),
        ("raw_score", "DOUBLE"),
        ("score", "DOUBLE"),
        ("ci_low", "DOUBLE"),
        ("ci_high", "DOUBLE"),
        ("rate", "DOUBLE"),
        ("rate_ci_low", "DOUBLE"),
        ("rate_ci_high", "DOUBLE"),
        ("n", "INTEGER"),
        ("n_events", "INTEGER"),
        ("n_failed", "INTEGER"),
        ("weight", "DOUBLE"),
        ("threshold", "DOUBLE"),
        ("passed", "BOOLEAN"),
        ("details", "JSON"),
        ("n_planned", "INTEGER"),
        ("n_excluded", "INTEGER"),
        ("excluded", "JSON"),
        ("coverage", "DOUBLE"),
        ("gate_reason", "VARCHAR"),
    ],
    "llm_calls": [
        ("run_id", "VARCHAR"),
        ("metric", "VARCHAR"),
        ("stage", "VARCHAR"),
        ("role", "VARCHAR"),
        ("call_key", "VARCHAR"),
        ("sample_index", "INTEGER"),
        ("endpoint", "VARCHAR"),
        ("model", "VARCHAR"),
        ("request", "JSON"),
        ("response_text", "VARCHAR"),
        ("status", "VARCHAR"),
        ("error", "VARCHAR"),
        ("http_status", "INTEGER"),
        ("latency_ms", "DOUBLE"),
        ("prompt_tokens", "INTEGER"),
        ("completion_tokens", "INTEGER"),
        ("attempts", "INTEGER"),
        ("response_model", "VARCHAR"),
        ("fingerprint", "VARCHAR"),
        ("source", "VARCHAR"),
        ("created_at", "TIMESTAMP"),
    ],
    "run_notes": [
        ("run_id", "VARCHAR"),
        ("metric", "VARCHAR"),
        ("stage", "VARCHAR"),
        ("level", "VARCHAR"),
        ("code", "VARCHAR"),
        ("message", "VARCHAR"),
    ],
    # a person's category for a judgement (`aip-eval label import`, human_labels.py): one row per
    # judgement and labeller, replaced when the same labeller's label is imported again; the judge's
    # category at import time beside it (the judge's side of the comparison, on the same scale)
    "human_labels": [
        ("run_id", "VARCHAR"),
        ("metric", "VARCHAR"),
        ("judgement_id", "VARCHAR"),
        ("category", "VARCHAR"),
        ("labeller", "VARCHAR"),
        ("note", "VARCHAR"),
        ("judge_category", "VARCHAR"),
        ("imported_at", "TIMESTAMP"),
        ("source_file", "VARCHAR"),
        ("source_row", "INTEGER"),
    ],
    # run B against run A (compare.py): run_id = run_b; a re-comparison of a pair replaces its rows
    "run_comparisons": [
        ("run_a", "VARCHAR"),
        ("run_b", "VARCHAR"),
        ("run_id", "VARCHAR"),
        ("metric", "VARCHAR"),
        ("scope", "VARCHAR"),
        ("group_key", "VARCHAR"),
        ("score_a", "DOUBLE"),
        ("score_b", "DOUBLE"),
        ("diff", "DOUBLE"),
        ("ci_low", "DOUBLE"),
        ("ci_high", "DOUBLE"),
        ("p_value", "DOUBLE"),
        ("p_adjusted", "DOUBLE"),
        ("significant", "BOOLEAN"),
        ("n_a", "INTEGER"),
        ("n_b", "INTEGER"),
        ("method", "VARCHAR"),
        ("warnings", "JSON"),
        ("created_at", "TIMESTAMP"),
    ],
    # this run against the spec's previous run of the metric (history.py), written by the aggregation: kind
    # score (a compared figure: compare.compare_runs at alpha_run / metrics in the run, worse when it is a
    # significant change for the worse) or drift (the share of answers, decisions or verdicts that changed on
    # the probes both runs asked; scope model: 1 when the model ids or fingerprints the SUT reported changed)
    "regressions": [
        ("run_id", "VARCHAR"),
        ("metric", "VARCHAR"),
        ("previous_run", "VARCHAR"),
        ("kind", "VARCHAR"),
        ("scope", "VARCHAR"),
        ("group_key", "VARCHAR"),
        ("score_a", "DOUBLE"),
        ("score_b", "DOUBLE"),
        ("diff", "DOUBLE"),
        ("ci_low", "DOUBLE"),
        ("ci_high", "DOUBLE"),
        ("p_value", "DOUBLE"),
        ("p_adjusted", "DOUBLE"),
        ("significant", "BOOLEAN"),
        ("worse", "BOOLEAN"),
        ("n_a", "INTEGER"),
        ("n_b", "INTEGER"),
        ("method", "VARCHAR"),
        ("alpha", "DOUBLE"),
        ("alpha_run", "DOUBLE"),
        ("sentence", "VARCHAR"),
        ("details", "JSON"),
    ],
}

# tables whose rows are owned per (run, metric, stage) rather than per (run, metric)
STAGE_SCOPED = {"llm_calls", "run_notes"}

# The views over the shared tables that are no one metric's: people's labels, the judge's checks,
# the weakest rows, a run's summary, its calls, run over run. Each metric's own views are its own
# (``Metric.views()``, in its package); :func:`views` gives them all, the metrics' first.
CORE_VIEWS: dict[str, str] = {
    "v_flip_rate_by_axis": """
        SELECT run_id, metric, group_key AS axis, rate AS flip_rate, rate_ci_low, rate_ci_high,
               n AS pairs_judged, n_events AS flips, n_excluded AS pairs_excluded, n_failed AS pairs_failed, coverage, excluded, score
        FROM metric_scores WHERE scope = 'axis'
    """,
    # every claim a run's metrics tested (docs/concepts/claims.md): what it names, its estimate and interval at
    # the claim's matching level, its p-value raw and adjusted within the metric's claims, and the decision
    "v_claims": """
        SELECT run_id, metric, group_key AS claim, details ->> 'kind' AS kind, details ->> 'axis' AS axis,
               details ->> 'value' AS value, details ->> 'sides' AS sides, details ->> 'direction' AS direction,
               raw_score AS estimate, ci_low, ci_high, CAST(details ->> 'ci_confidence' AS DOUBLE) AS ci_confidence,
               CAST(details ->> 'p_value' AS DOUBLE) AS p_value, CAST(details ->> 'p_adjusted' AS DOUBLE) AS p_adjusted,
               details ->> 'status' AS status, CAST(details ->> 'claimed' AS BOOLEAN) AS claimed, n,
               details ->> 'why' AS not_tested_because, details ->> 'method' AS method, details
        FROM metric_scores WHERE scope = 'claim'
    """,
    # each person's label beside the judge's verdict on the same judgement (human_labels.py)
    "v_human_vs_judge": """
        SELECT h.run_id, h.metric, h.judgement_id, h.labeller, h.category AS human_category,
               h.judge_category, h.category = h.judge_category AS agree, h.note, j.input_id, j.pair_id, j.axis,
               j.judge_kind, j.category AS item_category, j.status AS judge_status, j.label AS judge_label,
               j.score AS judge_score, j.reasoning AS judge_reasoning, h.source_file, h.source_row, h.imported_at
        FROM human_labels h
        LEFT JOIN judgements j ON j.run_id = h.run_id AND j.metric = h.metric AND j.judgement_id = h.judgement_id
    """,
    # the judge against people per run and metric: agreement and kappa, each category's sensitivity
    # and specificity, the key rate corrected for them (or why not)
    "v_human_agreement": """
        WITH h AS (SELECT *, regexp_extract(group_key, '^[a-z]+') AS what FROM metric_scores
                   WHERE scope = 'human_agreement')
        SELECT run_id, metric, what,
               CASE WHEN strpos(group_key, ':') > 0 THEN substr(group_key, strpos(group_key, ':') + 1) END AS category,
               rate, rate_ci_low, rate_ci_high, n, n_events,
               CASE WHEN what = 'agreement' THEN raw_score END AS kappa,
               CASE WHEN what = 'agreement' THEN ci_low END AS kappa_ci_low,
               CASE WHEN what = 'agreement' THEN ci_high END AS kappa_ci_high,
               CASE WHEN what = 'category' THEN CAST(details ->> 'specificity' AS DOUBLE) END AS specificity,
               CASE WHEN what = 'category' THEN CAST(details -> 'specificity_ci95' ->> 0 AS DOUBLE) END AS specificity_ci_low,
               CASE WHEN what = 'category' THEN CAST(details -> 'specificity_ci95' ->> 1 AS DOUBLE) END AS specificity_ci_high,
               CASE WHEN what = 'corrected' THEN raw_score END AS judge_rate,
               details ->> 'why' AS no_corrected_rate_because, details
        FROM h
    """,
    # a judge panel: each judge's verdict of each judgement beside the judgement's outcome (the
    # verdict used, or judges_disagree / judge_failed) and whether this judge agreed with it
    "v_judge_panel": """
        SELECT p.run_id, p.metric, p.judgement_id, p.pair_id, p.input_id, p.judge_kind, p.judge, p.role, p.model,
               p.status AS judge_status, p.category, p.chosen, j.status AS judgement_status,
               j.label AS judgement_label, c.category AS used_category,
               p.category IS NOT DISTINCT FROM c.category AND c.category IS NOT NULL AS agrees_with_used,
               p.parsed ->> 'reasoning' AS reasoning, p.error, p.raw_output, p.attempts, p.call_key
        FROM judge_panel p
        LEFT JOIN judgements j ON j.run_id = p.run_id AND j.metric = p.metric AND j.judgement_id = p.judgement_id
        LEFT JOIN judge_panel c ON c.run_id = p.run_id AND c.metric = p.metric AND c.judgement_id = p.judgement_id
             AND c.chosen
    """,
    # the judge exam per judge and kind of item: right answers, share and its Wilson 95% interval
    "v_judge_exams": """
        WITH k AS (
            SELECT run_id, metric, judge, role, endpoint, model, kind, count(*) AS n,
                   count(*) FILTER (WHERE status = 'right') AS n_right,
                   count(*) FILTER (WHERE status = 'failed') AS n_failed, any_value(min_score) AS min_score
            FROM judge_exams GROUP BY ALL),
        w AS (SELECT *, n_right / n AS share, 1.959963984540054 AS z FROM k)
        SELECT run_id, metric, judge, role, endpoint, model, kind, n, n_right, n_failed, share,
               (share + z * z / (2 * n) - z * sqrt(share * (1 - share) / n + z * z / (4 * n * n))) / (1 + z * z / n)
                   AS ci_low,
               (share + z * z / (2 * n) + z * sqrt(share * (1 - share) / n + z * z / (4 * n * n))) / (1 + z * z / n)
                   AS ci_high,
               min_score
        FROM w
    """,
    "v_position_bias": """
        SELECT run_id, metric, order_swapped, count(*) AS judged,
               avg(CASE WHEN decisions_differ THEN 1.0 ELSE 0.0 END) AS differ_rate,
               avg(CASE WHEN flipped THEN 1.0 ELSE 0.0 END) AS flip_rate,
               avg(CASE WHEN decision_a < decision_b THEN 1.0 ELSE 0.0 END)
                   FILTER (WHERE decision_a IS NOT NULL AND decision_b IS NOT NULL) AS a_sorts_first_rate
        FROM judgements WHERE status = 'ok' GROUP BY ALL
    """,
    "v_weakest_rows": """
        SELECT rs.run_id, rs.metric, rs.input_id, rs.score, rs.raw_score, rs.label, rs.n_judged, rs.n_failed,
               rs.n_events, rs.status, rs.error, rs.explanation, d.prompt, d.task_type
        FROM row_scores rs
        LEFT JOIN dataset_rows d ON d.run_id = rs.run_id AND d.metric = rs.metric AND d.input_id = rs.input_id
        ORDER BY rs.run_id, rs.metric, rs.score ASC NULLS FIRST, rs.input_id
    """,
    "v_run_summary": """
        SELECT m.run_id, r.spec_name, r.created_at, m.metric, m.metric_name, m.score, m.ci_low, m.ci_high,
               m.n, m.n_events, m.n_failed, m.coverage, m.n_excluded, m.excluded, m.threshold, m.passed, m.gate_reason
        FROM metric_scores m LEFT JOIN eval_runs r USING (run_id)
        WHERE m.scope = 'overall'
    """,
    "v_call_stats": """
        SELECT run_id, metric, stage, role, count(*) AS calls,
               count(*) FILTER (WHERE status <> 'ok') AS failed,
               sum(prompt_tokens) AS prompt_tokens, sum(completion_tokens) AS completion_tokens,
               median(latency_ms) AS p50_latency_ms, quantile_cont(latency_ms, 0.95) AS p95_latency_ms
        FROM llm_calls GROUP BY ALL
    """,
    # each run's overall scores beside the previous run's of the same spec: the plain difference,
    # no test (aip-eval compare tests it); a changed metric version is flagged
    "v_run_over_run": """
        WITH o AS (
            SELECT m.run_id, r.spec_name, r.created_at, m.metric, m.score, m.n,
                   r.metric_versions ->> m.metric AS metric_version
            FROM metric_scores m JOIN eval_runs r USING (run_id) WHERE m.scope = 'overall'),
        l AS (
            SELECT *, lag(run_id) OVER w AS prev_run_id, lag(created_at) OVER w AS prev_created_at,
                   lag(score) OVER w AS prev_score, lag(n) OVER w AS prev_n,
                   lag(metric_version) OVER w AS prev_metric_version
            FROM o WINDOW w AS (PARTITION BY spec_name, metric ORDER BY created_at, run_id))
        SELECT spec_name, metric, prev_run_id, run_id, prev_created_at, created_at, prev_score, score,
               score - prev_score AS diff, prev_n, n, prev_metric_version, metric_version,
               prev_metric_version IS DISTINCT FROM metric_version AS version_changed
        FROM l WHERE prev_run_id IS NOT NULL
    """,
    # every figure of every run of a spec, oldest first: each scope's score or rate with its interval, the
    # gate, coverage, the model ids and fingerprints the SUT reported, and the change since the spec's
    # run before (a plain difference; the regressions table tests it)
    "v_spec_history": """
        WITH m AS (
            SELECT run_id, metric,
                   string_agg(DISTINCT model, ', ' ORDER BY model) AS sut_models,
                   string_agg(DISTINCT fingerprint, ', ' ORDER BY fingerprint) AS sut_fingerprints
            FROM sut_responses WHERE status = 'ok' GROUP BY ALL),
        s AS (
            SELECT r.spec_name, s.run_id, r.created_at, s.metric, s.scope, s.group_key, s.score, s.ci_low, s.ci_high,
                   s.rate, s.rate_ci_low, s.rate_ci_high, s.n, s.n_events, s.coverage, s.threshold, s.passed,
                   s.gate_reason, m.sut_models, m.sut_fingerprints, r.dataset_sha256
            FROM metric_scores s JOIN eval_runs r USING (run_id) LEFT JOIN m USING (run_id, metric)
            WHERE s.scope <> 'claim')
        SELECT *, lag(run_id) OVER w AS prev_run_id, score - lag(score) OVER w AS score_change,
               rate - lag(rate) OVER w AS rate_change
        FROM s WINDOW w AS (PARTITION BY spec_name, metric, scope, group_key ORDER BY created_at, run_id)
    """,
}


def views() -> dict[str, str]:
    """Every view, name -> SELECT, in the order they are made: each registered metric's own
    (``metrics.all_views()``: the metrics a view reads are loaded), then the core ones."""
    from ..metrics import all_views

    return {**all_views(), **CORE_VIEWS}


def ensure_schema(con: duckdb.DuckDBPyConnection, in_lake: bool = False) -> None:
    """Create missing tables, add columns a newer version introduced, refresh the views. In a lake
    (which has no PRIMARY KEY: ``register_run`` checks a run id is new) all of it is one
    transaction, run again if another worker's made the same at the same moment."""
    every_view = views()

    def make(c: duckdb.DuckDBPyConnection) -> None:
        for table, cols in {**TABLES, **(LAKE_TABLES if in_lake else {})}.items():
            cols = [(col, t.replace(" PRIMARY KEY", "") if in_lake else t) for col, t in cols]
            c.execute(f"CREATE TABLE IF NOT EXISTS {table} ({', '.join(f'{col} {t}' for col, t in cols)})")
            for col, t in cols:
                c.execute(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {col} {t.replace(' PRIMARY KEY', '')}")
        for name, sql in every_view.items():
            c.execute(f"CREATE OR REPLACE VIEW {name} AS {sql}")

    if not in_lake:
        make(con)
        return
    # in a lake every DDL statement is a snapshot in the catalog: made only when this version's
    # tables and views are not there yet (their hash, in aip_schema)
    import hashlib
    import json

    version = hashlib.sha256(json.dumps([TABLES, every_view, LAKE_TABLES], sort_keys=True).encode()).hexdigest()[:16]

    def current(c: duckdb.DuckDBPyConnection) -> bool:
        """Whether the lake's schema is this one, or a later one (an older worker in a rolling
        deploy must not put its views back)."""
        if not c.execute(
            "SELECT 1 FROM duckdb_tables() WHERE database_name = current_database() AND table_name = 'aip_schema'"
        ).fetchone():
            return False
        row = c.execute("SELECT level, version FROM aip_schema").fetchone()
        if row is None:
            return False
        if int(row[0]) > SCHEMA_LEVEL:
            logger.warning(
                f"{lake.where()}: its tables are of a later aip_assets (schema level {row[0]}; this "
                f"one's is {SCHEMA_LEVEL}): left as they are"
            )
            return True
        return int(row[0]) == SCHEMA_LEVEL and row[1] == version

    if current(con):
        return

    def make_marked(c: duckdb.DuckDBPyConnection) -> None:
        if current(c):  # another worker made them meanwhile
            return
        make(c)
        c.execute("CREATE TABLE IF NOT EXISTS aip_schema (level INTEGER, version VARCHAR)")
        c.execute("DELETE FROM aip_schema")
        c.execute("INSERT INTO aip_schema VALUES (?, ?)", [SCHEMA_LEVEL, version])

    transaction(con, make_marked, "the warehouse's tables")


# Raised with every change to TABLES, the views or LAKE_TABLES: a lake made by a later level is never
# remade by an earlier one (workers of two versions during a rolling deploy)
SCHEMA_LEVEL = 8  # 4: human_labels, v_human_vs_judge, v_human_agreement; 5: judge_panel, v_judge_panel;
# 6: judge_exams, v_judge_exams; 7: persona_form, attributes and names of persona pools and probes;
# 8: regressions, v_spec_history
# A lake's own tables: the reports (report.write_report), so any host's `aip-eval report --serve`
# serves what any worker wrote, from the object store the lake's files are in
LAKE_TABLES: dict[str, list[tuple[str, str]]] = {
    "reports": [("run_id", "VARCHAR"), ("name", "VARCHAR"), ("html", "VARCHAR"), ("written_at", "TIMESTAMP")],
}


def frame(table: str, records: Iterable[dict[str, Any]] | pd.DataFrame, **const: Any) -> pd.DataFrame:
    """Build a DataFrame with exactly ``table``'s columns, in order, from records (+ constants)."""
    cols = [c for c, _ in TABLES[table]]
    df = records.copy() if isinstance(records, pd.DataFrame) else pd.DataFrame.from_records(list(records))
    for k, v in const.items():
        df[k] = v
    extra = set(df.columns) - set(cols)
    if extra:
        raise ValueError(f"{table}: unknown columns {sorted(extra)}")
    for c in cols:
        if c not in df.columns:
            df[c] = None
    return df[cols]


_ARROW = {
    "VARCHAR": "string",
    "JSON": "string",
    "DOUBLE": "float64",
    "INTEGER": "int64",
    "BIGINT": "int64",
    "BOOLEAN": "bool",
    "TIMESTAMP": "timestamp",
}


def arrow_schema(table: str):
    import pyarrow as pa

    def typ(t: str):
        name = _ARROW[t.split()[0]]
        return pa.timestamp("ns") if name == "timestamp" else pa.type_for_alias(name)

    return pa.schema([(c, typ(t)) for c, t in TABLES[table]])
