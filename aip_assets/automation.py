"""Recurring evaluations and new specs: schedules from each spec's ``schedule`` and a sensor on
``data/runs/`` (``AIP_RUNS_DIR``).

A tick changes nothing: it returns a run request of the launcher job ``aip_launch`` (so the
UI's "Preview tick result" or "Test sensor" registers nothing, adds no partition). The launched
run registers the run, named from the spec and the tick's time (runs never overwrite each other),
checks the endpoints, adds its partitions (one per configured metric) and evaluates each
configured metric as a run of the ``evaluate`` job (in shared mode, a lake, it queues those runs,
one per metric, for the daemon to launch, and ends). A tick that finds the previous run of the
same spec still going skips with the reason. The sensor's first tick records the spec files
already there as seen and launches none; later, a new or changed spec launches, an invalid one is
reported in the sensor's log with the validation error and launches nothing. Both start stopped:
turn them on in the UI.
"""

# no `from __future__ import annotations` here: Dagster reads register_and_evaluate's Config
# annotation as the class itself
import json
import logging
import re
from datetime import UTC, datetime
from pathlib import Path

from dagster import (
    Config,
    DagsterRunStatus,
    DefaultScheduleStatus,
    DefaultSensorStatus,
    Failure,
    RunRequest,
    RunsFilter,
    ScheduleDefinition,
    SensorResult,
    SkipReason,
    in_process_executor,
    job,
    op,
    schedule,
    sensor,
)
from pydantic import Field

from .checks import GateFailed
from .errors import AipError
from .hashing import file_sha256
from .pipeline import RUN_TIME, load_run, new_run_id, register_run, run_exists
from .preflight import examine, preflight, record_forms
from .resources import SutConnection, Warehouse
from .runspec import RunSpec, load_spec

log = logging.getLogger("aip_assets")
ACTIVE = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING, DagsterRunStatus.STARTED]


def runs_dir() -> Path:
    from .settings import current, data_dir

    return current().runs_dir or data_dir() / "runs"


LAUNCH_JOB = "aip_launch"


def launch_request(spec: RunSpec, spec_path: Path, run_id: str, trigger: str) -> RunRequest:
    """What a tick returns: a run of the launcher job, which registers ``run_id`` and evaluates
    every configured metric. Evaluating a tick (a real one, or a preview in the UI) changes
    nothing; only the launched run registers."""
    return RunRequest(
        run_key=run_id,
        job_name=LAUNCH_JOB,
        run_config={
            "ops": {
                "register_and_evaluate": {"config": {"spec_path": str(spec_path), "run_id": run_id, "trigger": trigger}}
            }
        },
        tags={"aip/run_id": run_id, "aip/spec": spec.name, "aip/trigger": trigger},
    )


class LaunchConfig(Config):
    """What a launch of ``aip_launch`` evaluates: the UI's launchpad shows these fields with their
    descriptions and defaults (the demo spec, a run id to fill in)."""

    spec_path: str = Field(
        default="data/runs/demo.yaml",
        description="the run spec (YAML) to evaluate, relative to the folder the UI was started in",
    )
    run_id: str = Field(
        default="",
        description="empty (the default): a new run, named <spec>-<UTC time> when the launch starts (-2, -3... "
        "if taken), so each Launch Run evaluates anew; a registered id resumes that run with its stored spec",
    )
    trigger: str = Field(
        default="launchpad",
        description="who launched it, kept as the aip/trigger tag: schedule, sensor, or launchpad",
    )


@op(
    description="register the run (eval_runs and its partitions), check the endpoints, then evaluate each "
    "configured metric as a run of the evaluate job",
)
def register_and_evaluate(context, config: LaunchConfig, sut: SutConnection, warehouse: Warehouse) -> None:
    path = Path(config.spec_path)
    try:
        run_id = config.run_id or _launched_run_id(context, path, sut)
        resume = run_exists(run_id)  # this launch re-executed (a metric failed, or it crashed): resume the run
        if resume:
            spec, _ = load_run(run_id)
            context.log.info(f"run {run_id} is registered: resuming it with its stored spec")
        else:
            spec = sut.apply(load_spec(path))  # the YAML as it is at launch; the sut resource, when set, instead
        checked = preflight(spec, run_id if resume else None)
        for line in checked:
            context.log.info(line)
        if not resume:  # the judge exam before any SUT call; a judge that fails it stops the launch
            exam = examine(spec, run_id, checked.forms, log=context.log.info)
            register_run(spec, run_id, forms=checked.forms, exam=exam)
        else:  # forms the check had to choose (none recorded for the run): recorded now
            record_forms(run_id, checked.forms)
    except AipError as e:
        raise Failure(description=f"{path}: nothing launched: {e}") from None
    tags = {"aip/spec": spec.name, "aip/trigger": config.trigger, "aip/launched_by": context.run_id}
    from .dagster_home import shared

    if shared():  # a lake: one queued run per metric, wherever the run launcher starts it
        from .partitions import register_partitions
        from .run_queue import location_name, submit

        register_partitions(context.instance, run_id, spec.metrics)
        origin, code = context.dagster_run.remote_job_origin, context.dagster_run.job_code_origin
        try:
            queued = submit(
                context.instance,
                run_id,
                spec.metrics,
                tags,
                location=origin.location_name if origin is not None else location_name(),
                like=code.repository_origin if code is not None else None,
            )
        except AipError as e:
            raise Failure(description=f"run {run_id}: nothing queued: {e}") from None
        for metric, dagster_run, new in queued:
            context.log.info(
                f"{run_id} × {metric}: {'queued as' if new else 'already queued or running as'} "
                f"Dagster run {dagster_run}"
            )
        return
    context.log.info(f"{path}: run {run_id}, evaluating {', '.join(spec.metrics)}")
    from .jobs import evaluate_run

    failed, below = [], []
    for out in evaluate_run(
        context.instance,
        run_id,
        spec.metrics,
        spec.metrics,
        tags,
        run_config={"resources": {"warehouse": {"config": {"path": warehouse.path}}}},  # this launch's warehouse
        like=origin.repository_origin if (origin := context.dagster_run.remote_job_origin) is not None else None,
    ):
        how = "done" if out.success else "gate failed" if out.gate_failed else "FAILED"
        context.log.info(f"{run_id} × {out.metric}: {how} (Dagster run {out.dagster_run_id})")
        if out.gate_failed:  # every stage ran; the metric's gate failed (aip-eval run's exit 1)
            why = f": {out.gate_reason}" if out.gate_reason else ""
            below.append(f"{out.metric} (Dagster run {out.dagster_run_id}){why}")
        elif not out.success:
            failed.append(f"{out.metric} (Dagster run {out.dagster_run_id})")
    if failed:
        raise Failure(
            description=f"run {run_id}: stage failed for {', '.join(failed)}"
            + (f"; gate failed for {'; '.join(below)}" if below else "")
        )
    if below:  # evaluated, not passed: this launch is no green run either; it reads as the verdict, no stack trace
        raise GateFailed(
            f"run {run_id}: evaluated; gate failed for {'; '.join(below)}",
            metadata={"run_id": run_id, "gate_failed": [b.split(" (Dagster run", 1)[0] for b in below]},
        )


def fresh_run_id(spec: RunSpec, taken=()) -> str:
    """A new run's id, ``<spec>-<UTC time>``; ``-2``, ``-3``... when a run of that name is already
    registered (or ``taken`` by another request of the same tick)."""
    run_id = base = new_run_id(spec)
    n = 1
    while run_exists(run_id) or run_id in taken:
        n += 1
        run_id = f"{base}-{n}"
    return run_id


def _launched_run_id(context, path: Path, sut: SutConnection) -> str:
    """The run id of a launch that names none (the launchpad's default): the one this launch (or the
    launch it re-executes) already took, kept as its ``aip/run_id`` tag, so a re-execution resumes
    that run; otherwise a new one from the spec's name and the time, tagged on this launch."""
    run = context.dagster_run
    for dagster_run_id in (run.run_id, run.parent_run_id, run.root_run_id):
        earlier = context.instance.get_run_by_id(dagster_run_id) if dagster_run_id else None
        if earlier is not None and earlier.job_name == LAUNCH_JOB and earlier.tags.get("aip/run_id"):
            return earlier.tags["aip/run_id"]
    run_id = fresh_run_id(sut.apply(load_spec(path)))
    context.instance.add_run_tags(run.run_id, {"aip/run_id": run_id})
    context.log.info(f"{path}: no run id given: a new run, {run_id}")
    return run_id


@job(
    name=LAUNCH_JOB,
    executor_def=in_process_executor,
    description="what schedules and the new-spec sensor launch: registers a run, then evaluates it",
)
def launch_job():
    register_and_evaluate()


def still_going(instance, spec_name: str) -> list[str]:
    records = instance.get_run_records(RunsFilter(tags={"aip/spec": spec_name}, statuses=ACTIVE), limit=5)
    return [r.dagster_run.tags.get("aip/run_id", r.dagster_run.run_id) for r in records]


def make_schedule(spec_path: Path, spec: RunSpec, job) -> ScheduleDefinition:
    name = "aip_" + re.sub(r"[^A-Za-z0-9_]", "_", spec.name) + "_schedule"
    assert spec.schedule is not None

    @schedule(
        name=name,
        cron_schedule=spec.schedule,
        job=job,
        execution_timezone="UTC",
        default_status=DefaultScheduleStatus.STOPPED,
        description=f"evaluates {spec_path} ({', '.join(spec.metrics)}) on '{spec.schedule}' (UTC)",
    )
    def _tick(context):
        try:
            current = load_spec(spec_path)  # the YAML as it is now
        except AipError as e:
            return SkipReason(f"{spec_path} is invalid now, nothing launched: {e}")
        busy = still_going(context.instance, current.name)
        if busy:
            return SkipReason(f"the previous run of {current.name} ({busy[0]}) is still going")
        tick = context.scheduled_execution_time or datetime.now(UTC)
        run_id = f"{current.name}-{tick.astimezone(UTC).strftime(RUN_TIME)}"
        if run_exists(run_id):
            return SkipReason(f"run {run_id} is already registered")
        return launch_request(current, spec_path, run_id, "schedule")

    return _tick


def build_schedules(job) -> list[ScheduleDefinition]:
    out: dict[str, ScheduleDefinition] = {}
    for path in sorted(runs_dir().glob("*.y*ml")):
        try:
            spec = load_spec(path)
        except AipError as e:  # a broken spec must not break the code location
            log.warning(f"{path}: no schedule: {e}")
            continue
        if spec.schedule:
            sched = make_schedule(path, spec, job)
            if sched.name in out:  # two specs of one name (a copied file): the first keeps it
                log.warning(
                    f"{path}: no schedule: {sched.name} already comes from another spec named {spec.name!r}; "
                    "give this spec another name"
                )
                continue
            out[sched.name] = sched
    return list(out.values())


def build_sensor(job):
    @sensor(
        name="aip_new_spec_sensor",
        job=job,
        minimum_interval_seconds=30,
        default_status=DefaultSensorStatus.STOPPED,
        description="registers and launches a run for every new or changed spec file in data/runs/",
    )
    def new_spec_sensor(context):
        specs = sorted(runs_dir().glob("*.y*ml"))
        # its first tick (no cursor; the UI's "Preview tick result" passes an empty one): what is there now
        # was there before it; launch none
        if not context.cursor:
            context.update_cursor(json.dumps({str(p): file_sha256(p) for p in specs}, sort_keys=True))
            return SkipReason(
                f"first tick: {len(specs)} spec file(s) already in {runs_dir()} recorded as seen; "
                "a new or changed one launches"
            )
        cursor = json.loads(context.cursor)
        requests, notes, taken = [], [], set()
        for path in specs:
            sha = file_sha256(path)
            if cursor.get(str(path)) == sha:
                continue
            cursor[str(path)] = sha
            try:
                spec = load_spec(path)
            except AipError as e:
                context.log.error(f"{path}: not launched: {e}")
                notes.append(f"{path.name} not launched: {str(e).splitlines()[-1]}")
                continue
            run_id = fresh_run_id(spec, taken)
            taken.add(run_id)
            requests.append(launch_request(spec, path, run_id, "sensor"))
            context.log.info(f"{path}: launching run {run_id} ({len(spec.metrics)} metric(s))")
        context.update_cursor(json.dumps(cursor, sort_keys=True))
        if not requests:
            return SkipReason("no new or changed spec" + (f" ({'; '.join(notes)})" if notes else ""))
        return SensorResult(run_requests=requests)

    return new_spec_sensor
