"""The `aip_assets` logger as each command sets it up (the CLI, a --parallel worker): its own module,
so whatever starts a command imports it without importing the CLI."""

from __future__ import annotations

import logging
import sys

log = logging.getLogger("aip_assets")


class StderrHandler(logging.StreamHandler):
    """Writes to whatever `sys.stderr` is when a record is emitted, not the stream of the moment the
    handler was made (which a caller, such as a test capturing output, may have closed since)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


def setup_logging(quiet: bool, prefix: str = "[aip]"):
    """Configure the `aip_assets` logger for one command; returns the function that puts back what
    was there, so calling `main()` in a process (tests, a notebook) leaves its logging as it was."""
    saved = (log.handlers[:], log.level, log.propagate)
    handler = StderrHandler()
    handler.setFormatter(logging.Formatter(f"{prefix} %(message)s"))
    log.handlers[:] = [handler]
    log.setLevel(logging.WARNING if quiet else logging.INFO)
    log.propagate = False

    def restore() -> None:
        log.handlers[:] = saved[0]
        log.setLevel(saved[1])
        log.propagate = saved[2]

    return restore
