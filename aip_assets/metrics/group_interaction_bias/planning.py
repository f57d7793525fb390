"""Group interaction bias's planning: what a planned run can detect (``aip-eval run --dry-run``),
from its pool and pairs before the first SUT call, and the warnings it gives."""

from __future__ import annotations

from typing import Any

import pandas as pd

from ...analysis.power import mde_coefficients
from ...gate import group_threshold
from ..base import StageContext
from .aggregate import persona_attributes, policy_of

BIAS_SD_ASSUMED = 0.25  # planning: the spread of a pair's bias around its expectation


def plan(ctx: StageContext) -> dict[str, Any] | None:
    """What the planned run can detect (``aip-eval run --dry-run``; warnings before the first SUT
    call): per attribute value, the smallest gap the planned pairs detect with 80% power, assuming a
    pair's bias spreads BIAS_SD_ASSUMED around its expectation; the values the pool cannot tell
    apart."""
    import numpy as np

    policy = policy_of(ctx)
    entry = ctx.spec.metrics.get(ctx.metric) if ctx.spec is not None else None
    personas = ctx.read("personas")
    attrs = persona_attributes(ctx, personas)
    pp = ctx.read("probe_pairs", None, ["input_id", "value_a", "value_b", "kind"])
    if not len(pp):
        return None
    pairs = pd.DataFrame(
        {
            "row": pp["input_id"],
            "kind": pp["kind"].fillna("persona"),
            "persona_a": pp["value_a"],
            "persona_b": pp["value_b"],
            "bias": 0.0,
        }
    )
    from ...analysis.fairness import straddle_columns

    cols, _ = straddle_columns(pairs, attrs)
    names = list(cols)
    axes = {k.split("=", 1)[0] for k in names}
    m = 1 + len(axes) + len(names)
    mde = mde_coefficients(
        np.stack([cols[k] for k in names], axis=1), pairs["row"].to_numpy(), BIAS_SD_ASSUMED, policy.alpha, m
    )
    per = dict(zip(names, mde))
    found = [v for v in per.values() if v is not None]
    inseparable = [k for k, v in per.items() if v is None]
    warnings: list[dict[str, Any]] = []
    if inseparable:
        warnings.append(
            {
                "level": "warning",
                "code": "inseparable",
                "message": f"llm.group_interaction_bias: {len(inseparable)} attribute value(s) cannot be told apart from "
                f"others in this run's pool and pairs ({', '.join(inseparable[:6])}{', ...' if len(inseparable) > 6 else ''}): "
                "they are reported as such and never gated; a larger persona_pool_size (24 or more; 48 or more with "
                "intersections, whose combinations are values too) separates them",
            }
        )
    thr = group_threshold(entry, ctx.threshold)
    weak = {k: v for k, v in per.items() if v is not None and thr is not None and v > 1 - thr}
    if weak and thr is not None:
        warnings.append(
            {
                "level": "warning",
                "code": "underpowered",
                "message": f"llm.group_interaction_bias: group_threshold {thr:.2f} fails a group whose pairs' bias is above "
                f"{1 - thr:.2f}, but this run shows a group less equitable beyond chance only from a gap of "
                f"{max(weak.values()):.2f} for {len(weak)} value(s) ({', '.join(list(weak)[:4])}{', ...' if len(weak) > 4 else ''}; "
                f"80% power, assuming a pair's bias spreads {BIAS_SD_ASSUMED}): more rows or num_pairs narrow it",
            }
        )
    lines = [
        f"  group gap (80% power, bias spread {BIAS_SD_ASSUMED} assumed): median value "
        + ("n/a" if not found else f"{float(np.median(found)):.3f}, least measured {max(found):.3f}")
        + (f"; {len(inseparable)} value(s) cannot be told apart" if inseparable else "")
    ]
    return {
        "alpha": policy.alpha,
        "claims": m,
        "observed": False,
        "bias_sd": BIAS_SD_ASSUMED,
        "gap": per,
        "median_gap": float(np.median(found)) if found else None,
        "largest_gap": max(found) if found else None,
        "inseparable": inseparable,
        "lines": lines,
        "warnings": warnings,
    }
