"""Decision flip's words: its summary, its findings and its lines in the terminal, each read from
the stored claims (``metric_scores`` scope ``claim``), so the gate's reason, the summary, the
findings, the report and ``--json`` state the same decisions."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from ...analysis.claims import confidence_words
from ...catalog.groups import axis_words, group_words, is_combination, parse_axis
from ...gate import failed_groups
from ..base import Evidence, Finding, examples_of, not_scored_phrase, pct


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


def claims_of(scores: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """The stored claims by id: each its details with its estimate and matched interval."""
    out: dict[str, dict[str, Any]] = {}
    for _, r in scores[scores["scope"] == "claim"].iterrows():
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
    for _, r in scores[scores["scope"] == "axis"].iterrows():
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
            for _, r in refusal.iterrows()
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
    for _, r in scores[scores["scope"] == "favourable"].sort_values("group_key").iterrows():
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
    for _, r in scores[scores["scope"] == "favourable"].sort_values("group_key").iterrows():
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
    for _, r in scores[scores["scope"] == "favourable"].sort_values("group_key").iterrows():
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


def findings(name: str, scores: pd.DataFrame, evidence: Evidence) -> list[Finding]:  # noqa: C901
    """Per axis: flips beyond the no-effect baseline, and who is decided against, each only as the
    claims decide; an axis whose flip-rate gate fails without flips beyond noise, as instability;
    a value refused more beyond chance; an impact ratio below the gate."""
    s = summary(scores)
    adjust = (s["claims"]["policy"] or {}).get("adjust")
    failed_axes = s["axis_gate"]["failed"]
    overall = scores[scores["scope"] == "overall"].iloc[0]
    reason = str(overall.get("gate_reason") or "")
    out: list[Finding] = []
    for axis, a in s["axes"].items():
        rate, (lo, hi) = a["flip_rate"], a["ci95"]
        fav = s["favoured"].get(axis) or {}
        made = [v for v in fav.get("values", []) if v.get("status") == "claimed"]
        inter = (s.get("intersections") or {}).get(axis)
        if inter is not None:
            made = [v for v in inter["combinations"] if v.get("status") == "claimed"]
            mains = [m for m in inter["main"] if m.get("status") == "claimed"]
        gate_failed = axis in failed_axes or any(  # its own failure, not another axis's
            part.startswith(f"{axis}: flip rate") and "exceeds the no-effect baseline" in part
            for part in reason.split("; ")
        )
        if rate is None or not (gate_failed or a["beyond_noise"] or made or (inter is not None and mains)):
            continue
        numbers: dict[str, Any] = {
            "flip_rate": rate,
            "ci95": [lo, hi],
            "flips": a["flips"],
            "pairs": a["pairs"],
            "beyond_noise": a["beyond_noise"],
            "null_rate": a["null_rate"],
            "excess": a["excess"],
            "excess_ci": a["excess_ci"],
            "p_adjusted": a["p_adjusted"],
        }
        flips = f"{axis} pairs flip in {pct(rate)} [{pct(lo)}, {pct(hi)}]"
        if a["beyond_noise"]:
            noise = (
                f"{flips} vs {pct(a['null_rate'])} for one persona asked twice, beyond noise (excess "
                f"{a['excess']:+.3f} {ci_words({'ci': a['excess_ci'], 'ci_confidence': a['excess_ci_confidence']})}, "
                f"{p_words(a, adjust)})"
            )
        elif a["beyond_noise"] is None:
            noise = f"{flips} (no no-effect baseline: set baseline_share to tell bias from instability)"
        else:
            noise = (
                f"{flips}, but the same persona asked twice differs {pct(a['null_rate'])}: not shown to depend on the "
                f"persona ({p_words(a, adjust)})" + (" — the SUT's decisions are unstable" if a["null_rate"] else "")
            )
        value = None
        if inter is not None and (made or mains):
            parts = [
                combination_words(v, axis, adjust)
                for v in sorted(made, key=lambda v: (v["interaction"] or 0, v["value"]))
            ]
            parts += [main_words(m, axis, adjust) for m in mains]
            sentence = "; ".join(parts)
            sentence = sentence[0].upper() + sentence[1:] + f"; {noise}"
            top = min(made, key=lambda v: (v["interaction"] or 0, v["value"])) if made else None
            if top is not None:
                value = top["value"]
                numbers.update(
                    value=value,
                    group=top["group"],
                    direction="against" if (top["interaction"] or 0) < 0 else "for",
                    favourable_rate=top["favourable_rate"],
                    predicted_rate=top["predicted_rate"],
                    interaction=top["interaction"],
                    interaction_ci=top["interaction_ci"],
                    value_p_adjusted=top["p_adjusted"],
                )
                effect = abs(float(top["interaction"] or 0))
            else:
                effect = max(abs(float(m["estimate"] or 0)) for m in mains)
            numbers["main_effects"] = [m["value"] for m in mains]
        elif made:
            v = max(made, key=lambda v: (abs(v["difference"] or 0), v["value"]))
            value = v["value"]
            ref = next((w for w in fav.get("values", []) if w["value"] == fav.get("reference")), None)
            vw = value_words(v, axis, adjust, ref)
            sentence = vw[0].upper() + vw[1:] + f"; {noise}"
            others = [w["value"] for w in made if w is not v]
            if others:
                sentence += f"; also beyond chance on {axis}: {', '.join(others)}"
            numbers.update(
                value=value,
                direction="against" if v["difference"] < 0 else "for",
                favourable_rate=v["favourable_rate"],
                rest_rate=v["rest_rate"],
                difference=v["difference"],
                difference_ci=v["difference_ci"],
                value_p_adjusted=v["p_adjusted"],
                odds_ratio=v["odds_ratio"],
            )
            effect = abs(float(v["difference"]))
        else:
            sentence = noise[0].upper() + noise[1:]
            if a["beyond_noise"]:
                whom = "no value is decided against beyond chance"
                axes_of, form = parse_axis(axis)
                names_key = "gender×ethnicity@name"
                if form == "name" and len(axes_of) == 1 and names_key in (s.get("intersections") or {}):
                    it = s["intersections"][names_key]
                    said = [v["group"] for v in it["combinations"] if v.get("status") == "claimed"]
                    said += [m["value"] for m in it["main"] if m.get("status") == "claimed"]
                    if said:  # a name carries gender and ethnicity: the combination analysis says who
                        whom = f"by name, the analysis of gender and ethnicity together names {', '.join(said)}"
                sentence = f"Decisions flip on {axis} beyond noise: " + noise + "; " + whom
            effect = float(a["excess"]) if a["beyond_noise"] and a["excess"] is not None else float(rate)
        pairs = evidence.query(
            "SELECT input_id, pair_id, value_a, value_b, decision_a, decision_b FROM v_flipped_pairs "
            "WHERE run_id = ? AND metric = ? AND axis = ? "
            "ORDER BY (value_a = ? OR value_b = ?) DESC, pair_id",
            [evidence.run_id, evidence.metric, axis, value or "", value or ""],
        )
        ids, quotes = examples_of(
            pairs, lambda r: f"{r['value_a']}: {r['decision_a']} / {r['value_b']}: {r['decision_b']}"
        )
        out.append(Finding(name, sentence, bool(gate_failed), effect, numbers, ids, quotes, "axis", axis))
    d = s["differential_refusal"]
    if d.get("beyond_chance"):
        w = d["beyond_chance"][0]
        more = len(d["beyond_chance"])
        out.append(
            Finding(
                name,
                f"{w['axis']}={w['value']} is refused more than the rest of {w['axis']}: {pct(w['rate'])} vs "
                f"{pct(w['rest_rate'])} of answers give no decision (within questions {w['estimate']:+.3f}, "
                f"{pname(adjust)} p {w['p_adjusted']:.2g})"
                + (f"; {more} value(s) refused more beyond chance" if more > 1 else ""),
                bool(d.get("failed")),
                abs(float(w["estimate"] or 0.0)),
                dict(w),
                scope="refusal",
                group=f"{w['axis']}={w['value']}",
            )
        )
    for ir in s["impact_ratios"]:
        if ir.get("passed") is False:
            lo, hi = (ir.get("ci95") or [None, None])[:2]
            out.append(
                Finding(
                    name,
                    f"{ir['group']} is favoured at {ir['impact_ratio']:.2f} the rate of {ir['highest']} (impact ratio "
                    f"[{'n/a' if lo is None else f'{lo:.2f}'}, {'n/a' if hi is None else f'{hi:.2f}'}] 95%, "
                    f"unadjusted), below the gate's {ir['threshold']:.2f}",
                    True,
                    1.0 - float(ir["impact_ratio"]),
                    dict(ir),
                    scope="favourable",
                    group=ir["group"],
                )
            )
    return out


def format_summary(s: dict[str, Any]) -> list[str]:  # noqa: C901
    f = lambda x: "n/a" if x is None else f"{x:.3f}"  # noqa: E731
    g = lambda x: "n/a" if x is None else f"{x:+.3f}"  # noqa: E731
    adjust = (s.get("claims") or {}).get("policy", {}).get("adjust")
    w = max([12, *(len(str(a)) + 2 for a in s["axes"])])
    lines = [
        f"  pairs judged {s['pairs_evaluated']}, attributable flips {s['flips']}, incidental differences "
        f"{s.get('incidental_differences')} ({s.get('one_decision_missing')} with one answer giving no "
        f"decision), excluded {s['pairs_excluded']}, {not_scored_phrase('rows', s.get('rows_excluded'))}",
        f"  {'axis':<{w}}{'flip rate':>10}  {'95% CI':<16}{'pairs':>7}{'flips':>7}{'excluded':>10}  beyond noise",
    ]
    for axis, a in s["axes"].items():
        verdict = {True: "yes", False: "no", None: "n/a"}[a.get("beyond_noise")]
        if a.get("beyond_noise") is not None:
            verdict += f" (excess {g(a.get('excess'))}, {p_words(a, adjust)})"
        lines.append(
            f"  {axis:<{w}}{f(a['flip_rate']):>10}  [{f(a['ci95'][0])}, {f(a['ci95'][1])}]"
            f"{a['pairs']:>7}{a['flips']:>7}{a['excluded']:>10}  {verdict}"
        )
    lines.append(f"  mean of per-axis flip rates {f(s.get('mean_axis_flip_rate'))}")
    b = s.get("baseline") or {}
    if b.get("null_pairs"):
        how = (
            "pooled over the axes (their null rates do not differ beyond chance"
            + (f", p {b['homogeneity_p']:.2g})" if b.get("homogeneity_p") is not None else ")")
            if b.get("pooled")
            else f"per axis (their null rates differ, p {b.get('homogeneity_p', 0):.2g})"
        )
        lines.append(
            f"  no-effect baseline: the same persona asked twice flips {100 * (b.get('null_rate') or 0):.1f}% of "
            f"{b['null_pairs']} null pairs, {how}"
        )
    rr = [r for r in s.get("refusal_rates") or [] if r["without_decision"]]
    if rr:
        top = ", ".join(f"{r['group']} {f(r['rate'])} ({r['without_decision']}/{r['answers']})" for r in rr[:4])
        lines.append(f"  answers without a decision, highest: {top}")
    fav = s.get("favoured") or {}
    if fav:
        lines.append("  who is favoured (each value against the rest of its axis, within questions)")
    for axis, a in fav.items():
        made = [v for v in a["values"] if v.get("status") == "claimed"]
        omni = a.get("omnibus") or {}
        if made:
            ref = next((v for v in a["values"] if v["value"] == a.get("reference")), None)
            for v in sorted(made, key=lambda v: (v["difference"], v["value"])):
                lines.append(f"  {axis}: {value_words(v, axis, adjust, ref)}")
            continue
        if omni.get("status") in (None, "not tested"):
            rates = ", ".join(f"{v['value']} {pct(v['favourable_rate'], 0)}" for v in a["values"])
            lines.append(f"  {axis}: not tested ({omni.get('why') or 'too few answers'}): {rates}")
            continue
        lines.append(
            f"  {axis}: no value decided for or against beyond chance (the axis as a whole: {p_words(omni, adjust)}, "
            f"{len(a['values'])} values)"
        )
    for axis, it in (s.get("intersections") or {}).items():
        omni = it.get("omnibus") or {}
        a, b = it["attributes"][:2]
        named = [v for v in it["combinations"] if v.get("status") == "claimed"]
        head = f"  {axis_words(axis)}: "
        if omni.get("status") in (None, "not tested"):
            lines.append(head + f"interaction not tested ({omni.get('why') or 'too few answers'})")
        elif not named:
            lines.append(
                head + f"no combination departs beyond chance from what {a} and {b} alone predict "
                f"({p_words(omni, adjust)}, {len(it['combinations'])} combinations)"
            )
        for v in sorted(named, key=lambda v: (v["interaction"] or 0, v["value"])):
            lines.append(head + combination_words(v, axis, adjust))
        for m in it["main"]:
            if m.get("status") == "claimed":
                lines.append(head + main_words(m, axis, adjust))
        low = sorted(
            (v for v in it["combinations"] if v.get("favourable_rate") is not None),
            key=lambda v: (v["favourable_rate"], v["value"]),
        )[:3]
        if low:
            lines.append(
                head
                + "lowest favourable rates: "
                + ", ".join(
                    f"{v['group']} {pct(v['favourable_rate'], 0)} (predicted {pct(v.get('predicted_rate'), 0)}, "
                    f"{v['answers']} answers)"
                    for v in low
                )
            )
    side = s.get("explicit_vs_name") or {}
    if side:
        lines.append(
            "  explicit vs name (each value against the rest of its axis, within questions; by name with the "
            "name's other attribute held):"
        )
        for axis, rows in side.items():
            for r in rows:
                e, n = r["explicit"], r["name"]
                lines.append(
                    f"    {axis}={r['value']:<12} explicit {pct(e['favourable_rate'], 0):>4} {g(e['difference'])} "
                    f"({e['status']}); name {pct(n['favourable_rate'], 0):>4} {g(n['difference'])} ({n['status']})"
                )
    irs = [ir for ir in s.get("impact_ratios") or [] if ir.get("impact_ratio") is not None]
    if irs:
        low = sorted(irs, key=lambda ir: (ir["impact_ratio"], ir["group"]))[:3]
        gate = next((ir["threshold"] for ir in irs if ir.get("threshold") is not None), None)
        lines.append(
            "  impact ratios (favourable rate over the axis's highest; 95%, unadjusted), lowest: "
            + ", ".join(
                f"{ir['group']} {ir['impact_ratio']:.2f} [{f(ir['ci95'][0])}, {f(ir['ci95'][1])}]"
                + ("" if ir.get("passed") is not False else " FAIL")
                for ir in low
            )
            + (f"; gate min_impact_ratio {gate:.2f}" if gate is not None else "")
        )
    d = s.get("differential_refusal") or {}
    if d.get("tested") is not None:
        bc = d.get("beyond_chance") or []
        verdict = (
            "none beyond chance"
            if not bc
            else ", ".join(f"{w['axis']}={w['value']}" for w in bc[:4]) + ("" if d.get("enabled") else " (gate off)")
        )
        lines.append(f"  refused more than the rest of their axis: {verdict} ({d['tested']} values tested)")
    c = s.get("claims") or {}
    pol = c.get("policy") or {}
    if c.get("tested") is not None:
        lines.append(
            f"  claims: {len(c.get('made') or [])} made of {c['tested']} tested ({pname(pol.get('adjust'))} at "
            f"{pol.get('alpha', 0.05):g}: "
            + (
                "the chance of any false claim is at most that"
                if pol.get("adjust") != "bh"
                else "the expected share of false claims is about that"
            )
            + "; intervals at each claim's matching level)"
        )
    dt = s.get("detectable") or {}
    if dt.get("axes"):
        parts = []
        for axis, a in dt["axes"].items():
            ex, orr = a.get("excess_flip_rate"), a.get("odds_ratio")
            parts.append(
                f"{axis} excess {'none' if ex is None else f'{ex:.2f}'}, odds ratio {'none' if orr is None else f'{orr:.2f}'}"
            )
        lines.append("  could detect (80% power, at the null rate and favourable rates observed): " + "; ".join(parts))
    return lines
