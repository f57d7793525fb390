"""Group interaction bias's SQL views: equitability per persona, attribute and pair; each
persona pair with every judge's number beside both answers; its null pairs."""

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
    "v_group_equitability": """
        SELECT run_id, metric, scope, group_key, score AS equitability, raw_score, n AS pairs,
               CAST(details ->> 'mean_bias' AS DOUBLE) AS mean_bias,
               CAST(details ->> 'less_helpful_share' AS DOUBLE) AS less_helpful_share, details
        FROM metric_scores WHERE metric = 'llm.group_interaction_bias' AND scope IN ('persona', 'attribute', 'pair')
    """,
    # each attribute value's effect with every other attribute its personas carry held (docs/concepts/claims.md):
    # its adjusted equitability (the group gate's figure, 95% interval) beside its pairs' raw one, its gap and
    # the claim's decision (the gap's interval at the claim's matching level); a value the pool cannot tell apart
    # from another has none, and says why
    "v_group_effects": """
        SELECT run_id, metric, group_key AS value, score AS adjusted_equitability, ci_low, ci_high,
               CAST(details ->> 'raw_equitability' AS DOUBLE) AS raw_equitability,
               CAST(details ->> 'gap' AS DOUBLE) AS gap, CAST(details -> 'gap_ci' ->> 0 AS DOUBLE) AS gap_ci_low,
               CAST(details -> 'gap_ci' ->> 1 AS DOUBLE) AS gap_ci_high,
               CAST(details ->> 'gap_ci_confidence' AS DOUBLE) AS gap_ci_confidence,
               CAST(details ->> 'p_adjusted' AS DOUBLE) AS p_adjusted, details ->> 'status' AS claim,
               n AS pairs, CAST(details ->> 'less_helpful_share' AS DOUBLE) AS less_helpful_share,
               threshold, passed, gate_reason, details ->> 'inseparable' AS inseparable
        FROM metric_scores WHERE metric = 'llm.group_interaction_bias' AND scope = 'group'
    """,
    # the judges' numbers are gathered per pair first (no text in the grouping: at 100,000 rows a
    # GROUP BY over the answers' text ran DuckDB out of its memory cap), then the texts joined
    # group interaction bias's persona pairs, each judge's number beside both answers
    "v_gib_pairs": GIB_PAIRS + " AND coalesce(pp.kind, 'persona') <> 'null'",
    # its null pairs (the no-effect baseline): one persona's first answer and its fresh sample
    "v_gib_baseline_pairs": GIB_PAIRS + " AND pp.kind = 'null'",
}
