"""Ctrl-C (SIGINT) and SIGTERM stop a run, once, cleanly.

The first signal asks the run to stop. No model call, stage or metric starts after it; the calls
already sent are answered and journaled (a resume pays for none of them again); a wait (a backoff,
a Retry-After, a rate limit, a provider batch being polled: it stays journaled and is polled again
on resume) ends at once; and the stage ends without writing its tables, with a
``KeyboardInterrupt`` (Dagster books it as an interruption). Where no event loop runs (the
warehouse read or written, scores aggregated) the stage stops at once, as Python's own handler
would stop it: a warehouse write rolls back whole, and the journal is closed (written) on the way
out. A second signal abandons the calls still in flight (they had no answer: a resume makes them
again); a third exits at once (``os._exit(130)``), and the journal (SQLite in WAL mode, or
Postgres) still holds every call written before.

Whoever holds the signal handler sees a signal: this module inside :func:`handled` (``aip-eval
run`` for its whole length, and each stage), Dagster's own handlers between a run's steps. So that
no signal is lost in Dagster's bookkeeping, the outermost :func:`handled` also sets a wakeup fd:
the interpreter writes each signal's number there whichever Python handler runs, and
:func:`requested` counts what it finds.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

logger = logging.getLogger("aip_assets")
SIGNALS = (signal.SIGINT, signal.SIGTERM)
EXIT_CODE = 130  # DESIGN.md: interrupted


class Interrupted(Exception):
    """Raised inside a stage where the run stops after a signal: at the next model call or wait.
    An ordinary Exception there, so a metric's bounded loops let the calls in flight finish (and
    be journaled) before it reaches the stage, which then ends with :class:`StageInterrupted`."""

    def __init__(self, message: str = "interrupted: the run stops (Ctrl-C or SIGTERM)"):
        super().__init__(message)


class StageInterrupted(KeyboardInterrupt):
    """A stage that stopped on a signal, its calls journaled and nothing of it written."""


class _State:
    def __init__(self) -> None:
        # SIGINT / SIGTERM since the outermost handled() began: those this module's handler ran for, and
        # the bytes the wakeup fd holds (every signal, whichever handler ran; two signals before a handler
        # runs are one call of it, and a byte may come a moment after the handler ran): the count is the larger
        self.seen = self.piped = 0
        self.modes: list[bool] = []  # per handled() level: whether plain code stops at the first signal
        self.pipe: tuple[int, int] | None = None  # the wakeup fd (read end, write end)
        self.events: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Event] = weakref.WeakKeyDictionary()
        self.hint = ""  # how to resume: said by the last-resort exit too
        self.forward: Callable[[], Iterable[int]] | None = None  # processes each signal is passed on to


_s = _State()


def _read_pipe() -> None:
    if _s.pipe is None:
        return
    while True:
        try:
            data = os.read(_s.pipe[0], 512)
        except OSError:  # empty (BlockingIOError), or closed
            return
        if not data:
            return
        _s.piped += sum(b in SIGNALS for b in data)


def _count() -> int:
    return max(_s.seen, _s.piped)


def count() -> int:
    """SIGINT and SIGTERM received so far (by whichever handler)."""
    _read_pipe()
    return _count()


def requested() -> bool:
    """Has a signal asked the run to stop?"""
    return count() > 0


def check() -> None:
    """Raise :class:`Interrupted` once a signal asked the run to stop. Cheap (every model call
    asks): it reads the count this module's handler keeps; :func:`requested` also reads the
    signals Dagster's handlers took."""
    if _count():
        raise Interrupted()


def set_hint(text: str) -> None:
    """How to resume the run (said when the process exits at once, on the third signal)."""
    _s.hint = text


@contextmanager
def forwarding(pids: Callable[[], Iterable[int]]) -> Iterator[None]:
    """Within: each signal this process receives is passed on (as SIGINT) to the processes
    ``pids()`` names (``--parallel``'s workers, in their own process group)."""
    before, _s.forward = _s.forward, pids
    try:
        yield
    finally:
        _s.forward = before


def _say(text: str) -> None:
    """Write to stderr from a signal handler: no logging lock, no buffered stream."""
    try:
        os.write(2, (text + "\n").encode())
    except OSError:
        pass


def _first_notice(event: asyncio.Event | None, name: str) -> None:
    if event is not None:
        event.set()
    logger.warning(
        f"interrupted ({name}): no new model call, stage or metric starts; the calls in flight are "
        "answered and journaled, then the run stops (Ctrl-C again abandons them)"
    )


def _on_signal(signum: int, frame: Any) -> None:
    _s.seen += 1
    n = count()
    if _s.forward is not None:
        try:
            for pid in _s.forward():
                try:
                    os.kill(pid, signal.SIGINT)
                except OSError:
                    pass
        except Exception:  # noqa: BLE001 - the workers are gone: nothing to pass on
            pass
    if n >= 3:
        _say("interrupted again: exiting now" + (f"; {_s.hint}" if _s.hint else ""))
        os._exit(EXIT_CODE)
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    if loop is None:
        if (
            _s.modes and _s.modes[-1]
        ):  # plain code (the warehouse, aggregation): stop here, as Python's own handler does
            raise KeyboardInterrupt
        return  # noted: whoever waits here (a --parallel parent, an idle worker) looks at requested()
    if n >= 2:
        _say(
            "interrupted again: abandoning the calls in flight (a resume makes them again); "
            "Ctrl-C once more exits at once"
        )
        raise KeyboardInterrupt
    # in an event loop: the next call or wait stops (check, sleep); the calls in flight finish
    loop.call_soon_threadsafe(_first_notice, _s.events.get(loop), signal.Signals(signum).name)


def _enter(stop: bool) -> tuple[dict, bool] | None:
    if threading.current_thread() is not threading.main_thread():
        return None
    outer = not _s.modes
    saved = {s: signal.getsignal(s) for s in SIGNALS}
    if outer:
        _s.seen, _s.piped, _s.hint, _s.pipe = 0, 0, "", None
        r, w = os.pipe()
        os.set_blocking(r, False)
        os.set_blocking(w, False)
        try:
            old_fd = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        except ValueError:
            old_fd = None
        if old_fd == -1:
            _s.pipe = (r, w)
        else:  # not allowed here, or someone else's (an event loop's signal handlers): theirs, not ours
            if old_fd is not None:
                signal.set_wakeup_fd(old_fd)
            os.close(r)
            os.close(w)
    else:
        _read_pipe()  # what Dagster's handlers took since
    for s in SIGNALS:
        signal.signal(s, _on_signal)
    _s.modes.append(stop)
    return saved, outer


def _exit(entered: tuple[dict, bool] | None) -> None:
    if entered is None:
        return
    saved, outer = entered
    _s.modes.pop()
    for s, h in saved.items():
        signal.signal(s, h if h is not None else signal.SIG_DFL)
    if outer:
        if _s.pipe is not None:
            signal.set_wakeup_fd(-1)
            for fd in _s.pipe:
                os.close(fd)
        _s.seen, _s.piped, _s.hint, _s.pipe = 0, 0, "", None


@contextmanager
def handled(stop: bool = True) -> Iterator[None]:
    """SIGINT and SIGTERM stop the run (the module's docstring) while within. ``stop`` False:
    plain code is not stopped at the first signal, only counted (for a process that waits on
    others, and looks at :func:`requested`). Nested uses share the outermost's count (it starts
    at 0 and ends there); each puts back the handlers it found (Dagster's, inside a step). Off the
    main thread (where Python allows no handler) it does nothing."""
    entered = _enter(stop)
    try:
        yield
    finally:
        _exit(entered)


def handle_for_life() -> None:
    """Count signals for the rest of this process's life, stopping nothing by itself (a
    ``--parallel`` worker between metrics; each stage stops as ``handled`` says)."""
    _enter(False)


def _event() -> asyncio.Event:
    loop = asyncio.get_running_loop()
    ev = _s.events.get(loop)
    if ev is None:
        ev = _s.events[loop] = asyncio.Event()
    return ev


async def sleep(seconds: float) -> None:
    """``asyncio.sleep(seconds)`` that a signal ends: raises :class:`Interrupted` then (or at once)."""
    check()
    stop = _event()
    nap = asyncio.ensure_future(asyncio.sleep(seconds))
    woken = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({nap, woken}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        nap.cancel()
        woken.cancel()
    if stop.is_set():
        raise Interrupted()
