"""The DuckDB warehouse: explicit table schemas, replace-a-partition writes, views.

DuckDB lets one process open a file for writing, and while it does no other process can open
it at all. So every access goes through :func:`connect`, which holds an exclusive file lock
beside the database while it is open and retries on lock errors. The database stays open a
quarter of a second after its last use (at most 2 s in all, and closed at once for a waiting
process of the project, :class:`_Linger`), so a burst of uses opens it once; the lock is held
that long too, also while the process goes on to other work (model calls included). A stage
replaces its partition's rows in one transaction.
"""

from __future__ import annotations

import atexit
import fcntl
import logging
import os
import random
import re
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, TypeVar

import duckdb
import pandas as pd

from . import lake
from .errors import AipError

# table -> ordered (column, type). Every table but eval_runs carries run_id and metric.
TABLES: dict[str, list[tuple[str, str]]] = {
    "eval_runs": [
        ("run_id", "VARCHAR PRIMARY KEY"), ("spec_name", "VARCHAR"), ("spec", "JSON"), ("metrics", "JSON"),
        ("metric_versions", "JSON"), ("dataset_path", "VARCHAR"), ("dataset_sha256", "VARCHAR"), ("datasets", "JSON"),
        ("n_dataset_rows", "INTEGER"), ("package_version", "VARCHAR"), ("seed", "BIGINT"),
        ("created_at", "TIMESTAMP"),
    ],
    "dataset_rows": [
        ("run_id", "VARCHAR"), ("metric", "VARCHAR"), ("row_index", "INTEGER"), ("input_id", "VARCHAR"),
        ("prompt", "VARCHAR"), ("prompt_is_turns", "BOOLEAN"), ("sut_response", "VARCHAR"), ("task_type", "VARCHAR"),
        ("context", "JSON"), ("metadata", "JSON"),
    ],
    "persona_pool": [
        ("run_id", "VARCHAR"), ("metric", "VARCHAR"), ("axis", "VARCHAR"), ("pool_index", "INTEGER"),
        ("value_a", "VARCHAR"), ("value_b", "VARCHAR"), ("persona_a", "VARCHAR"), ("persona_b", "VARCHAR"),
        ("source", "VARCHAR"),
    ],
    "personas": [
        ("run_id", "VARCHAR"), ("metric", "VARCHAR"), ("persona_id", "VARCHAR"), ("pool_index", "INTEGER"),
        ("description", "VARCHAR"), ("attributes", "JSON"), ("source", "VARCHAR"), ("language", "VARCHAR"),
    ],
    "probes": [
        ("run_id", "VARCHAR"), ("metric", "VARCHAR"), ("probe_id", "VARCHAR"), ("input_id", "VARCHAR"),
        ("axis", "VARCHAR"), ("category", "VARCHAR"), ("attribute_value", "VARCHAR"), ("persona", "VARCHAR"),
        ("query_text", "VARCHAR"), ("messages", "JSON"), ("template_version", "VARCHAR"),
        ("template_id", "VARCHAR"), ("wrapper_id", "VARCHAR"),
        # what the probe is: persona (decision flip, group bias), variant / base (consistency),
        # baseline / variant / excluded (perturbation); axis and attribute_value are decision flip's
        ("role", "VARCHAR"), ("persona_id", "VARCHAR"), ("group_id", "VARCHAR"), ("variant_id", "VARCHAR"),
        ("base_source", "VARCHAR"), ("exclusion", "VARCHAR"),
    ],
    "probe_pairs": [
        ("run_id", "VARCHAR"), ("metric", "VARCHAR"), ("pair_id", "VARCHAR"), ("input_id", "VARCHAR"),
        ("axis", "VARCHAR"), ("pool_index", "INTEGER"), ("value_a", "VARCHAR"), ("value_b", "VARCHAR"),
        ("probe_a", "VARCHAR"), ("probe_b", "VARCHAR"),
        # persona (a real pair) or null (the no-effect baseline: one persona's first answer against
        # its fresh sample sample_b, shown to the judge as the pair twin_of is)
        ("kind", "VARCHAR"), ("twin_of", "VARCHAR"), ("sample_b", "INTEGER"),
    ],
    "sut_responses": [
        ("run_id", "VARCHAR"), ("metric", "VARCHAR"), ("probe_id", "VARCHAR"), ("input_id", "VARCHAR"),
        ("sample_index", "INTEGER"), ("response", "VARCHAR"), ("status", "VARCHAR"), ("error", "VARCHAR"), ("latency_ms", "DOUBLE"),
        ("prompt_tokens", "INTEGER"), ("completion_tokens", "INTEGER"), ("model", "VARCHAR"),
        ("fingerprint", "VARCHAR"), ("call_key", "VARCHAR"), ("cached", "BOOLEAN"),
    ],
    "judgements": [
        ("run_id", "VARCHAR"), ("metric", "VARCHAR"), ("judgement_id", "VARCHAR"), ("pair_id", "VARCHAR"),
        ("input_id", "VARCHAR"), ("axis", "VARCHAR"), ("order_swapped", "BOOLEAN"), ("status", "VARCHAR"),
        ("error", "VARCHAR"), ("raw_output", "VARCHAR"), ("parsed", "JSON"), ("decision_a", "VARCHAR"),
        ("decision_b", "VARCHAR"), ("decisions_differ", "BOOLEAN"), ("attributable", "BOOLEAN"),
        ("flipped", "BOOLEAN"), ("label", "VARCHAR"), ("score", "DOUBLE"), ("reasoning", "VARCHAR"),
        ("attempts", "INTEGER"), ("model", "VARCHAR"), ("call_key", "VARCHAR"), ("reasks", "INTEGER"),
        ("network_retries", "INTEGER"), ("rate_limit_waits", "INTEGER"),
        # which judge (decision, similarity / tone / effort, comparison, correctness / robustness), of what
        ("judge_kind", "VARCHAR"), ("category", "VARCHAR"), ("sample_index", "INTEGER"), ("group_id", "VARCHAR"),
        ("variant_id", "VARCHAR"),
    ],
    "judge_audits": [
        ("run_id", "VARCHAR"), ("metric", "VARCHAR"), ("judgement_id", "VARCHAR"), ("pair_id", "VARCHAR"),
        ("input_id", "VARCHAR"), ("axis", "VARCHAR"), ("status", "VARCHAR"), ("error", "VARCHAR"),
        ("primary_label", "VARCHAR"), ("audit_label", "VARCHAR"), ("agree", "BOOLEAN"), ("raw_output", "VARCHAR"),
        ("attempts", "INTEGER"), ("model", "VARCHAR"), ("call_key", "VARCHAR"),
    ],
    # a judge panel (spec judges: [...]): every judge's verdict of every judgement, its category (the
    # metric's reading, what the panel's rule compares) and its call; chosen: the verdict used
    "judge_panel": [
        ("run_id", "VARCHAR"), ("metric", "VARCHAR"), ("judgement_id", "VARCHAR"), ("pair_id", "VARCHAR"),
        ("input_id", "VARCHAR"), ("judge_kind", "VARCHAR"), ("judge", "INTEGER"), ("role", "VARCHAR"),
        ("endpoint", "VARCHAR"), ("model", "VARCHAR"), ("response_model", "VARCHAR"), ("status", "VARCHAR"),
        ("error", "VARCHAR"), ("category", "VARCHAR"), ("chosen", "BOOLEAN"), ("parsed", "JSON"),
        ("raw_output", "VARCHAR"), ("attempts", "INTEGER"), ("call_key", "VARCHAR"),
    ],
    # the units every score is computed from (scoring.py): a judged pair, comparison or variant pair
    "score_units": [
        ("run_id", "VARCHAR"), ("metric", "VARCHAR"), ("unit_id", "VARCHAR"), ("input_id", "VARCHAR"),
        ("score_row", "VARCHAR"), ("cluster", "VARCHAR"), ("groups", "JSON"), ("flip", "DOUBLE"), ("bias", "DOUBLE"),
        ("score", "DOUBLE"), ("robustness", "DOUBLE"), ("correctness_drop", "DOUBLE"),
    ],
    "row_scores": [
        ("run_id", "VARCHAR"), ("metric", "VARCHAR"), ("input_id", "VARCHAR"), ("raw_score", "DOUBLE"),
        ("score", "DOUBLE"), ("label", "VARCHAR"), ("n_judged", "INTEGER"), ("n_failed", "INTEGER"),
        ("n_events", "INTEGER"), ("status", "VARCHAR"), ("error", "VARCHAR"), ("explanation", "VARCHAR"),
    ],
    "metric_scores": [
        ("run_id", "VARCHAR"), ("metric", "VARCHAR"), ("metric_name", "VARCHAR"), ("scope", "VARCHAR"),
        ("group_key", "VARCHAR"), ("raw_score", "DOUBLE"), ("score", "DOUBLE"), ("ci_low", "DOUBLE"),
        ("ci_high", "DOUBLE"), ("rate", "DOUBLE"), ("rate_ci_low", "DOUBLE"), ("rate_ci_high", "DOUBLE"),
        ("n", "INTEGER"), ("n_events", "INTEGER"), ("n_failed", "INTEGER"), ("weight", "DOUBLE"),
        ("threshold", "DOUBLE"), ("passed", "BOOLEAN"), ("details", "JSON"), ("n_planned", "INTEGER"),
        ("n_excluded", "INTEGER"), ("excluded", "JSON"), ("coverage", "DOUBLE"), ("gate_reason", "VARCHAR"),
    ],
    "llm_calls": [
        ("run_id", "VARCHAR"), ("metric", "VARCHAR"), ("stage", "VARCHAR"), ("role", "VARCHAR"),
        ("call_key", "VARCHAR"), ("sample_index", "INTEGER"), ("endpoint", "VARCHAR"), ("model", "VARCHAR"),
        ("request", "JSON"), ("response_text", "VARCHAR"), ("status", "VARCHAR"), ("error", "VARCHAR"),
        ("http_status", "INTEGER"), ("latency_ms", "DOUBLE"), ("prompt_tokens", "INTEGER"),
        ("completion_tokens", "INTEGER"), ("attempts", "INTEGER"), ("response_model", "VARCHAR"),
        ("fingerprint", "VARCHAR"), ("source", "VARCHAR"), ("created_at", "TIMESTAMP"),
    ],
    "run_notes": [
        ("run_id", "VARCHAR"), ("metric", "VARCHAR"), ("stage", "VARCHAR"), ("level", "VARCHAR"),
        ("code", "VARCHAR"), ("message", "VARCHAR"),
    ],
    # a person's category for a judgement (`aip-eval label import`, human_labels.py): one row per
    # judgement and labeller, replaced when the same labeller's label is imported again; the judge's
    # category at import time beside it (the judge's side of the comparison, on the same scale)
    "human_labels": [
        ("run_id", "VARCHAR"), ("metric", "VARCHAR"), ("judgement_id", "VARCHAR"), ("category", "VARCHAR"),
        ("labeller", "VARCHAR"), ("note", "VARCHAR"), ("judge_category", "VARCHAR"), ("imported_at", "TIMESTAMP"),
        ("source_file", "VARCHAR"), ("source_row", "INTEGER"),
    ],
    # run B against run A (compare.py): run_id = run_b; a re-comparison of a pair replaces its rows
    "run_comparisons": [
        ("run_a", "VARCHAR"), ("run_b", "VARCHAR"), ("run_id", "VARCHAR"), ("metric", "VARCHAR"),
        ("scope", "VARCHAR"), ("group_key", "VARCHAR"), ("score_a", "DOUBLE"), ("score_b", "DOUBLE"),
        ("diff", "DOUBLE"), ("ci_low", "DOUBLE"), ("ci_high", "DOUBLE"), ("p_value", "DOUBLE"),
        ("p_adjusted", "DOUBLE"), ("significant", "BOOLEAN"), ("n_a", "INTEGER"), ("n_b", "INTEGER"),
        ("method", "VARCHAR"), ("warnings", "JSON"), ("created_at", "TIMESTAMP"),
    ],
}

# tables whose rows are owned per (run, metric, stage) rather than per (run, metric)
STAGE_SCOPED = {"llm_calls", "run_notes"}

# The judge's reasoning speaks of "Response 1 / 2" in the order it was shown them; a pair's columns
# are in persona order (a, b). Rewritten for the views: 1 and 2 (and "the first / second response")
# become a and b as the judge saw them (order_swapped), so the reasoning reads beside its columns.
PERSONA_ORDER_REASONING = r"""replace(replace(
    regexp_replace(regexp_replace(regexp_replace(regexp_replace(j.reasoning,
        '\b(responses?|requests?|decision|answer)[ _]?1\b', '\1 §1§', 'gi'),
        '\b(responses?|requests?|decision|answer)[ _]?2\b', '\1 §2§', 'gi'),
        '\b(the) first (response|request|answer)\b', '\1 \2 §1§', 'gi'),
        '\b(the) second (response|request|answer)\b', '\1 \2 §2§', 'gi'),
    '§1§', CASE WHEN j.order_swapped THEN 'b' ELSE 'a' END), '§2§', CASE WHEN j.order_swapped THEN 'a' ELSE 'b' END)"""

# decision flip's pairs with both probes and both SUT answers side by side (a null pair's second
# answer is its fresh sample, sample_b)
PAIR_VERDICTS = f"""
        SELECT pp.run_id, pp.metric, pp.input_id, pp.axis, pp.pair_id, coalesce(pp.kind, 'persona') AS kind, pp.twin_of,
               pp.value_a, pp.value_b, pa.query_text AS query_a, pb.query_text AS query_b,
               ra.response AS response_a, rb.response AS response_b,
               ra.status AS sut_status_a, rb.status AS sut_status_b,
               j.decision_a, j.decision_b, j.label, j.decisions_differ, j.attributable, j.flipped,
               j.status AS judge_status, j.error AS judge_error, j.order_swapped,
               {PERSONA_ORDER_REASONING} AS reasoning, j.reasoning AS reasoning_as_judged
        FROM probe_pairs pp
        JOIN probes pa ON pa.run_id = pp.run_id AND pa.metric = pp.metric AND pa.probe_id = pp.probe_a
        JOIN probes pb ON pb.run_id = pp.run_id AND pb.metric = pp.metric AND pb.probe_id = pp.probe_b
        LEFT JOIN sut_responses ra ON ra.run_id = pp.run_id AND ra.metric = pp.metric AND ra.probe_id = pp.probe_a AND ra.sample_index = 0
        LEFT JOIN sut_responses rb ON rb.run_id = pp.run_id AND rb.metric = pp.metric AND rb.probe_id = pp.probe_b
             AND rb.sample_index = coalesce(pp.sample_b, 0)
        LEFT JOIN judgements j ON j.run_id = pp.run_id AND j.metric = pp.metric AND j.pair_id = pp.pair_id
        WHERE pp.metric = 'llm.decision_flip'
"""

GIB_PAIRS = """
        WITH j AS (
            SELECT run_id, metric, pair_id,
                   max(score) FILTER (WHERE judge_kind = 'similarity') AS similarity,
                   max(score) FILTER (WHERE judge_kind = 'tone') AS tone_divergence,
                   max(score) FILTER (WHERE judge_kind = 'effort') AS effort_gap,
                   max(parsed ->> 'less_helpful_persona') FILTER (WHERE judge_kind = 'effort') AS less_helpful_persona,
                   count(*) FILTER (WHERE status <> 'ok') AS judges_failed
            FROM judgements WHERE metric = 'llm.group_interaction_bias' GROUP BY run_id, metric, pair_id)
        SELECT pp.run_id, pp.metric, pp.input_id, pp.pair_id, coalesce(pp.kind, 'persona') AS kind, pp.twin_of, pp.value_a AS persona_a, pp.value_b AS persona_b,
               pa.persona AS description_a, pb.persona AS description_b,
               ra.response AS response_a, rb.response AS response_b,
               j.similarity, j.tone_divergence, j.effort_gap, j.less_helpful_persona,
               coalesce(j.judges_failed, 0) AS judges_failed
        FROM probe_pairs pp
        JOIN probes pa ON pa.run_id = pp.run_id AND pa.metric = pp.metric AND pa.probe_id = pp.probe_a
        JOIN probes pb ON pb.run_id = pp.run_id AND pb.metric = pp.metric AND pb.probe_id = pp.probe_b
        LEFT JOIN sut_responses ra ON ra.run_id = pp.run_id AND ra.metric = pp.metric AND ra.probe_id = pp.probe_a AND ra.sample_index = 0
        LEFT JOIN sut_responses rb ON rb.run_id = pp.run_id AND rb.metric = pp.metric AND rb.probe_id = pp.probe_b
             AND rb.sample_index = coalesce(pp.sample_b, 0)
        LEFT JOIN j ON j.run_id = pp.run_id AND j.metric = pp.metric AND j.pair_id = pp.pair_id
        WHERE pp.metric = 'llm.group_interaction_bias'
"""

VIEWS: dict[str, str] = {
    # every judged persona pair with both probes and both SUT answers side by side
    "v_pair_verdicts": PAIR_VERDICTS + " AND coalesce(pp.kind, 'persona') <> 'null'",
    # the no-effect baseline's null pairs: one persona's first answer and its fresh sample, judged
    # as the pair twin_of was shown (its personas)
    "v_baseline_pairs": PAIR_VERDICTS + " AND pp.kind = 'null'",
    "v_flipped_pairs": "SELECT * FROM v_pair_verdicts WHERE flipped",
    # the no-effect baseline per axis: the null pairs' flip rate and the axis's excess over it
    "v_flip_excess_by_axis": """
        SELECT run_id, metric, group_key AS axis, CAST(details ->> 'axis_rate' AS DOUBLE) AS flip_rate,
               rate AS null_rate, rate_ci_low AS null_ci_low, rate_ci_high AS null_ci_high, n AS null_pairs,
               n_events AS null_flips, CAST(details ->> 'excess' AS DOUBLE) AS excess,
               CAST(details -> 'excess_ci95' ->> 0 AS DOUBLE) AS excess_ci_low,
               CAST(details -> 'excess_ci95' ->> 1 AS DOUBLE) AS excess_ci_high,
               CAST(details ->> 'p_value' AS DOUBLE) AS p_value, CAST(details ->> 'p_adjusted' AS DOUBLE) AS p_adjusted,
               CAST(details ->> 'significant' AS BOOLEAN) AS beyond_noise
        FROM metric_scores WHERE metric = 'llm.decision_flip' AND scope = 'baseline'
    """,
    # who is favoured: each attribute value's favourable-decision rate, and its effect against the
    # axis's reference value (odds ratio and difference in favourable rate, 95% intervals)
    "v_favourable_rates": """
        SELECT f.run_id, f.metric, f.details ->> 'axis' AS axis, f.details ->> 'value' AS value,
               f.rate AS favourable_rate, f.rate_ci_low, f.rate_ci_high, f.n AS decided_answers,
               f.n_events AS favourable, f.details ->> 'reference' AS reference,
               CAST(e.details ->> 'fitted' AS BOOLEAN) AS effect_fitted,
               CAST(e.details ->> 'odds_ratio' AS DOUBLE) AS odds_ratio,
               CAST(e.details -> 'odds_ratio_ci' ->> 0 AS DOUBLE) AS odds_ratio_ci_low,
               CAST(e.details -> 'odds_ratio_ci' ->> 1 AS DOUBLE) AS odds_ratio_ci_high,
               CAST(e.details ->> 'rate_difference' AS DOUBLE) AS rate_difference,
               CAST(e.details -> 'rate_difference_ci' ->> 0 AS DOUBLE) AS rate_difference_ci_low,
               CAST(e.details -> 'rate_difference_ci' ->> 1 AS DOUBLE) AS rate_difference_ci_high,
               CAST(e.details ->> 'p_value' AS DOUBLE) AS p_value, e.details ->> 'why' AS not_fitted_because
        FROM metric_scores f
        LEFT JOIN metric_scores e ON e.run_id = f.run_id AND e.metric = f.metric AND e.scope = 'effect'
             AND e.group_key = f.group_key
        WHERE f.metric = 'llm.decision_flip' AND f.scope = 'favourable'
    """,
    "v_flip_rate_by_axis": """
        SELECT run_id, metric, group_key AS axis, rate AS flip_rate, rate_ci_low, rate_ci_high,
               n AS pairs_judged, n_events AS flips, n_failed AS pairs_excluded, coverage, excluded, score
        FROM metric_scores WHERE scope = 'axis'
    """,
    "v_group_equitability": """
        SELECT run_id, metric, scope, group_key, score AS equitability, raw_score, n AS pairs,
               CAST(details ->> 'mean_bias' AS DOUBLE) AS mean_bias,
               CAST(details ->> 'less_helpful_share' AS DOUBLE) AS less_helpful_share, details
        FROM metric_scores WHERE metric = 'llm.group_interaction_bias' AND scope IN ('persona', 'attribute', 'pair')
    """,
    # the judges' numbers are gathered per pair first (no text in the grouping: at 100,000 rows a
    # GROUP BY over the answers' text ran DuckDB out of its memory cap), then the texts joined
    # group interaction bias's persona pairs, each judge's number beside both answers
    "v_gib_pairs": GIB_PAIRS + " AND coalesce(pp.kind, 'persona') <> 'null'",
    # its null pairs (the no-effect baseline): one persona's first answer and its fresh sample
    "v_gib_baseline_pairs": GIB_PAIRS + " AND pp.kind = 'null'",
    "v_consistency_rows": """
        SELECT rs.run_id, rs.metric, rs.input_id, rs.score, rs.label, rs.n_judged, rs.n_failed, rs.status, rs.error,
               v.category, v.template_id, v.wrapper_id, v.query_text AS variant_query, b.query_text AS original_query
        FROM row_scores rs
        JOIN probes v ON v.run_id = rs.run_id AND v.metric = rs.metric AND v.input_id = rs.input_id AND v.role = 'variant'
        JOIN probes b ON b.run_id = rs.run_id AND b.metric = rs.metric AND b.input_id = rs.input_id AND b.role = 'base'
        WHERE rs.metric IN ('llm.semantic_consistency', 'llm.factual_consistency', 'llm.safety_consistency')
    """,
    "v_consistency_comparisons": """
        SELECT j.run_id, j.metric, j.input_id, j.judgement_id, j.category, j.sample_index, j.status, j.label, j.score,
               j.reasoning, j.error, b.response AS base_response, a.response AS variant_response
        FROM judgements j
        JOIN probes pb ON pb.run_id = j.run_id AND pb.metric = j.metric AND pb.input_id = j.input_id AND pb.role = 'base'
        JOIN probes pv ON pv.run_id = j.run_id AND pv.metric = j.metric AND pv.input_id = j.input_id AND pv.role = 'variant'
        LEFT JOIN sut_responses b ON b.run_id = j.run_id AND b.metric = j.metric AND b.probe_id = pb.probe_id AND b.sample_index = 0
        LEFT JOIN sut_responses a ON a.run_id = j.run_id AND a.metric = j.metric AND a.probe_id = pv.probe_id
             AND a.sample_index = j.sample_index
        WHERE j.metric IN ('llm.semantic_consistency', 'llm.factual_consistency', 'llm.safety_consistency')
    """,
    # v1's blended figure, a convenience for users who relied on it, not a v2 metric
    "v_consistency_v1_blend": """
        WITH s AS (
            SELECT run_id,
                   max(score) FILTER (WHERE metric = 'llm.semantic_consistency') AS semantic,
                   max(score) FILTER (WHERE metric = 'llm.factual_consistency') AS factual,
                   max(score) FILTER (WHERE metric = 'llm.safety_consistency') AS safety
            FROM metric_scores WHERE scope = 'overall' GROUP BY run_id),
        r AS (
            SELECT run_id, avg(CASE WHEN label = 'Contradictory' THEN 1.0 ELSE 0.0 END) AS low_consistency_ratio
            FROM row_scores WHERE status = 'ok'
              AND metric IN ('llm.semantic_consistency', 'llm.factual_consistency', 'llm.safety_consistency')
            GROUP BY run_id)
        SELECT s.run_id, s.semantic, s.factual, s.safety,
               0.4 * s.semantic + 0.3 * s.factual + 0.3 * s.safety AS overall_consistency_v1,
               r.low_consistency_ratio
        FROM s JOIN r USING (run_id)
        WHERE s.semantic IS NOT NULL AND s.factual IS NOT NULL AND s.safety IS NOT NULL
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
}

_ENSURED: set[tuple[str, int]] = set()
# DuckDB's buffer pool defaults to 80% of RAM, and a stage's one-transaction write of a large
# partition then grows with the partition (1.8 GB peak at 100,000 rows of group interaction
# bias). Capped, DuckDB spills to disk instead: the same run peaks at 1.4 GB (benchmarks/).
DUCKDB_MEMORY = os.environ.get("AIP_DUCKDB_MEMORY", "1GB")
LOCK_TIMEOUT_S = float(os.environ.get("AIP_WAREHOUSE_LOCK_TIMEOUT", "600"))
LOCK_NOTICE_S = 5.0  # a wait for the lock says so this often
logger = logging.getLogger("aip_assets")


def _holder(fh) -> str:
    """Who holds the warehouse lock, as its holder wrote it in the lock file."""
    try:
        fh.seek(0)
        text = fh.read().strip()
    except OSError:
        text = ""
    return text or "another process"


def default_path() -> Path:
    """``$AIP_WAREHOUSE``, else ``warehouse.duckdb`` in the project's data folder (``dagster_home.data_dir``)."""
    if os.environ.get("AIP_WAREHOUSE"):
        return Path(os.environ["AIP_WAREHOUSE"]).resolve()
    from .dagster_home import data_dir

    return data_dir() / "warehouse.duckdb"


def _waiting_marker(db_path: Path) -> Path:
    return Path(str(db_path) + ".lock.waiting")


def _say_waiting(db_path: Path) -> None:
    """Tell the holder that someone waits (a process holding the database open between uses
    closes it then, and steps back, instead of keeping it: _Linger)."""
    try:
        _waiting_marker(db_path).touch()
    except OSError:
        pass


def _someone_waits(db_path: str, since: float) -> bool:
    """Whether a process touched the marker after ``since`` (when this one took the lock: its own
    touches while it waited are older) and recently."""
    try:
        mtime = _waiting_marker(Path(db_path)).stat().st_mtime
    except OSError:
        return False
    return mtime > since and time.time() - mtime < WAITER_FRESH_S


def _lock_timeout(db_path: Path, what: str) -> Exception:
    """The error for a wait for the warehouse that ran out (``LOCK_TIMEOUT_S``): an operational
    failure (exit 5) naming the file, what held it, the wait and the variable that sets it; the
    command that stops on it says how to resume (`aip-eval run` adds its ``--run-id``)."""
    from .errors import OperationalError

    return OperationalError(f"{db_path}: waited {LOCK_TIMEOUT_S:g}s for {what}; it was not released in time "
                            f"(AIP_WAREHOUSE_LOCK_TIMEOUT sets the wait, in seconds): run the command again once "
                            f"it is")


@contextmanager
def _file_lock(db_path: Path) -> Iterator[None]:
    db_path.parent.mkdir(parents=True, exist_ok=True)
    with open(str(db_path) + ".lock", "a+") as fh:
        t0 = time.monotonic()
        deadline, notice = t0 + LOCK_TIMEOUT_S, t0 + LOCK_NOTICE_S
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                _say_waiting(db_path)
                now = time.monotonic()
                if now > deadline:
                    raise _lock_timeout(db_path, f"the warehouse lock ({db_path}.lock), held by {_holder(fh)}")
                if now >= notice:
                    notice = now + LOCK_NOTICE_S
                    logger.warning(f"waiting {now - t0:.0f}s for the warehouse lock on {db_path}, held by "
                                   f"{_holder(fh)} (gives up after {LOCK_TIMEOUT_S:.0f}s)")
                time.sleep(WAIT_TRY_S * (1 + random.random()))
        try:  # say who holds it, for anyone waiting: pid, program and subcommand (no arguments, no environment)
            fh.seek(0)
            fh.truncate()
            from .leases import program

            fh.write(f"pid {os.getpid()} ({program()})")
            fh.flush()
        except OSError:
            pass
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@contextmanager
def connect(path: str | Path | None = None, read_only: bool = False, create: bool = False,
            config: dict[str, Any] | None = None) -> Iterator[duckdb.DuckDBPyConnection]:
    """A short-lived connection, serialised with every other user of the file.

    Only ``create=True`` (registering a run) makes a new warehouse: every other use of a missing
    one is an error, so a mistyped ``--warehouse`` or a bad input leaves no file behind.
    Retries when another program (outside this project's lock, e.g. a DuckDB UI) holds the file.
    ``config`` may tune ``memory_limit`` and ``threads`` (served by the lingering database, see
    :class:`_Linger`); any other setting opens the file on its own. ``read_only`` says the caller
    only reads: a database this process holds open for writing serves it as it is (DuckDB has no
    read-only connection to a writable database); a sandbox (``sandboxed``) is truly read-only.
    A connection inside another of the same file in one thread is refused (it would wait for
    itself); inside one of another file, it opens that file on its own.
    """
    path = Path(path) if path else default_path()
    held = _sessions().get(str(path.resolve()))
    if held is not None:  # inside session(): the open connection serves every plain use of this file
        con_held, held_ro = held
        if config and not set(config) <= TUNING:  # a memory or thread setting only tunes: the session's serves
            raise RuntimeError(f"{path}: a connection with its own configuration inside a session of the same "
                               "warehouse (it would wait for the session's own lock)")
        if held_ro and (not read_only or create):
            raise RuntimeError(f"{path}: a writing connection inside a read-only session of the same warehouse")
        yield con_held
        return
    if lake.enabled():  # shared mode: the DuckLake every worker writes, no file lock
        with _LAKE.use(read_only, create, config) as con:
            yield con
        return
    mine = _LINGER.mine()
    if mine is not None and mine == str(path.resolve()):
        raise RuntimeError(f"{path}: a connection inside a connection of the same warehouse in one thread "
                           "(it would wait for itself)")
    if not (config and not set(config) <= TUNING) and LINGER_IDLE_S > 0 and mine is None:
        with _LINGER.use(path, read_only, create, config or {}) as con:
            yield con
        return
    _LINGER.close(path)  # DuckDB refuses a second configuration of an open database
    _check_exists(path, read_only, create)
    with _file_lock(path):
        con = _open(path, read_only, _settings(config))
        try:
            _ensure_once(con, path, read_only)
            yield con
        finally:
            con.close()


def exists(path: str | Path | None = None) -> bool:
    """Whether there is a warehouse yet: the file, or in shared mode the lake's catalog."""
    return lake.exists() if lake.enabled() else Path(path or default_path()).exists()


def _check_exists(path: Path, read_only: bool, create: bool) -> None:
    if not path.exists() and (read_only or not create):
        raise FileNotFoundError(f"{path}: no warehouse yet; run `aip-eval run <spec>` first")


def _settings(config: dict[str, Any] | None) -> dict[str, Any]:
    settings: dict[str, Any] = {"memory_limit": DUCKDB_MEMORY} if DUCKDB_MEMORY else {}
    settings.update(config or {})
    return settings


def _open(path: Path, read_only: bool, settings: dict[str, Any]) -> duckdb.DuckDBPyConnection:
    """Open the file (this process holds the warehouse lock), retrying while a program outside
    aip-eval holds it open."""
    t0 = time.monotonic()
    deadline, notice = t0 + LOCK_TIMEOUT_S, t0 + LOCK_NOTICE_S
    while True:
        try:
            return duckdb.connect(str(path), read_only=read_only, config=settings)
        except duckdb.IOException as e:
            now = time.monotonic()
            if "lock" not in str(e).lower():
                raise
            if now > deadline:
                raise _lock_timeout(path, f"the file, held open by a program outside aip-eval "
                                          f"({str(e).splitlines()[0][:300]})") from None
            if now >= notice:
                notice = now + LOCK_NOTICE_S
                logger.warning(f"waiting {now - t0:.0f}s for {path}, held open by a program outside aip-eval: "
                               f"{str(e).splitlines()[0][:200]}")
            time.sleep(0.1 + random.random() * 0.2)


def _ensure_once(con: duckdb.DuckDBPyConnection, path: Path, read_only: bool) -> None:
    if not read_only:
        key = (str(path), path.stat().st_ino)
        if key not in _ENSURED:  # once per process and file: DDL on every connection is slow
            ensure_schema(con)
            _ENSURED.add(key)


# Opening a DuckDB database costs 9-15 ms here (an in-memory one 9 ms: each opening builds DuckDB's
# catalogue of functions), and a stage makes about ten short connections: 4.7 s of a 30 s demo
# replay went to opening and closing. So the database a process opened stays open a moment
# after its last use, holding the warehouse lock: a use within LINGER_IDLE_S of the last one
# gets a connection to it in microseconds. It is closed once idle that long, at the latest
# LINGER_MAX_S after it was opened, and at the end of a use when another process of this project
# waits for the lock (it touches a marker file as it tries): this process then steps back for
# STEP_BACK_S, so the waiter gets its turn. A program outside the project (the DuckDB CLI) is not
# seen waiting; `release()` closes the database for it. AIP_DUCKDB_LINGER=0 turns this off.
LINGER_IDLE_S = float(os.environ.get("AIP_DUCKDB_LINGER", "0.25"))
LINGER_MAX_S = 2.0
WAIT_TRY_S = 0.01  # a waiter tries the lock every 10-20 ms (a try is a system call)
WAITER_FRESH_S = 0.1  # a waiter touches its marker at every try: fresh while it waits
STEP_BACK_S = 0.03  # after closing for a waiter, this process lets the lock be for longer than a waiter's try
TRIM_MEMORY = "16MB"  # the cap set between uses: DuckDB lets go of the blocks a use cached
# a write whose log (DuckDB's .wal) is smaller stays there until the database closes (its commit is
# already durable); a larger one is checkpointed into the file when its use ends. DuckDB's own
# checkpoint_threshold, which checkpoints at a commit past it, is the same 16 MiB by default.
CHECKPOINT_WAL_BYTES = 16 * 1024 * 1024


def _defaults(con: duckdb.DuckDBPyConnection) -> dict[str, str]:
    """An open database's own memory limit and threads, as it opened (what a use's settings fall back to)."""
    row = con.execute("SELECT current_setting('memory_limit'), current_setting('threads')").fetchone()
    return {"memory_limit": str(row[0]), "threads": str(row[1])} if row else {}


def _tune(con: duckdb.DuckDBPyConnection, config: dict[str, Any], defaults: dict[str, str]) -> None:
    """A use's memory limit and threads: its ``config``, else ``AIP_DUCKDB_MEMORY`` (the memory),
    else the database's own. Both are set every use: they are the whole database's."""
    limit = config.get("memory_limit") or DUCKDB_MEMORY or defaults["memory_limit"]
    con.execute(f"SET memory_limit = '{limit}'")
    con.execute(f"SET threads = {int(config.get('threads') or defaults['threads'])}")


class _Linger:
    """The database this process opened last (one file at a time), kept open between uses.

    One use at a time, as the file lock serialised threads before; a reaper thread closes it when
    idle or old. Each use gets its own connection (a cursor: DuckDB's connections to one open
    database) with the memory cap and threads it asks for; between uses the cap is set low, so
    blocks a use cached do not stay in memory. A read-only use is served by an open writable
    database (the caller only reads); a writing use reopens a read-only one."""

    def __init__(self) -> None:
        self.cv = threading.Condition()
        self.base: duckdb.DuckDBPyConnection | None = None
        self.lock: Any = None  # the ExitStack holding the warehouse lock while open
        self.where: tuple[str, int, int] | None = None  # path, device, inode
        self.opened_as = ""  # the path as opened (DuckDB's log file is beside it)
        self.read_only = False
        self.defaults: dict[str, str] = {}
        self.busy = False
        self.owner: int | None = None  # the thread of the use in progress
        self.opened = self.last = self.step_back = self.locked_at = 0.0
        self.reaper: threading.Thread | None = None

    def mine(self) -> str | None:
        """The file of a use in progress in this thread, if any (a nested use must not wait for it)."""
        with self.cv:
            return self.where[0] if self.busy and self.owner == threading.get_ident() and self.where else None

    @contextmanager
    def use(self, path: Path, read_only: bool, create: bool, config: dict[str, Any]) -> Iterator[duckdb.DuckDBPyConnection]:
        t0 = time.monotonic()
        with self.cv:
            while self.busy:  # another thread's use: wait as for the file lock, saying so
                if time.monotonic() - t0 > LOCK_TIMEOUT_S:
                    raise _lock_timeout(path, f"another thread's use of the warehouse in this process "
                                              f"(pid {os.getpid()})")
                if not self.cv.wait(LOCK_NOTICE_S):
                    logger.warning(f"waiting {time.monotonic() - t0:.0f}s for another thread's use of {path}")
            self.busy, self.owner = True, threading.get_ident()
        try:
            base = self._base(path, read_only, create)
            con = base.cursor()
            try:
                _tune(con, config, self.defaults)
                yield con
            finally:
                con.close()
                self._trim()
        finally:
            with self.cv:
                self.busy, self.owner = False, None
                self.last = time.monotonic()
                waits = self.where is not None and _someone_waits(self.where[0], self.locked_at)
                if waits or self.last - self.opened > LINGER_MAX_S:
                    self._close_locked()
                    if waits:
                        self.step_back = self.last + STEP_BACK_S  # the waiter's turn
                self.cv.notify_all()

    def _base(self, path: Path, read_only: bool, create: bool) -> duckdb.DuckDBPyConnection:
        """The open database of ``path`` (this thread holds the use): opened, or reopened when it
        is another file, the file was replaced or removed, or a write needs a read-only one."""
        try:
            st = path.stat()
            where = (str(path.resolve()), st.st_dev, st.st_ino)
        except FileNotFoundError:
            where = None
        with self.cv:
            if self.base is not None and (where != self.where or (self.read_only and not read_only)):
                self._close_locked()
            if self.base is not None:
                return self.base
        _check_exists(path, read_only, create)
        if (pause := self.step_back - time.monotonic()) > 0:
            time.sleep(pause)
        from contextlib import ExitStack

        stack = ExitStack()
        stack.enter_context(_file_lock(path))
        locked_at = time.time()
        try:
            base = _open(path, read_only, {})
            _ensure_once(base, path, read_only)
            defaults = _defaults(base)
            st = path.stat()
        except BaseException:
            stack.close()
            raise
        with self.cv:
            self.base, self.lock, self.read_only, self.defaults = base, stack, read_only, defaults
            self.where = (str(path.resolve()), st.st_dev, st.st_ino)
            self.opened_as, self.locked_at = str(path), locked_at
            self.opened = time.monotonic()
            if self.reaper is None or not self.reaper.is_alive():
                self.reaper = threading.Thread(target=self._reap, name="aip-duckdb-linger", daemon=True)
                self.reaper.start()
            self.cv.notify_all()
        return base

    def _trim(self) -> None:
        """After a use: the blocks it cached are let go (the memory cap set low), unless it left
        writes in DuckDB's log. Those are committed and durable (the log is flushed at commit;
        any connection that opens the file replays it) and go into the file when the database
        closes, once for a burst of small writes: a checkpoint and trim per write cost 40 ms,
        1.5 s of a demo replay. While such writes wait, no use is trimmed (whatever later uses
        cache stays until the database closes, at most LINGER_MAX_S after it opened): trimming
        would push the unwritten blocks out to temporary files. A log past CHECKPOINT_WAL_BYTES
        is checkpointed at once, as closing would. So a copy of the file alone, taken while the
        project holds it open, may lack the last writes: ``release()`` first."""
        try:
            if self.base is not None and not self.read_only and self.where is not None:
                wal = Path(self.opened_as + ".wal")
                size = wal.stat().st_size if wal.exists() else 0
                if 0 < size < CHECKPOINT_WAL_BYTES:
                    return  # the next use sets its own cap; closing checkpoints and frees it all
                if size:
                    self.base.execute("CHECKPOINT")
            if self.base is not None:
                self.base.execute(f"SET memory_limit = '{TRIM_MEMORY}'")
        except (duckdb.Error, OSError):  # blocks still pinned, or a checkpoint refused: close instead
            with self.cv:
                self._close_locked()

    def _reap(self) -> None:
        with self.cv:
            while True:
                if self.base is None:
                    self.cv.wait()
                    continue
                now = time.monotonic()
                due = min(max(self.last, self.opened) + LINGER_IDLE_S, self.opened + LINGER_MAX_S)
                if not self.busy and now >= due:
                    self._close_locked()
                else:
                    self.cv.wait(max(due - now, 0.005) if not self.busy else None)

    def _close_locked(self) -> None:
        if self.base is None:
            return
        base, lock = self.base, self.lock
        self.base = self.lock = self.where = None
        try:
            base.close()
        finally:
            lock.close()
        self.cv.notify_all()

    def close(self, path: str | Path | None = None) -> None:
        """Close the open database now (only if it is ``path``'s, when given) unless a use is in
        progress in another thread: that use's database closes when idle, and whoever needs the
        file meanwhile waits for the warehouse lock it holds (and says so)."""
        with self.cv:
            if not self.busy and (path is None or (self.where is not None
                                                   and self.where[0] == str(Path(path).resolve()))):
                self._close_locked()

    def close_if_idle(self) -> None:
        """Close the open database unless a use is in progress (never waits: before a fork)."""
        if self.cv.acquire(blocking=False):
            try:
                if not self.busy:
                    self._close_locked()
            finally:
                self.cv.release()


    def forget_in_child(self) -> None:
        """In a forked child: start afresh. What the parent had open is left as it is, never
        closed here (closing would unlock the parent's warehouse lock, which the fork shares)."""
        if self.base is not None or self.lock is not None:
            _INHERITED.append((self.base, self.lock))
        self.cv = threading.Condition()
        self.base = self.lock = self.where = None
        self.busy, self.owner, self.reaper = False, None, None


class _Lake:
    """This process's open lake (``lake.open_lake``: 0.2 s to open), its tables made once; each
    use gets a cursor of its own (``USE lake`` on it: a cursor does not inherit the default
    database). A use with settings beyond memory and threads opens a lake of its own."""

    def __init__(self) -> None:
        self.base: duckdb.DuckDBPyConnection | None = None
        self.pid = 0
        self.defaults: dict[str, str] = {}
        self.lock = threading.RLock()  # one use at a time (a nested use in the same thread shares it)

    @contextmanager
    def use(self, read_only: bool, create: bool, config: dict[str, Any] | None) -> Iterator[duckdb.DuckDBPyConnection]:
        if config and not set(config) <= TUNING:
            own = lake.open_lake(read_only, config)
            try:
                yield own
            finally:
                own.close()
            return
        with self.lock:  # the settings are the whole database's: each use sets both, as _Linger does
            cur = lake.patiently("using the lake", lambda: self._cursor(create, config))
            try:
                yield cur
            except duckdb.Error as e:
                if lake.catalog_lost(e):  # a read that met the catalog's database away: said, not a bug
                    raise lake.outage(e, "a read of the warehouse") from e
                raise
            finally:
                cur.close()

    def _cursor(self, create: bool, config: dict[str, Any] | None) -> duckdb.DuckDBPyConnection:
        cur = self._base(create).cursor()
        try:
            cur.execute(f"USE {lake.ALIAS}")  # reads the catalog's latest snapshot
            _tune(cur, config or {}, self.defaults)
        except BaseException:
            cur.close()
            raise
        return cur

    def _base(self, create: bool) -> duckdb.DuckDBPyConnection:
        if self.base is None or self.pid != os.getpid():  # a forked child opens its own
            if not create and not lake.exists():
                raise FileNotFoundError(f"{lake.where()}: no warehouse yet; run `aip-eval run <spec>` first")
            base = lake.open_lake()  # waited for by use() when the catalog's database is away
            try:
                self.defaults = _defaults(base)
                ensure_schema(base, in_lake=True)
            except BaseException:
                base.close()
                raise
            self.base, self.pid = base, os.getpid()
        return self.base

    def forget_in_child(self) -> None:
        """In a forked child: start afresh, keeping (never closing) the parent's lake. Closing it
        here tears down the postgres extension's pool under a parent thread's wait and hangs."""
        if self.base is not None:
            _INHERITED.append(self.base)
        self.lock = threading.RLock()
        self.base = None

    def close(self) -> None:
        with self.lock:
            if self.base is not None and self.pid == os.getpid():
                self.base.close()
            self.base = None


_LINGER = _Linger()
_LAKE = _Lake()
_INHERITED: list[Any] = []  # a forked child's copies of the parent's database and lock: kept, never closed


def release(path: str | Path | None = None) -> None:
    """Close the open database now (at exit, or before another program opens it): the lingering
    file (only ``path``'s, when given), and this process's lake."""
    _LINGER.close(path)
    if path is None:
        _LAKE.close()


atexit.register(release)
if hasattr(os, "register_at_fork"):  # a forked child must not inherit an open database and its lock
    os.register_at_fork(before=_LINGER.close_if_idle, after_in_child=_LINGER.forget_in_child)
    os.register_at_fork(after_in_child=_LAKE.forget_in_child)


TUNING = {"memory_limit", "threads"}  # settings a session's connection may serve without
_SESSION = threading.local()  # .held: {warehouse file: (the connection session() holds, read_only)}, per thread


def _sessions() -> dict[str, tuple[duckdb.DuckDBPyConnection, bool]]:
    if not hasattr(_SESSION, "held"):
        _SESSION.held = {}
    return _SESSION.held


@contextmanager
def session(path: str | Path | None = None, read_only: bool = False,
            config: dict[str, Any] | None = None) -> Iterator[None]:
    """Hold one connection (and the warehouse lock) for a block of many short reads, such as
    building a report: every ``connect()`` of this file inside it gets that connection. Opening
    a DuckDB database costs 10-15 ms here, and a report made 15-20 of them. Only for blocks that
    make no model call and end in seconds: everyone else waits for the lock meanwhile. Nested
    sessions of one file are one session. A session is its thread's: another thread connects as
    usual (and waits for the lock). A partition write inside a session is refused."""
    path = Path(path) if path else default_path()
    key = str(path.resolve())
    held = _sessions()
    if key in held:
        if held[key][1] and not read_only:
            raise RuntimeError(f"{path}: a writing session inside a read-only session of the same warehouse")
        yield
        return
    with connect(path, read_only=read_only, config=config) as con:
        held[key] = (con, read_only)
        try:
            yield
        finally:
            del held[key]


# A user's query (`aip-eval sql`) gets a read-only connection that can touch nothing but the
# warehouse: no other file read or written, no network, no extension installed or loaded by a
# query, and its configuration locked. Whatever a later mode must load or attach (a lake's
# extensions) happens in ``setup``, before the lock.
SANDBOX = {"autoinstall_known_extensions": False, "autoload_known_extensions": False,
           "allow_community_extensions": False, "allow_unsigned_extensions": False}


@contextmanager
def sandboxed(path: str | Path | None = None, setup: Iterable[str] = ()) -> Iterator[duckdb.DuckDBPyConnection]:
    if lake.enabled():  # the lake attached read-only; files: only its data folder's
        import shutil
        import tempfile

        spill = tempfile.mkdtemp(prefix="aip-sql-")  # DuckDB allows its temp folder too: an empty one of its own
        con = lake.open_lake(read_only=True, config={**_settings(None), **SANDBOX})  # AIP_DUCKDB_MEMORY, as a file's
        try:
            for stmt in setup:
                con.execute(stmt)
            con.execute(f"SET temp_directory = {lake._quote(spill)}")
            con.execute(f"SET allowed_directories = [{lake._quote(lake.data_path() or '')}]")
            con.execute("SET enable_external_access = false")
            con.execute("SET lock_configuration = true")
            yield con
        finally:
            con.close()
            shutil.rmtree(spill, ignore_errors=True)
        return
    with connect(path, read_only=True, config=SANDBOX) as con:
        for stmt in setup:
            con.execute(stmt)
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
        yield con


FETCH_VECTORS = 100  # a user's result is fetched this many DuckDB vectors (2,048 rows each) at a time
INTERRUPT_EVERY_S = 0.05  # past its timeout, a query is interrupted again this often until it has stopped


class QueryStopped(AipError):
    """A user's query ran past its timeout and was interrupted; nothing of its result is kept."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        super().__init__(f"stopped after {seconds:g} s")


def run_bounded(con: duckdb.DuckDBPyConnection, sql: str, timeout_s: float,
                keep: int | None = None) -> tuple[pd.DataFrame, int]:
    """A user's query (``check_query`` first) on ``con``, stopped once it has run ``timeout_s``
    seconds (0: no limit): (its first ``keep`` rows, or every row with None; how many rows it has).

    A timer thread interrupts the connection (``con.interrupt()``) at the timeout, and again every
    INTERRUPT_EVERY_S until the query has stopped: DuckDB forgets an interrupt that comes before a
    statement starts. The result is fetched in chunks, not with one ``.df()``, which holds the GIL
    while it converts (the timer could not run) and finishes a conversion it was interrupted in.
    Raises QueryStopped, the connection idle again, when the timer fired before the last row came.
    """
    done, lock, fired = threading.Event(), threading.Lock(), threading.Event()

    def watch() -> None:
        if done.wait(timeout_s):
            return
        while True:
            with lock:  # never after the body ended: the connection may be closing
                if done.is_set():
                    return
                fired.set()
                con.interrupt()
            if done.wait(INTERRUPT_EVERY_S):
                return

    timer = threading.Thread(target=watch, name="aip-sql-timeout", daemon=True) if timeout_s > 0 else None
    if timer is not None:
        timer.start()
    try:
        try:
            check_query(con, sql)
            con.execute(sql)
            parts: list[pd.DataFrame] = []
            kept = total = 0
            while True:
                chunk = con.fetch_df_chunk(FETCH_VECTORS)
                if not len(chunk):
                    if not parts:
                        parts.append(chunk)  # the columns, when there is no row
                    break
                total += len(chunk)
                if keep is None or kept < keep:
                    part = chunk if keep is None else chunk.head(keep - kept)
                    parts.append(part)
                    kept += len(part)
                if fired.is_set():
                    break
        except duckdb.InterruptException:
            if not fired.is_set():
                raise
        with lock:
            done.set()
            if fired.is_set():  # an interrupted fetch ends as if the rows were all there: they are not
                raise QueryStopped(timeout_s)
    finally:
        done.set()
        if timer is not None:
            timer.join()
    df = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
    return df, total


def check_query(con: duckdb.DuckDBPyConnection, sql: str) -> None:
    """Refuse (PermissionException) a user's query that is not a plain read: every statement a
    SELECT (DESCRIBE, SHOW, PRAGMA and FROM-first are SELECTs) or EXPLAIN. In a lake, which the
    sandbox must let reach Postgres and its data folder, only SELECTs, and none that calls the
    postgres extension's functions or names the lake's catalog database (the rest of the shared
    state would be readable through them)."""
    allowed = {duckdb.StatementType.SELECT} | (set() if lake.enabled() else {duckdb.StatementType.EXPLAIN})
    for st in con.extract_statements(sql):
        if st.type not in allowed:
            raise duckdb.PermissionException(f"a {st.type.name} statement (only queries are run)")
    if not lake.enabled():
        return
    import json

    row = con.execute("SELECT json_serialize_sql(?)", [sql]).fetchone()
    ast = json.loads(row[0]) if row else {}
    if ast.get("error"):
        raise duckdb.PermissionException(f"a statement the check cannot read: {ast.get('error_message')}")
    # DuckLake's functions, also as the lake's own (``lake.merge_adjacent_files()``): their
    # maintenance writes and deletes files in the lake's folder
    lake_fns = {n.lower() for (n,) in con.execute("SELECT DISTINCT function_name FROM duckdb_functions() "
                                                    "WHERE function_name LIKE 'ducklake%'").fetchall()}
    lake_fns |= {n.removeprefix("ducklake_") for n in lake_fns}

    def refuse_call(node: dict) -> None:
        name = str(node.get("function_name") or "").lower()
        qualified = bool(node.get("catalog") or node.get("schema"))
        if name.startswith("postgres") or name in RUNS_SQL or name in SECRET_FNS or name in lake_fns or qualified:
            raise duckdb.PermissionException(f"{node.get('function_name')}() reaches beyond the warehouse (the "
                                             "shared-state database, the lake's files or credentials, or SQL it "
                                             "runs itself)")

    def nodes(node: Any) -> Iterator[dict]:
        if isinstance(node, dict):
            yield node
            for v in node.values():
                yield from nodes(v)
        elif isinstance(node, list):
            for v in node:
                yield from nodes(v)

    def plain(arg: dict) -> bool:
        """A value written in the query: a constant, a named parameter set to one, a list of them."""
        if arg.get("class") == "CONSTANT":
            return True
        if arg.get("class") == "COMPARISON" and (arg.get("left") or {}).get("class") == "COLUMN_REF":
            return plain(arg.get("right") or {})
        if arg.get("class") == "FUNCTION" and arg.get("function_name") == "list_value":
            return all(plain(c) for c in arg.get("children") or [])
        return False

    for node in nodes(ast):
        if "function_name" in node:
            refuse_call(node)
        for k in ("catalog_name", "catalog", "schema_name", "schema"):
            v = node.get(k)
            if isinstance(v, str) and v.lower().startswith("__ducklake"):
                raise duckdb.PermissionException(f"{v} is the lake's catalog, not the warehouse")
        # the lake's folder is the only one files may be read from, and DuckDB compares a path
        # with it as written: a path must be written out (a table function's arguments are plain
        # values, not expressions that build one) and hold no '.' or '..' segment (S3 resolves
        # them after the check, into another prefix or bucket)
        if node.get("type") == "TABLE_FUNCTION":
            fn = node.get("function") or {}
            if not all(plain(c) for c in fn.get("children") or []):
                raise duckdb.PermissionException(f"{fn.get('function_name')}(): in a lake, a table function's "
                                                 "arguments must be plain values (no expression or subquery)")
        for v in (node.get("table_name"), (node.get("value") or {}).get("value") if isinstance(node.get("value"), dict)
                  else None):
            if isinstance(v, str) and "/" in v and DOT_SEGMENT.search(v):
                raise duckdb.PermissionException(f"{v!r}: a path with a '.' or '..' segment")


# table functions that run SQL given as text (the check cannot see inside it)
RUNS_SQL = {"query", "query_table", "json_execute_serialized_sql"}
# a lake on S3: its credentials stay out of reach (httpfs also copies the AWS variables into its
# s3_* settings, which lake._s3_secret empties)
SECRET_FNS = {"duckdb_secrets", "which_secret"}
DOT_SEGMENT = re.compile(r"(^|[/\\])\.{1,2}([/\\]|$)")


def ensure_schema(con: duckdb.DuckDBPyConnection, in_lake: bool = False) -> None:
    """Create missing tables, add columns a newer version introduced, refresh the views. In a lake
    (which has no PRIMARY KEY: ``register_run`` checks a run id is new) all of it is one
    transaction, run again if another worker's made the same at the same moment."""
    def make(c: duckdb.DuckDBPyConnection) -> None:
        for table, cols in {**TABLES, **(LAKE_TABLES if in_lake else {})}.items():
            cols = [(col, t.replace(" PRIMARY KEY", "") if in_lake else t) for col, t in cols]
            c.execute(f"CREATE TABLE IF NOT EXISTS {table} ({', '.join(f'{col} {t}' for col, t in cols)})")
            for col, t in cols:
                c.execute(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {col} {t.replace(' PRIMARY KEY', '')}")
        for name, sql in VIEWS.items():
            c.execute(f"CREATE OR REPLACE VIEW {name} AS {sql}")
    if not in_lake:
        make(con)
        return
    # in a lake every DDL statement is a snapshot in the catalog: made only when this version's
    # tables and views are not there yet (their hash, in aip_schema)
    import hashlib
    import json

    version = hashlib.sha256(json.dumps([TABLES, VIEWS, LAKE_TABLES], sort_keys=True).encode()).hexdigest()[:16]

    def current(c: duckdb.DuckDBPyConnection) -> bool:
        """Whether the lake's schema is this one, or a later one (an older worker in a rolling
        deploy must not put its views back)."""
        if not c.execute("SELECT 1 FROM duckdb_tables() WHERE database_name = current_database() "
                         "AND table_name = 'aip_schema'").fetchone():
            return False
        row = c.execute("SELECT level, version FROM aip_schema").fetchone()
        if row is None:
            return False
        if int(row[0]) > SCHEMA_LEVEL:
            logger.warning(f"{lake.where()}: its tables are of a later aip_assets (schema level {row[0]}; this "
                           f"one's is {SCHEMA_LEVEL}): left as they are")
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


# Raised with every change to TABLES, VIEWS or LAKE_TABLES: a lake made by a later level is never
# remade by an earlier one (workers of two versions during a rolling deploy)
SCHEMA_LEVEL = 5  # 4: human_labels, v_human_vs_judge, v_human_agreement; 5: judge_panel, v_judge_panel
# A lake's own tables: the reports (report.write_report), so any host's `aip-eval report --serve`
# serves what any worker wrote, from the object store the lake's files are in
LAKE_TABLES: dict[str, list[tuple[str, str]]] = {
    "reports": [("run_id", "VARCHAR"), ("name", "VARCHAR"), ("html", "VARCHAR"), ("written_at", "TIMESTAMP")],
}
LAKE_WRITE_TRIES = 30  # a DuckLake transaction that lost to other workers' this many times in a row fails
LAKE_STATS = {"commits": 0, "conflicts": 0}  # this process's lake transactions, and the conflicts they met


def transaction(con: duckdb.DuckDBPyConnection, body: Callable[[duckdb.DuckDBPyConnection], T], what: str,
                again_after_outage: bool = True) -> T:
    """``body(con)`` in one transaction. In a lake, a commit that lost to another worker's (DuckLake
    rolls it back whole) is run again after a short random pause, growing with each try; the
    counts are in ``LAKE_STATS``. One that met the catalog's database away (a restart) is run
    again once it answers (``lake.patiently``), unless ``again_after_outage`` is False: a commit
    whose acknowledgement alone was lost would then land twice, which a partition write (it
    replaces its rows) and registering a run (its check finds the run) are safe against, and an
    append is not. Any other failure rolls back and is raised."""
    if lake.enabled() and again_after_outage:
        return lake.patiently(f"writing {what}", lambda: _transaction(con, body, what, True))
    return _transaction(con, body, what, lake.enabled())


def _transaction(con: duckdb.DuckDBPyConnection, body: Callable[[duckdb.DuckDBPyConnection], T], what: str,
                 in_lake: bool) -> T:
    for attempt in range(LAKE_WRITE_TRIES):
        con.execute("BEGIN TRANSACTION")
        try:
            out = body(con)
            con.execute("COMMIT")
        except BaseException as e:
            _rollback(con)
            if not (in_lake and lake.is_conflict(e)):
                raise
            LAKE_STATS["conflicts"] += 1
            if attempt == LAKE_WRITE_TRIES - 1:
                from .errors import AipError

                raise AipError(f"{lake.where()}: writing {what} lost to other workers' writes {LAKE_WRITE_TRIES} "
                               f"times in a row; nothing was written: {str(e).splitlines()[0]}") from None
            pause = random.uniform(0.01, 0.05) * (attempt + 1)
            logger.info(f"writing {what}: another worker committed to the same table first; "
                        f"trying again in {pause:.2f}s ({attempt + 1})")
            time.sleep(pause)
            continue
        if in_lake:
            LAKE_STATS["commits"] += 1
        return out
    raise AssertionError("unreachable")


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


_ARROW = {"VARCHAR": "string", "JSON": "string", "DOUBLE": "float64", "INTEGER": "int64", "BIGINT": "int64",
          "BOOLEAN": "bool", "TIMESTAMP": "timestamp"}


def arrow_schema(table: str):
    import pyarrow as pa

    def typ(t: str):
        name = _ARROW[t.split()[0]]
        return pa.timestamp("ns") if name == "timestamp" else pa.type_for_alias(name)

    return pa.schema([(c, typ(t)) for c, t in TABLES[table]])


def release_memory() -> None:
    """Give the memory this process has freed back to the system. glibc keeps freed heap pages for
    reuse by this process's ``malloc``, and pyarrow's default pool (mimalloc) keeps its own; DuckDB
    allocates with yet another allocator, so without this a stage's freed batches and DuckDB's write
    buffers add up in the process's peak. Arrow is therefore switched to the system allocator,
    whose free pages ``malloc_trim`` returns (under a millisecond here; no ``gc.collect()``, which
    costs 150 ms in a process holding Dagster's objects, and a stage's batches hold no cycles)."""
    import ctypes

    import pyarrow as pa

    if pa.default_memory_pool().backend_name != "system":
        pa.set_memory_pool(pa.system_memory_pool())
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to trim
        pass


# A partition write holds each DuckDB thread's new row groups in memory until they fill: one
# thread, and a lean memory cap past which DuckDB writes them out to the file early. Measured
# (2,162,570 probes, 1.4 GB on disk, in one transaction): peak RSS 605 MiB at 256MB, 818 MiB at
# 512MB, 1,028 MiB at 1GB with 865,028. A write that needs more is retried once at DUCKDB_MEMORY.
# A stage's batch reads (read_partition with ids) run at the same lean cap.
WRITE_THREADS = 1
WRITE_MEMORY = os.environ.get("AIP_DUCKDB_WRITE_MEMORY", "256MB")


def _bytes(size: str) -> float | None:
    """A DuckDB memory size ("256MB", "1GB", "4GiB", "500 KB") in bytes; None when unreadable."""
    m = re.fullmatch(r"\s*([\d.]+)\s*([KMGT]?)(I?B)?\s*", size.upper())
    if not m:
        return None
    unit = 1024 if m.group(3) == "IB" else 1000
    return float(m.group(1)) * unit ** " KMGT".index(m.group(2) or " ")


def write_caps() -> list[str | None]:
    """The memory caps a partition write tries, in order: the lean WRITE_MEMORY, then the general
    DUCKDB_MEMORY (None: no cap, when AIP_DUCKDB_MEMORY is empty). A general cap at or below the
    lean one is the only one tried."""
    full = DUCKDB_MEMORY or None
    lean, lf = WRITE_MEMORY, _bytes(WRITE_MEMORY)
    if full is not None and lf is not None and (_bytes(full) or float("inf")) <= lf:
        return [full]
    return [lean, full] if lean != full else [full]


T = TypeVar("T")


def lean_first(fn: Callable[[dict[str, Any] | None], T]) -> T:
    """``fn(config)`` at the lean memory cap, and again at the full one if DuckDB runs out there:
    for reads that scan a whole partition (a report, a table's preview), whose scans would
    otherwise fill DuckDB's cache to its limit (1.2 GB for a 100,000-row decision flip's
    judgements preview; 490 MB at the lean cap, 6.7 s instead of 2.7 s)."""
    caps = write_caps()
    for i, cap in enumerate(caps):
        try:
            return fn({"memory_limit": cap} if cap else None)
        except duckdb.OutOfMemoryException:
            if i == len(caps) - 1:
                raise
            logger.info(f"a read needed more than {cap}: read again at {caps[i + 1] or 'no cap'}")
    raise AssertionError("unreachable: write_caps() is never empty")


def write_partition_files(run_id: str, metric: str, files: dict[str, list[Path]], stage: str | None = None,
                          path: str | Path | None = None, guard: Callable[[], None] | None = None) -> None:
    """Replace this partition's rows in each table with the rows of its staged Parquet files,
    all in one transaction; DuckDB reads the files itself, so Python never holds the partition.
    The transaction holds new rows in memory until they fill row groups, per DuckDB thread: the
    write uses one, at the lean cap first (see :func:`write_caps`). ``guard``: called at the start
    of each try of the transaction (a retry after a conflict or an outage too); what it raises
    rolls the write back (the partition's lease no longer this worker's: ``leases.Lease.check``)."""
    if str(Path(path or default_path()).resolve()) in _sessions():
        raise RuntimeError(f"{path or default_path()}: a partition write inside a session of the same warehouse")
    release_memory()
    caps = write_caps()
    for i, cap in enumerate(caps):
        final = i == len(caps) - 1
        config: dict[str, Any] = {"threads": WRITE_THREADS, **({"memory_limit": cap} if cap else {})}
        try:
            _write_files(run_id, metric, files, stage, path, config, final, guard)
            return
        except duckdb.OutOfMemoryException:
            if final:
                raise
            logger.info(f"writing {run_id} × {metric} needed more than {cap}: written again at {caps[i + 1] or 'no cap'}")
            release_memory()


def _write_files(run_id: str, metric: str, files: dict[str, list[Path]], stage: str | None,
                 path: str | Path | None, config: dict[str, Any], final: bool,
                 guard: Callable[[], None] | None = None) -> None:
    def replace(con: duckdb.DuckDBPyConnection) -> None:
        if guard is not None:
            guard()
        for table, paths in files.items():
            cols = ", ".join(c for c, _ in TABLES[table])
            if table in STAGE_SCOPED:
                con.execute(f"DELETE FROM {table} WHERE run_id = ? AND metric = ? AND stage = ?", [run_id, metric, stage])
            else:
                con.execute(f"DELETE FROM {table} WHERE run_id = ? AND metric = ?", [run_id, metric])
            if paths:
                con.execute(f"INSERT INTO {table} ({cols}) SELECT {cols} FROM read_parquet(?)", [[str(p) for p in paths]])

    with connect(path, config=config) as con:
        try:
            transaction(con, replace, f"{run_id} × {metric}")
        except duckdb.OutOfMemoryException as e:
            if not final:
                raise  # tried again at the next cap by the caller
            from .errors import AipError

            raise AipError(f"{path or default_path()}: DuckDB ran out of memory writing {run_id} × {metric} "
                           f"(limit {config.get('memory_limit') or 'none'}); nothing was written — set "
                           f"AIP_DUCKDB_MEMORY higher, e.g. 4GB, and materialise again: {e}") from None


def _rollback(con: duckdb.DuckDBPyConnection) -> None:
    try:
        con.execute("ROLLBACK")
    except duckdb.Error:  # the transaction is gone already; the error that led here is the one to raise
        pass


def migrate_into_lake(source: str | Path) -> dict[str, int]:
    """Copy a local warehouse file's runs into the lake (shared mode): every run the lake does not
    have yet. Under the lock on registering runs: first the runs' calls from the file's journal
    into the lake's (replacing any of theirs there: a migrate stopped before its commit, run
    again), so a stage resumed in the lake answers them instead of calling again; then their rows
    in every table, in one transaction. A run already in the lake is left as it is, so migrating
    again copies nothing twice. A column the file lacks (an older version's file) is NULL.
    Returns {table: rows copied, "runs": n, "journaled calls": n}. The files are read under the
    warehouse's lock, never changed."""
    from .errors import AipError
    from .models.journal import PgJournal, copy_runs, journal_path
    from .models.shared_state import shared_state_url

    if not lake.enabled():
        raise AipError(f"aip-eval migrate copies a local warehouse into the lake: set {lake.LAKE_ENV} "
                       "(and AIP_SHARED_STATE_URL, the lake's catalog) first")
    src = Path(source).resolve()
    if not src.exists():
        raise AipError(f"{src}: no such warehouse file to migrate")
    copied: dict[str, int] = {}
    with _file_lock(src), connect(create=True) as con, lake.registration_lock():
        con.execute(f"ATTACH {lake._quote(str(src))} AS aip_src (READ_ONLY)")
        try:
            have = {t for (t,) in con.execute("SELECT table_name FROM duckdb_tables() WHERE database_name = 'aip_src'"
                                              ).fetchall()}
            if "eval_runs" not in have:
                raise AipError(f"{src}: not a warehouse (no eval_runs table)")
            # nobody registers meanwhile (the lock): the runs the lake lacks stay the same until the commit
            runs = [r for (r,) in con.execute("SELECT run_id FROM aip_src.eval_runs WHERE run_id NOT IN "
                                              f"(SELECT run_id FROM {lake.ALIAS}.eval_runs) ORDER BY run_id").fetchall()]
            journal = PgJournal(shared_state_url() or "")
            try:
                calls = copy_runs(journal_path(src), journal, runs)
            finally:
                journal.close()

            def copy(c: duckdb.DuckDBPyConnection) -> None:
                copied.clear()
                for table, cols in TABLES.items():
                    if table not in have or not runs:
                        continue
                    there = {r[0] for r in c.execute("SELECT column_name FROM duckdb_columns() WHERE database_name = "
                                                     "'aip_src' AND table_name = ?", [table]).fetchall()}
                    names = [col for col, _ in cols]
                    picks = ", ".join(col if col in there else f"NULL AS {col}" for col in names)
                    c.execute(f"INSERT INTO {lake.ALIAS}.{table} ({', '.join(names)}) SELECT {picks} "
                              f"FROM aip_src.{table} WHERE run_id IN (SELECT unnest(?::VARCHAR[]))", [runs])
                    n = c.execute(f"SELECT count(*) FROM aip_src.{table} WHERE run_id IN (SELECT unnest(?::VARCHAR[]))",
                                  [runs]).fetchone()
                    copied[table] = int(n[0]) if n else 0

            transaction(con, copy, f"the runs of {src}", again_after_outage=False)  # appends: never twice
        finally:
            con.execute("DETACH aip_src")
    copied["runs"] = len(runs)
    copied["journaled calls"] = calls
    return copied


def read_partition(table: str, run_id: str, metric: str, path: str | Path | None = None,
                   order_by: str | None = None, ids: list[str] | None = None,
                   columns: list[str] | None = None) -> pd.DataFrame:
    """This partition's rows of ``table`` (only rows of ``ids`` when given); NULL stays None.
    A batch's read (``ids``) runs at the lean cap: DuckDB otherwise keeps the blocks it scanned
    cached up to its limit (a 100,000-row decision flip's batch reads rose to 1.5 GB)."""
    lean = write_caps()[0]
    with connect(path, config={"memory_limit": lean} if ids is not None and lean else None) as con:
        sql = f"SELECT {', '.join(columns) if columns else '*'} FROM {table} WHERE run_id = ? AND metric = ?"
        params: list[Any] = [run_id, metric]
        if ids is not None:
            sql += " AND input_id IN (SELECT unnest(?::VARCHAR[]))"
            params.append(list(ids))
        if order_by:
            sql += f" ORDER BY {order_by}"
        df = con.execute(sql, params).df()
    return df.astype(object).where(df.notna(), None)  # SQL NULL stays None, never NaN


def status_counts(con: duckdb.DuckDBPyConnection, table: str, run_id: str, metric: str) -> dict[str, int]:
    """{status: rows} of one partition of ``table`` (a NULL status counts as ok)."""
    rows = con.execute(f"SELECT coalesce(status, 'ok'), count(*) FROM {table} WHERE run_id = ? AND metric = ? "
                       "GROUP BY ALL", [run_id, metric]).fetchall()
    return {str(k): int(n) for k, n in rows}


def query(sql: str, params: list | None = None, path: str | Path | None = None, read_only: bool = True) -> pd.DataFrame:
    with connect(path, read_only=read_only) as con:
        return con.execute(sql, params or []).df()
