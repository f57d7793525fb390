"""What a decision flip run can detect (``analysis.power``): planned from the synthesised design
before the run (``aip-eval run --dry-run``; a warning before the first SUT call when a threshold asks
for less than the run can show) and said again after it from what it observed."""

from __future__ import annotations

from typing import Any

import pandas as pd

from ...analysis.claims import Policy
from ...analysis.power import mde_rate_drop, mde_rate_excess, odds_ratio_of_drop
from ...catalog.groups import CROSS
from ...gate import axis_threshold
from ...records import RunNote
from ..base import StageContext

NULL_RATE_ASSUMED = 0.1  # planning: the share of null pairs (one persona asked twice) whose decisions flip
FAVOURABLE_ASSUMED = 0.5  # planning: the favourable rate of a question
# planning: answers a combination needs for an interaction the size of a directional flip at 0.9 to be named in
# most runs (benchmarks/bench_intersections.py)
MIN_PER_COMBINATION = 20


def policy_of(ctx: StageContext) -> Policy:
    p = getattr(ctx.spec, "claims", None)
    return Policy(p.adjust, p.alpha) if p is not None else Policy()


def entry_of(ctx: StageContext):
    return ctx.spec.metrics.get(ctx.metric) if ctx.spec is not None else None


def detectable(answers: pd.DataFrame, pairs: pd.DataFrame, m: int, alpha: float, observed: bool) -> dict[str, Any]:
    """Per axis, the smallest excess flip rate and the smallest drop in one value's favourable rate
    (and its odds ratio) the run detects with 80% power at Holm's first step (alpha / m), from its
    counts: planned (assumed rates) or observed (the rates it measured)."""
    out: dict[str, Any] = {"alpha": alpha, "claims": m, "observed": observed, "axes": {}}
    nulls = pairs[pairs["kind"] == "null"]
    # observed: the null pairs' rate, at least half a flip among them (a rate of 0 is no evidence of none)
    p0 = max(float(nulls["flip"].mean()), 0.5 / len(nulls)) if observed and len(nulls) else NULL_RATE_ASSUMED
    out["null_rate"] = p0
    for axis, g in pairs[pairs["kind"] != "null"].groupby("axis", sort=True):
        a = answers[(answers["axis"] == axis)]
        if observed:
            a = a.dropna(subset=["favourable"])
        per_value = a.groupby("value").size()
        n_v = int(per_value.median()) if len(per_value) else 0
        fav = (
            float(a["favourable"].mean())
            if observed and len(a) and a["favourable"].notna().any()
            else FAVOURABLE_ASSUMED
        )
        drop = mde_rate_drop(n_v, max(0, len(a) - n_v), fav, alpha, m)
        out["axes"][str(axis)] = {
            "pairs": int(len(g)),
            "null_pairs": int(len(nulls)),
            "excess_flip_rate": mde_rate_excess(int(len(g)), int(len(nulls)), p0, alpha, m),
            "answers_per_value": n_v,
            "favourable_rate": fav,
            "favourable_drop": drop,
            "odds_ratio": odds_ratio_of_drop(fav, drop),
        }
    return out


def plan(ctx: StageContext) -> dict[str, Any]:
    """What the planned run can detect (``aip-eval run --dry-run``; warnings before the first SUT
    call): from the synthesised probes and pairs, assuming one persona asked twice flips
    NULL_RATE_ASSUMED of the time and questions are favourable half the time; each at the level a
    claim clears at Holm's first step over the planned claims."""
    policy = policy_of(ctx)
    entry = entry_of(ctx)
    probes = ctx.read("probes", None, ["input_id", "axis", "attribute_value", "role"])
    pp = ctx.read("probe_pairs", None, ["input_id", "axis", "kind"])
    probes = probes[probes["role"] == "persona"] if len(probes) else probes
    answers = pd.DataFrame(
        {
            "axis": probes["axis"].to_numpy(),
            "value": probes["attribute_value"].to_numpy(),
            "question": probes["input_id"].to_numpy(),
            "state": "decision",
            "no_decision": 0.0,
            "favourable": float("nan"),
        }
    )
    pairs = pd.DataFrame({"axis": pp["axis"], "row": pp["input_id"], "kind": pp["kind"].fillna("persona"), "flip": 0.0})
    axes = sorted(set(pairs.loc[pairs["kind"] != "null", "axis"]))
    m = len(axes) + 2 * sum(1 + answers.loc[answers["axis"] == a, "value"].nunique() for a in axes)
    can = detectable(answers, pairs, m, policy.alpha, observed=False)
    warnings: list[RunNote] = []
    thr = axis_threshold(entry, ctx.threshold)
    if not int((pairs["kind"] == "null").sum()) and axes:
        warnings.append(
            {
                "level": "warning",
                "code": "no_baseline",
                "message": "llm.decision_flip: no null pairs (baseline_share 0, or sut_temperature 0): flips cannot be "
                "told from instability, so no flip will be claimed beyond noise",
            }
        )
    elif thr is not None:
        weak = {
            axis: a
            for axis, a in can["axes"].items()
            if a["excess_flip_rate"] is None or a["excess_flip_rate"] > 1 - thr
        }
        if weak:
            shown = ", ".join(
                f"{axis} {'none' if a['excess_flip_rate'] is None else format(a['excess_flip_rate'], '.2f')}"
                for axis, a in weak.items()
            )
            warnings.append(
                {
                    "level": "warning",
                    "code": "underpowered",
                    "message": f"llm.decision_flip: axis_threshold {thr:.2f} fails an axis whose flip rate is above "
                    f"{1 - thr:.2f}, but this run shows flips beyond noise only from a larger excess ({shown}; 80% "
                    f"power, assuming one persona asked twice flips {NULL_RATE_ASSUMED:.0%}): an axis that fails may "
                    "be instability the run cannot tell from bias; more rows or a larger baseline_share narrow it",
                }
            )
    w = max([12, *(len(str(a)) + 2 for a in can["axes"])])
    lines = [
        f"  {'axis':<{w}}{'pairs':>7}{'null pairs':>12}{'excess flip rate':>18}{'answers/value':>15}{'odds ratio':>12}"
    ]
    for axis, a in can["axes"].items():
        ex, orr = a["excess_flip_rate"], a["odds_ratio"]
        lines.append(
            f"  {axis:<{w}}{a['pairs']:>7}{a['null_pairs']:>12}{'none' if ex is None else f'{ex:.3f}':>18}"
            f"{a['answers_per_value']:>15}{'none' if orr is None else f'{orr:.2f}':>12}"
        )
    for axis in sorted({a for a in answers["axis"] if CROSS in str(a)}):
        per = answers[answers["axis"] == axis].groupby("value").size()
        lines.append(
            f"  {axis}: {len(per)} combinations, {int(per.min())}-{int(per.max())} answers each (median "
            f"{int(per.median())}); a combination's interaction is told from its attributes' within questions"
        )
        if int(per.median()) < MIN_PER_COMBINATION:
            warnings.append(
                {
                    "level": "warning",
                    "code": "underpowered",
                    "message": f"llm.decision_flip: intersection {axis}: a combination gets {int(per.median())} answers "
                    f"(median) in this run, too few to name one treated worse unless the effect is large (at least "
                    f"{MIN_PER_COMBINATION} each: more rows, or fewer values in the intersection's axes)",
                }
            )
    return {**can, "lines": lines, "warnings": warnings, "claims_planned": m}
