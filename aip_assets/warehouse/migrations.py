"""Moving a local warehouse file's runs into the lake (``aip-eval migrate``)."""

from __future__ import annotations

from pathlib import Path

import duckdb

from . import lake
from .connection import connect
from .opening import _file_lock
from .tables import TABLES
from .transactions import transaction


def migrate_into_lake(source: str | Path) -> dict[str, int]:
    """Copy a local warehouse file's runs into the lake (shared mode): every run the lake does not
    have yet. Under the lock on registering runs: first the runs' calls from the file's journal
    into the lake's (replacing any of theirs there: a migrate stopped before its commit, run
    again), so a stage resumed in the lake answers them instead of calling again; then their rows
    in every table, in one transaction. A run already in the lake is left as it is, so migrating
    again copies nothing twice. A column the file lacks (an older version's file) is NULL.
    Returns {table: rows copied, "runs": n, "journaled calls": n}. The files are read under the
    warehouse's lock, never changed."""
    from ..errors import AipError
    from ..models.journal import journal_path
    from ..models.journal_pg import PgJournal, copy_runs
    from ..shared_state import shared_state_url

    if not lake.enabled():
        raise AipError(
            f"aip-eval migrate copies a local warehouse into the lake: set {lake.LAKE_ENV} "
            "(and AIP_SHARED_STATE_URL, the lake's catalog) first"
        )
    src = Path(source).resolve()
    if not src.exists():
        raise AipError(f"{src}: no such warehouse file to migrate")
    copied: dict[str, int] = {}
    with _file_lock(src), connect(create=True) as con, lake.registration_lock():
        con.execute(f"ATTACH {lake._quote(str(src))} AS aip_src (READ_ONLY)")
        try:
            have = {
                t
                for (t,) in con.execute(
                    "SELECT table_name FROM duckdb_tables() WHERE database_name = 'aip_src'"
                ).fetchall()
            }
            if "eval_runs" not in have:
                raise AipError(f"{src}: not a warehouse (no eval_runs table)")
            # nobody registers meanwhile (the lock): the runs the lake lacks stay the same until the commit
            runs = [
                r
                for (r,) in con.execute(
                    "SELECT run_id FROM aip_src.eval_runs WHERE run_id NOT IN "
                    f"(SELECT run_id FROM {lake.ALIAS}.eval_runs) ORDER BY run_id"
                ).fetchall()
            ]
            journal = PgJournal(shared_state_url() or "")
            try:
                calls = copy_runs(journal_path(src), journal, runs)
            finally:
                journal.close()

            def copy(c: duckdb.DuckDBPyConnection) -> None:
                copied.clear()
                for table, cols in TABLES.items():
                    if table not in have or not runs:
                        continue
                    there = {
                        r[0]
                        for r in c.execute(
                            "SELECT column_name FROM duckdb_columns() WHERE database_name = "
                            "'aip_src' AND table_name = ?",
                            [table],
                        ).fetchall()
                    }
                    names = [col for col, _ in cols]
                    picks = ", ".join(col if col in there else f"NULL AS {col}" for col in names)
                    c.execute(
                        f"INSERT INTO {lake.ALIAS}.{table} ({', '.join(names)}) SELECT {picks} "
                        f"FROM aip_src.{table} WHERE run_id IN (SELECT unnest(?::VARCHAR[]))",
                        [runs],
                    )
                    n = c.execute(
                        f"SELECT count(*) FROM aip_src.{table} WHERE run_id IN (SELECT unnest(?::VARCHAR[]))", [runs]
                    ).fetchone()
                    copied[table] = int(n[0]) if n else 0

            transaction(con, copy, f"the runs of {src}", again_after_outage=False)  # appends: never twice
        finally:
            con.execute("DETACH aip_src")
    copied["runs"] = len(runs)
    copied["journaled calls"] = calls
    return copied
