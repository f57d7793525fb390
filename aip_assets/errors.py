"""Errors a user sees. Each names the file, row and field where it can."""

from __future__ import annotations


class AipError(Exception):
    """Base class for errors reported to the user without a traceback."""


class SpecError(AipError):
    """The run spec is invalid."""


class DatasetError(AipError):
    """The dataset is invalid: names file, row and field."""


class EndpointError(AipError):
    """A model endpoint is unreachable, unauthorised or misconfigured."""


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
        shown = "" if err.get("type") in ("missing", "extra_forbidden") or isinstance(inp, (dict, list)) else f" (got {inp!r})"
        lines.append(f"{loc or '<root>'}: {msg}{shown}")
    return "\n".join(lines)
