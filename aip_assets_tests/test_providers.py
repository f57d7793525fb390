"""The provider layer (models/provider.py): each provider keeps to the protocol, says what it
supports, and the client drives any provider through it (cache -> provider -> journal)."""

from __future__ import annotations

import asyncio
import inspect
import json
from typing import Any, ClassVar

import pytest

from aip_assets.models import builtin
from aip_assets.models.batch_provider import BatchProvider
from aip_assets.models.builtin import BuiltinProvider
from aip_assets.models.client import ModelClient
from aip_assets.models.openai_compatible import OpenAICompatibleProvider
from aip_assets.models.provider import Capabilities, Provider, TransportResponse
from aip_assets.models.providers import capabilities, provider_for, stored_capabilities
from aip_assets.models.structured import FORMS, configured_form
from aip_assets.runspec import BuiltinProfile, Connection

from .scripted import Reply

BUILTIN = Connection()
OPENAI = Connection(provider="openai", base_url="http://127.0.0.1:9/v1", model="m")
BATCHED = Connection(provider="openai", base_url="http://127.0.0.1:9/v1", model="m", batch={"enabled": True})
METHODS = ("open", "send", "classify", "transient", "describe", "aclose")


@pytest.mark.parametrize(
    "conn, cls", [(BUILTIN, BuiltinProvider), (OPENAI, OpenAICompatibleProvider), (BATCHED, BatchProvider)]
)
def test_each_provider_keeps_to_the_protocol(conn, cls):
    """A connection gets its provider, unopened; the provider has every method of the protocol with
    the protocol's parameters (and coroutines where the protocol's are), and its capabilities."""
    p = provider_for(conn)
    assert type(p) is cls and isinstance(p, Provider) and p.conn is conn
    for name in METHODS:
        want, got = getattr(Provider, name), getattr(cls, name)
        assert list(inspect.signature(got).parameters) == list(inspect.signature(want).parameters), name
        assert inspect.iscoroutinefunction(got) == inspect.iscoroutinefunction(want), name
    assert isinstance(cls.capabilities, Capabilities) and capabilities(conn) is cls.capabilities


def test_what_each_provider_says_it_supports():
    b, o, batched = capabilities(BUILTIN), capabilities(OPENAI), capabilities(BATCHED)
    assert b.offline and b.structured_forms == ("prompt",) and b.pinned_form == "prompt"
    assert not (b.batch or b.writes or b.shares_connections or b.may_be_down or b.sends_text)
    assert not o.offline and o.structured_forms == FORMS and o.pinned_form is None and not o.batch
    assert o.writes and o.shares_connections and o.may_be_down and o.sends_text
    assert batched == Capabilities(**{**o.__dict__, "batch": True})
    # the builtin model is asked in its one form whatever the setting; an endpoint as configured
    assert configured_form("on", b) == "prompt" and configured_form("auto", o) is None
    assert configured_form("on", o) == "json_schema" and configured_form("json_object", batched) == "json_object"
    # a stored spec's connection (its JSON), as the report reads it
    assert stored_capabilities(json.loads(BUILTIN.model_dump_json())) is b
    assert stored_capabilities(json.loads(BATCHED.model_dump_json())) is batched
    assert stored_capabilities({"provider": "openai"}) is o and stored_capabilities({"provider": "x"}) is None


def test_the_builtin_provider_answers_in_process():
    p = provider_for(Connection(profile=BuiltinProfile(name="flip", value="Berlin", p=1.0)))
    body = {
        "model": "aip-builtin",
        "messages": [{"role": "user", "content": "Should I? Answer YES or NO."}],
        "temperature": 0.0,
    }

    async def go() -> TransportResponse:
        p.open()
        try:
            return await p.send(body, timeout=1.0)
        finally:
            await p.aclose()

    r = asyncio.run(go())
    assert r.status_code == 200 and r.body == builtin.handle_chat(body, p.conn.profile)
    assert p.describe() == 'builtin {"name": "flip", "p": 1.0, "value": "Berlin"}'


def test_the_http_provider_over_loopback(scripted):
    """Sends the text it is given as the body, returns the endpoint's answer and an error's headers,
    and classifies what got no answer."""
    server = scripted(lambda body, n: Reply(503, text="busy", headers={"Retry-After": "3"}) if n == 2 else "fine")
    p = provider_for(Connection(provider="openai", base_url=server.url, model="m"))
    body = {"model": "m", "messages": [{"role": "user", "content": "q"}]}

    async def go() -> tuple[TransportResponse, TransportResponse]:
        p.open()
        try:
            return await p.send(body, 5.0, text=json.dumps(body)), await p.send(body, 5.0)
        finally:
            await p.aclose()

    ok, busy = asyncio.run(go())
    assert ok.status_code == 200 and ok.body["choices"][0]["message"]["content"] == "fine"
    assert busy.status_code == 503 and busy.headers.get("retry-after") == "3"
    assert server.bodies() == [body, body] and p.describe() == server.url.rstrip("/")
    assert p.transient(429) and p.transient(503) and p.transient(408) and not p.transient(400)
    assert not p.transient(404)
    assert p.classify(ConnectionRefusedError(111, "refused"), 5.0) == (
        "connection refused: nothing listens at that address and port",
        True,
    )
    assert p.classify(TimeoutError(), 2.0) == ("timeout: no complete answer within 2s", True)


class ScriptedProvider:
    """A provider of the test's own: no HTTP. It fails its first sends as scripted (an exception,
    or a status), then answers; its own ``transient`` decides which statuses are retried."""

    capabilities: ClassVar[Capabilities] = Capabilities(
        offline=False, structured_forms=("prompt",), shares_connections=False
    )

    def __init__(self, conn: Connection, script: list[Any] | None = None):
        self.conn = conn
        self.script = list(script or [])
        self.sent: list[str | None] = []
        self.opened = self.closed = False

    def open(self) -> None:
        self.opened = True

    async def send(self, body: dict[str, Any], timeout: float, text: str | None = None) -> TransportResponse:
        self.sent.append(text)
        step = self.script.pop(0) if self.script else None
        if isinstance(step, BaseException):
            raise step
        if isinstance(step, int):
            return TransportResponse(step, None, f"scripted {step}")
        return TransportResponse(
            200,
            {
                "choices": [{"message": {"content": f"answer {len(self.sent)}"}}],
                "model": "scripted",
                "usage": {"prompt_tokens": 3, "completion_tokens": 2},
            },
            "",
        )

    def classify(self, e: BaseException, timeout: float) -> tuple[str, bool]:
        return f"scripted failure {type(e).__name__}", isinstance(e, ConnectionError)

    def transient(self, status: int) -> bool:
        return status == 418  # not a status the HTTP provider retries: the client asks this provider

    def describe(self) -> str:
        return "scripted"

    async def aclose(self) -> None:
        self.closed = True


def _drive(provider: ScriptedProvider, tmp_path, retries: int, times: int = 1):
    from aip_assets.models.journal import Journal

    journal = Journal(tmp_path / "j.sqlite")

    async def go():
        async with ModelClient(
            provider.conn,
            role="sut",
            run_id="r",
            metric="m",
            stage="s",
            journal=journal,
            backoff_s=0.001,
            provider=provider,
        ) as cl:
            return [
                await cl.chat([{"role": "user", "content": "q"}], temperature=0.0, retries=retries, timeout=5)
                for _ in range(times)
            ]

    results = asyncio.run(go())
    journal.flush()
    frames = list(journal.frames("r", "m", "s"))
    journal.close()
    return results, (frames[0] if frames else None)


def test_the_client_drives_a_provider_through_the_protocol(tmp_path):
    """Retried on what the provider classifies as transient (a connection error, its status 418),
    journaled once with its attempts, then answered from the journal without a send."""
    assert isinstance(ScriptedProvider(OPENAI), Provider)
    p = ScriptedProvider(OPENAI, [ConnectionResetError("gone"), 418])
    (first, again), frame = _drive(p, tmp_path, retries=2, times=2)
    assert p.opened and p.closed and len(p.sent) == 3
    assert first.ok and first.text == "answer 3" and first.attempts == 3 and first.retries_used == 2
    assert first.model == "scripted" and (first.prompt_tokens, first.completion_tokens) == (3, 2)
    assert again.cached and again.text == "answer 3" and again.call_key == first.call_key
    assert len(frame) == 1 and frame.attempts[0] == 3 and frame.status[0] == "ok"
    assert p.sent[0] == frame.request[0]  # the text sent is the text journaled (sends_text)


def test_what_the_provider_calls_final_is_not_retried(tmp_path):
    p = ScriptedProvider(OPENAI, [PermissionError("no"), 418])  # no answer, and final as classified
    [r], frame = _drive(p, tmp_path, retries=3)
    assert not r.ok and r.attempts == 1 and r.error == "scripted failure PermissionError" and not r.transient
    assert len(p.sent) == 1 and frame.status[0] == "error"
    (tmp_path / "b").mkdir()
    p = ScriptedProvider(OPENAI, [503, 503])  # 503 is the HTTP provider's transient status, not this one's
    [r], _ = _drive(p, tmp_path / "b", retries=3)
    assert not r.ok and r.attempts == 1 and r.http_status == 503 and r.error == "HTTP 503: scripted 503"


class Recording:
    """A provider wrapping another (the HTTP one here): every request it sends, then the inner's answer."""

    capabilities: ClassVar[Capabilities] = OpenAICompatibleProvider.capabilities

    def __init__(self, conn: Connection):
        self.conn = conn
        self.inner = OpenAICompatibleProvider(conn)
        self.statuses: list[int] = []

    def open(self) -> None:
        self.inner.open()

    async def send(self, body: dict[str, Any], timeout: float, text: str | None = None) -> TransportResponse:
        r = await self.inner.send(body, timeout, text)
        self.statuses.append(r.status_code)
        return r

    def classify(self, e: BaseException, timeout: float) -> tuple[str, bool]:
        return self.inner.classify(e, timeout)

    def transient(self, status: int) -> bool:
        return self.inner.transient(status)

    def describe(self) -> str:
        return "recording " + self.inner.describe()

    async def aclose(self) -> None:
        await self.inner.aclose()


def test_a_provider_plugged_in_over_http_gets_the_clients_retries_and_journal(scripted, tmp_path):
    """Over a real HTTP path: a 429 with Retry-After is waited out (no retry used), a 500 retried,
    the answer journaled once with its three attempts, and a second ask answered from the journal."""
    from aip_assets.models.journal import Journal

    answers = iter([Reply(429, headers={"Retry-After": "0"}), Reply(500, text="oops"), "fine"])
    server = scripted(lambda body, n: next(answers))
    conn = Connection(provider="openai", base_url=server.url, model="m")
    p = Recording(conn)
    journal = Journal(tmp_path / "j.sqlite")

    async def go():
        async with ModelClient(
            conn, role="judge", run_id="r", metric="m", stage="s", journal=journal, backoff_s=0.001, provider=p
        ) as cl:
            return [
                await cl.chat([{"role": "user", "content": "q"}], temperature=0.0, retries=1, timeout=5)
                for _ in range(2)
            ]

    first, again = asyncio.run(go())
    journal.flush()
    [frame] = journal.frames("r", "m", "s")
    journal.close()
    assert p.statuses == [429, 500, 200] and len(server.bodies()) == 3
    assert first.ok and first.text == "fine" and first.attempts == 3 and first.rate_limit_waits == 1
    assert first.retries_used == 1 and again.cached and again.text == "fine"
    assert len(frame) == 1 and frame.attempts[0] == 3 and frame.role[0] == "judge"
