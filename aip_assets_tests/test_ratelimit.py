"""An endpoint's requests_per_minute and tokens_per_minute, shared by every process on the machine."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable

import pytest

from aip_assets.models.ratelimit import SharedRate, estimate_tokens, limits_dir
from aip_assets.runspec import Connection

EP = "http://127.0.0.1:1/v1"


def test_the_schedule_by_hand(tmp_path):
    """rpm 60 (1 s per start) and tpm 600 (0.1 s per token), times given: each start waits for both
    the previous start + 1 s and the tokens spent so far; a settle moves the token schedule by the
    difference; a second instance on the same directory (another process) continues the schedule."""
    a = SharedRate(EP, rpm=60, tpm=600, directory=tmp_path)
    assert a.reserve(5, now=100.0) == 100.0  # free: at once; requests next 101, tokens paid off 100.5
    assert a.reserve(30, now=100.0) == 101.0  # the request rate decides; tokens paid off 104
    assert a.reserve(0, now=100.0) == 104.0  # the 30 tokens decide
    a.settle(30, 10)  # the endpoint counted 10: paid off 2 s earlier (102)
    assert a.reserve(0, now=100.0) == 105.0  # the request rate again (104 + 1)
    b = SharedRate(EP, rpm=60, tpm=600, directory=tmp_path)  # the same file, as another process sees it
    assert b.reserve(0, now=100.0) == 106.0
    assert b.reserve(0, now=200.0) == 200.0  # an idle endpoint owes nothing
    other = SharedRate("http://127.0.0.1:2/v1", rpm=60, tpm=None, directory=tmp_path)
    assert other.reserve(0, now=100.0) == 100.0  # another endpoint has its own schedule
    tokens_only = SharedRate("http://127.0.0.1:3/v1", rpm=None, tpm=60, directory=tmp_path)
    assert [tokens_only.reserve(2, now=0.0) for _ in range(3)] == [0.0, 2.0, 4.0]
    for r in (a, b, other, tokens_only):
        r.close()
    with pytest.raises(ValueError):
        SharedRate(EP, rpm=None, tpm=None, directory=tmp_path)


def test_token_estimates():
    assert estimate_tokens({"messages": [{"role": "user", "content": "x" * 9}]}) == 3
    assert (
        estimate_tokens(
            {
                "messages": [
                    {"role": "system", "content": "abcd"},
                    {"role": "user", "content": [{"type": "text", "text": "abcdefgh"}]},
                ],
                "max_tokens": 100,
            }
        )
        == 103
    )


def test_the_files_are_named_by_a_hash_never_the_endpoint(tmp_path, monkeypatch):
    monkeypatch.setenv("AIP_LIMITS_DIR", str(tmp_path / "lim"))
    r = SharedRate.for_endpoint("https://api.example.com/v1?key=secret", 100, None)
    assert limits_dir() == tmp_path / "lim" and r.path.parent == tmp_path / "lim"
    assert "secret" not in r.path.name and "example" not in r.path.name
    assert SharedRate.for_endpoint("https://api.example.com/v1?key=secret", 100, None) is r


WORKER = textwrap.dedent("""
    import asyncio, json, os, sys, time
    from aip_assets.models.client import ModelClient
    from aip_assets.runspec import Connection

    url, extra, concurrency, n, go = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]

    async def main():
        c = Connection(provider="openai", base_url=url, model="m", **extra)
        async with ModelClient(c, role="sut", run_id="r", metric="m", stage="sampling", journal=None,
                               concurrency=concurrency) as cl:
            open(f"{go}.ready-{os.getpid()}", "w").close()
            while not os.path.exists(go):  # every worker starts at the same moment
                time.sleep(0.005)
            rs = await asyncio.gather(*(cl.chat([{"role": "user", "content": f"{os.getpid()} q{i}"}],
                                                temperature=0, timeout=60) for i in range(n)))
        assert all(r.ok for r in rs), [r.error for r in rs]
    asyncio.run(main())
""")


def run_workers(
    tmp_path, url: str, workers: int, extra: dict, concurrency: int, calls: int, env: list[dict[str, str]] | None = None
) -> None:
    """``workers`` processes, each a ModelClient on ``url`` with the connection fields ``extra``,
    sending ``calls`` calls at ``concurrency``, all starting at the same moment; ``env``: each
    worker's own environment additions."""
    go = tmp_path / "go"
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), url, json.dumps(extra), str(concurrency), str(calls), str(go)],
            env={**os.environ, **(env[i] if env else {})},
        )
        for i in range(workers)
    ]
    while len(list(tmp_path.glob("go.ready-*"))) < workers and all(p.poll() is None for p in procs):
        time.sleep(0.02)
    go.touch()
    try:
        for p in procs:
            assert p.wait(120) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


def test_requests_per_minute_holds_across_processes(tmp_path, scripted):
    """Two processes (as `--parallel` workers or two Dagster runs are) send to one endpoint limited
    to 120 requests per minute, starting at the same moment: the server sees their requests one
    0.5 s slot after another, not two at a time. Only lower bounds on time are asserted (a slow
    machine only spreads them further); each process alone would send its first request at once."""
    server = scripted(lambda body, n: "ok")
    run_workers(tmp_path, server.url, 2, {"requests_per_minute": 120}, concurrency=8, calls=3)
    arrivals = sorted(t for b, t in zip(server.requests, server.arrivals) if "q" in str(b["messages"][-1]["content"]))
    assert len(arrivals) == 6
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    assert min(gaps) >= 0.25, gaps  # slots are 0.5 s apart; unshared, both first requests land together
    assert arrivals[-1] - arrivals[0] >= 5 * 0.5 * 0.9


def test_tokens_per_minute_follows_what_the_endpoint_counted(scripted, tmp_path):
    """The schedule is settled with the answer's usage: 20 calls of a short prompt (estimated at
    1-2 tokens) whose answers count 10 + 200 tokens each move the token schedule by 20 × 210
    tokens' worth of time, not by the estimates."""
    from aip_assets.metrics.running import gather_all
    from aip_assets.models.client import ModelClient

    server = scripted(lambda body, n: " ".join(["word"] * 200))
    tpm = 6_000_000  # 0.01 ms per token: nobody waits long
    conn = Connection(provider="openai", base_url=server.url, model="m", tokens_per_minute=tpm)

    async def go():
        async with ModelClient(
            conn, role="sut", run_id="r", metric="m", stage="sampling", journal=None, concurrency=4
        ) as cl:
            t0 = time.time()
            rs = await gather_all(
                *(cl.chat([{"role": "user", "content": f"q{i}"}], temperature=0, timeout=30) for i in range(20))
            )
            return t0, rs, cl.limiter

    t0, rs, limiter = asyncio.run(go())
    assert all(r.ok and r.prompt_tokens == 10 and r.completion_tokens == 200 for r in rs)
    import struct

    _, paid_off = struct.unpack("<dd", limiter.path.read_bytes())
    assert paid_off - t0 >= 20 * 210 * 60 / tpm * 0.999


class Spy:
    """A limiter that records what each attempt was charged and settled at."""

    def __init__(self):
        self.charged: list[int] = []
        self.settled: list[tuple[int, int]] = []

    async def wait(self, tokens: int = 0) -> None:
        self.charged.append(tokens)

    def settle(self, estimated: int, counted: int) -> None:
        self.settled.append((estimated, counted))


def _spied_chat(server, body_extra=None, retries=0, **conn):
    from aip_assets.models.client import ModelClient

    c = Connection(
        provider="openai", base_url=server.url, model="m", tokens_per_minute=10**9, params=body_extra or {}, **conn
    )
    spy = Spy()

    async def go():
        async with ModelClient(
            c, role="sut", run_id="r", metric="m", stage="sampling", journal=None, backoff_s=0.01
        ) as cl:
            cl.limiter = spy
            return await cl.chat([{"role": "user", "content": "x" * 40}], temperature=0, retries=retries, timeout=30)

    return asyncio.run(go()), spy


def test_each_attempt_is_charged_then_settled_at_what_the_endpoint_counted(scripted):
    """A 40-character prompt is 10 tokens; max_tokens 50 is reserved too. Answered with usage:
    settled at the usage. Without usage: the prompt estimate plus the answer's characters / 4.
    max_completion_tokens is reserved like max_tokens and never counted twice. A 429 settles at 0
    (refused before any token), a 500 at the prompt; a retried call is charged per attempt."""
    from .scripted import Reply

    ok = scripted(
        lambda body, n: Reply(
            body={
                "choices": [{"message": {"content": "y" * 20}}],
                "usage": {"prompt_tokens": 7, "completion_tokens": 3},
            }
        )
    )
    r, spy = _spied_chat(ok, max_tokens=50)
    assert r.ok and spy.charged == [60] and spy.settled == [(60, 10)]
    bare = scripted(lambda body, n: Reply(body={"choices": [{"message": {"content": "y" * 20}}]}))
    r, spy = _spied_chat(bare, body_extra={"max_completion_tokens": 50})
    assert r.ok and spy.charged == [60] and spy.settled == [(60, 10 + 5)]
    half = scripted(
        lambda body, n: Reply(body={"choices": [{"message": {"content": "y" * 20}}], "usage": {"completion_tokens": 3}})
    )
    r, spy = _spied_chat(half)
    assert spy.settled == [(10, 10 + 3)]  # the prompt count it left out: estimated
    flaky = scripted(lambda body, n: Reply(status=429) if n == 1 else (Reply(status=500) if n == 2 else "fine"))
    r, spy = _spied_chat(flaky, retries=3)
    assert r.ok and spy.charged == [10, 10, 10]
    assert spy.settled[:2] == [(10, 0), (10, 10)] and spy.settled[2][0] == 10


def test_a_stored_time_far_ahead_or_not_a_number_is_taken_as_free(tmp_path):
    import struct

    r = SharedRate(EP, rpm=60, tpm=None, directory=tmp_path)
    for bad in (float("inf"), float("nan"), time.time() + 10 * 86_400):
        r.path.write_bytes(struct.pack("<dd", bad, bad))
        now = time.time()
        assert r.reserve(0, now=now) == now
    r.close()


def test_a_limits_folder_of_another_user_or_open_to_others_is_refused(tmp_path):
    from aip_assets.errors import AipError

    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    with pytest.raises(AipError, match="nobody else can write"):
        SharedRate(EP, rpm=60, tpm=None, directory=shared)
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    with pytest.raises(AipError, match="rate-limit folder"):
        SharedRate(EP, rpm=60, tpm=None, directory=link)
    ok = SharedRate(EP, rpm=60, tpm=None, directory=tmp_path / "mine")
    assert oct((tmp_path / "mine").stat().st_mode & 0o777) == "0o700"
    ok.close()


# ------------------------------------------------------------------ max_connections, shared
def test_connection_slots_by_hand(tmp_path):
    """max_connections 10 in 10 slot files. A client wanting 8 takes 8; a second wanting 8 finds 2
    free and, short of its fair share (10 / 2 clients = 5), says so; the first then gives back
    down to 5 and the second takes them. With nobody short a client grows into free slots; a
    closed client's slots are free at once, and a client whose process died holds none."""
    from aip_assets.models.slots import SharedSlots

    a = SharedSlots(EP, 10, want=8, directory=tmp_path)
    assert a.look() == 8
    b = SharedSlots(EP, 10, want=8, directory=tmp_path)
    assert b.look() == 2  # short of its share of 5: it says so
    assert a.look() == 5  # another client is short: back to the fair share
    assert b.look() == 5
    assert a.look() == 5 and b.look() == 5  # settled: nobody short, nothing free
    b.close()
    time.sleep(2.1)  # b's "short" mark is older than SHORT_FRESH_S (b is gone anyway)
    assert a.look() == 8  # alone again: grows to what it wants
    # a process that dies holding slots: its locks go with it, and its member file is removed
    code = textwrap.dedent(f"""
        import os, sys, time
        from pathlib import Path
        from aip_assets.models.slots import SharedSlots
        s = SharedSlots({EP!r}, 10, want=2, directory=Path({str(tmp_path)!r}))
        print(s.look(), flush=True)
        time.sleep(60)
    """)
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "2"
    a.close()
    c = SharedSlots(EP, 10, want=10, directory=tmp_path)
    assert c.look() == 8  # the live child holds 2
    child.kill()
    child.wait()
    assert c.look() == 10 and [p.name for p in c.dir.glob("m-*")] == [c.member.name]
    c.close()
    # more clients than the share rounded up would serve: 4 connections, 3 clients wanting 4 each;
    # the share is 4 // 3 = 1, so every client gets a slot (rounded up, 2/2/0 would settle)
    xs = [SharedSlots(EP, 4, want=4, directory=tmp_path / "four")]
    assert xs[0].look() == 4
    for _ in range(2):
        xs.append(SharedSlots(EP, 4, want=4, directory=tmp_path / "four"))
    for _ in range(4):  # a few rounds of looks, as each client's background task makes them
        for x in xs:
            x.look()
    assert all(x.capacity >= 1 for x in xs) and sum(x.capacity for x in xs) <= 4, [x.capacity for x in xs]
    for x in xs:
        x.close()
    # giving back never cuts under calls in flight: a holder of 8 with 6 calls running keeps 6 slots
    # (and may start no new call: its bound is its share), then lets them go as its calls end
    h = SharedSlots(EP, 8, want=8, directory=tmp_path / "eight")
    assert h.look() == 8
    s2 = SharedSlots(EP, 8, want=8, directory=tmp_path / "eight")
    assert s2.look() == 0  # nothing free: short
    assert h.look(in_flight=6) == 4 and h.capacity == 6  # bound 4 (its share), 6 slots kept for the calls
    assert s2.look() == 2
    assert h.look(in_flight=1) == 4 and h.capacity == 4
    assert s2.look() == 4
    h.close()
    s2.close()
    # 512 connections in 64 files of 8; a client wanting 20 takes 3 files (24)
    d = SharedSlots(EP, 512, want=20, directory=tmp_path)
    assert len(d.sizes) == 64 and set(d.sizes) == {8} and d.look() == 24
    d.close()


def test_max_connections_holds_across_processes(tmp_path, scripted):
    """Three processes, each wanting 6 calls in flight, call one endpoint with max_connections 6
    (answers take 0.2 s): the server never has more than 6 requests open at once, every call of
    every process is answered, and the processes share the slots while they all run (a holder
    gives back as its calls end, without a new call of its own to prompt it). Unshared, the
    server saw 18 at once."""
    from aip_assets_tests.scripted import Reply

    def handler(body, n):
        return Reply(text="ok", delay_s=0.2)

    server = scripted(handler)
    run_workers(tmp_path, server.url, 3, {"max_connections": 6}, concurrency=6, calls=30)
    assert len(server.bodies()) == 90
    assert 1 <= server.peak_open <= 6, server.peak_open  # counted by the server, until each answer leaves
    # shared, not taken in turn: every process's first call came before the first process's last
    # (alone, the first would take 5 rounds of 0.2 s; the others get slots at its next look)
    pid_of = [b["messages"][-1]["content"].split()[0] for b in server.bodies()]
    last_of_first = max(i for i, p in enumerate(pid_of) if p == pid_of[0])
    assert all(pid_of.index(p) < last_of_first for p in set(pid_of))


def test_a_change_of_slots_never_undoes_a_rate_limit_cut():
    """The calls in flight stay under the adaptive limit and the slots held, separately: a 429
    halves what was allowed; slots going down then up again leave the cut in place; it grows
    back only by successes."""
    from aip_assets.models.concurrency import AdaptiveLimit

    async def go():
        lim = AdaptiveLimit(8)
        await lim.set_cap(4)
        assert lim.bound == 4
        lim.throttled(lim.cuts)  # a 429 while 4 were allowed: 2
        assert lim.bound == 2 and lim.cuts == 1
        await lim.set_cap(2)
        await lim.set_cap(8)
        assert lim.bound == 2  # the slots came back; the cut stays
        for _ in range(2):
            await lim.succeeded()
        assert lim.bound == 3  # additive increase
        await lim.set_cap(1)
        assert lim.bound == 1

    asyncio.run(go())


# ------------------------------------------------------------------ shared across machines (Postgres)
def test_the_postgres_schedule_is_the_same_arithmetic_as_the_files(postgres, monkeypatch):
    """PgRate keeps SharedRate's schedule in Postgres: the worked example of the file schedule,
    step for step, and two instances (as two workers) share it."""
    from aip_assets.models.ratelimit import PgRate

    ep = f"http://127.0.0.1:1/v1/pg-{os.getpid()}"
    a = PgRate(ep, rpm=60, tpm=600, url=postgres.url)
    assert a.reserve(5, now=100.0) == 100.0
    assert a.reserve(30, now=100.0) == 101.0
    assert a.reserve(0, now=100.0) == 104.0
    a.settle(30, 10)
    assert a.reserve(0, now=100.0) == 105.0
    b = PgRate(ep, rpm=60, tpm=600, url=postgres.url)  # another worker, the same row
    assert b.reserve(0, now=100.0) == 106.0
    assert b.reserve(0, now=200.0) == 200.0
    assert PgRate(ep + "/other", rpm=60, tpm=None, url=postgres.url).reserve(0, now=100.0) == 100.0
    # on the database's clock, returned on this machine's: a free endpoint starts now
    fresh = PgRate(ep + "/fresh", rpm=60, tpm=None, url=postgres.url)
    assert abs(fresh.reserve(0) - time.time()) < 5
    for r in (a, b, fresh):
        r.close()
    monkeypatch.setenv("AIP_SHARED_STATE_URL", postgres.url)
    shared = SharedRate.for_endpoint(ep + "/picked", 60, None)
    assert isinstance(shared, PgRate) and "Postgres" in shared.where()


def test_workers_that_connect_at_once_to_a_new_database_all_find_the_tables(postgres):
    """Two workers started together both make the shared-state tables of a new database (test_workers'
    lake case failed in CI this way). CREATE TABLE IF NOT EXISTS alone lets one of them fail
    ("relation ... already exists", "type ... already exists" or a duplicate pg_type key, all
    measured); so each makes them under the setup lock, in turn.

    First the turn itself: while another session holds the lock, a connection waits for it and
    makes nothing; when it is let go, the connection goes on. The partition leases' tables wait for
    the same turn. Then four connections at once, on four new databases: none fails, and none keeps
    the lock."""
    import threading

    import psycopg

    from aip_assets.shared_state import _PG_TABLES, _SETUP_LOCK, connect

    from .conftest import new_database

    def tables(con) -> list[str]:
        return [r[0] for r in con.execute("SELECT tablename FROM pg_tables WHERE tablename LIKE 'aip_%' ORDER BY 1")]

    def setup_locks(con, where: str = "true") -> int:  # a bigint key's low 32 bits are its objid
        sql = f"SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = %s AND {where}"
        return con.execute(sql, [_SETUP_LOCK]).fetchone()[0]

    def waiting(con) -> int:
        return setup_locks(con, "NOT granted")

    errors: list[str] = []

    def worker(out: list, make: Callable[[], object]) -> None:
        try:
            out.append(make())
        except Exception as e:  # noqa: BLE001 - every failure is the finding
            errors.append(str(e))

    def shared_state(url: str) -> Callable[[], object]:
        return lambda: connect(url, "make the shared-state tables", _PG_TABLES)

    def leases(url: str) -> Callable[[], object]:
        """A worker's first lease makes the leases' tables; its connection (and the shared-state
        tables) made before the lock is taken, so that the wait is the leases' own."""
        from aip_assets.leases import PgLease
        from aip_assets.shared_state import SharedDb

        db = SharedDb.get(url)
        db.run("connect", lambda c: None)
        return lambda: PgLease("r", "m", "sampling", db, 30)._ensure()

    state = ["aip_rate_schedule", "aip_run_budget"]
    for maker, before, made in (
        (shared_state, [], state),
        (leases, state, ["aip_partition_lease", *state, "aip_stage_done"]),
    ):
        url = new_database(postgres)
        make = maker(url)
        with psycopg.connect(url, autocommit=True) as other:
            other.execute("SELECT pg_advisory_lock(%s)", [_SETUP_LOCK])
            done: list = []
            t = threading.Thread(target=worker, args=(done, make))
            t.start()
            deadline = time.monotonic() + 30
            while not waiting(other) and not done and time.monotonic() < deadline:
                time.sleep(0.02)
            assert (waiting(other), done, errors, tables(other)) == (1, [], [], before)
            other.execute("SELECT pg_advisory_unlock(%s)", [_SETUP_LOCK])
            t.join(timeout=30)
            assert errors == [] and len(done) == 1
            assert tables(other) == made
            if done[0] is not None:
                done[0].close()

    for _ in range(4):
        url = new_database(postgres)
        start, conns = threading.Barrier(4), []

        def together() -> None:
            start.wait()
            worker(conns, shared_state(url))

        threads = [threading.Thread(target=together) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == [] and len(conns) == 4
        assert tables(conns[0]) == ["aip_rate_schedule", "aip_run_budget"]
        assert setup_locks(conns[0]) == 0
        for c in conns:
            c.close()


def test_requests_per_minute_holds_across_machines_through_postgres(tmp_path, scripted, postgres):
    """Two workers as on two machines (each its own limits folder, so nothing on disk is shared),
    4 requests/s allowed: with AIP_SHARED_STATE_URL the server sees at most 4 starts in any second
    (every fifth request at least a second after the first of them); without it, as a control,
    the two together send twice that. Lower bounds on time only."""
    server = scripted(lambda body, n: "ok")

    def arrivals_of(env):
        before = len(server.requests)
        run_workers(
            tmp_path / env[0]["TAG"], server.url, 2, {"requests_per_minute": 240}, concurrency=8, calls=8, env=env
        )
        return sorted(
            t
            for b, t in zip(server.requests[before:], server.arrivals[before:])
            if " q" in str(b["messages"][-1]["content"])
        )

    def machines(tag, shared):
        out = []
        for i in range(2):
            (tmp_path / tag / f"limits{i}").mkdir(parents=True, mode=0o700)
            out.append(
                {
                    "TAG": tag,
                    "AIP_LIMITS_DIR": str(tmp_path / tag / f"limits{i}"),
                    "AIP_SHARED_STATE_URL": postgres.url if shared else "",
                }
            )
        return out

    shared = arrivals_of(machines("shared", True))
    assert len(shared) == 16
    fifth = [b - a for a, b in zip(shared, shared[4:])]
    # 0.25 s slots: five starts span a second, sixteen 3.75 s (slack for a late arrival at the server)
    assert min(fifth) >= 0.75 and shared[-1] - shared[0] >= 3.25, fifth
    alone = arrivals_of(machines("alone", False))
    assert len(alone) == 16
    # each machine alone holds 4/s, so the two together send 8/s: sixteen starts in about 1.75 s
    assert min(b - a for a, b in zip(alone, alone[4:])) < 0.75 and alone[-1] - alone[0] < 3.25


def test_a_bad_shared_state_url_stops_the_run_before_anything_is_written(tmp_path, capsys, monkeypatch):
    """AIP_SHARED_STATE_URL naming no database: `aip-eval run` stops at its checks with an error
    that names the variable and hides the password; nothing is written."""
    from aip_assets.cli import main

    from .conftest import write_dataset

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    monkeypatch.setenv("AIP_SHARED_STATE_URL", f"postgresql://aip:s3cretpw@127.0.0.1:{port}/x")
    ds = write_dataset(tmp_path / "d.jsonl", 2)
    spec = tmp_path / "s.yaml"
    spec.write_text(
        json.dumps(
            {
                "name": "shared",
                "dataset": str(ds),
                "metrics": {"llm.decision_flip": {"config": {"dimensions": ["gender"], "num_pairs_per_dimension": 1}}},
            }
        )
    )
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert main(["run", str(spec), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"AIP_SHARED_STATE_URL (postgresql://aip@127.0.0.1:{port}/x): cannot connect" in err, err
    assert "s3cretpw" not in err, err
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_shared_state_messages_never_show_the_password(postgres):
    """The database is named from the parsed URL, and a driver message is scrubbed of the URL and
    the password in every spelling: percent-encoded with an @, in the query string, keyword form,
    a URL libpq cannot read (whose parse error would quote it), a closed port."""
    from aip_assets.errors import AipError
    from aip_assets.shared_state import SharedDb, _scrub, describe

    assert describe("postgresql://aip:p%40ss:w0rd@db.example:5433/evals") == "postgresql://aip@db.example:5433/evals"
    assert describe("postgresql://aip@h/db?password=topsecret&sslmode=require") == "postgresql://aip@h/db"
    assert describe("host=h user=u password=kw-secret dbname=d") == "postgresql://u@h/d"
    assert describe("postgresql://[::1]:5432/db") == "postgresql://[::1]:5432/db"
    assert "hunter2" not in describe("garbage hunter2")
    url = "postgresql://aip:p%40ss@h/x"
    assert _scrub(f'could not parse "{url}": "p@ss" or "p%40ss"', url) == 'could not parse "***": "***" or "***"'
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for bad, secret in [
        (f"postgresql://aip:p%40ss-w0rd@127.0.0.1:{port}/x", "ss-w0rd"),
        (f"postgresql://aip@127.0.0.1:{port}/x?password=q-secret", "q-secret"),
        ("postgresql://aip:pw-secret@127.0.0.1:notaport/x", "pw-secret"),
        ("postgresql://aip:pw-secret@127.0.0.1:1/x?nosuchoption=1", "pw-secret"),
        ("not a url, password pw-secret", "pw-secret"),
    ]:
        with pytest.raises(AipError) as e:
            SharedDb(bad).run("a test", lambda c: c.execute("SELECT 1"))
        msg = str(e.value)
        assert "AIP_SHARED_STATE_URL" in msg and secret not in msg and bad not in msg, msg


def test_the_shared_state_survives_a_lost_connection_and_a_deleted_row(postgres, caplog):
    """The database drops the worker's connection mid-run: the next statement connects again (and
    says so); rows deleted meanwhile are made again. When it cannot connect again (the role may no
    longer log in), the error names the variable and what failed, not a raw driver error."""
    import psycopg

    from aip_assets.errors import AipError
    from aip_assets.models.budget import PgBudget
    from aip_assets.models.ratelimit import PgRate
    from aip_assets.shared_state import SharedDb

    role = f"w{os.getpid()}"
    with psycopg.connect(postgres.url, autocommit=True) as admin:
        SharedDb.get(postgres.url).run("tables", lambda c: None)  # the tables, made by the superuser
        admin.execute(f"CREATE ROLE {role} LOGIN")
        admin.execute(f"GRANT ALL ON SCHEMA public TO {role}")
        admin.execute(f"GRANT ALL ON ALL TABLES IN SCHEMA public TO {role}")
        url = postgres.url.replace("//aip@", f"//{role}@")
        rate = PgRate(f"http://127.0.0.1:1/v1/lost-{role}", rpm=60, tpm=None, url=url)
        budget = PgBudget(f"lost-{role}", None, 3, None, url)
        assert rate.reserve(0, now=500.0) == 500.0
        budget.reserve()

        def kill():
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", [role])

        kill()
        admin.execute("DELETE FROM aip_run_budget WHERE run_id = %s", [f"lost-{role}"])
        with caplog.at_level("WARNING", logger="aip_assets"):
            assert rate.reserve(0, now=500.0) == 501.0  # connected again; the schedule kept
        assert "connection was lost" in caplog.text
        admin.execute("DELETE FROM aip_rate_schedule WHERE endpoint = %s", [rate.key])
        assert rate.reserve(0, now=500.0) == 500.0  # the row made again
        budget.reserve()
        assert budget.calls == 1  # the deleted row made again (from no journal)
        admin.execute(f"ALTER ROLE {role} NOLOGIN")
        kill()
        with pytest.raises(AipError) as e:
            rate.reserve(0, now=500.0)
        assert str(e.value).startswith(
            f"AIP_SHARED_STATE_URL (postgresql://{role}@127.0.0.1:{postgres.port}/postgres): cannot connect"
        ), e.value
        with pytest.raises(AipError, match="AIP_SHARED_STATE_URL"):
            budget.reserve()
        admin.execute(f"ALTER ROLE {role} LOGIN")
        assert rate.reserve(0, now=900.0) == 900.0  # and back once the database lets it in


def test_waiting_on_the_shared_schedule_leaves_the_event_loop_running(postgres, monkeypatch):
    """Another worker holds the endpoint's row: the wait for it happens on the database's thread,
    so the event loop (every other call of the client) keeps running; past the lock timeout the
    wait fails with an error that names the variable."""
    import psycopg

    from aip_assets import shared_state
    from aip_assets.errors import AipError
    from aip_assets.models.ratelimit import PgRate

    monkeypatch.setattr(shared_state, "LOCK_TIMEOUT_S", 1)
    url = postgres.url + "?application_name=loop"  # a connection of its own, with the short timeout
    rate = PgRate(f"http://127.0.0.1:1/v1/loop-{os.getpid()}", rpm=6000, tpm=None, url=url)
    rate.reserve(0)
    ticks = []

    async def go(hold_s):
        async def ticker():
            while True:
                ticks.append(time.monotonic())
                await asyncio.sleep(0.01)

        t = asyncio.create_task(ticker())
        try:
            with psycopg.connect(postgres.url, autocommit=True) as other, other.transaction():
                other.execute("SELECT 1 FROM aip_rate_schedule WHERE endpoint = %s FOR UPDATE", [rate.key])
                w = asyncio.create_task(rate.wait(0))
                await asyncio.sleep(hold_s)
                n_held = len(ticks)
            await w
        finally:
            t.cancel()
        return n_held

    assert asyncio.run(go(0.4)) >= 10  # ~40 ticks while the row was held; none if the loop were blocked
    with pytest.raises(AipError, match=r"AIP_SHARED_STATE_URL .*the rate schedule of .*lock timeout"):
        asyncio.run(go(1.6))


def test_a_worker_with_a_skewed_clock_waits_the_schedules_time_on_its_own(postgres, monkeypatch):
    """The schedule runs on the database's clock; a worker whose clock is an hour ahead still waits
    one slot (1 s at 60 requests/min) for its second request, not an hour or nothing."""
    from aip_assets.models import ratelimit
    from aip_assets.models.ratelimit import PgRate

    real = time.time
    monkeypatch.setattr(ratelimit.time, "time", lambda: real() + 3600)
    rate = PgRate(f"http://127.0.0.1:1/v1/skew-{os.getpid()}", rpm=60, tpm=None, url=postgres.url)
    before = ratelimit.time.time()
    first = rate.reserve(0)
    second = rate.reserve(0)
    assert 0 <= first - before < 30, first - before  # now, on this machine's (skewed) clock
    assert 0.9 < second - first < 1.1, second - first  # one slot later; an hour off, or 0, without the conversion


BUDGET_WORKER = textwrap.dedent("""
    import asyncio, json, os, sys, time
    from aip_assets.models.budget import Budget, BudgetExhausted
    from aip_assets.models.client import ModelClient
    from aip_assets.runspec import Connection

    url, run_id, max_calls, n, go = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]

    async def main():
        c = Connection(provider="openai", base_url=url, model="m")
        budget = Budget.for_run(run_id, None, max_calls, None)
        sent = refused = 0
        async with ModelClient(c, role="sut", run_id=run_id, metric="m", stage="sampling", journal=None,
                               concurrency=4, budget=budget) as cl:
            open(f"{go}.ready-{os.getpid()}", "w").close()
            while not os.path.exists(go):
                time.sleep(0.005)
            for i in range(n):
                try:
                    r = await cl.chat([{"role": "user", "content": f"{os.getpid()} b{i}"}], temperature=0, timeout=60)
                    sent += r.ok
                except BudgetExhausted as e:
                    refused += 1
                    assert "limits.max_calls = " + str(max_calls) in str(e), e
        print(json.dumps({"sent": sent, "refused": refused}))
    asyncio.run(main())
""")


def test_a_runs_call_cap_holds_across_workers_through_postgres(tmp_path, scripted, postgres, monkeypatch):
    """limits.max_calls is the run's, not a worker's: two workers of one run (separate processes,
    no journal in common), 9 calls each, max_calls 10 through AIP_SHARED_STATE_URL. The server
    gets exactly 10; the other 8 are refused with the cap's message."""
    server = scripted(lambda body, n: "ok")
    monkeypatch.setenv("AIP_SHARED_STATE_URL", postgres.url)
    go = tmp_path / "go"
    script = tmp_path / "budget_worker.py"
    script.write_text(BUDGET_WORKER)
    run_id = f"shared-{os.getpid()}-{time.time_ns()}"
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), server.url, run_id, "10", "9", str(go)],
            stdout=subprocess.PIPE,
            text=True,
            env=os.environ.copy(),
        )
        for _ in range(2)
    ]
    try:
        while len(list(tmp_path.glob("go.ready-*"))) < 2 and all(p.poll() is None for p in procs):
            time.sleep(0.02)
        go.touch()
        outs = [json.loads(p.communicate(timeout=120)[0].strip().splitlines()[-1]) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0]
    assert sum(o["sent"] for o in outs) == 10 and sum(o["refused"] for o in outs) == 8, outs
    assert len([b for b in server.requests if " b" in str(b["messages"][-1]["content"])]) == 10
