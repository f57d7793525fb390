"""The warehouse's commands: `aip-eval sql` (a read-only query, bounded in rows and time),
`aip-eval runs` (the registered runs) and `aip-eval migrate` (a local warehouse into the lake)."""

from __future__ import annotations

import sys
from pathlib import Path

from ..errors import AipError


def cmd_sql(args) -> int:
    from .. import warehouse as wh

    path = Path(args.warehouse).resolve() if args.warehouse else None
    import duckdb
    import pandas as pd

    if not args.timeout >= 0:  # also NaN
        raise AipError(f"--timeout must be 0 (no limit) or a number of seconds, got {args.timeout:g}")
    keep = args.max_rows if args.format == "table" and args.max_rows > 0 else None
    try:
        with wh.sandboxed(path) as con:  # closed, and the warehouse's lock let go, before anything is printed
            df, total = wh.run_bounded(con, args.query, args.timeout, keep)
    except wh.QueryStopped as e:
        print(f"error: stopped after {e.seconds:g} s (--timeout); narrow the query or raise --timeout", file=sys.stderr)
        return 2
    except (duckdb.PermissionException, duckdb.InvalidInputException) as e:
        msg = str(e)
        if isinstance(e, duckdb.PermissionException) or "configuration has been locked" in msg or "read-only" in msg:
            print(
                f"error: refused: `aip-eval sql` reads the warehouse and nothing else (no other file, no network, "
                f"no extension, no settings, no writes): {msg.splitlines()[0]}",
                file=sys.stderr,
            )
        else:
            print(f"error: {msg}", file=sys.stderr)
        return 2
    except duckdb.Error as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.format == "csv":
        df.to_csv(sys.stdout, index=False)
    elif args.format == "json":
        print(df.to_json(orient="records", date_format="iso", force_ascii=False))
    else:
        if not total:
            print("(no rows)")
            return 0
        width = args.max_colwidth if args.max_colwidth > 0 else None
        with pd.option_context("display.max_columns", None, "display.width", 200):
            print(df.to_string(index=False, max_colwidth=width))
        if len(df) < total:  # only the rows shown were kept
            print(
                f"... {total - len(df)} more row(s) not shown ({total} in all; --max-rows 0 shows every row, "
                f"--format csv or json prints them all)"
            )
    return 0


def cmd_runs(args) -> int:
    from .. import pipeline

    runs = pipeline.list_runs()
    print(runs.to_string(index=False) if len(runs) else "(no runs)")
    return 0


def cmd_migrate(args) -> int:
    from .. import warehouse as wh
    from ..warehouse import lake

    copied = wh.migrate_into_lake(args.source or wh.default_path())
    runs = copied.pop("runs")
    calls = copied.pop("journaled calls")
    print(
        f"{runs} run(s) copied into the {lake.where()}"
        + (": " + ", ".join(f"{t} {n}" for t, n in copied.items() if n) if runs else " (every run was there already)")
        + (f"; {calls} journaled call(s) into its journal" if calls else "")
    )
    return 0
