"""Decision flip's counts and rates: the running counts per axis (pairs judged, flips, exclusions
by reason) and the descriptive rate rows, each with its Wilson 95% interval: the no-effect
baseline pooled and per axis, and per axis value its answers without a decision (``refusal``)
and its favourable decisions (``favourable``), each with its claim's decision."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from ...analysis.claims import Claim
from ...catalog.groups import parse_axis
from ...stats import wilson
from ..base import failed_count


@dataclass
class AxisCounts:
    judged: int = 0
    flips: int = 0
    excluded: Counter = field(default_factory=Counter)


def tally(counts: dict[str, AxisCounts], judgements: pd.DataFrame | Mapping[str, Sequence[Any]]) -> None:
    """Add judgements (axis, status, flipped: a frame's columns, or lists) to their axes' counts:
    judged and flipped, or excluded by status."""
    for axis, st, fl in zip(judgements["axis"], judgements["status"], judgements["flipped"]):
        c = counts.setdefault(axis, AxisCounts())
        if st == "ok":
            c.judged += 1
            c.flips += bool(fl)
        else:
            c.excluded[st] += 1


def baseline_rows(cfg, null_counts: dict[str, AxisCounts], baseline: dict[str, Any]) -> list[dict]:
    """The no-effect baseline: the null pairs' flip rate pooled (``baseline`` scope, group ``all``)
    and per axis (Wilson 95%), with whether they were pooled."""
    rows: list[dict] = []
    total = AxisCounts()
    for nc in null_counts.values():
        total.judged += nc.judged
        total.flips += nc.flips
        total.excluded.update(nc.excluded)
    for key, nc in [("all", total), *null_counts.items()]:
        if not nc.judged and not nc.excluded:
            continue
        lo, hi = wilson(nc.flips, nc.judged)
        rows.append(
            {
                "metric_name": cfg.metric_name,
                "scope": "baseline",
                "group_key": key,
                "rate": nc.flips / nc.judged if nc.judged else None,
                "rate_ci_low": lo,
                "rate_ci_high": hi,
                "n": nc.judged,
                "n_events": nc.flips,
                "n_failed": failed_count(nc.excluded),
                "n_excluded": sum(nc.excluded.values()),
                "weight": cfg.weight,
                "details": json.dumps(
                    {
                        "pooled": baseline.get("pooled", True),
                        "homogeneity_p": baseline.get("homogeneity_p"),
                        "excluded": dict(nc.excluded),
                    }
                ),
            }
        )
    return rows


def rate_rows(
    cfg, answers: pd.DataFrame, by_id: dict[str, Claim], impacts: dict[str, dict], cells: dict | None = None
) -> list[dict]:
    """Per axis value, descriptive rates with Wilson 95% intervals: favourable decisions among its
    answers with a decision (scope ``favourable``, with its impact ratio and its claim's decision in
    details) and answers without a decision among those read (scope ``refusal``). Each says its
    axis key's form (explicit, name) and, for an intersection, its combination: the attributes, the
    additive model's prediction and the interaction (its claim's, for a combination named)."""
    rows: list[dict] = []
    cells = cells or {}
    # each value's counts in one pass (whole counts: the sums of 0/1 columns, as summed one group at a time)
    counts = (
        answers.assign(
            _none=answers["state"] == "none",
            _empty=answers["state"] == "empty",
            _fav=answers["favourable"].notna(),
        )
        .groupby(["axis", "value"], sort=True)
        .agg(
            nr=("no_decision", "size"),
            kr=("no_decision", "sum"),
            none=("_none", "sum"),
            empty=("_empty", "sum"),
            n=("_fav", "sum"),
            k=("favourable", "sum"),
        )
    )
    for (axis, value), c_nr, c_kr, c_none, c_empty, c_n, c_k in zip(
        counts.index, counts["nr"], counts["kr"], counts["none"], counts["empty"], counts["n"], counts["k"]
    ):
        key = f"{axis}={value}"
        axes, form = parse_axis(str(axis))
        shape: dict[str, Any] = {"persona_form": form, "attributes": axes[0] if len(axes) == 1 else list(axes)}
        if len(axes) > 1:
            fig = (cells.get(str(axis)) or {}).get(str(value)) or {}
            ic = by_id.get(f"interaction:{key}")
            shape.update(
                combination=dict(zip(axes, str(value).split("×"), strict=False)),
                predicted_rate=fig.get("predicted"),
                interaction=fig.get("interaction"),
                interaction_named=fig.get("named"),
                interaction_status=ic.status if ic is not None else None,
            )
        nr, kr = int(c_nr), int(c_kr)
        lo, hi = wilson(kr, nr)
        rows.append(
            {
                "metric_name": cfg.metric_name,
                "scope": "refusal",
                "group_key": key,
                "rate": kr / nr if nr else None,
                "rate_ci_low": lo,
                "rate_ci_high": hi,
                "n": nr,
                "n_events": kr,
                "weight": cfg.weight,
                "details": json.dumps(
                    {
                        "axis": axis,
                        "value": value,
                        "no_decision": int(c_none),
                        "empty": int(c_empty),
                        "claim": f"refusal:{key}",
                        "status": by_id[f"refusal:{key}"].status if f"refusal:{key}" in by_id else None,
                        **shape,
                    }
                ),
            }
        )
        if not c_n:
            continue
        k, n = int(c_k), int(c_n)
        lo, hi = wilson(k, n)
        c = by_id.get(f"favoured:{key}")
        ir = impacts.get(key, {})
        rows.append(
            {
                "metric_name": cfg.metric_name,
                "scope": "favourable",
                "group_key": key,
                "rate": k / n,
                "rate_ci_low": lo,
                "rate_ci_high": hi,
                "n": n,
                "n_events": k,
                "weight": cfg.weight,
                "threshold": ir.get("threshold"),
                "passed": ir.get("passed"),
                "details": json.dumps(
                    {
                        "axis": axis,
                        "value": value,
                        "claim": f"favoured:{key}",
                        "status": c.status if c is not None else None,
                        "impact_ratio": ir.get("impact_ratio"),
                        "impact_ratio_ci95": ir.get("ci95"),
                        "standardised_rate": ir.get("rate"),  # over the axis's mix of questions
                        "highest": ir.get("highest"),
                        "highest_standardised_rate": ir.get("highest_rate"),
                        **shape,
                    }
                ),
            }
        )
    return rows
