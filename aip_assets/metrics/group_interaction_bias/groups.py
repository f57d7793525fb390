"""Group interaction bias's groups: per attribute value (per persona when the personas carry
none), its adjusted equitability row (scope ``group``) beside its raw equitability, its gap and its
claim's decision; and the group gate that holds each separable value to the threshold (or, with
gate_on equivalence, its gap within the margin), in the words every place uses."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from ...analysis.claims import Claim, Policy, confidence_words
from ...stats import normalise
from ..words import num


def pname(adjust: str) -> str:
    return "BH" if adjust == "bh" else "Holm"


def gap_words(c: Claim | None, null_level: float | None, adjust: str) -> str:
    """Whether a group's pairs are less equitable than pairs without it beyond chance, in the words
    every place uses."""
    if c is None:
        return "its gap not tested"
    if c.why is not None:
        return f"not tested: {c.why}"
    gap = (
        f"gap {c.estimate:+.3f} [{num(c.ci[0], '+.3f')}, {num(c.ci[1], '+.3f')}] ({confidence_words(c.ci_confidence)})"
    )
    if c.claimed:
        return f"less equitable than pairs without it beyond chance: {gap}, {pname(adjust)} p {c.p_adjusted:.2g}"
    unstable = (
        f"; one persona asked twice differs {null_level:.3f}: the SUT's answers are unstable"
        if null_level is not None and null_level >= 0.1
        else ""
    )
    return f"not shown less equitable than pairs without it ({gap}, {pname(adjust)} p {c.p_adjusted:.2g}){unstable}"


def group_rows(
    cfg, levels: dict[str, dict[str, Any]], by_id: dict[str, Claim], pairs: pd.DataFrame, attrs, null_level
) -> list[dict]:
    """Per attribute value (per persona when the personas carry none), its adjusted equitability: 1 -
    the mean bias of the pairs that straddle it (one persona holds it, the other does not) with every
    other value's estimated contribution taken out (scope ``group``, 95% interval, unadjusted: the
    gate's figure), beside the same pairs' raw equitability, the share of them in which its persona
    was helped less, its gap and its claim's decision; a value the pool cannot tell apart from another
    has none."""
    norm = lambda x: normalise(x, cfg.min, cfg.max, cfg.inverted)  # noqa: E731
    real = pairs[pairs["kind"] != "null"]
    rows = []
    for key, lv in sorted(levels.items()):
        c = by_id.get(f"group:{key}")
        level = lv.get("level")
        eq = None if level is None else 1.0 - level
        lo = hi = None
        if level is not None:
            lo, hi = 1.0 - lv["ci95"][1], 1.0 - lv["ci95"][0]
        axis, val = key.split("=", 1)
        members = [p for p, a in attrs.items() if str(a.get(axis)) == val] if axis != "persona" else [val]
        holds_a, holds_b = real["persona_a"].isin(members), real["persona_b"].isin(members)
        mine = real[holds_a != holds_b]  # the pairs that straddle the value: what its figures rest on
        held = mine["less_helpful"].isin(members)
        rows.append(
            {
                "metric_name": cfg.metric_name,
                "scope": "group",
                "group_key": key,
                "raw_score": eq,
                "score": norm(eq),
                "ci_low": norm(lo),
                "ci_high": norm(hi),
                "n": int(len(mine)),
                "weight": cfg.weight,
                "details": json.dumps(
                    {
                        "adjusted_equitability": eq,
                        "raw_equitability": norm(1.0 - float(mine["bias"].mean())) if len(mine) else None,
                        "gap": None if c is None else c.estimate,
                        "gap_ci": None if c is None else list(c.ci),
                        "gap_ci_confidence": None if c is None else c.ci_confidence,
                        "claim": f"group:{key}",
                        "status": None if c is None else c.status,
                        "p_adjusted": None if c is None else c.p_adjusted,
                        "inseparable": lv.get("inseparable"),
                        "aliases": lv.get("aliases"),
                        "personas": members,
                        "less_helpful_share": float(held.mean()) if len(mine) else None,
                        "null_level": null_level,
                    },
                    ensure_ascii=False,
                ),
            }
        )
    return rows


def group_gate(
    rows: list[dict], by_id: dict[str, Claim], threshold: float | None, on: str, margin, policy: Policy, null_level
) -> list[str]:
    """Hold every separable group to the threshold on its adjusted equitability (point, or its 95%
    lower end with gate_on interval), or, with gate_on equivalence, its gap within ``margin`` (a
    one-sided test at alpha: the upper end of its 1 - 2 alpha interval; a gap below zero is no bias); each reason says whether the
    group is less equitable beyond chance. A group the pool cannot tell apart is not gated."""
    failures: list[str] = []
    for r in rows:
        d = json.loads(r["details"])
        c = by_id.get(f"group:{r['group_key']}")
        if d.get("inseparable"):
            r.update(threshold=None, passed=None, gate_reason=f"{d['inseparable']}: not gated")
            continue
        words = gap_words(c, null_level, policy.adjust)
        if on == "equivalence":
            hi = c.test.bound(policy.alpha, lower=False) if c is not None and c.test is not None else None
            lo = c.test.bound(policy.alpha, lower=True) if c is not None and c.test is not None else None
            shown = f"gap {num(c.estimate if c else None, '+.3f')}, {100 * (1 - 2 * policy.alpha):.0f}% interval [{num(lo, '+.3f')}, {num(hi, '+.3f')}]"
            if hi is not None and hi <= margin:
                r.update(passed=True, gate_reason=f"{shown} within the margin {margin:.3f}: no bias beyond it")
                if c is not None:
                    c.facts["equivalent"] = True
                continue
            why = f"{r['group_key']}: {shown}: not shown within the margin {margin:.3f} (its upper end: a one-sided test at {policy.alpha:g})"
            r.update(passed=False, gate_reason=why)
            failures.append(why)
            continue
        if threshold is None:
            continue
        score, lo = r.get("score"), r.get("ci_low")
        held = score if on == "point" else lo
        shown = f"adjusted equitability {num(score)} [{num(lo)}, {num(r.get('ci_high'))}]" + (
            "" if on == "point" else f" (95% lower end {num(lo)})"
        )
        if held is None:
            why = f"{r['group_key']}: no adjusted equitability"
        elif held < threshold:
            why = f"{r['group_key']}: {shown} below {threshold:.3f}; {words}"
        else:
            r.update(threshold=threshold, passed=True, gate_reason=f"{shown} at least {threshold:.3f}; {words}")
            continue
        r.update(threshold=threshold, passed=False, gate_reason=why)
        failures.append(why)
    return failures
