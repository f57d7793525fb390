"""Shared mode's warehouse: a DuckLake with its catalog in Postgres (issue 14).

Needs PostgreSQL (aip_assets_tests/pg.py); skipped, saying why, where none can start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import duckdb
import pytest

from aip_assets import warehouse as wh
from aip_assets.cli import main
from aip_assets.warehouse import lake as lk
from aip_assets.warehouse import linger as wh_linger
from aip_assets.warehouse import opening as wh_opening

from .conftest import crash_sampling_after, make_spec, run_all, table, write_dataset
from .test_pipeline import FLIP, _assert_same, _stable


def make_lake() -> None:
    """Make this test's lake (its tables), then let this process's connection to it go."""
    with wh.connect(create=True):
        pass
    wh.release()


def start_workers(script: Path, argv: list[list[str]]) -> tuple[Path, list[subprocess.Popen]]:
    """Worker processes of ``script`` (one per argument list, the go-file last), waiting for the
    go-file beside the script; returns (the go-file, the processes)."""
    go = script.parent / "go"
    return go, [
        subprocess.Popen(
            [sys.executable, str(script), *args, str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(os.environ),
        )
        for args in argv
    ]


def test_a_lake_warehouse_gives_the_local_results_and_any_duckdb_reads_it(
    tmp_path, builtin_http, lake, monkeypatch, capsys
):
    """The same run in a lake and in a local file: every stable table equal; the lake's rows are
    Parquet files in its folder and no warehouse file is made; another process with plain duckdb
    and the two extensions attaches the lake read-only and reads the views; the CLI reads it."""
    ds = write_dataset(tmp_path / "d.jsonl", 8)
    url, _ = builtin_http(FLIP)
    spec = make_spec(ds, sut={"provider": "openai", "base_url": url, "model": "m"})
    from aip_assets import pipeline

    assert not pipeline.run_exists("lk") and not wh.exists()
    run_all(spec, "lk")
    assert pipeline.run_exists("lk") and wh.exists()  # a resume finds the run in the lake
    in_lake = _stable("lk")
    assert not wh.default_path().exists() and list((tmp_path / "lake").rglob("*.parquet"))
    n_pairs = int(wh.query("SELECT count(*) AS n FROM v_pair_verdicts WHERE run_id = 'lk'").n[0])
    assert n_pairs > 0
    code = textwrap.dedent(f"""
        import duckdb, importlib, pathlib
        con = duckdb.connect(config={{"autoinstall_known_extensions": False, "autoload_known_extensions": False}})
        for n in ("ducklake", "postgres_scanner"):
            m = importlib.import_module("duckdb_extension_" + n)
            con.execute(f"LOAD '{{pathlib.Path(m.__file__).parent}}/extensions/v{{duckdb.__version__}}/{{n}}.duckdb_extension'")
        con.execute("ATTACH 'ducklake:postgres:{lake}' AS l (METADATA_SCHEMA 'aip_lake', READ_ONLY)")
        print(con.execute("SELECT count(*) FROM l.v_pair_verdicts WHERE run_id = 'lk'").fetchone()[0])
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd="/")
    assert out.returncode == 0 and int(out.stdout.strip()) == n_pairs, out.stderr
    assert main(["sql", "SELECT count(*) AS n FROM metric_scores WHERE run_id = 'lk'", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["n"] == len(in_lake["metric_scores"])

    monkeypatch.delenv("AIP_LAKE_DATA_PATH")
    monkeypatch.delenv("AIP_SHARED_STATE_URL")
    wh.release()
    run_all(spec, "local")
    _assert_same(in_lake, _stable("local"))
    assert len(table("llm_calls", "local", "created_at")) > 0


def test_a_write_that_meets_another_workers_commit_is_run_again(tmp_path, lake):
    """Two partitions of one table replaced at once conflict in DuckLake (a conflict is per table):
    the loser is rolled back whole and run again, and both partitions hold exactly their rows."""
    make_lake()
    rows = {
        run: [
            {"run_id": run, "metric": "m", "stage": "s", "level": "info", "code": "c", "message": f"{run}-{i}"}
            for i in range(n)
        ]
        for run, n in (("a", 3), ("b", 5))
    }

    def stage(run, rows_):
        path = tmp_path / f"{run}-{len(rows_)}.parquet"
        wh.frame("run_notes", rows_).to_parquet(path)
        return {"run_notes": [path]}

    for run in rows:  # both partitions have rows: replacing either deletes from the table
        wh.write_partition_files(run, "m", stage(run, rows[run][:1]), stage="s")
    other = lk.open_lake()
    before = dict(wh.LAKE_STATS)
    tries = []

    def body(con):
        tries.append(1)
        con.execute("DELETE FROM run_notes WHERE run_id = 'a'")
        con.register("_a", wh.frame("run_notes", rows["a"]))
        con.execute("INSERT INTO run_notes SELECT * FROM _a")
        if len(tries) == 1:  # another worker replaces b and commits first
            other.execute("BEGIN TRANSACTION")
            other.execute("DELETE FROM run_notes WHERE run_id = 'b'")
            other.register("_b", wh.frame("run_notes", rows["b"]))
            other.execute("INSERT INTO run_notes SELECT * FROM _b")
            other.execute("COMMIT")

    with wh.connect() as con:
        wh.transaction(con, body, "a test's partition")
    other.close()
    assert len(tries) == 2 and wh.LAKE_STATS["conflicts"] == before["conflicts"] + 1
    assert wh.LAKE_STATS["commits"] == before["commits"] + 1
    got = wh.query("SELECT run_id, message FROM run_notes ORDER BY run_id, message")
    assert list(got.itertuples(index=False, name=None)) == [(r, x["message"]) for r in "ab" for x in rows[r]]


WRITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from aip_assets import warehouse as wh
    run, n, folder, go = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
    while not Path(go).exists():
        time.sleep(0.005)
    for k in range(1, n + 1):
        path = folder / f"{run}-{k}.parquet"
        wh.frame("run_notes", [{"run_id": run, "metric": "m", "stage": "s", "message": f"{run} write {k} row {i}"}
                               for i in range(k)]).to_parquet(path)
        wh.write_partition_files(run, "m", {"run_notes": [path]}, stage="s")
    print(wh.LAKE_STATS["commits"], wh.LAKE_STATS["conflicts"])
""")


def test_workers_replacing_partitions_at_once_all_land(tmp_path, lake):
    """Three worker processes replace their own partition of one table eight times each, at the
    same moment: every write lands (conflicts are retried), each partition holds its last write."""
    make_lake()
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    go, procs = start_workers(script, [[f"w{i}", "8", str(tmp_path)] for i in range(3)])
    go.touch()
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [o[1][-2000:] for o in outs]
    stats = [tuple(map(int, o[0].split())) for o in outs]
    assert all(commits == 8 for commits, _ in stats), stats  # its writes (the tables were there: no DDL)
    got = wh.query("SELECT run_id, count(*) AS n, max(message) AS last FROM run_notes GROUP BY run_id ORDER BY run_id")
    assert list(got.run_id) == ["w0", "w1", "w2"] and list(got.n) == [8, 8, 8]
    assert all(last.startswith(f"{r} write 8 ") for r, last in zip(got.run_id, got["last"]))


@pytest.mark.parametrize("bad", ["no catalog", "folder", "catalog down"])
def test_a_bad_lake_configuration_stops_the_run_before_anything_is_written(tmp_path, capsys, monkeypatch, bad, request):
    """The lake cannot be used: `aip-eval run` stops at its checks with exit 2 and an error that
    names the variable (never the password); no warehouse, journal or report is made."""
    ds = write_dataset(tmp_path / "d.jsonl", 2)
    spec = tmp_path / "s.yaml"
    spec.write_text(
        json.dumps(
            {
                "name": "lk",
                "dataset": str(ds),
                "metrics": {"llm.decision_flip": {"config": {"dimensions": ["gender"], "num_pairs_per_dimension": 1}}},
            }
        )
    )
    monkeypatch.setenv("AIP_LAKE_DATA_PATH", str(tmp_path / "lake"))
    if bad == "folder":  # a file where the folder should be
        request.getfixturevalue("lake")
        (tmp_path / "lake").write_text("not a folder")
    elif bad == "catalog down":
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        monkeypatch.setenv("AIP_SHARED_STATE_URL", f"postgresql://aip:pw-secret@127.0.0.1:{port}/x")
    else:
        monkeypatch.delenv("AIP_SHARED_STATE_URL", raising=False)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert main(["run", str(spec), "--quiet"]) == 2
    err = capsys.readouterr().err
    want = {
        "no catalog": "AIP_LAKE_DATA_PATH is set, but AIP_SHARED_STATE_URL is not",
        "folder": "AIP_LAKE_DATA_PATH: the lake's data folder",
        "catalog down": "AIP_SHARED_STATE_URL (postgresql://aip@127.0.0.1:",
    }[bad]
    assert want in err and "pw-secret" not in err, err
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    if bad == "folder":
        assert not lk.exists()  # no catalog made either


def test_the_lake_refuses_a_data_folder_other_than_its_own(tmp_path, lake, monkeypatch):
    """The folder is stored in the catalog when the lake is made: a worker that names another one
    is refused with DuckLake's reason, rather than writing its rows elsewhere."""
    make_lake()
    monkeypatch.setenv("AIP_LAKE_DATA_PATH", str(tmp_path / "elsewhere"))
    with pytest.raises(Exception) as e:
        with wh.connect() as con:
            con.execute("SELECT 1")
    assert "AIP_LAKE_DATA_PATH: cannot open the DuckLake" in str(e.value) and "postgresql://aip@" in str(e.value)
    assert not isinstance(e.value, duckdb.Error)


class _LosesTheRace:
    """A DuckDB connection whose first ATTACH fails as it does for a worker that another one beat to
    making a new lake (the error Postgres gave, measured with three processes at once); then itself."""

    def __init__(self, con, error: str, attaches: list[str]):
        self._con, self._error, self._attaches = con, error, attaches

    def execute(self, sql, *args):
        if sql.startswith("ATTACH"):
            self._attaches.append(sql)
            if len(self._attaches) == 1:
                raise duckdb.CatalogException(self._error)
        return self._con.execute(sql, *args)

    def __getattr__(self, name):
        return getattr(self._con, name)


@pytest.mark.parametrize(
    "error, attaches",
    [
        (  # what three workers opening one new lake at once met (2 of 90 opens)
            'Failed to initialize DuckLake: Failed to execute query "CREATE TABLE "aip_lake"."ducklake_metadata"'
            '(...)": ERROR:  relation "ducklake_metadata" already exists',
            2,
        ),
        ('ERROR:  duplicate key value violates unique constraint "pg_type_typname_nsp_index"', 2),
        ("ERROR:  permission denied for schema aip_lake", 1),  # not a race: said at once
    ],
)
def test_a_worker_that_loses_the_race_to_make_a_new_lake_opens_the_one_made(lake, monkeypatch, error, attaches):
    real, seen = duckdb.connect, []
    monkeypatch.setattr(lk.duckdb, "connect", lambda *a, **k: _LosesTheRace(real(*a, **k), error, seen))
    if attaches == 1:
        with pytest.raises(Exception, match="permission denied") as e:
            lk.open_lake()
        assert "AIP_LAKE_DATA_PATH: cannot open the DuckLake" in str(e.value)
    else:
        con = lk.open_lake()
        assert con.execute("SELECT current_database()").fetchone()[0] == lk.ALIAS  # attached, in use
        con.close()
        assert lk.exists()
    assert len(seen) == attaches and len(set(seen)) == 1


def test_migrate_copies_a_local_warehouse_into_the_lake_once(tmp_path, builtin_http, postgres, monkeypatch, capsys):
    """`aip-eval migrate` copies every run of a local warehouse into the lake with all its rows
    (the tables then equal the local ones); run again, it copies nothing twice; a run made in the
    lake meanwhile is kept. Without the lake's variables it says what to set."""
    from aip_assets import pipeline

    from .conftest import new_database

    ds = write_dataset(tmp_path / "d.jsonl", 6)
    url, server = builtin_http(FLIP)
    spec = make_spec(
        ds, sut={"provider": "openai", "base_url": url, "model": "m"}, config={"sub_call_concurrency_limit": 1}
    )
    run_all(spec, "one")
    run_all(spec, "two", stages=["ingest", "synthesis"])  # a run half done: its sampling crashes after 15 calls
    crash_sampling_after(monkeypatch, "two", 15)
    local = {r: _stable(r) for r in ("one", "two")}
    n_calls = len(table("llm_calls", "one", "created_at"))
    wh.release()
    import sqlite3

    from aip_assets.models.journal import journal_path

    with sqlite3.connect(journal_path(wh.default_path())) as con:
        [(journaled,)] = con.execute(
            "SELECT count(*) FROM call_index WHERE run_id = 'two' AND stage = 'sampling' AND status = 'ok'"
        ).fetchall()
    assert 10 <= journaled <= 15
    with pytest.raises(Exception, match="set AIP_LAKE_DATA_PATH"):
        wh.migrate_into_lake(wh.default_path())
    monkeypatch.setenv("AIP_SHARED_STATE_URL", new_database(postgres))
    monkeypatch.setenv("AIP_LAKE_DATA_PATH", str(tmp_path / "lake"))
    run_all(spec, "three", stages=["ingest"])  # made in the lake
    assert main(["migrate"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("2 run(s) copied into the DuckLake") and f"llm_calls {n_calls}" in out, out
    assert "journaled call(s) into its journal" in out, out
    for r in ("one", "two"):
        _assert_same(local[r], _stable(r))
    # the crashed stage resumed in the lake: the 15 calls it journaled locally are answered from the
    # lake's journal, not asked again (the journal moved with the run)
    asked = dict(server.ok_bodies)
    pipeline.run_stage("sampling", "two", "llm.decision_flip")
    resp = table("sut_responses", "two", "probe_id")
    new = {
        b: n - asked.get(b, 0) for b, n in server.ok_bodies.items() if n > asked.get(b, 0) and "Reply with OK." not in b
    }  # endpoint checks left out
    assert resp.cached.sum() == journaled and sum(new.values()) == len(resp) - journaled, (
        sum(new.values()),
        len(resp),
        journaled,
        [b[:200] for b in new][:3],
    )
    assert main(["migrate"]) == 0 and "every run was there already" in capsys.readouterr().out
    runs = wh.query("SELECT run_id, count(*) AS n FROM eval_runs GROUP BY run_id ORDER BY run_id")
    assert list(runs.run_id) == ["one", "three", "two"] and set(runs.n) == {1}
    assert len(table("llm_calls", "one", "created_at")) == n_calls
    wh.release()


def test_the_catalogs_password_is_in_no_message_setting_or_table(tmp_path, postgres, monkeypatch, capsys):
    """The lake's ATTACH names a password file, never the password: `aip-eval sql` shows it in no
    database path or setting, and a write that fails because the catalog went away says why
    without it."""
    import psycopg

    role, password = f"pw{os.getpid()}", "S3cret:PW\\x"  # a ':' and a '\' to escape in the password file
    hba = postgres.dir / "data" / "pg_hba.conf"
    rule = f"host all {role} 127.0.0.1/32 scram-sha-256\n"
    subprocess.run(
        [*postgres.as_user, "sh", "-c", f"cat > {hba}.new"], input=rule + hba.read_text(), text=True, check=True
    )
    subprocess.run([*postgres.as_user, "mv", f"{hba}.new", str(hba)], check=True)
    with psycopg.connect(postgres.url, autocommit=True) as admin:  # this role needs its password; others do not
        admin.execute(f"CREATE ROLE {role} LOGIN SUPERUSER PASSWORD '{password}'")
        admin.execute(f"CREATE DATABASE {role} OWNER {role}")
        admin.execute("SELECT pg_reload_conf()")
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(f"postgresql://{role}:wrong@127.0.0.1:{postgres.port}/{role}").close()
    from urllib.parse import quote

    url = f"postgresql://{role}:{quote(password, safe='')}@127.0.0.1:{postgres.port}/{role}"
    monkeypatch.setenv("AIP_SHARED_STATE_URL", url)
    monkeypatch.setenv("AIP_LAKE_DATA_PATH", str(tmp_path / "lake"))
    with wh.connect(create=True):
        pass
    for q, code in (
        ("SELECT path FROM duckdb_databases()", 0),
        ("SELECT name, value FROM duckdb_settings()", 0),
        ("SELECT * FROM duckdb_secrets()", 2),
    ):  # the secrets: refused in a lake
        assert main(["sql", q, "--format", "csv"]) == code, q
        out = capsys.readouterr()
        assert "S3cret" not in out.out + out.err
    with wh.connect() as con:
        con.execute("SELECT 1")

    with psycopg.connect(postgres.url, autocommit=True) as admin:  # the catalog's connections are cut
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            [url.rsplit("/", 1)[1]],
        )
        admin.execute(f"ALTER DATABASE {url.rsplit('/', 1)[1]} ALLOW_CONNECTIONS false")
    # the catalog stays away: waited for a second (not the default minute, AIP_SHARED_RETRY_SECONDS), then said
    monkeypatch.setenv("AIP_SHARED_RETRY_SECONDS", "1")
    try:
        with pytest.raises(Exception) as e:
            with wh.connect() as con:
                con.execute("SELECT count(*) FROM eval_runs").fetchall()
        assert "S3cret" not in str(e.value) and "S3cret" not in repr(e.value.args)
    finally:
        with psycopg.connect(postgres.url, autocommit=True) as admin:
            admin.execute(f"ALTER DATABASE {url.rsplit('/', 1)[1]} ALLOW_CONNECTIONS true")


REGISTER = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from aip_assets import pipeline
    from aip_assets.errors import SpecError
    from aip_assets.runspec import load_spec
    spec, go = load_spec(sys.argv[1]), Path(sys.argv[2])
    Path(f"{go}.ready-{os.getpid()}").touch()
    while not go.exists():
        time.sleep(0.002)
    try:
        pipeline.register_run(spec, "same-id")
        print("registered")
    except SpecError as e:
        print("refused" if "already registered" in str(e) else e)
""")


def test_two_workers_registering_one_run_id_register_it_once(tmp_path, lake):
    """A lake has no primary key and DuckLake lets both inserts commit: registration is serialised
    through Postgres, so of four workers registering one run id at once, one does; three are told
    it is taken; the lake holds one row."""
    ds = write_dataset(tmp_path / "d.jsonl", 2)
    spec = tmp_path / "s.yaml"
    spec.write_text(json.dumps({"name": "same", "dataset": str(ds), "metrics": {"llm.decision_flip": {}}}))
    make_lake()
    script = tmp_path / "register.py"
    script.write_text(REGISTER)
    go, procs = start_workers(script, [[str(spec)]] * 4)
    while len(list(tmp_path.glob("go.ready-*"))) < 4 and all(p.poll() is None for p in procs):
        time.sleep(0.02)  # each has imported and waits
    go.touch()
    outs = [p.communicate(timeout=300) for p in procs]
    said = sorted(o[0].strip().splitlines()[-1] if o[0].strip() else o[1][-300:] for o in outs)
    assert said == ["refused", "refused", "refused", "registered"], said
    assert int(wh.query("SELECT count(*) AS n FROM eval_runs WHERE run_id = 'same-id'").n[0]) == 1


def test_the_lake_is_checked_not_remade_and_each_use_sets_its_own_memory(tmp_path, lake):
    """Opening a lake whose tables are this version's makes no snapshot (every DDL statement would
    be one); a use's memory and thread settings do not stay for the next use."""
    import psycopg

    make_lake()

    def snapshots():
        with psycopg.connect(lake) as con:
            return con.execute("SELECT count(*) FROM aip_lake.ducklake_snapshot").fetchone()[0]

    before = snapshots()
    for _ in range(2):
        with wh.connect() as con:
            con.execute("SELECT count(*) FROM eval_runs").fetchall()
        wh.release()
    assert snapshots() == before
    with wh.connect() as con:  # a later aip_assets made the tables: this one leaves them as they are
        con.execute("UPDATE aip_schema SET level = level + 1, version = 'later'")
    wh.release()
    before = snapshots()
    with wh.connect() as con:
        con.execute("SELECT count(*) FROM eval_runs").fetchall()
    wh.release()
    assert snapshots() == before
    with wh.connect(config={"memory_limit": "300MB", "threads": 1}) as con:
        assert con.execute("SELECT current_setting('threads')").fetchone()[0] == 1
    with wh.connect() as con:
        limit, threads = con.execute("SELECT current_setting('memory_limit'), current_setting('threads')").fetchone()
    expected = duckdb.connect(
        config={"memory_limit": wh_opening.duckdb_memory() or wh_linger._LAKE.defaults["memory_limit"]}
    )
    assert str(threads) == wh_linger._LAKE.defaults["threads"], threads
    assert limit == expected.execute("SELECT current_setting('memory_limit')").fetchone()[0], limit
    expected.close()


def test_a_journal_record_with_a_nul_is_kept(lake):
    """An endpoint's error text may hold a NUL, which Postgres text cannot: it is kept as U+FFFD,
    and the journal goes on."""
    from aip_assets.models.journal_pg import PgJournal

    j = PgJournal(lake)
    rec = {
        "run_id": "nul",
        "metric": "m",
        "stage": "sampling",
        "role": "sut",
        "call_key": "k1",
        "request": {"q": 1},
        "response_text": None,
        "status": "error",
        "error": "HTTP 500: bad\x00page",
        "attempts": 1,
        "source": "network",
        "created_at": 1.0,
    }
    j.record(rec)
    j.record({**rec, "call_key": "k2", "status": "ok", "error": None, "response_text": "fine"})
    [frame] = j.frames("nul", "m", "sampling")
    assert list(frame.error)[0] == "HTTP 500: bad\ufffdpage" and j.lookup("k2", ["nul"])["response_text"] == "fine"
    j.close()


def test_the_postgres_journal_writes_on_after_its_connection_is_lost(lake, postgres, caplog):
    """The database drops the journal's connection between two batches: the next batch is written
    on a new connection (and the log says so), nothing is lost; dropped again, a reader (the
    cache's lookup) connects again and answers."""
    import psycopg

    from aip_assets.models.journal_pg import PgJournal

    j = PgJournal(lake)

    def rec(i):
        return {
            "run_id": "lost",
            "metric": "m",
            "stage": "sampling",
            "role": "sut",
            "call_key": f"k{i}",
            "request": {"q": i},
            "response_text": f"a{i}",
            "status": "ok",
            "attempts": 1,
            "source": "network",
            "created_at": float(i),
        }

    for i in range(5):
        j.record(rec(i))
    j.flush()
    with psycopg.connect(postgres.url, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", [lake.rsplit("/", 1)[1]]
        )
    with caplog.at_level("WARNING", logger="aip_assets"):
        for i in range(5, 9):
            j.record(rec(i))
        j.flush()
    assert "connection was lost; connecting again" in caplog.text
    with psycopg.connect(postgres.url, autocommit=True) as admin:  # again, now under a reader
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", [lake.rsplit("/", 1)[1]]
        )
    assert j.lookup("k3", ["lost"])["response_text"] == "a3"
    pages = j.frames("lost", "m", "sampling", chunk=4)  # and between two pages of a stage's calls
    first = next(pages)
    with psycopg.connect(postgres.url, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", [lake.rsplit("/", 1)[1]]
        )
    rest = list(pages)
    assert [list(f.call_key) for f in (first, *rest)] == [
        [f"k{i}" for i in range(k, min(k + 4, 9))] for k in range(0, 9, 4)
    ]
    assert j.ok_keys(["lost"], "sampling") == {f"k{i}" for i in range(9)}
    [frame] = j.frames("lost", "m", "sampling")
    assert list(frame.call_key) == [f"k{i}" for i in range(9)]
    j.close()


def test_a_process_forked_after_using_the_lake_exits(lake):
    """A child forked after this process used the lake (multiprocessing's default on Linux) exits
    instead of hanging on the inherited lake's connections, and uses a lake of its own."""
    make_lake()
    with wh.connect() as con:
        con.execute("SELECT count(*) FROM eval_runs").fetchall()
    pid = os.fork()
    if pid == 0:  # the child: a use of its own, then out
        try:
            with wh.connect() as con:
                con.execute("SELECT count(*) FROM eval_runs").fetchall()
            os._exit(0)
        except BaseException:
            os._exit(3)
    deadline = time.monotonic() + 120  # a hang detector, not a speed bound: it takes well under a second
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung")
    with wh.connect() as con:  # the parent's lake still works
        assert con.execute("SELECT count(*) FROM eval_runs").fetchone() == (0,)


# ------------------------------------------------------------------ a lake on S3 (a local S3 server)
def test_a_lake_on_s3_gives_the_local_results_and_aip_eval_sql_reads_only_it(
    tmp_path, builtin_http, lake_s3, s3_server, monkeypatch, capsys
):
    """AIP_LAKE_DATA_PATH=s3://bucket/lake on S3-compatible storage: the same run gives every
    stable table of a local file, its rows are Parquet objects under the prefix and nothing is
    written on local disk; `aip-eval sql` reads the lake, and only the lake: another prefix of the
    same bucket and the S3 secret are refused."""
    from aip_assets import pipeline

    from .conftest import s3_keys

    _, bucket = lake_s3
    ds = write_dataset(tmp_path / "d.jsonl", 6)
    url, _ = builtin_http(FLIP)
    spec = make_spec(ds, sut={"provider": "openai", "base_url": url, "model": "m"})
    run_all(spec, "s3run")
    assert pipeline.run_exists("s3run")
    in_lake = _stable("s3run")
    keys = s3_keys(s3_server, bucket)
    assert keys and all(k.startswith("lake/") for k in keys) and any(k.endswith(".parquet") for k in keys)
    assert not wh.default_path().exists() and not (tmp_path / "lake").exists()
    import boto3

    from .conftest import S3_KEYS

    boto3.client(
        "s3",
        endpoint_url=s3_server,
        aws_access_key_id=S3_KEYS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=S3_KEYS["AWS_SECRET_ACCESS_KEY"],
        region_name="us-east-1",
    ).put_object(Bucket=bucket, Key="other/secret.csv", Body=b"a\n1\n")
    capsys.readouterr()
    assert main(["sql", "SELECT count(*) AS n FROM metric_scores WHERE run_id = 's3run'", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["n"] == len(in_lake["metric_scores"])
    assert (
        main(["sql", f"SELECT count(*) AS n FROM read_parquet('s3://{bucket}/lake/**/*.parquet')", "--format", "json"])
        == 0
    )  # the lake's own files: readable
    assert json.loads(capsys.readouterr().out)[0]["n"] > 0
    for q in (
        f"SELECT * FROM read_csv('s3://{bucket}/other/secret.csv')",
        "SELECT * FROM duckdb_secrets()",
        "SELECT * FROM which_secret('s3://x/y', 's3')",
        # S3 resolves dot segments after DuckDB compared the path with the lake's prefix
        f"SELECT * FROM read_csv('s3://{bucket}/lake/../other/secret.csv')",
        f"FROM 's3://{bucket}/lake/./../other/secret.csv'",
        f"SELECT * FROM read_csv('s3://{bucket}/lake/' || '..' || '/other/secret.csv')",
        f"SELECT * FROM read_csv(['s3://{bucket}/lake/x.csv', concat('s3://{bucket}/lake/.', './other/secret.csv')])",
    ):
        assert main(["sql", q]) == 2, q
        err = capsys.readouterr().err
        assert "aip-test-key" not in err and "s3cret" not in err
    # the settings httpfs copies the AWS variables into are empty (the secret serves the lake)
    assert main(["sql", "SELECT name, value FROM duckdb_settings() WHERE name LIKE 's3%'", "--format", "csv"]) == 0
    out = capsys.readouterr().out
    assert "s3_secret_access_key" in out and "aip-test-key" not in out and "s3cret" not in out
    con = lk.open_lake(read_only=True)
    try:
        assert con.execute(
            "SELECT current_setting('s3_secret_access_key'), current_setting('s3_access_key_id')"
        ).fetchone() == ("", "")
    finally:
        con.close()
    wh.release()
    for var in ("AIP_LAKE_DATA_PATH", "AIP_SHARED_STATE_URL"):
        monkeypatch.delenv(var)
    run_all(spec, "s3run")
    _assert_same(in_lake, _stable("s3run"))


@pytest.mark.parametrize("bad", ["no keys", "no bucket", "endpoint down", "endpoint form", "scheme"])
def test_a_bad_s3_configuration_stops_the_run_before_anything_is_written(
    tmp_path, lake_s3, s3_server, capsys, monkeypatch, bad
):
    """A lake on S3 that cannot be used: exit 2 at the checks before the run, naming the variable
    and never the secret key; no object, no warehouse, no run."""
    import socket

    from .conftest import s3_keys

    _, bucket = lake_s3
    ds = write_dataset(tmp_path / "d.jsonl", 2)
    spec = tmp_path / "s.yaml"
    spec.write_text(
        json.dumps(
            {
                "name": "lk",
                "dataset": str(ds),
                "metrics": {"llm.decision_flip": {"config": {"dimensions": ["gender"], "num_pairs_per_dimension": 1}}},
            }
        )
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    if bad == "no keys":  # and the credential chain finds none (conftest.isolated)
        monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    elif bad == "scheme":  # never taken for a local folder named "gs:"
        monkeypatch.setenv("AIP_LAKE_DATA_PATH", "gs://bucket/lake")
    elif bad == "no bucket":
        monkeypatch.setenv("AIP_LAKE_DATA_PATH", "s3://no-such-bucket-here/lake")
    elif bad == "endpoint down":
        monkeypatch.setenv("AIP_S3_ENDPOINT", f"http://127.0.0.1:{closed}")
    else:
        monkeypatch.setenv("AIP_S3_ENDPOINT", "127.0.0.1:9000")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert main(["run", str(spec), "--quiet"]) == 2
    err = capsys.readouterr().err
    want = {
        "no keys": "AIP_LAKE_DATA_PATH: the S3 credentials are not usable (no AWS_ACCESS_KEY_ID and "
        "AWS_SECRET_ACCESS_KEY set, and the AWS credential chain found none",
        "scheme": "AIP_LAKE_DATA_PATH must be a folder or s3://bucket/prefix",
        "no bucket": "AIP_LAKE_DATA_PATH: the lake's data path s3://no-such-bucket-here/lake/ cannot be read",
        "endpoint down": "AIP_LAKE_DATA_PATH: the lake's data path",
        "endpoint form": "AIP_S3_ENDPOINT must be http://host:port or https://host",
    }[bad]
    assert want in err and "s3cret" not in err, err
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    assert s3_keys(s3_server, bucket) == [] and not lk.exists()


def test_a_report_written_in_the_lake_is_served_from_any_host(tmp_path, builtin_http, lake, monkeypatch):
    """In a lake a report is also kept in the lake (its `reports` table, one row per report, the
    latest): the report server of another host, whose own reports folder is empty, answers the
    report's URL (the one the Dagster metadata links) from the lake; an unknown report is a 404."""
    import threading
    import urllib.error
    import urllib.request

    from aip_assets.report import report_url, serve_reports, write_report

    ds = write_dataset(tmp_path / "d.jsonl", 4)
    url, _ = builtin_http(FLIP)
    run_all(make_spec(ds, sut={"provider": "openai", "base_url": url, "model": "m"}), "rep-1")
    first = write_report("rep-1")
    out = write_report("rep-1")  # written again: replaced, not added
    assert out == first and out.is_file()
    stored = wh.query("SELECT run_id, name, html FROM reports")
    assert list(stored.run_id) == ["rep-1"] and list(stored.name) == ["rep-1.html"]
    assert stored.html[0] == out.read_text(encoding="utf-8")
    wh.release()
    elsewhere = tmp_path / "other-host"
    monkeypatch.setenv("AIP_DATA_DIR", str(elsewhere))
    monkeypatch.setenv("AIP_WAREHOUSE", str(elsewhere / "warehouse.duckdb"))
    server = serve_reports(elsewhere / "reports", port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        with urllib.request.urlopen(report_url(out, port), timeout=30) as r:
            assert r.status == 200 and r.read().decode("utf-8") == stored.html[0]
        head = urllib.request.Request(report_url(out, port), method="HEAD")
        with urllib.request.urlopen(head, timeout=30) as r:
            assert r.status == 200 and int(r.headers["Content-Length"]) == len(stored.html[0].encode("utf-8"))
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/rep-2.html", timeout=30)
        assert e.value.code == 404
    finally:
        server.shutdown()
        server.server_close()
    assert not list((elsewhere / "reports").iterdir())


def test_a_lake_on_s3_takes_its_credentials_from_the_aws_chain_without_keys(tmp_path, lake_s3, s3_server, monkeypatch):
    """No AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY: the lake uses the AWS credential chain (DuckDB's
    aws extension), here a shared credentials file, as a pod's profile or role would be."""
    from .conftest import S3_KEYS, s3_keys

    _, bucket = lake_s3
    creds = tmp_path / "aws-credentials"
    creds.write_text(
        f"[default]\naws_access_key_id = {S3_KEYS['AWS_ACCESS_KEY_ID']}\n"
        f"aws_secret_access_key = {S3_KEYS['AWS_SECRET_ACCESS_KEY']}\n"
    )
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(creds))
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    assert "aws" in lk.extensions()
    assert lk.check() is not None
    run_all(make_spec(write_dataset(tmp_path / "d.jsonl", 2)), "chain")
    assert len(table("metric_scores", "chain", "scope")) > 0
    assert any(k.endswith(".parquet") for k in s3_keys(s3_server, bucket, "lake/"))


def test_a_dry_run_in_shared_mode_writes_nothing_to_the_lake(tmp_path, lake, capsys):
    """A dry run counts calls in a throwaway local warehouse, in shared mode too: before, it
    registered a run `dry-run` in the shared lake, and the next dry run anywhere stopped with
    "run dry-run is already registered"."""
    ds = write_dataset(tmp_path / "d.jsonl", 4)
    p = tmp_path / "s.yaml"
    p.write_text(json.dumps({"name": "x", "dataset": str(ds), "metrics": {"llm.decision_flip": {}}}))
    for _ in range(2):
        assert main(["run", str(p), "--dry-run", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["total"]["sut_calls"] > 0
    assert not wh.exists() and lk.enabled()  # no lake was made, and the lake is still the warehouse
