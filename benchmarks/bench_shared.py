"""Shared mode against local mode: the demo with 1, 2 and 4 workers, write conflicts, query latency.

A throwaway PostgreSQL (``aip_assets_tests/pg.py``: Debian's ``initdb`` and ``pg_ctl``) holds the
shared state and the DuckLake's catalog; the lake's Parquet files go to a temporary folder. The
builtin model (the demo's SUT profile; it also answers the judge prompts) is served over HTTP
with ``serve-builtin --latency-ms L`` in its own process, as in ``bench_parallel.py``. For each
mode and worker count P,

    python -m aip_assets.cli run spec.yaml --json --parallel P

runs in a fresh data folder (shared mode: a fresh database and lake folder too); its metrics run
P at a time, each in a worker process writing its own partitions. Mode ``queued`` is shared mode
through Dagster's queue: a DAGSTER_HOME with the shared settings and at most P runs at once, a
daemon (``aip-eval daemon``, started and ready before the clock starts), and
``aip-eval run spec.yaml --json --submit``; each metric is a Dagster run the daemon launches in a
process of its own (Dagster's default run launcher). Reported per run: wall time,
server requests, and in shared mode the DuckLake commits (snapshots in the catalog) and the
write conflicts retried (counted from the workers' log lines), so the retry rate; whether every
metric's score and interval equal local mode's at P = 1. Then README queries, each timed through
``aip-eval sql`` (a new process: start-up included) and in one process (``warehouse.query``, the
median of 5 after a first) in both modes.

This checkout's code under this interpreter (``sys.executable``, the checkout first on PYTHONPATH).

    python benchmarks/bench_shared.py [--latency-ms 100] [--workers 1,2,4] [--max-connections 512]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import yaml

CHECKOUT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(CHECKOUT))
from _common import run_header, write_results  # noqa: E402
from bench_parallel import demo_spec, env, free_port, stats, wait_for_server  # noqa: E402

OUT_DIR = Path(__file__).resolve().parent / "out"
CONFLICT_LINE = "another worker committed to the same table first"
QUERIES = {
    "v_run_summary": "SELECT * FROM v_run_summary ORDER BY created_at DESC",
    "v_flipped_pairs": "SELECT run_id, axis, value_a, value_b, decision_a, decision_b, response_a, response_b, "
    "reasoning FROM v_flipped_pairs ORDER BY run_id DESC, axis",
    "v_call_stats": "SELECT * FROM v_call_stats",
    "v_pair_verdicts": "SELECT * FROM v_pair_verdicts WHERE label = 'incidental_difference'",
}
IN_PROCESS = """
import json, statistics, sys, time
from aip_assets import warehouse as wh
out = {}
for name, sql in json.loads(sys.argv[1]).items():
    wh.query(sql)
    times = []
    for _ in range(5):
        t = time.perf_counter(); wh.query(sql); times.append(time.perf_counter() - t)
    out[name] = statistics.median(times) * 1000
print(json.dumps(out))
"""


def new_database(admin_url: str) -> str:
    import psycopg

    name = f"bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_url, autocommit=True) as con:
        con.execute(f"CREATE DATABASE {name}")
    return admin_url.rsplit("/", 1)[0] + "/" + name


def snapshots(url: str) -> int:
    import psycopg

    with psycopg.connect(url) as con:
        return con.execute("SELECT count(*) FROM aip_lake.ducklake_snapshot").fetchone()[0]


def start_daemon(home: Path, runs: int, environ: dict, cwd: Path):
    """`aip-eval daemon` on a DAGSTER_HOME with the shared settings and ``runs`` runs at once,
    returned once its queue has reported a heartbeat: (the process, its log file)."""
    from aip_assets.dagster_home import instance_settings

    home.mkdir(parents=True)
    (home / "dagster.yaml").write_text(instance_settings(home, shared=True, max_runs=runs))
    log = home / "daemon.log"
    environ = {**environ, "DAGSTER_HOME": str(home)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "aip_assets.cli", "daemon"],
        env=environ,
        cwd=cwd,
        stdout=open(log, "wb"),
        stderr=subprocess.STDOUT,
    )
    probe = (
        "from aip_assets.dagster_home import get_instance; from aip_assets.run_queue import daemon_alive; "
        "import sys; sys.exit(0 if daemon_alive(get_instance()) else 1)"
    )
    t0 = time.monotonic()
    while subprocess.run([sys.executable, "-c", probe], env=environ, cwd=cwd, capture_output=True).returncode != 0:
        if proc.poll() is not None or time.monotonic() - t0 > 300:
            raise SystemExit(f"the daemon did not start:\n{log.read_text()[-3000:]}")
        time.sleep(1)
    return proc, log


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--latency-ms", type=float, default=100.0)
    ap.add_argument("--workers", default="1,2,4")
    ap.add_argument("--max-connections", type=int, default=512)
    ap.add_argument("--out")
    args = ap.parse_args()
    from aip_assets_tests.pg import Postgres, unavailable

    why = unavailable()
    if why:
        raise SystemExit(f"shared mode needs PostgreSQL: {why}")
    header = run_header()
    levels = [int(x) for x in args.workers.split(",")]
    demo = yaml.safe_load((CHECKOUT / "data" / "runs" / "demo.yaml").read_text())
    port = free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "aip_assets.cli",
            "serve-builtin",
            "--port",
            str(port),
            "--latency-ms",
            str(args.latency_ms),
            "--profile",
            json.dumps(demo["sut"]["profile"]),
        ],
        env=env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/v1"
    work = Path(tempfile.mkdtemp(prefix="aip-bench-shared-"))
    pg = Postgres().start()
    runs: list[dict] = []
    queries: dict[str, dict] = {}
    try:
        wait_for_server(url)
        conn = {"provider": "openai", "base_url": url, "model": "aip-builtin", "max_connections": args.max_connections}
        spec_path = work / "spec.yaml"
        spec_path.write_text(yaml.safe_dump(demo_spec(demo, conn), sort_keys=False))
        for p in levels:
            for mode in ("local", "shared", "queued"):
                data = work / f"{mode}-p{p}"
                extra = {"AIP_DATA_DIR": str(data)}
                daemon = None
                if mode != "local":
                    db = new_database(pg.url)
                    extra |= {"AIP_SHARED_STATE_URL": db, "AIP_LAKE_DATA_PATH": str(work / f"lake-{mode}-p{p}")}
                if mode == "queued":
                    daemon, daemon_log = start_daemon(work / f"home-p{p}", p, {**env(), **extra}, work)
                    extra["DAGSTER_HOME"] = str(work / f"home-p{p}")
                before = stats(url).get("requests", 0)
                how = ["--submit"] if mode == "queued" else ["--parallel", str(p)]
                t0 = time.perf_counter()
                try:
                    out = subprocess.run(
                        [sys.executable, "-m", "aip_assets.cli", "run", str(spec_path), "--json", *how],
                        env={**env(), **extra},
                        cwd=work,
                        capture_output=True,
                        text=True,
                    )
                finally:
                    wall = time.perf_counter() - t0
                    if daemon is not None:
                        daemon.terminate()
                        daemon.wait(60)
                if out.returncode not in (0, 1):
                    print(out.stderr[-3000:], file=sys.stderr)
                    raise SystemExit(f"{mode} {' '.join(how)}: exit {out.returncode}")
                summary = json.loads(out.stdout)
                row = {
                    "mode": mode,
                    "workers": p,
                    "wall_s": wall,
                    "requests": stats(url).get("requests", 0) - before,
                    "scores": {m: (s.get("score"), s.get("ci95")) for m, s in summary["metrics"].items()},
                }
                if mode != "local":
                    logs = out.stderr + (daemon_log.read_text(errors="replace") if mode == "queued" else "")
                    row["commits"] = snapshots(db)
                    row["conflicts"] = logs.count(CONFLICT_LINE)
                    row["retry_rate"] = row["conflicts"] / max(1, row["commits"] + row["conflicts"])
                runs.append(row)
                print(
                    f"{mode} P={p}: {wall:.1f} s, {row['requests']} requests"
                    + (f", {row['commits']} commits, {row['conflicts']} conflicts" if mode != "local" else ""),
                    file=sys.stderr,
                    flush=True,
                )
                if p == levels[0] and mode != "queued":  # README queries against this warehouse
                    q: dict[str, dict] = {}
                    for name, sql in QUERIES.items():
                        times = []
                        for _ in range(3):
                            t = time.perf_counter()
                            r = subprocess.run(
                                [sys.executable, "-m", "aip_assets.cli", "sql", sql, "--format", "csv"],
                                env={**env(), **extra},
                                cwd=work,
                                capture_output=True,
                                text=True,
                            )
                            times.append(time.perf_counter() - t)
                            if r.returncode != 0:
                                raise SystemExit(f"{mode}: aip-eval sql {name}: {r.stderr[-500:]}")
                        q[name] = {"cli_s": statistics.median(times)}
                    inproc = subprocess.run(
                        [sys.executable, "-c", IN_PROCESS, json.dumps(QUERIES)],
                        env={**env(), **extra},
                        cwd=work,
                        capture_output=True,
                        text=True,
                    )
                    if inproc.returncode != 0:
                        raise SystemExit(f"{mode}: in-process queries: {inproc.stderr[-800:]}")
                    for name, ms in json.loads(inproc.stdout).items():
                        q[name]["in_process_ms"] = ms
                    queries[mode] = q
    finally:
        server.terminate()
        server.wait(10)
        pg.stop()
    base = next(r["scores"] for r in runs if r["mode"] == "local")
    same = all(r["scores"] == base for r in runs)
    info = {
        **header,
        "latency_ms": args.latency_ms,
        "max_connections": args.max_connections,
        "runs": runs,
        "queries": queries,
        "same_scores": same,
    }
    lines = [
        f"# Shared mode against local mode: the demo against a {args.latency_ms:g} ms endpoint",
        "",
        f"- date: {info['date']}; machine: nproc {info['nproc']}, CPU {info['cpu']}, Python {info['python']}",
        f"- aip_assets {info['version']} at commit {info['commit']}; code: {info['code']}; "
        f"interpreter {sys.executable}",
        "- shared: Postgres 15 on loopback (shared state, the lake's catalog, Dagster's storage), lake files "
        "on local disk; `--parallel P` workers",
        "- queued: shared, through Dagster's queue: `run --submit` and `aip-eval daemon` with at most P runs "
        "at once (each metric a Dagster run in a process of its own)",
        "",
        "| mode | workers | wall s | server requests | lake commits | conflicts retried | retry rate |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        lines.append(
            f"| {r['mode']} | {r['workers']} | {r['wall_s']:.1f} | {r['requests']} | "
            + (f"{r['commits']} | {r['conflicts']} | {r['retry_rate']:.1%} |" if r["mode"] != "local" else "| | |")
        )
    lines += [
        "",
        f"Every metric's score and interval identical in every run: {same}.",
        "",
        "| query | local: aip-eval sql s | local: in process ms | shared: aip-eval sql s | shared: in process ms |",
        "|---|---:|---:|---:|---:|",
    ]
    for name in QUERIES:
        lo, sh = queries.get("local", {}).get(name, {}), queries.get("shared", {}).get(name, {})
        lines.append(
            f"| {name} | {lo.get('cli_s', float('nan')):.2f} | {lo.get('in_process_ms', float('nan')):.1f} | "
            f"{sh.get('cli_s', float('nan')):.2f} | {sh.get('in_process_ms', float('nan')):.1f} |"
        )
    write_results(Path(args.out) if args.out else OUT_DIR / "shared.md", lines, info)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
