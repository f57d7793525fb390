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

This module holds the plug-ins; the stages are in their own modules: ``recipe`` (the variants,
the paraphrase request, the export), ``synthesis`` (the rows grouped, one probe each),
``judging``, ``aggregate`` and ``words`` (summary, findings, terminal lines).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pandas as pd

from ...dataset import DatasetRow
from ...models.providers import capabilities
from ...perturbations import ALL_TYPES
from ...scoring import PERTURBATION_GROUP
from ...stats import third
from ..answers import given_response, sample_probes
from ..base import THIRDS, THIRDS_TEXT, KeyRate, Metric, StageContext, thirds
from ..words import Evidence, Finding
from . import exam, words
from .aggregate import aggregate
from .builtin_judge import BUILTIN_JUDGES
from .config import PerturbationRobustnessConfig, PerturbationRobustnessExternalConfig
from .judging import judge
from .prompts import Correctness, Robustness
from .recipe import ask_paraphrases, generate_variants
from .synthesis import _h, group_rows

HUMAN_ITEMS = {  # what a person labels, per judge kind (human_labels.py)
    "correctness": "correctness of the answer (against the reference where given)",
    "robustness": "robustness: does the answer to the reworded question keep the substance of the original's",
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

    # ---- synthesis (synthesis.py): group the rows (full dataset)
    def group_rows(self, rows: list[DatasetRow]) -> tuple[list[dict], list[dict]]:
        return group_rows(self, rows)

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

    # ---- judging (judging.py): per group, base correctness, then per variant correctness + robustness
    def judge(self, ctx: StageContext):
        return judge(self, ctx)

    # ---- aggregation (aggregate.py) and words (words.py)
    def aggregate(self, ctx: StageContext):
        return aggregate(self, ctx)

    def summary(self, scores: pd.DataFrame) -> dict[str, Any]:
        return words.summary(scores)

    def findings(self, scores: pd.DataFrame, evidence: Evidence) -> list[Finding]:
        return words.findings(self.name, scores, evidence)

    def format_summary(self, s: dict[str, Any]) -> list[str]:
        return words.format_summary(s)

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
