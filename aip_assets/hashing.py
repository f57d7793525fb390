"""Hashing helpers every layer uses (a leaf module: it imports nothing of the project)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any


def file_sha256(path: str | Path) -> str:
    """The file's sha256, read a MiB at a time."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def stable_json(obj: Any) -> str:
    """One spelling of a JSON value whatever its keys' order: what request keys and hashes are made of."""
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)


def wire_json(obj: Any) -> str:
    """A request body as it is sent and journaled: compact like ``stable_json`` but in the body's own
    key order, so a schema's properties reach a grammar-constrained judge in the order it declares
    them (``reasoning`` before the ruling). Keys are made of ``stable_json``, never of this."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), default=str)


def u01(*parts: Any) -> float:
    """A uniform number in [0, 1) from the hash of the parts: the builtin model's only randomness."""
    h = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(h[:8], "big") / 2**64
