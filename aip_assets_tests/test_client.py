"""The model client's retry policy, against a scripted server: which failures are retried, how
many times, and what Retry-After does."""

from __future__ import annotations

import asyncio
import time

import pytest

from aip_assets.models.client import ModelClient
from aip_assets.models.request import build_body, call_key
from aip_assets.models.retry import retry_after_s as _retry_after
from aip_assets.runspec import Connection

from .scripted import Reply


def _chat(url: str, retries: int, **conn):
    async def go():
        c = Connection(provider="openai", base_url=url, model="m", **conn)
        async with ModelClient(c, role="sut", run_id="r", metric="m", stage="s", journal=None, backoff_s=0.01) as cl:
            t0 = time.monotonic()
            r = await cl.chat([{"role": "user", "content": "q"}], temperature=0, retries=retries, timeout=5)
            return r, time.monotonic() - t0

    return asyncio.run(go())


def record_sleeps(monkeypatch) -> list[float]:
    """The client's waits, recorded instead of slept (no wall clock in the test)."""
    from aip_assets.models import client as client_mod

    slept: list[float] = []
    real_sleep = asyncio.sleep

    async def record(d, *a, **k):
        slept.append(d)
        await real_sleep(0)

    monkeypatch.setattr(client_mod.asyncio, "sleep", record)
    return slept


def _sequence(statuses: list[int], headers: dict | None = None):
    """A handler answering the given statuses in turn, then 200 'fine'."""

    def handler(body, n):
        i = handler.calls
        handler.calls += 1
        if i < len(statuses):
            return Reply(statuses[i], headers=headers or {})
        return "fine"

    handler.calls = 0
    return handler


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
def test_other_4xx_are_not_retried(scripted, status):
    h = _sequence([status])
    server = scripted(h)
    r, _ = _chat(server.url, retries=3)
    assert not r.ok and r.http_status == status and r.attempts == 1 and h.calls == 1
    assert r.error.startswith(f"HTTP {status}")


@pytest.mark.parametrize("status", [408, 409, 425, 429, 500, 502, 503])
def test_transient_failures_are_retried_within_the_budget(scripted, status):
    h = _sequence([status, status])
    server = scripted(h)
    r, _ = _chat(server.url, retries=2)
    assert r.ok and r.text == "fine" and r.attempts == 3 and r.retries_used == 2 and h.calls == 3
    h2 = _sequence([status, status, status])
    server2 = scripted(h2)
    r, _ = _chat(server2.url, retries=2)
    assert not r.ok and r.attempts == 3 and h2.calls == 3  # the budget: one try and two retries


def test_retry_after_is_honoured_and_uses_no_budget(scripted):
    h = _sequence([429, 429], headers={"Retry-After": "0.3"})
    server = scripted(h)
    r, took = _chat(server.url, retries=0)
    assert r.ok and r.rate_limit_waits == 2 and r.retries_used == 0 and r.attempts == 3
    assert took >= 0.6  # it waited as told
    # a 500 with Retry-After is a failure (it uses the budget), waited as told
    h = _sequence([500], headers={"Retry-After": "0.2"})
    server = scripted(h)
    r, took = _chat(server.url, retries=1)
    assert r.ok and r.retries_used == 1 and r.rate_limit_waits == 0 and took >= 0.2


def test_compressed_answers_and_the_request_as_sent_and_journaled(scripted, tmp_path):
    """The transport hands httpx an answer aiohttp has already inflated: a gzip 200 (non-ASCII
    text) and a gzip 429 (its Retry-After and error text) read as plain ones. The request is
    sent as the JSON the journal keeps, in the body's own key order; the call key hashes its
    canonical (sorted) form."""
    import json

    from aip_assets.hashing import stable_json, wire_json
    from aip_assets.models.journal import Journal

    answers = iter(
        [
            Reply(429, headers={"Retry-After": "0.1"}, gzip=True, body={"error": {"message": "slow down ✋"}}),
            Reply(text="Décision : APPROUVÉ ✓ " * 40, gzip=True),
        ]
    )
    server = scripted(lambda body, n: next(answers))
    journal = Journal(tmp_path / "j.sqlite")

    async def go():
        c = Connection(provider="openai", base_url=server.url, model="m")
        async with ModelClient(c, role="sut", run_id="r", metric="m", stage="s", journal=journal) as cl:
            return await cl.chat([{"role": "user", "content": "Prêt ? ✓"}], temperature=0.5, timeout=5)

    r = asyncio.run(go())
    assert r.ok and r.text == "Décision : APPROUVÉ ✓ " * 40 and r.rate_limit_waits == 1 and r.attempts == 2
    sent = server.bodies()[-1]
    journal.flush()
    [frame] = journal.frames("r", "m", "s")
    assert frame.request[0] == server.raw[-1].decode("utf-8") and json.loads(frame.request[0]) == sent  # as sent
    assert frame.request[0] == wire_json(sent) != stable_json(sent)  # the body's own order, not sorted
    assert frame.call_key[0] == r.call_key
    journal.close()


def test_retry_after_formats():
    assert _retry_after({"Retry-After": "2"}) == 2.0
    assert _retry_after({"retry-after": "0.5"}) == 0.5
    assert _retry_after({"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0  # a date in the past
    assert _retry_after({"Retry-After": "soon"}) is None and _retry_after({}) is None


def test_call_identity():
    conn = Connection(provider="openai", base_url="http://x/v1", model="m")
    msgs = [{"role": "user", "content": "q"}]
    b0, b1 = build_body(conn, msgs, 0.7, None, sample_index=0), build_body(conn, msgs, 0.7, None, sample_index=1)
    assert "seed" not in b0 and b1["seed"] == 1  # N fresh samples are N distinct requests
    k = call_key("e", b0, 0, "t")
    assert len(k) == 32 and int(k, 16) >= 0  # 128 bits of a SHA-256, hex
    assert k == call_key("e", dict(reversed(list(b0.items()))), 0, "t")  # key order does not matter
    assert (
        len(
            {
                k,
                call_key("e", b1, 1, "t"),
                call_key("e", b0, 0, "t2"),
                call_key("e", b0, 0, "t", attempt=1),
                call_key("f", b0, 0, "t"),
            }
        )
        == 5
    )


def test_backoff_is_exponential_with_jitter(scripted, monkeypatch):
    """Without Retry-After, the k-th retry waits backoff x 2^(k-1) x (0.5 + u), u uniform in [0, 1):
    the waits asked of asyncio.sleep are recorded (no wall clock)."""
    import random

    slept = record_sleeps(monkeypatch)
    server = scripted(_sequence([500, 500, 500]))

    async def go():
        c = Connection(provider="openai", base_url=server.url, model="m")
        async with ModelClient(c, role="sut", run_id="r", metric="m", stage="s", journal=None, backoff_s=0.2) as cl:
            cl._rng = random.Random(7)
            return await cl.chat([{"role": "user", "content": "q"}], temperature=0, retries=3, timeout=5)

    r = asyncio.run(go())
    u = random.Random(7)
    want = [0.2 * 2**k * (0.5 + u.random()) for k in range(3)]
    assert r.ok and slept == pytest.approx(want)


def test_a_503_with_retry_after_is_a_wait_too(scripted):
    h = _sequence([503], headers={"Retry-After": "0.05"})
    server = scripted(h)
    r, _ = _chat(server.url, retries=0)
    assert r.ok and r.rate_limit_waits == 1 and r.retries_used == 0 and r.http_status == 200


def test_latency_is_measured_in_milliseconds(scripted):
    import time as _t

    def slow(body, n):
        _t.sleep(0.2)
        return "fine"

    server = scripted(slow)
    r, took = _chat(server.url, retries=0)
    assert r.ok and 200 <= r.latency_ms <= took * 1000 + 1
    server = scripted(lambda body, n: (_t.sleep(0.2), Reply(400))[1])
    r, took = _chat(server.url, retries=0)
    assert not r.ok and 200 <= r.latency_ms <= took * 1000 + 1


def test_rate_limit_waits_are_bounded_per_call_and_by_silence(scripted, monkeypatch):
    """Each wait sleeps max(Retry-After, backoff); a call waits while its total stays within
    max_rate_limit_wait_seconds (a wait that reaches it exactly is allowed) and while the
    endpoint's silence, plus the wait, stays within it too. The client's clock is a fake that
    only the recorded waits advance (a loaded machine's real latency never enters the count)."""
    import types

    from aip_assets.models import client as client_mod
    from aip_assets.models import deadline as deadline_mod
    from aip_assets.models import retry as retry_mod

    slept: list[float] = []
    real_sleep = asyncio.sleep
    clock = {"now": 1000.0}

    async def record(d, *a, **k):
        slept.append(d)
        clock["now"] += d
        await real_sleep(0)

    monkeypatch.setattr(client_mod.asyncio, "sleep", record)
    fake = types.SimpleNamespace(monotonic=lambda: clock["now"], perf_counter=lambda: clock["now"])
    for mod in (client_mod, retry_mod, deadline_mod):  # every module of the client that reads the clock
        monkeypatch.setattr(mod, "time", fake)
    server = scripted(lambda body, n: Reply(429, headers={"Retry-After": "0.25"}))
    r, _ = _chat(server.url, retries=0, max_rate_limit_wait_seconds=1.0)
    assert slept == [0.25] * 4 and r.rate_limit_waits == 4 and r.attempts == 5 and "rate limited" in r.error
    slept.clear()
    server = scripted(lambda body, n: Reply(429, headers={"Retry-After": "0"}))
    r, _ = _chat(server.url, retries=0, max_rate_limit_wait_seconds=0.05)  # backoff 0.01: Retry-After 0 waits 0.01
    assert slept and all(d == 0.01 for d in slept) and len(slept) <= 5
    # silence spans calls: a second call to an endpoint that has answered nothing for the whole
    # window gets no wait at all (its own wait total is still 0), and says so
    slept.clear()
    server = scripted(lambda body, n: Reply(429, headers={"Retry-After": "0.25"}))

    async def two_calls():
        c = Connection(provider="openai", base_url=server.url, model="m", max_rate_limit_wait_seconds=1.0)
        async with ModelClient(c, role="sut", run_id="r", metric="m", stage="s", journal=None, backoff_s=0.01) as cl:
            first = await cl.chat([{"role": "user", "content": "q1"}], temperature=0, retries=0, timeout=5)
            second = await cl.chat([{"role": "user", "content": "q2"}], temperature=0, retries=0, timeout=5)
            return first, second

    first, second = asyncio.run(two_calls())
    assert first.rate_limit_waits == 4 and second.rate_limit_waits == 0 and second.attempts == 1
    assert "answered nothing for 1s" in second.error and slept == [0.25] * 4


# ------------------------------------------------------------------ the row deadline (issue 11)
async def chat_as_row(cl: ModelClient, row: str, **kw):
    """One call made for dataset row ``row`` (as run_bounded marks a work item's calls)."""
    from aip_assets.models import deadline as deadline_mod

    token = deadline_mod.CURRENT_ROW.set(row)
    try:
        return await cl.chat([{"role": "user", "content": "q"}], temperature=0, **kw)
    finally:
        deadline_mod.CURRENT_ROW.reset(token)


def _round_trip(url: str) -> float:
    """Seconds one answered request takes on this machine now (the tests' patience is scaled by it)."""

    async def go():
        c = Connection(provider="openai", base_url=url, model="m")
        async with ModelClient(c, role="sut", run_id="r", metric="m", stage="s", journal=None) as cl:
            t0 = time.monotonic()
            for _ in range(3):
                await cl.chat([{"role": "user", "content": "warm"}], temperature=0, timeout=30)
            return (time.monotonic() - t0) / 3

    return asyncio.run(go())


def test_a_rows_calls_end_at_its_deadline_and_other_rows_keep_their_own(scripted):
    """Row r1's first call is answered, its second is cut at the deadline (it was sent: attempts
    1, an error that names the deadline), its third is never sent; row r2's clock is its own."""
    from aip_assets.metrics.running import run_bounded

    state = {"delay": 0.0}
    server = scripted(lambda body, n: Reply(text=f"answer {n}", delay_s=state["delay"]))
    unit = max(0.4, 20 * _round_trip(server.url))  # a slow answer, far above this machine's overhead
    state["delay"] = unit
    sent_before = len(server.bodies())
    notes: list[dict] = []

    from aip_assets.models.budget import Budget

    budget = Budget("r", None, max_calls=3, max_tokens=None)  # exactly the calls really sent

    async def go():
        c = Connection(provider="openai", base_url=server.url, model="m")
        async with ModelClient(
            c,
            role="sut",
            run_id="r",
            metric="llm.decision_flip",
            stage="sampling",
            journal=None,
            concurrency=1,
            on_note=notes.append,
            row_timeout_s=1.5 * unit,
            budget=budget,
        ) as cl:

            async def one(item):
                return await cl.chat(
                    [{"role": "user", "content": f"{item[0]} {item[1]}"}], temperature=0, retries=3, timeout=30
                )

            out = await run_bounded([("r1", 0), ("r1", 1), ("r1", 2), ("r2", 0)], one, 1)
            return out, dict(cl.stats)

    (a, b, c, d), stats = asyncio.run(go())
    assert a.ok and d.ok
    assert not b.ok and b.attempts == 1 and "row deadline" in b.error and "r1" in b.error and "waited" in b.error
    assert not c.ok and c.attempts == 0 and "before this call was sent" in c.error
    contents = [x["messages"][-1]["content"] for x in server.bodies()[sent_before:]]
    assert contents == ["r1 0", "r1 1", "r2 0"]  # the cut call was sent; the third never was, nor retried
    assert stats["network_calls"] == 3 and stats["deadline_cut"] == 2 and stats["deadline_rows"] == 1
    assert budget.calls == 3  # the call never sent is not charged (a fourth row would have been refused)
    [note] = notes
    assert note["code"] == "row_deadline" and "1 row(s)" in note["message"] and "2 sut call(s)" in note["message"]


def test_no_retry_starts_after_the_row_deadline(scripted, monkeypatch):
    """A failure whose backoff would end past the deadline is returned as it is (with the reason),
    not retried; without a deadline the same failure is retried."""
    server = scripted(_sequence([500, 500, 500, 500, 500, 500]))
    stats: dict = {}

    async def go(row_timeout, url=None):
        c = Connection(provider="openai", base_url=url or server.url, model="m")
        async with ModelClient(
            c,
            role="judge",
            run_id="r",
            metric="m",
            stage="judging",
            journal=None,
            backoff_s=60.0,
            row_timeout_s=row_timeout,
        ) as cl:
            try:
                return await chat_as_row(cl, "r7", retries=3, timeout=30)
            finally:
                stats.update(cl.stats)

    r = asyncio.run(go(5.0))
    assert not r.ok and r.attempts == 1 and r.retries_used == 0 and r.http_status == 500
    assert "not retried: the row deadline comes first" in r.error
    assert len(server.bodies()) == 1 and stats["deadline_cut"] == 1 and stats["deadline_rows"] == 1
    # a Retry-After longer than the time left is not waited out either, and says so
    limited = scripted(lambda body, n: Reply(429, headers={"Retry-After": "30"}))
    r = asyncio.run(go(5.0, limited.url))
    assert not r.ok and r.attempts == 1 and r.rate_limit_waits == 0 and "not waited: the row deadline" in r.error
    assert len(limited.bodies()) == 1 and stats["deadline_cut"] == 1

    slept = record_sleeps(monkeypatch)
    r = asyncio.run(go(None))  # no deadline: the three retries are made (their waits recorded, not slept)
    assert not r.ok and r.attempts == 4 and len(slept) == 3 and len(server.bodies()) == 5


def test_a_call_waiting_for_the_rate_limiter_is_not_sent_once_its_row_ran_out(scripted):
    """Row r1 makes two calls at once against an endpoint limited to one request per 2 units: the
    first is slow (3 units) and is cut at the row's deadline (1 unit); the second waits for the
    limiter (the row's clock runs meanwhile only because the first is in flight), and when its slot
    comes the row has no time left: it is not sent (attempts 0) and says why."""
    from aip_assets.metrics.running import gather_all
    from aip_assets.models import deadline as deadline_mod

    state = {"delay": 0.0}
    server = scripted(lambda body, n: Reply(text="ok", delay_s=state["delay"]))
    unit = max(0.5, 20 * _round_trip(server.url))
    state["delay"] = 3 * unit
    sent_before = len(server.bodies())
    rpm = max(1, int(60 / (2 * unit)))  # one request start per ~2 units

    async def go():
        c = Connection(provider="openai", base_url=server.url, model="m", requests_per_minute=rpm)
        async with ModelClient(
            c, role="sut", run_id="r", metric="m", stage="sampling", journal=None, concurrency=2, row_timeout_s=unit
        ) as cl:
            token = deadline_mod.CURRENT_ROW.set("r1")
            try:
                return await gather_all(
                    *(
                        cl.chat([{"role": "user", "content": f"q{i}"}], temperature=0, retries=0, timeout=30)
                        for i in range(2)
                    )
                )
            finally:
                deadline_mod.CURRENT_ROW.reset(token)

    first, second = sorted(asyncio.run(go()), key=lambda r: -r.attempts)
    assert first.attempts == 1 and "while this call waited" in first.error
    assert second.attempts == 0 and "before this call was sent" in second.error
    assert len(server.bodies()) - sent_before == 1


def test_a_200_without_an_answer_is_a_failed_call(scripted):
    """An HTTP 200 whose body has no choices[0].message.content is an error, not an empty answer."""
    server = scripted(lambda body, n: Reply(body={"id": "x", "choices": []}))
    r, _ = _chat(server.url, retries=0)
    assert not r.ok and r.http_status == 200 and r.error == "malformed response: no choices[0].message.content"


def test_a_cut_attempt_that_fails_early_reports_its_own_failure():
    """An attempt whose timeout was cut to the row's deadline but that fails at once (nothing
    listens) reports the connection failure, not the deadline: the row still had time."""
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def go():
        c = Connection(provider="openai", base_url=f"http://127.0.0.1:{port}/v1", model="m")
        async with ModelClient(
            c, role="sut", run_id="r", metric="m", stage="s", journal=None, row_timeout_s=0.9
        ) as cl:  # under a second left: the attempt is cut
            return await chat_as_row(cl, "r1", retries=0, timeout=60)

    r = asyncio.run(go())
    assert not r.ok and r.attempts == 1 and "connection refused" in r.error and "row deadline" not in r.error


def test_a_retry_within_the_row_deadline_is_made(scripted):
    """A failure whose backoff ends well before the row's deadline is retried as usual."""
    server = scripted(_sequence([500]))

    async def go():
        c = Connection(provider="openai", base_url=server.url, model="m")
        async with ModelClient(
            c, role="sut", run_id="r", metric="m", stage="s", journal=None, backoff_s=0.01, row_timeout_s=30.0
        ) as cl:
            return await chat_as_row(cl, "r1", retries=2, timeout=30)

    r = asyncio.run(go())
    assert r.ok and r.text == "fine" and r.attempts == 2 and r.retries_used == 1


def test_each_call_waits_at_most_its_own_rate_limit_budget(scripted, monkeypatch):
    """While other calls get answers (so the endpoint is not silent), a call that keeps getting
    429 + Retry-After 0.25 still stops after max_rate_limit_wait_seconds (1.0) of its own waits:
    4 waits, then it fails saying so. The client's clock is a fake the recorded waits advance."""
    import types

    from aip_assets.models import client as client_mod
    from aip_assets.models import deadline as deadline_mod
    from aip_assets.models import retry as retry_mod

    clock = {"now": 1000.0}
    real_sleep = asyncio.sleep

    async def record(d, *a, **k):
        clock["now"] += d
        await real_sleep(0.05)  # real time for the other call's answers to arrive in between

    monkeypatch.setattr(client_mod.asyncio, "sleep", record)
    fake = types.SimpleNamespace(monotonic=lambda: clock["now"], perf_counter=lambda: clock["now"])
    for mod in (client_mod, retry_mod, deadline_mod):  # every module of the client that reads the clock
        monkeypatch.setattr(mod, "time", fake)
    server = scripted(
        lambda body, n: (
            Reply(429, headers={"Retry-After": "0.25"}) if body["messages"][-1]["content"] == "limited" else "fine"
        )
    )

    async def go():
        c = Connection(provider="openai", base_url=server.url, model="m", max_rate_limit_wait_seconds=1.0)
        async with ModelClient(
            c, role="sut", run_id="r", metric="m", stage="s", journal=None, backoff_s=0.01, concurrency=4
        ) as cl:
            done = asyncio.Event()

            async def answered():
                n = 0
                while not done.is_set():
                    n += 1
                    await cl.chat([{"role": "user", "content": f"ok {n}"}], temperature=0, timeout=30)
                    await real_sleep(0.01)

            other = asyncio.create_task(answered())
            try:
                return await cl.chat([{"role": "user", "content": "limited"}], temperature=0, retries=0, timeout=30)
            finally:
                done.set()
                await other

    r = asyncio.run(go())
    assert not r.ok and r.rate_limit_waits == 4 and "waited 1s on Retry-After" in r.error


def test_call_keys_are_the_hash_of_stable_json_of_the_whole_call():
    """call_key writes the whole call's stable_json around the body's (made once per call, and
    sent): the key must stay exactly the hash it always was, or no earlier run's journal would
    answer a replay. Checked against the formula itself on uneven bodies (unicode, nesting,
    floats, booleans where numbers go)."""
    import hashlib
    import random

    from aip_assets.hashing import stable_json
    from aip_assets.models.request import call_key

    rng = random.Random(3)

    def value(depth=0):
        kind = rng.randrange(7 if depth < 3 else 4)
        if kind == 0:
            return rng.choice(["", 'é ✓ "quoted"\n', "Decision: APPROVE", "\u2028", "a" * 50])
        if kind == 1:
            return rng.choice([0, 1, -7, 10**18, True, False, None])
        if kind == 2:
            return rng.choice([0.5, 1e-9, 1.0, -2.25])
        if kind == 3:
            return str(rng.random())
        if kind in (4, 5):
            return {rng.choice("zyxabc") + str(i): value(depth + 1) for i in range(rng.randrange(4))}
        return [value(depth + 1) for _ in range(rng.randrange(4))]

    for i in range(300):
        extra = value(1)
        body = {
            "model": "m",
            "messages": [{"role": "user", "content": value()}],
            **(extra if isinstance(extra, dict) else {"params": extra}),
        }
        if i % 3 == 0:
            body = {"messages": [{"role": "system", "content": "Ünïcode"}], "temperature": 0.7}
        endpoint = rng.choice(["http://127.0.0.1:9/v1", "https://api.example.com/v1|m", "é"])
        sample = rng.choice([0, 1, 3, True, 2.0])
        template = rng.choice(["", "v1", "tmpl-✓", "1"])
        attempt = rng.choice([0, 0, 1, 2])
        payload = {"endpoint": endpoint, "body": body, "sample_index": sample, "template": template}
        if attempt:
            payload["attempt"] = attempt
        want = hashlib.sha256(stable_json(payload).encode()).hexdigest()[:32]
        assert call_key(endpoint, body, sample, template, attempt) == want
        assert call_key(endpoint, body, sample, template, attempt, stable_json(body)) == want


def test_journal_deflation_round_trips_and_stays_small_for_every_dictionary_size():
    """_deflate sizes zlib's window to the dictionary (a default-size stream cost 60-75 us to set
    up): whatever the sizes of text and dictionary, the text comes back exactly, and a request
    like the dictionary's compresses as well as with zlib's defaults."""
    import random
    import zlib

    from aip_assets.models.journal_format import _ZDICT_MAX, _deflate, _inflate

    rng = random.Random(7)
    words = ["loan", "approve", "income", "months", "Décision", "✓", "rent", "credit", "history", "the", "a"]
    for size in (0, 10, 900, 6000, 20000, 50000):  # a prompt of its own words, not repeating itself
        prompt = " ".join(rng.choice(words) + str(rng.randrange(100)) for _ in range(size // 8))
        zdict = prompt.encode()[-_ZDICT_MAX:]
        like = prompt.replace("loan", "lease", 3)  # the next request of the same template
        block = " ".join(rng.choice(words) + str(rng.randrange(1000)) for _ in range(300))
        long_own = block * 3  # longer than the dictionary, repeating itself 2-3 KB back
        for text in ("", "x", like, long_own, "".join(chr(rng.randrange(32, 0x2FF)) for _ in range(3000))):
            blob = _deflate(text, zdict)
            assert _inflate(blob, zdict) == text
            c = zlib.compressobj(6, zdict=zdict)
            default = c.compress(text.encode()) + c.flush()
            assert len(blob) <= len(default) * 1.1 + 8, (size, len(text))


def test_journal_writes_in_batches_off_the_caller_and_answers_from_its_queue(tmp_path):
    """record() only queues; a queued success answers lookup at once; readers and close() wait for
    the writer; a long flush interval gathers many calls into one transaction."""
    import sqlite3

    from aip_assets.models.journal import Journal

    j = Journal(tmp_path / "j.sqlite", flush_s=3600)  # after its first batch, the writer waits for flush()

    def rec(i, status="ok", run="r1"):
        return {
            "run_id": run,
            "metric": "m",
            "stage": "sampling",
            "role": "sut",
            "call_key": f"k{i}",
            "request": {"i": i},
            "response_text": f"answer {i}",
            "status": status,
            "attempts": 1,
            "source": "network",
            "created_at": 1.0,
        }

    def rows():
        with sqlite3.connect(tmp_path / "j.sqlite") as con:
            return con.execute("SELECT call_key, run_id, stage FROM call_index ORDER BY seq").fetchall()

    j.record(rec(0))
    j.flush()
    assert rows() == [("k0", "r1", "sampling")]
    for i in range(1, 200):
        j.record(rec(i, status="ok" if i % 3 else "error"))
    assert len(rows()) == 1  # queued, not written: the writer is waiting out its interval
    assert j.lookup("k5", ["r1"])["response_text"] == "answer 5"  # from the queue
    assert j.lookup("k6", ["r1"]) is None and j.lookup("k5", ["r2"]) is None  # failed; another run's
    assert j.ok_keys(["r1"], "sampling") == {f"k{i}" for i in range(200) if i == 0 or i % 3}  # waits for the write
    assert len(rows()) == 200 and j.totals("r1") == (200, 0)
    [frame] = j.frames("r1", "m", "sampling")
    assert list(frame.call_key) == [f"k{i}" for i in range(200)] and frame.request[7] == '{"i":7}'
    assert list(frame.columns[:4]) == ["run_id", "metric", "stage", "role"] and set(frame.run_id) == {"r1"}
    assert j.lookup("k7", ["r1"])["request"] == '{"i":7}'  # from the file now, inflated
    hexkey = "0123456789abcdef0123456789abcdef"  # a real key's shape: stored as its 16 bytes, read back as hex
    j.record({**rec(199.5), "call_key": hexkey})
    j.flush()
    assert j.lookup(hexkey, ["r1"])["call_key"] == hexkey and hexkey in j.ok_keys(["r1"], "sampling")
    from aip_assets.models.journal_format import key_mark

    marks = j.ok_marks(["r1"], "sampling")
    keys = j.ok_keys(["r1"], "sampling")
    assert len(marks) == len(keys) and all(key_mark(k) in marks for k in keys)
    assert key_mark(hexkey) == 0x0123456789ABCDEF and key_mark(hexkey) in marks  # as from its stored bytes
    assert key_mark("k6") not in marks and 0 <= key_mark("k6") < 2**64  # failed: not a mark; any key: unsigned
    assert rows()[-1][0] == hexkey and list(j.frames("r1", "m", "sampling"))[0].call_key.iloc[-1] == hexkey
    j.record(rec(200))
    j.close()  # writes what is queued
    assert rows()[-1][0] == "k200"
    with pytest.raises(RuntimeError, match="closed"):
        j.record(rec(201))
    reopened = Journal(tmp_path / "j.sqlite")
    assert reopened.lookup("k200", ["r1"])["response_text"] == "answer 200"
    # a write that fails (here: a value SQLite cannot store) is raised to the next caller, and the
    # batch is rolled back whole
    reopened.record({**rec(300), "error": {"not": "a text"}})
    with pytest.raises(RuntimeError, match="writing the call journal failed"):
        reopened.flush()
    with pytest.raises(RuntimeError, match="writing the call journal failed"):
        reopened.record(rec(301))
    with pytest.raises(RuntimeError):
        reopened.close()
    assert len(rows()) == 202


class _Admits:
    """An endpoint that admits ``capacity`` requests at once and answers the rest 429 with
    Retry-After: 0 (so a client comes back after its own backoff); it records the most it had in
    flight and how many it refused."""

    def __init__(self, capacity: int):
        self.capacity, self.in_flight, self.most, self.refused, self.answered = capacity, 0, 0, 0, 0

    def app(self):
        from aiohttp import web

        async def chat(request):
            await request.read()
            if self.in_flight >= self.capacity:
                self.refused += 1
                return web.json_response({"error": {"message": "slow down"}}, status=429, headers={"Retry-After": "0"})
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
            try:
                await asyncio.sleep(0.01)
            finally:
                self.in_flight -= 1
            self.answered += 1
            return web.json_response(
                {
                    "choices": [
                        {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
                    ],
                    "model": "m",
                }
            )

        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        return app


def _burst(url: str, n: int, concurrency: int, adaptive: bool, server: _Admits, capacity_after: int | None = None):
    notes: list[dict] = []

    async def go():
        c = Connection(
            provider="openai", base_url=url, model="m", max_connections=concurrency, adaptive_concurrency=adaptive
        )
        async with ModelClient(
            c,
            role="sut",
            run_id="r",
            metric="m",
            stage="s",
            journal=None,
            backoff_s=0.005,
            concurrency=concurrency,
            on_note=notes.append,
        ) as cl:

            async def one(i):
                return await cl.chat([{"role": "user", "content": f"q{i}"}], temperature=0, timeout=10)

            first = await asyncio.gather(*(one(i) for i in range(n)))
            lowest, limit_then = cl.sem.lowest, cl.sem.limit
            second = []
            if capacity_after is not None:  # the endpoint recovers: the limit grows back
                server.capacity, server.most = capacity_after, 0
                second = await asyncio.gather(*(one(n + i) for i in range(n)))
            return first + second, lowest, limit_then, cl.sem.limit

    results, lowest, limit_then, limit_end = asyncio.run(go())
    return results, lowest, limit_then, limit_end, notes


def test_adaptive_concurrency_backs_off_on_429_and_grows_back():
    """32 calls at once against an endpoint that admits 4: with the adaptive limit the client halves
    its calls in flight on the first 429s (once per burst) and draws far fewer 429s than without
    it; when the endpoint admits more, the limit grows back. Every call succeeds either way (a 429
    with Retry-After is a wait, not a failure)."""
    from aip_assets.models.builtin import start_app_in_thread

    counts = {}
    for adaptive in (False, True):
        server = _Admits(4)
        url, stop = start_app_in_thread(server.app())
        try:
            results, lowest, limit_then, limit_end, notes = _burst(
                url, 300, 32, adaptive, server, capacity_after=64 if adaptive else None
            )
        finally:
            stop()
        assert all(r.ok for r in results) and len(results) == (600 if adaptive else 300)
        counts[adaptive] = server.refused
        if adaptive:
            assert 2 <= lowest <= 4 and limit_then <= 8  # 32 -> 16 -> 8 -> 4 (or lower), near the capacity
            assert limit_end > limit_then and server.most > 4  # the endpoint admits more: more in flight again
            assert limit_end <= 32
            [note] = notes
            assert note["code"] == "adaptive_concurrency" and "from 32 to as few as" in note["message"]
        else:
            assert lowest == limit_end == 32 and notes == []
    assert counts[False] > 0 and counts[True] < counts[False] / 3, counts


def test_a_mark_shared_by_two_keys_costs_a_lookup_never_a_wrong_answer(tmp_path, scripted):
    """The client tests a call against the 64-bit marks of the answered calls' keys before it asks
    the journal. A call whose mark is there but whose key is not (another key sharing its first 64
    bits) is sent to the endpoint and answered by it."""
    from aip_assets.models.journal import Journal
    from aip_assets.models.journal_format import key_mark

    server = scripted(lambda body, n: f"fresh {n}")
    conn = Connection(provider="openai", base_url=server.url, model="m")
    j = Journal(tmp_path / "j.sqlite")
    msgs = [{"role": "user", "content": "q"}]

    async def go():
        async with ModelClient(conn, role="sut", run_id="r", metric="m", stage="sampling", journal=j) as cl:
            key = call_key(cl.endpoint_id, build_body(conn, msgs, 0.0, None, 0), 0, "")
            cl._known_ok.add(key_mark(key))  # as if another key with the same first 64 bits had been answered
            first = await cl.chat(msgs, temperature=0.0)
            again = await cl.chat(msgs, temperature=0.0)
            return first, again

    first, again = asyncio.run(go())
    j.close()
    assert first.ok and not first.cached and first.text == "fresh 1"
    assert again.cached and again.text == "fresh 1" and len(server.bodies()) == 1


def test_marks_fold_into_a_sorted_array_and_stay_a_set():
    """Marks kept as 8-byte integers: the newest in a set, folded into a sorted array every FOLD;
    membership holds across a fold, for the largest 64-bit values, and for marks never added."""
    import random

    from aip_assets.models.journal_format import Marks

    rng = random.Random(7)
    first = [rng.getrandbits(64) for _ in range(1000)] + [2**64 - 1, 0]
    m = Marks(first + first[:10])  # duplicates count once
    assert len(m) == len(first)
    later = [rng.getrandbits(64) for _ in range(Marks.FOLD + 5)]
    for x in later:
        m.add(x)
    assert len(m._new) == 5 and all(x in m for x in first + later)
    size = len(m)
    for x in first[:3] + later[-3:]:  # held already, in the array or among the newest: no second copy
        m.add(x)
    assert len(m) == size == len(set(first + later))
    assert not any(rng.getrandbits(64) in m for _ in range(1000))  # a chance collision: about 1e-13


@pytest.mark.parametrize("store", ["sqlite", "postgres"])
def test_the_journal_answers_the_same_from_sqlite_and_postgres(tmp_path, request, store):
    """The journal's contract, in both stores (shared mode keeps it in Postgres): uneven records
    over two runs and two stages, a failure, a cache record, missing fields; a key answered by both
    runs; then every reader's answer, derived by hand. The frames of the two stores are equal."""
    import random

    import pandas as pd

    from aip_assets.models.journal import Journal
    from aip_assets.models.journal_pg import PgJournal

    rnd = random.Random(11)
    keys = [f"{rnd.getrandbits(128):032x}" for _ in range(8)] + ["not-a-hex-key"]
    tag = f"{store}-{time.time_ns()}"  # the shared database outlives a test
    r1, r2 = f"r1-{tag}", f"r2-{tag}"

    def rec(i, run, key=None, stage="sampling", status="ok", source="network", answer=None, **kw):
        return {
            "run_id": run,
            "metric": "m",
            "stage": stage,
            "role": "sut" if stage == "sampling" else "judge",
            "call_key": key or keys[i],
            "sample_index": i % 3,
            "endpoint": "http://e/v1",
            "model": "mod",
            "request": {"messages": [{"role": "user", "content": f"question {i} " + "x" * i}]},
            "response_text": None if status != "ok" else (answer or f"answer {i}"),
            "status": status,
            "error": "HTTP 500: boom" if status != "ok" else None,
            "http_status": 500 if status != "ok" else 200,
            "latency_ms": 2.5 * i,
            "prompt_tokens": i,
            "completion_tokens": i + 1 if i % 2 else None,
            "attempts": 1 + (status != "ok"),
            "response_model": "mod-v",
            "fingerprint": None,
            "source": source,
            "created_at": 1_700_000_000.0 + i,
            **kw,
        }

    def open_():
        if store == "sqlite":
            return Journal(tmp_path / "j.sqlite")
        return PgJournal(request.getfixturevalue("postgres").url)

    records = [
        rec(0, r1),
        rec(1, r1),
        rec(2, r1, status="error"),
        rec(3, r2),
        rec(4, r1, source="cache"),
        rec(5, r1, stage="judging"),
        rec(3, r1, answer="r1's own answer"),
        rec(8, r1),
        rec(6, r2, status="error"),
    ]
    j = open_()
    for r in records:
        j.record(r)
    assert j.lookup(keys[8], [r1])["response_text"] == "answer 8"  # queued or written: answered either way
    assert j.ok_keys([r1], "sampling") == {keys[0], keys[1], keys[3], keys[4], keys[8]}
    assert j.ok_keys([r2], "sampling") == {keys[3]} and j.ok_keys([r1, r2], "judging") == {keys[5]}
    assert len(j.ok_marks([r1, r2], "sampling")) == 5
    assert j.lookup(keys[3], [r1, r2])["response_text"] == "r1's own answer"  # this run's first
    assert j.lookup(keys[3], [r2, r1])["response_text"] == "answer 3"
    assert j.lookup(keys[2], [r1]) is None and j.lookup(keys[6], [r2]) is None  # failures answer nothing
    assert j.lookup(keys[0], [r2]) is None  # another run's
    got = j.lookup(keys[1], [r1])
    # the request as it was given (and sent): its own key order, compact
    assert got["request"] == '{"messages":[{"role":"user","content":"question 1 x"}]}' and got["completion_tokens"] == 2
    # network calls of r1: 0, 1, 2 (failed), 5, 3, 8 (4 came from the cache); tokens: prompt + completion
    assert j.totals(r1) == (6, (0 + 0) + (1 + 2) + (2 + 0) + (5 + 6) + (3 + 4) + (8 + 0))
    frame = pd.concat(list(j.frames(r1, "m", "sampling")), ignore_index=True)
    assert list(frame.call_key) == [keys[i] for i in (0, 1, 2, 4, 3, 8)]  # in the order written
    assert list(frame.status) == ["ok", "ok", "error", "ok", "ok", "ok"] and pd.isna(frame.response_text.iloc[2])
    assert list(frame.source) == ["network"] * 3 + ["cache"] + ["network"] * 2
    assert frame.created_at.iloc[0] == pd.Timestamp(1_700_000_000, unit="s")
    assert list(j.frames(r2, "m", "judging")) == []
    j.record(rec(7, r1, key=keys[-1]))  # a key of another shape is kept as it is
    j.flush()
    assert j.lookup(keys[-1], [r1])["call_key"] == keys[-1]
    j.close()


def test_journal_stores_give_equal_frames_and_share_a_part_written_at_once(tmp_path, postgres):
    """The same records through SQLite and Postgres give equal frames (columns, types, values);
    and two workers writing the same part at the same moment in Postgres both land, with one part."""
    import threading

    import pandas as pd
    import psycopg

    from aip_assets.models.journal import Journal
    from aip_assets.models.journal_pg import PgJournal

    run = f"same-{time.time_ns()}"

    def rec(i, worker=0):
        return {
            "run_id": run,
            "metric": "m",
            "stage": "sampling",
            "role": "sut",
            "call_key": f"{worker:04x}{i:028x}",
            "sample_index": i,
            "endpoint": "e",
            "model": None,
            "request": {"q": i, "w": worker},
            "response_text": f"a{i}" if i % 4 else None,
            "status": "ok" if i % 4 else "error",
            "error": None,
            "http_status": 200,
            "latency_ms": i / 3,
            "prompt_tokens": i,
            "completion_tokens": None,
            "attempts": 1,
            "response_model": None,
            "fingerprint": None,
            "source": "network",
            "created_at": 10.0 + i,
        }

    frames = []
    for j in (Journal(tmp_path / "j.sqlite"), PgJournal(postgres.url)):
        for i in range(30):
            j.record(rec(i))
        frames.append(pd.concat(list(j.frames(run, "m", "sampling")), ignore_index=True))
        j.close()
    pd.testing.assert_frame_equal(frames[0], frames[1])

    run = f"race-{time.time_ns()}"
    journals = [PgJournal(postgres.url, flush_s=0.001) for _ in range(4)]
    go = threading.Barrier(len(journals))

    def write(w):
        go.wait()
        for i in range(50):
            journals[w].record(rec(i, w))
        journals[w].flush()

    threads = [threading.Thread(target=write, args=(w,)) for w in range(len(journals))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for j in journals:
        j.close()
    with psycopg.connect(postgres.url) as con:
        assert con.execute("SELECT count(*) FROM aip_journal.call_parts WHERE run_id = %s", [run]).fetchone() == (1,)
        assert con.execute("SELECT count(*) FROM aip_journal.call_index WHERE run_id = %s", [run]).fetchone() == (200,)
    j = PgJournal(postgres.url)
    assert len(j.ok_keys([run], "sampling")) == 4 * 37 and j.totals(run) == (200, 4 * sum(range(50)))
    j.close()


def test_a_request_asked_again_while_in_flight_is_sent_once(scripted, tmp_path):
    """The same request asked three times at once (same body, sample index, template, attempt):
    one is sent, the other two wait for its answer and read it from the journal (cached); a
    different sample index is its own request. When the one sent fails, a waiting one is sent."""
    from aip_assets.models.journal import Journal

    fail_first = {"on": False}

    def answer(body, n):
        if fail_first["on"] and n == 1 + 2:  # the first request of the second round (after two above)
            return Reply(500)
        return Reply(text=f"answer {n}", delay_s=0.2)

    server = scripted(answer)
    journal = Journal(tmp_path / "j.sqlite")
    msgs = [{"role": "user", "content": "approve?"}]

    async def go(keys):
        c = Connection(provider="openai", base_url=server.url, model="m")
        async with ModelClient(c, role="sut", run_id="r", metric="m", stage="s", journal=journal) as cl:
            return await asyncio.gather(*(cl.chat(msgs, temperature=0.5, sample_index=k, timeout=5) for k in keys))

    a, b, c, d = asyncio.run(go([0, 0, 0, 1]))
    assert len(server.bodies()) == 2  # sample 0 once, sample 1 once
    assert a.text == b.text == c.text != d.text and all(r.ok for r in (a, b, c, d))
    assert sorted(r.cached for r in (a, b, c)) == [False, True, True] and not d.cached
    journal.flush()
    [frame] = journal.frames("r", "m", "s")
    assert len(frame) == 2  # one call on record per request sent
    fail_first["on"] = True
    msgs = [{"role": "user", "content": "another"}]
    e, f = asyncio.run(go([0, 0]))
    assert len(server.bodies()) == 4  # the first failed (500, no retry): the one waiting was sent
    assert sorted([e.ok, f.ok]) == [False, True]
    journal.close()
