"""The report's warehouse rows as plain Python (report/values.py ``_records``): converted a column
at a time, they are exactly what converting ``to_dict("records")`` value by value gave."""

from __future__ import annotations

import math
from typing import Any

import duckdb
import numpy as np
import pandas as pd
import pytest

from aip_assets.report.values import _records, _v


def _by_value(df: pd.DataFrame) -> list[dict[str, Any]]:
    """The conversion as it was: every value of ``to_dict("records")`` through ``_v``."""
    return [{k: _v(v) for k, v in r.items()} for r in df.to_dict("records")]


def _same(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    if isinstance(a, np.ndarray):
        return a.tolist() == b.tolist()
    return bool(a == b)


def _assert_same(df: pd.DataFrame) -> None:
    want, got = _by_value(df), _records(df)
    assert len(got) == len(want)
    for w, g in zip(want, got, strict=True):
        assert list(g) == list(w)
        for k in w:
            assert _same(w[k], g[k]), (k, w[k], g[k], df[k].dtype)


SQL = """
    SELECT * FROM (VALUES
        (1, 'a', 1.5, TRUE, 10, 2.5::DOUBLE, TIMESTAMP '2026-01-02 03:04:05.123456', [1, 2], 'x', 7::HUGEINT),
        (2, NULL, NULL, NULL, NULL, 'nan'::DOUBLE, NULL, NULL, 'y', NULL),
        (3, 'c''s <b>', -0.0, FALSE, -3, NULL, TIMESTAMP '2026-01-02 00:00:00', [], NULL, 0::HUGEINT)
    ) t(i, s, f, b, n, d, ts, l, s2, h)
"""


def test_records_of_a_warehouse_query_equal_the_value_by_value_conversion():
    """Text with NULLs, nullable integers, flags and floats (NULL and NaN), timestamps, lists and
    wide integers: the same Python values, of the same types, in the same column order."""
    con = duckdb.connect()
    df = con.execute(SQL).df()
    assert len({str(t) for t in df.dtypes}) >= 6  # the query gives the dtypes the report meets
    _assert_same(df)
    _assert_same(con.execute("SELECT count(*) AS n, max(f) AS m FROM (" + SQL + ") WHERE i > 5").df())  # no rows
    _assert_same(con.execute("SELECT i, s FROM (" + SQL + ") WHERE false").df())


@pytest.mark.filterwarnings("ignore:DataFrame columns are not unique")
@pytest.mark.parametrize(
    "frame",
    [
        pd.DataFrame({"a": [1, 2], "b": [1.0, np.nan], "c": [True, False], "d": ["x", None]}),
        pd.DataFrame({"a": pd.array([1, None], dtype="Int32"), "b": pd.array([None, 0.5], dtype="Float64")}),
        pd.DataFrame({"a": pd.array([True, None], dtype="boolean"), "b": pd.array(["x", None], dtype="string")}),
        pd.DataFrame({"a": [np.float64(1.5), None, np.nan, "t", [1]]}, dtype=object),
        pd.DataFrame([[1, 2]], columns=["a", "a"]),  # duplicate names: the last one kept, as to_dict does
    ],
)
def test_records_of_frames_of_every_kind_equal_the_value_by_value_conversion(frame):
    _assert_same(frame)
