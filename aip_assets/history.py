"""A spec's runs over time: the run before this one, what changed since it, and the SUT's drift.

Every aggregation of a metric's partition ends with :func:`check_regression` (``pipeline``): when
the spec has an earlier completed run of the same metric on the same dataset, this run is compared
with it by the engine ``aip-eval compare`` uses (``compare.compare_runs``: paired over the input
rows both ingested, the overall score and the metric's breakdown, each change with its interval),
and the result is written to ``regressions``, replacing the partition's rows.

- **Error control across the run.** A run of K metrics spends ``alpha / K`` on each metric's
  comparison, and Holm's adjustment within it holds that: the chance that any metric of the run
  reports a change that is not there is at most the spec's ``claims.alpha`` (Bonferroni across
  metrics, Holm within). Intervals are at the matching simultaneous level.
- **A regression** is a significant change for the worse: a lower score, or a higher rate where
  lower is better (decision flip's flip rate per axis). With ``fail_on_regression: true`` in the
  spec it fails the metric's gate (its reason says what regressed); otherwise it is a finding
  and a warning on the ``regression`` asset check.
- **SUT drift.** On the probes both runs asked (probe ids are derived from the spec, the dataset
  and the seeds, not from the run), the share of answers that changed word for word, of decisions
  that changed (decision flip), and of judge verdicts that changed; and the model ids and system
  fingerprints the endpoint reported in each run. A silently swapped model shows here even when
  no score moved.

:func:`history` reads ``v_spec_history``: every figure of every run of a spec, in time order.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

from . import warehouse as wh

DRIFT_SCOPES = ("answers", "decisions", "verdicts")


def previous_run(con, run_id: str, metric: str) -> str | None:
    """The spec's latest run before ``run_id`` that aggregated ``metric`` on the same dataset (its
    sha256 as registered: ``compare.dataset_sha``), or None."""
    from .compare import dataset_sha

    cols = "r.run_id, r.spec_name, r.created_at, r.spec, r.datasets, r.dataset_path, r.dataset_sha256"

    def record(row) -> dict[str, Any]:
        keys = ("run_id", "spec_name", "created_at", "spec", "datasets", "dataset_path", "dataset_sha256")
        rec = dict(zip(keys, row))
        rec["spec"], rec["datasets"] = json.loads(rec["spec"] or "{}"), json.loads(rec["datasets"] or "{}")
        return rec

    row = con.execute(f"SELECT {cols} FROM eval_runs r WHERE r.run_id = ?", [run_id]).fetchone()
    if row is None:
        return None
    this = record(row)
    sha = dataset_sha(this, metric)
    rows = con.execute(
        f"SELECT {cols} FROM eval_runs r "
        "WHERE r.spec_name = ? AND r.run_id <> ? AND (r.created_at < ? OR (r.created_at = ? AND r.run_id < ?)) "
        "AND EXISTS (SELECT 1 FROM metric_scores m WHERE m.run_id = r.run_id AND m.metric = ? AND m.scope = 'overall') "
        "ORDER BY r.created_at DESC, r.run_id DESC",
        [this["spec_name"], run_id, this["created_at"], this["created_at"], run_id, metric],
    ).fetchall()
    return next((str(r[0]) for r in rows if dataset_sha(record(r), metric) == sha), None)


# ------------------------------------------------------------------ drift
def drift(con, run_a: str, run_b: str, metric: str) -> list[dict[str, Any]]:
    """What changed in the SUT's behaviour on the probes both runs asked: one row per reading with
    common items (answers word for word, decisions, verdicts), and one for the model ids and
    fingerprints the endpoint reported."""
    p = [metric, run_a, metric, run_b]
    out: list[dict[str, Any]] = []
    answers = con.execute(
        "SELECT count(*), count(*) FILTER (WHERE a.response IS DISTINCT FROM b.response) "
        "FROM (SELECT * FROM sut_responses WHERE metric = ? AND run_id = ? AND status = 'ok') a "
        "JOIN (SELECT * FROM sut_responses WHERE metric = ? AND run_id = ? AND status = 'ok') b "
        "ON a.probe_id = b.probe_id AND a.sample_index = b.sample_index",
        p,
    ).fetchone()
    decided = """
        SELECT j.run_id, p.probe_a AS probe_id, j.decision_a AS decision FROM judgements j
        JOIN probe_pairs p ON p.run_id = j.run_id AND p.metric = j.metric AND p.pair_id = j.pair_id
        WHERE j.metric = ? AND j.run_id IN (?, ?) AND j.status = 'ok' AND p.kind = 'persona' AND j.decision_a IS NOT NULL
        UNION ALL
        SELECT j.run_id, p.probe_b, j.decision_b FROM judgements j
        JOIN probe_pairs p ON p.run_id = j.run_id AND p.metric = j.metric AND p.pair_id = j.pair_id
        WHERE j.metric = ? AND j.run_id IN (?, ?) AND j.status = 'ok' AND p.kind = 'persona' AND j.decision_b IS NOT NULL
    """
    decisions = con.execute(
        f"WITH d AS ({decided}), e AS (SELECT run_id, probe_id, min(decision) AS decision FROM d GROUP BY ALL) "
        "SELECT count(*), count(*) FILTER (WHERE a.decision <> b.decision) FROM e a JOIN e b USING (probe_id) "
        "WHERE a.run_id = ? AND b.run_id = ?",
        [metric, run_a, run_b, metric, run_a, run_b, run_a, run_b],
    ).fetchone()
    verdict = "coalesce(label, category, CAST(score AS VARCHAR))"
    verdicts = con.execute(
        f"SELECT count(*), count(*) FILTER (WHERE a.v IS DISTINCT FROM b.v) "
        f"FROM (SELECT judgement_id, judge_kind, {verdict} AS v FROM judgements WHERE metric = ? AND run_id = ? "
        f"AND status = 'ok') a JOIN (SELECT judgement_id, judge_kind, {verdict} AS v FROM judgements "
        "WHERE metric = ? AND run_id = ? AND status = 'ok') b USING (judgement_id, judge_kind)",
        p,
    ).fetchone()
    for scope, counted in zip(DRIFT_SCOPES, (answers, decisions, verdicts)):
        n, k = counted or (0, 0)
        if n:
            out.append(_drift_row(scope, int(n), int(k)))
    models = {
        r[0]: (list(r[1] or []), list(r[2] or []))
        for r in con.execute(
            "SELECT run_id, list(DISTINCT model ORDER BY model) FILTER (WHERE model IS NOT NULL), "
            "list(DISTINCT fingerprint ORDER BY fingerprint) FILTER (WHERE fingerprint IS NOT NULL) "
            "FROM sut_responses WHERE metric = ? AND run_id IN (?, ?) AND status = 'ok' GROUP BY run_id",
            [metric, run_a, run_b],
        ).fetchall()
    }
    (ma, fa), (mb, fb) = models.get(run_a, ([], [])), models.get(run_b, ([], []))
    if ma or mb:
        changed = ma != mb or fa != fb
        row = _drift_row("model", 1, int(changed))
        row["details"] = {"models_a": ma, "models_b": mb, "fingerprints_a": fa, "fingerprints_b": fb}
        out.append(row)
    return out


def _drift_row(scope: str, n: int, k: int) -> dict[str, Any]:
    return {
        "kind": "drift",
        "scope": scope,
        "group_key": "all",
        "score_b": k / n,
        "n_a": n,
        "n_b": n,
        "details": {"changed": k, "common": n},
        "significant": False,
        "worse": False,
    }


# ------------------------------------------------------------------ the regression check
def _fmt_change(row: dict[str, Any], rate: bool) -> tuple[str, str]:
    """(from-to, change with interval) in the row's units: points for a rate, the score's own scale."""
    a, b, d, lo, hi = (row.get(k) for k in ("score_a", "score_b", "diff", "ci_low", "ci_high"))
    assert a is not None and b is not None and d is not None  # a compared figure: both runs scored it
    have_ci = lo is not None and hi is not None and not (math.isnan(lo) or math.isnan(hi))
    lo, hi = (float(lo), float(hi)) if lo is not None and hi is not None and have_ci else (0.0, 0.0)
    if rate:
        change = f"{d * 100:+.1f} points" + (f" [{lo * 100:+.1f}, {hi * 100:+.1f}]" if have_ci else "")
        return f"from {a:.1%} to {b:.1%}", change
    change = f"{d:+.3f}" + (f" [{lo:+.3f}, {hi:+.3f}]" if have_ci else "")
    return f"from {a:.3f} to {b:.3f}", change


def sentence(row: dict[str, Any], previous: str, rate_label: str | None, lower_better: bool) -> str:
    """A compared figure in words: "gender flips rose from 3.1% to 12.5% since demo-261202-0200,
    +9.4 points [+4.0, +14.2]"."""
    metric = str(row["metric"]).split(".", 1)[-1].replace("_", " ")
    d = row["diff"]
    verb = "rose" if d > 0 else "fell" if d < 0 else "stayed"
    if lower_better:
        what = f"{row['group_key']} {'flips' if rate_label == 'flip rate' else rate_label or 'rate'}"
    elif row["scope"] == "overall":
        what = f"{metric} score"
    else:
        what = f"{metric} score for {row['scope']} {row['group_key']}"
    span, change = _fmt_change(row, lower_better)
    if d == 0:
        return f"{what} stayed at {span.split(' to ')[-1]} since {previous}"
    return f"{what} {verb} {span} since {previous}, {change}"


def regression(run_id: str, metric: str, path: Path | None = None) -> tuple[str | None, list[dict[str, Any]]]:
    """(previous run, rows): this run's metric against the spec's previous run of it (none: (None,
    [])). Rows: one per compared figure (``kind`` score, from ``compare.compare_runs``) with its
    words and whether it is a significant worsening, then the drift rows."""
    from .compare import compare_runs, is_drop, lower_is_better
    from .metrics import REGISTRY

    with wh.connect(path, read_only=True) as con:
        prev = previous_run(con, run_id, metric)
        if prev is None:
            return None, []
        moved = drift(con, prev, run_id, metric)
        spec, metrics = con.execute("SELECT spec, metrics FROM eval_runs WHERE run_id = ?", [run_id]).fetchone() or (
            "{}",
            "[]",
        )
    spec = json.loads(spec or "{}")
    alpha_run = float((spec.get("claims") or {}).get("alpha", 0.05))
    k = max(1, len(json.loads(metrics or "[]")))
    alpha = alpha_run / k  # Bonferroni across the run's metrics, Holm within each
    df, warnings = compare_runs(prev, run_id, path, alpha=alpha, persist=False, only=[metric])
    plugin = REGISTRY.get(metric)
    rate_label = getattr(plugin, "rate_label", None)
    rows: list[dict[str, Any]] = []
    for r in df.to_dict("records"):
        r = {k2: (None if v is pd.NA or (isinstance(v, float) and math.isnan(v)) else v) for k2, v in r.items()}
        lower = lower_is_better(metric, r["scope"])
        r["kind"] = "score"
        r["worse"] = bool(is_drop(r))
        r["sentence"] = sentence(r, prev, rate_label, lower) if r["diff"] is not None else None
        r["details"] = {"warnings": warnings, "lower_is_better": lower}
        rows.append(r)
    for r in moved:
        r["metric"] = metric
        r["sentence"] = drift_sentence(r, prev)
        rows.append(r)
    for r in rows:
        r["previous_run"], r["alpha"], r["alpha_run"] = prev, alpha, alpha_run
    return prev, rows


def drift_sentence(row: dict[str, Any], previous: str) -> str:
    """A drift row in words."""
    d = row["details"]
    if row["scope"] == "model":
        a, b = ", ".join(d["models_a"]) or "none", ", ".join(d["models_b"]) or "none"
        if not row["score_b"]:
            return f"the SUT reported model {b} in both runs (fingerprint {', '.join(d['fingerprints_b']) or 'none'})"
        if a != b:
            return f"the SUT reported model {b}, where it reported {a} in {previous}"
        fa, fb = ", ".join(d["fingerprints_a"]) or "none", ", ".join(d["fingerprints_b"]) or "none"
        return f"the SUT reported model {b} as in {previous}, but its fingerprint changed from {fa} to {fb}"
    what = {
        "answers": "answers changed word for word",
        "decisions": "decisions changed",
        "verdicts": "judge verdicts changed",
    }[row["scope"]]
    return (
        f"{d['changed']} of {d['common']} {what} ({row['score_b']:.1%}) since {previous}, on the probes both runs asked"
    )


def write_regression(
    run_id: str, metric: str, rows: list[dict[str, Any]], fail: bool, path: Path | None = None
) -> str | None:
    """Replace the partition's ``regressions`` rows; with ``fail`` (the spec's ``fail_on_regression``)
    and a significant worsening, fail the metric's gate saying so. Returns the reason added to the
    gate, or None. One transaction."""
    out = pd.DataFrame(
        [{**r, "details": json.dumps(r.get("details") or {}, ensure_ascii=False, default=str)} for r in rows]
    )
    frame = wh.frame("regressions", out if len(out) else [], run_id=run_id, metric=metric)
    # the breakdown's figures first (where it got worse), then by the adjusted p-value
    worse = sorted((r for r in rows if r.get("worse")), key=lambda r: (r["scope"] == "overall", r["p_adjusted"]))
    reason = None
    if fail and worse:
        more = f" (and {len(worse) - 1} more)" if len(worse) > 1 else ""
        reason = f"regressed: {worse[0]['sentence']}{more}"

    def replace(con) -> None:
        con.execute("DELETE FROM regressions WHERE run_id = ? AND metric = ?", [run_id, metric])
        wh.insert_frame(con, "regressions", frame)
        if reason is not None:
            con.execute(
                "UPDATE metric_scores SET gate_reason = CASE WHEN passed THEN ? ELSE gate_reason || '; ' || ? END, "
                "passed = false WHERE run_id = ? AND metric = ? AND scope = 'overall'",
                [reason, reason, run_id, metric],
            )

    with wh.connect(path) as con:
        wh.transaction(con, replace, f"the regression check of {run_id} × {metric}")
    return reason


def check_regression(run_id: str, metric: str, fail: bool, path: Path | None = None, log=None) -> None:
    """Compare the partition with the spec's previous run, write the result, and say what got worse
    (``log``)."""
    prev, rows = regression(run_id, metric, path)
    reason = write_regression(run_id, metric, rows, fail, path)
    if log is not None and prev is not None:
        for r in rows:
            if r.get("worse"):
                log(f"regression [{run_id} × {metric}]: {r['sentence']}")
        if reason:
            log(f"regression [{run_id} × {metric}]: the gate fails (fail_on_regression)")


def since_metadata(run_id: str, metric: str, path: Path | None = None) -> dict[str, Any]:
    """What the aggregation's metadata says of the previous run, from the stored ``regressions``
    rows: which run it was, and the change since it."""
    stored_rows = stored(run_id, metric, path)
    if not len(stored_rows):
        return {"previous_run": "none: the first completed run of this spec on this dataset"}
    rows = stored_rows.to_dict("records")
    prev = str(rows[0]["previous_run"])
    return {
        "previous_run": prev,
        "since_previous": since_markdown(prev, rows),
        "regressions": sum(bool(r["worse"]) for r in rows),
    }


def since_markdown(prev: str, rows: list[dict[str, Any]]) -> str:
    """The change since the previous run as a markdown list (the aggregation's metadata)."""
    lines = [f"Since **{prev}**:"]
    scored = [r for r in rows if r["kind"] == "score"]
    sig = [r for r in scored if r.get("significant")]
    for r in sig:
        lines.append(f"- {'**worse**' if r['worse'] else 'better'}: {r['sentence']}")
    if not sig:
        ov = next((r for r in scored if r["scope"] == "overall" and r.get("sentence")), None)
        lines.append(
            f"- no significant change ({len(scored)} figures compared)" + (f"; {ov['sentence']}" if ov else "")
        )
    for r in rows:
        if r["kind"] == "drift":
            lines.append(f"- drift: {r['sentence']}")
    return "\n".join(lines)


def stored(run_id: str, metric: str | None = None, path: Path | None = None) -> pd.DataFrame:
    """The run's ``regressions`` rows (of one metric, when given)."""
    sql = "SELECT * FROM regressions WHERE run_id = ?" + (" AND metric = ?" if metric else "")
    df = wh.query(sql + " ORDER BY metric, kind DESC, scope, group_key", [run_id, *([metric] if metric else [])], path)
    return df.astype(object).where(df.notna(), None)


def history(spec_name: str, path: Path | None = None) -> pd.DataFrame:
    """Every figure of every run of ``spec_name`` (``v_spec_history``), oldest first."""
    return wh.query(
        "SELECT * FROM v_spec_history WHERE spec_name = ? ORDER BY created_at, run_id, metric, scope, group_key",
        [spec_name],
        path,
    )
