"""The OpenAI-compatible provider: any ``/chat/completions`` endpoint over httpx.

httpx is the API; an aiohttp transport carries it (``AiohttpBodyTransport``), because on this
kind of machine httpx's default transport spends its CPU in connection-pool bookkeeping at high
concurrency (see DESIGN.md and ``benchmarks/bench_sampling.py``).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from typing import Any, ClassVar

import aiohttp
import httpx
import yarl
from aiohttp import http_exceptions

from ..connections import Connection
from ..errors import EndpointError
from ..hashing import wire_json
from . import structured
from .provider import Capabilities, TransportResponse

TRANSIENT_STATUS = {408, 409, 425, 429}


def scrub_secrets(text: str, conn: Connection) -> str:
    """``text`` (an endpoint's error page, which may echo the request's headers) without the
    connection's secrets: the API key and every header_env value."""
    values = [os.environ.get(conn.api_key_env or "")] + [os.environ.get(env) for env in conn.header_env.values()]
    for v in sorted((v for v in values if v and len(v) >= 4), key=len, reverse=True):
        text = text.replace(v, "***")
    return text


def resolve_headers(conn: Connection) -> dict[str, str]:
    """Request headers with secrets read from the environment now (never stored)."""
    headers = {"Content-Type": "application/json", **conn.headers}
    if conn.api_key_env:
        key = os.environ.get(conn.api_key_env)
        if not key:
            raise EndpointError(f"{conn.base_url}: environment variable {conn.api_key_env} (api_key_env) is not set")
        headers["Authorization"] = f"Bearer {key}"
    for name, env in conn.header_env.items():
        val = os.environ.get(env)
        if val is None:
            raise EndpointError(f"{conn.base_url}: environment variable {env} (header_env.{name}) is not set")
        headers[name] = val
    return headers


# aiohttp's failures as httpx's (the httpx transport contract), the aiohttp error kept as the
# cause: describe_failure reads the chain. The first match in this order wins (most specific first).
_HTTPX_ERRORS: list[tuple[type, type]] = [
    (aiohttp.ConnectionTimeoutError, httpx.ConnectTimeout),
    (aiohttp.SocketTimeoutError, httpx.ReadTimeout),
    (aiohttp.ServerTimeoutError, httpx.TimeoutException),
    (aiohttp.ClientConnectorError, httpx.ConnectError),
    (aiohttp.ServerDisconnectedError, httpx.RemoteProtocolError),
    (aiohttp.ClientPayloadError, httpx.ReadError),
    (aiohttp.ClientConnectionError, httpx.NetworkError),
    (aiohttp.ClientError, httpx.TransportError),
]


class AiohttpBodyTransport(httpx.AsyncBaseTransport):
    """An httpx transport on one aiohttp session (its pool holds at most ``max_connections``),
    for requests whose answer is read whole: the answer comes back as an ``httpx.Response``
    holding its bytes, with no stream wrapper and no async iteration per chunk.

    Measured against ``httpx-aiohttp``'s transport (which wraps the answer's stream) and aiohttp
    called directly, client CPU per call at 1,024 calls in flight on 2 cores (2026-11-30,
    ``bench_sampling.py`` workload): httpx-aiohttp 0.42-0.52 ms, this 0.39-0.44 ms, aiohttp
    directly 0.32-0.45 ms (bare aiohttp loop 0.26-0.29). httpx stays the API (DESIGN.md), so the
    httpx request and response objects remain the client's largest cost at that load."""

    def __init__(self, max_connections: int, keepalive_s: float = 5.0):
        self.max_connections, self.keepalive_s = max_connections, keepalive_s
        self.session: aiohttp.ClientSession | None = None
        self._timeouts: dict[tuple, aiohttp.ClientTimeout] = {}
        self._urls: dict[httpx.URL, yarl.URL] = {}

    def _open(self, https: bool) -> aiohttp.ClientSession:
        # TLS as httpx makes it (certifi's roots, no SSLKEYLOGFILE from the environment)
        connector = aiohttp.TCPConnector(
            limit=self.max_connections,
            limit_per_host=0,
            keepalive_timeout=self.keepalive_s,
            ssl=httpx.create_ssl_context(trust_env=False) if https else True,
        )
        self.session = aiohttp.ClientSession(connector=connector, trust_env=False, cookie_jar=aiohttp.DummyCookieJar())
        return self.session

    def _timeout(self, t: dict[str, float | None]) -> aiohttp.ClientTimeout:
        """httpx's connect / read / pool timeouts as aiohttp's (its ``connect`` covers the wait for
        a connection of the pool), made once per value (row deadlines give many: a few kept)."""
        key = (t.get("connect"), t.get("read"), t.get("pool"))
        timeout = self._timeouts.get(key)
        if timeout is None:
            timeout = self._timeouts[key] = aiohttp.ClientTimeout(
                total=None, sock_connect=key[0], sock_read=key[1], connect=key[2]
            )
            if len(self._timeouts) > 64:
                self._timeouts.pop(next(iter(self._timeouts)))
        return timeout

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        session = self.session or self._open(request.url.scheme == "https")
        url = self._urls.get(request.url)
        if url is None:  # parsed once per URL, not per call
            url = self._urls[request.url] = yarl.URL(str(request.url), encoded=True)
        try:
            async with session.request(
                request.method,
                url,
                headers=request.headers,
                data=request.content or None,
                timeout=self._timeout(request.extensions.get("timeout", {})),
                allow_redirects=False,
                compress=None,
            ) as r:
                content = await r.read()
                status, headers = r.status, r.raw_headers
        except aiohttp.ClientError as e:
            for source, target in _HTTPX_ERRORS:
                if isinstance(e, source):
                    raise target(str(e) or type(e).__name__, request=request) from e
            raise
        # the content is already decoded (aiohttp's auto_decompress): drop the header that says
        # otherwise, or httpx would decode it again
        headers = tuple((k, v) for k, v in headers if k.lower() != b"content-encoding")
        return httpx.Response(
            status, headers=headers, content=content, request=request, extensions={"http_version": b"HTTP/1.1"}
        )

    async def aclose(self) -> None:
        session, self.session = self.session, None
        if session is not None:
            await session.close()


class OpenAICompatibleProvider:
    """POST /chat/completions: an httpx request, carried by ``AiohttpBodyTransport``.

    The request goes straight to the transport: an ``httpx.AsyncClient`` would add URL merging,
    cookie extraction and redirect handling on every call, which an API endpoint does not need
    and which cost about 0.2 ms of CPU per call (benchmarks/bench_sampling.py)."""

    capabilities: ClassVar[Capabilities] = Capabilities(offline=False, structured_forms=structured.FORMS)

    def __init__(self, conn: Connection):
        self.conn = conn
        self.transport: AiohttpBodyTransport | None = None  # made by open

    def open(self) -> None:
        conn = self.conn
        self.transport = AiohttpBodyTransport(conn.max_connections)
        self.url = httpx.URL(conn.endpoint_id() + "/chat/completions")
        self.headers = httpx.Headers(resolve_headers(conn))  # normalised once, copied per request

    async def send(self, body: dict[str, Any], timeout: float, text: str | None = None) -> TransportResponse:
        """``text``: the body as JSON when the caller has it already (``wire_json``: its own key order)."""
        transport = self.transport
        assert transport is not None, "send before open"
        # connect and read timeouts inside the transport, so a failure says which it was; the outer
        # bound (later) only catches an answer trickled in so slowly that no read times out. Its half
        # second of margin keeps it from firing in the same turn of a busy event loop as an inner
        # timeout, which would then be reported as the outer one ("no complete answer" for a connect
        # timeout: seen once on a loaded machine with a margin of 0.075 s)
        limits = {"connect": timeout, "read": timeout, "write": timeout, "pool": timeout}
        request = httpx.Request(
            "POST",
            self.url,
            headers=self.headers,
            content=(text if text is not None else wire_json(body)).encode("utf-8"),
            extensions={"timeout": limits},
        )
        bound = timeout * 1.05 + 0.5
        if hasattr(asyncio, "timeout"):  # 3.11+: no task per call, as wait_for makes (visible at 1,024 in flight)
            async with asyncio.timeout(bound):
                resp = await transport.handle_async_request(request)
        else:
            resp = await asyncio.wait_for(transport.handle_async_request(request), bound)
        try:
            parsed = json.loads(resp.content)
        except ValueError:
            parsed = None
        if resp.status_code == 200 and isinstance(parsed, dict):
            return TransportResponse(200, parsed, "")
        return TransportResponse(
            resp.status_code, parsed if isinstance(parsed, dict) else None, resp.text, dict(resp.headers)
        )

    def classify(self, e: BaseException, timeout: float) -> tuple[str, bool]:
        return describe_failure(e, timeout)

    def transient(self, status: int) -> bool:
        return status in TRANSIENT_STATUS or status >= 500

    def describe(self) -> str:
        return self.conn.endpoint_id()

    async def aclose(self) -> None:
        if self.transport is not None:
            await self.transport.aclose()


def describe_failure(e: BaseException, timeout: float) -> tuple[str, bool]:
    """(what happened, whether to retry) for a request that got no HTTP answer. The transport
    raises httpx's error for aiohttp's (``AiohttpBodyTransport``); the aiohttp error it wraps (its
    ``__cause__``) and the OS error under that say what really happened."""
    import ssl

    chain: list[BaseException] = []
    x: BaseException | None = e
    while x is not None and x not in chain:
        chain.append(x)
        x = x.__cause__ or x.__context__
        if isinstance(x, aiohttp.ClientConnectorError) and x.os_error is not None:
            chain.append(x)
            x = x.os_error

    def has(*types) -> BaseException | None:
        return next((c for c in chain if isinstance(c, types)), None)

    text = " ".join(str(c) for c in chain)
    if has(aiohttp.ClientConnectorDNSError) or re.search(
        r"name or service not known|nodename nor servname|"
        r"temporary failure in name resolution|getaddrinfo",
        text,
        re.I,
    ):
        return f"DNS failure: the host name cannot be resolved ({_first_line(chain[-1])})", True
    if has(aiohttp.ClientConnectorCertificateError, aiohttp.ClientSSLError, ssl.SSLError):
        return f"TLS failure: {_first_line(has(aiohttp.ClientSSLError, ssl.SSLError) or chain[-1])}", False
    if has(ConnectionRefusedError):
        return "connection refused: nothing listens at that address and port", True
    cut = has(http_exceptions.ContentLengthError, http_exceptions.TransferEncodingError)
    if cut is None and has(aiohttp.ServerDisconnectedError, ConnectionResetError, httpx.RemoteProtocolError):
        return f"connection {'reset' if has(ConnectionResetError) else 'closed'} by the server without an answer", True
    if cut is not None:  # headers came, then the connection ended mid-body (aiohttp's code 400 is no HTTP status)
        how = "reset" if re.search(r"connection reset", text, re.I) else "closed"
        got = re.search(r"received (\d+) of (\d+) bytes", text)
        part = (
            f": {got[1]} of the {got[2]} bytes its Content-Length announced came"
            if got
            else ": the chunked body stopped before its last chunk"
            if isinstance(cut, http_exceptions.TransferEncodingError)
            else ""
        )
        return f"the connection was {how} before the answer was complete{part} (aiohttp {type(cut).__name__})", True
    if has(aiohttp.ConnectionTimeoutError, httpx.ConnectTimeout) and not has(aiohttp.ClientConnectorError):
        if has(aiohttp.ConnectionTimeoutError) or isinstance(e, httpx.ConnectTimeout) and "onnect" in text:
            return f"connect timeout: no connection within {timeout:g}s", True
    if has(aiohttp.SocketTimeoutError, httpx.ReadTimeout):
        return f"read timeout: connected, but no answer within {timeout:g}s", True
    if has(asyncio.TimeoutError, httpx.TimeoutException):
        return f"timeout: no complete answer within {timeout:g}s", True
    return f"connection error: {type(chain[-1]).__name__}: {_first_line(chain[-1])}", True


def _first_line(x: BaseException) -> str:
    if isinstance(x, http_exceptions.HttpProcessingError) and x.message:
        return x.message.strip().splitlines()[0][:200]  # its str() starts with a code that is no HTTP status
    return (str(x).strip().splitlines() or [type(x).__name__])[0][:200]
