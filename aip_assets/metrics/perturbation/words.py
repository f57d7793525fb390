"""Perturbation robustness's words: its summary, its findings (the perturbation types that hurt)
and its lines in the terminal, each read from its stored scores."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from ..words import Evidence, Finding, clip_quote, examples_of, not_scored_phrase, pct


def summary(scores: pd.DataFrame) -> dict[str, Any]:
    overall = scores[scores["scope"] == "overall"].iloc[0]
    d = json.loads(overall["details"]) if overall["details"] else {}
    types = scores[scores["scope"] == "perturbation_type"].sort_values(["score", "group_key"])
    return {
        "score": overall["score"],
        "ci95": [overall["ci_low"], overall["ci_high"]],
        **d,
        "by_perturbation_type": [
            {"type": r["group_key"], "score": r["score"], "pairs": int(r["n"]), **json.loads(r["details"])}
            for _, r in types.iterrows()
        ],
    }


def findings(name: str, scores: pd.DataFrame, evidence: Evidence) -> list[Finding]:
    """Each perturbation type whose score falls below the overall score's 95% interval (or its
    threshold): its score, robustness and correctness drop against the overall score, with the
    least robust variants' judge reasoning as examples."""
    ov = scores[scores["scope"] == "overall"].iloc[0]
    overall, lo = ov["score"], ov["ci_low"]
    threshold = None if ov["threshold"] is None or ov["threshold"] != ov["threshold"] else float(ov["threshold"])
    bar = min(x for x in (lo, overall, threshold) if x is not None and x == x) if overall is not None else None
    out: list[Finding] = []
    types = scores[scores["scope"] == "perturbation_type"].sort_values(["score", "group_key"])
    for _, r in types.iterrows():
        if bar is None or r["score"] is None or not r["score"] < bar:
            continue
        d = json.loads(r["details"]) if r["details"] else {}
        rob, drop = d.get("mean_robustness"), d.get("mean_correctness_drop")
        judged = evidence.query(
            "SELECT input_id, reasoning FROM judgements WHERE run_id = ? AND metric = ? AND judge_kind = "
            "'robustness' AND category = ? AND status = 'ok' ORDER BY score, input_id",
            [evidence.run_id, evidence.metric, r["group_key"]],
        )
        ids, quotes = examples_of(judged, lambda j: clip_quote(j["reasoning"], 70))
        below = threshold is not None and r["score"] < threshold
        out.append(
            Finding(
                name,
                f"Perturbation {r['group_key']} changes the answer: answers to its variants agree with the "
                f"original's {pct(rob, 0)} of the time (robustness {rob:.3f}), correctness drop {drop:+.3f}; "
                f"score {r['score']:.3f} vs {overall:.3f} overall, {int(r['n'])} variant pairs",
                below and not bool(ov["passed"]),
                float(overall - r["score"]),
                {
                    "score": r["score"],
                    "overall": overall,
                    "overall_ci95": [lo, ov["ci_high"]],
                    "robustness": rob,
                    "correctness_drop": drop,
                    "pairs": int(r["n"]),
                },
                ids,
                quotes,
                "perturbation_type",
                str(r["group_key"]),
            )
        )
    return out


def format_summary(s: dict[str, Any]) -> list[str]:
    f = lambda x: "n/a" if x is None else f"{x:.3f}"  # noqa: E731
    lines = [
        f"  rows scored {s['rows_scored']}, {not_scored_phrase('rows', s.get('rows_excluded'))}, groups scored "
        f"{s.get('groups_scored')}, {not_scored_phrase('groups', s.get('groups_excluded'))}, variant pairs judged "
        f"{s.get('variant_pairs_judged')}, excluded {s.get('variant_pairs_excluded')}",
        "  score = 0.5 x robustness (the variant's answer agrees with the original's) + 0.5 x (1 - correctness "
        "drop) (how much less correct it is)",
        f"  {'perturbation type':<20}{'score':>8}{'robustness':>12}{'correctness drop':>18}{'pairs':>7}",
    ]
    for t in s["by_perturbation_type"]:
        lines.append(
            f"  {t['type']:<20}{f(t['score']):>8}{f(t['mean_robustness']):>12}"
            f"{t['mean_correctness_drop']:>+18.3f}{t['pairs']:>7}"
        )
    return lines
