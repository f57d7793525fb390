"""The evaluate job, the light Definitions that run it without the automation, and the one loop
that evaluates a registered run's metrics.

``aip-eval run`` and the launcher job resolve ``evaluate`` here: building the full Definitions
would also build a schedule per spec in ``runs/``, and a broken or duplicate spec there must not
stop an evaluation.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from multiprocessing import get_context
from typing import Any

from dagster import Definitions, define_asset_job, in_process_executor

from . import interrupts
from .assets import STAGE_ASSETS
from .assets.stages import REPORT_AFTER_ALL
from .partitions import partition_key, register_partitions
from .resources import SutConnection, Warehouse

# in-process: the stages of a partition run one after another in the run's process (the default
# multiprocess executor starts a Python process per step, which cost minutes per UI launch)
evaluate_job = define_asset_job(
    "evaluate",
    selection=STAGE_ASSETS,  # partitioned like its assets
    description="All five stages for one <run>|<metric> partition.",
    executor_def=in_process_executor,
)
RESOURCES = {"warehouse": Warehouse(), "sut": SutConnection()}


@functools.cache
def evaluate():
    """The resolved evaluate job (its resources bound), as `dagster dev` has it."""
    return Definitions(
        assets=STAGE_ASSETS, jobs=[evaluate_job], resources=RESOURCES, executor=in_process_executor
    ).resolve_job_def("evaluate")


@dataclass
class Outcome:
    """How one metric's evaluate run ended: what `aip-eval run` and the launcher report.
    ``success`` is the Dagster run's; ``gate_failed``: it failed only because the metric's gate
    failed (its stages all ran and wrote their tables: exit 1, not a failed stage); ``interrupted``:
    a Ctrl-C or SIGTERM stopped it (exit 130; its Dagster run is marked canceled)."""

    metric: str
    success: bool
    dagster_run_id: str
    errors: list[str] = field(default_factory=list)  # each failed step's innermost message
    gate_failed: bool = False
    interrupted: bool = False
    kind: str = ""  # a failed run's: "gate", "limit", "operational", "input" (an AipError) or "bug"
    tracebacks: list[str] = field(default_factory=list)  # a bug's: each failed step's whole error, to save
    gate_reason: str = ""  # a failed gate's reason (gate.decide), as its Failure's metadata carries it
    # the metric's findings its aggregation read for its metadata in this run (findings.take: the warehouse
    # read, the findings), for the CLI's summary; None: not in this run (read them again)
    findings: tuple[str, list[Any]] | None = None

    @property
    def completed(self) -> bool:
        """Every stage ran: the run succeeded, or failed on its gate alone."""
        return self.success or self.gate_failed


def _root_message(err) -> str:
    """The innermost cause of a Dagster step error: what actually went wrong."""
    while getattr(err, "cause", None) is not None:
        err = err.cause
    return err.message.strip()


def gate_only(failures) -> bool:
    """Did a run fail on its gate alone? ``failures``: the StepFailureData of its failed steps."""
    from .checks import is_gate_failure

    failures = list(failures)
    return bool(failures) and all(is_gate_failure(f) for f in failures)


KINDS = {"OperationalFailure": "operational", "LimitFailure": "limit", "Failure": "input", "GateFailed": "gate"}
# an error of Dagster's own storage in Postgres cut off by the database going away (psycopg2's,
# SQLAlchemy's or ours from dagster_home._ride_out, all named so; dagster-postgres' after its
# retries), anywhere in a failed step's chain of causes: a failure outside the project
OUTAGES = {"OperationalError", "DagsterPostgresException"}


def _kind(err) -> str:
    kind = KINDS.get(err.cls_name, "bug")
    cause = err
    while kind == "bug" and cause is not None:
        if cause.cls_name in OUTAGES:
            return "operational"
        cause = getattr(cause, "cause", None)
    return kind


def failure_kind(failures) -> str:
    """What stopped a failed run, from its steps' StepFailureData: the worst of them, a bug (any
    exception that is not one of the project's failures) first, then an operational failure, a
    limit, bad input, a failed gate."""
    kinds = set()
    for f in failures:
        err = getattr(f, "error", None)
        kinds.add(_kind(err) if err is not None else "bug")
    return next((k for k in ("bug", "operational", "limit", "input", "gate") if k in kinds), "")


def _outcome(metric: str, result) -> Outcome:
    failures = [e.event_specific_data for e in result.get_step_failure_events()]
    errs = [err for f in failures if (err := getattr(f, "error", None)) is not None]
    from dagster._core.execution.plan.objects import ErrorSource

    kind = failure_kind(failures) if not result.success else ""
    return Outcome(
        metric,
        result.success,
        result.run_id,
        [_root_message(err) for err in errs],
        gate_failed=not result.success and gate_only(failures),
        interrupted=any(getattr(f, "error_source", None) == ErrorSource.INTERRUPT for f in failures),
        kind=kind,
        tracebacks=[err.to_string() for err in errs if _kind(err) == "bug"],
        gate_reason=next(filter(None, (_gate_reason(f) for f in failures)), ""),
    )


def _gate_reason(failure) -> str:
    from .checks import is_gate_failure

    data = getattr(failure, "user_failure_data", None)
    value = (data.metadata or {}).get("gate_reason") if data is not None and is_gate_failure(failure) else None
    return str(getattr(value, "value", value) or "")


MODULE = "aip_assets.definitions"  # the code location's module (workspace.yaml, `aip-eval ui`)


def location_name() -> str:
    """The code location's name: the module's, or ``$AIP_CODE_LOCATION`` where a deployment names
    it otherwise (run_queue.py)."""
    from .settings import current

    return current().code_location or MODULE


def job_origin(like=None):
    """Where the UI finds the evaluate job: its code location's repository (``like``: the
    repository origin of the launcher's run, when it has one), so Dagster's Overview (its timeline
    and jobs, which group runs by code location and skip a run with none) shows the runs
    `aip-eval run` and the launcher execute in process. ``execute_in_process`` gives its runs no
    origin; the UI's own launches have this one."""
    import sys

    from dagster._core.remote_origin import (
        InProcessCodeLocationOrigin,
        RemoteJobOrigin,
        RemoteRepositoryOrigin,
    )
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin

    if like is None:
        location = InProcessCodeLocationOrigin(
            LoadableTargetOrigin(executable_path=sys.executable, module_name=MODULE), location_name=location_name()
        )
        like = RemoteRepositoryOrigin(location, "__repository__")  # a Definitions' repository
    return RemoteJobOrigin(repository_origin=like, job_name="evaluate")


@contextmanager
def _runs_from(instance, origin) -> Iterator[None]:
    """The runs ``instance`` creates meanwhile (execute_in_process's one) have ``origin``."""
    create = instance.create_run_for_job

    def with_origin(*args: Any, **kwargs: Any):
        kwargs["remote_job_origin"] = kwargs.get("remote_job_origin") or origin
        return create(*args, **kwargs)

    instance.create_run_for_job = with_origin
    try:
        yield
    finally:
        del instance.create_run_for_job  # the class's method again


def _execute(
    instance, run_id: str, metric: str, tags: dict[str, str], run_config: dict[str, Any] | None, like=None
) -> Outcome:
    try:
        origin = job_origin(like)
    except ImportError:  # another layout of Dagster's internals: the run still runs, the Overview misses it
        origin = None
    from .findings import take

    take(run_id, metric)  # none kept from before: only this run's aggregation's
    with _runs_from(instance, origin) if origin is not None else nullcontext():
        result = evaluate().execute_in_process(
            partition_key=partition_key(run_id, metric),
            instance=instance,
            run_config=run_config or {},
            raise_on_error=False,
            tags={"aip/run_id": run_id, "aip/metric": metric, **tags},
        )
    out = _outcome(metric, result)
    out.findings = take(run_id, metric)
    if interrupts.requested():  # also a signal Dagster's own handler took between two steps
        out.interrupted = True
    if out.interrupted and not out.success:  # the UI's Runs list says canceled, not failed
        run = instance.get_run_by_id(result.run_id)
        if run is not None:
            instance.report_run_canceled(
                run,
                message="interrupted (Ctrl-C or SIGTERM): the calls answered are "
                "journaled; `aip-eval run SPEC --run-id RUN` resumes it",
            )
    return out


def _execute_in_child(
    run_id: str,
    metric: str,
    tags: dict[str, str],
    run_config: dict[str, Any] | None,
    quiet: bool,
    report_later: bool,
    verbose: bool = False,
    like=None,
) -> Outcome:
    """One metric in a worker process (spawned: it inherits the parent's environment, so the same
    warehouse and Dagster storage; the endpoints' connections are shared through models/slots.py)."""
    from .dagster_home import get_instance
    from .logs import setup_logging

    if interrupts.requested():  # the parent passed a Ctrl-C on: no metric starts after it
        return Outcome(metric, False, "", ["interrupted before it started"], interrupted=True)
    setup_logging(
        quiet, prefix=f"[aip {metric.removeprefix('llm.')}]", verbose=verbose
    )  # the worker's whole life: not restored
    if report_later:  # the parent writes the report after the last metric
        REPORT_AFTER_ALL.add(run_id)
    return _execute(get_instance(), run_id, metric, tags, run_config, like)


def _worker_init() -> None:
    """A --parallel worker: in its own process group, so a terminal's Ctrl-C reaches the parent
    alone, which passes each signal on once (``interrupts.forwarding``); counted here for life."""
    import os

    try:
        os.setpgrp()
    except OSError:  # already a group's leader: the parent's signals may then come twice (the second abandons)
        pass
    interrupts.handle_for_life()


def _children() -> list[int]:
    import multiprocessing

    return [p.pid for p in multiprocessing.active_children() if p.pid is not None]


def evaluate_run(
    instance,
    run_id: str,
    configured,
    metrics,
    tags: dict[str, str],
    run_config: dict[str, Any] | None = None,
    on_start: Callable[[str], None] | None = None,
    parallel: int = 1,
    quiet: bool = False,
    verbose: bool = False,
    like=None,
) -> Iterator[Outcome]:
    """Evaluate ``metrics`` of the registered run ``run_id``, one run of the evaluate job each,
    yielding each one's Outcome as it ends; a failed metric does not stop the others. First the
    run's partitions are added: one per ``configured`` metric, the run's real work.

    ``parallel`` > 1: that many metrics at once, each in a worker process (Python runs one thread
    at a time, and a metric's own stages run in order). Every model connection's
    ``max_connections`` is shared by the workers (as by every client on the machine,
    models/slots.py), so the endpoint sees no more calls in flight than it allows. ``instance``
    must then be the project's (the workers open it from the environment). ``like``: the repository
    origin the evaluate runs get (``job_origin``), the launcher's own; else this code location's."""
    from .errors import AipError

    unknown = [m for m in metrics if m not in configured]
    if unknown:
        raise AipError(
            f"metric {', '.join(unknown)} is not configured in run {run_id} (configured: {', '.join(configured)})"
        )
    register_partitions(instance, run_id, configured)
    later = len(metrics) > 1  # the report once, after the last metric, not rebuilt at each (0.5 s each for the demo)
    if later:
        REPORT_AFTER_ALL.add(run_id)
    try:
        yield from _evaluate(
            instance, run_id, metrics, tags, run_config, on_start, parallel, quiet, later, verbose, like
        )
    finally:
        if later:
            REPORT_AFTER_ALL.discard(run_id)
            if not interrupts.requested():  # interrupted: the resumed run writes it
                _write_report(run_id)


def _write_report(run_id: str) -> None:
    import logging

    from .report import write_report

    try:
        write_report(run_id)
    except Exception as e:  # noqa: BLE001 - the run's outcomes stand; `aip-eval report` writes it again
        logging.getLogger("aip_assets").warning(
            f"run {run_id}: the report could not be written "
            f"({type(e).__name__}: {e}); `aip-eval report {run_id}` writes it"
        )


def _evaluate(
    instance,
    run_id: str,
    metrics,
    tags: dict[str, str],
    run_config: dict[str, Any] | None,
    on_start: Callable[[str], None] | None,
    parallel: int,
    quiet: bool,
    later: bool,
    verbose: bool = False,
    like=None,
) -> Iterator[Outcome]:
    """Each metric's Outcome; after a Ctrl-C or SIGTERM (interrupts.py) no metric starts, and the
    metrics running end as their stages do."""
    workers = min(parallel, len(metrics))
    if workers <= 1:
        for metric in metrics:
            if interrupts.requested():
                return
            if on_start:
                on_start(metric)
            out = _execute(instance, run_id, metric, tags, run_config, like)
            yield out
            if out.interrupted:
                return
        return
    # the parent waits on its workers: a signal is counted and passed on to them, and they stop
    with (
        interrupts.handled(stop=False),
        interrupts.forwarding(_children),
        ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn"), initializer=_worker_init) as pool,
    ):
        futures = {}
        for metric in metrics:
            if on_start:
                on_start(metric)
            futures[pool.submit(_execute_in_child, run_id, metric, tags, run_config, quiet, later, verbose, like)] = (
                metric
            )
        for f in as_completed(futures):
            if interrupts.requested():
                for other in futures:
                    other.cancel()  # not started yet: never starts
            if f.cancelled():
                continue
            try:
                out = f.result()
            except Exception as e:  # noqa: BLE001 - a worker that died: that metric failed, the others report
                out = Outcome(futures[f], False, "", [f"its worker process failed: {type(e).__name__}: {e}"])
            if out.interrupted and not out.dagster_run_id:
                continue  # it never started
            yield out
