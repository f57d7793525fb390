"""A warehouse file's schema (``warehouse.schema.ensure_schema``, not a lake's): made whole in a new
file, left as it is in a current one, and brought up to date in one made by an earlier version (a
table missing, a column missing, the views of another version), in one transaction."""

from __future__ import annotations

import duckdb
import pytest

from aip_assets.warehouse.core_views import views
from aip_assets.warehouse.schema import ensure_schema
from aip_assets.warehouse.tables import TABLES


def catalog(con: duckdb.DuckDBPyConnection) -> tuple[dict[str, list[tuple[str, str]]], list[str]]:
    """Each table's columns (name, type) in order, and the views' names."""
    tables = {
        t: [(r[1], r[2]) for r in con.execute(f"PRAGMA table_info('{t}')").fetchall()]
        for (t,) in con.execute("SELECT table_name FROM duckdb_tables() ORDER BY table_name").fetchall()
    }
    names = [v for (v,) in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal ORDER BY 1").fetchall()]
    return tables, names


def test_a_new_file_gets_every_table_column_and_view_and_a_current_one_is_left_as_it_is(tmp_path):
    con = duckdb.connect(str(tmp_path / "w.duckdb"))
    ensure_schema(con)
    tables, names = catalog(con)
    assert sorted(tables) == sorted(TABLES)
    for table, cols in TABLES.items():
        assert [c for c, _ in tables[table]] == [c for c, _ in cols]
    assert names == sorted(views())
    con.execute("INSERT INTO eval_runs (run_id) VALUES ('r1')")
    ensure_schema(con)  # again: nothing lost, nothing added
    assert catalog(con) == (tables, names)
    assert con.execute("SELECT run_id FROM eval_runs").fetchall() == [("r1",)]


def test_a_file_of_an_earlier_version_gets_the_missing_table_columns_and_views(tmp_path):
    con = duckdb.connect(str(tmp_path / "w.duckdb"))
    ensure_schema(con)
    want = catalog(con)
    table, (col, _) = "eval_runs", TABLES["eval_runs"][-1]
    for (v,) in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall():
        con.execute(f"DROP VIEW {v}")
    con.execute("INSERT INTO eval_runs (run_id) VALUES ('r1')")
    con.execute(f"ALTER TABLE {table} DROP COLUMN {col}")
    con.execute("DROP TABLE regressions")
    con.execute("CREATE VIEW v_run_summary AS SELECT 1 AS old")  # another version's view of that name
    ensure_schema(con)
    assert catalog(con) == want
    assert con.execute(f"SELECT run_id, {col} FROM {table}").fetchall() == [("r1", None)]
    assert "old" not in [d[0] for d in con.execute("SELECT * FROM v_run_summary LIMIT 0").description]


def test_a_failing_statement_leaves_the_file_as_it_was(tmp_path, monkeypatch):
    from aip_assets.warehouse import schema

    con = duckdb.connect(str(tmp_path / "w.duckdb"))
    monkeypatch.setitem(schema.TABLES, "broken", [("x", "NO_SUCH_TYPE")])
    with pytest.raises(duckdb.Error):
        ensure_schema(con)
    assert catalog(con) == ({}, [])  # one transaction: none of it made
    monkeypatch.delitem(schema.TABLES, "broken")
    ensure_schema(con)  # and the connection is usable afterwards
    assert sorted(catalog(con)[0]) == sorted(TABLES)
