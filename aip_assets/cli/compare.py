"""`aip-eval compare`: run B against run A, each metric's change tested (Holm), as a table, JSON
or the two runs' side-by-side page."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..errors import AipError


def cmd_compare(args) -> int:
    from .. import compare, compare_table

    path = Path(args.warehouse).resolve() if args.warehouse else None
    if args.latest and args.runs:
        raise AipError("give either RUN_A RUN_B or --latest SPEC_NAME, not both")
    if args.latest:
        run_a, run_b = compare.latest_pair(args.latest, path)
    elif len(args.runs) == 2:
        run_a, run_b = args.runs
    else:
        raise AipError("compare needs two run ids (RUN_A RUN_B) or --latest SPEC_NAME")
    if args.html and not args.html.endswith(".html"):
        raise AipError(
            f"--html PATH must name a .html file, got {args.html!r} (for the reports folder, put --html after "
            "the run ids: `aip-eval compare RUN_A RUN_B --html`)"
        )
    df, warnings = compare.compare_runs(run_a, run_b, path, alpha=args.alpha)
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    drops = [r for r in df.to_dict("records") if compare.is_drop(r)]
    if args.json:
        print(
            json.dumps(
                {
                    "run_a": run_a,
                    "run_b": run_b,
                    "alpha": args.alpha,
                    "warnings": warnings,
                    "significant_drops": len(drops),
                    "rows": compare_table.json_rows(df),
                },
                indent=2,
            )
        )
    else:
        print(compare_table.format_table(df, run_a, run_b, args.alpha))
    if args.html is not None:  # the page's path on stderr: stdout stays the table or the JSON
        from ..report import default_out, report_url
        from ..report.comparison import write_comparison

        page = write_comparison(run_a, run_b, df, warnings, args.alpha, out=args.html or None, path=path)
        print(f"comparison page: {page}", file=sys.stderr)
        if page.parent == default_out("x", path).parent.resolve():
            print(f"served by `aip-eval report --serve` at {report_url(page)}", file=sys.stderr)
    return 1 if args.fail_on_drop and drops else 0
