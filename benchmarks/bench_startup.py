"""A small run's start-up: process start to the run registered (the moment the first Dagster run
starts), for one or more checkouts, alternated round by round.

The small run of bench_peers.py (the demo's decision flip alone, SUT and judge each a
``serve-builtin --latency-ms L``). Each timed process is ``aip-eval run spec.yaml --json --quiet``
with ``pipeline.register_run`` wrapped: once it returns, the process prints its CPU seconds (user
+ system, every thread) and ends (``os._exit``). Its wall time is measured from outside, from the
process's start. Every round gets a new data folder: empty (a new project), or with
``--existing`` a copy of one a whole run of the same checkout made first (a project that has run
before: warehouse, Dagster storage, journal).

    python benchmarks/bench_startup.py [--rounds 3] [--existing] [--latency-ms 100] old=/work/main new=.

Prints each round and, per checkout, the wall and CPU medians with the load average.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_peers import DROPPED, small_spec, start_server  # noqa: E402

PROBE = """
import os, sys
import aip_assets.pipeline as pipeline
real = pipeline.register_run
def registered(*a, **k):
    out = real(*a, **k)
    t = os.times()
    print(f"STARTUP-CPU {t.user + t.system:.3f}", flush=True)
    os._exit(0)
pipeline.register_run = registered
from aip_assets import cli
cli.entry()  # as the command runs (its own process: aip-eval run pauses the cycle collector for its start-up)
"""


def timed(checkout: Path, data: Path, spec: Path) -> tuple[float, float]:
    env = {k: v for k, v in os.environ.items() if k not in DROPPED and not k.startswith("AIP_SHARED")}
    env.update(PYTHONPATH=str(checkout), AIP_DATA_DIR=str(data))
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", PROBE, "run", str(spec), "--json", "--quiet"],
        env=env,
        cwd=spec.parent,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - t0
    cpu = [line.split()[1] for line in out.stdout.splitlines() if line.startswith("STARTUP-CPU")]
    if not cpu:
        raise SystemExit(f"{checkout}: the run did not register (exit {out.returncode}): {out.stderr[-1500:]}")
    return wall, float(cpu[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkouts", nargs="+", help="name=path of each checkout (its code is run with PYTHONPATH)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--existing", action="store_true", help="a project that has run before (see above)")
    ap.add_argument("--latency-ms", type=float, default=100)
    args = ap.parse_args()
    checkouts = {n: Path(p).resolve() for n, p in (c.split("=", 1) for c in args.checkouts)}
    work = Path(tempfile.mkdtemp(prefix="aip-startup-"))
    sut, sut_url = start_server(None, args.latency_ms)
    judge, judge_url = start_server(None, args.latency_ms)
    results: dict[str, list[tuple[float, float]]] = {n: [] for n in checkouts}
    loads = []
    try:
        spec = work / "spec.yaml"
        spec.write_text(yaml.safe_dump(small_spec(sut_url, judge_url, 64)))
        for name, checkout in checkouts.items():
            if args.existing:  # one whole run, its normal exit: the project as a user's is
                env = {k: v for k, v in os.environ.items() if k not in DROPPED and not k.startswith("AIP_SHARED")}
                env.update(PYTHONPATH=str(checkout), AIP_DATA_DIR=str(work / f"made-{name}"))
                subprocess.run(
                    [sys.executable, "-m", "aip_assets.cli", "run", str(spec), "--json", "--quiet"],
                    env=env,
                    cwd=work,
                    capture_output=True,
                )
            timed(checkout, work / f"warm-{name}", spec)  # not counted: the files in the OS's cache
        for r in range(args.rounds):
            for name, checkout in checkouts.items():
                data = work / f"{name}-{r}"
                if args.existing:
                    shutil.copytree(work / f"made-{name}", data)
                wall, cpu = timed(checkout, data, spec)
                loads.append(os.getloadavg()[0])
                results[name].append((wall, cpu))
                print(f"{name} round {r + 1}: wall {wall:.2f} s, CPU {cpu:.2f} s, load {loads[-1]:.1f}", flush=True)
    finally:
        sut.terminate()
        judge.terminate()
        shutil.rmtree(work, ignore_errors=True)
    kind = "a project that has run before" if args.existing else "a new project"
    print(f"\nstart-up ({kind}), {args.rounds} rounds alternated, load {min(loads):.1f}-{max(loads):.1f}:")
    for name, rows in results.items():
        print(
            f"  {name}: wall median {statistics.median(w for w, _ in rows):.2f} s {[round(w, 2) for w, _ in rows]}, "
            f"CPU median {statistics.median(c for _, c in rows):.2f} s {[round(c, 2) for _, c in rows]}"
        )


if __name__ == "__main__":
    main()
