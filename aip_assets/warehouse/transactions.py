"""One transaction of the warehouse, run again where a lake's commit lost to another worker's."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

import duckdb

from . import lake

logger = logging.getLogger("aip_assets")
T = TypeVar("T")
LAKE_WRITE_TRIES = 30  # a DuckLake transaction that lost to other workers' this many times in a row fails
LAKE_STATS = {"commits": 0, "conflicts": 0}  # this process's lake transactions, and the conflicts they met


def transaction(
    con: duckdb.DuckDBPyConnection,
    body: Callable[[duckdb.DuckDBPyConnection], T],
    what: str,
    again_after_outage: bool = True,
) -> T:
    """``body(con)`` in one transaction. In a lake, a commit that lost to another worker's (DuckLake
    rolls it back whole) is run again after a short random pause, growing with each try; the
    counts are in ``LAKE_STATS``. One that met the catalog's database away (a restart) is run
    again once it answers (``lake.patiently``), unless ``again_after_outage`` is False: a commit
    whose acknowledgement alone was lost would then land twice, which a partition write (it
    replaces its rows) and registering a run (its check finds the run) are safe against, and an
    append is not. Any other failure rolls back and is raised."""
    if lake.enabled() and again_after_outage:
        return lake.patiently(f"writing {what}", lambda: _transaction(con, body, what, True))
    return _transaction(con, body, what, lake.enabled())


def _transaction(
    con: duckdb.DuckDBPyConnection, body: Callable[[duckdb.DuckDBPyConnection], T], what: str, in_lake: bool
) -> T:
    for attempt in range(LAKE_WRITE_TRIES):
        con.execute("BEGIN TRANSACTION")
        try:
            out = body(con)
            con.execute("COMMIT")
        except BaseException as e:
            _rollback(con)
            if not (in_lake and lake.is_conflict(e)):
                raise
            LAKE_STATS["conflicts"] += 1
            if attempt == LAKE_WRITE_TRIES - 1:
                from ..errors import AipError

                raise AipError(
                    f"{lake.where()}: writing {what} lost to other workers' writes {LAKE_WRITE_TRIES} "
                    f"times in a row; nothing was written: {str(e).splitlines()[0]}"
                ) from None
            pause = random.uniform(0.01, 0.05) * (attempt + 1)
            logger.info(
                f"writing {what}: another worker committed to the same table first; "
                f"trying again in {pause:.2f}s ({attempt + 1})"
            )
            time.sleep(pause)
            continue
        if in_lake:
            LAKE_STATS["commits"] += 1
        return out
    raise AssertionError("unreachable")


def _rollback(con: duckdb.DuckDBPyConnection) -> None:
    try:
        con.execute("ROLLBACK")
    except duckdb.Error:  # the transaction is gone already; the error that led here is the one to raise
        pass
