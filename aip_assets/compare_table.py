"""A run comparison (``compare``) as people read it: its rows as plain JSON values (``--json`` and
the comparison page), the table's cells, its footnote, and the terminal's table."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from .compare import is_drop, lower_is_better


def json_rows(df: pd.DataFrame) -> list[dict[str, Any]]:
    """The comparison's rows as plain JSON values (what `aip-eval compare --json` prints and the
    comparison page embeds): every float exactly as computed, a missing value None."""

    def plain(x: Any) -> Any:
        if x is None or x is pd.NA or (isinstance(x, float) and math.isnan(x)):
            return None
        if isinstance(x, np.generic):
            return plain(x.item())
        return x

    return [{k: plain(v) for k, v in r.items()} for r in df.to_dict("records")]


def table_cells(r: dict[str, Any]) -> dict[str, str | int]:
    """One compared score as the table shows it (the terminal's and the comparison page's): scores
    and differences to 3 decimals, p-values to 4 (or in scientific notation below 1e-4), counts as
    integers ("" where a value is missing)."""
    f = lambda x, nd=3: "" if x is None or pd.isna(x) else f"{x:.{nd}f}"  # noqa: E731
    fd = lambda x: "" if x is None or pd.isna(x) else f"{x:+.3f}"  # noqa: E731
    fp = lambda x: "" if x is None or pd.isna(x) else (f"{x:.4f}" if x >= 1e-4 else f"{x:.1e}")  # noqa: E731
    mark = ("* drop" if is_drop(r) else "* gain") if r["significant"] and r["diff"] else ""
    test = (
        "none"
        if str(r["method"]).startswith("no test")
        else "2-prop"
        if str(r["method"]).startswith("two-proportion")
        else "bootstrap"
    )
    lower = " (rate, lower better)" if lower_is_better(r["metric"], r["scope"]) else ""
    return {
        "": mark,
        "metric": r["metric"],
        "scope": r["scope"] + lower,
        "group": r["group_key"],
        "A": f(r["score_a"]),
        "B": f(r["score_b"]),
        "diff": fd(r["diff"]),
        "interval": "" if r["ci_low"] is None or pd.isna(r["ci_low"]) else f"[{fd(r['ci_low'])}, {fd(r['ci_high'])}]",
        "p": fp(r["p_value"]),
        "p adj.": fp(r["p_adjusted"]),
        "n A": "" if r["n_a"] is None or pd.isna(r["n_a"]) else int(r["n_a"]),
        "n B": "" if r["n_b"] is None or pd.isna(r["n_b"]) else int(r["n_b"]),
        "test": test,
    }


def footnote(df: pd.DataFrame, alpha: float = 0.05) -> list[str]:
    """What the table's marks and intervals mean, and the scores left untested by reason."""
    m = int(df["p_value"].notna().sum())
    lines = [
        f"* significant at alpha {alpha} after Holm over {m} tests; intervals at the Bonferroni level "
        f"{1 - alpha / max(m, 1):.4g}; a drop is a lower score or a higher flip rate."
    ]
    untested = df[df["p_value"].isna()]
    for reason, g in untested.groupby("method", sort=False):
        lines.append(
            f"{reason}: " + ", ".join(f"{a} {b} {c}" for a, b, c in zip(g["metric"], g["scope"], g["group_key"]))
        )
    return lines


def format_table(df: pd.DataFrame, run_a: str, run_b: str, alpha: float = 0.05) -> str:
    """The comparison as terminal text: one line per score, significant rows marked."""
    rows = [table_cells(r) for r in df.to_dict("records")]
    head = f"Run B {run_b} vs run A {run_a} (diff = B - A)"
    if not rows:
        return head + "\n(nothing to compare)"
    return "\n".join([head, pd.DataFrame(rows).to_string(index=False), "", *footnote(df, alpha)])
