"""Making the warehouse's schema: its tables (``tables``) and views (``core_views``), and what orders them.

:func:`ensure_schema` creates what is missing and adds the columns a newer version introduced (the
warehouse's migration, run once per process and file); ``SCHEMA_LEVEL`` orders the schemas of a lake.
"""

from __future__ import annotations

import logging

import duckdb

from . import lake
from .core_views import views
from .tables import LAKE_TABLES, TABLES
from .transactions import _transaction, transaction

logger = logging.getLogger("aip_assets")


def ensure_schema(con: duckdb.DuckDBPyConnection, in_lake: bool = False) -> None:
    """Create missing tables, add columns a newer version introduced, refresh the views. In a lake
    (which has no PRIMARY KEY: ``register_run`` checks a run id is new) all of it is one
    transaction, run again if another worker's made the same at the same moment."""
    every_view = views()

    def make(c: duckdb.DuckDBPyConnection) -> None:
        for table, cols in {**TABLES, **(LAKE_TABLES if in_lake else {})}.items():
            cols = [(col, t.replace(" PRIMARY KEY", "") if in_lake else t) for col, t in cols]
            c.execute(f"CREATE TABLE IF NOT EXISTS {table} ({', '.join(f'{col} {t}' for col, t in cols)})")
            for col, t in cols:
                c.execute(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {col} {t.replace(' PRIMARY KEY', '')}")
        for name, sql in every_view.items():
            c.execute(f"CREATE OR REPLACE VIEW {name} AS {sql}")

    if not in_lake:
        _make_local(con, every_view)
        return
    # in a lake every DDL statement is a snapshot in the catalog: made only when this version's
    # tables and views are not there yet (their hash, in aip_schema)
    import hashlib
    import json

    version = hashlib.sha256(json.dumps([TABLES, every_view, LAKE_TABLES], sort_keys=True).encode()).hexdigest()[:16]

    def current(c: duckdb.DuckDBPyConnection) -> bool:
        """Whether the lake's schema is this one, or a later one (an older worker in a rolling
        deploy must not put its views back)."""
        if not c.execute(
            "SELECT 1 FROM duckdb_tables() WHERE database_name = current_database() AND table_name = 'aip_schema'"
        ).fetchone():
            return False
        row = c.execute("SELECT level, version FROM aip_schema").fetchone()
        if row is None:
            return False
        if int(row[0]) > SCHEMA_LEVEL:
            logger.warning(
                f"{lake.where()}: its tables are of a later aip_assets (schema level {row[0]}; this "
                f"one's is {SCHEMA_LEVEL}): left as they are"
            )
            return True
        return int(row[0]) == SCHEMA_LEVEL and row[1] == version

    if current(con):
        return

    def make_marked(c: duckdb.DuckDBPyConnection) -> None:
        if current(c):  # another worker made them meanwhile
            return
        make(c)
        c.execute("CREATE TABLE IF NOT EXISTS aip_schema (level INTEGER, version VARCHAR)")
        c.execute("DELETE FROM aip_schema")
        c.execute("INSERT INTO aip_schema VALUES (?, ?)", [SCHEMA_LEVEL, version])

    transaction(con, make_marked, "the warehouse's tables")


def _make_local(con: duckdb.DuckDBPyConnection, every_view: dict[str, str]) -> None:
    """A warehouse file's schema (not a lake's): ``make``'s statements less those with nothing
    to do, in one transaction. The tables there and their columns are read first: a table not
    there is created, a column not there is added (a table just created, or holding every column,
    needs no ``ALTER``). Every view is made again, as always (DuckDB keeps a view's SQL
    reformatted, so whether it changed cannot be read back). Before: 345 statements (19 tables,
    300 columns, 26 views), each committed on its own, 0.105 s for a new file and 0.086 s for one
    already made; now 0.03 and 0.024 s, most of it the views (medians of 10, 2026-12-07, DuckDB 1.5)."""
    there = {
        name.lower()
        for (name,) in con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() "
            "AND schema_name = current_schema()"
        ).fetchall()
    }
    ours = [table for table in TABLES if table.lower() in there]
    have: dict[str, set[str]] = {table.lower(): set() for table in ours}
    if ours:  # their columns (duckdb_columns() would bind every view as well: 5x slower)
        for table, column in con.execute(
            " UNION ALL ".join(f"SELECT '{table}', name FROM pragma_table_info('{table}')" for table in ours)
        ).fetchall():
            have[table.lower()].add(column.lower())
    statements = []
    for table, cols in TABLES.items():
        columns = have.get(table.lower())
        if columns is None:
            statements.append(f"CREATE TABLE IF NOT EXISTS {table} ({', '.join(f'{col} {t}' for col, t in cols)})")
            continue
        statements += [
            f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {col} {t.replace(' PRIMARY KEY', '')}"
            for col, t in cols
            if col.lower() not in columns
        ]
    statements += [f"CREATE OR REPLACE VIEW {name} AS {sql}" for name, sql in every_view.items()]

    def run(c: duckdb.DuckDBPyConnection) -> None:
        for statement in statements:
            c.execute(statement)

    _transaction(con, run, "the warehouse's tables", in_lake=False)  # a file: no lake's retries


# Raised with every change to TABLES, the views or LAKE_TABLES: a lake made by a later level is never
# remade by an earlier one (workers of two versions during a rolling deploy)
SCHEMA_LEVEL = 8  # 4: human_labels, v_human_vs_judge, v_human_agreement; 5: judge_panel, v_judge_panel;
# 6: judge_exams, v_judge_exams; 7: persona_form, attributes and names of persona pools and probes;
# 8: regressions, v_spec_history
