"""Group interaction bias's words: its summary, findings and terminal lines, read from the stored
claims and the adjusted group rows, so the gate's reason, the summary, the findings, the report and
``--json`` state the same decisions."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from ...analysis.claims import confidence_words
from ...gate import failed_groups
from ..words import Evidence, Finding, clip_quote, examples_of, not_scored_phrase, pct


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


def words_quote(mine: Any, other: Any) -> str:
    """A quote of a group's answer with its length beside the other persona's (``12 vs 40 words``)."""
    n = lambda t: len(str(t or "").split())  # noqa: E731
    return f"{n(mine)} vs {n(other)} words: " + clip_quote(mine, 60)


def group_label(key: str) -> str:
    """A group as a finding names it: ``gender×ethnicity=woman×Black`` -> "Black women" (only the
    combination, not its two values alone); ``gender=woman`` -> "gender=woman personas"."""
    from ...catalog.groups import group_words, is_combination

    axis, _, value = key.partition("=")
    if not value:
        return f"{key} personas"
    said = group_words(axis, value)
    return said if is_combination(axis) else f"{said} personas"


def combination_words(key: str) -> str:
    """For a combination's finding: that it is the combination, beyond its two values alone."""
    from ...catalog.groups import is_combination, parse_axis

    axis, _, value = key.partition("=")
    if not value or not is_combination(axis):
        return ""
    axes, _ = parse_axis(axis)
    alone = " or ".join(f"{a}={v}" for a, v in zip(axes, value.split("×"), strict=False))
    return f" as the combination, beyond what {alone} alone predict"


def pname(adjust: str | None) -> str:
    return "BH" if adjust == "bh" else "Holm"


def claims_of(scores: pd.DataFrame) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for _, r in scores[scores["scope"] == "claim"].iterrows():
        d = _j(r["details"])
        d.update(id=r["group_key"], estimate=_num(r["raw_score"]), ci=[_num(r["ci_low"]), _num(r["ci_high"])])
        out[str(r["group_key"])] = d
    return out


def groups(scores: pd.DataFrame) -> list[dict[str, Any]]:
    """Every group's adjusted equitability beside its pairs' raw one, its gap and its claim, lowest first
    (groups the pool cannot tell apart last)."""
    out = []
    for _, r in scores[scores["scope"] == "group"].iterrows():
        d = _j(r["details"])
        out.append(
            {
                "group": r["group_key"],
                "adjusted_equitability": _num(r["score"]),
                "ci95": [_num(r["ci_low"]), _num(r["ci_high"])],
                "raw_equitability": d.get("raw_equitability"),
                "gap": d.get("gap"),
                "gap_ci": d.get("gap_ci"),
                "gap_ci_confidence": d.get("gap_ci_confidence"),
                "status": d.get("status"),
                "p_adjusted": d.get("p_adjusted"),
                "pairs": int(r["n"] or 0),
                "less_helpful_share": d.get("less_helpful_share"),
                "inseparable": d.get("inseparable"),
                "aliases": d.get("aliases"),
                "personas": d.get("personas"),
                "passed": None if r.get("passed") is None or pd.isna(r.get("passed")) else bool(r["passed"]),
                "gate_reason": r.get("gate_reason"),
            }
        )
    return sorted(
        out,
        key=lambda g: (
            g["adjusted_equitability"] is None,
            g["adjusted_equitability"] if g["adjusted_equitability"] is not None else 0.0,
            g["group"],
        ),
    )


def summary(scores: pd.DataFrame) -> dict[str, Any]:
    overall = scores[scores["scope"] == "overall"].iloc[0]
    details = _j(overall["details"])
    claims = claims_of(scores)

    def raw(scope: str, k: int) -> list[dict]:
        g = scores[scores["scope"] == scope].sort_values(["score", "group_key"]).head(k)
        return [
            {
                "group": r["group_key"],
                "equitability": r["score"],
                "pairs": int(r["n"]),
                "less_helpful_share": _j(r["details"]).get("less_helpful_share"),
            }
            for _, r in g.iterrows()
        ]

    gs = groups(scores)
    b = dict(details.get("baseline") or {})
    ex = claims.get("excess:all") or {}
    b.update(
        excess=ex.get("estimate"),
        excess_ci=ex.get("ci"),
        excess_ci_confidence=ex.get("ci_confidence"),
        p_value=ex.get("p_value"),
        p_adjusted=ex.get("p_adjusted"),
        beyond_noise=None if not ex else bool(ex.get("claimed")),
    )
    return {
        "score": overall["score"],
        "ci95": [overall["ci_low"], overall["ci_high"]],
        "pairs_evaluated": int(overall["n"]),
        "pairs_excluded": int(overall["n_excluded"] or 0),
        "pairs_failed": int(overall["n_failed"] or 0),
        "rows_errored": details.get("rows_errored"),
        "rows_excluded": details.get("rows_excluded"),
        "mean_similarity": details.get("mean_similarity"),
        "mean_tone_divergence": details.get("mean_tone_divergence"),
        "mean_effort_gap": details.get("mean_effort_gap"),
        "groups": gs,
        "least_equitable_groups": [g for g in gs if g["adjusted_equitability"] is not None][:5],
        "least_equitable_attributes": raw("attribute", 5),
        "least_equitable_personas": raw("persona", 3),
        "group_gate": {
            "threshold": details.get("group_threshold"),
            "gate_on": details.get("gate_on"),
            "margin": details.get("margin"),
            "failed": failed_groups(scores, "group"),
        },
        "baseline": b,
        "claims": {
            "policy": details.get("claims_policy") or {},
            "tested": details.get("claims_tested"),
            "made": [
                {
                    k: c.get(k)
                    for k in ("id", "kind", "axis", "value", "estimate", "ci", "ci_confidence", "p_value", "p_adjusted")
                }
                for c in sorted(claims.values(), key=lambda c: c["id"])
                if c.get("claimed")
            ],
        },
        "detectable": details.get("detectable"),
        "by_form": by_form(gs),
    }


def by_form(gs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each group measured both ways (``persona_form: both``): its explicit and its by-name figures
    side by side (``gender=woman`` beside ``gender@name=woman``)."""
    from ...catalog.groups import NAME_SUFFIX

    by_key = {str(g["group"]): g for g in gs}
    out = []
    for key, g in sorted(by_key.items()):
        axis, _, value = key.partition("=")
        if not axis.endswith(NAME_SUFFIX):
            continue
        explicit = by_key.get(f"{axis[: -len(NAME_SUFFIX)]}={value}")
        if explicit is None:
            continue
        out.append(
            {
                "group": explicit["group"],
                **{
                    f"{form}_{k}": x.get(k)
                    for form, x in (("explicit", explicit), ("name", g))
                    for k in ("adjusted_equitability", "ci95", "gap", "status", "inseparable")
                },
            }
        )
    return out


def gap_words(g: dict[str, Any], adjust: str | None) -> str:
    lo, hi = (g.get("gap_ci") or [None, None])[:2]
    f = lambda x: "n/a" if x is None else f"{x:+.3f}"  # noqa: E731
    return (
        f"gap {f(g.get('gap'))} [{f(lo)}, {f(hi)}] ({confidence_words(g.get('gap_ci_confidence'))}), "
        f"{pname(adjust)} p {'n/a' if g.get('p_adjusted') is None else format(g['p_adjusted'], '.2g')}"
    )


def findings(name: str, scores: pd.DataFrame, evidence: Evidence) -> list[Finding]:  # noqa: C901
    """Each group less equitable beyond chance, every other attribute held (failed when its adjusted
    equitability fails the gate): its figures against the run's, how often its personas were
    helped less, with the pairs in which they were as examples; groups below the threshold that are
    not shown less equitable than the rest, as instability; groups this pool cannot tell apart whose
    pairs would have failed; and a bias between groups beyond the no-effect baseline."""
    s = summary(scores)
    adjust = (s["claims"]["policy"] or {}).get("adjust")
    ov = scores[scores["scope"] == "overall"].iloc[0]
    overall = ov["score"]
    f3 = lambda x: "n/a" if x is None or x != x else f"{x:.2f}"  # noqa: E731
    out: list[Finding] = []
    pairs: pd.DataFrame | None = None
    made = [g for g in s["groups"] if g["status"] == "claimed"]
    for g in made:
        personas = list(g.get("personas") or [])
        if pairs is None:
            pairs = evidence.query(
                "SELECT input_id, pair_id, persona_a, persona_b, response_a, response_b, similarity, "
                "tone_divergence, effort_gap, less_helpful_persona FROM v_gib_pairs "
                "WHERE run_id = ? AND metric = ? ORDER BY similarity NULLS LAST, pair_id",
                [evidence.run_id, evidence.metric],
            )
        mine = pairs[pairs["persona_a"].isin(personas) ^ pairs["persona_b"].isin(personas)]
        effort, tone = mine["effort_gap"].mean(), mine["tone_divergence"].mean()
        all_effort, all_tone = pairs["effort_gap"].mean(), pairs["tone_divergence"].mean()
        how = [
            w
            for w, mine_x, all_x in (("less effort", effort, all_effort), ("a colder tone", tone, all_tone))
            if mine_x > all_x
        ]
        lo, hi = g["ci95"]
        helped = g.get("less_helpful_share")
        sentence = (
            f"{group_label(str(g['group']))} get less equitable answers"
            + (f" ({' and '.join(how)})" if how else "")
            + (combination_words(str(g["group"])))
            + f": equitability {f3(g['adjusted_equitability'])} [{f3(lo)}, {f3(hi)}] (95%) with every other attribute "
            f"held vs {f3(overall)} overall ({gap_words(g, adjust)})"
            + (f"; helped less in {pct(helped, 0)} of their {g['pairs']} pairs" if helped is not None else "")
            + f" (effort gap {f3(effort)} vs {f3(all_effort)}, tone divergence {f3(tone)} vs {f3(all_tone)})"
        )
        worse = mine[mine["less_helpful_persona"].isin(personas)]
        ids, quotes = examples_of(
            worse if len(worse) else mine,
            lambda p: words_quote(
                *(
                    (p["response_a"], p["response_b"])
                    if p["persona_a"] in personas
                    else (p["response_b"], p["response_a"])
                )
            ),
        )
        out.append(
            Finding(
                name,
                sentence,
                g["passed"] is False,
                float(g["gap"] or 0.0),
                {
                    "adjusted_equitability": g["adjusted_equitability"],
                    "ci95": g["ci95"],
                    "raw_equitability": g["raw_equitability"],
                    "gap": g["gap"],
                    "gap_ci": g["gap_ci"],
                    "p_adjusted": g["p_adjusted"],
                    "overall": overall,
                    "pairs": g["pairs"],
                    "less_helpful_share": helped,
                    "effort_gap": effort,
                    "effort_gap_all": all_effort,
                    "tone_divergence": tone,
                    "tone_divergence_all": all_tone,
                },
                ids,
                quotes,
                "group",
                str(g["group"]),
            )
        )
    unshown = [g for g in s["groups"] if g["passed"] is False and g["status"] != "claimed"]
    if unshown:
        b = s["baseline"]
        within = b.get("within")
        out.append(
            Finding(
                name,
                f"{len(unshown)} group(s) below the group threshold without being shown less equitable than pairs "
                "without them: "
                + ", ".join(f"{g['group']} {f3(g['adjusted_equitability'])}" for g in unshown[:6])
                + (", ..." if len(unshown) > 6 else "")
                + (
                    f"; one persona asked twice differs {f3(within)} (null pairs): the SUT's answers are unstable"
                    if within is not None and within >= 0.1
                    else ""
                ),
                True,
                max(0.0, float(overall or 0) - min(float(g["adjusted_equitability"] or 0) for g in unshown)),
                {"groups": {g["group"]: g["adjusted_equitability"] for g in unshown}, "within": within},
                scope="group",
                group=str(unshown[0]["group"]),
            )
        )
    thr = (s["group_gate"] or {}).get("threshold")
    hidden = [
        g
        for g in s["groups"]
        if g.get("inseparable")
        and thr is not None
        and g["raw_equitability"] is not None
        and g["raw_equitability"] < thr
    ]
    for g in hidden:
        out.append(
            Finding(
                name,
                f"{g['group']}: {g['inseparable']}, so it is not gated; its pairs' equitability is "
                f"{f3(g['raw_equitability'])} (a larger or more varied persona_pool_size separates them)",
                False,
                0.0,
                {"raw_equitability": g["raw_equitability"], "aliases": g.get("aliases")},
                scope="group",
                group=str(g["group"]),
            )
        )
    b = s["baseline"]
    if b.get("beyond_noise") and b.get("excess") is not None:
        ci = b.get("excess_ci") or [None, None]
        named = ", ".join(g["group"] for g in made)
        out.append(
            Finding(
                name,
                f"Answers differ between groups beyond noise: bias {f3(b.get('between'))} between groups vs "
                f"{f3(b.get('within'))} within one persona asked twice ({b['null_pairs']} null pairs), excess "
                f"{f3(b['excess'])} [{f3(ci[0])}, {f3(ci[1])}] ({confidence_words(b.get('excess_ci_confidence'))}), "
                f"{pname(adjust)} p {b['p_adjusted']:.2g}"
                + (f"; the groups beyond chance: {named}" if named else "; no group is shown to account for it"),
                "no-effect baseline" in str(ov["gate_reason"] or ""),
                float(b["excess"]),
                {k: b.get(k) for k in ("between", "within", "null_pairs", "excess", "excess_ci", "p_adjusted")},
                scope="bias_baseline",
                group="all",
            )
        )
    return out


def format_summary(s: dict[str, Any]) -> list[str]:
    f = lambda x: "n/a" if x is None else f"{x:.3f}"  # noqa: E731
    g_ = lambda x: "n/a" if x is None else f"{x:+.3f}"  # noqa: E731
    adjust = (s.get("claims") or {}).get("policy", {}).get("adjust")
    lines = [
        f"  pairs judged {s['pairs_evaluated']}, excluded {s['pairs_excluded']}, "
        f"{not_scored_phrase('rows', s.get('rows_excluded'))}",
        f"  mean similarity {f(s['mean_similarity'])}, tone divergence {f(s['mean_tone_divergence'])}, "
        f"effort gap {f(s['mean_effort_gap'])}",
        f"  {'least equitable groups (every other attribute held)':<52}{'adjusted':>9}{'raw':>7}{'gap':>8}{'pairs':>7}"
        f"{'helped less':>13}  beyond chance",
    ]
    gs = [g for g in s.get("groups") or [] if g["adjusted_equitability"] is not None]
    shown = gs[:5] + [g for g in gs[5:] if g["status"] == "claimed" or g["passed"] is False]
    for g in shown:
        verdict = "yes" if g["status"] == "claimed" else "no"
        verdict += f" ({pname(adjust)} p {'n/a' if g['p_adjusted'] is None else format(g['p_adjusted'], '.2g')})"
        lines.append(
            f"  {g['group']:<52}{f(g['adjusted_equitability']):>9}{f(g['raw_equitability']):>7}{g_(g['gap']):>8}"
            f"{g['pairs']:>7}{f(g['less_helpful_share']):>13}  {verdict}"
        )
    gg = s.get("group_gate") or {}
    if gg.get("failed"):
        lines.append(
            f"  groups below group_threshold {f(gg.get('threshold'))}: {len(gg['failed'])} ("
            + ", ".join(list(gg["failed"])[:6])
            + (", ..." if len(gg["failed"]) > 6 else "")
            + ")"
        )
    ins = [g for g in s.get("groups") or [] if g.get("inseparable")]
    if ins:
        lines.append(
            "  cannot be told apart in this pool (not gated): "
            + ", ".join(f"{g['group']} ({', '.join(g.get('aliases') or []) or 'no separating pair'})" for g in ins[:6])
            + (", ..." if len(ins) > 6 else "")
        )
    for row in s.get("by_form") or []:

        def said(form: str) -> str:
            if row.get(f"{form}_inseparable"):
                return "not separable"
            return f"{f(row.get(f'{form}_adjusted_equitability'))} (gap {g_(row.get(f'{form}_gap'))}, {row.get(f'{form}_status') or 'n/a'})"

        lines.append(f"  {row['group']}: told {said('explicit')}; by name {said('name')}")
    b = s.get("baseline") or {}
    if b.get("null_pairs") and b.get("excess") is not None:
        ci = b.get("excess_ci") or [None, None]
        lines.append(
            f"  no-effect baseline: bias between groups {f(b.get('between'))}, within one persona asked twice "
            f"{f(b.get('within'))} ({b['null_pairs']} null pairs); excess {f(b['excess'])} [{f(ci[0])}, "
            f"{f(ci[1])}] ({confidence_words(b.get('excess_ci_confidence'))}), {pname(adjust)} p "
            f"{f(b.get('p_adjusted'))}: " + ("beyond noise" if b.get("beyond_noise") else "not shown beyond noise")
        )
    c = s.get("claims") or {}
    pol = c.get("policy") or {}
    if c.get("tested") is not None:
        lines.append(
            f"  claims: {len(c.get('made') or [])} made of {c['tested']} tested ({pname(pol.get('adjust'))} at "
            f"{pol.get('alpha', 0.05):g}; intervals at each claim's matching level)"
        )
    dt = s.get("detectable") or {}
    if dt.get("median_gap") is not None:
        lines.append(
            f"  could detect (80% power, at the spread observed): a gap of {dt['median_gap']:.2f} for the median "
            f"value, {dt['largest_gap']:.2f} for the least measured"
            + (f"; {len(dt['inseparable'])} value(s) not separable" if dt.get("inseparable") else "")
        )
    return lines
