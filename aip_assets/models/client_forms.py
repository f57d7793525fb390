"""The structured-output side of a model client (``client.ModelClient``): the form its requests ask
for JSON in (``structured.FORMS``), pinned by the connection, recorded for the run in the journal,
or found by probing the endpoint (``client.negotiate``, whose finding is a ``Negotiation``); the
move to the next form after a refusal; and the run notes saying which form and why.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import structured

if TYPE_CHECKING:
    from ..connections import Connection
    from .journal import Journal
    from .provider import Capabilities

logger = logging.getLogger("aip_assets")


class StructuredForms:
    """The structured-output methods of ``ModelClient``, which sets the attributes below and finds
    a form by probing the endpoint (``_negotiate``)."""

    conn: Connection
    caps: Capabilities
    journal: Journal | None
    run_id: str
    metric: str
    stage: str
    role: str
    endpoint_id: str
    on_note: Callable[[dict[str, str]], None] | None

    # ---- structured output (models/structured.py): the form this client asks for JSON in
    _form: str | None  # once known (structured_form)
    _form_lock: asyncio.Lock | None  # made in the running loop

    def _where(self) -> str:
        return f"{self.role} endpoint {self.endpoint_id} (model {self.conn.model})"

    async def structured_form(self) -> str:
        """The structured-output form of this run's requests for JSON to this endpoint: the one the
        connection pins (``on``, ``off``, a form; the builtin model: ``prompt``), else (``auto``)
        the one recorded for the run in the journal, by the endpoint check before the run or by an
        earlier stage; with none recorded (a run launched without the check), it is found now, once
        per (run, endpoint), the same way, and recorded. A run note says which form and why."""
        if self._form is not None:
            return self._form
        if self._form_lock is None:
            self._form_lock = asyncio.Lock()
        async with self._form_lock:
            if self._form is not None:
                return self._form
            pinned = structured.configured_form(self.conn.structured_output, self.caps)
            if pinned is not None:
                self._form = pinned
                if self.caps.pinned_form is None:
                    self._note(
                        "info",
                        "structured_output",
                        f"{self.metric} {self.stage}: {self._where()} is asked "
                        f"for JSON in form {pinned} (structured_output: {self.conn.structured_output})",
                    )
                return pinned
            rec = await self._recorded_form()
            if rec is None:
                n = await self._negotiate()
                rec = {
                    "run_id": self.run_id,
                    "endpoint": self.endpoint_id,
                    "model": self.conn.model,
                    "role": self.role,
                    "form": n.form,
                    "previous": None,
                    "how": "lazily",
                    "reason": n.describe(),
                }
                if self.journal is not None:
                    await self._in_thread(self.journal.record_form, rec)
                    rec = await self._recorded_form() or rec  # another process may have recorded one first
            self._form = rec["form"]
            how = {
                "preflight": "chosen by the endpoint check before the run",
                "lazily": "chosen when the run first asked this endpoint for JSON (no choice was recorded)",
                "fallback": "moved to after a refusal",
            }.get(rec["how"], rec["how"])
            self._note(
                "info",
                "structured_output",
                f"{self.metric} {self.stage}: {self._where()} is asked for JSON "
                f"in form {self._form} ({how}: {rec['reason']})",
            )
            return self._form

    async def _recorded_form(self) -> dict[str, Any] | None:
        if self.journal is None:
            return None
        return await self._in_thread(self.journal.form, self.run_id, self.endpoint_id, self.conn.model)

    async def _in_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        """A journal statement: off the event loop when the journal is a server's."""
        return await asyncio.to_thread(fn, *args) if self.journal is not None and self.journal.REMOTE else fn(*args)

    # judging ahead (metrics/ahead.py) is told of a refused form instead: moving the run to the next
    # form is the judging stage's (its requests, its note), so none of its answers is asked twice
    on_refusal: Callable[[], None] | None = None

    def falls_back(self) -> bool:
        """Whether a refused form moves this client to the next one (``structured_output: auto``).
        Asked when the endpoint has refused the form."""
        if self.on_refusal is not None:
            self.on_refusal()
            return False
        return self.caps.pinned_form is None and self.conn.structured_output == "auto"

    async def fall_back(self, refused: str, words: str | None) -> str:
        """The endpoint refused form ``refused`` (``words``: what it said): the run asks it in the next
        form from now on (recorded in the journal, with a run note), or in the form another request
        already moved it to. Uses no judgement's budget."""
        current = self._form or refused
        nxt = structured.next_form(refused) or refused
        if structured.later(current, nxt) == current:  # moved on already (another judgement's refusal)
            return current
        self._form = nxt
        reason = f"the endpoint refused form {refused}: {(words or '')[:300]}"
        if self.journal is not None:
            await self._in_thread(
                self.journal.record_form,
                {
                    "run_id": self.run_id,
                    "endpoint": self.endpoint_id,
                    "model": self.conn.model,
                    "role": self.role,
                    "form": nxt,
                    "previous": refused,
                    "how": "fallback",
                    "reason": reason,
                },
            )
        self._note(
            "warning",
            "structured_output_fallback",
            f"{self.metric} {self.stage}: {self._where()} refused "
            f"response_format in form {refused} ({(words or '')[:300]}); the run asks it in form {nxt} from "
            "now on (structured_output: auto; the refused requests used no judgement's retries)",
        )
        return nxt

    def _note(self, level: str, code: str, msg: str) -> None:
        (logger.warning if level == "warning" else logger.info)(msg)
        if self.on_note:
            self.on_note({"level": level, "code": code, "message": msg})

    async def _negotiate(self) -> Negotiation:
        """The form this endpoint takes, found now by probing it (``client.negotiate``)."""
        raise NotImplementedError


@dataclass
class Negotiation:
    """The structured-output form found for an endpoint (``negotiate``) and what the others did."""

    form: str
    tried: list[tuple[str, str]]  # (form, why it was not kept), in the order tried
    requests: int  # requests sent, retries included
    answered: bool = True  # False: no form got the JSON object asked for (plain prompting, the last resort)

    def describe(self) -> str:
        """What was found, then why each earlier form was passed over (each reason cut at 200 characters)."""
        before = "; ".join(f"{f}: {why if len(why) <= 200 else why[:199] + '…'}" for f, why in self.tried)
        if not self.answered:
            return (
                f"no form got the JSON object asked for, so plain prompting, the last resort ({self.requests} "
                f"request(s)): {before}"
            )
        found = f"{self.form} answered the probe ({self.requests} request(s))"
        return f"{found}; before it, {before}" if before else found
