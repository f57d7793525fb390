"""The five stages, independent of Dagster: register a run, then ingest → synthesis →
sampling → judging → aggregation for one (run, metric) partition.

Stages are thin: load inputs from the warehouse, call the metric plug-in, replace the
partition's rows in one transaction, return metadata. Model calls happen before the write
connection opens; calls are journaled as they complete (crash-safe resume).

Around them: the checks before a run writes anything (``preflight``), a stage's output staged on
disk until it commits (``staging``), a run's results read back (``summary``) and what a run will
spend (``estimate``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd

from . import __version__, interrupts
from . import warehouse as wh
from .dataset import load_dataset
from .errors import AipError, SpecError
from .hashing import file_sha256, stable_json
from .judge_exam import Exam, exam_tables
from .judge_exam import stored as stored_exam
from .logs import gate_words, stage_words
from .metrics import REGISTRY, ahead, get_metric
from .metrics.base import Metric, OverlayReader, StageContext
from .metrics.judging import panel_role
from .metrics.running import Heartbeat
from .models.journal_pg import open_journal
from .models.providers import capabilities
from .preflight import checked_before_the_run, record_forms, stage_endpoint_check
from .runspec import RunSpec, parse_spec
from .staging import StagedTables

logger = logging.getLogger("aip_assets")
STAGES = ("ingest", "synthesis", "sampling", "judging", "aggregation")
Log = Callable[[str], None]


RUN_TIME = "%y%m%d-%H%M"  # a run id's time, UTC to the minute: short enough that a partition key reads whole


def new_run_id(spec: RunSpec, now: datetime | None = None) -> str:
    """``<spec name>-<yymmdd-hhmm>`` (UTC), ``demo-261201-2103``: with the metric, the partition key
    ``demo-261201-2103|llm.decision_flip`` (34 characters) fits the Dagster UI's list of
    materialisations whole. Two runs of one spec within a minute: the caller adds ``-2``, ``-3``."""
    now = now or datetime.now(UTC)
    return f"{spec.name}-{now.astimezone(UTC).strftime(RUN_TIME)}"


def validate_datasets(spec: RunSpec) -> dict[str, int]:
    """Read and validate every dataset the spec names (the run's and each metric's): {path: rows}.
    Raises DatasetError naming the file, row and field; touches nothing."""
    datasets = spec.datasets()
    if spec.dataset not in datasets:  # every metric has its own: the run's dataset is still recorded
        datasets = [spec.dataset, *datasets]
    return {ds: len(load_dataset(ds)) for ds in datasets}


def check_run_id(run_id: str, field: str = "run id") -> None:
    """A run id is a partition key, a file name part and a line of every log: non-empty, without
    '|', leading or trailing spaces, or control and format characters (a newline, a tab, a NUL, a
    zero-width space, a bidi override). SpecError naming ``field`` (``--run-id`` on the command line)."""
    import unicodedata

    bad = next((c for c in run_id or "" if unicodedata.category(c) in ("Cc", "Cf", "Cs", "Co", "Cn")), None)
    if bad is not None:
        raise SpecError(
            f"{field} {run_id!r}: must not contain control or invisible characters (found U+{ord(bad):04X}"
            f"{' ' + unicodedata.name(bad, '') if unicodedata.name(bad, '') else ''}); use letters, digits, '-', '_' or '.'"
        )
    if not run_id or "|" in run_id or run_id != run_id.strip():
        raise SpecError(
            f"{field} {run_id!r}: must be non-empty, without '|' (it separates the run from the metric in "
            "Dagster's partition keys) and without leading or trailing spaces"
        )


def register_run(
    spec: RunSpec,
    run_id: str,
    path: Path | None = None,
    n_rows: dict[str, int] | None = None,
    forms: list[dict[str, Any]] | None = None,
    exam: Exam | None = None,
) -> dict[str, Any]:
    """Store the resolved spec (no secrets), metric versions, dataset hash and package version;
    the one step that creates the warehouse. ``n_rows``: the datasets already validated;
    ``forms``: the structured-output forms the endpoint check chose (``preflight(...).forms``),
    recorded for the run in its journal; ``exam``: the judge exam the run passed (``examine``),
    stored with it (``judge_exams`` and its calls in ``llm_calls``), in the same transaction."""
    check_run_id(run_id)
    n_rows = n_rows or validate_datasets(spec)  # validates: bad input stops here
    datasets = list(n_rows)
    shas = {ds: file_sha256(ds) for ds in datasets}
    rec = {
        "run_id": run_id,
        "spec_name": spec.name,
        "spec": stable_json(spec.resolved()),
        "metrics": json.dumps(list(spec.metrics)),
        "metric_versions": stable_json({m: REGISTRY[m].version for m in spec.metrics}),
        "dataset_path": spec.dataset,
        "dataset_sha256": shas[spec.dataset],
        "n_dataset_rows": n_rows[spec.dataset],
        "datasets": stable_json(shas),
        "package_version": __version__,
        "seed": spec.seed,
        "created_at": datetime.now(UTC).replace(tzinfo=None),
    }
    tables = {"eval_runs": wh.frame("eval_runs", [rec])}
    if exam is not None and exam.judges:
        tables.update(exam_tables(exam, run_id, path))

    def insert(con) -> None:  # the check and the insert in one transaction (a lake has no primary key)
        if con.execute("SELECT 1 FROM eval_runs WHERE run_id = ?", [run_id]).fetchone():
            raise AlreadyRegistered(f"run {run_id} is already registered; pass it to --run-id to resume it")
        for table, df in tables.items():
            wh.insert_frame(con, table, df)

    from .warehouse import lake

    with wh.connect(path, create=True) as con, lake.registration_lock():
        wh.transaction(con, insert, f"run {run_id}")
    record_forms(run_id, forms or [], path)
    return rec


class AlreadyRegistered(SpecError):
    """``register_run`` of a run id another worker (or an earlier run) registered."""


def spec_differences(
    spec: RunSpec, run_id: str, path: Path | None = None, limit: int = 5, ignore: tuple[str, ...] = ()
) -> list[str]:
    """Where ``spec`` (resolved) and its datasets differ from the registered run's: one line per
    field (``metrics.llm.decision_flip.config.dimensions: [...] here, [...] registered``), at most
    ``limit`` (then how many more); [] when they are the same. ``ignore``: top-level fields left out."""
    stored, rec = load_run(run_id, path)
    out: list[str] = []

    def walk(a: Any, b: Any, where: str) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            for k in sorted(set(a) | set(b), key=str):
                walk(a.get(k), b.get(k), f"{where}.{k}" if where else str(k))
        elif a != b:
            out.append(
                f"{where}: {json.dumps(a, default=str)[:120]} here, {json.dumps(b, default=str)[:120]} registered"
            )

    mine, theirs = (json.loads(stable_json(s.resolved())) for s in (spec, stored))
    for k in ignore:
        mine.pop(k, None)
        theirs.pop(k, None)
    walk(mine, theirs, "")
    shas = json.loads(rec["datasets"] or "{}")
    for ds in spec.datasets() if spec.dataset in spec.datasets() else [spec.dataset, *spec.datasets()]:
        if ds in shas and Path(ds).exists() and file_sha256(ds) != shas[ds]:
            out.append(f"{ds}: the file changed since the run was registered (sha256 {shas[ds][:12]}… registered)")
    return out[:limit] + ([f"... and {len(out) - limit} more"] if len(out) > limit else [])


def run_exists(run_id: str, path: Path | None = None) -> bool:
    """Whether ``run_id`` is registered (False when there is no warehouse yet; none is created)."""
    path = Path(path) if path else wh.default_path()
    if not wh.exists(path):
        return False
    with wh.connect(path, read_only=True) as con:
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
    return wh.query(
        "SELECT run_id, spec_name, created_at, metrics FROM eval_runs ORDER BY created_at", path=path, read_only=True
    )


class WarehouseReader:
    """Reads one (run, metric) partition from the warehouse, a batch of rows at a time."""

    def __init__(self, run_id: str, metric: str, path: Path):
        self.run_id, self.metric, self.path = run_id, metric, path

    def read(self, table: str, ids: list[str] | None = None, columns: list[str] | None = None) -> pd.DataFrame:
        return wh.read_partition(table, self.run_id, self.metric, self.path, ids=ids, columns=columns)

    def count(self, table: str) -> int:
        with wh.connect(self.path) as con:
            row = con.execute(
                f"SELECT count(*) FROM {table} WHERE run_id = ? AND metric = ?", [self.run_id, self.metric]
            ).fetchone()
        return int(row[0]) if row else 0

    def status_counts(self, table: str) -> dict[str, int]:
        with wh.connect(self.path) as con:
            return wh.status_counts(con, table, self.run_id, self.metric)

    def input_ids(self) -> list[str]:
        df = wh.read_partition(
            "dataset_rows", self.run_id, self.metric, self.path, order_by="row_index", columns=["input_id"]
        )
        return list(df["input_id"])


def _drain_async(agen, staged: StagedTables) -> None:
    async def go():
        async for tables in agen:
            staged.add(tables)
            interrupts.check()  # a metric that booked the stopped calls as failures: no further batch

    asyncio.run(go())


def run_stage(
    stage: str,
    run_id: str,
    metric: str,
    log: Log | None = None,
    path: Path | None = None,
    observe: Callable[[dict[str, Any]], None] | None = None,
    since: float | None = None,
    detail: Log | None = None,
) -> dict[str, Any]:
    """Materialise one stage of one (run, metric) partition. Returns metadata for Dagster/CLI.
    ``log``: what a reader of the command's output reads (default the ``aip_assets`` logger's
    info); ``detail``: the stage's counts in words (default its debug: ``aip-eval run -v``).
    ``observe``: progress while the stage runs, as metadata (a provider batch's status and counts
    each time they change; Dagster records it as an asset observation).

    The stage streams: each batch of rows is processed and staged on disk, and the partition's
    rows are replaced in one transaction at the end. A stage that fails writes nothing.

    Ctrl-C or SIGTERM (interrupts.py) stops it: no call starts after the signal, the calls in
    flight are answered and journaled, and it ends with ``StageInterrupted`` having written nothing.

    One worker at a time does a partition's stage (leases.py): the stage waits for the partition's
    lease, and holds it until its write commits. ``since``: when this worker's evaluation of the
    partition began (epoch seconds); a stage another worker committed after that (while this one
    waited) is not done again: its result is what this one goes on from.
    """
    from . import leases

    log = log or logger.info
    detail = detail or logger.debug
    path = Path(path) if path else wh.default_path()
    with interrupts.handled():
        try:
            interrupts.check()  # a signal before it began (between two stages): it does not start
            _check_partition(
                stage, run_id, metric, path
            )  # before the lease: a partition that is not one leaves nothing
            with leases.held(run_id, metric, stage, path, log) as lease:
                before = STAGES[STAGES.index(stage) - 1] if stage != STAGES[0] else None
                done = lease.done_since(since, before) if since is not None else None
                if done is not None:
                    return _done_elsewhere(stage, run_id, metric, path, log, done)
                return _run_stage(stage, run_id, metric, log, path, observe, lease, detail)
        except interrupts.Interrupted as e:
            raise interrupts.StageInterrupted(
                f"{stage} [{run_id} × {metric}]: {e}; its calls answered so far are "
                "journaled, nothing of the stage is written"
            ) from None


def _check_partition(stage: str, run_id: str, metric: str, path: Path) -> None:
    """The run is registered with the metric configured, and the stage is one (else the error to show)."""
    spec, _ = load_run(run_id, path)
    if metric not in spec.metrics:
        raise AipError(
            f"metric {metric} is not configured for run {run_id} (configured: {', '.join(spec.metrics)}); "
            "nothing to materialise for this partition"
        )
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; stages: {', '.join(STAGES)}")


def _done_elsewhere(stage: str, run_id: str, metric: str, path: Path, log: Log, done: dict[str, Any]) -> dict[str, Any]:
    """The metadata of a stage another worker committed since this one began: its result, read back."""
    when = datetime.fromtimestamp(done["at"], UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    meta: dict[str, Any] = {"done_by": f"another worker, {done['by']}, at {when}"}
    if stage == "aggregation":
        meta.update(_aggregation_meta(run_id, metric, get_metric(metric), path))
    log(
        f"{stage} [{run_id} × {metric}]: done by another worker ({done['by']}) since this one began; going on "
        "from its result"
    )
    return meta


def _aggregation_meta(run_id: str, metric: str, plugin, path: Path) -> dict[str, Any]:
    """An aggregation's summary and gate, as written."""
    scores = wh.read_partition("metric_scores", run_id, metric, path)
    ov = scores[scores["scope"] == "overall"].iloc[0]
    exam = [e["line"] for e in stored_exam(run_id, path) if e["metric"] == metric]
    from .history import since_metadata

    return {
        **since_metadata(run_id, metric, path),
        **({"judge_exam": "\n".join(exam)} if exam else {}),
        "summary": with_panel(plugin.summary(scores), scores),
        "gate": {
            "passed": ov["passed"],
            "gate_reason": ov["gate_reason"],
            "coverage": ov["coverage"],
            "excluded": json.loads(ov["excluded"] or "{}"),
            "score": _num(ov["score"]),
            "ci_low": _num(ov["ci_low"]),
            "ci_high": _num(ov["ci_high"]),
            "threshold": _num(ov["threshold"]),
        },
    }


def _run_stage(
    stage: str,
    run_id: str,
    metric: str,
    log: Log,
    path: Path,
    observe: Callable[[dict[str, Any]], None] | None,
    lease,
    detail: Log,
) -> dict[str, Any]:
    spec, rec = load_run(run_id, path)  # read again under the lease: the last holder may have changed it
    plugin = get_metric(metric)
    journal = open_journal(path)
    staged = StagedTables(path.parent, run_id, metric, stage)
    # aggregation has no calls to count: it says what it does while it takes long
    beat = Heartbeat(f"{stage} [{run_id} × {metric}]", "reading its inputs").start() if stage == "aggregation" else None
    try:
        ctx = StageContext(
            run_id=run_id,
            metric=metric,
            spec=spec,
            config=spec.metric_config(metric),
            journal=journal,
            reader=WarehouseReader(run_id, metric, path),
            log=log,
            threshold=spec.metrics[metric].threshold,
            batch_rows=spec.batch_rows,
            observe=observe,
        )
        if stage == "ingest":
            path_ds = spec.dataset_for(metric)
            registered = json.loads(rec["datasets"] or "{}").get(path_ds) or rec["dataset_sha256"]
            sha = file_sha256(path_ds)
            if sha != registered:
                raise AipError(
                    f"{path_ds}: the dataset changed since run {run_id} was registered "
                    f"(sha256 {registered[:12]}… → {sha[:12]}…); start a new run"
                )
            rows = load_dataset(path_ds)
            for i in range(0, len(rows), spec.batch_rows):
                staged.add(
                    {
                        "dataset_rows": [
                            {"row_index": i + k, **r.to_record()} for k, r in enumerate(rows[i : i + spec.batch_rows])
                        ]
                    }
                )
        elif stage == "synthesis":
            for tables in plugin.synthesize(ctx):
                staged.add(tables)
            for frame in journal.frames(run_id, metric, stage):  # calls of a synthesis model, if any
                staged.add({"llm_calls": frame})
        elif stage in ("sampling", "judging"):
            if stage == "sampling" and plugin.calls_sut and not checked_before_the_run(ctx):
                stage_endpoint_check(ctx, stage, spec.sut, "sut")
            if stage == "sampling":  # what the run can detect, said before its first SUT call
                for w in (plugin.plan(ctx) or {}).get("warnings", []):
                    log(w["message"])
                    ctx.notes.append(w)
            done = ahead.checked(ctx) if stage == "judging" else set()  # checked during sampling (metrics.ahead)
            for i, conn in enumerate(spec.panel() if stage == "judging" else []):  # every judge of a panel
                if panel_role(i) not in done:
                    stage_endpoint_check(ctx, stage, conn, panel_role(i))
            _drain_async(plugin.sample(ctx) if stage == "sampling" else plugin.run_judge(ctx), staged)
            if stage == "judging" and spec.judge_audit is not None:  # a second judge for a sample
                from .judge_audit import audit

                judged = OverlayReader(ctx.reader, {"judgements": staged.frame("judgements")})
                staged.add({"judge_audits": asyncio.run(audit(replace(ctx, reader=judged), plugin))})
            for frame in journal.frames(run_id, metric, stage):
                staged.add({"llm_calls": frame})
            if stage == "judging" and (note := builtin_judge_note(spec, plugin)):
                log(note)
                ctx.notes.append({"level": "warning", "code": "builtin_judge", "message": note})
        else:
            assert beat is not None
            beat.phase = "scoring (units, rows, axes and groups, intervals, claims)"
            for tables in finished_aggregate(plugin, ctx):
                staged.add(tables)
            beat.phase = "writing its tables"
        if ctx.notes:
            staged.add({"run_notes": ctx.notes})
        interrupts.check()  # stopped calls a metric booked as failures are never written
        staged.commit(path, guard=lease.check)  # at each try: still this worker's partition (else not written)
        if beat is not None:  # against the spec's previous run: the regression check, SUT drift
            from .history import check_regression

            beat.phase = "comparing with the spec's previous run"
            check_regression(run_id, metric, spec.fail_on_regression, path, log)
        lease.mark_done()
        meta = staged.metadata()
        if beat is not None:
            beat.phase = "reading its summary back"
            meta.update(_aggregation_meta(run_id, metric, plugin, path))
    finally:
        if beat is not None:
            beat.stop()
        with interrupts.handled(stop=False):  # the journal written whole, even if a signal comes now
            journal.close()
        shutil.rmtree(staged.dir, ignore_errors=True)
    if "calls.network" in meta:  # the calls this process sent, not those of a stage it resumes (journal.sent)
        meta["calls.network"], meta["calls.failed"] = journal.sent[stage], journal.sent_failed[stage]
    detail(f"{stage_words(stage, meta)} [{run_id} × {metric}]")
    if stage == "aggregation":  # the metric's one line at the default level
        log(f"{metric}: {gate_words(meta['gate'])}")
    return meta


def finished_aggregate(plugin: Metric, ctx: StageContext) -> Iterator[dict[str, list[dict]]]:
    """A metric's ``aggregate`` with the gate applied to its run score, and the judges' checks
    added (the audit judge, position bias, a panel's agreement, people's labels): one engine for
    every metric, applied here so that no metric calls it. BLAS on one thread meanwhile
    (``analysis.blas``: the analysis's products are small; the same figures, half the CPU)."""
    from .analysis import blas
    from .gate import finish_scores
    from .human_labels import human_scores
    from .judge_audit import audit_scores, position_scores
    from .judge_panel import panel_scores

    with blas.one_thread():
        for tables in plugin.aggregate(ctx):
            if "metric_scores" in tables:
                judges = (
                    audit_scores(ctx, ctx.config)
                    + position_scores(ctx, ctx.config, plugin)
                    + panel_scores(ctx, ctx.config)
                )
                judges += human_scores(ctx, plugin)  # people's labels (aip-eval label import), kept on re-aggregation
                tables = {**tables, "metric_scores": finish_scores(ctx, tables["metric_scores"]) + judges}
            yield tables


def with_panel(summary: dict[str, Any], scores: pd.DataFrame) -> dict[str, Any]:
    """A metric's summary with its judge panel's agreement (``judge_panel``), when it had one."""
    from .judge_panel import panel_summary

    panel = panel_summary(scores)
    return {**summary, "judge_panel": panel} if panel is not None else summary


def _num(x: Any) -> float | None:
    """A stored number, None for NULL / NaN."""
    return None if x is None or pd.isna(x) else float(x)


BUILTIN_JUDGE_NOTE = (
    "the judge is the builtin model, a heuristic reader meant for the offline calibration rig, "
    "while the SUT is {sut}: its verdicts rest on patterns (decision lines, yes/no stances, "
    "figures) and exclude what they cannot read; point `judge:` at an LLM for a real evaluation "
    "(docs/judges.md)"
)


def builtin_judge_note(spec: RunSpec, plugin) -> str | None:
    """Say which judge spoke: the builtin judge on a SUT that is not the builtin model."""
    if capabilities(spec.judge).offline and not capabilities(spec.sut).offline and plugin.calls_sut:
        return BUILTIN_JUDGE_NOTE.format(sut=f"{spec.sut.base_url} ({spec.sut.model})")
    return None
