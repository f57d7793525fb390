"""Perturbation robustness's aggregation: per group of rows, the baseline's correctness and each
variant's robustness and correctness drop, the group's score (the engine's formula) on every row
of the group; the run's score the mean over groups, with its breakdown by perturbation type."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import numpy as np

from ...gate import exclusion_reason
from ...records import RowScore
from ...scoring import PERTURBATION_GROUP, Accumulator, explode, record, to_records, units_frame
from ...stats import normalise
from ..base import FAILURE_REASONS, StageContext
from ..words import row_reason, unscored_status
from .synthesis import EDGE_MESSAGES, _h, member


def group_score(robustness: list[float], drops: list[float]) -> float:
    """0.5 x mean robustness + 0.5 x max(0, 1 - mean correctness drop), capped at 1 (a variant
    answered better than its baseline does not lift the score above 1): the engine's formula."""
    raw = PERTURBATION_GROUP.raw(np.array([sum(robustness), sum(drops), len(robustness)], dtype=float))
    assert raw is not None, "a group score needs at least one judged variant pair"
    return raw


def aggregate(plugin, ctx: StageContext):
    cfg = ctx.config
    norm = lambda x: normalise(x, cfg.min, cfg.max, cfg.inverted)  # noqa: E731
    probes = ctx.read(
        "probes", None, ["input_id", "role", "category", "group_id", "variant_id", "exclusion", "query_text"]
    ).to_dict("records")
    j = ctx.read("judgements", None, ["pair_id", "input_id", "judge_kind", "status", "score", "error"])
    by_pair = {k: g.to_dict("records") for k, g in j.groupby("pair_id")} if len(j) else {}
    groups: dict[str, list[dict]] = {}
    row_scores: list[RowScore] = []
    edge_rows: set[str] = set()
    edge_reasons: Counter = Counter()
    for p in probes:
        if p["role"] == "excluded" and p["input_id"] not in edge_rows:
            edge_rows.add(p["input_id"])
            edge_reasons[p["exclusion"]] += 1
            row_scores.append(
                {
                    "input_id": p["input_id"],
                    "status": "excluded",  # a dataset edge case: nothing failed
                    "label": "excluded",
                    "n_judged": 0,
                    "n_failed": 0,
                    "n_events": 0,
                    "error": EDGE_MESSAGES[p["exclusion"]],
                }
            )
        elif p["role"] != "excluded":
            groups.setdefault(p["group_id"], []).append(p)
    units: list[dict[str, Any]] = []
    groups_scored = groups_failed = pairs_judged = 0
    # rows and groups without a score, by reason (row_reason; a dataset edge case under its own name)
    rows_excluded: Counter = Counter()
    groups_excluded: Counter = Counter()
    # dataset edge cases: every row that would have been a variant is a planned pair, excluded under its case
    # (a row claiming to be its group's baseline plans no pair: its query is the group's original query)
    excluded: Counter = Counter(
        p["exclusion"]
        for p in probes
        if p["role"] == "excluded" and (p["group_id"] is None or _h(p["query_text"]) != p["group_id"])
    )
    for gid, members in groups.items():
        variants = [m for m in members if m["role"] == "variant"]
        bj = by_pair.get(f"{gid}|base", [])
        b_ok = [x for x in bj if x["status"] == "ok"]
        error = None
        statuses: list[str] = [str(x["status"]) for x in bj]
        if not b_ok:  # every variant of the group is excluded, under the baseline's reason
            excluded[exclusion_reason([x["status"] for x in bj])] += len(variants)
            error = "baseline not scored: " + ("; ".join(str(x["error"]) for x in bj) or "no judgement")
        rob, drops, failed, explained = [], [], 0, []
        if error is None:
            b = float(b_ok[0]["score"])
            for v in variants:
                vj = {x["judge_kind"]: x for x in by_pair.get(f"{gid}|{member(v)}", [])}
                c, r = vj.get("correctness"), vj.get("robustness")
                if not c or not r or c["status"] != "ok" or r["status"] != "ok":
                    statuses += [str(x["status"]) for x in (c, r) if x]
                    failed += 1
                    excluded[exclusion_reason([x["status"] for x in (c, r) if x])] += 1
                    continue
                drop = b - float(c["score"])
                rob.append(float(r["score"]))
                drops.append(drop)
                units.append(
                    {
                        "unit_id": f"{gid}|{member(v)}",
                        "input_id": v["input_id"],
                        "score_row": gid,
                        "cluster": gid,
                        "robustness": float(r["score"]),
                        "correctness_drop": drop,
                        "groups": {"perturbation_type": [v["category"]]},
                    }
                )
                explained.append(f"{v['category']}: robustness {float(r['score']):.2f}, drop {drop:+.2f}")
            if not rob:
                error = f"no variant of the group could be scored ({failed} excluded)"
        pairs_judged += len(rob)
        if error:
            groups_failed += 1
            reason = row_reason(statuses)
            groups_excluded[reason] += 1
            rows_excluded[reason] += len({m["input_id"] for m in members})
            row_scores += [
                {
                    "input_id": i,
                    "status": unscored_status(reason),
                    "label": unscored_status(reason),
                    "n_judged": 0,
                    "n_failed": failed,
                    "n_events": 0,
                    "error": error,
                }
                for i in {m["input_id"] for m in members}
            ]
            continue
        groups_scored += 1
        raw = group_score(rob, drops)  # the engine's formula, as for the run below
        expl = (
            f"group of {len(members)} rows; mean robustness {sum(rob) / len(rob):.2f}, mean correctness drop "
            f"{sum(drops) / len(drops):+.2f}; " + "; ".join(explained)
        )
        for m in {m["input_id"]: m for m in members}.values():  # the group score, on every row of the group
            row_scores.append(
                {
                    "input_id": m["input_id"],
                    "raw_score": raw,
                    "score": norm(raw),
                    "status": "ok",
                    "label": "robust" if raw >= 0.85 else "fragile",
                    "n_judged": len(rob),
                    "n_failed": failed,
                    "n_events": sum(1 for d in drops if d > 0),
                    "explanation": expl[:1000],
                }
            )
    frame = units_frame(units)
    yield {"row_scores": row_scores, "score_units": to_records(frame)}
    engine = Accumulator(plugin.formula, ["perturbation_type"])
    engine.add(frame)  # the run's mean counts each original query (a group, a cluster) once
    run = engine.run(ctx.seed)
    scores = [
        record(
            run,
            "overall",
            "all",
            cfg,
            threshold=ctx.threshold,
            judged=pairs_judged,
            excluded=dict(excluded),
            details=json.dumps(
                {
                    "formula": plugin.formula.name,
                    "groups_scored": groups_scored,
                    "groups_failed": groups_failed,
                    "variant_pairs_judged": pairs_judged,
                    "variant_pairs_excluded": sum(excluded.values()),
                    "rows_scored": sum(1 for r in row_scores if r["status"] == "ok"),
                    "rows_errored": sum(n for k, n in rows_excluded.items() if k in FAILURE_REASONS),
                    "rows_excluded": {k: n for k, n in (rows_excluded + edge_reasons).items() if n},
                    "groups_excluded": dict(groups_excluded),
                }
            ),
        )
    ]
    for ptype, st in engine.breakdown("perturbation_type", ctx.seed).items():
        of = explode(frame, "perturbation_type")
        of = of[of["key"] == ptype]
        scores.append(
            record(
                st,
                "perturbation_type",
                ptype,
                cfg,
                n=len(of),
                n_events=int((of["correctness_drop"] > 0).sum()),
                details=json.dumps(
                    {
                        "mean_robustness": float(of["robustness"].mean()),
                        "mean_correctness_drop": float(of["correctness_drop"].mean()),
                        "groups": st.n,
                    }
                ),
            )
        )
    yield {"metric_scores": scores}
