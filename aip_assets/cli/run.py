"""`aip-eval run`: register a run of a spec (or resume one) and evaluate its metrics here, in
worker processes (`--parallel`) or through the daemon's queue (`--submit`); then the summary and
the exit code."""

from __future__ import annotations

import gc
import json
import logging
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from ..errors import (
    EXIT_BAD_INPUT,
    EXIT_INTERNAL,
    EXIT_LIMIT,
    EXIT_OPERATIONAL,
    AipError,
    OperationalError,
    save_traceback,
)
from ..settings import data_dir, override
from .dry_run import dry_exam, dry_run
from .failures import known_failure, outage_of
from .summary import print_summary

log = logging.getLogger("aip_assets")
T = TypeVar("T")

# Set by ``cli.entry``: this process is aip-eval's own command, so what its start-up loads lives until it ends.
OWN_PROCESS = False


def _pause_collector() -> bool:
    """Python's cycle collector paused for the start-up of aip-eval's own process (``OWN_PROCESS``):
    the ~2,200 modules a run loads and Dagster's instance are some million objects that live until
    the process ends, and every full collection scanned them all again. The small run of
    bench_peers.py made 5-6 full collections, 0.25-0.44 s of its 5.5 s of CPU, 0.39-0.60 s with the
    young ones; paused, then frozen: 1 full, 0.07-0.08 s in all (``gc.callbacks``, 2026-12-07).
    True when paused (then :func:`_resume_collector` resumes it). A test that calls ``main`` in its
    own process leaves the collector as it is."""
    if not OWN_PROCESS or not gc.isenabled():
        return False
    gc.disable()
    return True


def _resume_collector(paused: bool) -> None:
    """The collector resumed after the start-up, the objects that start-up made frozen first
    (``gc.freeze``: kept out of every later collection; they live until the process ends anyway).
    The run's own objects are collected as ever. Once only: a second call does nothing."""
    if paused and not gc.isenabled():
        gc.freeze()
        gc.enable()


def _chosen_warehouse(args):
    """``--warehouse`` as this process's warehouse for the command (``settings.override``)."""
    return override(warehouse=Path(args.warehouse).resolve()) if args.warehouse else override()


def cmd_run(args) -> int:
    """A Ctrl-C or SIGTERM stops the run (interrupts.py): no stage or metric starts after it, the
    calls answered are journaled, and it exits 130 saying how to resume."""
    from .. import interrupts

    resumable: dict[str, str] = {}
    paused = _pause_collector()
    with interrupts.handled():
        try:
            with _chosen_warehouse(args):
                code = _run(args, resumable, lambda: _resume_collector(paused))
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
            outage = outage_of(e)  # Dagster's storage in Postgres went away: exit 5 as well
            known = known_failure(e) if outage is None else outage  # a damaged warehouse, a full disk
            if known is None:
                raise
            if not isinstance(known, OperationalError):
                raise known from None
            raise OperationalError(_with_hint(known, resumable)) from None
        finally:
            _resume_collector(paused)  # a start-up that failed or was stopped: resumed all the same
        print("interrupted; " + resumable["hint"] if resumable else "interrupted", file=sys.stderr)
        return interrupts.EXIT_CODE


def _with_hint(e: Exception, resumable: dict[str, str]) -> str:
    """An operational failure's message with what to do: resume the registered run, else (stopped
    before anything was registered) run the command again once what failed is back."""
    from ..errors import DiskFull

    return (
        f"{e}; {resumable['hint']}"
        if resumable.get("hint")
        else f"{e}; nothing was registered or written: run the same command again once "
        + ("there is space" if isinstance(e, DiskFull) else "it is back")
    )


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


def _handing_over(outcomes: Iterator[T], run_id: str, answered_at: float) -> Iterator[T]:
    """The metrics' outcomes as they are evaluated (``jobs.evaluate_run``, lazy), with the endpoint
    check just made handed over to the first of them to sample (``preflight.hand_over_check``)."""
    from ..preflight import hand_over_check

    with hand_over_check(run_id, answered_at):
        yield from outcomes


def _evaluate_job():
    """The evaluate job resolved; ``jobs.evaluate_run``, which runs it."""
    from ..jobs import evaluate, evaluate_run

    evaluate()
    return evaluate_run


def _run(args, resumable: dict[str, str], started: Callable[[], None] = lambda: None) -> int:
    """``started``: called once the start-up is done (the run registered or resumed), before the
    metrics are evaluated."""
    from .. import interrupts, pipeline
    from .. import warehouse as wh
    from ..dagster_home import get_instance, use_project_of
    from ..estimate import update_limits
    from ..preflight import examine, preflight, record_forms
    from ..runspec import load_spec
    from ..summary import run_summary

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
        return dry_exam(spec, args.json) if args.exam else dry_run(spec, args.json)
    run_id = args.run_id
    resume = run_id is not None and pipeline.run_exists(run_id, path)
    if resume:
        spec, _ = pipeline.load_run(run_id, path)
        log.info(f"resuming run {run_id} with its stored spec")
        resumable["hint"] = _resume_hint(args, run_id)
        interrupts.set_hint(resumable["hint"])
        only_configured(f"run {run_id}", "; a resumed run keeps the metrics of its stored spec")
    from ..shared_state import shared_state_url

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
        answered_at = time.monotonic()
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
        from ..run_queue import require_queue

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
    started()
    metrics = args.metric or list(spec.metrics)
    if args.submit:
        outcomes = _submit(instance, run_id, spec, metrics, path, args)
        if outcomes is None:
            return 0
    else:
        # --warehouse reaches the stages as the warehouse resource's path (--parallel: in other processes)
        chosen = {"resources": {"warehouse": {"config": {"path": str(path)}}}} if args.warehouse else {}
        outcomes = _handing_over(
            evaluate_run(
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
            ),
            run_id,
            answered_at,
        )
    failed: dict[str, str] = {}  # metric -> what stopped it (jobs.Outcome.kind)
    known = {}  # metric -> the findings its aggregation read in this run (jobs.Outcome.findings)
    for out in outcomes:
        if out.findings is not None:
            known[out.metric] = out.findings
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
    from ..findings import findings_of

    # the aggregations' findings when they read every metric's, else read (findings.findings_of)
    summary["findings"] = [f.to_dict() for f in findings_of(run_id, list(summary["metrics"]), path, known)]
    from ..warehouse import lake

    summary["warehouse"] = lake.where() if lake.enabled() else str(path)
    summary["failed_metrics"] = list(failed)
    summary["failed_why"] = failed  # metric -> operational, limit, input or bug
    if args.json:
        print(json.dumps(summary, indent=2, default=str))
    else:
        from ..report import report_line

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
    from .. import run_queue
    from ..jobs import _write_report
    from ..partitions import register_partitions
    from ..warehouse.lake import enabled as lake_enabled

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
