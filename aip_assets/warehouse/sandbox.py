"""A user's query (``aip-eval sql``): a sandboxed, read-only connection, checked and time-bounded."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd

from ..errors import AipError
from . import lake
from .connection import connect
from .opening import _settings

# A user's query (`aip-eval sql`) gets a read-only connection that can touch nothing but the
# warehouse: no other file read or written, no network, no extension installed or loaded by a
# query, and its configuration locked. Whatever a later mode must load or attach (a lake's
# extensions) happens in ``setup``, before the lock.
SANDBOX = {
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "allow_community_extensions": False,
    "allow_unsigned_extensions": False,
}


@contextmanager
def sandboxed(path: str | Path | None = None, setup: Iterable[str] = ()) -> Iterator[duckdb.DuckDBPyConnection]:
    if lake.enabled():  # the lake attached read-only; files: only its data folder's
        import shutil
        import tempfile

        spill = tempfile.mkdtemp(prefix="aip-sql-")  # DuckDB allows its temp folder too: an empty one of its own
        con = lake.open_lake(read_only=True, config={**_settings(None), **SANDBOX})  # AIP_DUCKDB_MEMORY, as a file's
        try:
            for stmt in setup:
                con.execute(stmt)
            con.execute(f"SET temp_directory = {lake._quote(spill)}")
            con.execute(f"SET allowed_directories = [{lake._quote(lake.data_path() or '')}]")
            con.execute("SET enable_external_access = false")
            con.execute("SET lock_configuration = true")
            yield con
        finally:
            con.close()
            shutil.rmtree(spill, ignore_errors=True)
        return
    with connect(path, read_only=True, config=SANDBOX) as con:
        for stmt in setup:
            con.execute(stmt)
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
        yield con


FETCH_VECTORS = 100  # a user's result is fetched this many DuckDB vectors (2,048 rows each) at a time
INTERRUPT_EVERY_S = 0.05  # past its timeout, a query is interrupted again this often until it has stopped


class QueryStopped(AipError):
    """A user's query ran past its timeout and was interrupted; nothing of its result is kept."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        super().__init__(f"stopped after {seconds:g} s")


def run_bounded(
    con: duckdb.DuckDBPyConnection, sql: str, timeout_s: float, keep: int | None = None
) -> tuple[pd.DataFrame, int]:
    """A user's query (``check_query`` first) on ``con``, stopped once it has run ``timeout_s``
    seconds (0: no limit): (its first ``keep`` rows, or every row with None; how many rows it has).

    A timer thread interrupts the connection (``con.interrupt()``) at the timeout, and again every
    INTERRUPT_EVERY_S until the query has stopped: DuckDB forgets an interrupt that comes before a
    statement starts. The result is fetched in chunks, not with one ``.df()``, which holds the GIL
    while it converts (the timer could not run) and finishes a conversion it was interrupted in.
    Raises QueryStopped, the connection idle again, when the timer fired before the last row came.
    """
    done, lock, fired = threading.Event(), threading.Lock(), threading.Event()

    def watch() -> None:
        if done.wait(timeout_s):
            return
        while True:
            with lock:  # never after the body ended: the connection may be closing
                if done.is_set():
                    return
                fired.set()
                con.interrupt()
            if done.wait(INTERRUPT_EVERY_S):
                return

    timer = threading.Thread(target=watch, name="aip-sql-timeout", daemon=True) if timeout_s > 0 else None
    if timer is not None:
        timer.start()
    try:
        try:
            check_query(con, sql)
            con.execute(sql)
            parts: list[pd.DataFrame] = []
            kept = total = 0
            while True:
                chunk = con.fetch_df_chunk(FETCH_VECTORS)
                if not len(chunk):
                    if not parts:
                        parts.append(chunk)  # the columns, when there is no row
                    break
                total += len(chunk)
                if keep is None or kept < keep:
                    part = chunk if keep is None else chunk.head(keep - kept)
                    parts.append(part)
                    kept += len(part)
                if fired.is_set():
                    break
        except duckdb.InterruptException:
            if not fired.is_set():
                raise
        with lock:
            done.set()
            if fired.is_set():  # an interrupted fetch ends as if the rows were all there: they are not
                raise QueryStopped(timeout_s)
    finally:
        done.set()
        if timer is not None:
            timer.join()
    df = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
    return df, total


def check_query(con: duckdb.DuckDBPyConnection, sql: str) -> None:
    """Refuse (PermissionException) a user's query that is not a plain read: every statement a
    SELECT (DESCRIBE, SHOW, PRAGMA and FROM-first are SELECTs) or EXPLAIN. In a lake, which the
    sandbox must let reach Postgres and its data folder, only SELECTs, and none that calls the
    postgres extension's functions or names the lake's catalog database (the rest of the shared
    state would be readable through them)."""
    allowed = {duckdb.StatementType.SELECT} | (set() if lake.enabled() else {duckdb.StatementType.EXPLAIN})
    for st in con.extract_statements(sql):
        if st.type not in allowed:
            raise duckdb.PermissionException(f"a {st.type.name} statement (only queries are run)")
    if not lake.enabled():
        return
    import json

    row = con.execute("SELECT json_serialize_sql(?)", [sql]).fetchone()
    ast = json.loads(row[0]) if row else {}
    if ast.get("error"):
        raise duckdb.PermissionException(f"a statement the check cannot read: {ast.get('error_message')}")
    # DuckLake's functions, also as the lake's own (``lake.merge_adjacent_files()``): their
    # maintenance writes and deletes files in the lake's folder
    lake_fns = {
        n.lower()
        for (n,) in con.execute(
            "SELECT DISTINCT function_name FROM duckdb_functions() WHERE function_name LIKE 'ducklake%'"
        ).fetchall()
    }
    lake_fns |= {n.removeprefix("ducklake_") for n in lake_fns}

    def refuse_call(node: dict) -> None:
        name = str(node.get("function_name") or "").lower()
        qualified = bool(node.get("catalog") or node.get("schema"))
        if name.startswith("postgres") or name in RUNS_SQL or name in SECRET_FNS or name in lake_fns or qualified:
            raise duckdb.PermissionException(
                f"{node.get('function_name')}() reaches beyond the warehouse (the "
                "shared-state database, the lake's files or credentials, or SQL it "
                "runs itself)"
            )

    def nodes(node: Any) -> Iterator[dict]:
        if isinstance(node, dict):
            yield node
            for v in node.values():
                yield from nodes(v)
        elif isinstance(node, list):
            for v in node:
                yield from nodes(v)

    def plain(arg: dict) -> bool:
        """A value written in the query: a constant, a named parameter set to one, a list of them."""
        if arg.get("class") == "CONSTANT":
            return True
        if arg.get("class") == "COMPARISON" and (arg.get("left") or {}).get("class") == "COLUMN_REF":
            return plain(arg.get("right") or {})
        if arg.get("class") == "FUNCTION" and arg.get("function_name") == "list_value":
            return all(plain(c) for c in arg.get("children") or [])
        return False

    for node in nodes(ast):
        if "function_name" in node:
            refuse_call(node)
        for k in ("catalog_name", "catalog", "schema_name", "schema"):
            v = node.get(k)
            if isinstance(v, str) and v.lower().startswith("__ducklake"):
                raise duckdb.PermissionException(f"{v} is the lake's catalog, not the warehouse")
        # the lake's folder is the only one files may be read from, and DuckDB compares a path
        # with it as written: a path must be written out (a table function's arguments are plain
        # values, not expressions that build one) and hold no '.' or '..' segment (S3 resolves
        # them after the check, into another prefix or bucket)
        if node.get("type") == "TABLE_FUNCTION":
            fn = node.get("function") or {}
            if not all(plain(c) for c in fn.get("children") or []):
                raise duckdb.PermissionException(
                    f"{fn.get('function_name')}(): in a lake, a table function's "
                    "arguments must be plain values (no expression or subquery)"
                )
        for v in (
            node.get("table_name"),
            (node.get("value") or {}).get("value") if isinstance(node.get("value"), dict) else None,
        ):
            if isinstance(v, str) and "/" in v and DOT_SEGMENT.search(v):
                raise duckdb.PermissionException(f"{v!r}: a path with a '.' or '..' segment")


# table functions that run SQL given as text (the check cannot see inside it)
RUNS_SQL = {"query", "query_table", "json_execute_serialized_sql"}
# a lake on S3: its credentials stay out of reach (httpfs also copies the AWS variables into its
# s3_* settings, which lake._s3_secret empties)
SECRET_FNS = {"duckdb_secrets", "which_secret"}
DOT_SEGMENT = re.compile(r"(^|[/\\])\.{1,2}([/\\]|$)")
