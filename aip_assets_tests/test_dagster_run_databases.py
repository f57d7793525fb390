"""A new run's Dagster database copied from a template Dagster made (dagster_storage.TEMPLATE),
and the tables and columns Dagster asks about remembered: the same files as Dagster's own, read
and written by Dagster's plain storage, and whole after a process killed while making them."""

import logging
import os
import signal
import sqlite3
import time
from pathlib import Path

import pytest
from dagster._core.events.log import EventLogEntry
from dagster._core.storage.event_log.sqlite.sqlite_event_log import SqliteEventLogStorage

from aip_assets import dagster_storage

pytestmark = pytest.mark.skipif(not dagster_storage.FAST, reason="this Dagster gets its own storage: nothing to check")


def entry(run_id: str, msg: str) -> EventLogEntry:
    return EventLogEntry(
        error_info=None,
        level=logging.INFO,
        user_message=msg,
        run_id=run_id,
        timestamp=time.time(),
        step_key=None,
        job_name=None,
        dagster_event=None,
    )


def schema(db: Path) -> tuple:
    c = sqlite3.connect(db)
    try:
        return (
            sorted(c.execute("SELECT type, name, tbl_name, sql FROM sqlite_master").fetchall()),
            c.execute("SELECT version_num FROM alembic_version").fetchall(),
            c.execute("PRAGMA journal_mode").fetchall(),
            c.execute("PRAGMA page_size").fetchall(),
            c.execute("PRAGMA auto_vacuum").fetchall(),
        )
    finally:
        c.close()


@pytest.fixture
def initdb_calls(monkeypatch):
    calls: list[str] = []
    real = SqliteEventLogStorage._initdb

    def counted(self, engine, *a, **kw):
        calls.append(Path(engine.url.database).name)
        return real(self, engine, *a, **kw)

    monkeypatch.setattr(SqliteEventLogStorage, "_initdb", counted)
    yield calls
    dagster_storage.ANCHORS.release()


def test_new_run_databases_are_copies_of_the_one_dagster_made(tmp_path, initdb_calls):
    base = tmp_path / "runs"
    ours = dagster_storage.EngineKeepingSqliteEventLogStorage(str(base))
    initdb_calls.clear()  # the index: made by Dagster as the storage opens, as before
    for run in ("r1", "r2", "r3"):
        ours.store_event(entry(run, f"first of {run}"))
    # Dagster's own _initdb ran once, for the template (a file of its own); the three runs are copies
    assert len(initdb_calls) == 1 and initdb_calls[0].endswith(".tmp"), initdb_calls
    template = [p for p in base.iterdir() if p.name.startswith(".aip-run-database-")]
    assert [p.name for p in template] == [dagster_storage.TEMPLATE.format(version=__import__("dagster").__version__)]
    assert not list(base.glob("*.tmp")) and not list(base.glob(".*.tmp"))  # nothing left behind
    # the same database as Dagster's own storage makes for a run
    plain_base = tmp_path / "plain"
    plain = SqliteEventLogStorage(str(plain_base))
    plain.store_event(entry("p1", "Dagster's own"))
    assert schema(base / "r1.db") == schema(plain_base / "p1.db")
    assert schema(base / "r1.db")[2] == [("wal",)]
    # Dagster's plain storage (what `dagster dev` opens) reads them and writes to them
    ui = SqliteEventLogStorage(str(base))
    assert [e.user_message for e in ui.get_logs_for_run("r2")] == ["first of r2"]
    ui.store_event(entry("r2", "from the UI"))
    assert sorted(ui.get_all_run_ids()) == ["r1", "r2", "r3"]  # the template is not a run
    # a storage opened afterwards (another process) finds them made: no _initdb for them either
    initdb_calls.clear()
    again = dagster_storage.EngineKeepingSqliteEventLogStorage(str(base))
    assert [e.user_message for e in again.get_logs_for_run("r2")] == ["first of r2", "from the UI"]
    again.store_event(entry("r4", "a new run"))
    assert initdb_calls == []
    # a run database of another revision is Dagster's to look at
    c = sqlite3.connect(base / "r4.db")
    c.execute("UPDATE alembic_version SET version_num = 'older'")
    c.commit()
    c.close()
    third = dagster_storage.EngineKeepingSqliteEventLogStorage(str(base))
    assert [e.user_message for e in third.get_logs_for_run("r4")] == ["a new run"]
    assert initdb_calls == ["r4.db"]
    for s in (ours, plain, ui, again, third):
        s.dispose()


def _killed_at(name: str, base: Path, run: str) -> None:
    """A child process storing ``run``'s first event, killed (SIGKILL) at its first ``os.<name>``."""
    pid = os.fork()
    if pid == 0:  # the child
        try:
            setattr(os, name, lambda *a, **kw: os.kill(os.getpid(), signal.SIGKILL))
            dagster_storage.EngineKeepingSqliteEventLogStorage(str(base)).store_event(entry(run, "lost"))
        finally:
            os._exit(3)  # not killed: the test fails below
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def test_a_process_killed_while_making_a_run_database_leaves_the_storage_whole(tmp_path, initdb_calls):
    base = tmp_path / "runs"
    dagster_storage.EngineKeepingSqliteEventLogStorage(str(base)).dispose()  # the index, made
    # killed as the template was to be named: no template, no run database
    _killed_at("replace", base, "r1")
    assert not [p for p in base.iterdir() if p.name.startswith(".aip-run-database-") and p.suffix == ".sqlite"]
    assert not (base / "r1.db").exists()
    # killed as the run's database was to be named: the template whole, the run's database not there
    ours = dagster_storage.EngineKeepingSqliteEventLogStorage(str(base))
    ours.store_event(entry("r0", "made the template"))
    _killed_at("link", base, "r1")
    assert not (base / "r1.db").exists()
    assert list(base.glob("r1.db.*.tmp"))  # the copy never named is all that is left
    # the storage goes on: Dagster's plain storage and ours store and read the run
    ui = SqliteEventLogStorage(str(base))
    assert sorted(ui.get_all_run_ids()) == ["r0"]
    later = dagster_storage.EngineKeepingSqliteEventLogStorage(str(base))
    later.store_event(entry("r1", "stored"))
    assert [e.user_message for e in ui.get_logs_for_run("r1")] == ["stored"]
    assert [e.user_message for e in ours.get_logs_for_run("r0")] == ["made the template"]
    for s in (ours, ui, later):
        s.dispose()


def test_tables_and_columns_found_are_remembered_and_missing_ones_asked_again(tmp_path, monkeypatch):
    store = dagster_storage.EngineKeepingSqliteEventLogStorage(str(tmp_path / "runs"))
    asked: list[str] = []
    real = SqliteEventLogStorage.has_table
    monkeypatch.setattr(SqliteEventLogStorage, "has_table", lambda self, t: asked.append(t) or real(self, t))
    for _ in range(3):
        assert store.has_table("asset_check_executions")
        assert not store.has_table("no_such_table")
    assert asked == ["asset_check_executions", "no_such_table", "no_such_table", "no_such_table"]
    with store.index_connection() as conn:
        for _ in range(2):
            assert store._has_asset_key_col_on_connection(conn, "last_materialization_timestamp")
            assert not store._has_asset_key_col_on_connection(conn, "no_such_column")
    assert store._found == {"table asset_check_executions", "asset_keys column last_materialization_timestamp"}
    store.dispose()
    dagster_storage.ANCHORS.release()


def test_a_kept_connection_follows_its_file_and_its_process(tmp_path, monkeypatch):
    """The connection kept between statements writes to the file at its path, in the process that
    opened it: a run's file removed (Dagster's wipe) is opened again by its name; a forked child
    opens its own (the parent's kept connections are closed before the fork) and both processes'
    events are stored; one seen from another process id is set aside, never used or closed."""
    import subprocess
    import sys

    base = tmp_path / "runs"
    store = dagster_storage.EngineKeepingSqliteEventLogStorage(str(base))
    store.store_event(entry("r1", "one"))
    store.wipe()  # removes the runs' files: the next write makes r1's again, not the removed one's
    store.store_event(entry("r1", "after the wipe"))
    plain = SqliteEventLogStorage(str(base))
    assert [e.user_message for e in plain.get_logs_for_run("r1")] == ["after the wipe"]
    pid = os.fork()
    if pid == 0:  # the child
        code = 1
        try:
            store.store_event(entry("r1", "the child's"))
            store.store_event(entry("r2", "the child's own run"))
            code = 0 if not dagster_storage._INHERITED else 2
        finally:
            os._exit(code)
    assert os.waitpid(pid, 0)[1] == 0
    store.store_event(entry("r1", "the parent's again"))
    assert [e.user_message for e in plain.get_logs_for_run("r1")] == [
        "after the wipe",
        "the child's",
        "the parent's again",
    ]
    assert [e.user_message for e in plain.get_logs_for_run("r2")] == ["the child's own run"]
    # a kept connection checked out under another process id: set aside, a new one opened
    real = os.getpid()
    monkeypatch.setattr(os, "getpid", lambda: real + 1)
    store.store_event(entry("r1", "under another pid"))
    monkeypatch.setattr(os, "getpid", lambda: real)
    assert len(dagster_storage._INHERITED) >= 1
    dagster_storage._INHERITED.clear()
    assert plain.get_logs_for_run("r1")[-1].user_message == "under another pid"
    for db in (base / "r1.db", base / "r2.db"):
        c = sqlite3.connect(db)
        assert c.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        c.close()
    store.dispose()
    plain.dispose()
    dagster_storage.ANCHORS.release()
    # a process that ends closes its kept connections before its anchors: the log checkpointed away
    code = (
        "import logging, time\n"
        "from aip_assets import dagster_storage\n"
        "from dagster._core.events.log import EventLogEntry\n"
        f"s = dagster_storage.EngineKeepingSqliteEventLogStorage({str(base)!r})\n"
        "s.store_event(EventLogEntry(error_info=None, level=logging.INFO, user_message='x', run_id='r3',"
        " timestamp=time.time(), step_key=None, job_name=None, dagster_event=None))\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ), timeout=300)
    assert (base / "r3.db").exists() and not (base / "r3.db-wal").exists()
