"""Which provider a connection has, and what it supports: the one place that maps a connection's
``provider`` setting to its :class:`~aip_assets.models.provider.Provider` class (the protocol and
its types are in ``provider.py``, which imports no implementation)."""

from __future__ import annotations

from typing import Any

from ..connections import Connection
from .provider import Capabilities, Provider


def _registry() -> dict[str, type[Provider]]:
    """The providers by kind: a connection's ``provider`` setting, and ``openai+batch`` for an
    OpenAI-compatible connection with ``batch.enabled`` (imported on first use: the model layer's
    HTTP stack loads only where a provider is asked for)."""
    from .batch_provider import BatchProvider
    from .builtin import BuiltinProvider
    from .openai_compatible import OpenAICompatibleProvider

    return {"builtin": BuiltinProvider, "openai": OpenAICompatibleProvider, "openai+batch": BatchProvider}


def _kind(conn: Connection) -> str:
    return "openai+batch" if conn.provider == "openai" and conn.batch.enabled else conn.provider


def provider_for(conn: Connection) -> Provider:
    """The provider of a connection (not yet open: asking it what it supports costs nothing)."""
    provider: Provider = _registry()[_kind(conn)](conn)
    return provider


def capabilities(conn: Connection) -> Capabilities:
    """What a connection's provider supports."""
    caps: Capabilities = _registry()[_kind(conn)].capabilities
    return caps


def stored_capabilities(conn: dict[str, Any]) -> Capabilities | None:
    """What the provider of a connection as a stored spec holds it (its JSON) supports; None for a
    provider name no provider has."""
    name = conn.get("provider") or ""
    batch = conn.get("batch")
    if name == "openai" and isinstance(batch, dict) and batch.get("enabled"):
        name = "openai+batch"
    cls = _registry().get(name)
    return None if cls is None else cls.capabilities
