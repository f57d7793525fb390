"""The warehouse's views that are no one metric's (``CORE_VIEWS``), and every view in the order they are made
(:func:`views`: each metric's own, then these)."""

from __future__ import annotations

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
