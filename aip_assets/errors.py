"""Errors a user sees. Each names the file, row and field where it can."""

from __future__ import annotations

from pathlib import Path


class AipError(Exception):
    """Base class for errors reported to the user without a traceback."""


class SpecError(AipError):
    """The run spec is invalid."""


class SettingsError(AipError):
    """An ``AIP_*`` environment variable has a value that cannot be used (settings.py): names it."""


class DatasetError(AipError):
    """The dataset is invalid: names file, row and field."""


class EndpointError(AipError):
    """A model endpoint is unreachable, unauthorised or misconfigured."""


class OperationalError(AipError):
    """Something outside the project failed and did not recover in time: a lock not released, a
    database or an endpoint unreachable after its retries. Exit 5 (``EXIT_OPERATIONAL``); the
    message names what failed and where, and the command that stops on it says how to resume."""


class EndpointDown(OperationalError, EndpointError):
    """A model endpoint still down after the endpoint check's retries (no connection, timeouts,
    429, 5xx), as opposed to one that answers but cannot be used (unauthorised, misconfigured).
    Before a run it stops the run with exit 5 (an operational failure, nothing written: run it again
    once the endpoint answers); at a stage's start the stage goes on and its calls are recorded as
    failed (the gate fails on them)."""


class LimitReached(AipError):
    """The run stopped at one of its limits (calls, tokens): exit 4, resumable."""


# The exit codes of `aip-eval` (DESIGN.md, "Exit codes"; docs/concepts/exit-codes.md): each means one thing.
EXIT_PASSED = 0  # every metric passed its gate
EXIT_GATE_FAILED = 1  # a metric's gate failed (its tables are written)
EXIT_BAD_INPUT = 2  # bad input or configuration: nothing written
EXIT_INTERNAL = 3  # a bug of aip-eval: the traceback is saved
EXIT_LIMIT = 4  # stopped at a limit (calls, tokens): resumable
EXIT_OPERATIONAL = 5  # a failure outside the project (a lock, a database, an endpoint) after retries: resumable
EXIT_INTERRUPTED = 130  # Ctrl-C or SIGTERM: resumable


def save_traceback(text: str, what: str, folder: Path) -> str:
    """Keep a bug's traceback in ``folder`` (the data folder's ``errors/``; else the temporary
    folder), for the report the message asks for; returns where (or why it could not be kept).
    ``what``: a word for the file's name (the command, a run and metric)."""
    import os
    import re
    import tempfile
    import time

    name = f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}-{re.sub(r'[^A-Za-z0-9_.-]+', '_', what)[:80]}.txt"
    for place in (folder, Path(tempfile.gettempdir()) / "aip-eval-errors"):
        try:
            place.mkdir(parents=True, exist_ok=True)
            (place / name).write_text(text)
            return str(place / name)
        except OSError:
            continue
    return "(not saved: neither the data folder nor the temporary folder could be written)"


def format_validation_error(exc, prefix: str = "") -> str:
    """Render a pydantic ValidationError as one line per problem: ``field.path: message``."""
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "__root__")
        loc = f"{prefix}.{loc}" if prefix and loc else (prefix or loc)
        msg = err.get("msg", "invalid")
        if err.get("type") == "extra_forbidden":
            msg = "unknown field"
        inp = err.get("input")
        shown = (
            ""
            if err.get("type") in ("missing", "extra_forbidden") or isinstance(inp, (dict, list))
            else f" (got {inp!r})"
        )
        lines.append(f"{loc or '<root>'}: {msg}{shown}")
    return "\n".join(lines)
