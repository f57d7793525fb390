"""The provider layer: what a model client asks of whatever answers its requests.

A provider sends one chat-completion request and says what became of a request that got no
answer; its :class:`Capabilities` say what it supports. The client (``client.ModelClient``)
composes the journal's cache, a provider and the journal's record around it, so nothing outside
``models/`` asks which provider a connection names: it asks :func:`capabilities` instead.

Providers:

- ``openai_compatible.OpenAICompatibleProvider``: any OpenAI-compatible ``/chat/completions``
  endpoint over HTTP;
- ``builtin.BuiltinProvider``: the builtin model, in process, offline and deterministic;
- ``batch_provider.BatchProvider``: an OpenAI-compatible endpoint whose calls go through its
  Batch API (``batch.enabled``); the client hands them to its ``batch.BatchRunner``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

from ..connections import Connection


@dataclass
class TransportResponse:
    """A provider's answer to one request: the HTTP status, the JSON body, the text (for an error)."""

    status_code: int
    body: dict[str, Any] | None
    text: str
    headers: dict[str, str] = field(default_factory=dict)


def parse_completion(body: dict[str, Any] | None):
    """(text, model, fingerprint, prompt_tokens, completion_tokens) or an error string."""
    if not isinstance(body, dict):
        return "malformed response: no choices[0].message.content"
    try:
        choice = body["choices"][0]
        text = choice["message"]["content"]
    except (TypeError, KeyError, IndexError):
        return "malformed response: no choices[0].message.content"
    if text is None:
        text = ""
    usage = body.get("usage") or {}
    return (
        text,
        body.get("model"),
        body.get("system_fingerprint"),
        usage.get("prompt_tokens"),
        usage.get("completion_tokens"),
    )


@dataclass(frozen=True)
class Capabilities:
    """What a provider supports, asked instead of its name.

    Attributes:
        offline: it answers in process from a known function of the request: no endpoint to check,
            no network, no key, no cost, the same answer every time (the builtin model).
        structured_forms: the structured-output forms (``structured.FORMS``) it can be asked for
            JSON in, in the order ``structured_output: auto`` tries them; one form means it is
            never asked in another (the builtin model reads its prompts: ``prompt`` only).
        batch: it sends a stage's calls through a Batch API.
        writes: it writes new text on request (paraphrases, personas); a provider that cannot
            leaves synthesis to the metric's own catalogue.
        shares_connections: its calls hold the endpoint's connections (``max_connections``,
            shared by every client on this machine: ``slots.SharedSlots``).
        may_be_down: its endpoint can be unreachable or overloaded, so a run of failed calls
            finds it down (``client.DOWN_AFTER_CALLS``).
        sends_text: it sends the body as the JSON text the client made of it once (``wire_json``:
            the body's own key order; the journal keeps that text); otherwise the journal keeps
            the body itself.
    """

    offline: bool
    structured_forms: tuple[str, ...]
    batch: bool = False
    writes: bool = True
    shares_connections: bool = True
    may_be_down: bool = True
    sends_text: bool = True

    @property
    def pinned_form(self) -> str | None:
        """The one structured-output form it takes, when it takes only one."""
        return self.structured_forms[0] if len(self.structured_forms) == 1 else None


@runtime_checkable
class Provider(Protocol):
    """What answers a client's requests for one connection.

    ``open`` makes what ``send`` needs (a session, the resolved headers: it raises
    ``EndpointError`` for a missing key); ``aclose`` releases it.
    """

    capabilities: ClassVar[Capabilities]
    conn: Connection

    def __init__(self, conn: Connection) -> None:
        """A provider for ``conn``, not yet open."""

    def open(self) -> None:
        """Make what sending needs; raises ``EndpointError`` when the connection cannot be used."""

    async def send(self, body: dict[str, Any], timeout: float, text: str | None = None) -> TransportResponse:
        """POST one chat completion; ``text``: the body as JSON when the caller has it already."""

    def classify(self, e: BaseException, timeout: float) -> tuple[str, bool]:
        """(what happened, whether a retry may answer it) for a request that got no answer."""

    def transient(self, status: int) -> bool:
        """Whether an answer with this HTTP status is one a retry may answer (408, 429, 5xx …)."""

    def describe(self) -> str:
        """The connection's endpoint as a report names it."""

    async def aclose(self) -> None:
        """Release what ``open`` made."""
