"""Perturbation robustness's judging: per group, the baseline's correctness, then each variant's
correctness and its robustness against the baseline."""

from __future__ import annotations

from typing import Any

from ...models.deadline import CURRENT_ROW
from ..answers import answer_problem
from ..base import StageContext
from ..judging import ask_panel, judged_fields
from ..running import gather_all, run_bounded, worst_outcome
from ..verdicts import Verdict
from .prompts import Correctness, Robustness, correctness_messages, robustness_messages
from .synthesis import member


async def judge(plugin, ctx: StageContext):
    cfg = ctx.config
    probes = ctx.read(
        "probes", None, ["probe_id", "input_id", "role", "category", "group_id", "query_text", "variant_id"]
    )
    probes = probes[probes["role"] != "excluded"].to_dict("records")
    resp = {
        r["probe_id"]: r
        for r in ctx.read("sut_responses", None, ["probe_id", "sample_index", "status", "error", "response"]).to_dict(
            "records"
        )
        if r["sample_index"] == 0
    }
    meta = {r.input_id: r.metadata for r in ctx.rows()}
    groups: dict[str, dict] = {}
    for p in probes:
        g = groups.setdefault(p["group_id"], {"base": None, "variants": []})
        if p["role"] == "baseline":
            g["base"] = p
        else:
            g["variants"].append(p)
    progress = ctx.progress("judging groups", len(groups))
    async with ctx.client("judge", "judging", cfg.sub_call_concurrency_limit) as client:
        progress.in_flight = lambda: client.stats["in_flight"]

        async def ask(common: dict[str, Any], kind: str, messages, model: type[Verdict]):
            """One judge (``kind``: correctness or robustness) of one pair of the group, its calls
            made for the judged answer's own row (its row deadline; a task of its own, see gather_all)."""
            CURRENT_ROW.set(common["input_id"])
            o = await ask_panel(
                client,
                messages,
                model,
                category=lambda v: plugin.verdict_category(v, kind),
                retries=ctx.spec.judge_retries,
                timeout=cfg.timeout_seconds,
                temperature=ctx.spec.judge_temperature,
                template_version=plugin.judge_template_version,
            )
            row = {**common, "judgement_id": f"{common['pair_id']}|{kind}", "judge_kind": kind, **judged_fields(o)}
            v = o.value
            if v is None:
                return {**row, "status": "judge_failed", "error": f"{kind} judge {o.error}"}
            assert isinstance(v, Verdict)
            if v.unjudgeable:
                return {
                    **row,
                    "status": "unjudgeable",
                    "reasoning": v.reasoning,
                    "parsed": v.model_dump_json(),
                    "error": f"{kind} judge: unjudgeable: {v.reasoning}"[:500],
                }
            return {
                **row,
                "status": "ok",
                "score": float(getattr(v, kind)),
                "reasoning": v.reasoning,
                "parsed": v.model_dump_json(),
            }

        def answer(p):
            """(text, None) or (None, (status, reason)) for a failed or empty answer."""
            r = resp.get(p["probe_id"])
            bad = answer_problem(r, "the SUT answer")
            return (None, bad) if bad else (r["response"].strip(), None)

        async def one(item):
            gid, g = item
            base = g["base"]
            m = meta.get(base["input_id"], {})
            ref = m.get("reference_answer") or cfg.reference_answer
            gctx = m.get("groundtruth_context") or cfg.groundtruth_context
            b_text, b_bad = answer(base)
            out = []
            b_common = {
                "pair_id": f"{gid}|base",
                "input_id": base["input_id"],
                "category": "baseline",
                "group_id": gid,
            }
            if b_bad:  # nothing to compare the variants with
                return [
                    {
                        **b_common,
                        "judgement_id": f"{gid}|base|correctness",
                        "judge_kind": "correctness",
                        "status": b_bad[0],
                        "error": f"baseline: {b_bad[1]}",
                    }
                ]
            tasks = [
                ask(
                    b_common,
                    "correctness",
                    correctness_messages(base["query_text"], b_text, ref, gctx),
                    Correctness,
                )
            ]
            for v in g["variants"]:
                v_text, v_bad = answer(v)
                pid = f"{gid}|{member(v)}"
                common = {
                    "pair_id": pid,
                    "input_id": v["input_id"],
                    "category": v["category"],
                    "group_id": gid,
                    "variant_id": member(v),
                }
                if v_bad:  # a failed or empty variant answer is excluded and counted, never a 0
                    out += [
                        {
                            **common,
                            "judgement_id": f"{pid}|{k}",
                            "judge_kind": k,
                            "status": v_bad[0],
                            "error": v_bad[1],
                        }
                        for k in ("correctness", "robustness")
                    ]
                else:
                    tasks.append(
                        ask(
                            common,
                            "correctness",
                            correctness_messages(v["query_text"], v_text, ref, gctx),
                            Correctness,
                        )
                    )
                    tasks.append(
                        ask(
                            common,
                            "robustness",
                            robustness_messages(base["query_text"], v["query_text"], b_text, v_text),
                            Robustness,
                        )
                    )
            return out + list(await gather_all(*tasks))

        results = await run_bounded(
            sorted(groups.items()),
            one,
            cfg.sub_call_concurrency_limit,
            progress,
            lambda rs: worst_outcome(r["status"] for r in rs),
        )
    yield {"judgements": [r for rs in results for r in rs]}
