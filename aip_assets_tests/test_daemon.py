"""Shared mode through Dagster's queue and daemon (issue 14): Dagster's storage in Postgres, runs
submitted with `aip-eval run --submit`, launched by `aip-eval daemon`, each run in a process and a
working folder of its own (aip_assets_tests/podlike.py, the command a Kubernetes run pod runs).

Patience comes from a measured time: the same evaluation run here first, in local mode.

The queue here is Dagster's as `aip-eval` configures it, polled faster: the daemon dequeues every
second (AIP_DEQUEUE_INTERVAL_SECONDS=1; Dagster's default: every 5 s), so no test waits on a poll
interval meant for a production queue."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from aip_assets import warehouse as wh
from aip_assets.cli import main
from aip_assets.models.builtin import handle_chat
from aip_assets.runspec import BuiltinProfile

from .conftest import run_all, write_dataset
from .scripted import Reply, is_preflight
from .test_pipeline import FLIP, _assert_same, _stable

AIP_EVAL = [sys.executable, "-m", "aip_assets.cli"]


def spec_file(folder: Path, name: str, dataset: Path, url: str, dimensions=("gender", "role"), **extra) -> Path:
    data = {
        "name": name,
        "dataset": str(dataset),
        "seed": 3,
        "retry_backoff_seconds": 0.01,
        "batch_rows": 4,
        "sut": {"provider": "openai", "base_url": url, "model": "m", "requests_per_minute": 240},
        "judge": {"provider": "builtin"},
        # baseline_share 0: a worker in its own process has the real default, the in-process run here
        # the tests' (conftest.no_default_baseline); these tests count calls of the pairs alone
        "metrics": {
            "llm.decision_flip": {
                "baseline_share": 0.0,
                "config": {"dimensions": list(dimensions), "num_pairs_per_dimension": 2},
            }
        },
        **extra,
    }
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def dagster_home(home: Path, pods: Path) -> Path:
    """A DAGSTER_HOME with the shared-mode settings (the queue polled every second), every run
    launched as a pod would be, and run monitoring on (a run whose worker died is marked failed)."""
    from aip_assets.dagster_home import instance_settings
    from aip_assets.settings import override

    home.mkdir(parents=True)
    with override(dequeue_interval_seconds=1):  # AIP_DEQUEUE_INTERVAL_SECONDS
        settings = instance_settings(home, shared=True)
    assert "dequeue_interval_seconds: 1\n" in settings
    (home / "dagster.yaml").write_text(
        settings
        + f"run_launcher:\n  module: aip_assets_tests.podlike\n  class: PodLikeRunLauncher\n  config:\n    root: {pods}\n"
        + "run_monitoring:\n  enabled: true\n  poll_interval_seconds: 2\n"
    )
    return home


@pytest.fixture(scope="module")
def import_seconds() -> float:
    """How long a fresh process takes to import the code location here (what the daemon, its code
    server, a submitter and each run worker do first): measured once for the tests of this module
    that have no run of their own to measure."""
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-c", "import aip_assets.definitions"], check=True, timeout=600)
    return time.monotonic() - t0


def start_daemon(log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [*AIP_EVAL, "daemon"],
        stdout=open(log, "wb"),
        stderr=subprocess.STDOUT,
        env=dict(os.environ),
        start_new_session=True,
    )


def stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)


def wait_for(what: str, ok, patience: float, log: Path | None = None, step: float = 0.5):
    end = time.monotonic() + patience
    while time.monotonic() < end:
        got = ok()
        if got:
            return got
        time.sleep(step)
    raise AssertionError(f"{what}: not within {patience:.0f} s" + (f"\n{log.read_text()[-4000:]}" if log else ""))


def instance_processes(home: str | Path) -> list[int]:
    """The running processes of the Dagster instance in ``home``: a dagster command (the daemon, its
    code server, a run worker) with that DAGSTER_HOME."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if f"DAGSTER_HOME={home}".encode() in environ and b"dagster" in cmdline and int(pid) != os.getpid():
            found.append(int(pid))
    return found


def dagster_runs(instance, run_id: str):
    from dagster import RunsFilter

    return instance.get_run_records(RunsFilter(job_name="evaluate", tags={"aip/run_id": run_id}))


@pytest.fixture
def sut(scripted):
    """The builtin model (flip profile) behind a scripted server, which records every arrival."""
    profile = BuiltinProfile.model_validate(FLIP)
    return scripted(lambda body, n: Reply(body=handle_chat(body, profile)))


def test_the_daemon_runs_two_runs_at_once_in_separate_workers_with_local_results(
    tmp_path, lake_s3, s3_server, sut, monkeypatch
):
    """Two runs of two specs submitted with `aip-eval run --submit --detach`, launched by
    `aip-eval daemon`: each partition runs in a process and a working folder of its own, the two
    at once, writing a lake on a local S3 server; every stable table equals local mode's for the
    same run; the endpoint's limit of 4 requests/s holds across the two workers, measured at the
    server."""
    ds = write_dataset(tmp_path / "d.jsonl", 3)
    # one axis: 11 SUT calls a run (22 at 4/s: 6 s of sampling), enough to see the limit shared
    specs = [spec_file(tmp_path / "specs", name, ds, sut.url, dimensions=["gender"]) for name in ("alpha", "beta")]
    from aip_assets.dagster_home import get_instance
    from aip_assets.runspec import load_spec

    home = dagster_home(tmp_path / "home", tmp_path / "pods")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    instance = get_instance()  # Dagster's tables made here, before two submitters use them at once
    submitters = []
    for p in specs:  # each submitter in a folder of its own, the two at once
        (tmp_path / f"submit-{p.stem}").mkdir()
        submitters.append(
            subprocess.Popen(
                [*AIP_EVAL, "run", str(p), "--run-id", f"{p.stem}-1", "--submit", "--detach"],
                cwd=tmp_path / f"submit-{p.stem}",
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=dict(os.environ),
            )
        )
    try:
        # local mode meanwhile, in this process: the reference, and the measured time the patience
        # below comes from
        shared = {var: os.environ.pop(var) for var in ("AIP_SHARED_STATE_URL", "AIP_LAKE_DATA_PATH", "DAGSTER_HOME")}
        t0 = time.monotonic()
        for p in specs:
            run_all(load_spec(p), f"{p.stem}-1")
        local_seconds = time.monotonic() - t0
        local = {p.stem: _stable(f"{p.stem}-1") for p in specs}
        wh.release()
        for var, value in shared.items():
            monkeypatch.setenv(var, value)
        patience = 60 + 20 * local_seconds  # two imports of Dagster per run, the queue's ticks, a loaded machine
        said = [submitter.communicate(timeout=patience)[1] for submitter in submitters]
    finally:
        for submitter in submitters:
            if submitter.poll() is None:
                submitter.kill()
                submitter.wait()
    for p, submitter, err in zip(specs, submitters, said):
        assert submitter.returncode == 0, err
        assert f"{p.stem}-1 × llm.decision_flip: queued as Dagster run" in err
        assert "no Dagster daemon" in err  # none runs yet: said, and the run waits in the queue
    first_request = len(sut.requests)

    assert all(r.dagster_run.status.value == "QUEUED" for p in specs for r in dagster_runs(instance, f"{p.stem}-1"))
    daemon = start_daemon(tmp_path / "daemon.log")
    try:
        records = wait_for(
            "both runs ended",
            lambda: (
                (rs := [r for p in specs for r in dagster_runs(instance, f"{p.stem}-1") if r.dagster_run.is_finished])
                and len(rs) == 2
                and rs
            ),
            patience,
            tmp_path / "daemon.log",
        )
    finally:
        stop(daemon)
    logs = {r.dagster_run.run_id: (tmp_path / "pods" / r.dagster_run.run_id / "out.log") for r in records}
    assert all(r.dagster_run.status.value == "SUCCESS" for r in records), {
        k: v.read_text()[-3000:] for k, v in logs.items()
    }
    workers = [json.loads((tmp_path / "pods" / r.dagster_run.run_id / "worker.json").read_text()) for r in records]
    assert workers[0]["pid"] != workers[1]["pid"] and workers[0]["cwd"] != workers[1]["cwd"]
    # at once: each started before the other ended
    assert max(r.start_time for r in records) < min(r.end_time for r in records), [
        (r.start_time, r.end_time) for r in records
    ]
    for p in specs:
        _assert_same(_stable(f"{p.stem}-1"), local[p.stem])  # read from the lake
    from .conftest import s3_keys

    assert any(k.endswith(".parquet") for k in s3_keys(s3_server, lake_s3[1], "lake/"))
    assert not list((tmp_path / "pods").rglob("*.duckdb"))  # no worker made a warehouse of its own
    # 4 requests/s across the two workers: every fifth request at least a second after the first of the five
    arrivals = sorted(
        t for b, t in zip(sut.requests[first_request:], sut.arrivals[first_request:]) if not is_preflight(b)
    )
    assert len(arrivals) >= 2 * 8
    fifth = [b - a for a, b in zip(arrivals, arrivals[4:])]
    assert min(fifth) >= 0.75, fifth  # 0.25 s slots (slack for a late arrival at the server)


def test_a_run_worker_killed_mid_stage_is_resumed_by_another_without_repeating_a_call(tmp_path, lake, sut, monkeypatch):
    """A queued run's worker is SIGKILLed while sampling; Dagster's run monitoring marks its run
    failed; `aip-eval run --run-id ... --submit` from another folder queues the partition again,
    and the new worker (another process, another folder) asks the endpoint only for the calls the
    journal in Postgres does not hold: no call the first worker journaled is sent again."""
    import psycopg

    ds = write_dataset(tmp_path / "d.jsonl", 6)
    spec = spec_file(tmp_path / "specs", "gamma", ds, sut.url)
    home = dagster_home(tmp_path / "home", tmp_path / "pods")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    # the killed worker's lease on the partition ends 6 s after its last renewal (default 30 s), by
    # the time the new worker asks for it: it takes it over without waiting out the default
    monkeypatch.setenv("AIP_LEASE_SECONDS", "6")

    def journaled() -> int:
        with psycopg.connect(lake) as con:
            if con.execute("SELECT to_regclass('aip_journal.call_index')").fetchone()[0] is None:
                return 0  # the first worker has not made the journal yet
            return con.execute(
                "SELECT count(*) FROM aip_journal.call_index WHERE run_id = 'g-1' AND role = 'sut' "
                "AND stage = 'sampling' AND status = 'ok'"
            ).fetchone()[0]

    from aip_assets.dagster_home import get_instance

    instance = get_instance()  # Dagster's tables made here, before the daemon and the submitter use them
    daemon = start_daemon(tmp_path / "daemon.log")  # starting while the run is submitted
    try:
        t0 = time.monotonic()
        (tmp_path / "first").mkdir()
        out = subprocess.run(
            [*AIP_EVAL, "run", str(spec), "--run-id", "g-1", "--submit", "--detach"],
            cwd=tmp_path / "first",
            capture_output=True,
            text=True,
            timeout=600,
            env=dict(os.environ),
        )
        assert out.returncode == 0, out.stderr
        submit_seconds = time.monotonic() - t0  # loads the code location, as each run worker does
        patience = 60 + 30 * submit_seconds
        wait_for(
            "the first worker journaled 12 calls",
            lambda: journaled() >= 12,
            patience,
            tmp_path / "daemon.log",
            step=0.05,
        )
        (first,) = dagster_runs(instance, "g-1")
        worker = json.loads((tmp_path / "pods" / first.dagster_run.run_id / "worker.json").read_text())
        os.kill(worker["pid"], signal.SIGKILL)
        kept = journaled()
        asked_before = len([b for b in sut.requests if not is_preflight(b)])
        wait_for(
            "run monitoring marked the killed run failed",
            lambda: instance.get_run_by_id(first.dagster_run.run_id).status.value == "FAILURE",
            patience,
            tmp_path / "daemon.log",
        )
        (tmp_path / "second").mkdir()
        out = subprocess.run(
            [*AIP_EVAL, "run", str(spec), "--run-id", "g-1", "--submit"],
            cwd=tmp_path / "second",
            capture_output=True,
            text=True,
            timeout=patience,
            env=dict(os.environ),
        )
    finally:
        stop(daemon)
    assert out.returncode == 0, out.stderr + (tmp_path / "daemon.log").read_text()[-3000:]
    assert "resuming run g-1" in out.stderr and "g-1 × llm.decision_flip: success" in out.stderr
    assert "Warehouse: DuckLake at" in out.stdout and "llm.decision_flip" in out.stdout  # the summary, of the lake
    runs = dagster_runs(instance, "g-1")
    assert len(runs) == 2 and {r.dagster_run.status.value for r in runs} == {"FAILURE", "SUCCESS"}
    pods = {json.loads((tmp_path / "pods" / r.dagster_run.run_id / "worker.json").read_text())["cwd"] for r in runs}
    assert len(pods) == 2
    second = next(r for r in runs if r.dagster_run.status.value == "SUCCESS")
    bodies = [json.dumps(b, sort_keys=True) for b in sut.requests if not is_preflight(b)]
    # the second worker's requests: those that arrived after its run started (a request the killed
    # worker had sent may still arrive after the kill, but long before that)
    after = [
        json.dumps(b, sort_keys=True)
        for b, t in zip(sut.requests, sut.arrivals)
        if not is_preflight(b) and t >= second.start_time
    ]
    assert 12 <= kept < len(set(bodies)) and asked_before >= kept  # killed mid-stage
    # it asked for every call but the ones journaled before the kill, each once
    assert len(after) == len(set(after)) == len(set(bodies)) - kept, (kept, asked_before, len(after))


def test_a_bad_queue_configuration_stops_before_anything_is_registered(
    tmp_path, lake, sut, postgres, monkeypatch, capsys
):
    """`run --submit` checks Dagster's side before it registers anything: each bad configuration
    exits 2 with an error naming what to fix (never the password), and no run is registered or
    queued."""
    import socket

    from aip_assets import pipeline
    from aip_assets.dagster_home import get_instance

    spec = spec_file(tmp_path / "specs", "delta", write_dataset(tmp_path / "d.jsonl", 2), sut.url)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]

    def refused(*extra: str) -> str:
        capsys.readouterr()
        assert main(["run", str(spec), "--run-id", "bad-1", "--submit", *extra]) == 2
        return capsys.readouterr().err

    assert main(["run", str(spec), "--detach"]) == 2
    assert "--detach goes with --submit" in capsys.readouterr().err
    assert "--parallel is for evaluating here" in refused("--parallel", "2")
    # Dagster's storage unreachable (a database of its own, a closed port): Dagster's retries, then said
    monkeypatch.setenv("AIP_DAGSTER_STORAGE_URL", f"postgresql+psycopg2://aip:s3cret-pw@127.0.0.1:{closed}/dg")
    err = refused()
    assert (
        f"Dagster's storage in Postgres (postgresql://aip@127.0.0.1:{closed}/dg, AIP_DAGSTER_STORAGE_URL) "
        "cannot be used"
        in err
        and "s3cret-pw" not in err
    ), err
    monkeypatch.delenv("AIP_DAGSTER_STORAGE_URL")
    # the shared-state database named in libpq's keyword form: fine for the journal, not for Dagster
    monkeypatch.setenv(
        "AIP_SHARED_STATE_URL", f"host=127.0.0.1 port={postgres.port} user=aip dbname={lake.rsplit('/', 1)[1]}"
    )
    assert "AIP_SHARED_STATE_URL is not a postgresql:// URL" in refused()
    # a password with a bare '@': the driver would take its tail for the host, and say it
    monkeypatch.setenv("AIP_SHARED_STATE_URL", lake.replace("//aip@", "//aip:SEC@RETpart@"))
    err = refused()
    assert "AIP_SHARED_STATE_URL: the user or password holds an '@'" in err and "RETpart" not in err, err
    monkeypatch.setenv("AIP_SHARED_STATE_URL", lake)
    # an instance of the user's without the run queue
    home = tmp_path / "own-home"
    home.mkdir()
    (home / "dagster.yaml").write_text(
        "storage:\n  postgres:\n    postgres_url:\n      env: AIP_DAGSTER_STORAGE_URL\n"
        "run_coordinator:\n  module: dagster._core.run_coordinator\n"
        "  class: DefaultRunCoordinator\n"
    )
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    assert "--submit needs Dagster's run queue" in refused()
    assert not pipeline.run_exists("bad-1")
    assert get_instance().get_runs() == []


def test_in_shared_mode_a_schedule_or_sensor_launch_queues_one_run_per_metric(tmp_path, lake, sut, monkeypatch):
    """The launcher job (what a schedule tick or the sensor runs) registers the run and queues one
    evaluate run per configured metric, each tagged with its partition, for the daemon to launch on
    any worker; it evaluates nothing itself. Launched again, it queues no partition twice."""
    from aip_assets import pipeline
    from aip_assets.automation import LAUNCH_JOB, launch_request
    from aip_assets.dagster_home import get_instance
    from aip_assets.definitions import defs
    from aip_assets.runspec import load_spec

    path = spec_file(tmp_path / "specs", "eps", write_dataset(tmp_path / "d.jsonl", 2), sut.url)
    data = yaml.safe_load(path.read_text())
    data["metrics"]["llm.semantic_consistency"] = {}
    path.write_text(yaml.safe_dump(data))
    monkeypatch.setenv("DAGSTER_CURRENT_IMAGE", "registry.example/aip-assets:7")  # as the Helm chart sets it
    instance = get_instance()
    request = launch_request(load_spec(path), path, "eps-1", "schedule")
    for _ in range(2):
        assert (
            defs.resolve_job_def(LAUNCH_JOB)
            .execute_in_process(run_config=request.run_config, instance=instance, tags=request.tags)
            .success
        )
    assert pipeline.run_exists("eps-1")
    queued = dagster_runs(instance, "eps-1")
    assert sorted(
        (r.dagster_run.tags["aip/metric"], r.dagster_run.tags["dagster/partition"], r.dagster_run.status.value)
        for r in queued
    ) == [
        ("llm.decision_flip", "eps-1|llm.decision_flip", "QUEUED"),
        ("llm.semantic_consistency", "eps-1|llm.semantic_consistency", "QUEUED"),
    ]
    assert all(
        r.dagster_run.tags["aip/trigger"] == "schedule"
        and r.dagster_run.remote_job_origin.location_name == "aip_assets.definitions"
        for r in queued
    )
    # a run launcher that starts runs in containers (K8sRunLauncher) finds the image on each run
    assert {r.dagster_run.job_code_origin.repository_origin.container_image for r in queued} == {
        "registry.example/aip-assets:7"
    }
    assert not any(not is_preflight(b) for b in sut.requests)  # nothing evaluated here
    # queued from a run of another location and image (the launcher's own run, in a deployment):
    # the new runs keep both; a run deleted meanwhile ends the wait as failed, saying so
    from types import SimpleNamespace

    from aip_assets.run_queue import submit, wait

    # what submit() reads of the launcher's run's repository origin
    like = SimpleNamespace(container_image="registry.example/aip-assets:8", entry_point=None, container_context=None)
    pipeline.register_run(load_spec(path), "eps-2")
    from aip_assets.partitions import register_partitions

    register_partitions(instance, "eps-2", ["llm.decision_flip"])
    [(metric, dagster_run, new)] = submit(
        instance, "eps-2", ["llm.decision_flip"], {}, location="aip-assets", like=like
    )
    run = instance.get_run_by_id(dagster_run)
    assert new and run.remote_job_origin.location_name == "aip-assets"
    assert run.job_code_origin.repository_origin.container_image == "registry.example/aip-assets:8"
    instance.delete_run(dagster_run)
    [out] = list(wait(instance, {metric: dagster_run}, poll_seconds=0.01))
    assert not out.success and out.errors == ["its Dagster run was deleted"]


def test_dagsters_postgres_storage_keeps_its_connections_open_in_shared_mode(lake):
    """Shared mode: the instance's run and event-log storage keep a connection (as Dagster's
    webserver has them do), so two statements use one Postgres backend instead of connecting
    twice, with the statement timeout set; done once per instance."""
    from sqlalchemy.pool import NullPool

    from aip_assets.dagster_home import get_instance, pooled

    instance = get_instance()
    for storage in (instance._run_storage, instance._event_storage):
        engine = storage._engine
        assert not isinstance(engine.pool, NullPool)
        pids = []
        for _ in range(2):
            with engine.connect() as c:
                pids.append(c.exec_driver_sql("SELECT pg_backend_pid()").scalar())
                timeout = c.exec_driver_sql("SHOW statement_timeout").scalar()
        assert pids[0] == pids[1] and timeout == "1min", (pids, timeout)
    engine = instance._run_storage._engine
    pooled(instance)  # again: the same engine, not a new pool
    assert instance._run_storage._engine is engine


def test_submit_a_failed_gate_is_a_failed_run_and_exit_1_then_a_stopped_daemon_leaves_no_process(
    tmp_path, lake, monkeypatch, import_seconds
):
    """Issue 24.5 through the queue: `aip-eval run --submit` waits for the daemon's run of a metric
    whose gate fails. That run is a FAILURE (its aggregation step failed on the gate, after writing
    its tables), and the command still exits 1 with the summary: a failed gate, not a failed stage
    (exit 3) and not an internal error.

    Then the daemon is stopped as a service manager stops it: `aip-eval daemon` became Dagster's
    daemon, and a SIGTERM to it ends the daemon and the code server it started, and no process of
    the instance is left running. (One daemon for both: starting one, with its code server, is
    the slowest part of each.)"""
    ds = write_dataset(tmp_path / "d.jsonl", 6)
    spec = tmp_path / "specs" / "gated.yaml"
    spec.parent.mkdir()
    spec.write_text(
        yaml.safe_dump(
            {
                "name": "gated",
                "dataset": str(ds),
                "seed": 3,
                "sut": {"provider": "builtin", "profile": {**FLIP, "p": 1.0}},
                "metrics": {"llm.decision_flip": {"threshold": 1.0, "config": {"dimensions": ["gender"]}}},
            }
        )
    )
    home = dagster_home(tmp_path / "home", tmp_path / "pods")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    patience = 120 + 40 * import_seconds  # the submitter, the daemon and the run each import Dagster
    from aip_assets.dagster_home import get_instance
    from aip_assets.run_queue import daemon_alive

    instance = get_instance()  # Dagster's tables made here, before the daemon and the submitter use them
    daemon = start_daemon(tmp_path / "daemon.log")
    (tmp_path / "submit").mkdir()
    try:
        out = subprocess.run(
            [*AIP_EVAL, "run", str(spec), "--run-id", "gated-1", "--submit"],
            cwd=tmp_path / "submit",
            capture_output=True,
            text=True,
            timeout=patience,
            env=dict(os.environ),
        )
        assert out.returncode == 1, out.stderr + (tmp_path / "daemon.log").read_text()[-3000:]
        assert "stage failed" not in out.stderr and "internal error" not in out.stderr
        assert "llm.decision_flip: gate failed: score" in out.stderr and "below threshold 1.000" in out.stderr
        assert "Warehouse: DuckLake at" in out.stdout and "FAIL" in out.stdout  # the summary, of the lake
        # the daemon stopped: SIGTERM to the process `aip-eval daemon` started as
        wait_for("the daemon reported", lambda: daemon_alive(instance), patience, tmp_path / "daemon.log")
        assert daemon.pid in instance_processes(home)  # the process started is Dagster's daemon itself
        daemon.terminate()
        daemon.wait(patience)
        wait_for(
            "every process of the instance ended",
            lambda: not instance_processes(home),
            patience,
            tmp_path / "daemon.log",
        )
    finally:
        stop(daemon)
        for pid in instance_processes(home):
            os.kill(pid, signal.SIGKILL)
    [run] = dagster_runs(instance, "gated-1")
    assert run.dagster_run.status.value == "FAILURE"
    scores = wh.query("SELECT passed FROM metric_scores WHERE run_id = 'gated-1' AND scope = 'overall'")
    assert scores.passed.tolist() == [False]
