"""The JSON objects in a judge's answer as judges write them (:func:`scan_json`,
:func:`json_objects`): in code fences or not, after a preamble, before trailing prose, outside
``<think>`` blocks, trailing commas and Python-style dicts repaired, a cut-off final object noticed."""

from __future__ import annotations

import re

from .text import _THINK

_FENCE = re.compile(r"```[a-zA-Z0-9_-]*\s*\n?")
_TRAILING_COMMA = re.compile(r",\s*([}\]])")
_DECODER = None


def _balanced_end(text: str, start: int) -> int | None:
    """Index just past the object opened at ``start``, honouring '…' and "…" strings."""
    depth, quote, esc = 0, None, False
    for i in range(start, len(text)):
        ch = text[i]
        if quote:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
    return None


def _repair(fragment: str) -> object | None:
    """A near-JSON object: trailing commas, or a Python dict (single quotes, True/False/None)."""
    import ast
    import json

    fixed = _TRAILING_COMMA.sub(r"\1", fragment)
    try:
        return json.loads(fixed, strict=False)  # a raw line break or tab inside a string, as small models write
    except ValueError:
        pass
    try:
        return ast.literal_eval(fixed)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None


def json_objects(text: str | None) -> list[dict]:
    """Every top-level JSON object in an answer, in order (see :func:`scan_json`)."""
    return scan_json(text)[0]


_KEY_START = re.compile(r"\{\s*[\"']")


def scan_json(text: str | None) -> tuple[list[dict], bool]:
    """(every top-level JSON object in an answer, in order; whether an object the answer began
    after the last one is unfinished). Objects count inside code fences or not, after a preamble,
    before trailing prose, outside ``<think>`` blocks; trailing commas and Python-style dicts are
    repaired. Objects inside a top-level array are not top-level (an array is no verdict). A
    cut-off final object means the verdict is missing, whatever drafts came before it. A raw
    control character (a line break, a tab) inside a string is read as JSON-with-it, not refused."""
    import json

    global _DECODER
    if not text:
        return [], False
    # strict=False: a raw line break or tab inside a string ("line one<newline>line two") is read, as
    # many small models write it; only control characters inside strings are allowed beyond JSON
    _DECODER = _DECODER or json.JSONDecoder(strict=False)
    body = _FENCE.sub("\n", _THINK.sub(" ", text)).replace("```", "\n")
    out: list[dict] = []
    unfinished = False
    i = 0
    while i < len(body):
        ch = body[i]
        if ch not in "{[":
            i += 1
            continue
        try:
            value, end = _DECODER.raw_decode(body, i)
        except ValueError:
            value, end = None, None
        if end is None:
            stop = _balanced_end(body, i)
            value = _repair(body[i:stop]) if stop else None
            end = stop if value is not None else None
            if end is None and stop is None and ch == "{" and _KEY_START.match(body, i):
                unfinished = True  # an object begun and never closed: the answer was cut off
        if end is None:
            i += 1
            continue
        if isinstance(value, dict) and not unfinished:  # after an unfinished object, objects are inside it
            out.append(value)
        i = end
    return out, unfinished
