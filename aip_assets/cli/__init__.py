"""`aip-eval`: run a spec end to end, query the warehouse, serve the builtin model.

Exit codes (errors.EXIT_*; docs/concepts/exit-codes.md), each meaning one thing: 0 every metric passed its
gate; 1 a metric's gate failed (no score, a score below its threshold, coverage below
min_coverage, too many failed answers or verdicts, a differential refusal, a label mismatch): its
tables are written, and its Dagster run is marked failed so the UI's Runs list shows it; 2 bad
input or configuration (spec, dataset, endpoint, a missing file): nothing written; 3 an internal
error, a bug of aip-eval (the traceback is saved in the data folder's errors/); 4 the run stopped
at its limits (resumable with --run-id); 5 an operational failure outside the project that did not
recover in time (a lock not released, a database or an endpoint unreachable after retries),
naming what and how to resume; 130 interrupted by Ctrl-C or SIGTERM (resumable with --run-id:
the calls answered before the stop are journaled and not made again).

This module has the parser and `main`; each command (or group of commands) is a module beside it,
whose own imports stay inside its functions so `aip-eval --help` loads none of the pipeline.
"""

from __future__ import annotations

import argparse
import sys

from ..errors import (
    EXIT_BAD_INPUT,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OPERATIONAL,
    AipError,
    OperationalError,
    save_traceback,
)
from ..logs import setup_logging
from ..settings import current, data_dir
from .builtin import cmd_answer, cmd_serve
from .compare import cmd_compare
from .dagster_ui import cmd_daemon, cmd_ui, start_report_server
from .datasets import cmd_perturb, cmd_templates, cmd_validate
from .failures import known_failure, outage_of
from .labels import cmd_label_export, cmd_label_import
from .report import cmd_report
from .run import cmd_run
from .sql import cmd_migrate, cmd_runs, cmd_sql
from .summary import print_summary

__all__ = ["build_parser", "entry", "main", "print_summary", "start_report_server"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="aip-eval", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    r = sub.add_parser("run", help="register a run of SPEC (or resume one) and materialise every metric")
    r.add_argument("spec", help="run spec YAML, e.g. data/runs/demo.yaml")
    r.add_argument("--run-id", help="resume this run (or start a new run with this id)")
    r.add_argument("--metric", action="append", help="only this metric (repeatable)")
    r.add_argument("--json", action="store_true", help="print the summary as JSON")
    r.add_argument(
        "--warehouse",
        help="DuckDB file (default $AIP_WAREHOUSE, else warehouse.duckdb in the data folder: $AIP_DATA_DIR, the project's data/, or the user data folder)",
    )
    r.add_argument("--quiet", action="store_true", help="no progress lines")
    r.add_argument("-v", "--verbose", action="store_true", help="also each stage's counts, in words (Dagster's log)")
    r.add_argument(
        "--dry-run", action="store_true", help="estimate the calls and tokens the spec will spend; call nothing"
    )
    r.add_argument(
        "--exam",
        action="store_true",
        help="with --dry-run: check the endpoints and run only the judge exam (exit 2 when a judge fails it); "
        "nothing is sent to the SUT or written",
    )
    r.add_argument("--max-calls", type=int, help="cap the run's model calls (raises a resumed run's cap)")
    r.add_argument("--max-tokens", type=int, help="cap the run's tokens (raises a resumed run's cap)")
    r.add_argument(
        "--submit",
        action="store_true",
        help="queue one Dagster run per metric for the instance's daemon (`aip-eval daemon`, `aip-eval ui`) "
        "instead of evaluating here; waits for them and prints the summary",
    )
    r.add_argument("--detach", action="store_true", help="with --submit: return once the runs are queued")
    r.add_argument(
        "--parallel",
        type=int,
        default=1,
        help="evaluate this many metrics at once, each in a worker process; every endpoint's "
        "max_connections is shared between them (default 1; not with call or token caps)",
    )
    r.set_defaults(fn=cmd_run)

    q = sub.add_parser("sql", help="run a read-only SQL query against the warehouse")
    q.add_argument("query")
    q.add_argument("--format", choices=["table", "csv", "json"], default="table")
    q.add_argument(
        "--max-rows", type=int, default=200, help="table format: rows printed (0: all; csv and json print every row)"
    )
    q.add_argument(
        "--max-colwidth",
        type=int,
        default=80,
        help="table format: characters per cell, longer cells end in '...' (0: no limit)",
    )
    q.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help="stop the query after this many seconds (default %(default)g; 0: no limit); a stopped "
        "query prints no result and exits 2",
    )
    q.add_argument("--warehouse")
    q.set_defaults(fn=cmd_sql)

    sub.add_parser("runs", help="list registered runs").set_defaults(fn=cmd_runs)
    sub.add_parser(
        "daemon",
        help="run Dagster's daemon on the project's instance (one per instance): it "
        "launches queued runs (`run --submit`, schedules, the sensor)",
    ).set_defaults(fn=cmd_daemon)
    ui = sub.add_parser("ui", help="run the Dagster UI and daemon (`dagster dev`) on the project's instance")
    ui.add_argument("--host", default="127.0.0.1")
    ui.add_argument("--port", type=int, default=3000)
    ui.set_defaults(fn=cmd_ui)

    mg = sub.add_parser(
        "migrate",
        help="copy a local warehouse's runs into the lake (shared mode: "
        "AIP_LAKE_DATA_PATH and AIP_SHARED_STATE_URL set)",
    )
    mg.add_argument(
        "--from",
        dest="source",
        help="the local DuckDB file (default $AIP_WAREHOUSE, else warehouse.duckdb in the data folder)",
    )
    mg.set_defaults(fn=cmd_migrate)

    c = sub.add_parser("compare", help="compare run B against run A: each metric's change, tested")
    c.add_argument("runs", nargs="*", metavar="RUN", help="RUN_A RUN_B (diff = B - A)")
    c.add_argument("--latest", metavar="SPEC_NAME", help="the latest run of this spec against the one before")
    c.add_argument("--json", action="store_true", help="print the comparison as JSON")
    c.add_argument("--fail-on-drop", action="store_true", help="exit 1 when any score dropped significantly")
    c.add_argument("--alpha", type=float, default=0.05, help="family-wise error rate (Holm), default 0.05")
    c.add_argument(
        "--html",
        nargs="?",
        const="",
        metavar="PATH",
        help="also write the comparison page, the two runs side by side (default <warehouse dir>/reports/"
        "compare--<A>--<B>.html; its path on stderr)",
    )
    c.add_argument("--warehouse")
    c.set_defaults(fn=cmd_compare)

    rp = sub.add_parser("report", help="write a self-contained HTML report of RUN and print its path")
    rp.add_argument("run", nargs="?", help="run id (see `aip-eval runs`); optional with --serve")
    rp.add_argument(
        "--serve",
        action="store_true",
        help="then serve the reports folder over HTTP (loopback) so the links in the Dagster UI open; Ctrl-C stops",
    )
    rp.add_argument("--host", default="127.0.0.1", help="--serve: address to listen on (default loopback only)")
    rp.add_argument("--port", type=int, default=None, help="--serve: port (default $AIP_REPORT_PORT, else 8112)")
    rp.add_argument("--out", help="output file (default <warehouse dir>/reports/<run>.html)")
    rp.add_argument(
        "--rows-per-metric",
        type=int,
        default=None,
        help="the sample viewer embeds at most this many rows of each metric, lowest scores first "
        "(default 500; the page says how many were left out)",
    )
    rp.add_argument(
        "--warehouse",
        help="DuckDB file (default $AIP_WAREHOUSE, else warehouse.duckdb in the data folder: $AIP_DATA_DIR, the project's data/, or the user data folder)",
    )
    rp.set_defaults(fn=cmd_report)

    lb = sub.add_parser("label", help="check the judge against people: export judgements to label, import the labels")
    lsub = lb.add_subparsers(dest="label_cmd", required=True)
    le = lsub.add_parser(
        "export",
        help="write a seeded sample of RUN's judgements of a metric, stratified by the "
        "judge's category, to a CSV (or .jsonl) a person fills in",
    )
    le.add_argument("run", help="run id (see `aip-eval runs`)")
    le.add_argument("--metric", required=True, help="the metric whose judgements to label, e.g. llm.decision_flip")
    le.add_argument("--n", type=int, default=100, help="judgements in the sample (default 100)")
    le.add_argument("--out", help="the file: .csv or .jsonl (default <warehouse dir>/labels/<run>--<metric>.csv)")
    le.add_argument(
        "--show-verdict",
        action="store_true",
        help="include the judge's category and reasoning (default: hidden, so the person is not led by it)",
    )
    le.add_argument("--seed", type=int, help="the sample's seed (default the run's seed)")
    le.add_argument("--force", action="store_true", help="replace --out if it exists")
    le.add_argument("--json", action="store_true", help="print what was written as JSON")
    le.add_argument(
        "--warehouse", help="DuckDB file (default $AIP_WAREHOUSE, else warehouse.duckdb in the data folder)"
    )
    le.set_defaults(fn=cmd_label_export)
    li = lsub.add_parser(
        "import",
        help="check and store a filled-in file's labels (table human_labels), then the "
        "judge's agreement with people, kappa and the corrected rate (metric_scores)",
    )
    li.add_argument("file", help="the filled-in .csv or .jsonl")
    li.add_argument("--labeller", help="who labelled the rows whose labeller cell is empty")
    li.add_argument("--json", action="store_true", help="print the figures as JSON")
    li.add_argument(
        "--warehouse", help="DuckDB file (default $AIP_WAREHOUSE, else warehouse.duckdb in the data folder)"
    )
    li.set_defaults(fn=cmd_label_import)

    v = sub.add_parser("validate", help="validate a spec and its dataset without running anything")
    v.add_argument("spec")
    v.set_defaults(fn=cmd_validate)

    t = sub.add_parser("templates", help="list the consistency family's variant templates")
    t.add_argument("family", nargs="?", choices=["semantic", "factual", "safety", "jailbreak"])
    t.add_argument("--spec", help="include the extra templates of this run spec")
    t.set_defaults(fn=cmd_templates)

    pt = sub.add_parser(
        "perturb", help="generate perturbed variants of a dataset (gdi_text_v1, with metadata.original_query)"
    )
    pt.add_argument("seed_dataset")
    pt.add_argument("out", help="output file: .jsonl, .csv or .parquet")
    pt.add_argument("--types", help="comma-separated: typos,casing,punctuation,word_order,filler,synonyms,paraphrase")
    pt.add_argument("--seed", type=int, default=0)
    pt.add_argument("--variants-per-type", type=int, default=1)
    pt.add_argument("--paraphrase-base-url", help="OpenAI-compatible endpoint for the paraphrase perturbation")
    pt.add_argument("--paraphrase-model", default="aip-builtin")
    pt.add_argument("--paraphrase-api-key-env")
    pt.set_defaults(fn=cmd_perturb)

    an = sub.add_parser("answer", help="fill sut_response with the builtin model's answers (outside the pipeline)")
    an.add_argument("dataset")
    an.add_argument("out")
    an.add_argument(
        "--profile", help='builtin SUT profile as JSON, e.g. \'{"name": "fragile", "fragile_to": "typos"}\''
    )
    an.set_defaults(fn=cmd_answer)

    s = sub.add_parser("serve-builtin", help="serve the builtin model as an OpenAI-compatible endpoint")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8111)
    s.add_argument("--profile", help='SUT profile as JSON, e.g. \'{"name": "flip", "value": "woman", "p": 0.3}\'')
    s.add_argument("--latency-ms", type=float, default=0.0)
    s.add_argument("--fail-rate", type=float, default=0.0, help="share of request bodies answered with HTTP 500")
    s.add_argument("--fail-substring", help="requests whose body contains this get HTTP 500")
    s.add_argument("--api-key-env", help="require 'Authorization: Bearer $VAR'")
    s.add_argument(
        "--batch-seconds",
        type=float,
        default=2.0,
        help="Batch API (/v1/files, /v1/batches): a batch is done this long after it is created",
    )
    s.add_argument(
        "--batch-expire-rate",
        type=float,
        default=0.0,
        help="Batch API: share of requests (picked by body) that miss the completion window",
    )
    s.set_defaults(fn=cmd_serve)
    return p


def main(argv: list[str] | None = None) -> int:
    """Exit 2 for the user's input (spec, dataset, endpoint, missing file), 5 for a failure outside
    the project that did not recover (errors.OperationalError), 3 for anything else: an unexpected
    exception is a bug of aip-eval, not the user's mistake (its traceback is saved)."""
    args = build_parser().parse_args(argv)
    restore_logging = setup_logging(getattr(args, "quiet", False), verbose=getattr(args, "verbose", False))
    try:
        return args.fn(args)
    except OperationalError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_OPERATIONAL
    except AipError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as e:  # noqa: BLE001 - reported, with the traceback saved
        import traceback

        outage = outage_of(e)
        if outage is not None:  # Dagster's storage in Postgres went away (another command than run)
            print(f"error: {outage}", file=sys.stderr)
            return EXIT_OPERATIONAL
        known = known_failure(e)  # a damaged warehouse file, a full disk: said, not a bug
        if known is not None:
            then = "; then run the same command again" if isinstance(known, OperationalError) else ""
            print(f"error: {known}{then}", file=sys.stderr)
            return EXIT_OPERATIONAL if isinstance(known, OperationalError) else EXIT_BAD_INPUT
        if current().debug:
            traceback.print_exc()
        where = save_traceback(traceback.format_exc(), args.cmd, data_dir() / "errors")
        print(
            f"internal error: {type(e).__name__}: {e}\nThis is a bug in aip-eval, not a problem with your "
            f"input. The traceback is saved in {where}; please report it with that file (AIP_DEBUG=1 prints it "
            "too).",
            file=sys.stderr,
        )
        return EXIT_INTERNAL
    finally:
        restore_logging()


def entry() -> None:
    """The ``aip-eval`` command (and ``python -m aip_assets.cli``): ``main``, then its exit code.

    A process that has run ``aip-eval run`` holds some 2,200 modules (Dagster, pandas, SQLAlchemy,
    pydantic...), and the interpreter's teardown, which frees every one of their objects, took
    0.75 s of wall and 0.8 s of CPU of a 9 s small run (bench_phases.py, 2026-12-07). Nothing of
    ours waits for that teardown: the exit handlers close the warehouse (``linger.release``) and
    Dagster's SQLite files (``dagster_storage.ANCHORS``) and flush the logs. So after ``main``
    returns, threading shuts down as at a normal exit (its exit callbacks, which stop idle thread
    pools, then the threads that are not daemons joined: ``threading._shutdown``, the interpreter's
    own first step; without it, the normal way out) and the exit handlers run; then the output is
    flushed and the process ends at once (``os._exit``), with main's code.
    An exception out of ``main`` (``SystemExit`` from ``--help`` or a usage error) takes the
    normal way out."""
    import atexit
    import os
    import threading

    from . import run

    run.OWN_PROCESS = True  # `aip-eval run` may pause the cycle collector for its start-up (run._pause_collector)
    code = main()
    shutdown = getattr(threading, "_shutdown", None)  # what the interpreter calls first at its exit
    if shutdown is None:  # another Python's threading: the normal way out
        sys.exit(code)
    shutdown()  # threading's own exit callbacks (idle thread pools told to stop), then non-daemon threads joined
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (`aip-eval sql ... | head`) or a closed stream
            pass
    os._exit(code or 0)
