"""SUT-sampling throughput: our ModelClient vs a bare aiohttp client, against the builtin HTTP server.

The builtin server (``aip-eval serve-builtin --latency-ms L``) runs in its own process. For each
concurrency c, both clients issue N = max(40, 12*c) distinct chat completions (capped by
``--max-calls`` and a per-measurement time budget) with c in flight:

- ours: ``ModelClient`` (provider openai, ``max_connections`` = max(c, 1), ``concurrency=c``,
  journaling every call into a SQLite ``Journal`` in a temp dir, a fresh run_id per measurement so
  nothing comes from the cache);
- bare: ``aiohttp.ClientSession`` with ``TCPConnector(limit=c)`` and a semaphore of c, posting the
  same bodies to ``/v1/chat/completions``.

Ideal throughput is c / latency. Both clients are warmed up (c untimed calls) before each
measurement so connection set-up is not counted. The table also gives the client process's CPU
time per call, which is where the two differ on a 2-core machine.

    python benchmarks/bench_sampling.py [--latency-ms 100] [--concurrency 1,8,64,256] [--repeat 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's aip_assets, whatever is installed
import aiohttp
from _common import code_fingerprint, run_header

from aip_assets.models.client import ModelClient
from aip_assets.models.journal import Journal
from aip_assets.runspec import Connection

OUT_DIR = Path(__file__).resolve().parent / "out"
LABELS = "APPROVE, DENY"


def machine_info() -> dict[str, str]:
    return {**run_header(), "aiohttp": aiohttp.__version__}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(latency_ms: float, log_path: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "aip_assets.cli",
        "serve-builtin",
        "--port",
        str(port),
        "--latency-ms",
        str(latency_ms),
    ]
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}; see {log_path}")
        try:
            with urllib.request.urlopen(base + "/models", timeout=2) as r:
                if r.status == 200:
                    json.load(r)
                    return proc, base
        except OSError:
            pass
        if time.monotonic() > deadline:
            stop_server(proc)
            raise RuntimeError(f"server did not answer GET /v1/models within 60 s; see {log_path}")
        time.sleep(0.2)


def stop_server(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def proc_cpu_s(pid: int) -> float | None:
    """utime + stime of a process from /proc (Linux), in seconds; None when unavailable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def server_stats(base: str) -> dict:
    try:
        with urllib.request.urlopen(base.rsplit("/v1", 1)[0] + "/stats", timeout=5) as r:
            return json.load(r)
    except OSError:
        return {}


def messages_for(tag: str, i: int) -> list[dict[str, str]]:
    return [
        {
            "role": "user",
            "content": (
                f"Request {i} of {tag}: I earn $4,{i % 1000:03d} a month and ask for a $9,500 loan. Should it be approved?\n\n"
                f"Based only on the information above, make the decision that is asked for.\n"
                f'End your reply with one final line of the form "Decision: <label>", where <label> is exactly one of: {LABELS}.'
            ),
        }
    ]


async def drive(n: int, c: int, one, budget_s: float) -> tuple[int, int, float, float]:
    """c workers issue up to n calls (stop starting new ones after budget_s).
    Returns (done, failed, wall seconds, process CPU seconds)."""
    next_i = 0
    done = failed = 0
    t0, cpu0 = time.perf_counter(), time.process_time()
    deadline = time.monotonic() + budget_s

    async def worker():
        nonlocal next_i, done, failed
        while next_i < n and time.monotonic() < deadline:
            i = next_i
            next_i += 1
            ok = await one(i)
            done += 1
            failed += 0 if ok else 1

    await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(min(c, n)))), budget_s + 120)
    return done, failed, time.perf_counter() - t0, time.process_time() - cpu0


async def measure_ours(base: str, c: int, n: int, journal: Journal, budget_s: float) -> dict:
    conn = Connection(provider="openai", base_url=base, model="aip-builtin", max_connections=max(1, min(c, 1024)))
    tag = f"ours-c{c}-{uuid.uuid4().hex[:8]}"
    # a fresh run_id: the journal lookup runs (and misses) for every call, as in a new run
    warm = ModelClient(
        conn,
        role="sut",
        run_id=tag + "-warm",
        metric="bench",
        stage="sampling",
        journal=journal,
        concurrency=c,
        share_connections=False,
    )  # never entered: it must hold no slot
    client = ModelClient(conn, role="sut", run_id=tag, metric="bench", stage="sampling", journal=journal, concurrency=c)
    async with client:
        warm.transport = client.transport  # warm the same connection pool, journaled under another run id

        async def warm_one(i):
            return (await warm.chat(messages_for(tag + "-warm", i), temperature=0.7, timeout=60)).ok

        await drive(c, c, warm_one, budget_s)

        async def one(i):
            r = await client.chat(messages_for(tag, i), temperature=0.7, timeout=60)
            return r.ok and not r.cached

        done, failed, wall, cpu = await drive(n, c, one, budget_s)
    assert client.stats["cached"] == 0, client.stats
    return {"done": done, "failed": failed, "wall": wall, "cpu": cpu}


async def measure_bare(base: str, c: int, n: int, budget_s: float) -> dict:
    tag = f"bare-c{c}-{uuid.uuid4().hex[:8]}"
    url = base.rstrip("/") + "/chat/completions"
    sem = asyncio.Semaphore(c)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=c), trust_env=False) as session:

        def make(tag_):
            async def one(i):
                body = {"model": "aip-builtin", "messages": messages_for(tag_, i), "temperature": 0.7}
                async with sem:
                    async with session.post(
                        url,
                        data=json.dumps(body),
                        headers={"Content-Type": "application/json"},
                        timeout=aiohttp.ClientTimeout(total=60),
                    ) as resp:
                        data = await resp.json()
                        return resp.status == 200 and bool(data["choices"][0]["message"]["content"])

            return one

        await drive(c, c, make(tag + "-warm"), budget_s)
        done, failed, wall, cpu = await drive(n, c, make(tag), budget_s)
    return {"done": done, "failed": failed, "wall": wall, "cpu": cpu}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--latency-ms", type=float, default=100.0)
    ap.add_argument("--concurrency", default="1,8,64,256", help="comma-separated levels")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--max-calls", type=int, default=4000, help="cap on N per measurement")
    ap.add_argument("--budget-s", type=float, default=15.0, help="stop starting calls after this long per measurement")
    ap.add_argument("--out", default=str(OUT_DIR / "sampling.md"))
    args = ap.parse_args(argv)
    levels = [int(x) for x in args.concurrency.split(",") if x.strip()]
    if any(c < 1 or c > 1024 for c in levels):
        ap.error("concurrency levels must be in 1..1024")
    if not 1 <= args.repeat <= 20:
        ap.error("--repeat must be in 1..20")
    lat_s = args.latency_ms / 1000
    info = machine_info()
    tmp = Path(tempfile.mkdtemp(prefix="aip-bench-sampling-"))
    proc = None

    def on_signal(signum, frame):
        stop_server(proc)
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    results: dict[int, dict[str, list[dict]]] = {}
    try:
        proc, base = start_server(args.latency_ms, tmp / "server.log")
        print(f"server pid {proc.pid} at {base}", file=sys.stderr, flush=True)
        journal = Journal(tmp / "bench.journal.sqlite")
        try:
            for c in levels:
                n = min(max(40, 12 * c), args.max_calls)
                results[c] = {"ours": [], "bare": []}
                for rep in range(args.repeat):
                    for kind in ("ours", "bare") if rep % 2 == 0 else ("bare", "ours"):
                        s0 = proc_cpu_s(proc.pid)
                        if kind == "ours":
                            r = asyncio.run(measure_ours(base, c, n, journal, args.budget_s))
                        else:
                            r = asyncio.run(measure_bare(base, c, n, args.budget_s))
                        s1 = proc_cpu_s(proc.pid)
                        # the server's CPU over warm-up + timed calls (c + done requests)
                        r["server_cpu"] = None if s0 is None or s1 is None else (s1 - s0) / (r["done"] + c)
                        r["n"] = n
                        r["rate"] = r["done"] / r["wall"]
                        results[c][kind].append(r)
                        print(
                            f"c={c:<4} {kind:<5} rep {rep + 1}: {r['done']}/{n} calls ({r['failed']} failed) in "
                            f"{r['wall']:.2f} s = {r['rate']:.1f}/s ({100 * r['rate'] / (c / lat_s):.1f}% of ideal), "
                            f"client CPU {1000 * r['cpu'] / max(r['done'], 1):.2f} ms/call, server CPU "
                            f"{'n/a' if r['server_cpu'] is None else format(1000 * r['server_cpu'], '.2f')} ms/call",
                            file=sys.stderr,
                            flush=True,
                        )
        finally:
            journal.close()
        stats = server_stats(base)
    finally:
        stop_server(proc)
        shutil.rmtree(tmp, ignore_errors=True)

    def med(rs, key):
        return statistics.median(x[key] for x in rs)

    def rng(rs, key, fmt):
        if len(rs) < 2:
            return ""
        return f" ({fmt.format(min(x[key] for x in rs))}–{fmt.format(max(x[key] for x in rs))})"

    lines = [
        "# SUT sampling throughput: ModelClient vs bare aiohttp",
        "",
        f"- date: {info['date']}",
        f"- code: {info['code']}"
        + (
            ""
            if code_fingerprint() == info["code"]
            else f" — WARNING: the sources changed during the run (now {code_fingerprint()})"
        ),
        f"- aip_assets {info['version']} at commit {info['commit']}; interpreter {info['interpreter']}",
        f"- machine: nproc {info['nproc']}, CPU {info['cpu']}, Python {info['python']}, aiohttp {info['aiohttp']}",
        f"- server: `aip-eval serve-builtin --latency-ms {args.latency_ms:g}` in its own process (same machine)",
        f"- ideal = c / {lat_s:g} s; N = max(40, 12·c) capped at {args.max_calls} and a {args.budget_s:g} s budget; "
        f"repeat {args.repeat} (median{', range in brackets' if args.repeat > 1 else ''}); c untimed warm-up calls each",
        "- client CPU = this process's CPU time over the timed calls / calls; server CPU = the server process's CPU "
        "(utime+stime from /proc) over warm-up + timed calls / requests",
        "- ours = `ModelClient` (httpx over the project's aiohttp transport, SQLite journal per call, cache lookup per call); "
        "bare = `aiohttp.ClientSession` + `TCPConnector(limit=c)` + semaphore",
        "",
        "| c | N | ideal calls/s | ours calls/s | ours % ideal | bare calls/s | bare % ideal | ours / bare "
        "| client CPU ms/call (ours / bare) | server CPU ms/call (ours / bare) | failed (ours/bare) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c, rs in results.items():
        ideal = c / lat_s
        o, b = rs["ours"], rs["bare"]
        ro, rb = med(o, "rate"), med(b, "rate")
        n_done = f"{int(med(o, 'done'))}" if int(med(o, "done")) == o[0]["n"] else f"{int(med(o, 'done'))}/{o[0]['n']}"
        cpu_o = statistics.median(x["cpu"] / max(x["done"], 1) for x in o) * 1000
        cpu_b = statistics.median(x["cpu"] / max(x["done"], 1) for x in b) * 1000
        sv = [
            statistics.median(x["server_cpu"] for x in rs_) * 1000
            if all(x["server_cpu"] is not None for x in rs_)
            else None
            for rs_ in (o, b)
        ]
        sv_txt = " / ".join("n/a" if v is None else f"{v:.2f}" for v in sv)
        lines.append(
            f"| {c} | {n_done} | {ideal:.0f} | {ro:.1f}{rng(o, 'rate', '{:.1f}')} | {100 * ro / ideal:.1f}% "
            f"| {rb:.1f}{rng(b, 'rate', '{:.1f}')} | {100 * rb / ideal:.1f}% | {ro / rb:.2f} "
            f"| {cpu_o:.2f} / {cpu_b:.2f} | {sv_txt} | {sum(x['failed'] for x in o)}/{sum(x['failed'] for x in b)} |"
        )
    if stats:
        lines += ["", f"Server /stats at the end: {json.dumps(stats, sort_keys=True)}"]
    text = "\n".join(lines) + "\n"
    print(text)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    out.with_suffix(".json").write_text(
        json.dumps(
            {
                **info,
                "latency_ms": args.latency_ms,
                "repeat": args.repeat,
                "server_stats": stats,
                "levels": {
                    str(c): {
                        "ideal_calls_per_s": c / lat_s,
                        **{kind: [{k: v for k, v in r.items()} for r in rs[kind]] for kind in ("ours", "bare")},
                        "ours_over_bare": med(rs["ours"], "rate") / med(rs["bare"], "rate"),
                    }
                    for c, rs in results.items()
                },
            },
            indent=2,
        )
    )
    print(f"written to {out} and {out.with_suffix('.json')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
