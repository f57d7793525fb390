"""The five stage assets, each partitioned by run × metric. Thin: the pipeline does the work."""


from typing import Any

from dagster import AssetExecutionContext, AssetKey, Failure, MaterializeResult, MetadataValue, asset

from .. import checks
from ..errors import AipError
from ..metrics import get_metric
from ..partitions import run_metric_partitions
from ..pipeline import load_run, logger, run_stage

GROUP = "evaluation"


def _materialise(stage: str, context: AssetExecutionContext) -> MaterializeResult:
    keys = context.partition_key.keys_by_dimension
    try:
        def log(message: str) -> None:
            context.log.info(message)
            logger.info(message)

        meta = run_stage(stage, keys["run"], keys["metric"], log=log)
    except AipError as e:
        raise Failure(description=str(e)) from None
    out: dict[str, Any] = {k: v for k, v in meta.items() if k not in ("summary", "gate")}
    if "summary" in meta:
        s = meta["summary"]
        out["score"] = MetadataValue.float(float(s["score"])) if s.get("score") is not None else MetadataValue.text("n/a")
        out["summary"] = MetadataValue.json(s)
        g = meta.get("gate") or {}
        out["passed"] = MetadataValue.bool(bool(g.get("passed")))
        out["gate_reason"] = MetadataValue.text(g.get("gate_reason") or "")
        out["coverage"] = MetadataValue.float(float(g["coverage"])) if g.get("coverage") is not None else MetadataValue.text("n/a")
        out["excluded"] = MetadataValue.json(g.get("excluded") or {})
        lines = [(f"**{keys['metric']}** score {s['score']:.3f}" if s.get("score") is not None else "no score")
                 + f", {'PASS' if g.get('passed') else 'FAIL'}: {g.get('gate_reason')}", "```",
                 *get_metric(keys["metric"]).format_summary(s), "```"]
        out["headline"] = MetadataValue.md("\n".join(lines))
        from ..report import write_report

        report = write_report(keys["run"])  # the run's report, refreshed as each metric lands
        out["report"] = MetadataValue.path(str(report))
        out["report_url"] = MetadataValue.url(report.resolve().as_uri())
    check = []
    if stage in checks.CHECKS:
        spec, _ = load_run(keys["run"])
        check = checks.evaluate(stage, keys["run"], keys["metric"], spec)
    return MaterializeResult(metadata=out, check_results=check)


@asset(partitions_def=run_metric_partitions, group_name=GROUP, description="dataset rows (gdi_text_v1) → dataset_rows",
       check_specs=checks.spec_for("ingest", AssetKey("ingest")))
def ingest(context: AssetExecutionContext) -> MaterializeResult:
    return _materialise("ingest", context)


@asset(partitions_def=run_metric_partitions, group_name=GROUP, deps=[ingest],
       description="probes: persona pool, persona variants and pairs → persona_pool, probes, probe_pairs")
def synthesis(context: AssetExecutionContext) -> MaterializeResult:
    return _materialise("synthesis", context)


@asset(partitions_def=run_metric_partitions, group_name=GROUP, deps=[synthesis],
       description="every SUT answer → sut_responses, llm_calls",
       check_specs=checks.spec_for("sampling", AssetKey("sut_sampling")))
def sut_sampling(context: AssetExecutionContext) -> MaterializeResult:
    return _materialise("sampling", context)


@asset(partitions_def=run_metric_partitions, group_name=GROUP, deps=[sut_sampling],
       description="judge verdicts → judgements, llm_calls",
       check_specs=checks.spec_for("judging", AssetKey("judging")))
def judging(context: AssetExecutionContext) -> MaterializeResult:
    return _materialise("judging", context)


@asset(partitions_def=run_metric_partitions, group_name=GROUP, deps=[judging],
       description="row and run scores with 95% intervals → row_scores, metric_scores",
       check_specs=checks.spec_for("aggregation", AssetKey("aggregation")))
def aggregation(context: AssetExecutionContext) -> MaterializeResult:
    return _materialise("aggregation", context)


STAGE_ASSETS = [ingest, synthesis, sut_sampling, judging, aggregation]
