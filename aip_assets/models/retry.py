"""Retries: a call tried again after a transient failure, honouring ``Retry-After``.

- every try has the call's ``timeout``, cut at the row's deadline (``deadline``);
- a failure a retry may answer (the provider's ``classify`` / ``transient``: no connection, a
  timeout, 408/409/425/429, 5xx) is tried again up to the call's ``retries``, after an
  exponential backoff with jitter (``backoff_s * 2**n * [0.5, 1.5)``, at most ``MAX_BACKOFF_S``)
  or the Retry-After the endpoint asks for; other 4xx are not retried;
- a 429/503 with ``Retry-After`` is waited out without using a retry, up to the connection's
  ``max_rate_limit_wait_seconds`` per call, and not once the endpoint has answered nothing for
  that long (unless the client counts such waits as retries: the endpoint check);
- each try waits for the endpoint's shared rate (``ratelimit.SharedRate``) and settles what it
  cost; the run's budget is charged once, when the call is first sent;
- a wait gives the call's place back (``concurrency.AdaptiveLimit.pause``); a rate-limit answer
  lowers the calls in flight.
"""

from __future__ import annotations

import email.utils
import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import aiohttp
import httpx

from .. import interrupts
from . import structured
from .openai_compatible import scrub_secrets
from .provider import parse_completion
from .ratelimit import counted_tokens, estimate_tokens, prompt_tokens_estimate
from .result import ChatResult

if TYPE_CHECKING:
    from ..connections import Connection
    from .budget import Budget
    from .concurrency import AdaptiveLimit
    from .deadline import RowClock, RowDeadlines
    from .provider import Provider
    from .ratelimit import SharedRate

MAX_BACKOFF_S = 60.0


class Sender(Protocol):
    """What ``send`` asks of the client whose call it sends (``client.ModelClient``): its connection
    and provider, its bounds (the endpoint's shared rate, the calls in flight, the row deadlines,
    the run's budget), how it waits and whom it tells, and when the endpoint last answered."""

    conn: Connection
    provider: Provider
    limiter: SharedRate | None
    sem: AdaptiveLimit
    deadlines: RowDeadlines
    budget: Budget | None
    backoff_s: float
    retry_after_uses_retries: bool
    on_wait: Callable[[str], None] | None
    _last_answer: float
    _rng: random.Random


def retry_after_s(headers: dict[str, str]) -> float | None:
    """The seconds an answer's ``Retry-After`` asks for (a number, or an HTTP date), None without one."""
    val = next((v for k, v in headers.items() if k.lower() == "retry-after"), None)
    if val is None:
        return None
    try:
        return max(0.0, float(val))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(val)
        return max(0.0, when.timestamp() - time.time())
    except (TypeError, ValueError):
        return None


HTTP_REASONS = {
    408: "request timeout",
    409: "conflict",
    425: "too early",
    429: "rate limited",
    500: "server error",
    502: "bad gateway",
    503: "unavailable",
    504: "gateway timeout",
}


def _secs(x: float) -> str:
    """Seconds as a person reads them: 0.012s, 1.5s, 16s, 600s."""
    return f"{x:.2g}s" if x < 10 else f"{x:.0f}s"


def what_failed(err: str, http_status: int | None) -> str:
    """A try's failure in a few words, for a line saying why a call waits: the HTTP status and its
    meaning, or what happened to the connection (``describe_failure``'s words)."""
    if http_status is None:
        return err
    reason = HTTP_REASONS.get(http_status) or ("server error" if http_status >= 500 else "")
    return f"answered HTTP {http_status}" + (f" ({reason})" if reason else "")


async def send(
    client: Sender,
    body: dict[str, Any],
    key: str,
    retries: int,
    timeout: float,
    clock: RowClock | None = None,
    text: str | None = None,
    counted: bool = False,
) -> ChatResult:
    """One call sent through ``client.provider``, tried again as the module docstring says.
    ``text``: the body as JSON (``wire_json``, its own key order), sent as it is; ``counted``: the budget has the
    call already (a batch's request sent again live)."""
    attempts = retries_used = waits = 0
    waited_s = 0.0
    max_wait = client.conn.max_rate_limit_wait_seconds
    http_status = None

    def left() -> float:
        return float("inf") if clock is None else clock.left()

    def failed(
        err: str, latency: float | None = None, refused: str | None = None, transient: bool = False
    ) -> ChatResult:
        return ChatResult(
            None,
            "error",
            err,
            latency,
            None,
            None,
            None,
            None,
            attempts,
            key,
            http_status=http_status,
            retries_used=retries_used,
            rate_limit_waits=waits,
            structured_refused=refused,
            transient=transient,
        )

    structured_sent = "response_format" in body

    limiter = client.limiter
    tokens = estimate_tokens(body) if limiter is not None else 0  # charged to the shared schedule per attempt
    while True:
        charge: int | None = None  # what this attempt cost at the endpoint, once known (else 0)
        try:
            if limiter is not None:  # waiting for the endpoint's shared rate is not the row's time
                if clock is not None:
                    clock.stop()
                try:
                    await limiter.wait(tokens)
                finally:
                    if clock is not None:
                        clock.start()
            if left() <= 0:
                return failed(
                    client.deadlines.error("before this attempt" if attempts else "before this call was sent")
                )
            interrupts.check()  # after a Ctrl-C nothing is sent or retried; the calls sent finish
            if attempts == 0 and client.budget is not None and not counted:  # counted once it is really sent
                await client.budget.areserve()
            attempts += 1
            cut = left() < timeout  # this attempt ends at the row deadline, not at its own timeout
            t0 = time.perf_counter()
            retry_after = None
            http_status = None
            cuts_when_sent = client.sem.cuts
            try:
                resp = await client.provider.send(body, min(timeout, left()), text)
            except (TimeoutError, httpx.TransportError, aiohttp.ClientError, OSError) as e:
                charge = prompt_tokens_estimate(body) if limiter is not None else 0  # it may have been read
                if cut and left() <= 0:
                    return failed(client.deadlines.error("while this call waited for its answer"))
                err, transient = client.provider.classify(e, timeout)
            else:
                latency = (time.perf_counter() - t0) * 1000
                http_status = resp.status_code
                if resp.status_code == 200:
                    client._last_answer = time.monotonic()
                    await client.sem.succeeded()
                    parsed = parse_completion(resp.body)
                    if isinstance(parsed, str):
                        charge = prompt_tokens_estimate(body) if limiter is not None else 0
                        return failed(parsed, latency)
                    answer, model, fp, pt, ct = parsed
                    charge = counted_tokens(body, pt, ct, answer) if limiter is not None else 0
                    return ChatResult(
                        answer,
                        "ok",
                        None,
                        latency,
                        pt,
                        ct,
                        model,
                        fp,
                        attempts,
                        key,
                        http_status=200,
                        retries_used=retries_used,
                        rate_limit_waits=waits,
                    )
                text_ = scrub_secrets(resp.text, client.conn)  # it may echo the key
                err = f"HTTP {resp.status_code}: {text_[:300]}"
                if limiter is not None and resp.status_code != 429:  # a 429 was refused before any token
                    charge = prompt_tokens_estimate(body)
                words = structured.refusal(resp.status_code, text_) if structured_sent else None
                if words is not None:  # the form is refused, not the request: no retry answers it (a 500 too)
                    return failed(f"HTTP {resp.status_code}: {words}", latency, refused=words)
                transient = client.provider.transient(resp.status_code)
                retry_after = retry_after_s(resp.headers)
                if resp.status_code == 429 or (resp.status_code == 503 and retry_after is not None):
                    client.sem.throttled(cuts_when_sent)
            latency = (time.perf_counter() - t0) * 1000
            if (
                transient
                and http_status in (429, 503)
                and retry_after is not None
                and not client.retry_after_uses_retries
            ):
                # the endpoint says when to come back: a wait, not a failure. Bounded twice: this call
                # waits at most max_rate_limit_wait_seconds in all, and nobody waits once the endpoint
                # has answered nothing for that long (a run against an endpoint that never recovers ends)
                sleep = max(retry_after, client.backoff_s)  # Retry-After: 0 is no licence to hammer
                silent = time.monotonic() - client._last_answer
                if waited_s + sleep <= max_wait and silent + sleep <= max_wait:
                    if sleep >= left():  # the wait would end after the row deadline
                        client.deadlines.count_cut()
                        return failed(
                            f"{err} (rate limited; not waited: the row deadline comes first, "
                            f"{max(left(), 0):.0f}s left, Retry-After {retry_after:g}s)",
                            latency,
                        )
                    waits += 1
                    waited_s += sleep
                    if client.on_wait is not None:
                        client.on_wait(
                            f"{what_failed(err, http_status)}; waiting {_secs(sleep)} (Retry-After; a "
                            f"rate-limit wait uses no retry) before try {attempts + 1}"
                        )
                    await client.sem.pause(sleep, clock)
                    continue
                err += (
                    f" (rate limited: this call waited {waited_s:g}s on Retry-After, the endpoint answered "
                    f"nothing for {silent:.0f}s; max_rate_limit_wait_seconds {max_wait:g})"
                )
            if not transient or retries_used >= retries:
                return failed(err, latency, transient=transient)
            delay = (
                retry_after
                if retry_after is not None
                else client.backoff_s * 2**retries_used * (0.5 + client._rng.random())
            )
            if min(delay, MAX_BACKOFF_S) >= left():  # the retry would start after the row deadline
                client.deadlines.count_cut()
                return failed(f"{err} (not retried: the row deadline comes first)", latency, transient=transient)
            retries_used += 1
            if client.on_wait is not None:
                client.on_wait(
                    f"{what_failed(err, http_status)}; waiting {_secs(min(delay, MAX_BACKOFF_S))} "
                    f"({'Retry-After' if retry_after is not None else 'backoff'}) before try "
                    f"{attempts + 1} of {retries + 1}"
                )
            await client.sem.pause(min(delay, MAX_BACKOFF_S), clock)
        finally:
            if limiter is not None:  # the schedule follows what the endpoint counted
                limiter.settle(tokens, charge or 0)
