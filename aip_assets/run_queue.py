"""Evaluations through Dagster's run queue: `aip-eval run --submit`, and the launcher job of the
schedules and the sensor in shared mode.

Each (run, metric) partition becomes one run of the ``evaluate`` job, created and submitted the
way ``dagster job launch`` does it (a workspace of this code location, in process; the run's
origin names the location, so the daemon that dequeues it launches it from its own workspace),
tagged with its partition. The instance's ``QueuedRunCoordinator`` holds it until its daemon (one
per instance: ``aip-eval daemon``, ``aip-eval ui``, or the Helm chart's) launches it within the
run limits: at most ``MAX_CONCURRENCY`` at once, and one per partition. Where it runs is the run
launcher's choice: Dagster's default starts it on the daemon's host; ``K8sRunLauncher`` in a pod.

The code location's name is ``aip_assets.definitions`` (what workspace.yaml and ``-m`` give it),
or ``$AIP_CODE_LOCATION`` where a deployment names it otherwise (the Helm chart's user deployment,
``deploy/k8s/values.yaml``). The launcher job uses its own run's location instead.

Creating the run uses Dagster's workspace classes (``dagster._core``), as its own CLI does: they
are not public API, and a Dagster upgrade may need this module changed (the tests run it).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from .errors import AipError
from .jobs import MODULE, location_name
from .partitions import partition_key

log = logging.getLogger("aip_assets")
LOCATION_ENV = "AIP_CODE_LOCATION"
JOB = "evaluate"
PARTITION_TAG = "dagster/partition"
DAEMON_SILENT_SECONDS = 60.0  # no heartbeat of the queue's daemon for this long: say the runs wait for one


def _statuses():
    from dagster import DagsterRunStatus as S

    active = [S.QUEUED, S.NOT_STARTED, S.STARTING, S.STARTED, S.CANCELING]
    return active, {S.SUCCESS, S.FAILURE, S.CANCELED}


@contextmanager
def _remote_job(instance, location: str, run_config: dict[str, Any], like=None):
    """The evaluate job as a workspace of this code location has it. ``like``: the repository
    origin of a run this one is queued from (the launcher's), whose image, entry point and
    container context the new runs keep: a run launcher that starts runs in containers
    (Kubernetes) takes the image from there. Without it, ``$DAGSTER_CURRENT_IMAGE`` (which the Helm
    chart sets in the code server's pod), if any."""
    import warnings

    from dagster import BetaWarning, PreviewWarning
    from dagster._core.remote_origin import InProcessCodeLocationOrigin
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
    from dagster._core.workspace.context import WorkspaceProcessContext
    from dagster._core.workspace.load_target import InProcessWorkspaceLoadTarget

    image = getattr(like, "container_image", None) or os.environ.get("DAGSTER_CURRENT_IMAGE") or None
    origin = InProcessCodeLocationOrigin(
        LoadableTargetOrigin(executable_path=sys.executable, module_name=MODULE),
        container_image=image,
        entry_point=getattr(like, "entry_point", None),
        container_context=getattr(like, "container_context", None),
        location_name=location,
    )
    with warnings.catch_warnings(), WorkspaceProcessContext(instance, InProcessWorkspaceLoadTarget(origin)) as ctx:
        warnings.simplefilter("ignore", BetaWarning)  # Dagster's own, loading the definitions
        warnings.simplefilter("ignore", PreviewWarning)
        ws = ctx.create_request_context()
        error = ws.get_code_location_error(location)
        if error is not None:
            raise AipError(f"code location {location} ({MODULE}) does not load: {error.message.strip()}")
        loc = ws.get_code_location(location)
        repo = next(iter(loc.get_repositories().values()))
        job = repo.get_full_job(JOB)
        plan = loc.get_execution_plan(job, run_config, step_keys_to_execute=None, known_state=None, instance=instance)
        yield ws, repo, job, plan.execution_plan_snapshot


def require_queue(instance) -> None:
    from dagster._core.run_coordinator import QueuedRunCoordinator

    if not isinstance(instance.run_coordinator, QueuedRunCoordinator):
        raise AipError(
            f"--submit needs Dagster's run queue, and the instance in {os.environ.get('DAGSTER_HOME')} uses "
            f"{type(instance.run_coordinator).__name__}: set run_coordinator to QueuedRunCoordinator in its "
            "dagster.yaml (as the project's does), or run without --submit"
        )


def submit(
    instance,
    run_id: str,
    metrics,
    tags: dict[str, str],
    run_config: dict[str, Any] | None = None,
    location: str | None = None,
    like=None,
) -> list[tuple[str, str, bool]]:
    """Queue one evaluate run per metric of the registered ``run_id`` (its partitions must exist).
    A partition that already has a queued or running run is not queued twice. Returns
    (metric, Dagster run id, newly queued) per metric. ``location``, ``like``: see ``_remote_job``."""
    from dagster import RunsFilter

    require_queue(instance)
    active, _ = _statuses()
    run_config = run_config or {}
    out = []
    with _remote_job(instance, location or location_name(), run_config, like) as (ws, repo, job, plan):
        for metric in metrics:
            key = partition_key(run_id, metric)
            busy = instance.get_run_records(
                RunsFilter(job_name=JOB, tags={PARTITION_TAG: key}, statuses=active), limit=1
            )
            if busy:
                out.append((metric, busy[0].dagster_run.run_id, False))
                continue
            run = instance.create_run(
                job_name=JOB,
                run_id=None,
                run_config=run_config,
                resolved_op_selection=None,
                step_keys_to_execute=None,
                op_selection=None,
                status=None,
                root_run_id=None,
                parent_run_id=None,
                tags={**job.tags, **tags, "aip/run_id": run_id, "aip/metric": metric, PARTITION_TAG: key},
                job_snapshot=job.job_snapshot,
                execution_plan_snapshot=plan,
                parent_job_snapshot=job.parent_job_snapshot,
                remote_job_origin=job.get_remote_origin(),
                job_code_origin=job.get_python_origin(),
                asset_selection=None,
                asset_check_selection=None,
                asset_graph=repo.asset_graph,
            )
            instance.submit_run(run.run_id, ws)
            out.append((metric, run.run_id, True))
    return out


def _errors(instance, dagster_run_id: str) -> tuple[list[str], bool, str, list[str]]:
    """Why a run failed: each failed step's innermost message, else the run's own failure; whether
    it failed on the metric's gate alone (its stages ran: not a failed stage); what kind of failure
    (``jobs.failure_kind``; a run that failed with no failed step, its worker gone or its launch
    failed, is an operational one); and a bug's whole errors, to save."""
    from dagster import DagsterEventType

    from .jobs import _kind, _root_message, failure_kind, gate_only

    errors, failures, tracebacks = [], [], []
    for entry in instance.all_logs(dagster_run_id, of_type=DagsterEventType.STEP_FAILURE):
        data = entry.dagster_event.event_specific_data
        failures.append(data)
        err = getattr(data, "error", None)
        if err is not None:
            errors.append(_root_message(err))
            if _kind(err) == "bug":
                tracebacks.append(err.to_string())
    kind = failure_kind(failures) if failures else "operational"
    if not errors:
        for entry in instance.all_logs(dagster_run_id, of_type=DagsterEventType.RUN_FAILURE):
            errors.append((entry.dagster_event.message or entry.user_message or "the run failed").strip())
    return errors, gate_only(failures), kind, tracebacks


def daemon_alive(instance, within: float = DAEMON_SILENT_SECONDS) -> bool:
    """Has the queue's daemon reported within ``within`` seconds?"""
    beat = instance.get_daemon_heartbeats().get("QUEUED_RUN_COORDINATOR")
    return beat is not None and time.time() - beat.timestamp < within


def wait(
    instance, runs: dict[str, str], on_status: Callable[[str, str, str], None] | None = None, poll_seconds: float = 1.0
) -> Iterator:
    """Follow the queued runs ``{metric: Dagster run id}`` until each ends, yielding each one's
    ``jobs.Outcome`` as it ends; ``on_status(metric, dagster_run_id, status)`` at every change."""
    from dagster import RunsFilter

    from .jobs import Outcome

    _, terminal = _statuses()
    pending = {rid: metric for metric, rid in runs.items()}
    seen = {rid: "QUEUED" for rid in pending}  # what submit() said; a change from it is news
    queued_since = time.monotonic()
    warned = False
    while pending:
        records = instance.get_run_records(RunsFilter(run_ids=list(pending)))
        for gone in set(pending) - {r.dagster_run.run_id for r in records}:  # deleted (in the UI, say)
            yield Outcome(pending.pop(gone), False, gone, ["its Dagster run was deleted"], kind="operational")
        for rec in records:
            run = rec.dagster_run
            status = run.status.value
            if seen.get(run.run_id) != status:
                seen[run.run_id] = status
                if on_status:
                    on_status(pending[run.run_id], run.run_id, status)
            if run.status in terminal:
                metric = pending.pop(run.run_id)
                if run.status.value == "SUCCESS":
                    yield Outcome(metric, True, run.run_id)
                    continue
                errors, gate, kind, tracebacks = _errors(instance, run.run_id)
                yield Outcome(
                    metric,
                    False,
                    run.run_id,
                    errors or [status.lower()],
                    gate_failed=gate and run.status.value == "FAILURE",
                    kind=kind,
                    tracebacks=tracebacks,
                )
        if (
            pending
            and not warned
            and all(s == "QUEUED" for s in seen.values())
            and time.monotonic() - queued_since > DAEMON_SILENT_SECONDS
            and not daemon_alive(instance)
        ):
            warned = True
            log.warning(
                f"no Dagster daemon has dequeued runs in the last {DAEMON_SILENT_SECONDS:.0f} s: the runs wait "
                "in the queue until one runs on this instance (`aip-eval daemon` or `aip-eval ui`)"
            )
        if pending:
            time.sleep(poll_seconds)
