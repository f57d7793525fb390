"""The endpoint check before a run: one tiny question to a role's endpoint, retried as a call is,
which says whether it answers, is down (``EndpointDown``) or cannot be used (``EndpointError``).
The search for the structured-output form it takes is the client's (``client.negotiate``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ..connections import Connection
from ..errors import EndpointDown, EndpointError
from .builtin import ENDPOINT_CHECK
from .client import ModelClient
from .providers import capabilities
from .retry import what_failed

logger = logging.getLogger("aip_assets")


CHECK_MIN_RETRIES = 2  # the endpoint check retries at least this often, whatever its calls' retries


def base_url_field(role: str) -> str:
    """The spec's field that holds the ``base_url`` of the connection a role's calls use."""
    if role.startswith("judge-"):  # a panel's judge N (panel_role): judges[N - 1]
        return f"judges[{int(role.removeprefix('judge-')) - 1}].base_url"
    return {"audit": "judge_audit.judge.base_url"}.get(role, f"{role}.base_url")


def _address_hint(role: str, error: str) -> str:
    """When nothing listens at the address or its host name does not resolve: the address itself
    may be wrong (a typo, a port, a host), not the endpoint down."""
    if error.startswith(("connection refused", "DNS failure")):
        return f"; is base_url right? (spec field {base_url_field(role)})"
    return ""


async def check_endpoint(
    conn: Connection,
    role: str,
    *,
    retries: int = CHECK_MIN_RETRIES,
    timeout: float = 30.0,
    backoff_s: float = 0.5,
    log: Callable[[str], None] | None = None,
) -> str:
    """Ask the endpoint one tiny question, retried as a call is (``ModelClient._call``): a try that
    fails transiently (no connection, a timeout, 408/409/425/429, 5xx) is tried again, up to
    ``retries`` times, after an exponential backoff with jitter from ``backoff_s`` or after the
    Retry-After the endpoint asks for; each try waits ``timeout`` seconds at most. A Retry-After is
    one of the retries here (not a free wait up to max_rate_limit_wait_seconds), so an endpoint
    answering 429 for ever ends the check within its budget. Each wait is told to ``log`` (default:
    the project's logger) with why it waits, how long and before which try.

    Raises EndpointDown when the endpoint is still down after the retries (the message says what
    was tried and the last failure), EndpointError when it answers but cannot be used
    (unauthorised, not a chat completion, TLS, a missing key)."""
    if capabilities(conn).offline:
        return f"{role}: builtin model ({conn.profile.name})"
    where = f"{role} endpoint {conn.base_url} (model {conn.model})"
    say = log or logger.info
    client = ModelClient(
        conn,
        role=role,
        run_id="preflight",
        metric="",
        stage="preflight",
        journal=None,
        backoff_s=backoff_s,
        concurrency=1,
        share_connections=False,
        batchable=False,  # one call: no slot, no batch, no concurrency to adapt
        on_wait=lambda why: say(f"endpoint check: {where} {why}"),
        retry_after_uses_retries=True,
    )
    t0 = time.monotonic()
    try:
        async with client:
            r = await client.chat(
                [{"role": "user", "content": ENDPOINT_CHECK}],
                temperature=0.0,
                retries=retries,
                timeout=timeout,
                max_tokens=5,
            )
    except EndpointError as e:
        raise EndpointError(f"{where}: {e}") from None
    if r.ok:
        return f"{role}: {conn.base_url} answers as {r.model or conn.model}"
    if r.http_status in (401, 403):
        raise EndpointError(f"{where}: unauthorised (HTTP {r.http_status}); check api_key_env / header_env")
    if r.transient:
        what = (
            "unreachable" if r.http_status is None else f"unavailable: it {what_failed(r.error or '', r.http_status)}"
        )
        tries = f"{r.attempts} tr{'y' if r.attempts == 1 else 'ies'}"
        raise EndpointDown(
            f"{where}: {what} after {tries} over {time.monotonic() - t0:.1f}s (the check's budget: "
            f"{retries} retries, backoff from {backoff_s:g}s doubling with jitter or the Retry-After "
            f"asked for, {timeout:g}s per try){_address_hint(role, r.error or '')}; the last try: {r.error}"
        )
    if r.http_status is None:
        raise EndpointError(f"{where}: unreachable: {r.error}")
    raise EndpointError(f"{where}: does not answer a chat completion: {r.error}")
