"""The SQL the report runs, through one read-only session of short queries on the warehouse."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from .. import warehouse as wh
from ..errors import AipError
from ..metrics.judging import PERSONA_ORDER_REASONING
from .values import _records

WEAKEST_ROWS = 5

Records = list[dict[str, Any]]
ByRow = dict[tuple[str, str], Any]  # (metric, input_id) -> what the report shows of that row


class _Reader:
    def __init__(self, run_id: str, path: Path):
        self.run_id, self.path = run_id, path

    def q(self, sql: str, params: list | None = None) -> pd.DataFrame:
        return wh.query(sql, [self.run_id, *(params or [])], path=self.path, read_only=True)

    def records(self, sql: str, params: list | None = None) -> Records:
        """The rows of ``sql`` as plain Python (the run's id is its first parameter)."""
        return _records(self.q(sql, params))


def _warehouse_path(path: str | Path | None) -> Path:
    return Path(path).resolve() if path else wh.default_path()


def run_record(rd: _Reader) -> dict[str, Any]:
    """The run's ``eval_runs`` row; a run that is not registered is an AipError naming the latest."""
    runs = rd.records("SELECT * FROM eval_runs WHERE run_id = ?")
    if not runs:
        known = wh.query("SELECT run_id FROM eval_runs ORDER BY created_at DESC LIMIT 5", path=rd.path, read_only=True)
        hint = f" (latest: {', '.join(known['run_id'])})" if len(known) else ""
        raise AipError(f"run {rd.run_id!r} is not registered in {rd.path}{hint}; `aip-eval runs` lists them")
    return runs[0]


def metric_scores(rd: _Reader) -> Records:
    return rd.records("SELECT * FROM metric_scores WHERE run_id = ? ORDER BY metric, scope, group_key")


def weakest_rows(rd: _Reader) -> Records:
    """The WEAKEST_ROWS lowest-scored rows of each metric, lowest first."""
    return rd.records(f"""
        SELECT * FROM (
            SELECT metric, input_id, score, raw_score, label, n_judged, n_failed, n_events, explanation,
                   row_number() OVER (PARTITION BY metric ORDER BY score ASC, input_id) AS rank
            FROM row_scores WHERE run_id = ? AND status = 'ok' AND score IS NOT NULL)
        WHERE rank <= {WEAKEST_ROWS} ORDER BY metric, rank""")


def unscored_rows(rd: _Reader) -> Records:
    """The rows without a score: excluded (nothing could be judged) or errored (a failure)."""
    return rd.records("""
        SELECT metric, input_id, status, error, explanation FROM row_scores
        WHERE run_id = ? AND NOT (status = 'ok' AND score IS NOT NULL) ORDER BY metric, input_id""")


def row_counts(rd: _Reader) -> dict[str, dict[str, Any]]:
    """Each metric's rows scored, excluded (status ``excluded``) and errored (the other unscored)."""
    return {
        r["metric"]: r
        for r in rd.records("""
        SELECT metric, count(*) FILTER (WHERE status = 'ok' AND score IS NOT NULL) AS scored,
               count(*) FILTER (WHERE status = 'excluded') AS excluded,
               count(*) FILTER (WHERE NOT (status = 'ok' AND score IS NOT NULL) AND status <> 'excluded') AS errored
        FROM row_scores WHERE run_id = ? GROUP BY metric""")
    }


def evidence(rd: _Reader, rows: Records) -> tuple[ByRow, ByRow, ByRow]:
    """What the report shows of ``rows`` (the weakest): their probes with the SUT's answers, their
    persona pairs with the verdicts on them, and the other verdicts by what they judged."""
    keys = [f"{r['metric']}\x1f{r['input_id']}" for r in rows]
    probes: dict[tuple[str, str], Records] = {}
    pairs: dict[tuple[str, str], Records] = {}
    verdicts: dict[tuple[str, str], dict[str, Records]] = {}
    if not keys:
        return probes, pairs, verdicts
    for e in rd.records(
        """
            SELECT p.metric, p.input_id, p.probe_id, p.role, p.axis, p.category, p.attribute_value, p.persona,
                   p.persona_id, p.template_id, p.variant_id, p.wrapper_id, p.query_text, r.sample_index, r.response,
                   r.status AS sut_status, r.error AS sut_error
            FROM probes p
            LEFT JOIN (SELECT * FROM sut_responses WHERE run_id = $1
                       AND metric || chr(31) || input_id IN (SELECT unnest($2::VARCHAR[]))) r
                   ON r.metric = p.metric AND r.probe_id = p.probe_id
            WHERE p.run_id = $1 AND p.metric || chr(31) || p.input_id IN (SELECT unnest($2::VARCHAR[]))
            ORDER BY p.metric, p.input_id, p.probe_id, r.sample_index""",
        [keys],
    ):
        probes.setdefault((e["metric"], e["input_id"]), []).append(e)
    for p in rd.records(
        """
            SELECT pp.metric, pp.input_id, pp.pair_id, pp.value_a, pp.value_b, pp.probe_a, pp.probe_b,
                   bool_or(coalesce(j.flipped, false)) AS flipped,
                   avg(CASE WHEN j.status = 'ok' THEN CASE WHEN j.judge_kind IN ('tone', 'effort') THEN j.score
                            ELSE 1 - j.score END END) AS badness,
                   string_agg(CASE WHEN j.status <> 'ok' THEN 'judge ' || j.status
                                   WHEN j.decision_a IS NOT NULL OR j.decision_b IS NOT NULL
                                   THEN j.label || ' (' || coalesce(j.decision_a, '?') || ' vs ' || coalesce(j.decision_b, '?') || ')'
                                   ELSE coalesce(j.label, j.judge_kind) || ' ' || printf('%.3f', j.score) END, '; '
                              ORDER BY j.judge_kind) AS verdict
            FROM probe_pairs pp
            LEFT JOIN (SELECT * FROM judgements WHERE run_id = $1
                       AND metric || chr(31) || input_id IN (SELECT unnest($2::VARCHAR[]))) j
                   ON j.metric = pp.metric AND j.pair_id = pp.pair_id
            WHERE pp.run_id = $1 AND pp.metric || chr(31) || pp.input_id IN (SELECT unnest($2::VARCHAR[]))
            GROUP BY ALL""",
        [keys],
    ):
        pairs.setdefault((p["metric"], p["input_id"]), []).append(p)
    for j in rd.records(
        """
            SELECT j.metric, j.input_id,
                   coalesce(CAST(j.sample_index AS VARCHAR), CASE WHEN j.category = 'baseline' THEN 'base' END,
                            j.variant_id, j.input_id) AS key,
                   coalesce(j.label, j.judge_kind) AS label, j.score, j.status, j.error
            FROM judgements j
            WHERE j.run_id = ? AND j.metric || chr(31) || j.input_id IN (SELECT unnest(?::VARCHAR[]))
              AND NOT EXISTS (SELECT 1 FROM probe_pairs pp WHERE pp.run_id = j.run_id AND pp.metric = j.metric
                              AND pp.pair_id = j.pair_id)
            ORDER BY j.metric, j.input_id, key, j.label""",
        [keys],
    ):
        verdicts.setdefault((j["metric"], j["input_id"]), {}).setdefault(str(j["key"]), []).append(j)
    return probes, pairs, verdicts


def calls_by_role(rd: _Reader) -> Records:
    return rd.records("""
        SELECT role, count(*) AS calls, count(*) FILTER (WHERE status <> 'ok') AS failed,
               count(*) FILTER (WHERE source = 'reused') AS reused,
               CAST(sum(prompt_tokens) AS BIGINT) AS prompt_tokens,
               CAST(sum(completion_tokens) AS BIGINT) AS completion_tokens, median(latency_ms) AS p50_latency_ms
        FROM llm_calls WHERE run_id = ? GROUP BY role ORDER BY role""")


def calls_by_metric(rd: _Reader) -> Records:
    return rd.records("""
        SELECT role, metric, stage, count(*) AS calls, count(*) FILTER (WHERE status <> 'ok') AS failed,
               count(*) FILTER (WHERE source = 'reused') AS reused,
               CAST(sum(prompt_tokens) AS BIGINT) AS prompt_tokens,
               CAST(sum(completion_tokens) AS BIGINT) AS completion_tokens, median(latency_ms) AS p50_latency_ms
        FROM llm_calls WHERE run_id = ? GROUP BY ALL ORDER BY role, metric, stage""")


def judge_exams(rd: _Reader) -> Records:
    """The judge exam before the run, per metric, judge and kind of item (``v_judge_exams``)."""
    return rd.records(
        "SELECT metric, judge, model, kind, n_right, n, share, ci_low, ci_high, min_score FROM v_judge_exams "
        "WHERE run_id = ? ORDER BY metric, judge, kind"
    )


def run_notes(rd: _Reader) -> Records:
    return rd.records(
        "SELECT metric, stage, level, code, message FROM run_notes WHERE run_id = ? ORDER BY level, metric, stage, code"
    )


Query = Callable[..., Records]  # (sql, params) -> records; the run's id is the first parameter


def viewer_metrics(q: Query) -> dict[str, dict[str, Any]]:
    """Each metric's name and whether it has perturbation types (the viewer's facet)."""
    return {
        r["metric"]: r
        for r in q("""
        SELECT metric, any_value(metric_name) FILTER (WHERE scope = 'overall') AS metric_name,
               bool_or(scope = 'perturbation_type') AS has_types
        FROM metric_scores WHERE run_id = ? GROUP BY metric""")
    }


def viewer_rows(q: Query, rows_per_metric: int) -> Records:
    """At most ``rows_per_metric`` rows of each metric, the lowest scores first (unscored before them)."""
    return q(
        """
        SELECT * FROM (
            SELECT metric, input_id, score, raw_score, label, status, error, explanation, n_judged, n_failed, n_events,
                   row_number() OVER (PARTITION BY metric ORDER BY score ASC NULLS FIRST, input_id) AS rank,
                   count(*) OVER (PARTITION BY metric) AS total
            FROM row_scores WHERE run_id = ?)
        WHERE rank <= ? ORDER BY metric, rank""",
        [rows_per_metric],
    )


def viewer_evidence(q: Query, rows: Records) -> tuple[ByRow, ByRow, ByRow]:
    """What the viewer shows of ``rows``: their probes with every answer (and, for a variant that is
    its own row, its group's baseline), their pairs, and every verdict on them."""
    keys = [f"{r['metric']}\x1f{r['input_id']}" for r in rows]
    in_keys = "{a}.metric || chr(31) || {a}.input_id IN (SELECT unnest(?::VARCHAR[]))"
    # the joined side filtered by the same keys first: a join's hash table of the run's every answer
    # took a gigabyte at 100,000 rows (numbered parameters: $1 the run, $2 the keys)
    in_keys2 = in_keys.replace("?", "$2")
    probes: dict[tuple[str, str], list[dict[str, Any]]] = {}
    pairs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    verdicts: dict[tuple[str, str], list[dict[str, Any]]] = {}
    if not keys:
        return probes, pairs, verdicts
    for p in q(
        f"""
            SELECT p.metric, p.input_id, p.probe_id, p.role, p.axis, p.category, p.attribute_value, p.persona,
                   p.persona_id, p.template_id, p.variant_id, p.wrapper_id, p.exclusion, p.query_text, p.group_id,
                   r.sample_index, r.response, r.status AS sut_status, r.error AS sut_error
            FROM probes p
            LEFT JOIN (SELECT * FROM sut_responses r WHERE r.run_id = $1 AND {in_keys2.format(a="r")}) r
                   ON r.metric = p.metric AND r.probe_id = p.probe_id
            WHERE p.run_id = $1 AND {in_keys2.format(a="p")}
            ORDER BY p.metric, p.input_id, p.role, p.probe_id, r.sample_index""",
        [keys],
    ):
        probes.setdefault((p["metric"], p["input_id"]), []).append(p)
    # a perturbation variant that is its own row (the external metric) has its group's baseline in
    # another row: bring it in, so the row opens to the baseline and the variant side by side
    groups: dict[str, list[tuple[str, str]]] = {}
    for key, entries in probes.items():
        if not any(e.get("role") in ("base", "baseline") for e in entries):
            for g in {e["group_id"] for e in entries if e.get("group_id")}:
                groups.setdefault(f"{key[0]}\x1f{g}", []).append(key)
    if groups:
        for p in q(
            """
                SELECT p.metric, p.input_id, p.probe_id, p.role, p.category, p.variant_id, p.query_text, p.group_id,
                       r.sample_index, r.response, r.status AS sut_status, r.error AS sut_error
                FROM probes p
                LEFT JOIN sut_responses r ON r.run_id = p.run_id AND r.metric = p.metric AND r.probe_id = p.probe_id
                WHERE p.run_id = ? AND p.role = 'baseline'
                  AND p.metric || chr(31) || p.group_id IN (SELECT unnest(?::VARCHAR[]))
                ORDER BY p.probe_id, r.sample_index""",
            [list(groups)],
        ):
            for key in groups.get(f"{p['metric']}\x1f{p['group_id']}", []):
                probes[key].append(p)
    for p in q(
        f"""
            SELECT pp.metric, pp.input_id, pp.pair_id, pp.axis, pp.value_a, pp.value_b, pp.probe_a, pp.probe_b,
                   pp.kind, pp.twin_of, pp.sample_b
            FROM probe_pairs pp WHERE pp.run_id = ? AND {in_keys.format(a="pp")}
            ORDER BY pp.metric, pp.input_id, pp.pair_id""",
        [keys],
    ):
        pairs.setdefault((p["metric"], p["input_id"]), []).append(p)
    # the reasoning in persona order where the judge saw a pair in a randomised order; as written elsewhere
    for j in q(
        f"""
            SELECT j.metric, j.input_id, j.judgement_id, j.pair_id, j.judge_kind, j.category, j.sample_index,
                   j.variant_id, j.status, j.error, j.label, j.score, j.decision_a, j.decision_b, j.flipped,
                   j.attributable, j.order_swapped, j.call_key,
                   CASE WHEN j.order_swapped IS NULL THEN j.reasoning ELSE {PERSONA_ORDER_REASONING} END AS reasoning
            FROM judgements j WHERE j.run_id = ? AND {in_keys.format(a="j")}
            ORDER BY j.metric, j.input_id, j.pair_id, j.judge_kind, j.judgement_id""",
        [keys],
    ):
        verdicts.setdefault((j["metric"], j["input_id"]), []).append(j)
    return probes, pairs, verdicts


def viewer_personas(q: Query) -> Records:
    """The run's personas (group bias's pool): what each persona id is, its attributes."""
    return q("""
        SELECT metric, persona_id, description, CAST(attributes AS VARCHAR) AS attributes
        FROM personas WHERE run_id = ? ORDER BY metric, persona_id""")


def viewer_judge_calls(q: Query, call_keys: list[str]) -> dict[str, dict[str, Any]]:
    """The judge's calls behind ``call_keys``: each key's request (its messages) and raw answer, the
    latest call of a key (a call made again, as a reask or a retry, is recorded again)."""
    if not call_keys:
        return {}
    return {
        r["call_key"]: r
        for r in q(
            """
            SELECT call_key, CAST(request AS VARCHAR) AS request, response_text, status, error FROM llm_calls
            WHERE run_id = ? AND call_key IN (SELECT unnest(?::VARCHAR[]))
            QUALIFY row_number() OVER (PARTITION BY call_key ORDER BY status = 'ok' DESC, created_at DESC) = 1""",
            [sorted(set(call_keys))],
        )
    }


def run_list(path: Path) -> Records:
    """Every registered run, the newest first, with each metric's overall score, threshold and gate
    (one record per run and metric; a run without scores has one, its metric None)."""
    return _records(
        wh.query(
            """
            SELECT r.run_id, r.spec_name, r.created_at, m.metric, m.score, m.threshold, m.passed
            FROM eval_runs r LEFT JOIN metric_scores m ON m.run_id = r.run_id AND m.scope = 'overall'
            ORDER BY r.created_at DESC, r.run_id, m.metric""",
            path=path,
            read_only=True,
        )
    )


def comparison_list(path: Path) -> Records:
    """Every stored comparison of two runs (``run_comparisons``), the newest first: its runs, when it
    was made and how many of its scores changed significantly."""
    return _records(
        wh.query(
            """
            SELECT run_a, run_b, max(created_at) AS created_at, count(*) FILTER (WHERE significant) AS significant
            FROM run_comparisons GROUP BY run_a, run_b ORDER BY max(created_at) DESC, run_a, run_b""",
            path=path,
            read_only=True,
        )
    )
