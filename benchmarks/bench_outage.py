"""A SUT down for a whole sampling stage: how long the stage takes on the demo's dataset.

The demo spec (data/runs/demo.yaml) with its SUT pointed at a loopback endpoint that is down in
one of these ways, every SUT metric's ``n_sut_retries`` set to ``--retries`` (each call retried):

- ``refused``: nothing listens at the port (a stopped server);
- ``drop``: a server that reads the request and closes the connection without an answer;
- ``503``: a server that answers 503 without Retry-After;
- ``503-retry-after``: 503 with ``Retry-After: --retry-after`` (a wait, not a failure: bounded by
  the connection's ``max_rate_limit_wait_seconds``, set with ``--max-wait``);
- ``hang``: a server that accepts and never answers (each try waits the call's timeout,
  ``--timeout``, set on every metric).

Each SUT metric's run is registered, ingested and synthesised with the builtin judge, then its
sampling stage is timed (the stage-start endpoint check, then every call failing) in-process,
in a fresh data folder. Reported per metric: the stage's seconds, its SUT calls sent (journaled)
and the tries they made, and every row's status (all must be errors). ``--down-after 0`` measures
the client that sends every call with its retries however many failed before (no
``DOWN_AFTER_CALLS``).

    python benchmarks/bench_outage.py [--modes refused,drop,503] [--metrics M,...] [--retries 2] [--timeout 60]
                                      [--down-after N]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

CHECKOUT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(CHECKOUT))
from _common import run_header  # noqa: E402

OUT_DIR = Path(__file__).resolve().parent / "out"


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def start_down(mode: str, retry_after: float) -> tuple[str, object]:
    """An endpoint down in ``mode``: (base URL, what to keep alive)."""
    if mode == "refused":
        return f"http://127.0.0.1:{free_port()}/v1", None
    if mode == "hang":
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 0))
        s.listen(1024)
        held: list[socket.socket] = []

        def run():
            while True:
                try:
                    c, _ = s.accept()
                except OSError:
                    return
                held.append(c)  # accepted, never answered

        threading.Thread(target=run, daemon=True).start()
        return f"http://127.0.0.1:{s.getsockname()[1]}/v1", (s, held)
    from aiohttp import web

    from aip_assets.models.builtin import start_app_in_thread

    async def chat(request: web.Request) -> web.StreamResponse:
        await request.read()
        if mode == "drop":
            request.transport.abort()
            return web.Response(status=204)
        headers = {"Retry-After": f"{retry_after:g}"} if mode == "503-retry-after" else {}
        return web.json_response({"error": {"message": "down"}}, status=503, headers=headers)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    url, stop = start_app_in_thread(app)
    return url, stop


def measure(mode: str, args) -> list[dict]:
    from aip_assets import pipeline
    from aip_assets import warehouse as wh
    from aip_assets.metrics import get_metric
    from aip_assets.runspec import load_spec, parse_spec

    url, keep = start_down(mode, args.retry_after)
    spec = load_spec(str(CHECKOUT / "data" / "runs" / "demo.yaml"))
    data = spec.resolved()
    data["sut"] = {"provider": "openai", "base_url": url, "model": "down", "max_rate_limit_wait_seconds": args.max_wait}
    out = []
    for metric in [m for m in spec.metrics if get_metric(m).calls_sut and (not args.metrics or m in args.metrics)]:
        folder = Path(tempfile.mkdtemp(prefix="bench-outage-"))
        os.environ["AIP_DATA_DIR"] = str(folder)
        os.environ["AIP_WAREHOUSE"] = str(folder / "warehouse.duckdb")
        os.environ["AIP_LIMITS_DIR"] = str(folder / "limits")
        d = json.loads(json.dumps(data))
        d["metrics"] = {metric: d["metrics"][metric]}
        d["metrics"][metric]["config"]["n_sut_retries"] = args.retries
        if args.timeout:
            d["metrics"][metric]["config"]["timeout_seconds"] = args.timeout
        s = parse_spec(d)
        run_id = f"outage-{mode}"
        pipeline.register_run(s, run_id, n_rows=pipeline.validate_datasets(s))
        for stage in ("ingest", "synthesis"):
            pipeline.run_stage(stage, run_id, metric, log=lambda m: None)
        t0 = time.perf_counter()
        pipeline.run_stage("sampling", run_id, metric, log=lambda m: None)
        took = time.perf_counter() - t0
        resp = wh.query("SELECT status, count(*) AS n FROM sut_responses WHERE run_id = ? GROUP BY status", [run_id])
        calls = wh.query(
            "SELECT count(*) AS n, sum(attempts) AS tries FROM llm_calls WHERE run_id = ? AND role = 'sut'", [run_id]
        )
        row = {
            "mode": mode,
            "metric": metric,
            "seconds": round(took, 2),
            "sut_calls": int(calls.n[0]),
            "tries": int(calls.tries[0] or 0),
            "statuses": dict(zip(resp.status, map(int, resp.n))),
        }
        print(json.dumps(row), flush=True)
        out.append(row)
        wh.release()
    if callable(keep):
        keep()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modes", default="refused,drop,503,503-retry-after,hang")
    ap.add_argument("--metrics", default="", help="comma-separated: only these metrics")
    ap.add_argument("--retries", type=int, default=2, help="n_sut_retries of every SUT metric")
    ap.add_argument("--timeout", type=float, default=None, help="timeout_seconds of every metric (default: theirs)")
    ap.add_argument("--retry-after", type=float, default=1.0)
    ap.add_argument("--max-wait", type=float, default=600.0, help="the SUT's max_rate_limit_wait_seconds")
    ap.add_argument(
        "--down-after",
        type=int,
        default=None,
        help="client.DOWN_AFTER_CALLS (0: never found down, every call sent with its retries, as before it)",
    )
    args = ap.parse_args()
    if args.down_after is not None:
        from aip_assets.models import client

        client.DOWN_AFTER_CALLS = args.down_after or 10**9
    args.metrics = [m for m in args.metrics.split(",") if m]
    header = run_header()
    rows = [r for mode in args.modes.split(",") for r in measure(mode, args)]
    OUT_DIR.mkdir(exist_ok=True)
    path = OUT_DIR / f"outage-{time.strftime('%Y%m%dT%H%M%S')}.json"
    path.write_text(json.dumps({"header": header, "args": vars(args), "rows": rows}, indent=2))
    print(yaml.safe_dump({"written": str(path)}), file=sys.stderr)


if __name__ == "__main__":
    main()
