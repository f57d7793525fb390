"""Decision flip's findings and its summary's lines in the terminal, each from the summary
(``words.summary``, read from the stored claims) in the words ``words.py`` phrases them with, so
the gate's reason, the findings, the report and ``--json`` state the same decisions."""

from __future__ import annotations

from typing import Any

import pandas as pd

from ...catalog.groups import axis_words, parse_axis
from ..words import Evidence, Finding, examples_of, not_scored_phrase, pct
from .words import ci_words, combination_words, main_words, p_words, pname, summary, value_words


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
