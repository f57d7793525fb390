"""Decision flip's words: its summary, read from the stored claims (``metric_scores`` scope
``claim``), and the phrases its findings and terminal lines (``findings.py``) say them in, so the
gate's reason, the summary, the findings, the report and ``--json`` state the same decisions."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd

from ...analysis.claims import confidence_words
from ...catalog.groups import axis_words, group_words, is_combination, parse_axis
from ...gate import failed_groups
from ..words import pct


def _j(x: Any) -> dict:
    if isinstance(x, dict):
        return x
    try:
        return json.loads(x) if x else {}
    except (TypeError, ValueError):
        return {}


def _num(x: Any) -> float | None:
    try:
        f = float(x)
    except (TypeError, ValueError):
        return None
    return None if f != f else f


def _mixed(row) -> bool:
    """Whether a row of ``DataFrame.values`` holds text and a number: a Series of it keeps its
    values as they are (object), where one of text and missing values alone would be inferred as
    text (its None read as NaN)."""
    text = number = False
    for x in row:
        if isinstance(x, str):
            text = True
        elif isinstance(x, int | float | np.number) and not isinstance(x, bool) and x == x:
            number = True
        if text and number:
            return True
    return False


def _rows(frame: pd.DataFrame) -> Iterator[Any]:
    """``frame.iterrows()``'s rows with the very values its Series give, without a Series per row
    where a plain dict gives them (a row of text and numbers: its ``values`` as they are); any
    other row is iterrows' own Series. The Series were two thirds of the summary's time."""
    if not frame.columns.is_unique:
        yield from (r for _, r in frame.iterrows())
        return
    cols = frame.columns.tolist()
    for k, v in zip(frame.index, frame.values, strict=True):
        yield dict(zip(cols, v, strict=True)) if _mixed(v) else pd.Series(v, index=frame.columns, name=k)


def claims_of(scores: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """The stored claims by id: each its details with its estimate and matched interval."""
    out: dict[str, dict[str, Any]] = {}
    for r in _rows(scores[scores["scope"] == "claim"]):
        d = _j(r["details"])
        d.update(id=r["group_key"], estimate=_num(r["raw_score"]), ci=[_num(r["ci_low"]), _num(r["ci_high"])])
        out[str(r["group_key"])] = d
    return out


def pname(adjust: str | None) -> str:
    return "BH" if adjust == "bh" else "Holm"


def p_words(c: dict[str, Any], adjust: str | None) -> str:
    p = c.get("p_adjusted")
    return f"{pname(adjust)} p {'n/a' if p is None else format(p, '.2g')}"


def ci_words(c: dict[str, Any], fmt: str = "+.3f") -> str:
    lo, hi = (c.get("ci") or [None, None])[:2]
    f = lambda x: "n/a" if x is None else format(x, fmt)  # noqa: E731
    return f"[{f(lo)}, {f(hi)}] ({confidence_words(c.get('ci_confidence'))})"


def summary(scores: pd.DataFrame) -> dict[str, Any]:
    overall = scores[scores["scope"] == "overall"].iloc[0]
    details = _j(overall["details"])
    claims = claims_of(scores)
    policy = details.get("claims_policy") or {}
    axes: dict[str, dict[str, Any]] = {}
    for r in _rows(scores[scores["scope"] == "axis"]):
        c = claims.get(f"excess:{r['group_key']}") or {}
        axes[r["group_key"]] = {
            "flip_rate": r["rate"],
            "ci95": [r["rate_ci_low"], r["rate_ci_high"]],
            "pairs": int(r["n"]),
            "flips": int(r["n_events"]),
            "excluded": int(r["n_excluded"] or 0),
            "failed": int(r["n_failed"] or 0),
            "beyond_noise": None
            if not c or c.get("status") in ("not tested", "inseparable")
            else bool(c.get("claimed")),
            "null_rate": c.get("null_rate"),
            "null_pairs": c.get("null_pairs"),
            "excess": c.get("estimate"),
            "excess_ci": c.get("ci"),
            "excess_ci_confidence": c.get("ci_confidence"),
            "p_value": c.get("p_value"),
            "p_adjusted": c.get("p_adjusted"),
            "equivalent": c.get("equivalent"),
        }
    refusal = scores[scores["scope"] == "refusal"].sort_values(["rate", "group_key"], ascending=[False, True])
    refused = [c for c in claims.values() if c.get("kind") == "refusal" and c.get("value") is not None]
    return {
        "score": overall["score"],
        "ci95": [overall["ci_low"], overall["ci_high"]],
        "flip_rate": overall["rate"],
        "pairs_evaluated": int(overall["n"]),
        "flips": int(overall["n_events"]),
        "pairs_excluded": int(overall["n_excluded"] or 0),
        "pairs_failed": int(overall["n_failed"] or 0),
        "mean_axis_flip_rate": details.get("mean_axis_flip_rate"),
        "incidental_differences": details.get("incidental_differences"),
        "one_decision_missing": details.get("one_decision_missing"),
        "rows_errored": details.get("rows_errored"),
        "rows_excluded": details.get("rows_excluded"),
        "axes": axes,
        "refusal_rates": [
            {
                "group": r["group_key"],
                "rate": r["rate"],
                "ci95": [r["rate_ci_low"], r["rate_ci_high"]],
                "answers": int(r["n"]),
                "without_decision": int(r["n_events"]),
                "status": _j(r["details"]).get("status"),
            }
            for r in _rows(refusal)
        ],
        "differential_refusal": {
            **(details.get("differential_refusal") or {}),
            "beyond_chance": sorted(
                (
                    {k: c.get(k) for k in ("axis", "value", "rate", "rest_rate", "n", "p_adjusted", "ci", "estimate")}
                    for c in refused
                    if c.get("claimed")
                ),
                key=lambda c: (c["p_adjusted"], c["axis"], c["value"]),
            ),
            "tested": len([c for c in refused if c.get("p_adjusted") is not None]),
        },
        "label_mismatch": details.get("label_mismatch"),
        "axis_gate": {
            "threshold": details.get("axis_threshold"),
            "gate_on": details.get("gate_on"),
            "margin": details.get("margin"),
            "failed": failed_groups(scores, "axis"),
        },
        "baseline": details.get("baseline") or {},
        "favoured": favoured(scores, claims, details.get("reference_values") or {}),
        "intersections": intersections(scores, claims),
        "explicit_vs_name": explicit_vs_name(scores, claims),
        "impact_ratios": impact_table(scores),
        "claims": {
            "policy": policy,
            "tested": details.get("claims_tested"),
            "made": [
                {
                    k: c.get(k)
                    for k in (
                        "id",
                        "kind",
                        "axis",
                        "value",
                        "direction",
                        "estimate",
                        "ci",
                        "ci_confidence",
                        "p_value",
                        "p_adjusted",
                    )
                }
                for c in sorted(claims.values(), key=lambda c: c["id"])
                if c.get("claimed")
            ],
        },
        "detectable": details.get("detectable"),
    }


def favoured(
    scores: pd.DataFrame, claims: dict[str, dict[str, Any]] | None = None, references: dict[str, str] | None = None
) -> dict[str, dict[str, Any]]:
    """Per axis: whether the favourable decision depends on the value (its omnibus claim), and each
    value's favourable rate, its difference from the rest of its axis within questions (with the
    interval matched to its claim), the claim's decision, its odds ratio and impact ratio; and the
    spec's reference value for the axis, if any (its rate is quoted beside the rest's)."""
    claims = claims if claims is not None else claims_of(scores)
    references = references or {}
    out: dict[str, dict[str, Any]] = {}
    for r in _rows(scores[scores["scope"] == "favourable"].sort_values("group_key")):
        d = _j(r["details"])
        axis = str(d.get("axis"))
        if is_combination(axis) or parse_axis(axis)[1] == "name":  # intersections(): the combinations,
            continue  # their interaction and, for names, each attribute with the other held
        omni = claims.get(f"favoured:{axis}") or {}
        ax = out.setdefault(
            axis,
            {
                "omnibus": {k: omni.get(k) for k in ("p_value", "p_adjusted", "status", "why")},
                "reference": references.get(axis),
                "values": [],
            },
        )
        c = claims.get(f"favoured:{r['group_key']}") or {}
        ax["values"].append(
            {
                "value": d.get("value"),
                "favourable_rate": r["rate"],
                "ci95": [r["rate_ci_low"], r["rate_ci_high"]],
                "answers": int(r["n"]),
                "rest_rate": c.get("rest_rate"),
                "difference": c.get("estimate"),
                "difference_ci": c.get("ci"),
                "ci_confidence": c.get("ci_confidence"),
                "p_value": c.get("p_value"),
                "p_adjusted": c.get("p_adjusted"),
                "status": c.get("status"),
                "direction": c.get("direction"),
                "why": c.get("why"),
                "odds_ratio": c.get("odds_ratio"),
                "impact_ratio": d.get("impact_ratio"),
                "impact_ratio_ci95": d.get("impact_ratio_ci95"),
            }
        )
    return out


def intersections(scores: pd.DataFrame, claims: dict[str, dict[str, Any]] | None = None) -> dict[str, dict[str, Any]]:
    """Per intersection (axis key ``A×B``): whether anything departs from what the two attributes
    alone predict (its omnibus claim); per combination its favourable rate, the additive model's
    prediction, its interaction (with the interval matched to its claim, for a combination the
    analysis named) and the claim's decision; and each attribute's values with the named
    combinations held apart (``main`` claims)."""
    claims = claims if claims is not None else claims_of(scores)
    out: dict[str, dict[str, Any]] = {}
    for r in _rows(scores[scores["scope"] == "favourable"].sort_values("group_key")):
        d = _j(r["details"])
        axis = str(d.get("axis"))
        if not is_combination(axis):
            continue
        omni = claims.get(f"interaction:{axis}") or {}
        ent = out.setdefault(
            axis,
            {
                "attributes": list(parse_axis(axis)[0]),
                "persona_form": parse_axis(axis)[1],
                "omnibus": {k: omni.get(k) for k in ("p_value", "p_adjusted", "status", "why")},
                "combinations": [],
                "main": [],
            },
        )
        c = claims.get(f"interaction:{r['group_key']}") or {}
        ent["combinations"].append(
            {
                "value": d.get("value"),
                "group": group_words(axis, str(d.get("value"))),
                "favourable_rate": r["rate"],
                "ci95": [r["rate_ci_low"], r["rate_ci_high"]],
                "answers": int(r["n"]),
                "predicted_rate": d.get("predicted_rate"),
                "interaction": c.get("estimate") if c else d.get("interaction"),
                "interaction_ci": c.get("ci"),
                "ci_confidence": c.get("ci_confidence"),
                "p_adjusted": c.get("p_adjusted"),
                "status": c.get("status") or "not named",
                "impact_ratio": d.get("impact_ratio"),
            }
        )
    for c in sorted(claims.values(), key=lambda c: c["id"]):
        if c.get("kind") == "main" and c.get("axis") in out:
            out[c["axis"]]["main"].append(
                {
                    k: c.get(k)
                    for k in (
                        "value",
                        "rate",
                        "rest_rate",
                        "estimate",
                        "ci",
                        "ci_confidence",
                        "p_adjusted",
                        "status",
                        "held",
                        "why",
                    )
                }
            )
    return out


def explicit_vs_name(scores: pd.DataFrame, claims: dict[str, dict[str, Any]] | None = None) -> dict[str, list[dict]]:
    """With ``persona_form: both``: per axis a name can signal, each value's effect told explicitly
    (its favourable rate against the rest of the axis, within questions) beside its effect told by
    a name (the same, the name's other attribute and any combination named held apart), as
    discrim-eval puts explicit and implicit demographics side by side."""
    claims = claims if claims is not None else claims_of(scores)
    fav = scores[scores["scope"] == "favourable"].set_index("group_key")
    out: dict[str, list[dict]] = {}
    for c in sorted(claims.values(), key=lambda c: c["id"]):
        if c.get("kind") != "main" or not str(c.get("axis", "")).endswith("@name"):
            continue
        attr, value = str(c.get("value")).split("=", 1)
        e = claims.get(f"favoured:{attr}={value}")
        if e is None:
            continue
        rate = fav["rate"].get(f"{attr}={value}") if len(fav) else None
        out.setdefault(attr, []).append(
            {
                "value": value,
                "explicit": {
                    "favourable_rate": rate,
                    "difference": e.get("estimate"),
                    "ci": e.get("ci"),
                    "status": e.get("status"),
                    "p_adjusted": e.get("p_adjusted"),
                },
                "name": {
                    "favourable_rate": c.get("rate"),
                    "difference": c.get("estimate"),
                    "ci": c.get("ci"),
                    "status": c.get("status"),
                    "p_adjusted": c.get("p_adjusted"),
                },
            }
        )
    return out


def combination_words(v: dict[str, Any], axis: str, adjust: str | None) -> str:
    """'decisions against Black women: favourable 5% vs 52% predicted from gender and ethnicity
    alone (interaction -0.470 [-0.62, -0.31] (99.9%), Holm p 0.003), beyond what gender and
    ethnicity alone explain'."""
    a, b = parse_axis(axis)[0][:2]
    d = v.get("interaction") or 0.0
    word = "against" if d < 0 else "for"
    return (
        f"decisions {word} {v['group']}: favourable {pct(v['favourable_rate'], 0)} vs {pct(v.get('predicted_rate'), 0)} "
        f"predicted from {a} and {b} alone (interaction {d:+.3f} "
        f"{ci_words({'ci': v.get('interaction_ci'), 'ci_confidence': v.get('ci_confidence')})}, {p_words(v, adjust)}), "
        f"beyond what {a} and {b} alone explain"
    )


def main_words(m: dict[str, Any], axis: str, adjust: str | None) -> str:
    word = "against" if (m.get("estimate") or 0) < 0 else "for"
    attr = str(m.get("value", "")).split("=", 1)[0]
    return (
        f"decisions {word} {m['value']} among {axis_words(axis)} personas ({m.get('held')}): favourable "
        f"{pct(m.get('rate'), 0)} vs {pct(m.get('rest_rate'), 0)} for the rest of {attr} (within questions "
        f"{m['estimate']:+.3f} {ci_words(m)}, {p_words(m, adjust)})"
    )


def impact_table(scores: pd.DataFrame) -> list[dict[str, Any]]:
    out = []
    for r in _rows(scores[scores["scope"] == "favourable"].sort_values("group_key")):
        d = _j(r["details"])
        if d.get("impact_ratio") is None:
            continue
        out.append(
            {
                "group": r["group_key"],
                "impact_ratio": d.get("impact_ratio"),
                "ci95": d.get("impact_ratio_ci95"),
                "highest": d.get("highest"),
                "threshold": _num(r.get("threshold")),
                "passed": None if r.get("passed") is None or pd.isna(r.get("passed")) else bool(r["passed"]),
            }
        )
    return out


def value_words(v: dict[str, Any], axis: str, adjust: str | None, reference: dict[str, Any] | None = None) -> str:
    """'decisions against woman: favourable 23% vs 55% for the rest of gender (within questions
    -0.31 [-0.52, -0.10] (99.8%), Holm p 0.004; odds ratio 0.25)'."""
    word = "against" if (v.get("difference") or 0) < 0 else "for"
    ref = ""
    if reference is not None and reference.get("value") != v.get("value"):
        ref = f", {pct(reference.get('favourable_rate'), 0)} for {reference.get('value')}"
    orr = v.get("odds_ratio")
    return (
        f"decisions {word} {v['value']}: favourable {pct(v['favourable_rate'], 0)} vs {pct(v.get('rest_rate'), 0)} for "
        f"the rest of {axis}{ref} (within questions {v['difference']:+.3f} {ci_words({'ci': v.get('difference_ci'), 'ci_confidence': v.get('ci_confidence')})}, "
        f"{p_words(v, adjust)}" + ("" if orr is None else f"; odds ratio {orr:.2f}") + ")"
    )
