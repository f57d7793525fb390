"""The analysis on one BLAS thread: the shuffle tests' and intervals' products are small (thousands
of draws by a few hundred units), and OpenBLAS's threads cost more than they gain there. On two
busy cores a product of 9,000 x 249 by 249 x 4 took 5 times the CPU and wall time on two threads
as on one; the aggregation of a 32-row decision flip run spent half its CPU in them.

OpenBLAS splits a product's rows and columns between its threads, not the sum of one cell: the
figures were the same to the digit on one thread as on two (the demo's every metric, every table
and ``--json``), and on one they no longer depend on how many cores the machine has.

The BLAS libraries loaded (numpy's OpenBLAS, or MKL, BLIS...) are found and set by threadpoolctl,
the library scikit-learn uses for this; the setting is process-wide (a library has one), so
holders nested or in several threads share it: the first sets one thread, the last restores.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from typing import Any

_lock = threading.Lock()
_depth = 0  # nested or concurrent holders
_limiter: Any = None  # the first holder's limit, restored by the last


@functools.cache
def _controller() -> Any:
    """The BLAS libraries this process has loaded (numpy's first), found once."""
    import numpy  # noqa: F401 - its BLAS loaded first
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController().select(user_api="blas")


def threads() -> list[int]:
    """Each loaded BLAS library's number of threads now ([] when none is found)."""
    return [lib["num_threads"] for lib in _controller().info()]


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """BLAS on one thread within the block (process-wide), restored after."""
    global _depth, _limiter
    with _lock:
        if _depth == 0:
            _limiter = _controller().limit(limits=1)
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                _limiter.restore_original_limits()
                _limiter = None
