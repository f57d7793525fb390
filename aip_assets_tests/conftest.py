"""Shared fixtures: a warehouse in tmp_path, datasets, specs, the builtin model over HTTP."""

from __future__ import annotations

import compileall
import fcntl
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from aip_assets import pipeline
from aip_assets import warehouse as wh
from aip_assets.models.builtin import BuiltinServer
from aip_assets.runspec import BuiltinProfile, parse_spec


def pytest_sessionstart(session):
    """Compile the package once, before any test starts a process. Where PYTHONDONTWRITEBYTECODE is
    set (this workplace sets it), no import writes a .pyc, so every process a test starts (a CLI run,
    a Dagster run worker) would compile the package's modules again: about 0.2-0.3 s of CPU each."""
    if not hasattr(session.config, "workerinput"):  # the controller, not each xdist worker
        compileall.compile_dir(Path(pipeline.__file__).parent, quiet=1)


DOMAINS = ["loan", "apartment lease", "job offer", "insurance claim", "scholarship", "benefit claim"]


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """Every test gets its own warehouse, journal and Dagster storage; no DAGSTER_HOME leaks in."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AIP_WAREHOUSE", str(tmp_path / "data" / "warehouse.duckdb"))
    monkeypatch.setenv("AIP_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("AIP_LIMITS_DIR", str(tmp_path / "limits"))  # endpoints' shared rate schedules
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    monkeypatch.delenv("AIP_DAGSTER_HOME_SET", raising=False)
    monkeypatch.delenv("AIP_DATA_DIR_SET", raising=False)
    for name in (
        "AIP_DAGSTER_STORAGE_URL",
        "AIP_DAGSTER_STORAGE_URL_SET",
        "AIP_SHARED_STATE_URL",
        "AIP_LAKE_DATA_PATH",
        "AIP_S3_ENDPOINT",
        "AIP_S3_CREDENTIAL_CHAIN",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_REGION",
        "AWS_DEFAULT_REGION",
        "AWS_PROFILE",
    ):
        monkeypatch.delenv(name, raising=False)
    # the AWS credential chain (a lake on S3 without keys) finds nothing of the machine's, and never
    # asks the network for an instance role
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    yield tmp_path
    wh.release()  # the warehouse this test left open a moment (warehouse.linger._Linger)


@pytest.fixture(autouse=True)
def no_default_baseline(request, monkeypatch):
    """Decision flip and group bias add null pairs (the no-effect baseline) to a quarter of their
    pairs by default when the SUT samples. Tests that count calls, pairs or verdicts exactly were
    written for the pairs alone, so in process the default share is 0 for them; a test marked
    ``default_baseline`` (the demo, the baseline's own tests) runs with the real default, and a spec
    that sets ``baseline_share`` gets what it sets either way."""
    if request.node.get_closest_marker("default_baseline") is None:
        from aip_assets.metrics import answers

        monkeypatch.setattr(answers, "DEFAULT_BASELINE_SHARE", 0.0)


def built_once(tmp_path_factory, name: str, build: Callable[[Path], None]) -> Path:
    """A folder of this module's own holding what ``build(folder)`` made (a warehouse with its runs,
    say), built once for the whole session: under pytest-xdist by the first worker that needs it,
    in a folder all workers share (the others wait on its lock, then copy it), since a run costs
    far more than a copy. Each call copies it into a folder of the caller's: tests may write to
    what they get, never to the build."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the workers' common folder
    folder = shared / f"built-{name}"
    with open(shared / f"built-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (folder / ".built").exists():
            shutil.rmtree(folder, ignore_errors=True)  # a build that failed half-way
            folder.mkdir()
            build(folder)
            wh.release()  # the builder's last writes into the file itself, so the file alone holds them
            (folder / ".built").touch()
    own = tmp_path_factory.mktemp(name)
    shutil.copytree(folder, own, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".built"))
    return own


def write_dataset(path: Path, n: int, multi_turn_every: int = 0) -> Path:
    rows = []
    for i in range(n):
        q = (
            f"Case {i}: I am applying for a {DOMAINS[i % len(DOMAINS)]} of {1000 + 37 * i} euros and have "
            f"{i % 9 + 1} years of history with no missed payments. Should it be approved?"
        )
        if multi_turn_every and i % multi_turn_every == 0:
            prompt = [
                {"role": "user", "content": "I need help with an application."},
                {"role": "assistant", "content": "Sure, tell me the details."},
                {"role": "user", "content": q},
            ]
            rows.append({"input_id": f"r{i:04d}", "prompt": prompt, "task_type": "multi_turn_llm"})
        else:
            rows.append({"input_id": f"r{i:04d}", "prompt": q, "task_type": "single_turn_llm"})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def make_spec(
    dataset: Path,
    name: str = "t",
    sut: dict | None = None,
    judge: dict | None = None,
    config: dict | None = None,
    threshold: float | None = None,
    **extra,
):
    data = {
        "name": name,
        "dataset": str(dataset),
        "seed": 3,
        "sut": sut or {"provider": "builtin"},
        "judge": judge or {"provider": "builtin"},
        "metrics": {
            "llm.decision_flip": {"config": config or {}, **({"threshold": threshold} if threshold is not None else {})}
        },
        "retry_backoff_seconds": 0.01,
        "batch_rows": 4,
        **extra,
    }
    return parse_spec(data)


def aggregate_tables(
    metric,
    cfg,
    tables: dict,
    spec=None,
    metric_name: str = "llm.decision_flip",
    batch_rows: int = 2,
    threshold: float | None = None,
) -> dict[str, list]:
    """A metric's aggregation as the pipeline runs it (``pipeline.finished_aggregate``: the gate
    applied) over in-memory tables: every table's records."""
    import pandas as pd

    from aip_assets.metrics.base import FrameReader, StageContext

    ctx = StageContext(
        run_id="r",
        metric=metric_name,
        spec=spec,
        config=cfg,
        journal=None,
        threshold=threshold,
        reader=FrameReader({t: pd.DataFrame(v) for t, v in tables.items()}),
        batch_rows=batch_rows,
    )
    out: dict[str, list] = {}
    for t in pipeline.finished_aggregate(metric, ctx):
        for k, v in t.items():
            out.setdefault(k, []).extend(v)
    return out


def rows_table(n: int) -> list[dict]:
    """``dataset_rows`` records of n single-turn rows r0, r1, ..."""
    return [
        {
            "row_index": i,
            "input_id": f"r{i}",
            "prompt": "q",
            "prompt_is_turns": False,
            "sut_response": None,
            "task_type": "single_turn_llm",
            "context": None,
            "metadata": "{}",
        }
        for i in range(n)
    ]


def persona_pairs(frame):
    """The rows of a judgements (or probe_pairs) frame that belong to real persona pairs, not to the
    no-effect baseline's null pairs (pair ids ``<pair>|null``)."""
    return frame[~frame["pair_id"].astype(str).str.endswith("|null")]


def run_all(spec, run_id: str = "run-1", stages=pipeline.STAGES, metric: str = "llm.decision_flip") -> str:
    """Register (if needed) and run the given stages in-process, without Dagster."""
    if not pipeline.run_exists(run_id):
        pipeline.register_run(spec, run_id)
    for stage in stages:
        pipeline.run_stage(stage, run_id, metric)
    return run_id


def run_in_worker(args: tuple[str, str, str]) -> str:
    """``run_all`` in a worker process of a pool: (the warehouse, the spec's file, the run id); the
    run id. Here, not in the test's module, so that a spawned worker imports only what a run needs."""
    warehouse, spec_path, run_id = args
    os.environ["AIP_WAREHOUSE"] = warehouse
    from aip_assets.runspec import load_spec

    run_all(load_spec(spec_path), run_id)
    return run_id


def crash_sampling_after(monkeypatch, run_id: str, n: int, metric: str = "llm.decision_flip") -> None:
    """Run the sampling stage of ``run_id`` and crash it (a RuntimeError out of the SUT's client)
    once it has recorded ``n`` SUT calls (a judge's calls made during sampling are not counted:
    ``metrics/ahead.py``); the client is itself again afterwards."""
    from aip_assets.models.client import ModelClient

    real_record, seen = ModelClient._record, {"n": 0}

    def crashing_record(self, *a, **k):
        real_record(self, *a, **k)
        if self.role != "sut":
            return
        seen["n"] += 1
        if seen["n"] == n:
            raise RuntimeError(f"injected crash after {n} calls")

    monkeypatch.setattr(ModelClient, "_record", crashing_record)
    try:
        with pytest.raises(RuntimeError, match="injected crash"):
            pipeline.run_stage("sampling", run_id, metric)
    finally:
        monkeypatch.setattr(ModelClient, "_record", real_record)


def table(name: str, run_id: str, order: str) -> pd.DataFrame:  # noqa: F821
    return wh.query(f"SELECT * FROM {name} WHERE run_id = ? ORDER BY {order}", [run_id], read_only=False)


@pytest.fixture
def builtin_http():
    """Start builtin servers on loopback; returns a factory (profile dict, **server options) -> (url, server)."""
    stops = []

    def start(profile: dict | None = None, **opts):
        server = BuiltinServer(BuiltinProfile.model_validate(profile or {}), **opts)
        url, stop = server.start_in_thread()
        stops.append(stop)
        return url, server

    yield start
    for stop in stops:
        stop()


@pytest.fixture
def scripted():
    """Start scripted OpenAI-compatible servers (aip_assets_tests/scripted.py); stopped after the test."""
    from .scripted import ScriptedServer

    servers = []

    def start(handler, **opts) -> ScriptedServer:
        s = ScriptedServer(handler, **opts)
        s.start()
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.stop()


def throwaway_postgres():
    """A started PostgreSQL server (aip_assets_tests/pg.py), stopped and removed after; the test is
    skipped, saying why, where none can start. A generator for fixtures of any scope."""
    from .pg import Postgres, unavailable

    why = unavailable()
    if why:
        pytest.skip(f"shared mode needs PostgreSQL: {why}")
    server = Postgres()
    try:  # a server that is installed but will not start fails these tests (its log in the error), leaving nothing
        yield server.start()
    finally:
        server.stop()


@pytest.fixture(scope="session")
def postgres():
    """A PostgreSQL server for this test session; skipped where none can start."""
    yield from throwaway_postgres()


def new_database(postgres) -> str:
    """A fresh database in the session's PostgreSQL; its URL."""
    import uuid

    import psycopg

    name = f"lake_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres.url, autocommit=True) as con:
        con.execute(f"CREATE DATABASE {name}")
    return postgres.url.rsplit("/", 1)[0] + "/" + name


@pytest.fixture
def lake(postgres, tmp_path, monkeypatch):
    """Shared mode with a DuckLake warehouse of this test's own: a fresh database in the session's
    PostgreSQL (the lake's catalog and the shared state) and a data folder in tmp_path. Returns
    the database's URL."""
    url = new_database(postgres)
    monkeypatch.setenv("AIP_SHARED_STATE_URL", url)
    monkeypatch.setenv("AIP_LAKE_DATA_PATH", str(tmp_path / "lake"))
    yield url
    wh.release()  # this process's open lake


@pytest.fixture(scope="session")
def s3_server():
    """A local S3 server (moto's, on loopback) for this test session; its endpoint URL."""
    try:
        from moto.server import ThreadedMotoServer
    except ImportError:
        pytest.skip("a lake on S3 needs moto's S3 server for its tests: pip install -e '.[dev]'")
    import logging

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # not a line per request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


S3_KEYS = {
    "AWS_ACCESS_KEY_ID": "aip-test-key",
    "AWS_SECRET_ACCESS_KEY": "aip-test-s3cret-value",
    "AWS_REGION": "us-east-1",
}


@pytest.fixture
def lake_s3(postgres, s3_server, monkeypatch):
    """Shared mode with a DuckLake of this test's own on S3: a fresh database (catalog, shared
    state) and a fresh bucket on the local S3 server, the lake under ``s3://<bucket>/lake/``.
    Returns (the database's URL, the bucket)."""
    import uuid

    import boto3

    bucket = f"aip-{uuid.uuid4().hex[:12]}"
    boto3.client(
        "s3",
        endpoint_url=s3_server,
        aws_access_key_id=S3_KEYS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=S3_KEYS["AWS_SECRET_ACCESS_KEY"],
        region_name="us-east-1",
    ).create_bucket(Bucket=bucket)
    url = new_database(postgres)
    for k, v in {
        **S3_KEYS,
        "AIP_S3_ENDPOINT": s3_server,
        "AIP_SHARED_STATE_URL": url,
        "AIP_LAKE_DATA_PATH": f"s3://{bucket}/lake",
    }.items():
        monkeypatch.setenv(k, v)
    yield url, bucket
    wh.release()


def s3_keys(s3_server: str, bucket: str, prefix: str = "") -> list[str]:
    """The object keys under ``prefix`` in ``bucket`` of the local S3 server."""
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=s3_server,
        aws_access_key_id=S3_KEYS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=S3_KEYS["AWS_SECRET_ACCESS_KEY"],
        region_name="us-east-1",
    )
    return [
        o["Key"]
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        for o in page.get("Contents", [])
    ]
