"""The analysis on one BLAS thread: the shuffle tests' and intervals' products are small (thousands
of draws by a few hundred units), and OpenBLAS's threads cost more than they gain there. On two
busy cores a product of 9,000 x 249 by 249 x 4 took 5 times the CPU and wall time on two threads
as on one; the aggregation of a 32-row decision flip run spent half its CPU in them.

OpenBLAS splits a product's rows and columns between its threads, not the sum of one cell: the
figures were the same to the digit on one thread as on two (the demo's every metric, every table
and ``--json``), and on one they no longer depend on how many cores the machine has. Without
OpenBLAS (another BLAS, or none found) nothing changes.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

# (get, set) pairs by the names OpenBLAS builds export: numpy's wheels (scipy-openblas, 64-bit
# integers), OpenBLAS built with a symbol suffix, a system OpenBLAS
NAMES = [
    ("scipy_openblas_get_num_threads64_", "scipy_openblas_set_num_threads64_"),
    ("scipy_openblas_get_num_threads", "scipy_openblas_set_num_threads"),
    ("openblas_get_num_threads64_", "openblas_set_num_threads64_"),
    ("openblas_get_num_threads", "openblas_set_num_threads"),
]
_lock = threading.Lock()
_depth = 0  # nested or concurrent holders: the first sets one thread, the last restores
_saved = 0


def _loaded_openblas() -> list[str]:
    """The OpenBLAS libraries this process has loaded (numpy's), from its memory map."""
    try:
        text = Path("/proc/self/maps").read_text()
    except OSError:
        return []
    paths = {line.split(None, 5)[-1] for line in text.splitlines() if "openblas" in line.lower() and "/" in line}
    return sorted(p for p in paths if p.startswith("/"))


@functools.cache
def _controls() -> tuple[Callable[[], int], Callable[[int], None]] | None:
    import numpy  # noqa: F401 - its BLAS loaded first

    for path in _loaded_openblas():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for get_name, set_name in NAMES:
            get, put = getattr(lib, get_name, None), getattr(lib, set_name, None)
            if get is not None and put is not None:
                get.restype, get.argtypes = ctypes.c_int, []
                put.restype, put.argtypes = None, [ctypes.c_int]
                return get, put
    return None


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """BLAS on one thread within the block (process-wide: OpenBLAS has one setting), restored after."""
    global _depth, _saved
    controls = _controls()
    if controls is None:
        yield
        return
    get, put = controls
    with _lock:
        if _depth == 0:
            _saved = get()
            if _saved != 1:
                put(1)
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _saved != 1:
                put(_saved)
