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
    # per axis: its flip rate against the no-effect baseline (null pairs: one persona asked twice, pooled over
    # the axes unless their rates differ) and the claim that its flips are beyond noise, its interval at the
    # claim's matching level (docs/concepts/claims.md)
    "v_flip_excess_by_axis": """
        SELECT run_id, metric, details ->> 'axis' AS axis, CAST(details ->> 'rate' AS DOUBLE) AS flip_rate,
               CAST(details ->> 'null_rate' AS DOUBLE) AS null_rate, CAST(details ->> 'null_pairs' AS INTEGER) AS null_pairs,
               details ->> 'baseline' AS baseline, raw_score AS excess, ci_low AS excess_ci_low, ci_high AS excess_ci_high,
               CAST(details ->> 'ci_confidence' AS DOUBLE) AS ci_confidence,
               CAST(details ->> 'p_value' AS DOUBLE) AS p_value, CAST(details ->> 'p_adjusted' AS DOUBLE) AS p_adjusted,
               CAST(details ->> 'claimed' AS BOOLEAN) AS beyond_noise
        FROM metric_scores WHERE metric = 'llm.decision_flip' AND scope = 'claim' AND group_key LIKE 'excess:%'
    """,
    # who is favoured: each attribute value's favourable-decision rate (Wilson 95%), its difference from the
    # rest of its axis within questions (the claim's estimate, its interval at the claim's matching level),
    # the claim's decision, its Mantel-Haenszel odds ratio and its impact ratio (its rate over the axis's highest);
    # how the persona was told (explicit, name) and, for an intersection (axis gender×ethnicity), the combination,
    # the additive model's prediction and the interaction (its claim's interval when the analysis named it)
    "v_favourable_rates": """
        SELECT f.run_id, f.metric, f.details ->> 'axis' AS axis, f.details ->> 'value' AS value,
               f.rate AS favourable_rate, f.rate_ci_low, f.rate_ci_high, f.n AS decided_answers,
               f.n_events AS favourable, CAST(c.details ->> 'rest_rate' AS DOUBLE) AS rest_rate,
               c.raw_score AS difference, c.ci_low AS difference_ci_low, c.ci_high AS difference_ci_high,
               CAST(c.details ->> 'ci_confidence' AS DOUBLE) AS ci_confidence,
               CAST(c.details ->> 'p_value' AS DOUBLE) AS p_value, CAST(c.details ->> 'p_adjusted' AS DOUBLE) AS p_adjusted,
               c.details ->> 'status' AS claim, CAST(c.details ->> 'odds_ratio' AS DOUBLE) AS odds_ratio,
               CAST(f.details ->> 'impact_ratio' AS DOUBLE) AS impact_ratio,
               CAST(f.details -> 'impact_ratio_ci95' ->> 0 AS DOUBLE) AS impact_ratio_ci_low,
               CAST(f.details -> 'impact_ratio_ci95' ->> 1 AS DOUBLE) AS impact_ratio_ci_high,
               f.threshold AS min_impact_ratio, f.passed AS impact_ratio_passed, c.details ->> 'why' AS not_tested_because,
               coalesce(f.details ->> 'persona_form', 'explicit') AS persona_form, f.details -> 'combination' AS combination,
               CAST(f.details ->> 'predicted_rate' AS DOUBLE) AS predicted_rate,
               coalesce(i.raw_score, CAST(f.details ->> 'interaction' AS DOUBLE)) AS interaction,
               i.ci_low AS interaction_ci_low, i.ci_high AS interaction_ci_high,
               CAST(i.details ->> 'p_adjusted' AS DOUBLE) AS interaction_p_adjusted,
               CASE WHEN (f.details -> 'combination') IS NULL THEN NULL
                    ELSE coalesce(i.details ->> 'status', 'not named') END AS interaction_claim
        FROM metric_scores f
        LEFT JOIN metric_scores c ON c.run_id = f.run_id AND c.metric = f.metric AND c.scope = 'claim'
             AND c.group_key = 'favoured:' || f.group_key
        LEFT JOIN metric_scores i ON i.run_id = f.run_id AND i.metric = f.metric AND i.scope = 'claim'
             AND i.group_key = 'interaction:' || f.group_key
        WHERE f.metric = 'llm.decision_flip' AND f.scope = 'favourable'
    """,
    # impact ratios: each value's favourable rate over the highest of its axis (the four-fifths rule holds it to
    # 0.8), with a 95% interval from resampling questions (descriptive, unadjusted) and the gate's verdict
    # every name a run gave a persona (persona_form name): its group, how often it was asked, and the decisions
    # read in its answers, so one name's quirks can be told from its group's
    "v_persona_names": """
        SELECT p.run_id, p.metric, p.axis, p.persona_name AS name, p.attribute_value AS value, p.attributes,
               count(DISTINCT p.probe_id) AS probes, count(DISTINCT p.input_id) AS questions
        FROM probes p
        WHERE p.metric = 'llm.decision_flip' AND p.persona_name IS NOT NULL
        GROUP BY ALL
    """,
    "v_impact_ratios": """
        SELECT run_id, metric, details ->> 'axis' AS axis, details ->> 'value' AS value, rate AS favourable_rate,
               n AS decided_answers, CAST(details ->> 'impact_ratio' AS DOUBLE) AS impact_ratio,
               CAST(details -> 'impact_ratio_ci95' ->> 0 AS DOUBLE) AS ci_low,
               CAST(details -> 'impact_ratio_ci95' ->> 1 AS DOUBLE) AS ci_high,
               details ->> 'highest' AS highest_value, threshold AS min_impact_ratio, passed
        FROM metric_scores
        WHERE metric = 'llm.decision_flip' AND scope = 'favourable' AND (details ->> 'impact_ratio') IS NOT NULL
    """,
}
