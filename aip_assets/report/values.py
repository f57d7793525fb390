"""Warehouse values as plain Python, and their formatting as HTML: 3 decimals for scores and rates,
integers for counts, the raw value in the element's ``data-value`` attribute."""

from __future__ import annotations

import json
import math
import re
from html import escape
from typing import Any

import numpy as np
import pandas as pd
from pandas.arrays import BooleanArray, FloatingArray, IntegerArray

TEXT_LIMIT = 600


def _v(x: Any) -> Any:
    """A warehouse value as plain Python: NULL/NaN -> None, numpy scalars -> int/float/bool."""
    if x is None or x is pd.NA or x is pd.NaT:
        return None
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, np.generic) and not isinstance(x, np.datetime64):
        x = x.item()
        if isinstance(x, float) and math.isnan(x):
            return None
    return x


def _raw(x: Any) -> str:
    """The exact value for a data-value attribute (floats round-trip through repr)."""
    x = _v(x)
    if x is None:
        return ""
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, float):
        return repr(x)
    return str(x)


def _f3(x: Any) -> str:
    x = _v(x)
    return "n/a" if x is None else f"{float(x):.3f}"


def _int(x: Any) -> str:
    x = _v(x)
    return "n/a" if x is None else f"{round(float(x)):,}"


def _e(s: Any) -> str:
    return escape("" if s is None else str(s), quote=True)


def _attrs(**kw: Any) -> str:
    return "".join(f' {k.replace("_", "-")}="{_e(v)}"' for k, v in kw.items() if v is not None)


def _num(x: Any, fmt: str = "f3", tag: str = "span", cls: str = "num", **attrs: Any) -> str:
    """A number element: formatted text, raw value in data-value."""
    text = _f3(x) if fmt == "f3" else _int(x)
    x = _v(x)
    if fmt == "int" and isinstance(x, float) and x.is_integer():
        x = int(x)  # a count column with NULLs elsewhere comes back as float
    return f'<{tag} class="{cls}"{_attrs(**attrs)} data-value="{_e(_raw(x))}">{text}</{tag}>'


def _clip(s: Any, limit: int = TEXT_LIMIT) -> str:
    s = "" if _v(s) is None else str(s)
    return s if len(s) <= limit else s[:limit].rstrip() + "…"


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "-", s).strip("-")


def _records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """The rows of ``df`` as plain Python (:func:`_v` of what ``df.to_dict("records")`` gives),
    converted a column at a time: a numeric, boolean or text column through ``tolist`` (the same
    Python scalars), any other through ``Series.tolist`` and :func:`_v`. A fifth of a report's
    time went to converting value by value."""
    cols = df.columns.tolist()
    if len(set(cols)) != len(cols):  # to_dict's own way with duplicate names (the last one kept)
        return [{k: _v(v) for k, v in r.items()} for r in df.to_dict("records")]
    return [dict(zip(cols, row, strict=True)) for row in zip(*(_column(df.iloc[:, i]) for i in range(len(cols))))]


def _column(s: pd.Series) -> list[Any]:
    """One column's values as :func:`_records` gives them (public pandas only)."""
    dtype = s.dtype
    if isinstance(dtype, np.dtype) and dtype.kind in "biuf":  # numpy numbers: Python scalars, NaN -> None
        values = s.to_numpy().tolist()
        return [None if v != v else v for v in values] if dtype.kind == "f" else values
    if isinstance(s.array, BooleanArray | IntegerArray | FloatingArray) or isinstance(dtype, pd.StringDtype):
        # nullable numbers, flags and text: Python scalars and str, missing (or NaN) -> None
        return [None if v != v else v for v in s.array.to_numpy(dtype=object, na_value=None).tolist()]
    return [_v(v) for v in s.tolist()]  # any other column: Python or pandas scalars, then _v


def _json(s: Any) -> Any:
    s = _v(s)
    if s is None:
        return None
    if isinstance(s, (dict, list)):
        return s
    try:
        return json.loads(s)
    except (TypeError, ValueError):
        return None
