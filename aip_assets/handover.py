"""What one step of a run computed, handed to a later step in the same process, by key (a run and
a metric, or a run): the findings an aggregation read for its metadata, taken by ``aip-eval run``'s
summary (``findings``); the judgements made during sampling, taken by the judging stage
(``metrics.ahead``); the endpoint check before a run, taken by its first sampling stage
(``preflight.hand_over_check``). A value is taken once; a step that finds none computes it as it
would without."""

from __future__ import annotations

import threading
from typing import Any


class Handover:
    """Values by key, put by one thread and taken (once) by another."""

    def __init__(self) -> None:
        self._items: dict[Any, Any] = {}
        self._lock = threading.Lock()

    def put(self, key: Any, value: Any) -> None:
        with self._lock:
            self._items[key] = value

    def take(self, key: Any, default: Any = None) -> Any:
        """The value put for ``key`` (forgotten now), else ``default``."""
        with self._lock:
            return self._items.pop(key, default)
