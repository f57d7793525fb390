"""An endpoint's ``max_connections``, shared by every client on this machine.

``max_connections`` on a connection is the endpoint's capacity, not one client's: the metrics of
``aip-eval run --parallel N``, the partitions the Dagster UI runs at once, a second ``aip-eval run``
and the roles of one stage that call the same endpoint all draw from it, so the endpoint never
sees more calls in flight than it allows.

The capacity is cut into at most 64 slot files (``max_connections`` 512: 64 files of 8) in a
folder per endpoint and capacity, beside the rate schedules (``ratelimit.limits_dir``). A client
holds the slots it uses by an exclusive ``flock`` on their files, and its calls in flight are
bounded by the slots it holds. A process that dies holds nothing: its locks go with its file
descriptors.

Sharing: each client holds a member file (locked while it lives; a stale one is removed by whoever
finds it unlocked). A client's fair share is ``max_connections`` // the live members (at least
one slot). It takes the free slots it wants (up to its own concurrency) at its first call sent,
and every half second it looks again:

- below its fair share and short of what it wants, it takes free slots, and if there are none it
  says so by touching its member file;
- above its fair share while another member says it is short, it starts no new call beyond its
  share and gives back each slot as soon as no call of its own is in flight on it (never its
  last one);
- while nobody is short, it may grow beyond its fair share into slots nobody uses.

A client that holds no slot waits for one (and says so); such a wait of more than 30 s is logged.
With more clients than slots, the ones without a slot wait for one to be given back.

The pool belongs to the endpoint's URL *and* its ``max_connections``: connections to one URL
with different values (a SUT at 64 and a judge at 8) are separate pools, each bounded by its own.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import random
import time
from pathlib import Path

from .. import interrupts
from .ratelimit import _own_folder, limits_dir

logger = logging.getLogger("aip_assets")
MAX_FILES = 64
REBALANCE_S = 0.5  # how often a client looks at the others
SHORT_FRESH_S = 2.0  # a member file touched this recently says its client is short of slots
WARN_WAIT_S = 30.0


def _flock_nb(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def _open(path: Path) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600)


class SharedSlots:
    """The slots of one endpoint that one client holds (see the module's docstring)."""

    def __init__(self, endpoint: str, max_connections: int, want: int, directory: Path | None = None):
        base = directory or limits_dir()
        _own_folder(base)
        self.dir = base / f"{hashlib.sha256(endpoint.encode()).hexdigest()[:32]}.c{max_connections}"
        _own_folder(self.dir)
        self.endpoint, self.total = endpoint, max_connections
        n = min(max_connections, MAX_FILES)
        self.sizes = [max_connections // n + (1 if i < max_connections % n else 0) for i in range(n)]
        self.want = max(1, min(want, max_connections))
        self.held: dict[int, int] = {}  # slot file index -> its locked descriptor
        name = f"{os.getpid()}-{random.getrandbits(48):012x}"
        self.member = self.dir / f"m-{name}"
        making = self.dir / f"t-{name}"  # locked before it is named m-*: never taken for a stale one
        self._member_fd = _open(making)
        fcntl.flock(self._member_fd, fcntl.LOCK_EX)
        os.utime(self._member_fd, (0, 0))  # not short until it says so (a new file's time is now)
        os.rename(making, self.member)
        self.closed = False

    # ------------------------------------------------------------------ what is held
    @property
    def capacity(self) -> int:
        return sum(self.sizes[i] for i in self.held)

    def _take_free(self, up_to: int) -> None:
        """Take free slot files (from a random place) while the capacity held is below ``up_to``."""
        n = len(self.sizes)
        start = random.randrange(n)
        for k in range(n):
            if self.capacity >= up_to:
                return
            i = (start + k) % n
            if i in self.held:
                continue
            fd = _open(self.dir / f"s-{i:02d}")
            if _flock_nb(fd):
                self.held[i] = fd
            else:
                os.close(fd)

    def _give_back(self, down_to: int) -> None:
        """Release slot files while more than ``down_to`` is held, keeping at least one."""
        for i in sorted(self.held, key=lambda i: self.sizes[i]):
            if len(self.held) <= 1 or self.capacity - self.sizes[i] < down_to:
                return
            os.close(self.held.pop(i))  # closing the descriptor releases its lock

    # ------------------------------------------------------------------ the others
    def _members(self) -> tuple[int, bool]:
        """(live members, whether another one is short of slots). Removes stale member files."""
        live, other_short, now = 0, False, time.time()
        for f in self.dir.glob("m-*"):
            if f == self.member:
                live += 1
                continue
            try:
                fd = os.open(f, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
            except OSError:
                continue  # gone meanwhile
            try:
                if _flock_nb(fd):  # nobody holds it: its client is gone
                    try:
                        f.unlink()
                    except OSError:
                        pass
                    continue
                live += 1
                other_short = other_short or now - os.fstat(fd).st_mtime < SHORT_FRESH_S
            finally:
                os.close(fd)
        return max(live, 1), other_short

    def look(self, in_flight: int = 0) -> int:
        """Take or give back slots as the module's docstring says; returns how many calls this
        client may have in flight from now on (0: none held). Slots still covering ``in_flight``
        calls are kept until a later look: given back, they would let another client send before
        these calls end."""
        if self.closed:
            return 0
        live, other_short = self._members()
        share = max(1, self.total // live)  # rounded down: every live client can have its share
        goal = min(self.want, share)
        self._take_free(self.want if not other_short else goal)
        bound = self.capacity
        if bound < goal:
            os.utime(self._member_fd)  # say it: holders above their share give back
        elif other_short and bound > goal:
            self._give_back(max(goal, in_flight))
            bound = min(goal, self.capacity)
        return bound

    async def acquire(self) -> int:
        """Hold at least one slot (waiting for one, saying so); returns how many calls this client
        may have in flight (as :meth:`look`)."""
        t0 = time.monotonic()
        warned = False
        while (bound := self.look()) == 0:
            if not warned and time.monotonic() - t0 > WARN_WAIT_S:
                warned = True
                logger.warning(
                    f"{self.endpoint}: waiting {time.monotonic() - t0:.0f}s for a connection: its "
                    f"max_connections ({self.total}) are all in use by other clients on this machine "
                    f"(shared through {self.dir})"
                )
            await interrupts.sleep(0.05 + random.random() * 0.05)  # a Ctrl-C ends the wait
        return bound

    def __del__(self) -> None:  # a client dropped without closing still lets its slots go
        try:
            self.close()
        except Exception:  # noqa: BLE001 - at interpreter exit, os may be gone
            pass

    def close(self) -> None:
        if getattr(self, "closed", True):  # closed, or __init__ failed before it was set
            return
        self.closed = True
        for fd in self.held.values():
            os.close(fd)
        self.held.clear()
        try:
            self.member.unlink()
        except OSError:
            pass
        os.close(self._member_fd)
