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
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from .errors import (
    EXIT_BAD_INPUT,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_LIMIT,
    EXIT_OPERATIONAL,
    AipError,
    OperationalError,
    save_traceback,
)
from .logs import setup_logging
from .settings import current, data_dir, override

log = logging.getLogger("aip_assets")
T = TypeVar("T")


def _fmt(x, nd=3) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{nd}f}"


def print_summary(summary: dict, out=None) -> None:
    p = lambda s="": print(s, file=out or sys.stdout)  # noqa: E731
    from .metrics import get_metric
    from .metrics.words import failed_and_excluded, reasons_phrase

    p(f"Run {summary['run_id']}  (spec {summary['spec']}, dataset {summary['dataset']})")
    if summary.get("judge_note"):
        p(f"Note: {summary['judge_note']}")
    for line in structured_lines(summary.get("structured_output") or []):
        p(line)
    for e in summary.get("judge_exam") or []:
        p(e["line"][:1].upper() + e["line"][1:])
    from .findings import finding_lines

    p()
    for line in finding_lines(summary_findings(summary)):
        p(line)
    for metric, s in summary["metrics"].items():
        verdict = "PASS" if s.get("passed") else "FAIL"
        if "ci95" not in s:
            p(f"\n{metric}: {s.get('status')}  {verdict}: {s.get('gate_reason')}")
            continue
        th = "" if s.get("threshold") is None else f"  threshold {s['threshold']:.3f}"
        own = f" ({s['metric_name']})" if s.get("metric_name") and s["metric_name"] != metric.rsplit(".", 1)[-1] else ""
        p(
            f"\n{metric}{own}  score {_fmt(s['score'])}  95% CI [{_fmt(s['ci95'][0])}, "
            f"{_fmt(s['ci95'][1])}]  coverage {_fmt(s.get('coverage'))}{th}  {verdict}"
        )
        if not s.get("passed"):
            p(f"  gate: {s.get('gate_reason')}")
        if kinds := failed_and_excluded(s.get("excluded")):  # failures (stored as errors) apart from exclusions
            p(
                "  "
                + "; ".join(f"{word}: {reasons_phrase(items)}" for word, items in kinds)
                + f" (of {s.get('n_planned')} planned)"
            )
        for r in s.get("judge_reading") or []:
            p(
                f"  judge {r['judge']} ({r['model']}): {r['contradicted']} of {r['asked']} verdicts contradicted a "
                "decision or stance the answer plainly states (judge_failed, excluded)"
            )
        if s.get("judge_panel"):
            from .judge_panel import format_panel

            for line in format_panel(s["judge_panel"]):
                p(line)
        for line in get_metric(metric).format_summary(s):
            p(line)


def summary_findings(summary: dict) -> list[dict]:
    """The run's findings as dicts (``Finding.to_dict``): the summary's ``findings``, else read
    from the warehouse for the summary's metrics."""
    if "findings" not in summary:
        from .findings import run_findings

        summary["findings"] = [f.to_dict() for f in run_findings(summary["run_id"], list(summary["metrics"]))]
    return summary["findings"]


_HOW = {
    "preflight": "chosen before the run",
    "lazily": "chosen when the run first asked it (no choice was recorded)",
    "fallback": "moved to during the run",
}


def structured_lines(forms: list[dict]) -> list[str]:
    """The summary's lines on the structured-output form of each LLM judge endpoint."""
    out = []
    for f in forms:
        head = f"Structured output: {f['role']} {f['endpoint']} (model {f['model']}): "
        if not f["history"]:
            out.append(
                head
                + (
                    f"{f['form']} (structured_output: {f['structured_output']})"
                    if f["form"]
                    else "none chosen yet (no request for JSON reached it)"
                )
            )
            continue
        steps = [f"{_HOW.get(e['how'], e['how'])}: {e['reason'][:240]}" for e in f["history"]]
        out.append(head + f"{f['form']} ({'; then '.join(steps)})")
    return out


def _dry_exam(spec, as_json: bool) -> int:
    """``--dry-run --exam``: the endpoint check and the judge exam alone, in a scratch folder (its
    calls are not kept), printed; exit 2 when a judge fails."""
    import tempfile

    from . import judge_exam
    from .preflight import preflight, record_forms

    if not judge_exam.examined(spec):
        print(
            f"{spec.name}: no judge takes an exam (the builtin judge, or min_judge_exam: 0 on every metric)",
            file=sys.stderr,
        )
        return 0
    checked = preflight(spec)
    for line in checked:
        log.info(line)
    with tempfile.TemporaryDirectory(prefix="aip-exam-") as tmp:
        path = Path(tmp) / "exam.duckdb"
        run_id = f"exam-{spec.name}"
        record_forms(run_id, checked.forms, path)
        exam = judge_exam.run_exam(spec, run_id, path, log=(lambda m: None) if as_json else log.info)
    if as_json:
        print(json.dumps(judge_exam.summary(exam.rows()), indent=2))
    exam.raise_if_failed()
    return 0


def _dry_run(spec, as_json: bool) -> int:
    from .estimate import estimate

    est = estimate(spec)
    est["sent"] = _how_sent(spec, est["total"])
    if as_json:
        print(json.dumps(est, indent=2))
    else:
        print(f"Dry run of {spec.name}: no model is called. Estimated spend:")
        print(f"  {'metric':<40}{'SUT calls':>11}{'judge calls':>13}{'synth calls':>13}{'tokens':>14}")
        for m, e in est["metrics"].items():
            tokens = sum(v for k, v in e.items() if k.endswith("_tokens"))
            print(f"  {m:<40}{e['sut_calls']:>11,}{e['judge_calls']:>13,}{e['synthesis_calls']:>13,}{tokens:>14,}")
        t = est["total"]
        print(
            f"  {'total':<40}{t['sut_calls']:>11,}{t['judge_calls']:>13,}{t['synthesis_calls']:>13,}{t['tokens']:>14,}"
        )
        a = est["assumptions"]
        print(
            f"  (tokens: 4 characters a token; SUT answers {a['sut_answer_tokens']} tokens; judge prompts "
            f"{a['judge_prompt_tokens']} + both answers; judge answers {a['judge_answer_tokens']})"
        )
        if not est["within_limits"]:
            print(f"  over the spec's limits {est['limits']}: the run would stop at the cap (resumable)")
        for line in _batch_lines(spec, est["sent"]):
            print(line)
        for m, e in est["metrics"].items():
            plan = e.get("detectable")
            if not plan:
                continue
            print(
                f"What {m} can detect with 80% power (each claim at Holm's first step over its "
                f"{plan['claims']} planned claims, alpha {plan['alpha']:g}):"
            )
            for line in plan["lines"]:
                print(line)
            for w in plan["warnings"]:
                print(f"  warning: {w['message']}")
    return 0


def _how_sent(spec, total: dict) -> dict[str, dict]:
    """Per role with calls: how they go (the Batch API or live) and, where the connection's prices
    are configured, what they cost live and as configured."""
    out = {}
    for role in ("sut", "judge"):
        conn, calls = getattr(spec, role), total[f"{role}_calls"]
        if not calls:
            continue
        row: dict = {"calls": calls, "batch": conn.batch.enabled}
        if conn.prices is not None:
            p = conn.prices
            live = (
                total[f"{role}_prompt_tokens"] * p.input_per_million_tokens
                + total[f"{role}_completion_tokens"] * p.output_per_million_tokens
            ) / 1e6
            row.update(live_cost=round(live, 4), batch_cost=round(live * (1 - p.batch_discount), 4))
            row["cost"] = row["batch_cost"] if conn.batch.enabled else row["live_cost"]
        out[role] = row
    return out


def _batch_lines(spec, sent: dict[str, dict]) -> list[str]:
    out = []
    for role, r in sent.items():
        conn = getattr(spec, role)
        how = (
            f"Batch API (batches of up to {conn.batch.max_requests:,}, polled every {conn.batch.poll_seconds:g}s)"
            if r["batch"]
            else "live"
        )
        line = f"  {role}: {r['calls']:,} calls {how}"
        if "cost" in r:
            line += (
                f"; about {r['cost']:,.2f} (live: {r['live_cost']:,.2f}, saving {r['live_cost'] - r['cost']:,.2f})"
                if r["batch"]
                else f"; about {r['cost']:,.2f} (with batch.enabled: {r['batch_cost']:,.2f})"
            )
        out.append(line)
    return out


def _chosen_warehouse(args):
    """``--warehouse`` as this process's warehouse for the command (``settings.override``)."""
    return override(warehouse=Path(args.warehouse).resolve()) if args.warehouse else override()


def cmd_run(args) -> int:
    """A Ctrl-C or SIGTERM stops the run (interrupts.py): no stage or metric starts after it, the
    calls answered are journaled, and it exits 130 saying how to resume."""
    from . import interrupts

    resumable: dict[str, str] = {}
    with interrupts.handled():
        try:
            with _chosen_warehouse(args):
                code = _run(args, resumable)
            if not interrupts.requested():
                return code
        except (KeyboardInterrupt, interrupts.Interrupted):
            if args.submit:
                raise
        except OperationalError as e:  # a failure outside the project (exit 5): said with the way to resume
            raise OperationalError(_with_hint(e, resumable)) from None
        except AipError:
            raise
        except Exception as e:
            outage = _outage(e)  # Dagster's storage in Postgres went away: exit 5 as well
            known = _known_failure(e) if outage is None else outage  # a damaged warehouse, a full disk
            if known is None:
                raise
            if not isinstance(known, OperationalError):
                raise known from None
            raise OperationalError(_with_hint(known, resumable)) from None
        print("interrupted; " + resumable["hint"] if resumable else "interrupted", file=sys.stderr)
        return interrupts.EXIT_CODE


def _with_hint(e: Exception, resumable: dict[str, str]) -> str:
    """An operational failure's message with what to do: resume the registered run, else (stopped
    before anything was registered) run the command again once what failed is back."""
    from .errors import DiskFull

    return (
        f"{e}; {resumable['hint']}"
        if resumable.get("hint")
        else f"{e}; nothing was registered or written: run the same command again once "
        + ("there is space" if isinstance(e, DiskFull) else "it is back")
    )


def _outage(e: BaseException) -> OperationalError | None:
    """An error of Dagster's Postgres storage that is the database going away, as an
    OperationalError (``dagster_home.storage_outage``); None for anything else."""
    from .dagster_home import storage_outage

    try:
        return storage_outage(e)
    except Exception:  # noqa: BLE001 - telling it apart must not hide the error itself
        return None


def _known_failure(e: BaseException) -> AipError | None:
    """An error met below the CLI that is not a bug: the warehouse file damaged (exit 2), a disk
    full (exit 5, an OperationalError)."""
    from .errors import disk_full
    from .warehouse.opening import damaged

    return damaged(e) or disk_full(e, None)


def _resume_hint(args, run_id: str) -> str:
    import shlex

    cmd = ["aip-eval", "run", args.spec, "--run-id", run_id]
    if args.warehouse:
        cmd += ["--warehouse", args.warehouse]
    for m in args.metric or []:
        cmd += ["--metric", m]
    return f"resume with `{shlex.join(cmd)}`"


def _background(fn: Callable[[], T]) -> Callable[..., T]:
    """Start ``fn()`` in a thread (not a daemon: the process waits for it before it exits); the
    function returned waits for it and returns its result, or raises its exception (with
    ``quiet=True``, for a caller already raising its own: returns None)."""
    import threading

    box: dict[str, Any] = {}

    def go() -> None:
        try:
            box["out"] = fn()
        except BaseException as e:  # noqa: BLE001 - raised again in the waiting thread
            box["err"] = e

    thread = threading.Thread(target=go, name=f"aip-{getattr(fn, '__name__', 'background')}")
    thread.start()

    def wait(quiet: bool = False) -> T:
        thread.join()
        if "err" in box and not quiet:
            raise box["err"]
        return box.get("out")  # type: ignore[return-value]

    return wait


def _evaluate_job():
    """The evaluate job resolved; ``jobs.evaluate_run``, which runs it."""
    from .jobs import evaluate, evaluate_run

    evaluate()
    return evaluate_run


def _run(args, resumable: dict[str, str]) -> int:
    from . import interrupts, pipeline
    from . import warehouse as wh
    from .dagster_home import get_instance, use_project_of
    from .estimate import update_limits
    from .preflight import examine, preflight, record_forms
    from .runspec import load_spec
    from .summary import run_summary

    # validation order: the command line's numbers, the spec, every dataset, the endpoints, then the
    # warehouse; bad input of any kind stops before a file is written
    for flag, value in (
        ("--max-calls", args.max_calls),
        ("--max-tokens", args.max_tokens),
        ("--parallel", args.parallel),
    ):
        if value is not None and value < 1:
            raise AipError(f"{flag} must be at least 1, got {value}")
    if args.run_id is not None:
        pipeline.check_run_id(args.run_id, "--run-id")
    spec = load_spec(args.spec)
    use_project_of(args.spec)  # the warehouse and Dagster storage of the spec's project, wherever we stand
    path = wh.default_path()

    def only_configured(where: str, why: str = "") -> None:
        unknown = [m for m in args.metric or [] if m not in spec.metrics]
        if unknown:
            raise AipError(
                f"metric {', '.join(unknown)} is not configured in {where} (configured: {', '.join(spec.metrics)}){why}"
            )

    only_configured(f"spec {spec.name}")
    if args.detach and not args.submit:
        raise AipError("--detach goes with --submit (it returns once the runs are queued)")
    if args.submit and args.parallel > 1:
        raise AipError(
            "--parallel is for evaluating here; with --submit the daemon runs the metrics at once, "
            "within the queue's limits"
        )
    if args.exam and not args.dry_run:
        raise AipError("--exam goes with --dry-run (a run takes the exam anyway, before its first SUT call)")
    if args.dry_run:
        return _dry_exam(spec, args.json) if args.exam else _dry_run(spec, args.json)
    run_id = args.run_id
    resume = run_id is not None and pipeline.run_exists(run_id, path)
    if resume:
        spec, _ = pipeline.load_run(run_id, path)
        log.info(f"resuming run {run_id} with its stored spec")
        resumable["hint"] = _resume_hint(args, run_id)
        interrupts.set_hint(resumable["hint"])
        only_configured(f"run {run_id}", "; a resumed run keeps the metrics of its stored spec")
    from .shared_state import shared_state_url

    if (
        args.parallel > 1
        and (args.max_calls or args.max_tokens or spec.limits.max_calls or spec.limits.max_tokens)
        and not shared_state_url()
    ):
        raise AipError(
            "--parallel: the run's call and token caps (limits.max_calls / max_tokens, --max-calls, "
            "--max-tokens) are counted per process; run a capped run with --parallel 1, or share them "
            "through Postgres (AIP_SHARED_STATE_URL)"
        )
    # Dagster's modules load and the evaluate job resolves (the CLI's runs are its history in the UI)
    # in another thread while the endpoints are checked: the checks mostly wait on the network
    resolved = _background(_evaluate_job)
    try:
        n_rows = pipeline.validate_datasets(spec)
        checked = preflight(spec, run_id if resume else None, path)
    except BaseException:
        resolved(quiet=True)  # nothing left behind running
        raise
    evaluate_run = resolved()  # before any write; its error, if any, raised here
    for line in checked:
        log.info(line)
    # Dagster's storage (Postgres in shared mode), opened before anything is registered: a new run's
    # while its judge sits the exam (network again), waited for before the registration
    instance = get_instance() if resume or args.submit else None
    if args.submit:
        from .run_queue import require_queue

        require_queue(instance)
    if resume:  # forms the check had to choose (none recorded for the run): recorded now
        record_forms(run_id, checked.forms, path)
    if resume and (args.max_calls or args.max_tokens):
        update_limits(run_id, args.max_calls, args.max_tokens, path)
        spec, _ = pipeline.load_run(run_id, path)
        log.info(f"run {run_id}: limits raised to max_calls={args.max_calls}, max_tokens={args.max_tokens}")
    if not resume:
        if args.max_calls or args.max_tokens:
            spec = spec.model_copy(
                update={
                    "limits": spec.limits.model_copy(
                        update={k: v for k, v in (("max_calls", args.max_calls), ("max_tokens", args.max_tokens)) if v}
                    )
                }
            )
        base = run_id = run_id or pipeline.new_run_id(spec)
        n = 1
        while not args.run_id and pipeline.run_exists(run_id, path):  # two runs of one spec within a minute
            n += 1
            run_id = f"{base}-{n}"
        opening = _background(get_instance) if instance is None else None
        try:
            exam = examine(spec, run_id, checked.forms, path, log.info)  # before any SUT call
        except BaseException:
            if opening is not None:
                opening(quiet=True)
            raise
        if opening is not None:
            instance = opening()
        while True:
            try:
                rec = pipeline.register_run(spec, run_id, path, n_rows=n_rows, forms=checked.forms, exam=exam)
                log.info(f"registered run {run_id}: {rec['n_dataset_rows']} rows, metrics {', '.join(spec.metrics)}")
                break
            except pipeline.AlreadyRegistered:
                if not args.run_id:  # a run id of our own making, taken a moment ago: the next one
                    n += 1
                    run_id = f"{base}-{n}"
                    continue
            # another worker given the same new --run-id registered it first: this one joins it
            differ = pipeline.spec_differences(spec, run_id, path)
            if differ:
                raise AipError(
                    f"run {run_id} was registered by another worker with a different spec, so this one "
                    f"cannot join it: " + "; ".join(differ) + ". Give this spec its own --run-id, or "
                    "run the registered spec"
                ) from None
            spec, _ = pipeline.load_run(run_id, path)
            log.info(
                f"run {run_id} was registered a moment ago by another worker, with this same spec: joining it "
                "(each stage is done by one worker; the other goes on from its result)"
            )
            break
        resumable["hint"] = _resume_hint(args, run_id)
        interrupts.set_hint(resumable["hint"])
    elif differ := pipeline.spec_differences(load_spec(args.spec), run_id, path, ignore=("limits",)):
        log.warning(
            f"{args.spec} differs from run {run_id}'s stored spec (" + "; ".join(differ) + "); the resumed "
            "run keeps its stored spec"
        )
    metrics = args.metric or list(spec.metrics)
    if args.submit:
        outcomes = _submit(instance, run_id, spec, metrics, path, args)
        if outcomes is None:
            return 0
    else:
        # --warehouse reaches the stages as the warehouse resource's path (--parallel: in other processes)
        chosen = {"resources": {"warehouse": {"config": {"path": str(path)}}}} if args.warehouse else {}
        outcomes = evaluate_run(
            instance,
            run_id,
            spec.metrics,
            metrics,
            {"aip/spec": spec.name},
            run_config={"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}, **chosen},
            on_start=lambda m: log.info(f"materialising {run_id} × {m}"),
            parallel=args.parallel,
            quiet=args.quiet,
            verbose=args.verbose,
        )
    failed: dict[str, str] = {}  # metric -> what stopped it (jobs.Outcome.kind)
    for out in outcomes:
        if out.interrupted:  # the run stops here (cmd_run says how to resume)
            continue
        if out.gate_failed:  # its stages ran and wrote their tables; the Dagster run is marked failed for it
            log.debug(f"{out.metric}: gate failed (Dagster run {out.dagster_run_id} is marked failed)")
        elif not out.success:
            failed[out.metric] = out.kind or "bug"
            head = {
                "operational": "stopped by a failure outside aip-eval",
                "limit": "stopped at the run's limits",
                "input": "stopped on bad input",
            }.get(failed[out.metric], "stage failed (a bug in aip-eval)")
            log.error(f"{out.metric}: {head} (Dagster run {out.dagster_run_id}): " + " | ".join(out.errors))
            if failed[out.metric] == "bug":
                where = save_traceback(
                    "\n\n".join(out.tracebacks) or "\n".join(out.errors),
                    f"{run_id}-{out.metric}",
                    data_dir() / "errors",
                )
                log.error(f"{out.metric}: the traceback is saved in {where}; please report it with that file")
    if interrupts.requested():
        raise interrupts.Interrupted()
    summary = run_summary(run_id, path, metrics)  # the metrics this command ran, and no other
    from .findings import run_findings

    summary["findings"] = [f.to_dict() for f in run_findings(run_id, list(summary["metrics"]), path)]
    from .warehouse import lake

    summary["warehouse"] = lake.where() if lake.enabled() else str(path)
    summary["failed_metrics"] = list(failed)
    summary["failed_why"] = failed  # metric -> operational, limit, input or bug
    if args.json:
        print(json.dumps(summary, indent=2, default=str))
    else:
        from .report import report_line

        print_summary(summary)
        print(
            f"\nWarehouse: {summary['warehouse']}\nTry: aip-eval sql \"SELECT * FROM v_run_summary WHERE run_id = '{run_id}'\""
            + report_line(run_id, path)
        )
    if failed:
        kinds = set(failed.values())  # the worst decides: a bug, then an outage, then a limit, then bad input
        code = next(
            c
            for k, c in (
                ("bug", EXIT_INTERNAL),
                ("operational", EXIT_OPERATIONAL),
                ("limit", EXIT_LIMIT),
                ("input", EXIT_BAD_INPUT),
            )
            if k in kinds
        )
        if code in (EXIT_OPERATIONAL, EXIT_LIMIT):
            log.error(f"run {run_id}: {resumable.get('hint') or 'resume it with --run-id'}")
        return code
    below = [m for m in metrics if not summary["metrics"][m].get("passed")]  # the metrics this command ran
    if below:
        for m in below:
            log.error(f"{m}: gate failed: {summary['metrics'][m].get('gate_reason')}")
        return 1
    return 0


def _submit(instance, run_id: str, spec, metrics, path, args):
    """`run --submit`: queue one evaluate run per metric for the daemon; None with --detach, else
    each metric's Outcome as its run ends (the report is written here after the last)."""
    from . import run_queue
    from .jobs import _write_report
    from .partitions import register_partitions
    from .warehouse.lake import enabled as lake_enabled

    register_partitions(instance, run_id, spec.metrics)
    # local mode: the daemon's runs write this warehouse file, wherever the daemon was started;
    # a lake is found by every worker from its own environment
    run_config = {} if lake_enabled() else {"resources": {"warehouse": {"config": {"path": str(path)}}}}
    queued = run_queue.submit(instance, run_id, metrics, {"aip/spec": spec.name, "aip/trigger": "submit"}, run_config)
    for metric, dagster_run, new in queued:
        log.info(
            f"{run_id} × {metric}: "
            + ("queued as" if new else "already queued or running as")
            + f" Dagster run {dagster_run}"
        )
    if not run_queue.daemon_alive(instance):
        log.warning(
            "no Dagster daemon has reported in the last minute: the runs wait in the queue until one runs "
            "on this instance (`aip-eval daemon` or `aip-eval ui`, with the same data folder or lake)"
        )
    if args.detach:
        print(
            f"queued {sum(new for _, _, new in queued)} run(s) of {run_id}; follow them in the Dagster UI "
            f"(`aip-eval ui`), then: aip-eval sql \"SELECT * FROM v_run_summary WHERE run_id = '{run_id}'\""
        )
        return None

    def outcomes():
        try:
            yield from run_queue.wait(
                instance,
                {m: r for m, r, _ in queued},
                on_status=lambda m, r, st: log.info(f"{run_id} × {m}: {st.lower()} (Dagster run {r})"),
            )
        except KeyboardInterrupt:
            log.warning(f"stopped waiting: the queued runs of {run_id} go on (the Dagster UI shows them)")
            raise
        _write_report(run_id)  # here too: the runs wrote theirs where they ran

    return outcomes()


def _dagster(what: str, extra: list[str]) -> int:
    """Run a Dagster command on this project's instance (``prepare_home``: Postgres in shared mode,
    with the storage URL in the environment it inherits) and this code location, in this process."""
    from .dagster_home import configured_storage_url, prepare_home, shared
    from .run_queue import MODULE, location_name
    from .shared_state import describe

    home = prepare_home()
    url = configured_storage_url()
    where = f"Postgres {describe(url)}" if shared() and url else f"{home}"
    log.info(f"{what}: Dagster instance {home} (storage: {where}), code location {location_name()}")
    # this module, under the name queued runs give it (beside the temp files: DAGSTER_HOME may be read-only)
    import hashlib
    import tempfile

    text = (
        f"load_from:\n  - python_module:\n      module_name: {MODULE}\n"
        f"      location_name: {json.dumps(location_name())}\n"
    )
    workspace = Path(tempfile.gettempdir()) / f"aip-workspace-{hashlib.sha256(text.encode()).hexdigest()[:12]}.yaml"
    if not workspace.exists() or workspace.read_text() != text:
        tmp = workspace.with_name(f".{workspace.name}.{os.getpid()}")
        tmp.write_text(text)
        os.replace(tmp, workspace)
    # Dagster's command without its notices about its own API (dagster_cli.py)
    cmd = [sys.executable, "-m", "aip_assets.dagster_cli", *{"daemon": ["daemon", "run"], "ui": ["dev"]}[what]]
    cmd += ["-w", str(workspace)]
    sys.stdout.flush()
    sys.stderr.flush()
    # this process becomes Dagster's: a service manager's SIGTERM or a Ctrl-C reaches it, and no
    # daemon is left behind without its parent
    os.execv(cmd[0], cmd + extra)
    return 0  # not reached


def cmd_daemon(args) -> int:
    return _dagster("daemon", [])


def start_report_server(host: str, port: int | None = None) -> tuple[subprocess.Popen | None, str]:
    """Start the report server beside the UI, in a child process that ends when this process (or
    the program it becomes: `dagster dev`) ends, so the metadata's report and viewer links open.

    Args:
        host: The interface to listen on.
        port: Its port (default ``AIP_REPORT_PORT``).

    Returns:
        (the child process, or None when it could not listen; the line to print about it).
    """
    from .report import report_port

    port = report_port() if port is None else port
    code = f"from aip_assets.report.server import serve_beside; serve_beside({os.getpid()}, {host!r}, {port})"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    assert child.stdout is not None
    said = child.stdout.readline().strip()
    child.stdout.close()
    if said.startswith("ready "):
        return child, f"reports: http://{host}:{said.split()[1]}/ (the metadata's report_url and viewer links)"
    child.wait()
    why = said.removeprefix("busy ") or f"it exited with {child.returncode}"
    return None, (
        f"note: no report server started on {host}:{port} ({why}); if another `aip-eval report --serve` "
        "is not serving there, set AIP_REPORT_PORT"
    )


def cmd_ui(args) -> int:
    _, line = start_report_server(args.host)
    print(line, flush=True)
    return _dagster("ui", ["--host", args.host, "--port", str(args.port)])


def cmd_sql(args) -> int:
    from . import warehouse as wh

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
    from . import pipeline

    runs = pipeline.list_runs()
    print(runs.to_string(index=False) if len(runs) else "(no runs)")
    return 0


def cmd_migrate(args) -> int:
    from . import warehouse as wh
    from .warehouse import lake

    copied = wh.migrate_into_lake(args.source or wh.default_path())
    runs = copied.pop("runs")
    calls = copied.pop("journaled calls")
    print(
        f"{runs} run(s) copied into the {lake.where()}"
        + (": " + ", ".join(f"{t} {n}" for t, n in copied.items() if n) if runs else " (every run was there already)")
        + (f"; {calls} journaled call(s) into its journal" if calls else "")
    )
    return 0


def cmd_report(args) -> int:
    from .report import default_out, report_url, serve_reports, write_report

    path = Path(args.warehouse).resolve() if args.warehouse else None
    if not args.run and not args.serve:
        raise AipError("report needs a RUN (see `aip-eval runs`), or --serve to serve the reports folder")
    from .report import ROWS_PER_METRIC

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


def cmd_compare(args) -> int:
    from . import compare, compare_table

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
        from .report import default_out, report_url
        from .report.comparison import write_comparison

        page = write_comparison(run_a, run_b, df, warnings, args.alpha, out=args.html or None, path=path)
        print(f"comparison page: {page}", file=sys.stderr)
        if page.parent == default_out("x", path).parent.resolve():
            print(f"served by `aip-eval report --serve` at {report_url(page)}", file=sys.stderr)
    return 1 if args.fail_on_drop and drops else 0


def cmd_label_export(args) -> int:
    from . import label_files

    path = Path(args.warehouse).resolve() if args.warehouse else None
    out = label_files.export(
        args.run,
        args.metric,
        args.n,
        out=args.out,
        show_verdict=args.show_verdict,
        seed=args.seed,
        path=path,
        force=args.force,
    )
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(
        f"wrote {out['rows']} judgement(s) of {out['run_id']} × {out['metric']} to {out['file']} (seed {out['seed']}; "
        f"the judge's verdict {'shown' if out['verdict_shown'] else 'hidden'})"
    )
    print(f"  {'judge category':<26}{'judged':>8}{'sampled':>9}   (equal allocation, capped at each category's size)")
    for c, s in out["strata"].items():
        print(f"  {c:<26}{s['judged']:>8}{s['sampled']:>9}")
    print(
        f"Fill in human_label (one of the row's `allowed`), labeller and note, then: aip-eval label import {out['file']}"
    )
    return 0


def cmd_label_import(args) -> int:
    from . import label_files

    path = Path(args.warehouse).resolve() if args.warehouse else None
    out = label_files.import_labels(args.file, labeller=args.labeller, path=path)
    if args.json:
        print(json.dumps(out, indent=2, default=str))
    else:
        for line in label_files.summary_lines(out):
            print(line)
    return 0


def cmd_validate(args) -> int:
    from . import pipeline
    from .runspec import load_spec

    spec = load_spec(args.spec)
    rows = pipeline.validate_datasets(spec)
    print(
        json.dumps(
            {"spec": spec.name, "dataset_rows": rows[spec.dataset], "datasets": rows, "resolved": spec.shown()},
            indent=2,
        )
    )
    return 0


def cmd_templates(args) -> int:
    from .catalog.templates import catalogue

    extra = {}
    if args.spec:
        from .runspec import load_spec

        extra = load_spec(args.spec).templates
    for family, items in catalogue(extra).items():
        if args.family and family != args.family:
            continue
        for t in items:
            print(f"{t.template_id:<32} {t.category:<14} {t.text}")
    return 0


def cmd_perturb(args) -> int:
    from .recipes import perturb_file
    from .runspec import Connection

    conn = None
    if args.paraphrase_base_url:
        conn = Connection(
            provider="openai",
            base_url=args.paraphrase_base_url,
            model=args.paraphrase_model,
            api_key_env=args.paraphrase_api_key_env,
        )
    types = args.types.split(",") if args.types else None
    try:
        out = perturb_file(args.seed_dataset, args.out, types, args.seed, args.variants_per_type, conn)
    except ValueError as e:
        raise AipError(str(e)) from None
    print(json.dumps(out, indent=2))
    return 0


def cmd_answer(args) -> int:
    from .recipes import answer_file

    profile = _profile(args.profile)
    try:
        n = answer_file(args.dataset, args.out, profile)
    except ValueError as e:
        raise AipError(str(e)) from None
    print(f"answered {n} rows with the builtin model ({profile.name}) -> {args.out}")
    return 0


def _profile(text: str | None):
    """A builtin profile from --profile JSON; a malformed one is the user's input error."""
    from pydantic import ValidationError

    from .errors import format_validation_error
    from .runspec import BuiltinProfile

    if not text:
        return BuiltinProfile()
    try:
        return BuiltinProfile.model_validate(json.loads(text))
    except json.JSONDecodeError as e:
        raise AipError(f"--profile: not valid JSON: {e}") from None
    except ValidationError as e:
        raise AipError("--profile: " + format_validation_error(e).replace("\n", "; ")) from None


def cmd_serve(args) -> int:
    from .metrics import base as _metrics  # noqa: F401  (registers the metrics' builtin judge answers)
    from .models.builtin import BuiltinServer

    profile = _profile(args.profile)
    api_key = os.environ.get(args.api_key_env) if args.api_key_env else None
    server = BuiltinServer(
        profile,
        latency_ms=args.latency_ms,
        fail_rate=args.fail_rate,
        fail_substring=args.fail_substring,
        api_key=api_key,
        batch_seconds=args.batch_seconds,
        batch_expire_rate=args.batch_expire_rate,
    )
    print(
        f"builtin model ({profile.name}) serving OpenAI-compatible API at http://{args.host}:{args.port}/v1", flush=True
    )
    server.serve_forever(args.host, args.port)
    return 0


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

        outage = _outage(e)
        if outage is not None:  # Dagster's storage in Postgres went away (another command than run)
            print(f"error: {outage}", file=sys.stderr)
            return EXIT_OPERATIONAL
        known = _known_failure(e)  # a damaged warehouse file, a full disk: said, not a bug
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


if __name__ == "__main__":
    sys.exit(main())
