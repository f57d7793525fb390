"""`aip-eval report`: a run's self-contained HTML report (the sample viewer in it), and with
`--serve` the reports folder over HTTP."""

from __future__ import annotations

import sys
from pathlib import Path

from ..errors import AipError


def cmd_report(args) -> int:
    from ..report import default_out, report_url, serve_reports, write_report

    path = Path(args.warehouse).resolve() if args.warehouse else None
    if not args.run and not args.serve:
        raise AipError("report needs a RUN (see `aip-eval runs`), or --serve to serve the reports folder")
    from ..report import ROWS_PER_METRIC

    rows = ROWS_PER_METRIC if args.rows_per_metric is None else args.rows_per_metric
    if rows < 1:
        raise AipError(f"--rows-per-metric must be at least 1, got {rows}")
    written = write_report(args.run, out=args.out, path=path, rows_per_metric=rows) if args.run else None
    if written is not None:
        print(written)
    if not args.serve:
        return 0
    folder = default_out("x", path).parent  # the reports folder, and nothing else (not --out's folder)
    if written is not None and written.parent != folder.resolve():
        print(f"note: {written} is outside the reports folder and is not served", file=sys.stderr)
        written = None
    server = serve_reports(folder, args.host, args.port, warehouse=path)
    port = server.server_address[1]
    print(
        f"serving {folder} at http://{args.host}:{port}/ (Ctrl-C stops)"
        + (f"\n{report_url(written, port)}" if written is not None else ""),
        flush=True,
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
