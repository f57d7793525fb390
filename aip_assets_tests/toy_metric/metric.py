"""The toy metric's stages: one probe per row (its own question), one SUT answer each, one judge
verdict each, and a row's score 1 when the answer is polite."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd

from aip_assets.metrics.answers import answer_problem, sample_probes
from aip_assets.metrics.base import Metric, StageContext
from aip_assets.metrics.judging import ask_panel, judged_fields
from aip_assets.metrics.running import run_bounded
from aip_assets.scoring import MEAN_OF_ROW_MEANS, Accumulator, record, row_raws, to_records, units_frame
from aip_assets.stats import normalise

from .builtin_judge import BUILTIN_JUDGES
from .config import PolitenessVerdict, ToyPolitenessConfig
from .prompts import JUDGE_TEMPLATE_VERSION, TEMPLATE_VERSION, judge_messages

# the verdict's own fields, read from judgements.parsed as typed columns
VIEWS = {
    "v_toy_politeness": """
        SELECT run_id, metric, judgement_id, input_id, status, score,
               CAST(parsed ->> 'polite' AS BOOLEAN) AS polite, CAST(parsed ->> 'word_count' AS INTEGER) AS word_count,
               reasoning
        FROM judgements WHERE metric = 'llm.toy_politeness'
    """
}


class ToyPoliteness(Metric):
    """Whether the SUT thanks the user. Its verdict fields (``polite``, ``word_count``) are its own:
    a :class:`PolitenessVerdict` stored in ``judgements.parsed`` and read through ``v_toy_politeness``;
    no column of the core tables is added for them."""

    name = "llm.toy_politeness"
    version = "1.0.0"
    config_model = ToyPolitenessConfig
    formula = MEAN_OF_ROW_MEANS
    manifest = json.loads((Path(__file__).parent / "manifest.json").read_text())
    builtin_judges = BUILTIN_JUDGES
    count_labels = ("rows scored", "polite answers", "rows excluded")
    judgement_previews = (("v_toy_politeness", ("input_id", "polite", "word_count", "reasoning"), "input_id", "TRUE"),)

    def views(self) -> dict[str, str]:
        return dict(VIEWS)

    def synthesize(self, ctx: StageContext):
        for ids in ctx.batches(per_row=1):
            yield {
                "probes": [
                    {
                        "probe_id": f"{row.input_id}|q",
                        "input_id": row.input_id,
                        "role": "question",
                        "query_text": row.last_user_text,
                        "messages": json.dumps([{"role": "user", "content": row.last_user_text}]),
                        "template_version": TEMPLATE_VERSION,
                    }
                    for row in ctx.rows(ids)
                ]
            }

    def sample(self, ctx: StageContext):
        cfg = ctx.config
        return sample_probes(
            ctx,
            concurrency=cfg.concurrency_limit,
            temperature=0.0,
            retries=0,
            timeout=cfg.timeout_seconds,
            template_version=TEMPLATE_VERSION,
        )

    async def judge(self, ctx: StageContext):
        cfg = ctx.config
        async with ctx.client("judge", "judging", cfg.concurrency_limit) as client:
            for ids in ctx.batches():
                answers = {
                    r["input_id"]: r
                    for r in ctx.read("sut_responses", ids, ["input_id", "status", "error", "response"]).to_dict(
                        "records"
                    )
                }

                async def one(input_id: str) -> dict[str, Any]:
                    row = {"judgement_id": input_id, "input_id": input_id, "judge_kind": "politeness", "attempts": 0}
                    bad = answer_problem(answers.get(input_id), "SUT answer")
                    if bad:
                        return {**row, "status": bad[0], "error": bad[1]}
                    o = await ask_panel(
                        client,
                        judge_messages(answers[input_id]["response"]),
                        PolitenessVerdict,
                        category=self.verdict_category,
                        retries=cfg.n_judge_retries,
                        timeout=cfg.timeout_seconds,
                        temperature=0.0,
                        template_version=JUDGE_TEMPLATE_VERSION,
                    )
                    row.update(judged_fields(o))
                    if o.value is None:
                        return {**row, "status": "judge_failed", "error": f"judge {o.error}"}
                    v: PolitenessVerdict = o.value
                    if v.unjudgeable:
                        return {**row, "status": "unjudgeable", "reasoning": v.reasoning, "parsed": v.model_dump_json()}
                    return {
                        **row,
                        "status": "ok",
                        "label": "polite" if v.polite else "curt",
                        "score": 1.0 if v.polite else 0.0,
                        "reasoning": v.reasoning,
                        "parsed": v.model_dump_json(),
                    }

                yield {"judgements": await run_bounded(ids, one, cfg.concurrency_limit)}

    def aggregate(self, ctx: StageContext):
        cfg = ctx.config
        engine = Accumulator(self.formula, [])
        excluded: Counter = Counter()
        polite = 0
        for ids in ctx.batches():
            j = ctx.read("judgements", ids, ["judgement_id", "input_id", "status", "score", "error"])
            judged = j[j["status"] == "ok"]
            excluded.update(j[j["status"] != "ok"]["status"])
            units = units_frame(
                {
                    "unit_id": r["judgement_id"],
                    "input_id": r["input_id"],
                    "score_row": r["input_id"],
                    "cluster": r["input_id"],
                    "score": float(r["score"]),
                    "groups": {},
                }
                for r in judged.to_dict("records")
            )
            engine.add(units)
            raws = row_raws(units, self.formula) if len(units) else pd.Series(dtype=float)
            rows = []
            for r in j.to_dict("records"):
                if r["status"] != "ok":
                    rows.append(
                        {
                            "input_id": r["input_id"],
                            "status": "error",
                            "label": "error",
                            "n_judged": 0,
                            "n_failed": 1,
                            "n_events": 0,
                            "error": r["error"],
                        }
                    )
                    continue
                raw = float(raws[r["input_id"]])
                polite += int(raw == 1.0)
                rows.append(
                    {
                        "input_id": r["input_id"],
                        "raw_score": raw,
                        "score": normalise(raw, cfg.min, cfg.max, cfg.inverted),
                        "status": "ok",
                        "label": "polite" if raw == 1.0 else "curt",
                        "n_judged": 1,
                        "n_failed": 0,
                        "n_events": int(raw == 1.0),
                    }
                )
            yield {"row_scores": rows, "score_units": to_records(units)}
        run = engine.run(ctx.seed)
        yield {
            "metric_scores": [
                record(
                    run,
                    "overall",
                    "all",
                    cfg,
                    n_events=polite,
                    n_failed=sum(excluded.values()),
                    threshold=ctx.threshold,
                    judged=run.n,
                    excluded=dict(excluded),
                    details=json.dumps({"formula": self.formula.name, "polite": polite}),
                )
            ]
        }

    def verdict_category(self, verdict: PolitenessVerdict, *context: Any) -> str:
        return "unjudgeable" if verdict.unjudgeable else ("polite" if verdict.polite else "curt")

    def summary(self, scores: pd.DataFrame) -> dict[str, Any]:
        o = scores[scores["scope"] == "overall"].iloc[0]
        return {
            "score": o["score"],
            "ci95": [o["ci_low"], o["ci_high"]],
            "rows_scored": int(o["n"]),
            "polite": json.loads(o["details"])["polite"],
        }

    def format_summary(self, s: dict[str, Any]) -> list[str]:
        return [f"  rows scored {s['rows_scored']}, polite answers {s['polite']}"]
