"""Hardening (issue 10): `aip-eval sql` reads only the warehouse, bad input writes nothing,
secrets by value, connection failures named, a clear home for data, exit codes that blame the
right party."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from aip_assets import pipeline
from aip_assets import warehouse as wh
from aip_assets.cli import main
from aip_assets.errors import SpecError
from aip_assets.models.client import ModelClient
from aip_assets.runspec import Connection
from aip_assets.warehouse import opening as wh_opening
from aip_assets.warehouse import sandbox as wh_sandbox

from .conftest import make_spec, run_all, write_dataset


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


# ------------------------------------------------------------------ aip-eval sql
@pytest.fixture(scope="module")
def lake_with_a_run(postgres, tmp_path_factory):
    """A DuckLake warehouse (shared mode) with one small run, made once for this module's tests
    (they only read it): (its folder, its database's URL). The variables are set only while it
    is made; each test sets them again."""
    from .conftest import new_database

    d = tmp_path_factory.mktemp("lake_wh")
    with pytest.MonkeyPatch.context() as mp:
        url = new_database(postgres)
        for k, v in {
            "AIP_SHARED_STATE_URL": url,
            "AIP_LAKE_DATA_PATH": str(d / "lake"),
            "AIP_WAREHOUSE": str(d / "data" / "warehouse.duckdb"),
            "AIP_DATA_DIR": str(d / "data"),
        }.items():
            mp.setenv(k, v)
        mp.chdir(d)
        ds = write_dataset(d / "d.jsonl", 2)
        run_all(make_spec(ds, config={"dimensions": ["gender"], "num_pairs_per_dimension": 1}), "r")
        wh.release()
    (d / "home").mkdir()
    return d, url


@pytest.fixture(params=["local", "lake"])
def any_warehouse(tmp_path, monkeypatch, request):
    """A warehouse with one small run; HOME moved so DuckDB's user folder is visible to the test.
    Both kinds: the local file, and a DuckLake (shared mode: its catalog in Postgres)."""
    if request.param == "lake":
        d, url = request.getfixturevalue("lake_with_a_run")
        monkeypatch.setenv("AIP_SHARED_STATE_URL", url)
        monkeypatch.setenv("AIP_LAKE_DATA_PATH", str(d / "lake"))
        monkeypatch.setenv("HOME", str(d / "home"))
        monkeypatch.chdir(d)
        return d
    return request.getfixturevalue("warehouse")


@pytest.fixture
def warehouse(tmp_path, monkeypatch):
    """A local warehouse with one small run; HOME moved so DuckDB's user folder is visible to the test."""
    ds = write_dataset(tmp_path / "d.jsonl", 2)
    run_all(make_spec(ds, config={"dimensions": ["gender"], "num_pairs_per_dimension": 1}), "r")
    wh.release()  # as after the run's process ended: its last writes in the file, no DuckDB log beside it
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    return tmp_path


@pytest.mark.parametrize(
    "sql",
    [
        "COPY judgements TO '{tmp}/out.csv'",
        "COPY judgements TO '../out.csv'",
        "SELECT 1; COPY judgements TO '{tmp}/out2.csv'",
        "EXPORT DATABASE '{tmp}/export'",
        "SELECT * FROM read_text('/etc/hostname')",
        "SELECT * FROM read_csv('/etc/passwd')",
        "SELECT * FROM glob('/etc/*')",
        "CREATE SECRET s3 (TYPE S3, KEY_ID 'a', SECRET 'b')",
        "INSTALL httpfs",
        "LOAD httpfs",
        "SELECT * FROM 'https://example.com/data.csv'",
        "ATTACH '{tmp}/other.duckdb' AS other",
        "SET enable_external_access = true",
        "SET lock_configuration = false",
        "CREATE TABLE t AS SELECT 1",
        "DELETE FROM judgements",
        "COPY judgements TO '{tmp}/lake/out.csv'",  # the lake's own folder is readable, not writable
        "SELECT * FROM postgres_query('__ducklake_metadata_lake', 'SELECT 1')",
        "SELECT count(*) FROM __ducklake_metadata_lake.aip_lake.ducklake_snapshot",
        "CALL postgres_execute('__ducklake_metadata_lake', 'CREATE TABLE zz (a int)')",
        "SELECT * FROM __ducklake_metadata_lake.aip_run_budget",  # catalog.table, schema public
        "FROM __ducklake_metadata_lake.aip_run_budget",
        "SELECT * FROM query_table('__ducklake_metadata_lake.public.aip_run_budget')",
        "SELECT * FROM query('SELECT * FROM postgres_query(''__ducklake_metadata_lake'', ''SELECT 1'')')",
        "SELECT * FROM ducklake_merge_adjacent_files('lake')",  # would write Parquet in the lake's folder
        "SELECT * FROM ducklake_cleanup_old_files('lake', cleanup_all => true)",  # would delete there
        "SELECT * FROM lake.merge_adjacent_files()",  # the same, as the lake's own function
        "SELECT * FROM merge_adjacent_files()",
        "SELECT * FROM lake.snapshots()",
    ],
)
def test_sql_reads_the_warehouse_and_nothing_else(any_warehouse, capsys, sql):
    warehouse = any_warehouse
    if any(
        w in sql for w in ("postgres_query", "FROM __ducklake", "query_table", "ducklake_", "lake.", "merge_adjacent")
    ) and not sql.startswith("CALL"):
        if not (warehouse / "lake").exists():
            pytest.skip("a local warehouse has no lake catalog to reach")
    before = tree(warehouse)
    t0 = time.monotonic()
    assert main(["sql", sql.format(tmp=warehouse)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: refused: `aip-eval sql` reads the warehouse and nothing else"), err
    assert time.monotonic() - t0 < 30  # no extension download was attempted
    assert tree(warehouse) == before  # nothing written, no ~/.duckdb folder made
    assert main(["sql", "SELECT count(*) AS n FROM judgements"]) == 0 and "n" in capsys.readouterr().out


def test_sql_settings_are_locked(any_warehouse, capsys):
    assert (
        main(
            [
                "sql",
                "SELECT name, value FROM duckdb_settings() WHERE name IN ('enable_external_access', "
                "'lock_configuration', 'autoinstall_known_extensions', 'memory_limit') ORDER BY name",
                "--format",
                "json",
            ]
        )
        == 0
    )
    got = {r["name"]: r["value"] for r in json.loads(capsys.readouterr().out)}
    import duckdb

    # AIP_DUCKDB_MEMORY, as DuckDB shows it
    with duckdb.connect(config={"memory_limit": wh_opening.duckdb_memory()}) as con:
        cap = con.execute("SELECT current_setting('memory_limit')").fetchone()[0]
    assert got == {
        "autoinstall_known_extensions": "false",
        "enable_external_access": "false",
        "lock_configuration": "true",
        "memory_limit": cap,
    }  # in a lake too


def test_sql_prints_at_most_max_rows_and_max_colwidth(any_warehouse, capsys):
    """--max-rows and --max-colwidth bound the table it prints (500 rows and a 300-character
    cell asked for), and say what was left out; csv prints every row; 0 lifts a bound."""
    q = "SELECT i, repeat('x', 300) AS long_text FROM range(500) t(i) ORDER BY i"
    assert main(["sql", q, "--max-rows", "5", "--max-colwidth", "20"]) == 0
    lines = capsys.readouterr().out.splitlines()
    body = [ln for ln in lines[1:] if not ln.startswith("...")]
    assert len(body) == 5 and [ln.split()[0] for ln in body] == ["0", "1", "2", "3", "4"]
    assert max(len(ln) for ln in lines[:6]) < 40 and all(ln.rstrip().endswith("...") for ln in body)
    assert lines[-1].startswith("... 495 more row(s) not shown (500 in all")
    assert main(["sql", q, "--format", "csv", "--max-rows", "5"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 501  # header + every row
    assert main(["sql", q, "--max-rows", "0", "--max-colwidth", "0"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 501 and len(lines[1]) > 300


def test_a_lock_wait_says_who_it_waits_for(warehouse, capsys, monkeypatch):
    """A query waiting for the warehouse lock logs, every LOCK_NOTICE_S, how long it has waited
    and who holds the lock (pid and program, written by the holder); then it runs."""
    import threading

    from aip_assets import warehouse as wh

    monkeypatch.setattr(wh_opening, "LOCK_NOTICE_S", 0.2)
    held, release = threading.Event(), threading.Event()

    def hold():
        with wh.connect():
            held.set()
            release.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    held.wait(10)
    threading.Timer(1.0, release.set).start()
    assert main(["sql", "SELECT count(*) AS n FROM judgements", "--format", "json"]) == 0
    t.join()
    out, err = capsys.readouterr()
    waits = [ln for ln in err.splitlines() if "waiting" in ln]
    assert waits and all("for the warehouse lock" in w and f"held by pid {os.getpid()}" in w for w in waits)
    assert json.loads(out)[0]["n"] > 0


AIP_EVAL = [sys.executable, "-m", "aip_assets.cli"]
ENDLESS = {  # queries that never end on their own
    "recursive CTE": (
        "WITH RECURSIVE t(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM t) SELECT count(*) AS n FROM t",
        "table",
    ),
    # its rows fetched (csv: every row): the fetch, not the join, is where it spends its time
    "cross join": ("SELECT * FROM range(100000) a, range(100000) b, range(100000) c", "csv"),
}
STOPPED = "error: stopped after {t} s (--timeout); narrow the query or raise --timeout"
_STARTUP: dict[str, float] = {}


def sql_process(query: str, *extra: str) -> subprocess.Popen:
    """`aip-eval sql QUERY ...` in its own process (this test's environment: its warehouse or lake)."""
    return subprocess.Popen(
        [*AIP_EVAL, "sql", query, *extra],
        env=dict(os.environ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def startup() -> float:
    """What a quick query's process takes here (started, connected, answered, ended), measured once
    per kind of warehouse (run it before this process takes the warehouse's lock)."""
    kind = "lake" if os.environ.get("AIP_SHARED_STATE_URL") else "local"
    if kind not in _STARTUP:
        t0 = time.monotonic()
        proc = sql_process("SELECT 1 AS one", "--format", "json")
        try:
            out, err = proc.communicate(timeout=300)
        finally:
            proc.kill()
            proc.wait()
        assert proc.returncode == 0 and json.loads(out) == [{"one": 1}], err
        _STARTUP[kind] = time.monotonic() - t0
    return _STARTUP[kind]


def patience(timeout_s: float) -> float:
    """How long to wait for a query stopped at ``timeout_s`` to end: the timeout and a generous
    multiple of a quick query's process."""
    return timeout_s + 20 * startup() + 10


@pytest.mark.parametrize("shape", list(ENDLESS))
def test_sql_stops_an_endless_query_at_its_timeout(any_warehouse, shape):
    """`aip-eval sql --timeout 1` interrupts a query that would run for ever (a recursive CTE with
    no end, a three-way cross join of range(100000) being fetched), in a local warehouse and in a
    lake: exit 2, the message, and nothing printed as a result."""
    query, fmt = ENDLESS[shape]
    wait = patience(1)
    proc = sql_process(query, "--timeout", "1", "--format", fmt)
    try:
        out, err = proc.communicate(timeout=wait)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 2 and err.strip().splitlines()[-1] == STOPPED.format(t=1), err
    assert out == ""


def test_a_write_waits_for_a_query_at_its_timeout_then_goes_on(warehouse, monkeypatch, caplog):
    """While `aip-eval sql --timeout 2` (more on a slow machine) runs an endless query in another
    process, holding the warehouse's lock, a run's registration here waits for the lock (its wait
    names that process) and goes through once the query is stopped: the lock is let go with the
    interrupt, so the write does not wait out its own patience (AIP_WAREHOUSE_LOCK_TIMEOUT, here
    set to the query's)."""
    import logging
    import math

    timeout = max(2, math.ceil(4 * startup()))  # time for the registration to start waiting
    wait = patience(timeout)
    monkeypatch.setenv("AIP_WAREHOUSE_LOCK_TIMEOUT", str(wait))
    monkeypatch.setattr(wh_opening, "LOCK_NOTICE_S", 0.2)
    spec = make_spec(write_dataset(warehouse / "d2.jsonl", 2), name="behind")
    proc = sql_process(ENDLESS["recursive CTE"][0], "--timeout", str(timeout))
    lock_file = Path(str(wh.default_path()) + ".lock")
    try:
        while f"pid {proc.pid} " not in lock_file.read_text():  # the query's process has taken the lock
            assert proc.poll() is None, f"the query ended first (exit {proc.returncode}): {proc.stderr.read()}"
            time.sleep(0.01)
        with caplog.at_level(logging.WARNING, logger="aip_assets"):
            pipeline.register_run(spec, "behind")
        out, err = proc.communicate(timeout=wait)
    finally:
        proc.kill()
        proc.wait()
    waits = [r.getMessage() for r in caplog.records if "waiting" in r.getMessage()]
    assert waits and all(f"held by pid {proc.pid} " in w for w in waits), waits  # it did wait for the query
    assert proc.returncode == 2 and err.strip().splitlines()[-1] == STOPPED.format(t=timeout) and out == "", err
    runs = wh.query("SELECT run_id FROM eval_runs ORDER BY run_id", read_only=True)
    assert list(runs.run_id) == ["behind", "r"]


def test_an_interrupt_that_comes_before_the_statement_is_repeated(warehouse, monkeypatch):
    """DuckDB forgets an interrupt that comes while no statement runs (it clears it when one starts),
    so the timeout interrupts again until the query has stopped: here the first interrupt is made to
    land between the check of the query and its start, and the endless query is still stopped."""

    class Watched:  # the sandbox's connection, telling when it was interrupted
        def __init__(self, con):
            self.con, self.interrupts = con, threading.Event()

        def interrupt(self):
            self.interrupts.set()
            self.con.interrupt()

        def __getattr__(self, name):
            return getattr(self.con, name)

    check = wh.check_query

    def check_then_wait(con, sql):
        check(con, sql)
        assert con.interrupts.wait(60), "the timeout never interrupted"  # the first one: before the query starts

    monkeypatch.setattr(wh_sandbox, "check_query", check_then_wait)
    result: list = []
    wait = patience(0.05)  # measured before this process takes the warehouse's lock
    with wh.sandboxed() as con:
        watched = Watched(con)

        def query():
            try:
                result.append(wh.run_bounded(watched, ENDLESS["recursive CTE"][0], 0.05))
            except BaseException as e:  # noqa: BLE001 - the test reads it
                result.append(e)

        t = threading.Thread(target=query)
        t.start()
        t.join(wait)
        stopped = not t.is_alive()
        if not stopped:  # not stopped: end it here, then fail
            con.interrupt()
            t.join()
        assert stopped, f"the query was not stopped in {wait:.0f} s"
        assert result and isinstance(result[0], wh.QueryStopped), result
        assert con.execute("SELECT 42").fetchone() == (42,)  # the connection is usable again


def test_sql_timeout_zero_is_no_limit_and_a_quick_query_is_untouched(warehouse, capsys):
    """--timeout 0 sets no limit: a query that a 1 ms timeout stops gives its answer; a quick query
    under the default timeout prints as before (csv, json, the table's row count); no timer thread
    outlives a query; a negative timeout is refused."""
    slow = "SELECT count(*) AS n FROM range(100000) a, range(3000) b"  # 3e8 rows: far more than 1 ms
    assert main(["sql", slow, "--timeout", "0.001"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.strip() == STOPPED.format(t=0.001)
    assert main(["sql", slow, "--timeout", "0", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"n": 300_000_000}]
    n = int(wh.query("SELECT count(*) AS n FROM judgements", read_only=True)["n"][0])
    assert n > 0
    assert main(["sql", "SELECT count(*) AS n FROM judgements", "--format", "csv"]) == 0
    assert capsys.readouterr().out == f"n\n{n}\n"
    assert main(["sql", "SELECT judgement_id FROM judgements ORDER BY judgement_id", "--max-rows", "1"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith(f"... {n - 1} more row(s) not shown ({n} in all")
    assert main(["sql", "SELECT judgement_id FROM judgements WHERE false", "--format", "json"]) == 0
    assert capsys.readouterr().out.strip() == "[]"
    assert main(["sql", "SELECT judgement_id FROM judgements WHERE false"]) == 0
    assert capsys.readouterr().out.strip() == "(no rows)"
    assert not [t for t in threading.enumerate() if t.name == "aip-sql-timeout"]
    assert main(["sql", "SELECT 1", "--timeout", "-1"]) == 2
    assert "--timeout must be 0 (no limit) or a number of seconds, got -1" in capsys.readouterr().err


# ------------------------------------------------------------------ bad input writes nothing
def _spec_file(tmp_path, **over) -> Path:
    ds = over.pop("dataset", None) or write_dataset(tmp_path / "in" / "d.jsonl", 3)
    data = {"name": "bad", "dataset": str(ds), "metrics": {"llm.decision_flip": {}}, **over}
    p = tmp_path / "in" / "spec.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def _bad_dataset(tmp_path) -> Path:
    p = tmp_path / "in" / "bad.jsonl"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(
        json.dumps({"input_id": "a", "prompt": "q?", "task_type": "single_turn_llm"})
        + "\n"
        + json.dumps({"input_id": "a", "prompt": "q2?", "task_type": "single_turn_llm"})
        + "\n"
    )
    return p


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.mark.parametrize(
    "case",
    [
        "bad_yaml",
        "unknown_field",
        "bad_config",
        "bad_dataset",
        "bad_metric_dataset",
        "unreachable_sut",
        "unknown_metric_flag",
        "missing_key",
        "missing_audit_key",
        "pairs_filtered_out",
    ],
)
def test_bad_input_leaves_no_file(tmp_path, capsys, monkeypatch, case):
    """Validation order: the spec, every dataset, the endpoints, then the warehouse. Nothing is
    written for bad input of any kind: the folder (warehouse, lock, journal, Dagster storage) is
    exactly as it was."""
    monkeypatch.delenv("MISSING_KEY", raising=False)
    args = []
    if case == "bad_yaml":
        p = tmp_path / "in" / "spec.yaml"
        p.parent.mkdir(parents=True)
        p.write_text("name: [unclosed\n")
    elif case == "unknown_field":
        p = _spec_file(tmp_path, sedd=1)
    elif case == "bad_config":
        p = _spec_file(tmp_path, metrics={"llm.decision_flip": {"config": {"num_pairs_per_dimension": 99}}})
    elif case == "bad_dataset":
        p = _spec_file(tmp_path, dataset=_bad_dataset(tmp_path))
    elif case == "bad_metric_dataset":
        p = _spec_file(
            tmp_path,
            metrics={
                "llm.decision_flip": {},
                "llm.perturbation_robustness_external": {"dataset": str(_bad_dataset(tmp_path))},
            },
        )
    elif case == "unreachable_sut":
        p = _spec_file(
            tmp_path, sut={"provider": "openai", "base_url": f"http://127.0.0.1:{_free_port()}/v1", "model": "m"}
        )
    elif case == "unknown_metric_flag":
        p = _spec_file(tmp_path)
        args = ["--metric", "llm.semantic_consistency"]
    elif case == "missing_audit_key":  # the audit judge is an endpoint like the others: checked first
        p = _spec_file(
            tmp_path,
            judge_audit={
                "judge": {
                    "provider": "openai",
                    "base_url": "http://127.0.0.1:9/v1",
                    "model": "m",
                    "api_key_env": "MISSING_KEY",
                }
            },
        )
    elif case == "pairs_filtered_out":
        p = _spec_file(
            tmp_path,
            metrics={
                "llm.decision_flip": {
                    "config": {
                        "dimensions": ["role"],
                        "persona_pairs": [{"dimension": "gender", "persona_a": "woman", "persona_b": "man"}],
                    }
                }
            },
        )
    else:
        p = _spec_file(
            tmp_path,
            sut={"provider": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m", "api_key_env": "MISSING_KEY"},
        )
    before = tree(tmp_path)
    # an endpoint that does not answer is a failure outside the project (5), the rest bad input (2)
    assert main(["run", str(p), "--quiet", *args]) == (5 if case == "unreachable_sut" else 2)
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err
    assert tree(tmp_path) == before, sorted(tree(tmp_path) - before)
    if case == "bad_dataset":
        assert "bad.jsonl: row 2" in err and "input_id" in err
    if case == "unreachable_sut":
        assert "connection refused" in err
    if case in ("missing_key", "missing_audit_key"):
        assert "MISSING_KEY (api_key_env) is not set" in err
    if case == "pairs_filtered_out":
        assert "every pair would be filtered out" in err


@pytest.mark.parametrize("command", ["answer", "perturb"])
def test_an_output_file_of_unknown_kind_is_refused_before_any_work(tmp_path, capsys, command):
    ds = write_dataset(tmp_path / "d.jsonl", 2)
    before = tree(tmp_path)
    assert main([command, str(ds), str(tmp_path / "new" / "out.txt")]) == 2
    assert "out.txt: the output must end in .jsonl, .csv or .parquet" in capsys.readouterr().err
    assert tree(tmp_path) == before


@pytest.mark.parametrize("argv", [["runs"], ["sql", "SELECT 1"], ["report", "nope"], ["compare", "a", "b"]])
def test_commands_on_a_missing_warehouse_create_nothing(tmp_path, capsys, argv):
    before = tree(tmp_path)
    assert main(argv) == 2
    assert "no warehouse yet" in capsys.readouterr().err
    assert tree(tmp_path) == before


def test_resuming_with_a_metric_the_run_does_not_configure_is_the_users_mistake(tmp_path, capsys):
    """--metric on a resumed run is checked against the run's stored spec (not the YAML, which may
    have changed since): a clear input error, exit 2, nothing run."""
    ds = write_dataset(tmp_path / "d.jsonl", 2)
    pipeline.register_run(make_spec(ds), "r1")  # decision flip only
    data = make_spec(ds).model_dump()
    data["metrics"]["llm.semantic_consistency"] = {"config": {}}
    spec = tmp_path / "both.yaml"
    spec.write_text(yaml.safe_dump(data))
    assert main(["run", str(spec), "--run-id", "r1", "--metric", "llm.semantic_consistency"]) == 2
    err = capsys.readouterr().err
    assert "metric llm.semantic_consistency is not configured in run r1" in err and "internal error" not in err
    assert wh.query("SELECT count(*) AS n FROM dataset_rows").n[0] == 0


def test_main_leaves_the_process_logging_as_it_found_it(tmp_path, capsys, caplog):
    """`main()` called in a process (a test, a notebook) configures the `aip_assets` logger for its
    command only: afterwards a warning reaches the root logger again, and nothing writes to a stream
    that the caller has closed since (CI failed on exactly that: a later test's warning went to a
    closed capture file instead of caplog)."""
    import logging

    logger = logging.getLogger("aip_assets")
    before = (logger.handlers[:], logger.level, logger.propagate)
    assert main(["runs"]) == 2
    assert (logger.handlers[:], logger.level, logger.propagate) == before
    logger.warning("after main")
    assert "after main" in caplog.text


# ------------------------------------------------------------------ secrets by value
@pytest.mark.parametrize(
    "name,value",
    [
        ("X-Credential", "plain"),  # by name
        ("X-Signature", "abc"),
        ("X-Client", "a8Kq2LmZ9xYw4Tr7Vb3Np6HcQ"),  # by value: long and random
        ("X-Trace", "Bearer abcdefghijkl"),
        ("X-Upstream", "sk-proj-0123456789abcdef"),
        ("X-Id", "c331034d7081fef773bbff5b359388d9b89d5e2d"),
        ("X-Region", "AKIAIOSFODNN7EXAMPLE"),  # an AWS key id
        ("X-Api-Key", "plain"),
        ("Ocp-Apim-Subscription-Key", "plain"),
        ("X-Client-Secret", "plain"),
    ],
)
def test_credential_headers_are_refused_whatever_their_name(tmp_path, name, value):
    ds = write_dataset(tmp_path / "d.jsonl", 2)
    with pytest.raises(SpecError, match="header_env") as e:
        make_spec(ds, sut={"provider": "openai", "base_url": "http://127.0.0.1:1/v1", "headers": {name: value}})
    assert value not in str(e.value) or value in ("plain", "abc")


@pytest.mark.parametrize(
    "conn,needle",
    [
        ({"base_url": "http://user:hunter2@127.0.0.1:1/v1"}, "user name or password"),
        ({"base_url": "http://127.0.0.1:1/v1?api_key=abc"}, "query parameter(s) ['api_key']"),
        ({"base_url": "http://127.0.0.1:1/v1?x=sk-proj-0123456789abcdef"}, "query parameter(s) ['x']"),
        ({"params": {"api_key": "abc"}}, "params ['api_key']"),
        ({"params": {"user": "Bearer abcdefghijkl"}}, "params ['user']"),
    ],
)
def test_credentials_in_urls_and_params_are_refused(tmp_path, conn, needle):
    ds = write_dataset(tmp_path / "d.jsonl", 2)
    with pytest.raises(SpecError) as e:
        make_spec(ds, sut={"provider": "openai", "base_url": "http://127.0.0.1:1/v1", **conn})
    assert needle in str(e.value) and "hunter2" not in str(e.value) and "sk-proj" not in str(e.value)


def test_ordinary_urls_and_params_are_kept(tmp_path):
    ds = write_dataset(tmp_path / "d.jsonl", 2)
    spec = make_spec(
        ds,
        sut={
            "provider": "openai",
            "base_url": "http://127.0.0.1:1/v1?api-version=2024-06-01",
            "params": {"top_p": 0.9, "seed": 7, "stop": ["\n\n"], "user": "nightly-eval"},
        },
    )
    assert spec.resolved()["sut"]["params"]["user"] == "nightly-eval"


@pytest.mark.parametrize(
    "value",
    [
        "fairness",
        "application/json",
        "team-fairness-nightly-2026-11",
        "evaluation-pipeline-v2.3.1",
        "Mozilla/5.0 (X11; Linux x86_64)",
        # words that begin like a provider's token but are none
        "asia-southeast1",
        "hf_datasets_team",
        "sk-learn-team",
        "akiaproject1",
    ],
)
@pytest.mark.parametrize("name", ["X-Team", "X-Monkey-Team"])  # "key" inside a word is no key
def test_ordinary_header_values_are_kept(tmp_path, value, name):
    ds = write_dataset(tmp_path / "d.jsonl", 2)
    spec = make_spec(ds, sut={"provider": "openai", "base_url": "http://127.0.0.1:1/v1", "headers": {name: value}})
    assert spec.resolved()["sut"]["headers"] == {name: value}


def test_secrets_from_the_environment_are_never_stored(tmp_path, monkeypatch, capsys, builtin_http):
    secret_key, secret_sig = "sk-live-4f9Qz8LmX2", "sig-7Hq2Xw9PzL4k"
    monkeypatch.setenv("THE_KEY", secret_key)
    monkeypatch.setenv("THE_SIG", secret_sig)
    url, _ = builtin_http(api_key=secret_key)
    ds = write_dataset(tmp_path / "d.jsonl", 2)
    spec = tmp_path / "s.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "name": "sec",
                "dataset": str(ds),
                "sut": {
                    "provider": "openai",
                    "base_url": url,
                    "model": "m",
                    "api_key_env": "THE_KEY",
                    "header_env": {"X-Signature": "THE_SIG", "X-Credential": "THE_SIG"},
                },
                "metrics": {"llm.decision_flip": {"config": {"dimensions": ["gender"], "num_pairs_per_dimension": 1}}},
            }
        )
    )
    assert main(["run", str(spec), "--quiet", "--json"]) == 0
    out = capsys.readouterr()
    with wh.connect(read_only=True) as con:
        for (t,) in con.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_type = 'BASE TABLE'"
        ).fetchall():
            text = con.execute(f"SELECT * FROM {t}").df().to_csv()
            assert secret_key not in text and secret_sig not in text, t
    assert secret_key not in out.out + out.err and secret_sig not in out.out + out.err
    journal = (tmp_path / "data" / "warehouse.journal.sqlite").read_bytes()
    assert secret_key.encode() not in journal and secret_sig.encode() not in journal
    # the journal deflates request bodies: read them back, inflated, too
    import sqlite3

    from aip_assets.models.journal import Journal

    path = tmp_path / "data" / "warehouse.journal.sqlite"
    with sqlite3.connect(path) as con:
        parts = con.execute("SELECT DISTINCT run_id, metric, stage FROM call_parts").fetchall()
    j = Journal(path)
    texts = [f.to_csv() for part in parts for f in j.frames(*part)]
    j.close()
    assert len(texts) >= 2 and all('"messages"' in t for t in texts)
    assert not any(secret_key in t or secret_sig in t for t in texts)


# ------------------------------------------------------------------ connection failures, named
def _server(mode: str) -> tuple[int, object]:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    if mode == "backlog":  # a full accept queue: a new connection hangs in its handshake
        s.listen(0)
        fill = []
        for _ in range(8):
            c = socket.socket()
            c.setblocking(False)
            try:
                c.connect(("127.0.0.1", port))
            except BlockingIOError:
                pass
            fill.append(c)
        return port, (s, fill)
    s.listen(16)

    def run():
        while True:
            try:
                c, _ = s.accept()
            except OSError:
                return
            if mode == "close":
                c.recv(65536)
                c.close()
            elif mode == "plain":  # answers a TLS hello in plain HTTP
                c.recv(65536)
                c.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                c.close()
            else:  # hang: accept, never answer
                threading.Thread(target=lambda c=c: (time.sleep(20), c.close()), daemon=True).start()

    threading.Thread(target=run, daemon=True).start()
    return port, s


def _error(url: str, timeout: float = 1.0, stall_at: float | None = None) -> tuple[str, float]:
    """The error of one call to ``url``; ``stall_at``: the event loop is blocked for 0.25 s from
    that many seconds after the call starts (a busy machine's late turn of the loop)."""

    async def go():
        conn = Connection(provider="openai", base_url=url, model="m")
        async with ModelClient(conn, role="sut", run_id="r", metric="m", stage="s", journal=None) as c:
            t0 = time.perf_counter()
            if stall_at is not None:
                asyncio.get_running_loop().call_later(stall_at, time.sleep, 0.25)
            r = await c.chat([{"role": "user", "content": "x"}], temperature=0, retries=0, timeout=timeout)
            return r.error, time.perf_counter() - t0

    return asyncio.run(go())


def test_connection_failures_say_what_happened(monkeypatch):
    keep = []
    err, took = _error(f"http://127.0.0.1:{_free_port()}/v1")
    assert err.startswith("connection refused") and took < 1.0
    port, s = _server("close")
    keep.append(s)
    err, took = _error(f"http://127.0.0.1:{port}/v1")
    assert err.startswith("connection closed by the server without an answer") and took < 1.0, err
    port, s = _server("plain")
    keep.append(s)
    err, _ = _error(f"https://127.0.0.1:{port}/v1")
    assert err.startswith("TLS failure"), err
    port, s = _server("hang")
    keep.append(s)
    err, took = _error(f"http://127.0.0.1:{port}/v1", timeout=0.5)
    assert err.startswith("read timeout: connected, but no answer within 0.5s") and took >= 0.5, err
    port, s = _server("backlog")
    keep.append(s)
    err, took = _error(f"http://127.0.0.1:{port}/v1", timeout=0.5)
    assert err.startswith("connect timeout: no connection within 0.5s"), err
    # the loop late past the connect timeout: that timeout is still the one reported, not the outer
    # bound of the try ("no complete answer"), which fires well after it
    err, took = _error(f"http://127.0.0.1:{port}/v1", timeout=0.5, stall_at=0.45)
    assert err.startswith("connect timeout: no connection within 0.5s") and took >= 0.7, err
    # a name that cannot be resolved (the resolver is replaced: no lookup leaves the machine)
    real = socket.getaddrinfo

    def fake(host, *a, **kw):
        if host == "no-such-host.invalid":
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real(host, *a, **kw)

    monkeypatch.setattr(socket, "getaddrinfo", fake)
    err, _ = _error("http://no-such-host.invalid/v1")
    assert err.startswith("DNS failure"), err


# ------------------------------------------------------------------ where the data goes
def _standalone_spec(folder: Path) -> Path:
    ds = write_dataset(folder / "d.jsonl", 2)
    p = folder / "spec.yaml"
    p.write_text(
        yaml.safe_dump(
            {
                "name": "away",
                "dataset": "d.jsonl",
                "metrics": {"llm.decision_flip": {"config": {"dimensions": ["gender"], "num_pairs_per_dimension": 1}}},
            }
        )
    )
    assert ds.exists()
    return p


def test_outside_a_project_the_data_goes_to_the_user_folder(tmp_path, monkeypatch, capsys):
    for var in ("AIP_DATA_DIR", "AIP_WAREHOUSE", "DAGSTER_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    spec = _standalone_spec(tmp_path / "specs")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["run", str(spec), "--quiet", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["warehouse"] == str(tmp_path / "xdg" / "aip-assets" / "warehouse.duckdb")
    assert not any(elsewhere.iterdir())  # no stray data/ folder where we stand
    assert (tmp_path / "xdg" / "aip-assets" / "dagster_home" / "storage").is_dir()


def test_inside_a_project_the_data_goes_to_its_data_folder(tmp_path, monkeypatch, capsys):
    for var in ("AIP_DATA_DIR", "AIP_WAREHOUSE", "DAGSTER_HOME"):
        monkeypatch.delenv(var, raising=False)
    project = tmp_path / "proj"
    (project / "runs").mkdir(parents=True)
    (project / "workspace.yaml").write_text("load_from: [{python_module: aip_assets.definitions}]\n")
    spec = _standalone_spec(project / "runs")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["run", str(spec), "--quiet", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["warehouse"] == str(project / "data" / "warehouse.duckdb")
    assert not any(elsewhere.iterdir())
    monkeypatch.chdir(project / "runs")  # a later command from inside the project finds the same data
    assert main(["runs"]) == 0 and "away-" in capsys.readouterr().out


def test_a_spec_outside_the_project_run_from_inside_it_lands_in_the_projects_data(tmp_path, monkeypatch, capsys):
    """Issue 38: `aip-eval run /elsewhere/spec.yaml` from the project root wrote to the user's folder,
    where `aip-eval ui` and the printed `aip-eval sql` hint, started from the same place, found nothing."""
    for var in ("AIP_DATA_DIR", "AIP_WAREHOUSE", "DAGSTER_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    project = tmp_path / "proj"
    project.mkdir()
    (project / "workspace.yaml").write_text("load_from: [{python_module: aip_assets.definitions}]\n")
    spec = _standalone_spec(tmp_path / "elsewhere")
    monkeypatch.chdir(project)
    assert main(["run", str(spec), "--quiet", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["warehouse"] == str(project / "data" / "warehouse.duckdb")
    assert not (tmp_path / "xdg").exists()
    assert main(["sql", f"SELECT run_id FROM eval_runs WHERE run_id = '{out['run_id']}'"]) == 0
    assert out["run_id"] in capsys.readouterr().out


# ------------------------------------------------------------------ validate and exit codes
def test_validate_shows_only_what_applies(tmp_path, capsys):
    ds = write_dataset(tmp_path / "d.jsonl", 3)
    p = tmp_path / "s.yaml"
    p.write_text(
        yaml.safe_dump(
            {
                "name": "v",
                "dataset": str(ds),
                "sut": {"provider": "openai", "base_url": "http://127.0.0.1:1/v1", "model": "m"},
                "metrics": {"llm.decision_flip": {}},
            }
        )
    )
    before = tree(tmp_path)
    assert main(["validate", str(p)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert "profile" not in out["resolved"]["sut"] and out["resolved"]["sut"]["base_url"].startswith("http://")
    assert "base_url" not in out["resolved"]["judge"] and "profile" in out["resolved"]["judge"]
    assert out["dataset_rows"] == 3 and tree(tmp_path) == before


def test_a_bug_is_not_the_users_mistake(tmp_path, capsys, monkeypatch):
    ds = write_dataset(tmp_path / "d.jsonl", 2)
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump({"name": "v", "dataset": str(ds), "metrics": {"llm.decision_flip": {}}}))

    def boom(spec):
        raise ValueError("an internal invariant broke")

    monkeypatch.setattr(pipeline, "validate_datasets", boom)
    assert main(["validate", str(p)]) == 3
    err = capsys.readouterr().err
    assert "internal error: ValueError: an internal invariant broke" in err and "AIP_DEBUG=1" in err
    assert "Traceback" not in err
    monkeypatch.setenv("AIP_DEBUG", "1")
    assert main(["validate", str(p)]) == 3
    assert "Traceback" in capsys.readouterr().err
    # the user's own mistakes stay exit 2, with the field named
    assert main(["serve-builtin", "--profile", "{not json"]) == 2
    assert "--profile: not valid JSON" in capsys.readouterr().err
    assert main(["serve-builtin", "--profile", '{"name": "flip"}']) == 2
    assert "--profile" in capsys.readouterr().err
    os.environ.pop("AIP_DEBUG", None)
