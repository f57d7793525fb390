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


class WarehouseDamaged(AipError):
    """The warehouse file is not a whole DuckDB database (zero bytes, a garbage header, truncated,
    a failed checksum): exit 2, naming the file and what to do. Nothing is written to it."""

    def __init__(self, path: Path, detail: str):
        self.path = path
        wal = Path(f"{path}.wal")
        aside = f"mv {path} {path}.damaged" + (f" && mv {wal} {wal}.damaged" if wal.exists() else "")
        super().__init__(
            f"{path}: the warehouse file is damaged and cannot be read ({detail}); nothing was written. "
            f"Move it aside (`{aside}`) and restore it from a backup, or let the next `aip-eval run` "
            "start a new warehouse there (the runs the damaged file held are not in it)"
        )


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


class DiskFull(OperationalError):
    """No space left on a disk aip-eval writes to (the warehouse, the journal, Dagster's storage,
    the data folder): exit 5, naming the path; the command that stops on it says how to resume."""


# what a write to a full disk says: the OS (ENOSPC, EDQUOT), DuckDB ("No space left on device"),
# SQLite ("database or disk is full", the journal and Dagster's storage)
_FULL_ERRNOS = {28, 122}  # ENOSPC, EDQUOT (Linux)
_FULL_WORDS = ("no space left on device", "database or disk is full", "disk quota exceeded")


def disk_full(e: BaseException, where: Path | None = None) -> DiskFull | None:
    """A write that failed because its disk is full (``e`` or one of its causes), as an error that
    names the path and what to do; None for any other error. ``where``: the path, when the caller
    knows it better than the error does (else the error's file name, else the data folder)."""
    import re

    seen: set[int] = set()
    err: BaseException | None = e
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        msg = str(err)
        if (isinstance(err, OSError) and err.errno in _FULL_ERRNOS) or any(w in msg.lower() for w in _FULL_WORDS):
            if isinstance(err, DiskFull):
                return err
            named = getattr(err, "filename", None) or (m.group(1) if (m := re.search(r'file "([^"]+)"', msg)) else None)
            path = where or (Path(named) if named else "the data folder")
            return DiskFull(
                f"no space left on the disk of {path} ({msg.splitlines()[0].strip() if msg else 'ENOSPC'}): "
                "free space on that disk (`df -h` shows how much is left)"
            )
        err = err.__cause__ or err.__context__
    return None


# The exit codes of `aip-eval` (DESIGN.md, "Exit codes"; docs/concepts/exit-codes.md): each means one thing.
EXIT_PASSED = 0  # every metric passed its gate
EXIT_GATE_FAILED = 1  # a metric's gate failed (its tables are written)
EXIT_BAD_INPUT = 2  # bad input or configuration: nothing written
EXIT_INTERNAL = 3  # a bug of aip-eval: the traceback is saved
EXIT_LIMIT = 4  # stopped at a limit (calls, tokens): resumable
EXIT_OPERATIONAL = 5  # a failure outside the project (a lock, a database, an endpoint) after retries: resumable
EXIT_INTERRUPTED = 130  # Ctrl-C or SIGTERM: resumable


def symlink_loop(path: Path) -> str | None:
    """What to say of a path that is a symbolic link leading back to itself (ELOOP); None otherwise."""
    import errno

    try:
        path.stat()
    except OSError as e:
        if e.errno == errno.ELOOP:
            return (
                "is a symbolic link that loops (it leads back to itself, never to a file); point it, or the "
                "spec, at the dataset file itself"
            )
    return None


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
