"""Judge validation: a second judge for a sample of the judgements, and the judge's position bias.

- **Audit** (``judge_audit: {judge: <connection>, share: 0.2}`` in the spec): after the judging
  stage, a seeded sample of its judgements is put, prompt for prompt, to the auditing judge. Both
  verdicts become a category (the metric's ``audit_category``: decision flip's label, a
  consistency label, a score's third); the agreement rate and Cohen's kappa land in
  ``metric_scores`` (scope ``judge_audit``), each verdict pair in ``judge_audits``.
- **Position bias**: where a metric shows two answers in a seeded random order (decision flip,
  group interaction bias), the rate of its order-sensitive verdict (the metric's
  ``position_outcome``: a decision difference; "persona a helped less") should not depend on the
  order. The two rates, their difference and a two-proportion test land in ``metric_scores``
  (scope ``judge_position``), and the ``judge_position_bias`` check fails when the difference
  exceeds the spec's ``max_position_bias`` and is significant at 0.05.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from typing import Any

from .metrics.base import StageContext
from .metrics.judging import ask_json, judged_fields
from .metrics.running import run_bounded
from .scoring import frame_records
from .stats import cohen_kappa

AUDITED = ("ok", "no_decision", "unjudgeable")
ALPHA = 0.05


def sampled(seed: int, judgement_id: str, share: float) -> bool:
    h = hashlib.sha256(f"audit\x1f{seed}\x1f{judgement_id}".encode()).digest()
    return int.from_bytes(h[:8], "big") / 2**64 < share


def original_prompt(request_json: str) -> list[dict[str, str]]:
    """The first ask of a judgement (system and user message), whatever re-asks followed."""
    msgs = json.loads(request_json)["messages"]
    u = next(i for i, m in enumerate(msgs) if m["role"] == "user")
    return msgs[max(0, u - 1) : u + 1] if u and msgs[u - 1]["role"] == "system" else msgs[u : u + 1]


async def audit(ctx: StageContext, plugin) -> list[dict[str, Any]]:
    """Ask the auditing judge again for a sample of this partition's judgements."""
    a = ctx.spec.judge_audit
    assert a is not None
    cols = [
        "judgement_id",
        "pair_id",
        "input_id",
        "axis",
        "judge_kind",
        "category",
        "label",
        "status",
        "score",
        "parsed",
        "decision_a",
        "decision_b",
        "order_swapped",
        "call_key",
    ]
    j = ctx.read("judgements", None, cols)
    rows = [
        r
        for r in j.to_dict("records")
        if r["status"] in AUDITED
        and r["call_key"]
        and plugin.audit_model(r) is not None
        and sampled(ctx.spec.seed, r["judgement_id"], a.share)
    ]
    if not rows or ctx.journal is None:
        return []
    cfg = ctx.config
    limit = int(getattr(cfg, "sub_call_concurrency_limit", 0) or getattr(cfg, "concurrency_limit", 5))
    progress = ctx.progress("judge audit", len(rows))
    async with ctx.client("audit", "judging", limit) as client:
        progress.in_flight = lambda: client.stats["in_flight"]

        async def one(r):
            rec = ctx.journal.lookup(r["call_key"], [ctx.run_id])
            base = {
                "judgement_id": r["judgement_id"],
                "pair_id": r["pair_id"],
                "input_id": r["input_id"],
                "axis": r["axis"],
                "primary_label": plugin.audit_category(ctx, r, None),
            }
            if rec is None:
                return {**base, "status": "judge_failed", "error": "the judged prompt is not in the journal"}
            o = await ask_json(
                client,
                original_prompt(rec["request"]),
                plugin.audit_model(r),
                retries=ctx.spec.judge_retries,
                timeout=getattr(cfg, "timeout_seconds", 60.0),
                temperature=ctx.spec.judge_temperature,
                template_version="judge_audit/v1",
                context=plugin.audit_context(ctx, r),
                enums=plugin.audit_enums(ctx, r),
            )
            out = {
                **base,
                **{k: v for k, v in judged_fields(o).items() if k in ("attempts", "raw_output", "model", "call_key")},
            }
            if o.value is None:
                return {**out, "status": "judge_failed", "error": f"audit judge {o.error}"}
            label = plugin.audit_category(ctx, r, o.value)
            return {**out, "status": "ok", "error": None, "audit_label": label, "agree": label == base["primary_label"]}

        return await run_bounded(rows, one, limit, progress, lambda x: x["status"] == "ok")


def kappa(pairs: list[tuple[str, str]]) -> tuple[float | None, float | None]:
    """(observed agreement, Cohen's kappa) of two raters' categories."""
    return cohen_kappa([(a, b, 1.0) for a, b in pairs])


def audit_scores(ctx: StageContext, cfg) -> list[dict[str, Any]]:
    a = ctx.read("judge_audits", None, ["status", "primary_label", "audit_label"])
    if not len(a):
        return []
    ok = a[a["status"] == "ok"]
    po, k = kappa(list(zip(ok["primary_label"], ok["audit_label"])))
    confusion = Counter(f"{p} / {q}" for p, q in zip(ok["primary_label"], ok["audit_label"]))
    return [
        {
            "metric_name": cfg.metric_name,
            "scope": "judge_audit",
            "group_key": "second_judge",
            "rate": po,
            "raw_score": k,
            "n": len(ok),
            "n_events": int(sum(ok["primary_label"] == ok["audit_label"])),
            "n_failed": int(len(a) - len(ok)),
            "weight": cfg.weight,
            "details": json.dumps(
                {
                    "agreement": po,
                    "kappa": k,
                    "audit_failed": int(len(a) - len(ok)),
                    "confusion (run judge / audit judge)": dict(confusion),
                },
                ensure_ascii=False,
            ),
        }
    ]


def position_scores(ctx: StageContext, cfg, plugin) -> list[dict[str, Any]]:
    counts = {True: [0, 0], False: [0, 0]}  # swapped -> [judgements, outcome true]
    for ids in ctx.batches():  # a batch at a time: read whole, a 100,000-row partition's judgements peaked at 2.6 GB
        j = ctx.read(
            "judgements",
            ids,
            ["pair_id", "judge_kind", "status", "parsed", "decision_a", "decision_b", "order_swapped"],
        )
        j = j[(j["status"] == "ok") & j["order_swapped"].notna()] if len(j) else j
        if not len(j):
            continue
        pairs = {
            p["pair_id"]: p for p in frame_records(ctx.read("probe_pairs", ids, ["pair_id", "value_a", "value_b"]))
        }
        for r in frame_records(j):
            out = plugin.position_outcome(r, pairs.get(r["pair_id"], {}))
            if out is None:
                continue
            c = counts[bool(r["order_swapped"])]
            c[0] += 1
            c[1] += bool(out)
    (ns, ks), (nu, ku) = counts[True], counts[False]
    if not ns or not nu:
        return []
    rs, ru = ks / ns, ku / nu
    pool = (ks + ku) / (ns + nu)
    se = math.sqrt(pool * (1 - pool) * (1 / ns + 1 / nu))
    p = 1.0 if se == 0 else math.erfc(abs(rs - ru) / se / math.sqrt(2))
    if se == 0 and rs != ru:
        p = 0.0
    limit = ctx.spec.max_position_bias if ctx.spec is not None else 0.1
    return [
        {
            "metric_name": cfg.metric_name,
            "scope": "judge_position",
            "group_key": "by_order",
            "rate": abs(rs - ru),
            "n": ns + nu,
            "weight": cfg.weight,
            "passed": not (abs(rs - ru) > limit and p < ALPHA),
            "details": json.dumps(
                {
                    "rate_shown_swapped": rs,
                    "rate_shown_in_order": ru,
                    "n_swapped": ns,
                    "n_in_order": nu,
                    "difference": abs(rs - ru),
                    "p_value": p,
                    "max_position_bias": limit,
                    "alpha": ALPHA,
                }
            ),
        }
    ]
