"""The five stages, independent of Dagster: register a run, then ingest → synthesis →
sampling → judging → aggregation for one (run, metric) partition.

Stages are thin: load inputs from the warehouse, call the metric plug-in, replace the
partition's rows in one transaction, return metadata. Model calls happen before the write
connection opens; calls are journaled as they complete (crash-safe resume).
"""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from . import __version__
from .dataset import load_dataset
from .errors import AipError, SpecError
from .metrics import REGISTRY, get_metric
from .metrics.base import StageContext
from .models.client import check_endpoint
from .models.journal import Journal, journal_path
from .runspec import RunSpec, file_sha256, parse_spec, stable_json
from . import warehouse as wh

logger = logging.getLogger("aip_assets")
STAGES = ("ingest", "synthesis", "sampling", "judging", "aggregation")
Log = Callable[[str], None]


def new_run_id(spec: RunSpec, now: datetime | None = None) -> str:
    now = now or datetime.now(timezone.utc)
    return f"{spec.name}-{now.strftime('%Y%m%dT%H%M%SZ')}"


def preflight(spec: RunSpec) -> list[str]:
    """Check every endpoint answers before anything is written (raises EndpointError)."""
    async def go():
        seen, out = set(), []
        for role, conn in (("sut", spec.sut), ("judge", spec.judge)):
            if conn.endpoint_id() + conn.model in seen:
                continue
            seen.add(conn.endpoint_id() + conn.model)
            out.append(await check_endpoint(conn, role))
        return out
    return asyncio.run(go())


def register_run(spec: RunSpec, run_id: str, path: Path | None = None) -> dict[str, Any]:
    """Store the resolved spec (no secrets), metric versions, dataset hash and package version."""
    rows = load_dataset(spec.dataset)  # validates: bad input stops here, before any write
    rec = {
        "run_id": run_id, "spec_name": spec.name, "spec": stable_json(spec.resolved()),
        "metrics": json.dumps(list(spec.metrics)),
        "metric_versions": stable_json({m: REGISTRY[m].version for m in spec.metrics}),
        "dataset_path": spec.dataset, "dataset_sha256": file_sha256(spec.dataset), "n_dataset_rows": len(rows),
        "package_version": __version__, "seed": spec.seed, "created_at": datetime.now(timezone.utc).replace(tzinfo=None),
    }
    with wh.connect(path) as con:
        if con.execute("SELECT 1 FROM eval_runs WHERE run_id = ?", [run_id]).fetchone():
            raise SpecError(f"run {run_id} is already registered; pass it to --run-id to resume it")
        df = wh.frame("eval_runs", [rec])
        con.register("_incoming", df)
        con.execute(f"INSERT INTO eval_runs ({', '.join(df.columns)}) SELECT * FROM _incoming")
        con.unregister("_incoming")
    return rec


def run_exists(run_id: str, path: Path | None = None) -> bool:
    with wh.connect(path) as con:
        return con.execute("SELECT 1 FROM eval_runs WHERE run_id = ?", [run_id]).fetchone() is not None


def load_run(run_id: str, path: Path | None = None) -> tuple[RunSpec, dict[str, Any]]:
    with wh.connect(path) as con:
        cur = con.execute("SELECT * FROM eval_runs WHERE run_id = ?", [run_id])
        row = cur.fetchone()
        cols = [d[0] for d in cur.description]
    if row is None:
        raise SpecError(f"run {run_id!r} is not registered in {path or wh.default_path()}")
    rec = dict(zip(cols, row))
    spec = parse_spec(json.loads(rec["spec"]), where=f"eval_runs[{run_id}].spec")
    return spec, rec


def list_runs(path: Path | None = None) -> pd.DataFrame:
    return wh.query("SELECT run_id, spec_name, created_at, metrics FROM eval_runs ORDER BY created_at", path=path,
                    read_only=False)


def run_stage(stage: str, run_id: str, metric: str, log: Log | None = None, path: Path | None = None) -> dict[str, Any]:
    """Materialise one stage of one (run, metric) partition. Returns metadata for Dagster/CLI."""
    log = log or logger.info
    path = Path(path) if path else wh.default_path()
    spec, rec = load_run(run_id, path)
    if metric not in spec.metrics:
        raise AipError(f"metric {metric} is not configured for run {run_id} (configured: {', '.join(spec.metrics)}); "
                       "nothing to materialise for this partition")
    plugin = get_metric(metric)
    journal = Journal(journal_path(path))
    try:
        ctx = StageContext(run_id=run_id, metric=metric, spec=spec, config=spec.metric_config(metric),
                           journal=journal, read=lambda t: wh.read_partition(t, run_id, metric, path), log=log,
                           threshold=spec.metrics[metric].threshold)
        if stage == "ingest":
            sha = file_sha256(spec.dataset)
            if sha != rec["dataset_sha256"]:
                raise AipError(f"{spec.dataset}: the dataset changed since run {run_id} was registered "
                               f"(sha256 {rec['dataset_sha256'][:12]}… → {sha[:12]}…); start a new run")
            rows = load_dataset(spec.dataset)
            tables = {"dataset_rows": [{"row_index": i, **r.to_record()} for i, r in enumerate(rows)]}
        elif stage == "synthesis":
            tables = plugin.synthesize(ctx, ctx.rows())
        elif stage in ("sampling", "judging"):
            conn = spec.sut if stage == "sampling" else spec.judge
            asyncio.run(check_endpoint(conn, "sut" if stage == "sampling" else "judge"))
            tables = asyncio.run(plugin.sample(ctx) if stage == "sampling" else plugin.judge(ctx))
            tables["llm_calls"] = journal.frame(run_id, metric, stage)
        elif stage == "aggregation":
            tables = plugin.aggregate(ctx)
        else:
            raise ValueError(f"unknown stage {stage!r}; stages: {', '.join(STAGES)}")
        frames = {t: wh.frame(t, recs, run_id=run_id, metric=metric, **({"stage": stage} if t in wh.STAGE_SCOPED else {}))
                  for t, recs in tables.items()}
        counts = wh.write_partition(run_id, metric, frames, stage=stage, path=path)
    finally:
        journal.close()
    meta: dict[str, Any] = {f"rows.{t}": n for t, n in counts.items()}
    for t, df in frames.items():
        if "status" in df.columns and t != "llm_calls":
            meta[f"failed.{t}"] = int((df["status"].fillna("ok") != "ok").sum())
    if "llm_calls" in frames:
        calls = frames["llm_calls"]
        meta["calls.network"] = len(calls)
        meta["calls.failed"] = int((calls["status"] != "ok").sum()) if len(calls) else 0
        meta["tokens.prompt"] = int(calls["prompt_tokens"].fillna(0).sum()) if len(calls) else 0
        meta["tokens.completion"] = int(calls["completion_tokens"].fillna(0).sum()) if len(calls) else 0
    if stage == "aggregation":
        meta["summary"] = plugin.summary(frames["metric_scores"])
    log(f"{stage} [{run_id} × {metric}]: " + ", ".join(f"{k}={v}" for k, v in meta.items() if k != "summary"))
    return meta


def run_summary(run_id: str, path: Path | None = None) -> dict[str, Any]:
    spec, rec = load_run(run_id, path)
    out = {"run_id": run_id, "spec": spec.name, "dataset": spec.dataset, "metrics": {}}
    for metric in spec.metrics:
        scores = wh.read_partition("metric_scores", run_id, metric, path)
        if scores.empty:
            out["metrics"][metric] = {"status": "not aggregated"}
            continue
        s = get_metric(metric).summary(scores)
        ov = scores[scores["scope"] == "overall"].iloc[0]
        s["threshold"] = None if pd.isna(ov["threshold"]) else float(ov["threshold"])
        s["passed"] = None if pd.isna(ov["passed"]) else bool(ov["passed"])
        s["metric_name"] = ov["metric_name"]
        out["metrics"][metric] = s
    return out
