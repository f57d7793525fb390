"""Endpoint outages and what is said about them (issue 26, points 4 and 8).

The endpoint check retries as a call does and says why it waits; an endpoint down at a stage's
start is a metric whose calls failed (recorded, gate failed), not a crashed run; a client that
finds its endpoint down stops sending every call; a connection cut mid-answer and a dataset path
that is a folder say what happened. Outages are served on loopback: the scripted server closing
connections without an answer (``Reply(drop=True)``), or raw sockets."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import struct
import threading
from pathlib import Path

import pytest

from aip_assets import warehouse as wh
from aip_assets.cli import main
from aip_assets.errors import EndpointDown
from aip_assets.models import builtin
from aip_assets.models.client import DOWN_AFTER_CALLS, ModelClient
from aip_assets.models.endpoint_check import check_endpoint
from aip_assets.runspec import BuiltinProfile, Connection

from .conftest import table, write_dataset
from .scripted import Reply, is_preflight


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def builtin_text(body) -> str:
    """What the builtin model answers (so the builtin judge reads real decisions)."""
    return builtin.handle_chat(body, BuiltinProfile())["choices"][0]["message"]["content"]


def two_metric_spec(tmp_path: Path, sut: dict, retries: int = 3) -> Path:
    """Decision flip, then semantic consistency (``n_sut_retries`` = ``retries``), on 3 rows."""
    ds = write_dataset(tmp_path / "in" / "d.jsonl", 3)
    p = tmp_path / "in" / "spec.yaml"
    p.write_text(
        json.dumps(
            {
                "name": "outage",
                "dataset": str(ds),
                "seed": 3,
                "retry_backoff_seconds": 0.01,
                "sut": sut,
                "metrics": {
                    "llm.decision_flip": {"config": {"num_pairs_per_dimension": 2, "dimensions": ["gender"]}},
                    "llm.semantic_consistency": {"config": {"n_sut_retries": retries, "responses_per_query": 2}},
                },
            }
        )
    )
    return p


class Outage:
    """A SUT handler (the builtin model's answers) that goes down at the second endpoint check (the
    first is the run's, which decision flip's sampling takes as its own; the second semantic
    consistency's, at its stage's start) for ``window`` requests, or for ever (``window`` None):
    each such request's connection is closed without an answer."""

    def __init__(self, window: int | None):
        self.window, self.checks, self.left, self.down = window, 0, 0, False
        self.dropped = 0

    def __call__(self, body, n):
        if is_preflight(body):
            self.checks += 1
            if self.checks == 2:
                self.down, self.left = self.window is None, self.window or 0
        if self.down or self.left > 0:
            self.left -= 1
            self.dropped += 1
            return Reply(drop=True)
        return "OK" if is_preflight(body) else builtin_text(body)


def test_a_sut_outage_at_a_stage_start_within_the_retries_is_ridden_out(tmp_path, scripted, capsys):
    """The second metric's stage-start check meets an outage of three requests; with its calls'
    n_sut_retries (3) it tries four times, the fourth answers, and the run scores both metrics
    (the check's two quick retries used to end it, exit 2)."""
    outage = Outage(window=3)
    server = scripted(outage, answer_preflight=False)
    spec = two_metric_spec(tmp_path, server.conn())
    assert main(["run", str(spec)]) == 0
    err = capsys.readouterr().err
    assert outage.dropped == 3 and outage.checks == 5  # the run's, then semantic consistency's: 3 dropped, 1 answered
    where = f"endpoint check: sut endpoint {server.url} (model scripted)"
    waits = [line for line in err.splitlines() if where in line]
    assert len(waits) == 3 and all("connection closed by the server without an answer; waiting " in w for w in waits)
    assert [w.rsplit(" before ", 1)[1] for w in waits] == ["try 2 of 4", "try 3 of 4", "try 4 of 4"]
    assert "The endpoint is down" not in err
    run_id = wh.query("SELECT run_id FROM eval_runs").run_id[0]
    for metric in ("llm.decision_flip", "llm.semantic_consistency"):
        ov = table("metric_scores", run_id, "scope").query("scope == 'overall' and metric == @metric").iloc[0]
        assert ov.score is not None and ov.score == ov.score and ov.passed, metric  # scored (not NaN) and passed
        resp = table("sut_responses", run_id, "probe_id").query("metric == @metric")
        assert len(resp) > 0 and (resp.status == "ok").all(), metric


def test_a_sut_down_for_the_rest_of_the_run_fails_the_metric_not_the_run(tmp_path, scripted, capsys):
    """Down from the second metric's stage start on: its check gives up after its retries, warns
    and goes on; every one of its SUT calls is recorded as failed on its row, and its gate fails on
    them: exit 1, the first metric's scores intact."""
    outage = Outage(window=None)
    server = scripted(outage, answer_preflight=False)
    spec = two_metric_spec(tmp_path, server.conn())
    assert main(["run", str(spec)]) == 1
    err = capsys.readouterr().err
    assert "internal error" not in err and "Traceback" not in err
    warning = next(line for line in err.splitlines() if "The endpoint is down" in line)
    assert f"sut endpoint {server.url} (model scripted): unreachable after 4 tries" in warning
    assert "connection closed by the server without an answer" in warning and "recorded as failed" in warning
    run_id = wh.query("SELECT run_id FROM eval_runs").run_id[0]
    resp = table("sut_responses", run_id, "probe_id")
    second = resp[resp.metric == "llm.semantic_consistency"]
    assert len(second) == 6 and (second.status == "error").all()  # 3 rows x 2 samples
    assert second.error.str.contains("connection closed by the server without an answer").all()
    assert (resp[resp.metric == "llm.decision_flip"].status == "ok").all()
    scores = table("metric_scores", run_id, "metric").query("scope == 'overall'").set_index("metric")
    assert bool(scores.loc["llm.decision_flip"].passed) and not bool(scores.loc["llm.semantic_consistency"].passed)
    reason = scores.loc["llm.semantic_consistency"].gate_reason
    assert "6 of 6 SUT answers failed" in reason and "coverage 0.000 below min_coverage" in reason
    notes = table("run_notes", run_id, "metric").query(
        "metric == 'llm.semantic_consistency' and code == 'endpoint_down'"
    )
    assert len(notes) == 1 and "The endpoint is down" in notes.message.iloc[0]


def test_an_unauthorised_sut_at_a_stage_start_still_stops_the_run(tmp_path, scripted, capsys):
    """An endpoint that answers 401 at a stage's start is misconfigured, not down: exit 2."""

    def handler(body, n):
        handler.checks += is_preflight(body)
        if handler.checks >= 2:  # from semantic consistency's stage start on (decision flip's took the run's)
            return Reply(401, body={"error": {"message": "bad key"}})
        return "OK" if is_preflight(body) else builtin_text(body)

    handler.checks = 0
    server = scripted(handler, answer_preflight=False)
    assert main(["run", str(two_metric_spec(tmp_path, server.conn()))]) == 2
    err = capsys.readouterr().err
    assert f"sut endpoint {server.url} (model scripted): unauthorised (HTTP 401)" in err
    assert handler.checks == 2  # the run's check, then the second metric's stage start once: a 401 is not retried
    assert table(
        "sut_responses", wh.query("SELECT run_id FROM eval_runs").run_id[0], "probe_id"
    ).metric.unique().tolist() == [
        "llm.decision_flip"
    ]  # the first metric sampled on the run's check; the second stopped at its own


@pytest.mark.parametrize("fresh", [True, False])
def test_the_first_sampling_stage_takes_the_runs_check_as_its_own_when_it_is_fresh(
    tmp_path, scripted, capsys, monkeypatch, fresh
):
    """``aip-eval run`` checks the SUT before the run; the first metric's sampling, seconds later in
    the same process, takes that check as its own instead of asking again (a round trip before its
    first call); the next metric's stage checks, as every stage does whose run was checked elsewhere
    or over a minute ago (``preflight.FRESH_S``)."""
    from aip_assets import preflight

    if not fresh:
        monkeypatch.setattr(preflight, "FRESH_S", 0.0)
    server = scripted(lambda body, n: "OK" if is_preflight(body) else builtin_text(body), answer_preflight=False)
    checks_at: list[int] = []  # how many SUT calls (not checks) came before each check
    assert main(["run", "--verbose", str(two_metric_spec(tmp_path, server.conn()))]) == 0
    bodies = server.requests
    calls = 0
    for b in bodies:
        if is_preflight(b):
            checks_at.append(calls)
        else:
            calls += 1
    run_id = wh.query("SELECT run_id FROM eval_runs").run_id[0]
    first = len(table("sut_responses", run_id, "probe_id").query("metric == 'llm.decision_flip'"))
    assert first > 0 and calls > first
    # fresh: the run's check (before any call), then semantic consistency's, after decision flip's calls
    assert checks_at == ([0, first] if fresh else [0, 0, first])
    took = [line for line in capsys.readouterr().err.splitlines() if "answered the run's check" in line]
    assert len(took) == (1 if fresh else 0) and (not took or "llm.decision_flip" in took[0])


def test_the_check_before_a_run_says_why_it_waits_and_ends_within_its_budget(tmp_path, scripted, capsys):
    """An endpoint answering 429 with Retry-After: the check before the run waits as told, says
    why at each wait, and gives up after its retry budget (the calls' n_sut_retries, 3), not after
    max_rate_limit_wait_seconds (600 s by default): exit 5 naming the 429, nothing written. (The
    server would answer the seventh request: a check that waited freely would go on to run.)"""
    server = scripted(
        lambda body, n: Reply(429, headers={"Retry-After": "0.05"}) if n <= 6 else "OK", answer_preflight=False
    )
    spec = two_metric_spec(tmp_path, server.conn())
    before = tree(tmp_path)
    assert main(["run", str(spec)]) == 5  # a failure outside the project, not bad input
    err = capsys.readouterr().err
    assert len(server.requests) == 4
    waits = [line for line in err.splitlines() if "endpoint check: " in line]
    assert waits == [
        f"[aip] endpoint check: sut endpoint {server.url} (model scripted) answered HTTP 429 (rate "
        f"limited); waiting 0.05s (Retry-After) before try {k} of 4"
        for k in (2, 3, 4)
    ]
    last = err.strip().splitlines()[-1]
    assert last.startswith(
        f"error: sut endpoint {server.url} (model scripted): unavailable: it answered HTTP 429 "
        "(rate limited) after 4 tries over "
    ), last
    assert "3 retries" in last and 'the last try: HTTP 429: {"error": {"message": "scripted 429"}}' in last
    assert tree(tmp_path) == before


# ------------------------------------------------------------------ a client that finds its endpoint down
def _calls(url: str, n: int, concurrency: int, retries: int) -> tuple[list, ModelClient]:
    async def go():
        conn = Connection(provider="openai", base_url=url, model="m")
        notes: list[dict] = []
        async with ModelClient(
            conn,
            role="sut",
            run_id="r",
            metric="m",
            stage="sampling",
            journal=None,
            backoff_s=0.01,
            concurrency=concurrency,
            on_note=notes.append,
        ) as c:
            sem = asyncio.Semaphore(concurrency)

            async def one(i):
                async with sem:
                    return await c.chat(
                        [{"role": "user", "content": f"q{i}"}], temperature=0, retries=retries, timeout=5
                    )

            results = await asyncio.gather(*(one(i) for i in range(n)))
        c.notes = notes
        return results, c

    return asyncio.run(go())


def test_calls_to_an_endpoint_found_down_are_not_sent_but_one_at_a_time(scripted):
    """Every connection closed: the first calls fail after their retries; once DOWN_AFTER_CALLS
    in a row have, one call at a time is sent (with its retries) and the others fail at once,
    not sent, saying why. Every call is a failure either way; the endpoint sees a fraction of the
    requests (40 calls x 3 tries without it)."""
    server = scripted(lambda body, n: Reply(drop=True))
    results, c = _calls(server.url, 40, concurrency=4, retries=2)
    assert all(not r.ok for r in results)
    sent = [r for r in results if r.attempts]
    held = [r for r in results if not r.attempts]
    assert len(sent) >= DOWN_AFTER_CALLS and all(r.attempts == 3 for r in sent)  # each sent call: its retries
    assert len(server.requests) == sum(r.attempts for r in results) == 3 * len(sent)
    assert len(held) >= 40 - DOWN_AFTER_CALLS - 2 * 4  # after the first failures, at most the calls in flight are sent
    assert held and all(
        r.error.startswith(
            f"not sent: the sut endpoint {server.url} is down ({DOWN_AFTER_CALLS} or "
            "more calls in a row failed after their retries, the last: connection "
            "closed by the server without an answer)"
        )
        for r in held
    )
    assert c.stats["not_sent_down"] == len(held) and c.stats["network_calls"] == len(sent)
    note = next(n for n in c.notes if n["code"] == "endpoint_down")
    assert f"{len(held)} call(s) were not sent" in note["message"] and "it did not answer again" in note["message"]


def test_an_endpoint_found_down_is_sent_every_call_again_once_it_answers(scripted):
    """One call at a time: DOWN_AFTER_CALLS calls fail after their 2 retries (3 requests each);
    the next call finds the endpoint back at its second try, and every call after it is sent and
    answered."""
    down_for = 3 * DOWN_AFTER_CALLS + 1
    server = scripted(lambda body, n: Reply(drop=True) if n <= down_for else "fine")
    results, c = _calls(server.url, DOWN_AFTER_CALLS + 6, concurrency=1, retries=2)
    assert all(not r.ok and r.attempts == 3 for r in results[:DOWN_AFTER_CALLS])
    probe = results[DOWN_AFTER_CALLS]
    assert probe.ok and probe.attempts == 2
    assert all(r.ok and r.attempts == 1 for r in results[DOWN_AFTER_CALLS + 1 :])
    note = next(n for n in c.notes if n["code"] == "endpoint_down")
    assert "0 call(s) were not sent" in note["message"] and "it answered again 1 time(s)" in note["message"]


@pytest.mark.parametrize("back", [True, False])
def test_calls_wait_for_the_first_call_that_finds_out_whether_the_endpoint_is_back(back):
    """Found down, the endpoint is only suspected down until the first call sent to find out fails
    too: the calls meanwhile wait for it instead of failing at once, so an outage of a few seconds
    costs them nothing. Back: every waiting call is sent and answered. Still down (confirmed): one
    waiting call finds out next, the others fail at once, not sent."""
    from aip_assets.models.result import ChatResult

    async def go():
        conn = Connection(provider="openai", base_url="http://127.0.0.1:9/v1", model="m")
        c = ModelClient(
            conn,
            role="sut",
            run_id="r",
            metric="m",
            stage="sampling",
            journal=None,
            concurrency=4,
            share_connections=False,
        )
        c._slots_held = True  # no slot files: the calls below never reach the network
        for _ in range(DOWN_AFTER_CALLS):  # found down as calls failing after their retries find it
            c._health(
                ChatResult(None, "error", "connection refused", None, None, None, None, None, 3, "k", transient=True)
            )
        assert c._down_since is not None and not c._confirmed
        release, sent = asyncio.Event(), []

        async def call(body, key, retries, timeout, clock, text, counted):
            sent.append(key)
            if len(sent) == 1:
                await release.wait()  # the first call finds out while the others arrive
            await asyncio.sleep(0.01)  # a request takes a while
            return (
                ChatResult("fine", "ok", None, 1.0, 1, 1, "m", None, 1, key)
                if back
                else ChatResult(
                    None, "error", "connection refused", None, None, None, None, None, 3, key, transient=True
                )
            )

        c._call = call  # type: ignore[method-assign]
        c._record = lambda *a, **k: None  # type: ignore[method-assign]
        calls = [asyncio.create_task(c._live({"q": i}, f"k{i}", 0, 2, 5.0, "{}")) for i in range(4)]
        await asyncio.sleep(0.05)
        assert sent == ["k0"] and not any(t.done() for t in calls)  # the others wait, neither sent nor failed
        release.set()
        return await asyncio.gather(*calls), sent, c

    results, sent, c = asyncio.run(go())
    if back:
        assert all(r.ok for r in results) and len(sent) == 4 and c.stats["not_sent_down"] == 0
    else:  # the first failed: confirmed down; one more finds out, two fail at once
        assert not any(r.ok for r in results) and len(sent) == 2 and c.stats["not_sent_down"] == 2
        assert c._confirmed and sum(r.attempts == 0 for r in results) == 2


def test_server_errors_are_answers_and_never_find_the_endpoint_down(scripted):
    """A 500 is an answer (the endpoint is up, the request failed): every call is sent with its
    retries, however many fail in a row."""
    server = scripted(lambda body, n: Reply(500))
    results, c = _calls(server.url, 2 * DOWN_AFTER_CALLS, concurrency=2, retries=1)
    assert all(not r.ok and r.attempts == 2 for r in results)
    assert len(server.requests) == 4 * DOWN_AFTER_CALLS and c.stats["not_sent_down"] == 0


# ------------------------------------------------------------------ a connection cut, named
def _read_request(c: socket.socket) -> None:
    """Read one HTTP request whole (its headers, then the body its Content-Length gives), so that
    closing the connection afterwards leaves nothing unread (which would make the close a reset)."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += c.recv(65536) or b"\r\n\r\n"
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        (int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")), 0
    )
    while len(body) < length:
        chunk = c.recv(65536)
        if not chunk:
            return
        body += chunk


def _raw_server(answer: bytes, reset: bool) -> tuple[str, socket.socket]:
    """A loopback server that reads a request, sends ``answer`` and closes the connection (with a
    reset, SO_LINGER 0, when ``reset``)."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    s.listen(16)

    def run():
        while True:
            try:
                c, _ = s.accept()
            except OSError:
                return
            _read_request(c)
            if answer:
                c.sendall(answer)
            if reset:
                c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            c.close()

    threading.Thread(target=run, daemon=True).start()
    return f"http://127.0.0.1:{s.getsockname()[1]}/v1", s


CUT = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"choi'


@pytest.mark.parametrize(
    "answer, reset, said",
    ids=["short-body", "short-body-reset", "short-chunks", "reset"],
    argvalues=[
        (
            CUT,
            False,
            "the connection was closed before the answer was complete: 6 of the 100 bytes its Content-Length "
            "announced came (aiohttp ContentLengthError)",
        ),
        (
            CUT,
            True,
            "the connection was reset before the answer was complete: 6 of the 100 bytes its Content-Length "
            "announced came (aiohttp ContentLengthError)",
        ),
        (
            b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{"cho\r\n',
            False,
            "the connection was closed before the answer was complete: the chunked body stopped before its last chunk "
            "(aiohttp TransferEncodingError)",
        ),
        (b"", True, "connection reset by the server without an answer"),
    ],
)
def test_a_connection_cut_at_the_endpoint_check_says_what_happened(answer, reset, said, caplog):
    url, s = _raw_server(answer, reset)
    try:
        with caplog.at_level(logging.INFO, logger="aip_assets"), pytest.raises(EndpointDown) as e:
            asyncio.run(
                check_endpoint(
                    Connection(provider="openai", base_url=url, model="m"), "sut", retries=1, backoff_s=0.01, timeout=5
                )
            )
    finally:
        s.close()
    msg = str(e.value)
    assert msg.startswith(f"sut endpoint {url} (model m): unreachable after 2 tries over ") and msg.endswith(
        f"the last try: {said}"
    ), msg
    assert "400" not in msg.replace(url, "")  # aiohttp's code for a cut body is no HTTP status (the port may hold 400)
    waits = [r.getMessage() for r in caplog.records if r.getMessage().startswith("endpoint check: ")]
    assert len(waits) == 1 and waits[0].startswith(f"endpoint check: sut endpoint {url} (model m) {said}; waiting ")
    assert waits[0].endswith(" (backoff) before try 2 of 2")


# ------------------------------------------------------------------ a dataset path that is no file
@pytest.mark.parametrize("command", ["run", "validate"])
@pytest.mark.parametrize("kind", ["folder", "no_suffix"])
def test_a_dataset_path_that_is_a_folder_or_has_no_suffix_is_named(tmp_path, capsys, command, kind):
    good = write_dataset(tmp_path / "in" / "rows.jsonl", 2)
    if kind == "folder":
        ds = tmp_path / "in"
    else:
        ds = tmp_path / "in" / "rows"
        ds.write_text(good.read_text())
    spec = tmp_path / "in" / "spec.yaml"
    spec.write_text(json.dumps({"name": "ds", "dataset": str(ds), "metrics": {"llm.decision_flip": {}}}))
    before = tree(tmp_path)
    assert main([command, str(spec)]) == 2
    err = capsys.readouterr().err
    if kind == "folder":
        assert (
            f"error: {ds}: is a folder, not a dataset file (it holds rows.jsonl); give the path of one dataset "
            "file: .csv, .jsonl (or .ndjson) or .parquet (or .pq)" in err
        )
    else:
        assert (
            f"error: {ds}: the file name has no suffix, so its type is unknown; name the file for its format: "
            ".csv, .jsonl (or .ndjson) or .parquet (or .pq)" in err
        )
    assert "unsupported file type ''" not in err and "Traceback" not in err
    assert tree(tmp_path) == before


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    "role, field", [("sut", "sut.base_url"), ("judge-2", "judges[1].base_url"), ("audit", "judge_audit.judge.base_url")]
)
def test_an_address_nothing_listens_at_asks_whether_base_url_is_right(role, field):
    """Connection refused: the address may be wrong rather than the endpoint down (issue 38, fault
    10); the message names the spec's field, and still ends with the last try."""
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    with pytest.raises(EndpointDown) as e:
        asyncio.run(check_endpoint(Connection(provider="openai", base_url=url, model="m"), role, retries=0))
    msg = str(e.value)
    assert f"is base_url right? (spec field {field}); the last try: connection refused" in msg, msg
    assert msg.startswith(f"{role} endpoint {url} (model m): unreachable after 1 try over ")


def test_a_host_name_that_does_not_resolve_asks_whether_base_url_is_right(monkeypatch):
    real = socket.getaddrinfo

    def fake(host, *a, **kw):  # no lookup leaves the machine
        if host == "no-such-host.invalid":
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real(host, *a, **kw)

    monkeypatch.setattr(socket, "getaddrinfo", fake)
    conn = Connection(provider="openai", base_url="http://no-such-host.invalid/v1", model="m")
    with pytest.raises(EndpointDown) as e:
        asyncio.run(check_endpoint(conn, "judge", retries=0))
    assert "is base_url right? (spec field judge.base_url); the last try: DNS failure" in str(e.value), str(e.value)


def test_a_handed_over_check_is_taken_once_while_fresh_and_dropped_when_not_taken():
    """``hand_over_check`` around a run's evaluation: the first sampling stage takes the check, the
    next does not; a check older than ``FRESH_S`` is not taken; one nobody took is gone afterwards
    (a later run of the same id in this process checks at its stage's start)."""
    import time
    from types import SimpleNamespace

    from aip_assets import preflight

    ctx = SimpleNamespace(run_id="r-1", metric="llm.decision_flip")
    with preflight.hand_over_check("r-1", time.monotonic()):
        assert preflight.checked_before_the_run(SimpleNamespace(run_id="r-2", metric="m")) is False  # another run's
        assert preflight.checked_before_the_run(ctx) is True
        assert preflight.checked_before_the_run(ctx) is False  # once: the next metric checks
    with preflight.hand_over_check("r-1", time.monotonic() - preflight.FRESH_S - 1):
        assert preflight.checked_before_the_run(ctx) is False  # over a minute old
    with preflight.hand_over_check("r-1", time.monotonic()):
        pass  # no metric sampled
    assert preflight.checked_before_the_run(ctx) is False
