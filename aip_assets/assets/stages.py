"""The five stage assets, each partitioned by (run, metric) (partitions.py), with the warehouse tables each writes
as table assets (assets/tables.py). Thin: the pipeline does the work."""

from functools import partial
from typing import Any

from dagster import (
    AssetExecutionContext,
    AssetKey,
    AssetObservation,
    AssetSpec,
    Failure,
    MaterializeResult,
    MetadataValue,
    multi_asset,
)

from .. import checks
from .. import warehouse as wh
from ..errors import AipError
from ..metrics import get_metric
from ..partitions import evaluations, partition_key, split_key
from ..pipeline import load_run, logger, run_stage
from ..resources import Warehouse
from .tables import STAGE_TABLES, table_key, table_materialization_metadata, weakest_probes_preview

GROUP = "evaluation"
# A run of several metrics (jobs.evaluate_run) writes its report once, after the last one: it
# names the run here, in its own process (and in each --parallel worker), for as long as it
# evaluates. Anything else that materialises an aggregation (the UI, a re-execution, a retry)
# refreshes the report there. Not a run tag: a re-execution would copy it, and nobody would write.
REPORT_AFTER_ALL: set[str] = set()


class OperationalFailure(Failure):
    """A stage stopped by a failure outside the project (``errors.OperationalError``): `aip-eval
    run` exits 5 for it (``jobs.Outcome.kind``)."""


class LimitFailure(Failure):
    """A stage stopped at the run's limits (``errors.LimitReached``): exit 4, resumable."""


def stage_failure(e: AipError) -> Failure:
    """The Dagster failure of a stage for a user-facing error, of a class that says its kind
    (Dagster keeps the class name with the failure, where ``jobs.Outcome`` reads it)."""
    from ..errors import LimitReached, OperationalError

    cls = (
        OperationalFailure
        if isinstance(e, OperationalError)
        else LimitFailure
        if isinstance(e, LimitReached)
        else Failure
    )
    return cls(description=str(e), allow_retries=False)


def _known_failure(e: BaseException) -> AipError | None:
    from ..errors import disk_full
    from ..warehouse.opening import damaged

    return damaged(e) or disk_full(e)


def _materialise(stage: str, context: AssetExecutionContext, asset_key: AssetKey | None = None) -> MaterializeResult:
    try:
        run_id, metric = split_key(context.partition_key)

        def log(message: str) -> None:
            context.log.info(message)
            logger.info(message)

        def detail(message: str) -> None:  # the stage's counts: Dagster's log has them; the CLI's with -v
            context.log.info(message)
            logger.debug(message)

        def observe(progress: dict[str, Any]) -> None:  # a provider batch's status, as it changes
            context.log_event(
                AssetObservation(
                    asset_key=asset_key or AssetKey(stage), partition=context.partition_key, metadata=progress
                )
            )

        record = context.instance.get_run_record_by_id(context.run_id)  # when this run of the partition began
        since = record.start_time if record is not None and record.start_time else None
        meta = run_stage(stage, run_id, metric, log=log, observe=observe, since=since, detail=detail)
    except AipError as e:
        raise stage_failure(e) from None
    except Exception as e:
        known = _known_failure(e)  # a full disk (exit 5), a damaged warehouse file (exit 2): not a bug
        if known is None:
            raise
        raise stage_failure(known) from None
    out: dict[str, Any] = {}
    if "summary" in meta:  # aggregation: a headline to read first, then one typed entry per number
        later = run_id in REPORT_AFTER_ALL
        out.update(score_metadata(run_id, metric, meta["summary"], meta.get("gate") or {}, write=not later))
    out.update({k: v for k, v in meta.items() if k not in ("summary", "gate", "since_previous")})
    if "since_previous" in meta:  # the spec's previous run: its aggregation's page, and what changed since
        prev = str(meta["previous_run"])
        out["previous_run_url"] = MetadataValue.url(aggregation_partition_path(prev, metric))
        out["since_previous"] = MetadataValue.md(meta["since_previous"])
    if "summary" in meta:
        out["summary"] = MetadataValue.json(meta["summary"])  # everything, last
    check = []
    if stage in checks.CHECKS:
        spec, _ = load_run(run_id)
        check = checks.evaluate(stage, run_id, metric, spec)
    return MaterializeResult(asset_key=asset_key, metadata=out, check_results=check)


def _num(x: float | None) -> MetadataValue:
    return MetadataValue.float(round(float(x), 4)) if x is not None else MetadataValue.text("n/a")


def score_metadata(
    run_id: str, metric: str, s: dict[str, Any], g: dict[str, Any], write: bool = True
) -> dict[str, Any]:
    """An aggregation's metadata as people read it: a markdown headline (score, interval,
    threshold, verdict and why), then the score, its interval and threshold as separate floats
    named by the metric (so the asset's plot of each is that metric's history, not seven metrics
    on one line), passed, coverage, what was excluded, and the run's report (written now, or by
    the run of several metrics after its last one: ``write`` False)."""
    short = metric.split(".", 1)[-1]
    score, lo, hi, thr = g.get("score"), g.get("ci_low"), g.get("ci_high"), g.get("threshold")
    verdict = "PASS" if g.get("passed") else "FAIL"
    head = f"**{metric}** score **{score:.3f}**" if score is not None else f"**{metric}** no score"
    if lo is not None and hi is not None:
        head += f", 95% CI [{lo:.3f}, {hi:.3f}]"
    head += f", threshold {thr:.3f}" if thr is not None else ", no threshold"
    lines = [
        f"{head}: **{verdict}**",
        "",
        f"{g.get('gate_reason') or ''}",
        "",
        "```",
        *get_metric(metric).format_summary(s),
        "```",
    ]
    from ..findings import findings_markdown, remember, run_findings

    found = run_findings(run_id, [metric])  # the report takes them too (its metrics the same: a run of one)
    remember(run_id, metric, found)  # and `aip-eval run`'s summary (jobs.Outcome.findings)
    out: dict[str, Any] = {
        "headline": MetadataValue.md("\n".join(lines)),
        "findings": MetadataValue.md(findings_markdown([f.to_dict() for f in found])),
        "metric": MetadataValue.text(metric),
        f"{short} score": _num(score),
        f"{short} ci_low": _num(lo),
        f"{short} ci_high": _num(hi),
        f"{short} threshold": _num(thr),
        "passed": MetadataValue.bool(bool(g.get("passed"))),
        f"{short} coverage": _num(g.get("coverage")),
        "gate_reason": MetadataValue.text(g.get("gate_reason") or ""),
        "excluded": MetadataValue.json(g.get("excluded") or {}),
    }
    from ..report import default_out, report_url, write_report

    report = write_report(run_id, findings=(frozenset([metric]), found)) if write else default_out(run_id).resolve()
    out["report"] = MetadataValue.path(str(report))
    out["report_url"] = MetadataValue.url(report_url(report))  # opens while `aip-eval report --serve` runs
    out["report_how"] = MetadataValue.text(
        "`aip-eval ui` serves the reports beside Dagster (else run `aip-eval report --serve`), then open report_url"
        + ("" if write else " (written when the run's last metric ends)")
    )
    out.update(evidence_links(run_id, metric, report_url(report)))
    return out


def judgements_partition_path(run_id: str, metric: str) -> str:
    """The Dagster UI's page of this partition of the ``warehouse/judgements`` table asset (its
    preview of the pairs that matter), as the UI addresses it (``/assets/<key>?view=partitions&
    partition=<key>``); relative, so it opens on whichever host and port serve the UI."""
    from urllib.parse import quote, urlencode

    key = table_key("judgements")
    path = "/".join(quote(p, safe="") for p in key.path)
    return f"/assets/{path}?" + urlencode({"view": "partitions", "partition": partition_key(run_id, metric)})


def aggregation_partition_path(run_id: str, metric: str) -> str:
    """The Dagster UI's page of one partition of the ``aggregation`` asset (relative, as
    :func:`judgements_partition_path`)."""
    from urllib.parse import urlencode

    return "/assets/aggregation?" + urlencode({"view": "partitions", "partition": partition_key(run_id, metric)})


def group_view(scope: str, group: str) -> dict[str, str]:
    """The viewer's view of one breakdown: an axis (decision flip's ``gender``) is the viewer's
    ``axis`` filter; a group (group bias's ``religion=Muslim``) spans several personas, so its view
    is the viewer's ``group`` filter, which matches the attribute and value whole."""
    if scope == "axis":
        return {"axis": group}
    return {"group": group}


def failing_groups(run_id: str, metric: str) -> list[tuple[str, dict[str, str]]]:
    """The breakdowns of a metric that failed their threshold, worst first: (group_key, its view
    in the viewer, ``group_view``)."""
    with wh.connect(read_only=True) as con:
        rows = con.execute(
            "SELECT scope, group_key FROM metric_scores WHERE run_id = ? AND metric = ? AND NOT passed "
            "AND scope IN ('axis', 'attribute') ORDER BY score ASC NULLS FIRST, scope, group_key",
            [run_id, metric],
        ).fetchall()
    return [(group, group_view(scope, group)) for scope, group in rows]


def evidence_links(run_id: str, metric: str, report: str) -> dict[str, Any]:
    """Links from a score to its evidence: the report's viewer on this metric's flagged rows
    (``viewer``), one per breakdown that failed its threshold (``viewer <group>``), and the
    judgements partition in the Dagster UI (``judgements``)."""
    from ..report.links import viewer_link

    out: dict[str, Any] = {"viewer": MetadataValue.url(viewer_link(report, metric=metric, flagged=True))}
    for group, view in failing_groups(run_id, metric):
        out[f"viewer {group}"] = MetadataValue.url(viewer_link(report, metric=metric, flagged=True, **view))
    out["judgements"] = MetadataValue.url(judgements_partition_path(run_id, metric))
    return out


STAGES = [  # (asset name, pipeline stage, the stage before, description)
    ("ingest", "ingest", None, "dataset rows (gdi_text_v1) → dataset_rows"),
    (
        "synthesis",
        "synthesis",
        "ingest",
        "probes: persona pool, persona variants and pairs → persona_pool, probes, probe_pairs",
    ),
    ("sut_sampling", "sampling", "synthesis", "every SUT answer → sut_responses, llm_calls"),
    ("judging", "judging", "sut_sampling", "judge verdicts → judgements, llm_calls"),
    ("aggregation", "aggregation", "judging", "row and run scores with 95% intervals → row_scores, metric_scores"),
]


def _read_weakest(config, *, run_id: str, metric: str) -> str | None:
    with wh.connect(read_only=True, config=config) as con:
        return weakest_probes_preview(con, run_id, metric)


def _stage_asset(name: str, stage: str, before: str | None, description: str):
    """One stage as a multi_asset: the stage itself (its checks, its summary) and the warehouse
    tables it writes, each a table asset downstream of it (assets/tables.py). A failed gate (the
    aggregation's blocking ``gate`` check) fails the step last, once all of it is materialised."""
    specs = [
        AssetSpec(
            name,
            deps=[before] if before else [],
            description=description,
            group_name=GROUP,
            partitions_def=evaluations,
            kinds={"python"},
        ),
        *[
            AssetSpec(
                table_key(t),
                deps=[name],
                group_name=GROUP,
                partitions_def=evaluations,
                kinds={"duckdb", "table"},
                description=f"warehouse table {t}, written by {name}",
            )
            for t in STAGE_TABLES[stage]
        ],
    ]
    check_specs = checks.spec_for(stage, AssetKey(name), evaluations) if stage in checks.CHECKS else None

    @multi_asset(name=name, specs=specs, partitions_def=evaluations, check_specs=check_specs)
    def _stage(context: AssetExecutionContext, warehouse: Warehouse):
        from ..dagster_home import pooled

        pooled(context.instance)  # shared mode: Dagster's Postgres storage keeps its connections in this run
        result = _materialise(stage, context, asset_key=AssetKey(name))
        yield result
        run_id, metric = split_key(context.partition_key)

        def read(config):  # read all, then let go of the warehouse before yielding
            with wh.connect(read_only=True, config=config) as con:
                return {t: table_materialization_metadata(con, t, run_id, metric) for t in STAGE_TABLES[stage]}

        metas = wh.lean_first(read)
        for t, meta in metas.items():
            yield MaterializeResult(asset_key=table_key(t), metadata=meta)
        if stage == "aggregation":  # judged now: the probes asset's preview of the pairs that matter
            weakest = wh.lean_first(partial(_read_weakest, run_id=run_id, metric=metric))
            if weakest is not None:
                context.log_event(
                    AssetObservation(
                        asset_key=table_key("probes"),
                        partition=context.partition_key,
                        metadata={"preview": MetadataValue.md(weakest)},
                    )
                )
        failed = checks.gate_failure(run_id, metric, result.check_results)
        if failed is not None:  # everything is written and reported: now the run fails, saying why
            raise failed

    return _stage


ingest, synthesis, sut_sampling, judging, aggregation = (_stage_asset(*st) for st in STAGES)
STAGE_ASSETS = [ingest, synthesis, sut_sampling, judging, aggregation]
