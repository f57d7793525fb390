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
from .judge_exam import Exam, exam_tables, examined, reading_checks, run_exam
from .judge_exam import stored as stored_exam
from .logs import gate_words, stage_words
from .metrics import REGISTRY, get_metric
from .metrics.base import Metric, OverlayReader, StageContext
from .metrics.judging import panel_role
from .metrics.running import FAILED_OUTCOMES, Heartbeat
from .models.endpoint_check import check_endpoint
from .models.journal_pg import open_journal
from .models.providers import capabilities
from .runspec import RunSpec, parse_spec

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


class Preflight(list):
    """What the endpoint check found: a line per check (the list), and ``forms``, the
    structured-output forms it chose (journal records without a run id: ``record_forms``)."""

    def __init__(self, lines: list[str], forms: list[dict[str, Any]]):
        super().__init__(lines)
        self.forms = forms


def preflight(spec: RunSpec, run_id: str | None = None, path: Path | None = None) -> Preflight:
    """Check every endpoint answers before anything is written (raises EndpointError), and the
    shared-state database and the lake when configured (``AIP_SHARED_STATE_URL``,
    ``AIP_LAKE_DATA_PATH``; raises AipError). For an LLM judge (and an audit judge) with
    ``structured_output: auto``, find the structured-output form it takes (``client.negotiate``)
    unless the run ``run_id`` (resumed) has one recorded; with a form pinned, check the endpoint
    takes it (a refusal stops the run: it would fail every judgement).
    Returns what to log, a line per check, and the forms chosen (``Preflight.forms``)."""
    from .shared_state import check_shared_state
    from .warehouse import lake

    shared = [line for line in (check_shared_state(), lake.check()) if line]  # the database first: the lake's catalog
    forms: list[dict[str, Any]] = []
    recorded = _recorded_forms(run_id, path) if run_id else []

    async def go():
        out: list[str] = []
        roles = [(panel_role(i), c) for i, c in enumerate(spec.panel())]
        if any(get_metric(m).calls_sut for m in spec.metrics):
            roles.insert(0, ("sut", spec.sut))
        if spec.synthesis is not None:
            roles.append(("synthesis", spec.synthesis))
        if spec.judge_audit is not None:
            roles.append(("audit", spec.judge_audit.judge))
        checked: dict[str, str] = {}  # endpoint and model -> the role it was checked for
        probed: set[str] = set()
        for role, conn in roles:
            key = conn.endpoint_id() + conn.model
            judging = (role == "audit" or role.startswith("judge")) and capabilities(
                conn
            ).pinned_form is None  # judge-2... too
            if key in checked and not (judging and key not in probed):
                continue
            # a judge on the SUT's own endpoint and model is not checked twice, but is probed for its form
            line = (
                f"endpoint ok: {await check_endpoint(conn, role, **check_policy(spec, role))}"
                if key not in checked
                else f"endpoint ok: {role}: the {checked[key]}'s endpoint and model"
            )
            checked.setdefault(key, role)
            if judging:
                probed.add(key)
                line += "; " + await _structured_check(conn, role, recorded, forms)
            out.append(line)
        return out

    return Preflight(asyncio.run(go()) + shared, forms)


def examine(
    spec: RunSpec, run_id: str, forms: list[dict[str, Any]], path: Path | None = None, log: Log = logger.info
) -> Exam:
    """The judge exam of a new run (``judge_exam``), after the endpoint check and before any SUT
    call: the forms the check chose are recorded for the run first, so the exam asks in them.
    Raises ``ExamFailed`` (exit 2) when a judge fails; nothing is then written to the warehouse
    (the exam's calls stay in the run's journal: asked again under the same run id, they are
    answered from it)."""
    if not examined(spec):
        return Exam(run_id)
    record_forms(run_id, forms, path)
    exam = run_exam(spec, run_id, path, log)
    exam.raise_if_failed()
    return exam


def check_policy(spec: RunSpec, role: str, metrics: list[str] | None = None) -> dict[str, Any]:
    """How the endpoint check of ``role`` retries (``endpoint_check.check_endpoint``'s retries, timeout,
    backoff_s): as the calls it comes before do. The retry budget is theirs (the SUT's
    ``n_sut_retries``; a judge's ``n_judge_retries`` where the metric has one, else the spec's
    ``judge_retries``), the timeout their ``timeout_seconds``, the largest over ``metrics`` (default:
    every metric of the run that makes such calls), never fewer than ``CHECK_MIN_RETRIES`` retries;
    the backoff is the spec's ``retry_backoff_seconds``."""
    from .models.endpoint_check import CHECK_MIN_RETRIES

    names = [
        m for m in (metrics if metrics is not None else spec.metrics) if role != "sut" or get_metric(m).calls_sut
    ] or list(spec.metrics)
    cfgs = [spec.metric_config(m) for m in names]
    if role == "sut":
        retries = [getattr(c, "n_sut_retries", 0) for c in cfgs]
    elif role.startswith("judge") or role == "audit":
        retries = [getattr(c, "n_judge_retries", spec.judge_retries) for c in cfgs]
    else:  # synthesis
        retries = [spec.judge_retries]
    timeouts = [t for c in cfgs if (t := getattr(c, "timeout_seconds", None))]
    return {
        "retries": max(CHECK_MIN_RETRIES, *retries),
        "timeout": max(timeouts, default=60.0),
        "backoff_s": spec.retry_backoff_seconds,
    }


def stage_endpoint_check(ctx: StageContext, stage: str, conn, role: str) -> None:
    """The endpoint check at a stage's start, retried as its calls are (``check_policy``). An
    endpoint that answers but cannot be used (unauthorised, misconfigured) stops the stage
    (EndpointError). One still down after the retries does not: an outage is data, so the stage
    goes on, each of its calls is tried within its own retries, and those that fail are recorded
    as failed on their rows (the gate then counts them); a warning says so, in the log and in the
    run's notes."""
    from .errors import EndpointDown

    try:
        asyncio.run(check_endpoint(conn, role, log=ctx.log, **check_policy(ctx.spec, role, [ctx.metric])))
    except EndpointDown as e:
        msg = (
            f"{stage} [{ctx.run_id} × {ctx.metric}]: {e}. The endpoint is down: the stage goes on, and its "
            f"{role} calls that fail (each tried within its retries) are recorded as failed on their rows"
        )
        logger.warning(msg)
        ctx.notes.append({"level": "warning", "code": "endpoint_down", "message": msg})


async def _structured_check(conn, role: str, recorded: list[dict[str, Any]], forms: list[dict[str, Any]]) -> str:
    """The structured-output line of a judge's endpoint check (see ``preflight``)."""
    from .errors import EndpointError
    from .models.client import negotiate
    from .models.structured import configured_form

    setting = conn.structured_output
    pinned = configured_form(setting, capabilities(conn))
    if pinned == "prompt":
        return f"structured output: prompt (structured_output: {setting})"
    if pinned is not None:
        n = await negotiate(conn, role, forms=(pinned,))
        if n.answered:
            return f"structured output: {pinned} answers (structured_output: {setting})"
        why = n.tried[0][1]
        if why.startswith("refused "):
            raise EndpointError(
                f"{role} endpoint {conn.base_url} (model {conn.model}) refuses structured-output "
                f"form {pinned} {why[len('refused ') :]}; structured_output: {setting} never moves to "
                "another form: set structured_output: auto to find one it takes, or name a form it "
                "takes (json_schema, json_object_schema, json_object, prompt)"
            )
        return f"structured output: {pinned} (structured_output: {setting}), but the probe {why}"
    mine = [e for e in recorded if e["endpoint"] == conn.endpoint_id() and e["model"] == conn.model]
    if mine:
        from .models.structured import FORMS

        form = max(reversed(mine), key=lambda e: FORMS.index(e["form"]))["form"]
        return f"structured output: {form} (recorded for this run)"
    n = await negotiate(conn, role)
    forms.append(
        {
            "endpoint": conn.endpoint_id(),
            "model": conn.model,
            "role": role,
            "form": n.form,
            "previous": None,
            "how": "preflight",
            "reason": n.describe(),
        }
    )
    return f"structured output: {n.form} ({n.describe()})"


def _recorded_forms(run_id: str, path: Path | None) -> list[dict[str, Any]]:
    """The structured-output events recorded for a run ([] with no journal yet: none is made)."""
    from .models.journal import journal_path
    from .shared_state import shared_state_url
    from .warehouse import lake

    path = Path(path) if path else wh.default_path()
    if not (shared_state_url() and lake.enabled()) and not journal_path(path).exists():
        return []
    journal = open_journal(path)
    try:
        return journal.forms(run_id)
    finally:
        journal.close()


def record_forms(run_id: str, forms: list[dict[str, Any]], path: Path | None = None) -> None:
    """Record the structured-output forms the endpoint check chose for run ``run_id`` in its
    journal, where every stage of the run (in any process, resumed or not) finds them."""
    if not forms:
        return
    journal = open_journal(Path(path) if path else wh.default_path())
    try:
        for f in forms:
            journal.record_form({**f, "run_id": run_id})
    finally:
        journal.close()


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


class StagedTables:
    """A stage's output, written to Parquet batch by batch (memory bounded by the batch), then
    swapped into the warehouse as one transaction by :meth:`commit`."""

    def __init__(self, root: Path, run_id: str, metric: str, stage: str):
        self.dir = root / "staging" / run_id.replace("/", "_") / metric / stage
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True)
        self.run_id, self.metric, self.stage = run_id, metric, stage
        wh.release_memory()  # also puts Arrow on the system allocator, so later releases reach its pages
        self.files: dict[str, list[Path]] = {}
        self.rows: dict[str, int] = {}
        self.failed: dict[str, int] = {}  # records that failed (FAILED_OUTCOMES: an error, a SUT or judge failure)
        self.excluded: dict[str, int] = {}  # records excluded (no decision, an empty answer, unjudgeable...)
        self.calls = {"network": 0, "failed": 0, "prompt_tokens": 0, "completion_tokens": 0}

    def add(self, tables: dict[str, Any]) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        for table, recs in tables.items():
            const = {"run_id": self.run_id, "metric": self.metric}
            if table in wh.STAGE_SCOPED:
                const["stage"] = self.stage
            df = wh.frame(table, recs, **const)
            self.files.setdefault(table, [])
            self.rows[table] = self.rows.get(table, 0) + len(df)
            if not len(df):
                continue
            if "status" in df.columns and table != "llm_calls":
                status = df["status"].fillna("ok")
                failed = status.isin(FAILED_OUTCOMES)
                self.failed[table] = self.failed.get(table, 0) + int(failed.sum())
                self.excluded[table] = self.excluded.get(table, 0) + int(((status != "ok") & ~failed).sum())
            if table == "llm_calls":
                self.calls["network"] += len(df)
                self.calls["failed"] += int((df["status"] != "ok").sum())
                self.calls["prompt_tokens"] += int(pd.to_numeric(df["prompt_tokens"]).fillna(0).sum())
                self.calls["completion_tokens"] += int(pd.to_numeric(df["completion_tokens"]).fillna(0).sum())
            f = self.dir / f"{table}-{len(self.files[table]):05d}.parquet"
            pq.write_table(pa.Table.from_pandas(df, schema=wh.arrow_schema(table), preserve_index=False), f)
            self.files[table].append(f)

    def frame(self, table: str) -> pd.DataFrame:
        """What this stage has staged for ``table`` so far (before it is committed)."""
        files = self.files.get(table) or []
        return pd.concat([pd.read_parquet(f) for f in files], ignore_index=True) if files else pd.DataFrame()

    def commit(self, path: Path, guard: Callable[[], None] | None = None) -> None:
        wh.write_partition_files(self.run_id, self.metric, self.files, stage=self.stage, path=path, guard=guard)
        shutil.rmtree(self.dir, ignore_errors=True)

    def metadata(self) -> dict[str, Any]:
        meta: dict[str, Any] = {f"rows.{t}": n for t, n in self.rows.items()}
        meta.update({f"failed.{t}": n for t, n in self.failed.items()})
        meta.update({f"excluded.{t}": n for t, n in self.excluded.items()})
        if "llm_calls" in self.rows:
            meta.update(
                {
                    "calls.network": self.calls["network"],
                    "calls.failed": self.calls["failed"],
                    "tokens.prompt": self.calls["prompt_tokens"],
                    "tokens.completion": self.calls["completion_tokens"],
                }
            )
        return meta


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
            if stage == "sampling" and plugin.calls_sut:
                stage_endpoint_check(ctx, stage, spec.sut, "sut")
            if stage == "sampling":  # what the run can detect, said before its first SUT call
                for w in (plugin.plan(ctx) or {}).get("warnings", []):
                    log(w["message"])
                    ctx.notes.append(w)
            for i, conn in enumerate(spec.panel() if stage == "judging" else []):  # every judge of a panel
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
        meta["calls.network"], meta["calls.failed"] = journal.sent, journal.sent_failed
    detail(f"{stage_words(stage, meta)} [{run_id} × {metric}]")
    if stage == "aggregation":  # the metric's one line at the default level
        log(f"{metric}: {gate_words(meta['gate'])}")
    return meta


def finished_aggregate(plugin: Metric, ctx: StageContext) -> Iterator[dict[str, list[dict]]]:
    """A metric's ``aggregate`` with the gate applied to its run score, and the judges' checks
    added (the audit judge, position bias, a panel's agreement, people's labels): one engine for
    every metric, applied here so that no metric calls it."""
    from .gate import finish_scores
    from .human_labels import human_scores
    from .judge_audit import audit_scores, position_scores
    from .judge_panel import panel_scores

    for tables in plugin.aggregate(ctx):
        if "metric_scores" in tables:
            judges = (
                audit_scores(ctx, ctx.config) + position_scores(ctx, ctx.config, plugin) + panel_scores(ctx, ctx.config)
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


def run_summary(run_id: str, path: Path | None = None, metrics: list[str] | None = None) -> dict[str, Any]:
    """Each metric's headline numbers and its gate: ``passed`` true or false with ``gate_reason``;
    a metric that was not aggregated has ``passed`` false too. ``metrics``: only these (``aip-eval
    run --metric``), else every metric of the run."""
    spec, rec = load_run(run_id, path)
    out: dict[str, Any] = {"run_id": run_id, "spec": spec.name, "dataset": spec.dataset, "metrics": {}}
    shown = [m for m in spec.metrics if metrics is None or m in metrics]
    notes = [builtin_judge_note(spec, get_metric(m)) for m in shown]
    if any(notes):
        out["judge_note"] = next(n for n in notes if n)
    forms = structured_summary(spec, run_id, path)
    if forms:
        out["structured_output"] = forms
    exams = [e for e in stored_exam(run_id, path) if e["metric"] in shown]
    if exams:
        out["judge_exam"] = exams
    for metric in shown:
        scores = wh.read_partition("metric_scores", run_id, metric, path)
        if scores.empty:
            out["metrics"][metric] = {
                "status": "not aggregated",
                "score": None,
                "passed": False,
                "gate_reason": "not aggregated: a stage failed or has not run",
            }
            continue
        s = with_panel(get_metric(metric).summary(scores), scores)
        ov = scores[scores["scope"] == "overall"].iloc[0]
        s["threshold"] = None if ov["threshold"] is None or pd.isna(ov["threshold"]) else float(ov["threshold"])
        s["passed"] = bool(ov["passed"]) if ov["passed"] is not None else False
        s["gate_reason"] = ov["gate_reason"] or "no gate recorded (aggregated by an older version): re-run aggregation"
        s["coverage"] = None if ov["coverage"] is None or pd.isna(ov["coverage"]) else float(ov["coverage"])
        s["n_planned"] = None if ov["n_planned"] is None else int(ov["n_planned"])
        s["excluded"] = json.loads(ov["excluded"]) if ov["excluded"] else {}
        s["metric_name"] = ov["metric_name"]
        if notes[shown.index(metric)]:
            s["judge"] = "builtin (heuristic reader for the offline rig)"
        if reading := reading_checks(run_id, metric, path):
            s["judge_reading"] = reading
        s["since_previous"] = since_previous_json(run_id, metric, path)
        out["metrics"][metric] = s
    return out


def since_previous_json(run_id: str, metric: str, path: Path | None = None) -> dict[str, Any] | None:
    """The metric against the spec's previous run (``history``), for ``--json``: which run, each
    significant change (its figures, interval, adjusted p, whether worse, the sentence) and the
    drift; None when there was no previous run."""
    from .history import stored

    rows = stored(run_id, metric, path)
    if not len(rows):
        return None
    recs = rows.to_dict("records")
    keep = ("scope", "group_key", "score_a", "score_b", "diff", "ci_low", "ci_high", "p_adjusted", "worse", "sentence")
    return {
        "previous_run": recs[0]["previous_run"],
        "alpha": recs[0]["alpha"],
        "tests": sum(1 for r in recs if r["kind"] == "score" and r["p_value"] is not None),
        "changes": [{k: r[k] for k in keep} for r in recs if r["kind"] == "score" and r["significant"]],
        "drift": {
            r["scope"]: {
                "changed_share": r["score_b"],
                "common": r["n_b"],
                "sentence": r["sentence"],
                **({"details": json.loads(r["details"] or "{}")} if r["scope"] == "model" else {}),
            }
            for r in recs
            if r["kind"] == "drift"
        },
    }


def structured_summary(spec: RunSpec, run_id: str, path: Path | None = None) -> list[dict[str, Any]]:
    """Per LLM judge endpoint of the run (judge, each judge of a panel, audit judge, synthesis model): the
    structured-output form its requests for JSON use and how it came to it (``history``: the
    journal's events, oldest first: chosen before the run, lazily, or moved to after a refusal)."""
    from .models.structured import FORMS, configured_form

    conns = [
        *((panel_role(i), c) for i, c in enumerate(spec.panel())),  # a panel's every judge
        ("audit", spec.judge_audit.judge if spec.judge_audit else None),
        ("synthesis", spec.synthesis),
    ]
    events: list[dict[str, Any]] | None = None
    out: list[dict[str, Any]] = []
    seen = set()
    for role, conn in conns:
        if conn is None or capabilities(conn).pinned_form is not None or (conn.endpoint_id(), conn.model) in seen:
            continue
        seen.add((conn.endpoint_id(), conn.model))
        row: dict[str, Any] = {
            "role": role,
            "endpoint": conn.endpoint_id(),
            "model": conn.model,
            "structured_output": conn.structured_output,
        }
        pinned = configured_form(conn.structured_output, capabilities(conn))
        if pinned is not None:
            out.append({**row, "form": pinned, "history": []})
            continue
        if events is None:
            events = _recorded_forms(run_id, path)
        mine = [e for e in events if e["endpoint"] == conn.endpoint_id() and e["model"] == conn.model]
        form = max(reversed(mine), key=lambda e: FORMS.index(e["form"]))["form"] if mine else None
        out.append(
            {
                **row,
                "form": form,
                "history": [
                    {"how": e["how"], "form": e["form"], "previous": e["previous"], "reason": e["reason"]} for e in mine
                ],
            }
        )
    return out


# ------------------------------------------------------------------ estimates and limits
ASSUMED_ANSWER_TOKENS = 300  # when the SUT connection sets no max_tokens
JUDGE_PROMPT_TOKENS = 450  # a judge prompt's own text, before the answers it quotes
JUDGE_ANSWER_TOKENS = 80


def estimate(spec: RunSpec) -> dict[str, Any]:
    """What a run of ``spec`` will spend, without calling any model: ingest and synthesis run in a
    temporary warehouse (personas from the catalogue), then each metric counts its calls from
    the probes it made. Tokens are estimated at 4 characters a token."""
    import tempfile

    from .runspec import Connection
    from .warehouse import lake

    with (
        tempfile.TemporaryDirectory(prefix="aip-dry-run-") as tmp,
        lake.set_aside(),
    ):  # a local file, even in shared mode
        path = Path(tmp) / "estimate.duckdb"
        offline = spec.model_copy(update={"synthesis": Connection()})
        register_run(offline, "dry-run", path)
        sut_answer = spec.sut.max_tokens or ASSUMED_ANSWER_TOKENS
        out: dict[str, Any] = {
            "metrics": {},
            "assumptions": {
                "chars_per_token": 4,
                "sut_answer_tokens": sut_answer,
                "judge_prompt_tokens": JUDGE_PROMPT_TOKENS,
                "judge_answer_tokens": JUDGE_ANSWER_TOKENS,
            },
        }
        for metric in spec.metrics:
            for stage in ("ingest", "synthesis"):
                run_stage(stage, "dry-run", metric, log=lambda m: None, path=path)
            plugin = get_metric(metric)
            # the metric counts from the probes synthesised offline, with the run's real connections
            ctx = StageContext(
                run_id="dry-run",
                metric=metric,
                spec=spec,
                config=spec.metric_config(metric),
                journal=None,
                reader=WarehouseReader("dry-run", metric, path),
                threshold=spec.metrics[metric].threshold,
                batch_rows=spec.batch_rows,
            )
            e: dict[str, Any] = dict(plugin.estimate(ctx))
            plan = plugin.plan(ctx)
            if plan is not None:
                e["detectable"] = plan
            asked = e["judge_calls"]
            e["judge_calls"] *= len(spec.panel())  # a panel: every judge asked every verdict
            if spec.judge_audit is not None:  # the audit judge asks a share of the judgements again
                e["judge_calls"] += int(asked * spec.judge_audit.share + 0.999)
            e["sut_prompt_tokens"] = e.pop("sut_prompt_chars") // 4
            e["sut_completion_tokens"] = e["sut_calls"] * sut_answer
            e["judge_prompt_tokens"] = e["judge_calls"] * (JUDGE_PROMPT_TOKENS + 2 * sut_answer)
            e["judge_completion_tokens"] = e["judge_calls"] * JUDGE_ANSWER_TOKENS
            out["metrics"][metric] = e
    first = next(iter(out["metrics"].values()))
    tot = {k: sum(m[k] for m in out["metrics"].values()) for k in first if k != "detectable"}
    tot["calls"] = tot["sut_calls"] + tot["judge_calls"] + tot["synthesis_calls"]
    tot["tokens"] = sum(v for k, v in tot.items() if k.endswith("_tokens"))
    out["total"] = tot
    lim = spec.limits
    out["limits"] = lim.model_dump()
    out["within_limits"] = (lim.max_calls is None or tot["calls"] <= lim.max_calls) and (
        lim.max_tokens is None or tot["tokens"] <= lim.max_tokens
    )
    return out


def update_limits(run_id: str, max_calls: int | None, max_tokens: int | None, path: Path | None = None) -> None:
    """Raise (or set) a registered run's caps, recorded in its stored spec, so it can resume."""
    spec, rec = load_run(run_id, path)
    data = json.loads(rec["spec"])
    data.setdefault("limits", {})
    if max_calls is not None:
        data["limits"]["max_calls"] = max_calls
    if max_tokens is not None:
        data["limits"]["max_tokens"] = max_tokens
    parse_spec(data, where=f"eval_runs[{run_id}].spec")
    with wh.connect(path) as con:
        wh.transaction(
            con,
            lambda c: c.execute("UPDATE eval_runs SET spec = ? WHERE run_id = ?", [stable_json(data), run_id]),
            f"run {run_id}'s limits",
        )
