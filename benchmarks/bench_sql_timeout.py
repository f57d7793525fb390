"""How promptly `aip-eval sql --timeout` stops a query, and lets go of the warehouse.

For each query shape (a recursive CTE with no end, a count over a three-way cross join, the rows
of that cross join fetched, a sort of 15 million rows fetched), in this process, on a warehouse
file made here, with the timeout ``--timeout`` (default 1 s):

- ``bounded``: ``warehouse.run_bounded`` in ``warehouse.sandboxed`` (what `aip-eval sql` runs):
  the overshoot (return − timeout: the timer's lateness plus the time from the interrupt to the
  return), and the time from the return to the connection closed and the lock let go (another
  process may then write);
- ``df``: the same query fetched with one ``.df()``, a timer thread calling ``con.interrupt()`` at
  the timeout (what a plain timer would give): when the timer could run (the GIL is held while
  ``.df()`` converts) and when the call returned, or that it returned the rows anyway.

    python benchmarks/bench_sql_timeout.py [--timeout 1] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from _common import run_header  # noqa: E402

QUERIES = {
    "recursive CTE, count": "WITH RECURSIVE t(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM t) SELECT count(*) FROM t",
    "cross join ×3, count": "SELECT count(*) FROM range(100000) a, range(100000) b, range(100000) c",
    "cross join ×3, rows": "SELECT * FROM range(100000) a, range(100000) b, range(100000) c",
    "15M rows sorted, rows": "SELECT i, 'x' || i::VARCHAR AS s FROM range(15000000) t(i) ORDER BY s DESC",
}


def bounded(sql: str, timeout: float, db: Path) -> dict:
    from aip_assets import warehouse as wh

    stopped = None
    try:
        with wh.sandboxed(db) as con:
            t0 = time.monotonic()
            try:
                wh.run_bounded(con, sql, timeout)
            except wh.QueryStopped:
                stopped = time.monotonic()
                raise
    except wh.QueryStopped:
        pass
    released = time.monotonic()
    assert stopped is not None, "the query was not stopped"
    return {"overshoot_s": stopped - t0 - timeout, "release_s": released - stopped}


def plain_df(sql: str, timeout: float) -> dict:
    import duckdb

    con = duckdb.connect(config={"memory_limit": "1GB"})
    fired: dict[str, float] = {}

    def stop() -> None:
        fired["t"] = time.monotonic()
        con.interrupt()

    t0 = time.monotonic()
    timer = threading.Timer(timeout, stop)
    timer.start()
    try:
        n = len(con.execute(sql).df())
        outcome = f"returned {n} rows"
    except duckdb.InterruptException:
        outcome = "interrupted"
    end = time.monotonic()
    timer.cancel()
    con.close()
    return {
        "timer_late_s": fired.get("t", float("nan")) - t0 - timeout,
        "overshoot_s": end - t0 - timeout,
        "outcome": outcome,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--timeout", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    import duckdb

    folder = Path(tempfile.mkdtemp(prefix="bench-sql-"))
    db = folder / "warehouse.duckdb"
    duckdb.connect(str(db)).close()
    os.environ["AIP_WAREHOUSE"] = str(db)
    run_header()
    print(f"`aip-eval sql --timeout {args.timeout:g}`, duckdb {duckdb.__version__}, {args.repeat} tries each\n")
    print(
        "| query | bounded: overshoot (s) | bounded: close + unlock (s) | .df(): timer late (s) | "
        ".df(): overshoot (s) | .df(): outcome |"
    )
    print("|---|---|---|---|---|---|")
    for name, sql in QUERIES.items():
        b = [bounded(sql, args.timeout, db) for _ in range(args.repeat)]
        d = [plain_df(sql, args.timeout) for _ in range(args.repeat)]

        def span(rows, key):
            vals = [r[key] for r in rows]
            return f"{min(vals):.3f}-{max(vals):.3f} (median {statistics.median(vals):.3f})"

        print(
            f"| {name} | {span(b, 'overshoot_s')} | {span(b, 'release_s')} | {span(d, 'timer_late_s')} | "
            f"{span(d, 'overshoot_s')} | {', '.join(sorted({r['outcome'] for r in d}))} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
