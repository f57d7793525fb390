"""A 10,000-call stage through the Batch API against the same calls live (issue 15).

The builtin model is served in its own process (``serve-builtin --latency-ms L --batch-seconds
S``); this process runs one ``ModelClient`` (the SUT's, a journal in a temp folder) and sends N
distinct chat calls with ``asyncio.gather``, as a stage does:

- live: ``max_connections`` C calls in flight, each answered after L ms;
- batch: ``batch.enabled`` (``poll_seconds`` P): one file, one batch, polls until the server
  says done (S seconds after creation: the provider's own time, a parameter here), the output
  file read, every answer journaled.

Reported: wall time, calls per second, the server's requests (chat requests live; files,
batches, polls and downloads in batch mode), and for the batch our own time (wall time minus the
S seconds the server takes by design). Both runs' answers are compared (identical).

This checkout's code under this interpreter (``sys.executable``, the checkout first on PYTHONPATH).

    python benchmarks/bench_batch.py [--calls 10000] [--latency-ms 100] [--max-connections 64]
                                     [--batch-seconds 5] [--poll-seconds 1]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(CHECKOUT))
from _common import run_header, write_results  # noqa: E402
from bench_parallel import env, free_port, stats, wait_for_server  # noqa: E402

OUT_DIR = Path(__file__).resolve().parent / "out"


def question(i: int) -> list[dict[str, str]]:
    return [
        {
            "role": "user",
            "content": f"Case {i}: a loan of {1000 + i} euros with {i % 9 + 1} years of history and "
            "no missed payment. Should it be approved? Answer with exactly one of: YES, NO.",
        }
    ]


async def stage(
    url: str, calls: int, batch: dict | None, max_connections: int, journal_dir: Path
) -> tuple[float, list]:
    from aip_assets.models.client import ModelClient
    from aip_assets.models.journal import Journal
    from aip_assets.runspec import Connection

    conn = Connection(
        provider="openai",
        base_url=url,
        model="aip-builtin",
        max_connections=max_connections,
        **({"batch": batch} if batch else {}),
    )
    journal = Journal(journal_dir / "journal.sqlite")
    t0 = time.perf_counter()
    async with ModelClient(
        conn, role="sut", run_id="bench", metric="m", stage="sampling", journal=journal, concurrency=max_connections
    ) as cl:
        results = await asyncio.gather(*(cl.chat(question(i), temperature=0.0, timeout=120) for i in range(calls)))
    journal.flush()
    wall = time.perf_counter() - t0
    journal.close()
    return wall, [(r.status, r.text) for r in results]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=10_000)
    ap.add_argument("--latency-ms", type=float, default=100.0)
    ap.add_argument("--max-connections", type=int, default=64)
    ap.add_argument("--batch-seconds", type=float, default=5.0)
    ap.add_argument("--poll-seconds", type=float, default=1.0)
    ap.add_argument("--out")
    args = ap.parse_args()
    header = run_header()
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
            "--batch-seconds",
            str(args.batch_seconds),
        ],
        env=env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/v1"
    rows = {}
    try:
        wait_for_server(url)
        for mode in ("live", "batch"):
            before = stats(url)
            with tempfile.TemporaryDirectory(prefix="aip-bench-batch-") as d:
                wall, answers = asyncio.run(
                    stage(
                        url,
                        args.calls,
                        {"enabled": True, "poll_seconds": args.poll_seconds} if mode == "batch" else None,
                        args.max_connections,
                        Path(d),
                    )
                )
            after = stats(url)
            diff = {k: after.get(k, 0) - before.get(k, 0) for k in after}
            requests = (
                diff.get("requests", 0)
                if mode == "live"
                else sum(diff.get(k, 0) for k in ("batch_files", "batch_batches", "batch_polls")) + 1
            )  # + the download
            rows[mode] = {
                "wall_s": wall,
                "calls_per_s": args.calls / wall,
                "server_requests": requests,
                "ok": sum(s == "ok" for s, _ in answers),
                "server": diff,
                "answers": answers,
            }
            print(
                f"{mode}: {wall:.1f} s, {args.calls / wall:.0f} calls/s, {requests} server requests",
                file=sys.stderr,
                flush=True,
            )
    finally:
        server.terminate()
        server.wait(10)
    same = rows["live"]["answers"] == rows["batch"]["answers"]
    for r in rows.values():
        del r["answers"]
    own = rows["batch"]["wall_s"] - args.batch_seconds
    info = {**header, **vars(args), "runs": rows, "same_answers": same, "batch_own_s": own}
    lines = [
        f"# A {args.calls:,}-call stage: Batch API against live",
        "",
        f"- date: {info['date']}; machine: nproc {info['nproc']}, CPU {info['cpu']}, Python {info['python']}",
        f"- aip_assets {info['version']} at commit {info['commit']}; interpreter {sys.executable}",
        f"- live: {args.latency_ms:g} ms an answer, max_connections {args.max_connections}; batch: the server ends a "
        f"batch {args.batch_seconds:g} s after it is created, polled every {args.poll_seconds:g} s",
        "",
        "| mode | wall s | calls/s | server requests | answers ok |",
        "|---|---:|---:|---:|---:|",
    ]
    for mode, r in rows.items():
        lines.append(
            f"| {mode} | {r['wall_s']:.1f} | {r['calls_per_s']:.0f} | {r['server_requests']:,} | {r['ok']:,} |"
        )
    lines += [
        "",
        f"Batch: {own:.1f} s of our own (upload, polls, reading {args.calls:,} answers, journaling them) "
        f"beside the server's {args.batch_seconds:g} s. Identical answers: {same}.",
    ]
    write_results(Path(args.out) if args.out else OUT_DIR / "batch.md", lines, info)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
