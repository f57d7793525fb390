"""Perturbation robustness: the generation recipe, the external scorer, and the hosted variant.

- ``generate_variants`` (the recipe; the ``perturbation_dataset`` asset and ``aip-eval perturb``):
  from seed rows, meaning-preserving variants of each query, tagged with their perturbation type,
  deterministic under a seed, exported as a gdi_text_v1 file in which every row has
  ``metadata.original_query`` and the baseline row's query equals it.
- ``llm.perturbation_robustness_external`` (spec 002, ``scorer_contract: full_dataset``): no SUT
  calls. Rows are grouped by ``metadata.original_query``; the baseline is the row whose query
  equals it. The judge scores base correctness, each variant's correctness and a per-pair
  robustness score (using ``reference_answer`` / ``groundtruth_context`` from the config or the
  baseline row's metadata); group score = 0.5 x mean robustness + 0.5 x max(0, 1 - mean
  correctness drop), replicated to every row of the group. The run's score is the mean over
  groups (each original query counts once, however many variants it has), with a bootstrap 95%
  interval, and a breakdown by perturbation type (which kinds of noise hurt most).
- ``llm.perturbation_robustness`` (hosted): the same judges and aggregation, the variants made by
  the recipe within the run and answered by the SUT.

Edge cases, each with its outcome on the rows it concerns (the rest of the run completes):
a row without ``metadata.original_query``; a group with no baseline row; a group with two rows
claiming to be the baseline; a group with only its baseline (each an exclusion under that name);
an empty or failed baseline answer (all rows of the group error with the reason, its variants are
excluded under it); an empty or failed variant answer (excluded and counted without a judge call,
never scored as 0: ``empty_answer`` / ``sut_failed``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
from collections import Counter
from typing import Any, ClassVar

import numpy as np
import pandas as pd
from pydantic import Field

from ...dataset import DatasetRow
from ...gate import exclusion_reason
from ...models.deadline import CURRENT_ROW
from ...models.providers import capabilities
from ...perturbations import ALL_TYPES, RULE_BASED
from ...records import RowScore
from ...scoring import PERTURBATION_GROUP, Accumulator, explode, record, to_records, units_frame
from ...stats import normalise, third
from ..base import (
    FAILURE_REASONS,
    THIRDS,
    THIRDS_TEXT,
    Evidence,
    Finding,
    KeyRate,
    Metric,
    StageContext,
    answer_problem,
    clip_quote,
    examples_of,
    given_response,
    not_scored_phrase,
    pct,
    row_reason,
    sample_probes,
    thirds,
    unscored_status,
)
from ..judging import JsonAnswer, Verdict, ask_panel, judged_fields
from ..running import gather_all, run_bounded, worst_outcome
from . import exam
from .builtin_judge import BUILTIN_JUDGES
from .config import PerturbationRobustnessConfig, PerturbationRobustnessExternalConfig
from .prompts import Correctness, Robustness, correctness_messages, robustness_messages

HUMAN_ITEMS = {  # what a person labels, per judge kind (human_labels.py)
    "correctness": "correctness of the answer (against the reference where given)",
    "robustness": "robustness: does the answer to the reworded question keep the substance of the original's",
}


# ------------------------------------------------------------------ the recipe
# the paraphrase prompt's example, of an unrelated question: an answer repeating it copies the prompt
PARAPHRASE_EXAMPLE = ("What is the warranty period of this laptop?", "How long is this laptop under warranty?")


class Paraphrase(JsonAnswer):
    NOUN: ClassVar[str] = "paraphrase"
    EXAMPLES: ClassVar[tuple[str, ...]] = PARAPHRASE_EXAMPLE
    paraphrase: str = Field(..., min_length=1)


def paraphrase_messages(query: str) -> list[dict[str, str]]:
    example = json.dumps({"paraphrase": PARAPHRASE_EXAMPLE[1]})
    return [
        {
            "role": "system",
            "content": "You rewrite questions without changing their meaning. You answer with JSON only.",
        },
        {
            "role": "user",
            "content": (
                "Task: paraphrase (aip-judge paraphrase v2)\n\nRewrite the question below in different words. Keep "
                "its meaning, every fact, number and date, and its language.\n\n<<<\n" + query + "\n>>>\n\n"
                'Answer with one JSON object with one field, "paraphrase" (string): the question above in your '
                'words. For example, for the unrelated question "' + PARAPHRASE_EXAMPLE[0] + '", a correct answer '
                "was: " + example + "\nAnswer with the JSON object only, for the question above."
            ),
        },
    ]


def _h(*parts: Any) -> str:
    return hashlib.sha256("\x1f".join(map(str, parts)).encode()).hexdigest()[:16]


def generate_variants(
    rows: list[DatasetRow],
    types: list[str],
    seed: int,
    variants_per_type: int = 1,
    paraphrases: dict[tuple[str, int], str] | None = None,
) -> list[DatasetRow]:
    """Baseline + perturbed rows (gdi_text_v1) for each seed row; deterministic under ``seed``.

    ``paraphrases``: model paraphrases keyed by (input_id, k), when a model was asked."""
    out: list[DatasetRow] = []
    for row in rows:
        q = row.last_user_text
        meta = {**row.metadata, "original_query": q, "perturbation_type": "baseline", "seed_input_id": row.input_id}
        out.append(DatasetRow(row.input_id, row.prompt, row.task_type, None, row.context, meta))
        seen = {q}
        for t in types:
            for k in range(variants_per_type):
                if t == "paraphrase":
                    v = (paraphrases or {}).get((row.input_id, k))
                else:
                    v = RULE_BASED[t](q, random.Random(f"perturb:{seed}:{row.input_id}:{t}:{k}"))
                if not v or v in seen:
                    continue
                seen.add(v)
                prompt = v if isinstance(row.prompt, str) else row.turns[:-1] + [{"role": "user", "content": v}]
                out.append(
                    DatasetRow(
                        f"{row.input_id}--{t}-{k + 1}",
                        prompt,
                        row.task_type,
                        None,
                        row.context,
                        {**meta, "perturbation_type": t},
                    )
                )
    return out


async def ask_paraphrases(
    client, rows: list[DatasetRow], variants_per_type: int, timeout: float, retries: int, temperature: float
) -> dict[tuple[str, int], str]:
    async def one(item):
        row, k = item
        msgs = paraphrase_messages(row.last_user_text)
        r = await client.chat(
            msgs,
            temperature=temperature,
            sample_index=k,
            retries=retries,
            timeout=timeout,
            template_version="perturbation/paraphrase/v2",
        )
        from ..judging import parse_json_answer

        v, _ = parse_json_answer(r.text, Paraphrase) if r.ok else (None, r.error)
        return (row.input_id, k), (v.paraphrase.strip() if v else None)

    items = [(r, k) for r in rows for k in range(variants_per_type)]
    return {key: val for key, val in await run_bounded(items, one, 8) if val}


EXPORT_SUFFIXES = (".jsonl", ".ndjson", ".csv", ".parquet", ".pq")


def check_export_path(path) -> None:
    """Refuse an output file the exporter cannot write, before any work (and before any folder is made)."""
    from pathlib import Path

    if Path(path).suffix.lower() not in EXPORT_SUFFIXES:
        raise ValueError(f"{path}: the output must end in .jsonl, .csv or .parquet")


def export_dataset(rows: list[DatasetRow], path) -> None:
    """Write rows as gdi_text_v1: .jsonl, .csv (JSON in structured cells) or .parquet."""
    from pathlib import Path

    check_export_path(path)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    recs = [
        {
            "input_id": r.input_id,
            "prompt": r.prompt,
            "sut_response": r.sut_response,
            "task_type": r.task_type,
            "context": r.context,
            "metadata": r.metadata,
        }
        for r in rows
    ]
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        path.write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in recs))
        return
    flat = [
        {
            **x,
            "prompt": x["prompt"] if isinstance(x["prompt"], str) else json.dumps(x["prompt"], ensure_ascii=False),
            "context": None if x["context"] is None else json.dumps(x["context"], ensure_ascii=False),
            "metadata": json.dumps(x["metadata"], ensure_ascii=False),
        }
        for x in recs
    ]
    if suffix == ".csv":
        pd.DataFrame(flat).to_csv(path, index=False)
    else:
        pd.DataFrame(flat).to_parquet(path, index=False)


def messages_for(row: DatasetRow) -> list[dict[str, str]]:
    """The chat messages a row stands for: its turns, with RAG context before the last one."""
    turns = row.turns
    if row.context:
        ctx = "Context:\n" + "\n".join(f"- {p}" for p in row.context) + "\n\n"
        turns = turns[:-1] + [{"role": "user", "content": ctx + turns[-1]["content"]}]
    return turns


def member(probe: dict) -> str:
    """The row a probe stands for: a dataset row (external), or a generated variant (hosted)."""
    return probe.get("variant_id") or probe["input_id"]


def group_score(robustness: list[float], drops: list[float]) -> float:
    """0.5 x mean robustness + 0.5 x max(0, 1 - mean correctness drop), capped at 1 (a variant
    answered better than its baseline does not lift the score above 1): the engine's formula."""
    raw = PERTURBATION_GROUP.raw(np.array([sum(robustness), sum(drops), len(robustness)], dtype=float))
    assert raw is not None, "a group score needs at least one judged variant pair"
    return raw


# ------------------------------------------------------------------ the scorers
EDGE_MESSAGES = {
    "missing_original_query": "the row has no metadata.original_query, so it belongs to no group",
    "no_baseline": "no row of its group has a query equal to metadata.original_query (no baseline)",
    "duplicate_baseline": "two or more rows of its group claim to be the baseline (their query equals "
    "metadata.original_query); keep exactly one",
    "baseline_only": "its group has only the baseline row: no perturbed variant to compare",
}


class PerturbationRobustnessExternal(Metric):
    builtin_judges = BUILTIN_JUDGES  # the builtin judge's answers to this metric's prompts
    chart_scopes = {"perturbation_type": {"value": "score", "kind": "score", "title": "Score by perturbation type"}}
    human_key_rate = KeyRate(
        "robustness:low",
        tuple(f"robustness:{t}" for t in THIRDS),
        "the share of judged variant pairs whose answers lost the substance (robustness below 1/3)",
    )

    def human_categories(self, judgement: dict[str, Any]) -> list[str]:
        return thirds(judgement["judge_kind"])

    def human_item(self, judgement: dict[str, Any]) -> str:
        kind = str(judgement.get("judge_kind"))
        return f"{HUMAN_ITEMS.get(kind, kind)} ({THIRDS_TEXT})"

    def human_context(self, config: Any, row: DatasetRow, judgement: dict[str, Any]) -> str:
        if judgement.get("judge_kind") != "correctness":
            return ""
        ref = row.metadata.get("reference_answer") or getattr(config, "reference_answer", None)
        return f"reference answer: {ref}" if ref else ""

    count_labels = ("groups scored", "rows with a correctness drop", "variant pairs failed")
    exclusion_reasons = {
        "missing_original_query": "perturbation robustness (dataset): the row has no metadata.original_query",
        "no_baseline": "perturbation robustness (dataset): no row of the group equals its original query",
        "duplicate_baseline": "perturbation robustness (dataset): two or more rows of the group claim to be its "
        "baseline",
        "baseline_only": "perturbation robustness (dataset): the group has only its baseline, no variant",
    }
    formula = PERTURBATION_GROUP
    compare_scope = "perturbation_type"
    name = "llm.perturbation_robustness_external"
    version = "1.0.0"
    config_model = PerturbationRobustnessExternalConfig
    template_version = "perturbation_robustness/v1"  # the SUT's probes
    judge_template_version = "perturbation_robustness/judge/v2"  # the judge prompts (v2: fields described)
    calls_sut = False  # scores off-platform answers: no SUT connection is needed

    def estimate(self, ctx: StageContext) -> dict[str, int]:
        probes = ctx.read("probes", None, ["role", "messages"])
        scored = probes[probes["role"] != "excluded"]
        groups, variants = int((scored["role"] == "baseline").sum()), int((scored["role"] == "variant").sum())
        hosted = self.name == "llm.perturbation_robustness"
        return {
            "sut_calls": len(scored) if hosted else 0,
            "judge_calls": groups + 2 * variants,
            "synthesis_calls": 0,
            "sut_prompt_chars": int(scored["messages"].str.len().sum()) if hosted else 0,
        }

    # ---- synthesis: group the rows (full dataset)
    def group_rows(self, rows: list[DatasetRow]) -> tuple[list[dict], list[dict]]:
        """(probes, notes): one probe per row; rows in a broken group become ``excluded`` probes."""
        groups: dict[str, list[DatasetRow]] = {}
        probes, notes = [], []
        for row in rows:
            oq = row.metadata.get("original_query")
            if not isinstance(oq, str) or not oq.strip():
                probes.append(self._probe(row, "excluded", "missing_original_query", None))
                continue
            groups.setdefault(oq, []).append(row)
        for oq, members in groups.items():
            gid = _h(oq)
            base = [r for r in members if r.last_user_text == oq]
            problem = (
                "no_baseline"
                if not base
                else "duplicate_baseline"
                if len(base) > 1
                else "baseline_only"
                if len(members) == 1
                else None
            )
            if problem:
                ids = [r.input_id for r in members]
                notes.append(
                    {
                        "level": "warning",
                        "code": problem,
                        "message": f"group {gid} ({len(ids)} rows: {', '.join(ids[:5])}{'…' if len(ids) > 5 else ''}): "
                        f"{EDGE_MESSAGES[problem]}",
                    }
                )
                probes += [self._probe(r, "excluded", problem, gid) for r in members]
                continue
            for r in members:
                kind = "baseline" if r is base[0] else "variant"
                probes.append(
                    self._probe(
                        r,
                        kind,
                        r.metadata.get("perturbation_type") or ("baseline" if kind == "baseline" else "unknown"),
                        gid,
                    )
                )
        missing = sum(1 for p in probes if p["exclusion"] == "missing_original_query")
        if missing:
            notes.append(
                {
                    "level": "warning",
                    "code": "missing_original_query",
                    "message": f"{missing} rows have no metadata.original_query and are not scored",
                }
            )
        return probes, notes

    def _probe(self, row: DatasetRow, role: str, category: str, gid: str | None) -> dict:
        """A row's probe: its role (baseline, variant, excluded), its perturbation type (or, when
        excluded, why), its group."""
        msgs = messages_for(row)
        excluded = role == "excluded"
        return {
            "probe_id": _h(row.input_id, "perturbation"),
            "input_id": row.input_id,
            "role": role,
            "category": None if excluded else category,
            "exclusion": category if excluded else None,
            "group_id": gid,
            "query_text": row.last_user_text,
            "messages": json.dumps(msgs, ensure_ascii=False),
            "template_version": self.template_version,
        }

    def synthesize(self, ctx: StageContext):
        probes, notes = self.group_rows(ctx.rows())
        for n in notes:
            ctx.log(n["message"])
        yield {"probes": probes, "run_notes": notes}

    # ---- sampling: the off-platform answers, as given
    async def sample(self, ctx: StageContext):
        for ids in ctx.batches():
            rows = {r.input_id: r for r in ctx.rows(ids)}
            probes = ctx.read("probes", ids, ["probe_id", "input_id", "role"]).to_dict("records")
            yield {
                "sut_responses": [
                    given_response(p, rows[p["input_id"]].sut_response) for p in probes if p["role"] != "excluded"
                ]
            }

    # ---- judging: per group, base correctness, then per variant correctness + robustness
    async def judge(self, ctx: StageContext):
        cfg = ctx.config
        probes = ctx.read(
            "probes", None, ["probe_id", "input_id", "role", "category", "group_id", "query_text", "variant_id"]
        )
        probes = probes[probes["role"] != "excluded"].to_dict("records")
        resp = {
            r["probe_id"]: r
            for r in ctx.read(
                "sut_responses", None, ["probe_id", "sample_index", "status", "error", "response"]
            ).to_dict("records")
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
                    category=lambda v: self.verdict_category(v, kind),
                    retries=ctx.spec.judge_retries,
                    timeout=cfg.timeout_seconds,
                    temperature=ctx.spec.judge_temperature,
                    template_version=self.judge_template_version,
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

    # ---- aggregation
    def aggregate(self, ctx: StageContext):
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
        engine = Accumulator(self.formula, ["perturbation_type"])
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
                        "formula": self.formula.name,
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

    # ---- judge validation
    def audit_model(self, judgement):
        return {"correctness": Correctness, "robustness": Robustness}.get(judgement["judge_kind"])

    def exam_items(self, config, rows, seed, n):
        return exam.items(rows, seed, n)

    def verdict_category(self, verdict, kind):
        """A judge kind's score as its third (correctness:high, ...), or unjudgeable."""
        return "unjudgeable" if verdict.unjudgeable else f"{kind}:{third(getattr(verdict, kind))}"

    def audit_category(self, ctx, judgement, verdict):
        kind = judgement["judge_kind"]
        if verdict is not None:
            return self.verdict_category(verdict, kind)
        score = judgement["score"] if judgement["status"] == "ok" else None
        return "unjudgeable" if score is None else f"{kind}:{third(score)}"

    def summary(self, scores: pd.DataFrame) -> dict[str, Any]:
        overall = scores[scores["scope"] == "overall"].iloc[0]
        d = json.loads(overall["details"]) if overall["details"] else {}
        types = scores[scores["scope"] == "perturbation_type"].sort_values(["score", "group_key"])
        return {
            "score": overall["score"],
            "ci95": [overall["ci_low"], overall["ci_high"]],
            **d,
            "by_perturbation_type": [
                {"type": r["group_key"], "score": r["score"], "pairs": int(r["n"]), **json.loads(r["details"])}
                for _, r in types.iterrows()
            ],
        }

    def findings(self, scores: pd.DataFrame, evidence: Evidence) -> list[Finding]:
        """Each perturbation type whose score falls below the overall score's 95% interval (or its
        threshold): its score, robustness and correctness drop against the overall score, with the
        least robust variants' judge reasoning as examples."""
        ov = scores[scores["scope"] == "overall"].iloc[0]
        overall, lo = ov["score"], ov["ci_low"]
        threshold = None if ov["threshold"] is None or ov["threshold"] != ov["threshold"] else float(ov["threshold"])
        bar = min(x for x in (lo, overall, threshold) if x is not None and x == x) if overall is not None else None
        out: list[Finding] = []
        types = scores[scores["scope"] == "perturbation_type"].sort_values(["score", "group_key"])
        for _, r in types.iterrows():
            if bar is None or r["score"] is None or not r["score"] < bar:
                continue
            d = json.loads(r["details"]) if r["details"] else {}
            rob, drop = d.get("mean_robustness"), d.get("mean_correctness_drop")
            judged = evidence.query(
                "SELECT input_id, reasoning FROM judgements WHERE run_id = ? AND metric = ? AND judge_kind = "
                "'robustness' AND category = ? AND status = 'ok' ORDER BY score, input_id",
                [evidence.run_id, evidence.metric, r["group_key"]],
            )
            ids, quotes = examples_of(judged, lambda j: clip_quote(j["reasoning"], 70))
            below = threshold is not None and r["score"] < threshold
            out.append(
                Finding(
                    self.name,
                    f"Perturbation {r['group_key']} changes the answer: answers to its variants agree with the "
                    f"original's {pct(rob, 0)} of the time (robustness {rob:.3f}), correctness drop {drop:+.3f}; "
                    f"score {r['score']:.3f} vs {overall:.3f} overall, {int(r['n'])} variant pairs",
                    below and not bool(ov["passed"]),
                    float(overall - r["score"]),
                    {
                        "score": r["score"],
                        "overall": overall,
                        "overall_ci95": [lo, ov["ci_high"]],
                        "robustness": rob,
                        "correctness_drop": drop,
                        "pairs": int(r["n"]),
                    },
                    ids,
                    quotes,
                    "perturbation_type",
                    str(r["group_key"]),
                )
            )
        return out

    def format_summary(self, s: dict[str, Any]) -> list[str]:
        f = lambda x: "n/a" if x is None else f"{x:.3f}"  # noqa: E731
        lines = [
            f"  rows scored {s['rows_scored']}, {not_scored_phrase('rows', s.get('rows_excluded'))}, groups scored "
            f"{s.get('groups_scored')}, {not_scored_phrase('groups', s.get('groups_excluded'))}, variant pairs judged "
            f"{s.get('variant_pairs_judged')}, excluded {s.get('variant_pairs_excluded')}",
            "  score = 0.5 x robustness (the variant's answer agrees with the original's) + 0.5 x (1 - correctness "
            "drop) (how much less correct it is)",
            f"  {'perturbation type':<20}{'score':>8}{'robustness':>12}{'correctness drop':>18}{'pairs':>7}",
        ]
        for t in s["by_perturbation_type"]:
            lines.append(
                f"  {t['type']:<20}{f(t['score']):>8}{f(t['mean_robustness']):>12}"
                f"{t['mean_correctness_drop']:>+18.3f}{t['pairs']:>7}"
            )
        return lines


class PerturbationRobustness(PerturbationRobustnessExternal):
    """Hosted: variants made by the recipe within the run, answered by the SUT."""

    name = "llm.perturbation_robustness"
    spec_manifest = "llm.perturbation_robustness_external"  # the external scorer's spec
    version = "1.0.0"
    config_model = PerturbationRobustnessConfig
    calls_sut = True

    def estimate(self, ctx: StageContext) -> dict[str, int]:
        """The recipe's variants, plus a model paraphrase per row and variant when a synthesis model
        is configured (the dry run synthesises without a model, so these are added here)."""
        out = super().estimate(ctx)
        cfg = ctx.config
        if capabilities(ctx.spec.synthesis_connection()).writes and "paraphrase" in self.types(ctx):
            n = len(ctx.input_ids()) * cfg.variants_per_type
            out.update(synthesis_calls=n, sut_calls=out["sut_calls"] + n, judge_calls=out["judge_calls"] + 2 * n)
        return out

    def types(self, ctx: StageContext) -> list[str]:
        cfg = ctx.config
        if cfg.perturbation_types:
            return list(cfg.perturbation_types)
        llm = capabilities(ctx.spec.synthesis_connection()).writes
        return [t for t in ALL_TYPES if t != "paraphrase" or llm]

    def synthesize(self, ctx: StageContext):
        cfg = ctx.config
        rows = ctx.rows()
        types = self.types(ctx)
        paraphrases = {}
        if "paraphrase" in types:

            async def go():
                async with ctx.client("synthesis", "synthesis", 8) as client:
                    return await ask_paraphrases(
                        client, rows, cfg.variants_per_type, cfg.timeout_seconds, ctx.spec.judge_retries, 0.7
                    )

            paraphrases = asyncio.run(go())
        variants = generate_variants(rows, types, ctx.spec.seed, cfg.variants_per_type, paraphrases)
        probes, notes = self.group_rows(variants)
        seed_of = {v.input_id: v.metadata["seed_input_id"] for v in variants}
        for p in probes:  # a variant row belongs to its seed row: keep the seed row's input_id for batching
            p["variant_id"] = p["input_id"]
            p["input_id"] = seed_of[p["variant_id"]]  # (an id may itself contain "--")
            p["probe_id"] = _h(p["variant_id"], "perturbation")
        yield {"probes": probes, "run_notes": notes}

    def sample(self, ctx: StageContext):
        cfg = ctx.config
        return sample_probes(
            ctx,
            concurrency=cfg.sub_call_concurrency_limit,
            temperature=cfg.sut_temperature,
            retries=cfg.n_sut_retries,
            timeout=cfg.timeout_seconds,
            template_version=self.template_version,
        )
