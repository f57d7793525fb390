"""Run comparison: the change in each metric and breakdown between two runs, with a test.

``compare_runs(run_a, run_b)`` returns one row per compared score (``diff = b - a``) and a list
of warnings; ``latest_pair(spec)`` names the two latest scored runs of a spec. The statistics
are ``compare_stats``'s; the table people read, ``compare_table``'s.

What is compared, and how:

- **every metric's ``overall``**: a bootstrap over the units the score averages, resampled
  *paired* (the same draw of units for both runs) when both runs ingested the same input ids,
  independently otherwise. The units are input rows, weighted by their judged pairs where the
  metric pools pairs (decision flip, group interaction bias), and perturbation groups (one
  original query each) for the perturbation scorers. The bootstrap replicates each run's stored
  statistic exactly (checked against ``metric_scores``; when it does not, the difference is
  reported without a test). p-value and interval: the bootstrap standard error (scaled by
  sqrt(n/(n-1))) against Student's t on n-1 df, n the number of units: unlike percentiles it
  stays stable at the small tail levels the multiple-comparison correction asks for, and t keeps
  small groups (a handful of rows) from looking surer than they are.
- **decision flip ``axis``**: flip rates k/n of two runs, bootstrapped over the input rows like
  the scores (paired when both runs ingested the same rows), since the pairs one row draws on one
  axis share personas and answers (a two-proportion test that counted them as independent made
  false changes in 12.5% of null comparisons at alpha 0.05; ``_rate_test``). Lower is better
  here: a rise in the flip rate is the drop. Where the stored units do not reproduce the counts,
  a two-proportion z-test and Newcombe's interval, said in ``method``.
- **group interaction bias ``attribute``, consistency ``category``, perturbation
  ``perturbation_type``**: the group's items are rebuilt from the stored judgements and probes
  (pair biases with the input row they belong to; row scores with their variant category;
  variant robustness and correctness drops with their group), and the group's score is
  bootstrapped over input rows (or perturbation groups) as above, so pairs from one row stay
  together. A group whose rebuilt score does not match the stored one is reported without a test.

Holm–Bonferroni across every test of one comparison gives ``p_adjusted`` and ``significant``
(at ``alpha``); ``ci_low``/``ci_high`` are at the Bonferroni level 1 - alpha/m (simultaneous
coverage), so a Holm-significant row may still have an interval that touches 0.
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np
import pandas as pd

from . import scoring
from . import warehouse as wh
from .compare_stats import N_BOOT, Units, bootstrap_se, holm, newcombe, t_quantile, t_two_sided_p, two_proportion_p
from .errors import AipError
from .stats import normalise_array

COLUMNS = [
    "metric",
    "scope",
    "group_key",
    "score_a",
    "score_b",
    "diff",
    "ci_low",
    "ci_high",
    "p_value",
    "p_adjusted",
    "significant",
    "n_a",
    "n_b",
    "method",
]


def lower_is_better(metric: str, scope: str) -> bool:
    """Whether a scope's numbers are rates where lower is better (score_a/score_b hold the rate),
    as the metric declares (``Metric.lower_is_better``)."""
    from .metrics import REGISTRY

    plugin = REGISTRY.get(metric)
    return plugin is not None and scope in plugin.lower_is_better


TOL = 1e-6


def _normaliser(cfg: dict[str, Any]) -> Callable[[np.ndarray], np.ndarray]:
    """The metric's normalisation (stats.normalise_array) with this run's config."""
    lo, hi, inv = float(cfg.get("min", 0.0)), float(cfg.get("max", 1.0)), bool(cfg.get("inverted", False))
    return lambda raw: normalise_array(raw, lo, hi, inv)


# ------------------------------------------------------------------ reading the two runs
def _run_record(con, run_id: str) -> dict[str, Any]:
    cur = con.execute("SELECT * FROM eval_runs WHERE run_id = ?", [run_id])
    row = cur.fetchone()
    if row is None:
        raise AipError(f"run {run_id!r} is not registered in the warehouse")
    rec = dict(zip([d[0] for d in cur.description], row))
    rec["spec"] = json.loads(rec["spec"] or "{}")
    rec["metric_versions"] = json.loads(rec["metric_versions"] or "{}")
    rec["datasets"] = json.loads(rec["datasets"] or "{}")
    return rec


def _df(con, sql: str, params: list) -> pd.DataFrame:
    return con.execute(sql, params).df()


def _load(con, run_id: str, metric: str) -> dict[str, Any]:
    """What the tests need of one (run, metric) partition: its scores, its input ids and the
    units its scores were computed from (``score_units``)."""
    p = [run_id, metric]
    return {
        "scores": _df(con, "SELECT * FROM metric_scores WHERE run_id = ? AND metric = ?", p),
        "ids": set(_df(con, "SELECT input_id FROM dataset_rows WHERE run_id = ? AND metric = ?", p)["input_id"]),
        "units": scoring.stored_units(_df(con, "SELECT * FROM score_units WHERE run_id = ? AND metric = ?", p)),
    }


def _clusters(units: pd.DataFrame, formula: scoring.Formula, scope: str | None = None) -> dict[str, Units]:
    """{group key: {cluster: sufficient vector}} of the units (the overall score under key 'all')."""
    if not len(units):
        return {}
    if scope is None:
        t = scoring.cluster_table(units, formula)
        return {"all": {str(c): v for c, v in zip(t.index, t.to_numpy())}}
    out: dict[str, Units] = {}
    for key, g in scoring.explode(units, scope).groupby("key", sort=False):
        t = scoring.cluster_table(g, formula)
        out[str(key)] = {str(c): v for c, v in zip(t.index, t.to_numpy())}
    return out


# ------------------------------------------------------------------ the comparison
def _seed(*parts: str) -> int:
    return zlib.crc32("|".join(parts).encode())


def _num(x) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) or pd.isna(x) else float(x)


def _int(x) -> int | None:
    return None if x is None or pd.isna(x) else int(x)


def _config(rec: dict, metric: str) -> dict:
    return (rec["spec"].get("metrics", {}).get(metric) or {}).get("config") or {}


def dataset_sha(rec: dict, metric: str) -> str | None:
    """The sha256 the run registered for the dataset ``metric`` read (``_run_record``'s parsed record)."""
    entry = rec["spec"].get("metrics", {}).get(metric) or {}
    path = entry.get("dataset") or rec["spec"].get("dataset")
    return rec["datasets"].get(path) or (rec["dataset_sha256"] if path == rec["dataset_path"] else None)


def _diffs(a: Any, b: Any, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two JSON-like objects."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            out += _diffs(a.get(k), b.get(k), f"{prefix}{k}.")
        return out
    return [] if a == b else [prefix.rstrip(".")]


def _bootstrap_row(
    ctx: dict[str, Any], scope: str, key: str, ova, ovb, ua: Units, ub: Units, stat, unit_desc: str
) -> dict[str, Any]:
    """One compared score tested by the bootstrap: the stored scores, and a p-value and deferred
    interval when the units reproduce both stored scores."""
    m, paired, n_boot = ctx["metric"], ctx["paired"], ctx["n_boot"]
    row = {
        "metric": m,
        "scope": scope,
        "group_key": key,
        "score_a": _num(ova["score"]),
        "score_b": _num(ovb["score"]),
        "n_a": _int(ova["n"]),
        "n_b": _int(ovb["n"]),
    }
    _finish_diff(row)
    if row["diff"] is None:
        row["method"] = "no test: a score is missing"
        return row
    if len(ua) < 3 or len(ub) < 3:
        row["method"] = f"no test: fewer than 3 {unit_desc.split(',')[0]} in a run"
        return row
    for units, ov, norm in ((ua, ova, ctx["norm_a"]), (ub, ovb, ctx["norm_b"])):
        raw = float(stat(np.sum(np.array(list(units.values())), axis=0)))
        stored_raw = _num(ov["raw_score"])
        stored = _num(ov["score"])
        if (
            (stored_raw is not None and abs(raw - stored_raw) > TOL)
            or stored is None
            or abs(float(norm(np.array(raw))) - stored) > TOL
        ):
            row["method"] = "no test: the stored rows do not reproduce the score"
            return row
    se = bootstrap_se(
        ua, ub, stat, ctx["norm_a"], ctx["norm_b"], paired, _seed(ctx["run_a"], ctx["run_b"], m, scope, key), n_boot
    )
    if math.isnan(se):
        row["method"] = "no test: bootstrap failed"
        return row
    # the bootstrap variance of a mean is (n-1)/n of the unbiased one; Student's t on n-1 df
    n_units = len(set(ua) | set(ub)) if paired else min(len(ua), len(ub))
    se *= math.sqrt(n_units / (n_units - 1))
    df_t = n_units - 1
    d = row["diff"]
    row["p_value"] = (1.0 if d == 0 else 0.0) if se == 0 else t_two_sided_p(d / se, df_t)
    row["_ci"] = lambda q: (
        max(-1.0, d - t_quantile(q, df_t) * se),  # scores lie in [0, 1]
        min(1.0, d + t_quantile(q, df_t) * se),
    )
    shown = n_units if paired else f"{len(ua)}/{len(ub)}"
    row["method"] = (
        f"{'paired' if paired else 'unpaired'} bootstrap over {shown} {unit_desc} (B={n_boot}): "
        f"bootstrap SE, Student t on {df_t} df"
    )
    return row


def _rate_test(
    ctx: dict[str, Any],
    row: dict[str, Any],
    key: str,
    a: tuple[int, int],
    b: tuple[int, int],
    ua: Units,
    ub: Units,
    formula,
) -> None:
    """The test of a rate of events (decision flip's flips per axis): the bootstrap over the input
    rows (paired when both runs ingested the same rows), as for the scores, when the stored units
    reproduce both runs' counts. The pairs a row draws on one axis share personas and so answers:
    a two-proportion test that counts them as independent made a false change in 12.5% of 160
    comparisons of two runs of one SUT, at alpha 0.05 (benchmarks/bench_regression.py). Without
    units that reproduce the counts: the two-proportion z-test and Newcombe's interval, saying so."""
    (ka, na), (kb, nb) = a, b
    events = formula.events

    def counts(units: Units) -> tuple[int, int]:
        if not units:
            return (-1, -1)
        total = np.sum(np.array(list(units.values())), axis=0)
        return int(round(float(events(total)))), int(round(float(total[-1])))

    if counts(ua) == (ka, na) and counts(ub) == (kb, nb) and len(ua) >= 3 and len(ub) >= 3:
        rate = lambda v: events(v) / v[..., -1]  # noqa: E731
        ident = lambda x: x  # noqa: E731
        seed = _seed(ctx["run_a"], ctx["run_b"], ctx["metric"], key)
        with np.errstate(invalid="ignore", divide="ignore"):  # a draw of rows without a pair: NaN, left out
            se = bootstrap_se(ua, ub, rate, ident, ident, ctx["paired"], seed, ctx["n_boot"])
        if not math.isnan(se):
            n_units = len(set(ua) | set(ub)) if ctx["paired"] else min(len(ua), len(ub))
            se *= math.sqrt(n_units / (n_units - 1))
            df_t, d = n_units - 1, row["diff"]
            row["p_value"] = (1.0 if d == 0 else 0.0) if se == 0 else t_two_sided_p(d / se, df_t)
            row["_ci"] = lambda q: (max(-1.0, d - t_quantile(q, df_t) * se), min(1.0, d + t_quantile(q, df_t) * se))
            shown = n_units if ctx["paired"] else f"{len(ua)}/{len(ub)}"
            row["method"] = (
                f"{'paired' if ctx['paired'] else 'unpaired'} bootstrap over {shown} {formula.clusters} "
                f"(B={ctx['n_boot']}): bootstrap SE, Student t on {df_t} df; flip rate, lower is better"
            )
            return
    row["p_value"] = two_proportion_p(ka, na, kb, nb)
    row["_ci"] = lambda q: newcombe(ka, na, kb, nb, NormalDist().inv_cdf(q))
    row["method"] = (
        "two-proportion z-test (pooled), Newcombe hybrid Wilson interval (the stored units do not reproduce "
        "the counts, or fewer than 3 rows); flip rate, lower is better"
    )


def compare_runs(
    run_a: str,
    run_b: str,
    path: str | Path | None = None,
    alpha: float = 0.05,
    persist: bool = True,
    n_boot: int = N_BOOT,
    only: list[str] | None = None,
) -> tuple[pd.DataFrame, list[str]]:
    """Compare run B against run A: one row per compared score (``diff = b - a``) and warnings.

    The result is also written to ``run_comparisons`` (replacing an earlier comparison of the
    same pair) unless ``persist`` is false. ``only``: compare these metrics alone (the regression
    check compares one metric's partition: ``history.regression``).
    """
    warnings: list[str] = []
    data: dict[str, tuple[dict, dict]] = {}
    with wh.connect(path) as con:
        ra, rb = _run_record(con, run_a), _run_record(con, run_b)
        ma, mb = json.loads(ra["metrics"] or "[]"), json.loads(rb["metrics"] or "[]")
        if only is not None:
            ma, mb = [m for m in ma if m in only], [m for m in mb if m in only]
        metrics = [m for m in ma if m in mb]
        for m in ma:
            if m not in mb:
                warnings.append(f"{m}: only in run A ({run_a}), not compared")
        for m in mb:
            if m not in ma:
                warnings.append(f"{m}: only in run B ({run_b}), not compared")
        for m in metrics:
            data[m] = (_load(con, run_a, m), _load(con, run_b, m))

    if run_a == run_b:
        warnings.insert(0, f"run {run_a} is compared with itself")
    if ra["spec_name"] != rb["spec_name"]:
        warnings.insert(0, f"runs of different specs (A: {ra['spec_name']}, B: {rb['spec_name']}): compared anyway")
    (ja, rule_a), (jb, rule_b) = ((r["spec"].get("judges"), r["spec"].get("judge_rule")) for r in (ra, rb))
    if (ja or jb) and (ja, rule_a) != (jb, rule_b):
        warnings.append(
            f"the judge panel differs (A: {len(ja or [])} judge(s), {rule_a if ja else 'no panel'}; B: "
            f"{len(jb or [])}, {rule_b if jb else 'no panel'}): verdicts come from different panels"
        )
    if ra["spec"].get("judge") != rb["spec"].get("judge"):
        warnings.append(
            f"the judge differs ({', '.join(_diffs(ra['spec'].get('judge'), rb['spec'].get('judge')))}): "
            "scores come from different judges"
        )

    results: list[dict[str, Any]] = []  # rows, with a deferred interval for tested ones
    from .metrics import REGISTRY

    for m in metrics:
        da, db = data[m]
        plugin = REGISTRY[m]
        formula = plugin.formula
        va, vb = ra["metric_versions"].get(m), rb["metric_versions"].get(m)
        if va != vb:
            warnings.append(
                f"{m}: metric version {va} in run A vs {vb} in run B: not the same measurement; compared anyway"
            )
        cfg_a, cfg_b = _config(ra, m), _config(rb, m)
        changed = _diffs(cfg_a, cfg_b)
        if changed:
            warnings.append(f"{m}: the metric config differs ({', '.join(changed)})")
        sha_a, sha_b = dataset_sha(ra, m), dataset_sha(rb, m)
        if sha_a != sha_b:
            warnings.append(f"{m}: the runs read different datasets (sha256 {str(sha_a)[:12]}… vs {str(sha_b)[:12]}…)")
        paired = bool(da["ids"]) and da["ids"] == db["ids"]
        if not paired and sha_a == sha_b:
            warnings.append(f"{m}: the runs ingested different input ids; tests are unpaired")
        sa, sb = da["scores"], db["scores"]
        if not (sa["scope"] == "overall").any() or not (sb["scope"] == "overall").any():
            missing = [x for x, s in (("A", sa), ("B", sb)) if not (s["scope"] == "overall").any()]
            warnings.append(f"{m}: not aggregated in run {' and '.join(missing)}, not compared")
            continue
        ctx = {
            "run_a": run_a,
            "run_b": run_b,
            "metric": m,
            "norm_a": _normaliser(cfg_a),
            "norm_b": _normaliser(cfg_b),
            "paired": paired,
            "n_boot": n_boot,
        }

        # overall: the bootstrap of the score's own statistic over its clusters (scoring.py)
        ova, ovb = sa[sa["scope"] == "overall"].iloc[0], sb[sb["scope"] == "overall"].iloc[0]
        stat = scoring.statistic(formula)
        ua, ub = _clusters(da["units"], formula).get("all", {}), _clusters(db["units"], formula).get("all", {})
        results.append(_bootstrap_row(ctx, "overall", "all", ova, ovb, ua, ub, stat, formula.clusters))

        # breakdown
        scope = plugin.compare_scope
        if scope is None:
            continue
        ga = sa[sa["scope"] == scope].set_index("group_key")
        gb = sb[sb["scope"] == scope].set_index("group_key")
        keys = list(dict.fromkeys(list(ga.index) + list(gb.index)))
        rate = formula.interval == "wilson"
        units_a, units_b = _clusters(da["units"], formula, scope), _clusters(db["units"], formula, scope)
        unit_desc = formula.clusters if formula.level == "rows" else f"{formula.clusters} of the group's units"
        for key in keys:
            if key not in ga.index or key not in gb.index:
                side = "A" if key in ga.index else "B"
                g = ga.loc[key] if side == "A" else gb.loc[key]
                val = _num(g["rate"] if rate else g["score"])
                results.append(
                    {
                        "metric": m,
                        "scope": scope,
                        "group_key": key,
                        "score_a": val if side == "A" else None,
                        "score_b": val if side == "B" else None,
                        "n_a": _int(g["n"]) if side == "A" else None,
                        "n_b": _int(g["n"]) if side == "B" else None,
                        "diff": None,
                        "method": f"no test: only in run {side}",
                    }
                )
                continue
            a, b = ga.loc[key], gb.loc[key]
            if rate:  # a rate of events (flips): two proportions
                na, nb, ka, kb = (
                    _int(a["n"]) or 0,
                    _int(b["n"]) or 0,
                    _int(a["n_events"]) or 0,
                    _int(b["n_events"]) or 0,
                )
                row = {
                    "metric": m,
                    "scope": scope,
                    "group_key": key,
                    "score_a": ka / na if na else None,
                    "score_b": kb / nb if nb else None,
                    "n_a": na,
                    "n_b": nb,
                }
                _finish_diff(row)
                if not na or not nb:
                    row["method"] = "no test: no judged pair in a run"
                else:
                    _rate_test(ctx, row, key, (ka, na), (kb, nb), units_a.get(key, {}), units_b.get(key, {}), formula)
                results.append(row)
            else:
                results.append(
                    _bootstrap_row(ctx, scope, key, a, b, units_a.get(key, {}), units_b.get(key, {}), stat, unit_desc)
                )

    tested = [r for r in results if r.get("p_value") is not None]
    m_tests = len(tested)
    q = 1 - alpha / (2 * m_tests) if m_tests else None  # two-sided, Bonferroni
    for r, adj in zip(tested, holm([r["p_value"] for r in tested])):
        r["p_adjusted"] = adj
        r["significant"] = bool(adj <= alpha)
        r["ci_low"], r["ci_high"] = r.pop("_ci")(q)
    if m_tests:
        for r in tested:
            r["method"] += f"; Holm over {m_tests} tests, interval at the Bonferroni level {1 - alpha / m_tests:.4g}"
    for r in results:
        r.setdefault("significant", False)
    df = pd.DataFrame(results, columns=COLUMNS)
    df["significant"] = df["significant"].astype(bool)
    for c in ("n_a", "n_b"):
        df[c] = df[c].astype("Int64")
    if persist:
        save_comparison(run_a, run_b, df, warnings, path)
    return df, warnings


def _finish_diff(row: dict) -> None:
    a, b = row.get("score_a"), row.get("score_b")
    row["diff"] = None if a is None or b is None else b - a


def is_drop(row: dict | pd.Series) -> bool:
    """A significant change for the worse: a lower score, or a higher flip rate on an axis row."""
    if not bool(row["significant"]) or row["diff"] is None or pd.isna(row["diff"]):
        return False
    return row["diff"] > 0 if lower_is_better(row["metric"], row["scope"]) else row["diff"] < 0


def save_comparison(
    run_a: str, run_b: str, df: pd.DataFrame, warnings: list[str], path: str | Path | None = None
) -> int:
    """Replace the stored comparison of (run_a, run_b) in ``run_comparisons``, in one transaction."""
    out = df.copy()
    out["run_a"], out["run_b"], out["run_id"] = run_a, run_b, run_b
    out["warnings"] = json.dumps(warnings, ensure_ascii=False)
    out["created_at"] = datetime.now(UTC).replace(tzinfo=None)
    out = wh.frame("run_comparisons", out)

    def replace(con) -> None:
        con.execute("DELETE FROM run_comparisons WHERE run_a = ? AND run_b = ?", [run_a, run_b])
        wh.insert_frame(con, "run_comparisons", out)

    with wh.connect(path) as con:
        wh.transaction(con, replace, f"the comparison of {run_a} and {run_b}")
    return len(out)


def latest_pair(spec_name: str, path: str | Path | None = None) -> tuple[str, str]:
    """(previous, latest): the two most recent runs of ``spec_name`` by ``created_at`` that have
    scores (a run registered but never aggregated is skipped)."""
    with wh.connect(path) as con:
        rows = con.execute(
            "SELECT r.run_id FROM eval_runs r WHERE r.spec_name = ? AND EXISTS (SELECT 1 FROM metric_scores m "
            "WHERE m.run_id = r.run_id AND m.scope = 'overall') ORDER BY r.created_at DESC, r.run_id DESC LIMIT 2",
            [spec_name],
        ).fetchall()
        n_all = (con.execute("SELECT count(*) FROM eval_runs WHERE spec_name = ?", [spec_name]).fetchone() or (0,))[0]
    if len(rows) < 2:
        raise AipError(
            f"spec {spec_name!r} has {len(rows)} scored run{'s' if len(rows) != 1 else ''} "
            f"({n_all} registered); a comparison needs two"
        )
    return rows[1][0], rows[0][0]
