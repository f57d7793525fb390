"""Metrics at once: the demo's seven metrics against a 100 ms endpoint, `--parallel 1` against `N`.

The builtin model (the demo's SUT profile; it also answers the judge prompts) is served over HTTP
by ``python -m aip_assets.cli serve-builtin --latency-ms L`` in its own process. The demo spec is
rewritten so that ``sut`` and ``judge`` point at it with ``max_connections`` (default 512), and

    python -m aip_assets.cli run spec.yaml --json --quiet --parallel P

runs in a fresh data folder for each P, alternating, ``--repeat`` times. This checkout's code
under this interpreter (the checkout first on PYTHONPATH). Reported: wall time per P (median),
the speed-up, the server's requests, and whether every metric's score and interval are the same
at every P (they must be: the same seed, the same calls).

    python benchmarks/bench_parallel.py [--latency-ms 100] [--parallel 1,7] [--repeat 2] [--max-connections 512]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

CHECKOUT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import run_header  # noqa: E402

OUT_DIR = Path(__file__).resolve().parent / "out"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env() -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if k not in ("DAGSTER_HOME", "AIP_WAREHOUSE", "AIP_DATA_DIR")}
    e["PYTHONPATH"] = os.pathsep.join([str(CHECKOUT), *filter(None, [os.environ.get("PYTHONPATH")])])
    return e


def demo_spec(demo: dict, conn: dict) -> dict:
    """The demo spec with ``sut`` and ``judge`` at ``conn`` and its dataset paths made absolute."""
    spec = dict(demo, sut=conn, judge=conn)
    spec["dataset"] = str((CHECKOUT / "data" / "runs" / demo["dataset"]).resolve())
    spec["metrics"] = {name: dict(m) for name, m in demo["metrics"].items()}
    for m in spec["metrics"].values():  # per-metric datasets are relative to the demo spec too
        if m.get("dataset"):
            m["dataset"] = str((CHECKOUT / "data" / "runs" / m["dataset"]).resolve())
    return spec


def wait_for_server(url: str, tries: int = 200) -> None:
    for _ in range(tries):
        try:
            stats(url)
            return
        except OSError:
            time.sleep(0.1)


def stats(url: str) -> dict:
    with urllib.request.urlopen(url.removesuffix("/v1") + "/stats", timeout=10) as r:
        return json.loads(r.read())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--latency-ms", type=float, default=100.0)
    ap.add_argument("--parallel", default="1,7")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--max-connections", type=int, default=512)
    ap.add_argument("--out")
    args = ap.parse_args()
    header = run_header()
    levels = [int(x) for x in args.parallel.split(",")]
    demo = yaml.safe_load((CHECKOUT / "data" / "runs" / "demo.yaml").read_text())
    profile = demo["sut"]["profile"]
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
            json.dumps(profile),
        ],
        env=env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/v1"
    work = Path(tempfile.mkdtemp(prefix="aip-bench-parallel-"))
    results: dict[int, list[float]] = {p: [] for p in levels}
    scores: dict[int, dict] = {}
    requests: dict[int, list[int]] = {p: [] for p in levels}
    try:
        wait_for_server(url)
        conn = {"provider": "openai", "base_url": url, "model": "aip-builtin", "max_connections": args.max_connections}
        spec = demo_spec(demo, conn)
        spec_path = work / "spec.yaml"
        spec_path.write_text(yaml.safe_dump(spec, sort_keys=False))
        for r in range(args.repeat):
            for p in levels:
                data = work / f"p{p}-{r}"
                before = stats(url).get("requests", 0)
                t0 = time.perf_counter()
                out = subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "aip_assets.cli",
                        "run",
                        str(spec_path),
                        "--json",
                        "--quiet",
                        "--parallel",
                        str(p),
                    ],
                    env={**env(), "AIP_DATA_DIR": str(data)},
                    cwd=work,
                    capture_output=True,
                    text=True,
                )
                wall = time.perf_counter() - t0
                if out.returncode not in (0, 1):
                    print(out.stderr[-3000:], file=sys.stderr)
                    raise SystemExit(f"--parallel {p}: exit {out.returncode}")
                summary = json.loads(out.stdout)
                got = {m: (s.get("score"), s.get("ci95")) for m, s in summary["metrics"].items()}
                scores.setdefault(p, got)
                results[p].append(wall)
                requests[p].append(stats(url).get("requests", 0) - before)
                print(f"--parallel {p}: {wall:.1f} s, {requests[p][-1]} requests", file=sys.stderr, flush=True)
    finally:
        server.terminate()
        server.wait(10)
    same = all(scores[p] == scores[levels[0]] for p in levels)
    base = statistics.median(results[levels[0]])
    info = {
        **header,
        "latency_ms": args.latency_ms,
        "max_connections": args.max_connections,
        "repeat": args.repeat,
        "levels": {
            p: {
                "wall_s": results[p],
                "median_s": statistics.median(results[p]),
                "speedup": base / statistics.median(results[p]),
                "requests": requests[p],
            }
            for p in levels
        },
        "same_scores": same,
    }
    lines = [
        f"# Metrics at once: the demo against a {args.latency_ms:g} ms endpoint",
        "",
        f"- date: {info['date']}; machine: nproc {info['nproc']}, CPU {info['cpu']}, Python {info['python']}",
        f"- aip_assets {info['version']} at commit {info['commit']}; code: {info['code']}; "
        f"interpreter {sys.executable}",
        f"- SUT and judge: `serve-builtin --latency-ms {args.latency_ms:g}` (demo profile), max_connections "
        f"{args.max_connections}; {args.repeat} alternating rounds",
        "",
        "| --parallel | wall s (each) | median s | speed-up | server requests |",
        "|---:|---|---:|---:|---|",
    ]
    for p in levels:
        lv = info["levels"][p]
        lines.append(
            f"| {p} | {', '.join(f'{w:.1f}' for w in lv['wall_s'])} | {lv['median_s']:.1f} | "
            f"{lv['speedup']:.2f} | {', '.join(map(str, lv['requests']))} |"
        )
    lines += ["", f"Every metric's score and interval identical at every level: {same}."]
    out = Path(args.out) if args.out else OUT_DIR / "parallel.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(json.dumps(info, indent=2))
    print("\n".join(lines))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
