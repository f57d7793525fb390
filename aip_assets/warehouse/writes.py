"""Replace-a-partition writes, partition reads, and the memory caps they run at."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import duckdb
import pandas as pd

from .. import settings as aip_settings
from .connection import _sessions, connect
from .opening import default_path
from .tables import STAGE_SCOPED, TABLES
from .transactions import transaction

logger = logging.getLogger("aip_assets")


def release_memory() -> None:
    """Give the memory this process has freed back to the system. glibc keeps freed heap pages for
    reuse by this process's ``malloc``, and pyarrow's default pool (mimalloc) keeps its own; DuckDB
    allocates with yet another allocator, so without this a stage's freed batches and DuckDB's write
    buffers add up in the process's peak. Arrow is therefore switched to the system allocator,
    whose free pages ``malloc_trim`` returns (under a millisecond here; no ``gc.collect()``, which
    costs 150 ms in a process holding Dagster's objects, and a stage's batches hold no cycles)."""
    import ctypes

    import pyarrow as pa

    if pa.default_memory_pool().backend_name != "system":
        pa.set_memory_pool(pa.system_memory_pool())
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to trim
        pass


# A partition write holds each DuckDB thread's new row groups in memory until they fill: one
# thread, and a lean memory cap past which DuckDB writes them out to the file early. Measured
# (2,162,570 probes, 1.4 GB on disk, in one transaction): peak RSS 605 MiB at 256MB, 818 MiB at
# 512MB, 1,028 MiB at 1GB with 865,028. A write that needs more is retried once at AIP_DUCKDB_MEMORY.
# A stage's batch reads (read_partition with ids) run at the same lean cap.
WRITE_THREADS = 1
# The lean cap is AIP_DUCKDB_WRITE_MEMORY (settings.py: 256MB unless set).


def _bytes(size: str) -> float | None:
    """A DuckDB memory size ("256MB", "1GB", "4GiB", "500 KB") in bytes; None when unreadable."""
    m = re.fullmatch(r"\s*([\d.]+)\s*([KMGT]?)(I?B)?\s*", size.upper())
    if not m:
        return None
    unit = 1024 if m.group(3) == "IB" else 1000
    return float(m.group(1)) * unit ** " KMGT".index(m.group(2) or " ")


def write_caps() -> list[str | None]:
    """The memory caps a partition write tries, in order: the lean ``AIP_DUCKDB_WRITE_MEMORY``, then
    the general ``AIP_DUCKDB_MEMORY`` (None: no cap, when it is empty). A general cap at or below the
    lean one is the only one tried."""
    settings = aip_settings.current()
    full = settings.duckdb_memory or None
    lean = settings.duckdb_write_memory
    lf = _bytes(lean)
    if full is not None and lf is not None and (_bytes(full) or float("inf")) <= lf:
        return [full]
    return [lean, full] if lean != full else [full]


T = TypeVar("T")


def lean_first(fn: Callable[[dict[str, Any] | None], T]) -> T:
    """``fn(config)`` at the lean memory cap, and again at the full one if DuckDB runs out there:
    for reads that scan a whole partition (a report, a table's preview), whose scans would
    otherwise fill DuckDB's cache to its limit (1.2 GB for a 100,000-row decision flip's
    judgements preview; 490 MB at the lean cap, 6.7 s instead of 2.7 s)."""
    caps = write_caps()
    for i, cap in enumerate(caps):
        try:
            return fn({"memory_limit": cap} if cap else None)
        except duckdb.OutOfMemoryException:
            if i == len(caps) - 1:
                raise
            logger.info(f"a read needed more than {cap}: read again at {caps[i + 1] or 'no cap'}")
    raise AssertionError("unreachable: write_caps() is never empty")


def write_partition_files(
    run_id: str,
    metric: str,
    files: dict[str, list[Path]],
    stage: str | None = None,
    path: str | Path | None = None,
    guard: Callable[[], None] | None = None,
) -> None:
    """Replace this partition's rows in each table with the rows of its staged Parquet files,
    all in one transaction; DuckDB reads the files itself, so Python never holds the partition.
    The transaction holds new rows in memory until they fill row groups, per DuckDB thread: the
    write uses one, at the lean cap first (see :func:`write_caps`). ``guard``: called at the start
    of each try of the transaction (a retry after a conflict or an outage too); what it raises
    rolls the write back (the partition's lease no longer this worker's: ``leases.Lease.check``)."""
    if str(Path(path or default_path()).resolve()) in _sessions():
        raise RuntimeError(f"{path or default_path()}: a partition write inside a session of the same warehouse")
    release_memory()
    caps = write_caps()
    for i, cap in enumerate(caps):
        final = i == len(caps) - 1
        config: dict[str, Any] = {"threads": WRITE_THREADS, **({"memory_limit": cap} if cap else {})}
        try:
            _write_files(run_id, metric, files, stage, path, config, final, guard)
            return
        except duckdb.OutOfMemoryException:
            if final:
                raise
            logger.info(
                f"writing {run_id} × {metric} needed more than {cap}: written again at {caps[i + 1] or 'no cap'}"
            )
            release_memory()


def _write_files(
    run_id: str,
    metric: str,
    files: dict[str, list[Path]],
    stage: str | None,
    path: str | Path | None,
    config: dict[str, Any],
    final: bool,
    guard: Callable[[], None] | None = None,
) -> None:
    def replace(con: duckdb.DuckDBPyConnection) -> None:
        if guard is not None:
            guard()
        for table, paths in files.items():
            cols = ", ".join(c for c, _ in TABLES[table])
            if table in STAGE_SCOPED:
                con.execute(
                    f"DELETE FROM {table} WHERE run_id = ? AND metric = ? AND stage = ?", [run_id, metric, stage]
                )
            else:
                con.execute(f"DELETE FROM {table} WHERE run_id = ? AND metric = ?", [run_id, metric])
            if paths:
                con.execute(
                    f"INSERT INTO {table} ({cols}) SELECT {cols} FROM read_parquet(?)", [[str(p) for p in paths]]
                )

    with connect(path, config=config) as con:
        try:
            transaction(con, replace, f"{run_id} × {metric}")
        except duckdb.OutOfMemoryException as e:
            if not final:
                raise  # tried again at the next cap by the caller
            from ..errors import AipError

            raise AipError(
                f"{path or default_path()}: DuckDB ran out of memory writing {run_id} × {metric} "
                f"(limit {config.get('memory_limit') or 'none'}); nothing was written — set "
                f"AIP_DUCKDB_MEMORY higher, e.g. 4GB, and materialise again: {e}"
            ) from None


def read_partition(
    table: str,
    run_id: str,
    metric: str,
    path: str | Path | None = None,
    order_by: str | None = None,
    ids: list[str] | None = None,
    columns: list[str] | None = None,
) -> pd.DataFrame:
    """This partition's rows of ``table`` (only rows of ``ids`` when given); NULL stays None.
    A batch's read (``ids``) runs at the lean cap: DuckDB otherwise keeps the blocks it scanned
    cached up to its limit (a 100,000-row decision flip's batch reads rose to 1.5 GB)."""
    lean = write_caps()[0]
    with connect(path, config={"memory_limit": lean} if ids is not None and lean else None) as con:
        sql = f"SELECT {', '.join(columns) if columns else '*'} FROM {table} WHERE run_id = ? AND metric = ?"
        params: list[Any] = [run_id, metric]
        if ids is not None:
            sql += " AND input_id IN (SELECT unnest(?::VARCHAR[]))"
            params.append(list(ids))
        if order_by:
            sql += f" ORDER BY {order_by}"
        df = con.execute(sql, params).df()
    return df.astype(object).where(df.notna(), None)  # SQL NULL stays None, never NaN


def status_counts(con: duckdb.DuckDBPyConnection, table: str, run_id: str, metric: str) -> dict[str, int]:
    """{status: rows} of one partition of ``table`` (a NULL status counts as ok)."""
    rows = con.execute(
        f"SELECT coalesce(status, 'ok'), count(*) FROM {table} WHERE run_id = ? AND metric = ? GROUP BY ALL",
        [run_id, metric],
    ).fetchall()
    return {str(k): int(n) for k, n in rows}


def insert_frame(con: duckdb.DuckDBPyConnection, table: str, frame: pd.DataFrame) -> None:
    """Insert ``frame``'s rows into ``table`` by column name (never by position), on ``con`` (inside the
    caller's transaction); an empty frame inserts nothing."""
    if not len(frame):
        return
    cols = ", ".join(frame.columns)
    con.register("_incoming", frame)
    try:
        con.execute(f"INSERT INTO {table} ({cols}) SELECT {cols} FROM _incoming")
    finally:
        con.unregister("_incoming")


def query(sql: str, params: list | None = None, path: str | Path | None = None, read_only: bool = True) -> pd.DataFrame:
    with connect(path, read_only=read_only) as con:
        return con.execute(sql, params or []).df()
