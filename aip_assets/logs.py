"""The `aip_assets` logger as each command sets it up (the CLI, a --parallel worker): its own module,
so whatever starts a command imports it without importing the CLI."""

from __future__ import annotations

import logging
import sys
from typing import Any

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


def setup_logging(quiet: bool, prefix: str = "[aip]", verbose: bool = False):
    """Configure the `aip_assets` logger for one command: warnings only (``quiet``), what a reader
    needs (the default: a line per metric, notes, warnings), or each stage's counts too
    (``verbose``, the debug level); returns the function that puts back what was there, so calling
    `main()` in a process (tests, a notebook) leaves its logging as it was."""
    saved = (log.handlers[:], log.level, log.propagate)
    handler = StderrHandler()
    handler.setFormatter(logging.Formatter(f"{prefix} %(message)s"))
    log.handlers[:] = [handler]
    log.setLevel(logging.WARNING if quiet else logging.DEBUG if verbose else logging.INFO)
    log.propagate = False

    def restore() -> None:
        log.handlers[:] = saved[0]
        log.setLevel(saved[1])
        log.propagate = saved[2]

    return restore


def _n(x: Any) -> str:
    """A count with thousands separators; a real number rounded to 3 places."""
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        return f"{x:.3f}"
    return str(x)


def gate_words(gate: dict[str, Any]) -> str:
    """An aggregation's gate in words, its numbers rounded: ``score 0.955 [0.933, 0.970], coverage
    1.000, threshold 0.900: gate failed``."""
    score, lo, hi, thr = (gate.get(k) for k in ("score", "ci_low", "ci_high", "threshold"))
    out = "no score" if score is None else f"score {score:.3f}"
    if score is not None and lo is not None and hi is not None:
        out += f" [{lo:.3f}, {hi:.3f}]"
    if gate.get("coverage") is not None:
        out += f", coverage {gate['coverage']:.3f}"
    out += ", no threshold" if thr is None else f", threshold {thr:.3f}"
    excluded = {k: v for k, v in (gate.get("excluded") or {}).items() if v}
    if excluded:
        out += ", excluded " + ", ".join(f"{k} {_n(v)}" for k, v in excluded.items())
    return out + (": gate passed" if gate.get("passed") else ": gate failed")


def stage_words(stage: str, meta: dict[str, Any]) -> str:
    """A stage's metadata as a sentence (no dict, rounded numbers): the rows it wrote per table, each
    with the records that failed and were excluded, apart (as the progress lines count them); the
    model calls this process sent; the gate in words."""
    rows = {k[5:]: v for k, v in meta.items() if k.startswith("rows.")}
    parts = []
    for table, n in rows.items():
        failed, excluded = meta.get(f"failed.{table}"), meta.get(f"excluded.{table}")
        if table == "llm_calls" or not (n or failed or excluded):
            continue
        text = f"{_n(n)} {table}"
        if failed is not None or excluded is not None:
            text += f" ({_n(failed or 0)} failed, {_n(excluded or 0)} excluded)"
        parts.append(text)
    if "calls.network" in meta:
        recorded, sent = meta.get("rows.llm_calls", 0), meta["calls.network"]
        calls = f"{_n(recorded)} model calls"
        if meta.get("tokens.prompt") or meta.get("tokens.completion"):
            calls += f" (tokens {_n(meta.get('tokens.prompt', 0))} in / {_n(meta.get('tokens.completion', 0))} out)"
        sent_words = "all" if sent == recorded else f"{_n(sent)} of them"
        calls += f", {sent_words} sent by this process ({_n(meta.get('calls.failed', 0))} failed)"
        parts.append(calls)
    for k, v in meta.items():  # anything else a stage says (done_by, ...): scalars only, in words
        if k.split(".", 1)[0] in ("rows", "failed", "excluded", "calls", "tokens") or k in ("summary", "gate"):
            continue
        if isinstance(v, (str, int, float, bool)) and "\n" not in str(v):
            parts.append(f"{k.replace('_', ' ')} {_n(v)}")
    if isinstance(meta.get("gate"), dict):
        parts.append(gate_words(meta["gate"]))
    return f"{stage}: " + ("; ".join(parts) or "nothing written")
