"""The report's label tables: how each breakdown scope is charted, and the words for each metric's
counts, rates and single-number scopes."""

from __future__ import annotations

from typing import Any

GROUP_CAP = 15  # persona / attribute / pair charts show the lowest this many


# breakdown scope -> how to chart it. value: the bar; lo/hi: the 95% interval whisker (when present)
SCOPES: dict[str, dict[str, Any]] = {
    "axis": {"value": "rate", "lo": "rate_ci_low", "hi": "rate_ci_high", "kind": "rate", "sort": "desc",
             "title": "Flip rate by axis (bar: attributable flips / judged pairs; whisker: Wilson 95% interval)"},
    "attribute": {"value": "score", "lo": "ci_low", "hi": "ci_high", "kind": "score", "cap": GROUP_CAP,
                  "title": "Equitability by attribute value (whisker: bootstrap 95% interval)"},
    "persona": {"value": "score", "lo": "ci_low", "hi": "ci_high", "kind": "score", "cap": GROUP_CAP,
                "title": "Equitability by persona (whisker: bootstrap 95% interval)"},
    "pair": {"value": "score", "kind": "score", "cap": GROUP_CAP, "title": "Equitability by persona pair"},
    "judge": {"value": "raw_score", "kind": "plain", "order": ["similarity", "tone", "effort"],
              "title": "Judge means (similarity: higher is better; tone divergence and effort gap: lower is better)"},
    "category": {"value": "score", "lo": "ci_low", "hi": "ci_high", "kind": "score",
                 "title": "Score by template category (whisker: bootstrap 95% interval)"},
    "wrapping": {"value": "score", "lo": "ci_low", "hi": "ci_high", "kind": "score",
                 "title": "Plain versus jailbreak-wrapped variants (whisker: bootstrap 95% interval)"},
    "label": {"value": "n", "kind": "count", "order": ["Consistent", "Slightly Inconsistent", "Contradictory"],
              "title": "Rows per label"},
    "perturbation_type": {"value": "score", "kind": "score", "title": "Score by perturbation type"},
    "refusal": {"value": "rate", "lo": "rate_ci_low", "hi": "rate_ci_high", "kind": "rate", "sort": "desc",
                "title": "Answers without a decision by axis value (refusals, no configured label, empty; whisker: "
                         "Wilson 95% interval)"},
    "favourable": {"value": "rate", "lo": "rate_ci_low", "hi": "rate_ci_high", "kind": "rate", "sort": "desc",
                   "title": "Favourable decisions by axis value (bar: favourable / answers with a decision; whisker: "
                            "Wilson 95% interval)"},
    "baseline": {"value": "rate", "lo": "rate_ci_low", "hi": "rate_ci_high", "kind": "rate", "sort": "desc",
                 "title": "No-effect baseline by axis (bar: flips among null pairs, one persona asked twice; whisker: "
                          "Wilson 95% interval)"},
}
# the headline; single numbers beside it; effects (odds ratios) are a table (_effects_table)
NOT_CHARTED = {"overall", "axis_mean", "judge_audit", "judge_position", "judge_panel", "effect", "bias_baseline"}
HUMAN_SCOPE = "human_agreement"  # the judge checked against people (human_labels.py): a table of its own

COUNT_LABELS = {
    "llm.decision_flip": ("pairs judged", "attributable flips", "pairs excluded"),
    "llm.group_interaction_bias": ("pairs judged", "pairs with bias ≥ 0.1", "pairs excluded"),
    "llm.semantic_consistency": ("rows scored", "contradictory rows", "rows errored"),
    "llm.factual_consistency": ("rows scored", "contradictory rows", "rows errored"),
    "llm.safety_consistency": ("rows scored", "contradictory rows", "rows errored"),
    "llm.perturbation_robustness": ("groups scored", "rows with a correctness drop", "groups failed"),
    "llm.perturbation_robustness_external": ("groups scored", "rows with a correctness drop", "groups failed"),
}

RATE_LABELS = {"llm.decision_flip": "flip rate"}
EXTRA_SCOPE_LABELS = {"axis_mean": "mean axis flip rate",  # the same words as the overall row's detail
                      "judge_audit": "judge agreement with the audit judge",
                      "judge_position": "judge position bias (difference between orders)"}


def _scope_label(r: dict[str, Any]) -> str:
    if r["scope"] == "judge_panel":
        return "judge panel agreement" if r["group_key"] == "panel" else f"agreement {r['group_key']}"
    return EXTRA_SCOPE_LABELS.get(r["scope"], f'{r["scope"]} ({r["group_key"]})')
