"""Recurring evaluations and new specs: schedules from each spec's ``schedule`` and a sensor on
``data/runs/`` (``AIP_RUNS_DIR``).

Each tick registers a new run partition named from the spec and the tick's time, so runs never
overwrite each other, and launches every configured metric for it. A tick that finds the
previous run of the same spec still going skips with the reason. The sensor registers and
launches a new or changed spec; an invalid one is reported in the sensor's log with the
validation error and launches nothing. Both start stopped: turn them on in the UI.
"""

from __future__ import annotations

import json
import logging
import os
import re
from datetime import datetime, timezone
from pathlib import Path

from dagster import (DagsterRunStatus, DefaultScheduleStatus, DefaultSensorStatus, RunRequest, RunsFilter,
                     ScheduleDefinition, SensorResult, SkipReason, schedule, sensor)

from .errors import AipError
from .partitions import partition_key, runs_partitions
from .pipeline import new_run_id, preflight, register_run, run_exists
from .runspec import RunSpec, file_sha256, load_spec

log = logging.getLogger("aip_assets")
ACTIVE = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING, DagsterRunStatus.STARTED]


def runs_dir() -> Path:
    if os.environ.get("AIP_RUNS_DIR"):
        return Path(os.environ["AIP_RUNS_DIR"])
    from .dagster_home import data_dir

    return data_dir() / "runs"


def launch(spec: RunSpec, run_id: str, instance, trigger: str) -> list[RunRequest]:
    """Register the run (eval_runs and its Dagster partition) and request every metric's partition."""
    register_run(spec, run_id)
    instance.add_dynamic_partitions(runs_partitions.name, [run_id])
    return [RunRequest(run_key=f"{run_id}|{m}", job_name="evaluate", partition_key=partition_key(run_id, m),
                       tags={"aip/run_id": run_id, "aip/spec": spec.name, "aip/trigger": trigger})
            for m in spec.metrics]


def still_going(instance, spec_name: str) -> list[str]:
    records = instance.get_run_records(RunsFilter(tags={"aip/spec": spec_name}, statuses=ACTIVE), limit=5)
    return [r.dagster_run.tags.get("aip/run_id", r.dagster_run.run_id) for r in records]


def make_schedule(spec_path: Path, spec: RunSpec, job) -> ScheduleDefinition:
    name = "aip_" + re.sub(r"[^A-Za-z0-9_]", "_", spec.name) + "_schedule"
    assert spec.schedule is not None

    @schedule(name=name, cron_schedule=spec.schedule, job=job, execution_timezone="UTC",
              default_status=DefaultScheduleStatus.STOPPED,
              description=f"evaluates {spec_path} ({', '.join(spec.metrics)}) on '{spec.schedule}' (UTC)")
    def _tick(context):
        try:
            current = load_spec(spec_path)  # the YAML as it is now
        except AipError as e:
            return SkipReason(f"{spec_path} is invalid now, nothing launched: {e}")
        busy = still_going(context.instance, current.name)
        if busy:
            return SkipReason(f"the previous run of {current.name} ({busy[0]}) is still going")
        tick = context.scheduled_execution_time or datetime.now(timezone.utc)
        run_id = f"{current.name}-{tick.astimezone(timezone.utc):%Y%m%dT%H%MZ}"
        if run_exists(run_id):
            return SkipReason(f"run {run_id} is already registered")
        try:
            preflight(current)
        except AipError as e:
            return SkipReason(f"endpoint check failed, nothing launched: {e}")
        return launch(current, run_id, context.instance, "schedule")

    return _tick


def build_schedules(job) -> list[ScheduleDefinition]:
    out = []
    for path in sorted(runs_dir().glob("*.y*ml")):
        try:
            spec = load_spec(path)
        except AipError as e:  # a broken spec must not break the code location
            log.warning(f"{path}: no schedule: {e}")
            continue
        if spec.schedule:
            out.append(make_schedule(path, spec, job))
    return out


def build_sensor(job):
    @sensor(name="aip_new_spec_sensor", job=job, minimum_interval_seconds=30,
            default_status=DefaultSensorStatus.STOPPED,
            description="registers and launches a run for every new or changed spec file in data/runs/")
    def new_spec_sensor(context):
        cursor = json.loads(context.cursor) if context.cursor else {}
        requests, notes, new_runs = [], [], []
        for path in sorted(runs_dir().glob("*.y*ml")):
            sha = file_sha256(path)
            if cursor.get(str(path)) == sha:
                continue
            cursor[str(path)] = sha
            try:
                spec = load_spec(path)
                preflight(spec)
            except AipError as e:
                context.log.error(f"{path}: not launched: {e}")
                notes.append(f"{path.name} not launched: {str(e).splitlines()[-1]}")
                continue
            run_id = base = new_run_id(spec)
            n = 1
            while run_exists(run_id):
                n += 1
                run_id = f"{base}-{n}"
            # the partition is added now (a multi-partition key cannot be validated against a
            # dynamic_partitions_request of the same tick)
            requests += launch(spec, run_id, context.instance, "sensor")
            new_runs.append(run_id)
            context.log.info(f"{path}: registered run {run_id}, launching {len(spec.metrics)} metric(s)")
        context.update_cursor(json.dumps(cursor, sort_keys=True))
        if not requests:
            return SkipReason("no new or changed spec" + (f" ({'; '.join(notes)})" if notes else ""))
        return SensorResult(run_requests=requests)

    return new_spec_sensor
