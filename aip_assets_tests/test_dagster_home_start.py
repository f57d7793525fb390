"""Opening the project's Dagster instance (``dagster_home.get_instance``) quickly, with Dagster's own
storage: a new home's SQLite files are made in WAL mode (``_NewFilesQuickly``) and hold what
Dagster's own way makes; Dagster's migration scripts are read once per process
(``_keep_alembic_scripts``)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import yaml

from aip_assets import dagster_home
from aip_assets.dagster_home import get_instance


def tables_of(db: Path) -> tuple[list[tuple[str, str, str]], list[tuple]]:
    """A SQLite file's schema (type, name, SQL, sorted) and its alembic revision."""
    con = sqlite3.connect(db)
    try:
        schema = sorted(con.execute("SELECT type, name, coalesce(sql, '') FROM sqlite_master").fetchall())
        revision = con.execute("SELECT * FROM alembic_version").fetchall()
        return schema, revision
    finally:
        con.close()


def journal_mode(db: Path) -> str:
    con = sqlite3.connect(db)
    try:
        return con.execute("PRAGMA journal_mode").fetchone()[0]
    finally:
        con.close()


def test_a_new_home_is_made_in_wal_mode_with_what_dagsters_own_way_makes(tmp_path, monkeypatch):
    from dagster import DagsterInstance

    instance = get_instance()
    assert instance.get_runs() == []
    storage = Path(instance.root_directory) / "storage"
    ours = {p.relative_to(storage): p for p in storage.rglob("*.db")}
    assert sorted(map(str, ours)) == ["history/runs.db", "history/runs/index.db", "schedules/schedules.db"]
    # the same settings, opened by Dagster alone (no listener) in another folder
    plain_home = tmp_path / "plain"
    plain_home.mkdir()
    (plain_home / "dagster.yaml").write_text(dagster_home.instance_settings(plain_home))
    plain = DagsterInstance.from_config(str(plain_home))
    assert plain.get_runs() == []
    for rel, db in ours.items():
        assert journal_mode(db) == "wal"  # what Dagster sets just after making the tables
        assert tables_of(db) == tables_of(plain_home / "storage" / rel)
        assert journal_mode(plain_home / "storage" / rel) == "wal"
    plain.dispose()
    # a home already made is opened as it is: none of its files is taken for a new one
    instance.dispose()
    listeners = []
    real = dagster_home._NewFilesQuickly
    monkeypatch.setattr(dagster_home, "_NewFilesQuickly", lambda home: listeners.append(real(home)) or listeners[-1])
    again = get_instance()
    assert again.get_runs() == []
    assert len(listeners) == 1 and listeners[0].new == set() and listeners[0].old
    assert {rel: tables_of(db) for rel, db in ours.items()} == {
        rel: tables_of(plain_home / "storage" / rel) for rel in ours
    }
    again.dispose()


def test_the_listener_touches_only_new_files_of_its_home(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    listener = dagster_home._NewFilesQuickly(home)
    old = home / "old.db"
    sqlite3.connect(old).execute("CREATE TABLE t (a)").connection.commit()
    outside = tmp_path / "outside.db"
    for db in (home / "new.db", old, outside):
        con = sqlite3.connect(db)
        listener(con, None)
        listener(con, None)  # a second connection to the same file: the same decision
        con.close()
    assert journal_mode(home / "new.db") == "wal"
    assert journal_mode(old) == "delete" and journal_mode(outside) == "delete"
    assert listener.new == {str(home / "new.db")} and listener.old == {str(old)}


def test_a_users_dagster_home_is_left_to_its_own_settings(tmp_path, monkeypatch):
    home = tmp_path / "users_home"
    home.mkdir()
    storage = tmp_path / "users_storage"
    (home / "dagster.yaml").write_text(yaml.safe_dump({"storage": {"sqlite": {"base_dir": str(storage)}}}))
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    made = []
    monkeypatch.setattr(dagster_home, "_NewFilesQuickly", lambda *a: made.append(a) or (lambda *_: None))
    get_instance().dispose()
    assert made == []  # no listener: Dagster's way, whatever the user's settings name


def test_dagsters_migration_scripts_are_read_once_and_other_locations_as_alembic_does(tmp_path):
    from alembic.config import Config
    from alembic.script import ScriptDirectory
    from dagster._core.storage import sql as dagster_sql

    get_instance()
    kept = dagster_sql.ScriptDirectory
    assert issubclass(kept, ScriptDirectory)
    config = dagster_sql.get_alembic_config(dagster_sql.__file__)
    one = kept.from_config(config)
    assert kept.from_config(config) is one
    assert one.as_revision_number("head") == ScriptDirectory.from_config(config).as_revision_number("head")
    other = Config()
    other.set_main_option("script_location", str(tmp_path / "elsewhere"))
    (tmp_path / "elsewhere" / "versions").mkdir(parents=True)
    assert kept.from_config(other) is not kept.from_config(other)  # not kept: read each time
