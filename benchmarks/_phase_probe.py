"""`aip-eval` with its phases timed: ``python benchmarks/_phase_probe.py run SPEC --json --quiet``.

What bench_phases.py runs in place of ``python -m aip_assets.cli``. It imports the CLI (timed),
then the modules the run imports later (timed apart: the CLI imports them lazily, within its
phases), wraps the functions that make the run's phases (each wrapper records its start and end,
the stage it ran in, and the SUT and judge servers' request counts at both ends), and calls the
CLI's ``main``. At exit the intervals go as JSON to ``$AIP_PHASES_OUT``. A function this code no
longer has (a module split or renamed) is listed under ``not_found`` and its phase is missing.
"""

from __future__ import annotations

import time

T0_WALL, T0 = time.time(), time.perf_counter()  # noqa: E401 - first, before any import

import atexit  # noqa: E402

# atexit runs its handlers last registered first: this one, registered before any of the
# project's (the warehouse's and Dagster's storage release their databases), runs after them all
atexit.register(lambda: globals()["dump"]())
import functools  # noqa: E402
import importlib  # noqa: E402
import inspect  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import urllib.request  # noqa: E402

EVENTS: list[dict] = []
STAGE: list[str] = []  # the stage running (run_stage), for the phases inside it
NOT_FOUND: list[str] = []
SERVERS = [u for u in os.environ.get("AIP_PHASES_SERVERS", "").split(",") if u]


def now() -> float:
    return time.perf_counter() - T0


def counts() -> list[int]:
    out = []
    for url in SERVERS:
        try:
            with urllib.request.urlopen(url.removesuffix("/v1") + "/stats", timeout=5) as r:
                out.append(json.loads(r.read()).get("requests", 0))
        except OSError:
            out.append(-1)
    return out


def record(
    label: str,
    t0: float,
    t1: float,
    c0: list[int] | None = None,
    c1: list[int] | None = None,
    cpu: float | None = None,
    thread_cpu: float | None = None,
) -> None:
    """An interval of ``label``: wall seconds since the probe began, the process's CPU seconds within
    it (every thread's) and, for a wrapped call, the CPU seconds of the thread that ran it."""
    ev = {"label": label, "start": t0, "end": t1, "stage": STAGE[-1] if STAGE else None}
    if cpu is not None:
        ev["cpu"] = cpu
    if thread_cpu is not None:
        ev["thread_cpu"] = thread_cpu
    if c0 is not None and c1 is not None:
        ev["requests"] = [b - a for a, b in zip(c0, c1, strict=True)]
    EVENTS.append(ev)


t, p = now(), time.process_time()
import aip_assets.cli as cli  # noqa: E402

record("imports: aip_assets.cli (what the CLI imports at start)", t, now(), cpu=time.process_time() - p)
LATER = [
    "aip_assets.pipeline",
    "aip_assets.jobs",
    "aip_assets.dagster_home",
    "aip_assets.runspec",
    "aip_assets.definitions",
    "aip_assets.assets.stages",
    "aip_assets.findings",
    "aip_assets.history",
    "aip_assets.report",
    "aip_assets.checks",
    "aip_assets.metrics.decision_flip",
    "aip_assets.warehouse",
]
t, p = now(), time.process_time()
for name in LATER:
    try:
        importlib.import_module(name)
    except ImportError:
        NOT_FOUND.append(name)
record(
    "imports: the run's other modules (the CLI imports them within its phases)", t, now(), cpu=time.process_time() - p
)


def wrap(fn, label, count: bool, stage_arg: bool):
    if inspect.isgeneratorfunction(fn):

        @functools.wraps(fn)
        def gen(*a, **k):
            it = fn(*a, **k)
            while True:
                t0, c0, p0, h0 = now(), counts() if count else None, time.process_time(), time.thread_time()
                try:
                    item = next(it)
                except StopIteration:
                    record(
                        label,
                        t0,
                        now(),
                        c0,
                        counts() if count else None,
                        time.process_time() - p0,
                        time.thread_time() - h0,
                    )
                    return
                record(
                    label, t0, now(), c0, counts() if count else None, time.process_time() - p0, time.thread_time() - h0
                )
                yield item

        return gen

    @functools.wraps(fn)
    def plain(*a, **k):
        name = label
        if stage_arg:
            STAGE.append(a[0] if a else k.get("stage"))
            name = f"{label} {STAGE[-1]}"
        t0, c0, p0, h0 = now(), counts() if count else None, time.process_time(), time.thread_time()
        try:
            return fn(*a, **k)
        finally:
            record(name, t0, now(), c0, counts() if count else None, time.process_time() - p0, time.thread_time() - h0)
            if stage_arg:
                STAGE.pop()

    return plain


def patch(path: str, label: str, count: bool = False, stage_arg: bool = False) -> None:
    """Wrap ``module:attr`` (or ``module:Class.method``) wherever the same object is bound."""
    mod_name, attr = path.split(":")
    try:
        owner = importlib.import_module(mod_name)
        *cls, name = attr.split(".")
        for c in cls:
            owner = getattr(owner, c)
        orig = getattr(owner, name)
    except (ImportError, AttributeError):
        NOT_FOUND.append(path)
        return
    w = wrap(orig, label, count, stage_arg)
    setattr(owner, name, w)
    if not cls:
        for m in list(sys.modules.values()):
            try:
                if getattr(m, name, None) is orig:
                    setattr(m, name, w)
            except Exception:  # noqa: BLE001, S112 - a lazy module that refuses getattr
                continue


# the CLI's phases (cli.run._run), in order
patch("aip_assets.runspec:load_spec", "spec loaded and validated")
patch("aip_assets.dagster_home:use_project_of", "project folders chosen")
patch("aip_assets.jobs:evaluate", "definitions: the evaluate job resolved")
patch("aip_assets.pipeline:validate_datasets", "datasets validated")
patch("aip_assets.preflight:preflight", "endpoint checks (preflight)", count=True)
patch("aip_assets.dagster_home:get_instance", "Dagster instance opened")
patch("aip_assets.preflight:examine", "judge exam", count=True)
patch("aip_assets.pipeline:register_run", "registration (warehouse)")
patch("aip_assets.jobs:evaluate_run", "Dagster: the metrics' runs", count=True)
patch("aip_assets.summary:run_summary", "summary read (run_summary)")
patch("aip_assets.findings:run_findings", "findings")
# inside the Dagster run
patch("aip_assets.partitions:register_partitions", "Dagster: partitions registered")
patch("aip_assets.jobs:_execute", "Dagster: one metric's run (execute)")
patch("aip_assets.pipeline:run_stage", "stage", count=True, stage_arg=True)
# inside a stage
patch("aip_assets.pipeline:load_run", "run read back (load_run)")
patch("aip_assets.preflight:stage_endpoint_check", "endpoint check at the stage's start", count=True)
patch("aip_assets.pipeline:_drain_async", "model calls (the metric's sample/judge)", count=True)
patch("aip_assets.pipeline:finished_aggregate", "analysis (aggregate, gate, judges' checks)")
patch("aip_assets.staging:StagedTables.add", "rows staged to Parquet")
patch("aip_assets.staging:StagedTables.commit", "warehouse write (the stage's commit)")
patch("aip_assets.history:check_regression", "regression check against the previous run")
patch("aip_assets.pipeline:_aggregation_meta", "aggregation's summary read back")
patch("aip_assets.assets.stages:score_metadata", "score metadata for Dagster (and the report)")
patch("aip_assets.report:write_report", "report written (HTML)")
patch("aip_assets.checks:evaluate", "asset checks")
patch("aip_assets.models.journal_pg:open_journal", "journal opened")


def dump() -> None:
    """The last atexit handler: the intervals written to ``$AIP_PHASES_OUT``."""
    record("exit: atexit handlers done", now(), now(), cpu=time.process_time())  # the process's CPU so far
    out = os.environ.get("AIP_PHASES_OUT")
    if out:
        with open(out, "w") as f:
            json.dump({"t0_wall": T0_WALL, "events": EVENTS, "not_found": NOT_FOUND}, f, indent=1)


def first_at_exit() -> None:  # registered after the project's imports: runs before their handlers
    record("exit: atexit handlers start", now(), now(), cpu=time.process_time())  # the process's CPU so far


atexit.register(first_at_exit)

if __name__ == "__main__":
    main = cli.main

    def probed_main() -> int:
        code = main(sys.argv[1:])
        record("cli.main returned", now(), now(), cpu=time.process_time())  # the process's CPU so far
        return code

    cli.main = probed_main
    cli.entry()  # the way out the command takes (its exit handlers, then os._exit)
