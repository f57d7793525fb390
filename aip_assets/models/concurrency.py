"""The calls a client has in flight: an adaptive bound (additive increase, multiplicative
decrease on rate-limit answers) under the endpoint's connections this client holds (``slots``)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from .. import interrupts

if TYPE_CHECKING:
    from .deadline import RowClock


class AdaptiveLimit:
    """At most ``limit`` calls in flight: a semaphore whose size adapts to the endpoint (additive
    increase, multiplicative decrease). A rate-limit answer halves the limit, once for all the
    answers to calls sent before that cut (a burst of 429s is one signal, not thirty); after
    ``limit`` successes in a row it grows by one, never above ``ceiling`` (the configured
    concurrency) nor below 1. With ``adaptive`` off it is a plain semaphore of ``ceiling``.

    ``cap`` is a second, separate bound: the endpoint's connections this client holds (its slots,
    models/slots.py). Calls in flight stay under both; a change of ``cap`` never undoes a cut."""

    def __init__(self, ceiling: int, adaptive: bool = True):
        self.ceiling = self.limit = self.lowest = self.cap = ceiling
        self.adaptive = adaptive
        self.in_flight = 0
        self.cuts = 0  # a call remembers how many cuts there had been when it was sent
        self._streak = 0
        self._cond: asyncio.Condition | None = None
        self._waiting = 0  # calls queued for a place

    def _c(self) -> asyncio.Condition:
        if self._cond is None:  # made on first use, inside the running loop
            self._cond = asyncio.Condition()
        return self._cond

    async def __aenter__(self) -> AdaptiveLimit:
        if not self._waiting and self.in_flight < self.bound:  # a free place and nobody queued before
            self.in_flight += 1  # this call: take it at once (one event loop: nothing runs in between)
            return self
        c = self._c()
        self._waiting += 1
        try:
            async with c:
                await c.wait_for(lambda: self.in_flight < self.bound)
                self.in_flight += 1
        finally:
            self._waiting -= 1
        return self

    @property
    def bound(self) -> int:
        return min(self.limit, self.cap)

    async def __aexit__(self, *exc) -> None:
        self.in_flight -= 1
        if self._waiting and self.in_flight < self.bound:  # nobody queued: nobody to wake
            c = self._c()
            async with c:
                if self.in_flight < self.bound:
                    c.notify(self.bound - self.in_flight)

    async def pause(self, seconds: float, clock: RowClock | None = None) -> None:
        """Sleep without holding a place: a call waiting out a rate limit or a backoff gives its
        place back and queues for one again (behind the limit as it is by then). The wait counts
        on the row's clock; queueing for the place afterwards does not (as before any call)."""
        await self.__aexit__()
        try:
            await interrupts.sleep(seconds)  # a Ctrl-C ends the wait: the call is not retried
        finally:
            if clock is not None:
                clock.stop()
            try:  # shielded: a cancelled wait still takes the place its caller will give back
                await asyncio.shield(self.__aenter__())
            finally:
                if clock is not None:
                    clock.start()

    async def set_cap(self, cap: int) -> None:
        """The connections this client holds now: calls above it finish, none starts until under."""
        if cap == self.cap:
            return
        self.cap = max(1, cap)
        if self.in_flight < self.bound:
            c = self._c()
            async with c:
                c.notify(self.bound - self.in_flight)

    def throttled(self, cuts_when_sent: int) -> None:
        """A call sent when there had been ``cuts_when_sent`` cuts got a rate-limit answer: it cuts
        only if no cut came since (the answers to one burst are one signal)."""
        self._streak = 0
        if self.adaptive and cuts_when_sent == self.cuts and self.bound > 1:
            self.limit = self.bound // 2  # half of what was allowed in flight when the 429 came
            self.lowest = min(self.lowest, self.limit)
            self.cuts += 1

    async def succeeded(self) -> None:
        self._streak += 1
        if self.limit < self.ceiling and self._streak >= self.limit:
            self._streak = 0
            self.limit += 1
            c = self._c()
            async with c:
                c.notify(1)
