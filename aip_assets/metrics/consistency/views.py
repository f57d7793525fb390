"""The consistency family's SQL views (semantic, factual and safety consistency): each row with its
variant, each comparison with both answers, and v1's blended figure."""

VIEWS: dict[str, str] = {
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
}
