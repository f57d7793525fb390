"""Decision flip's SQL views: every judged persona pair side by side, its null pairs, the flipped
pairs, the no-effect baseline per axis, and who is favoured."""

from ..judging import PERSONA_ORDER_REASONING

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
}
