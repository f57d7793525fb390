"""A run answered from the call cache: the demo's fixed cost, and a large replay over HTTP.

The builtin model is served over HTTP by ``python -m aip_assets.cli serve-builtin`` (no added
latency) in its own process, for the SUT and the judge. Two cases, each in a fresh data folder:

- ``demo``: the demo spec pointed at that server. A first run, then the same run again
  (``--run-id``): every stage is materialised again and every call answered from the journal.
- ``decision_flip``: ``--rows`` rows (default 10,000) made as in ``bench_pipeline.py``,
  ``llm.decision_flip`` with sub_call_concurrency_limit 64; a first run, then its replay.

For each run: wall time, the server's requests (a replay must send none but the endpoint
checks), the calls in ``llm_calls`` for the run (each answered call, cached or not) and calls ÷
wall. For the demo replay, also where the time goes before Dagster starts (imports, spec, run
registration: process start → first Dagster run start) and per Dagster run (7 metrics): mean
run time. Every child is this checkout under this interpreter (``-m aip_assets.cli``).

    python benchmarks/bench_replay.py [--rows 10000] [--cases demo,decision_flip] [--repeat 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _common import run_header  # noqa: E402
from bench_parallel import CHECKOUT, demo_spec, env, free_port, stats, wait_for_server  # noqa: E402
from bench_pipeline import make_dataset  # noqa: E402

OUT_DIR = HERE / "out"

RUN_TIMES = r"""
import json, sys
from aip_assets.dagster_home import get_instance
inst = get_instance()
out = []
for run in inst.get_runs(limit=50):
    s = inst.get_run_stats(run.run_id)
    out.append({"start": s.start_time, "end": s.end_time, "tags": dict(run.tags)})
print(json.dumps(out))
"""


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "aip_assets.cli", *args]


def run(spec: Path, data: Path, work: Path, url: str, run_id: str | None) -> dict:
    cmd = cli("run", str(spec), "--json", "--quiet") + (["--run-id", run_id] if run_id else [])
    before = stats(url).get("requests", 0)
    t_start = time.time()
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env={**env(), "AIP_DATA_DIR": str(data)}, cwd=work, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(cmd)}: exit {p.returncode}\n{p.stderr[-3000:]}")
    summary = json.loads(p.stdout)
    rid = summary["run_id"]
    q = subprocess.run(
        cli("sql", f"SELECT count(*) AS n FROM llm_calls WHERE run_id = '{rid}'", "--format", "json"),
        env={**env(), "AIP_DATA_DIR": str(data)},
        cwd=work,
        capture_output=True,
        text=True,
        check=True,
    )
    calls = int(json.loads(q.stdout)[0]["n"])
    t = subprocess.run(
        [sys.executable, "-c", RUN_TIMES],
        env={**env(), "AIP_DATA_DIR": str(data)},
        cwd=work,
        capture_output=True,
        text=True,
        check=True,
    )
    dag = [r for r in json.loads(t.stdout.strip().splitlines()[-1]) if r["start"] and r["start"] >= t_start]
    first = min((r["start"] for r in dag), default=None)
    return {
        "run_id": rid,
        "wall_s": wall,
        "requests": stats(url).get("requests", 0) - before,
        "calls": calls,
        "calls_per_s": calls / wall,
        "dagster_runs": len(dag),
        "before_first_dagster_run_s": None if first is None else first - t_start,
        "mean_dagster_run_s": statistics.mean(r["end"] - r["start"] for r in dag if r["end"]) if dag else None,
        "scores": {m: s.get("score") for m, s in summary["metrics"].items()},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=10000)
    ap.add_argument("--cases", default="demo,decision_flip")
    ap.add_argument("--repeat", type=int, default=1, help="replays per case (the first run is made once)")
    ap.add_argument("--out")
    args = ap.parse_args()
    header = run_header()
    cases = [c for c in args.cases.split(",") if c]
    demo = yaml.safe_load((CHECKOUT / "data" / "runs" / "demo.yaml").read_text())
    port = free_port()
    server = subprocess.Popen(
        cli("serve-builtin", "--port", str(port), "--profile", json.dumps(demo["sut"]["profile"])),
        env=env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/v1"
    work = Path(tempfile.mkdtemp(prefix="aip-bench-replay-"))
    results: dict[str, dict] = {}
    try:
        wait_for_server(url)
        conn = {"provider": "openai", "base_url": url, "model": "aip-builtin", "max_connections": 256}
        for case in cases:
            if case == "demo":
                spec = demo_spec(demo, conn)
            elif case == "decision_flip":
                ds = work / "rows.jsonl"
                make_dataset(args.rows, ds)
                spec = {
                    "name": "replay",
                    "dataset": str(ds),
                    "sut": conn,
                    "judge": conn,
                    "metrics": {"llm.decision_flip": {"config": {"sub_call_concurrency_limit": 64}}},
                }
            else:
                raise SystemExit(f"unknown case {case!r} (demo, decision_flip)")
            spec_path = work / f"{case}.yaml"
            spec_path.write_text(yaml.safe_dump(spec, sort_keys=False))
            data = work / case
            first = run(spec_path, data, work, url, None)
            print(
                f"{case} first run: {first['wall_s']:.1f} s, {first['calls']} calls, {first['requests']} requests",
                file=sys.stderr,
                flush=True,
            )
            replays = []
            for _ in range(args.repeat):
                r = run(spec_path, data, work, url, first["run_id"])
                replays.append(r)
                print(
                    f"{case} replay: {r['wall_s']:.1f} s, {r['calls']} calls ({r['calls_per_s']:.0f}/s), "
                    f"{r['requests']} requests",
                    file=sys.stderr,
                    flush=True,
                )
            results[case] = {
                "first": first,
                "replays": replays,
                "same_scores": all(r["scores"] == first["scores"] for r in replays),
            }
    finally:
        server.terminate()
        server.wait(10)
    info = {**header, "rows": args.rows, "cases": results}
    lines = [
        "# Replaying a run from the call cache",
        "",
        f"- date: {info['date']}; machine: nproc {info['nproc']}, CPU {info['cpu']}, Python {info['python']}",
        f"- aip_assets {info['version']} at commit {info['commit']}; interpreter {info['interpreter']}",
        "- SUT and judge: `serve-builtin` (demo profile, no added latency) in its own process",
        "",
        "| case | run | wall s | server requests | calls in llm_calls | calls/s | Dagster runs | "
        "s before the first Dagster run | mean s per Dagster run |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for case, res in results.items():
        for label, r in [("first", res["first"])] + [("replay", r) for r in res["replays"]]:
            b = r["before_first_dagster_run_s"]
            m = r["mean_dagster_run_s"]
            lines.append(
                f"| {case} | {label} | {r['wall_s']:.1f} | {r['requests']:,} | {r['calls']:,} | "
                f"{r['calls_per_s']:.0f} | {r['dagster_runs']} | {'n/a' if b is None else f'{b:.1f}'} | "
                f"{'n/a' if m is None else f'{m:.2f}'} |"
            )
        lines.append(f"| {case} | same scores | {res['same_scores']} | | | | | | |")
    out = Path(args.out) if args.out else OUT_DIR / "replay.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps(info, indent=2))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
