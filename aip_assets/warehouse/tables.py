"""The warehouse's tables: every table's columns and types, and frames and Arrow schemas of them.

Every table but ``eval_runs`` carries ``run_id`` and ``metric``; columns are named and typed
here (``TABLES``; a lake's own tables, ``LAKE_TABLES``), and :func:`frame` builds a DataFrame with
exactly a table's columns. The views are in ``core_views``; making both, in ``schema``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pandas as pd

# table -> ordered (column, type). Every table but eval_runs carries run_id and metric.
TABLES: dict[str, list[tuple[str, str]]] = {
    "eval_runs": [
        ("run_id", "VARCHAR PRIMARY KEY"),
        ("spec_name", "VARCHAR"),
        ("spec", "JSON"),
        ("metrics", "JSON"),
        ("metric_versions", "JSON"),
        ("dataset_path", "VARCHAR"),
        ("dataset_sha256", "VARCHAR"),
        ("datasets", "JSON"),
        ("n_dataset_rows", "INTEGER"),
        ("package_version", "VARCHAR"),
        ("seed", "BIGINT"),
        ("created_at", "TIMESTAMP"),
    ],
    "dataset_rows": [
        ("run_id", "VARCHAR"),
        ("metric", "VARCHAR"),
        ("row_index", "INTEGER"),
        ("input_id", "VARCHAR"),
        ("prompt", "VARCHAR"),
        ("prompt_is_turns", "BOOLEAN"),
        ("sut_response", "VARCHAR"),
        ("task_type", "VARCHAR"),
        ("context", "JSON"),
        ("metadata", "JSON"),
    ],
    "persona_pool": [
        ("run_id", "VARCHAR"),
        ("metric", "VARCHAR"),
        ("axis", "VARCHAR"),
        ("pool_index", "INTEGER"),
        ("value_a", "VARCHAR"),
        ("value_b", "VARCHAR"),
        ("persona_a", "VARCHAR"),
        ("persona_b", "VARCHAR"),
        ("source", "VARCHAR"),
        # explicit (a statement) or name (a name from the names catalogue, drawn per row); what each
        # persona carries ({"gender": "woman", "ethnicity": "Black"}): the pair's group and what it holds
        ("persona_form", "VARCHAR"),
        ("attributes_a", "JSON"),
        ("attributes_b", "JSON"),
    ],
    "personas": [
        ("run_id", "VARCHAR"),
        ("metric", "VARCHAR"),
        ("persona_id", "VARCHAR"),
        ("pool_index", "INTEGER"),
        ("description", "VARCHAR"),
        ("attributes", "JSON"),
        ("source", "VARCHAR"),
        ("language", "VARCHAR"),
    ],
    "probes": [
        ("run_id", "VARCHAR"),
        ("metric", "VARCHAR"),
        ("probe_id", "VARCHAR"),
        ("input_id", "VARCHAR"),
        ("axis", "VARCHAR"),
        ("category", "VARCHAR"),
        ("attribute_value", "VARCHAR"),
        ("persona", "VARCHAR"),
        ("query_text", "VARCHAR"),
        ("messages", "JSON"),
        ("template_version", "VARCHAR"),
        ("template_id", "VARCHAR"),
        ("wrapper_id", "VARCHAR"),
        # what the probe is: persona (decision flip, group bias), variant / base (consistency),
        # baseline / variant / excluded (perturbation); axis and attribute_value are decision flip's
        ("role", "VARCHAR"),
        ("persona_id", "VARCHAR"),
        ("group_id", "VARCHAR"),
        ("variant_id", "VARCHAR"),
        ("base_source", "VARCHAR"),
        ("exclusion", "VARCHAR"),
        # decision flip: how the persona is told (explicit, name), every attribute it carries, and the
        # name it gives (persona_form name)
        ("persona_form", "VARCHAR"),
        ("attributes", "JSON"),
        ("persona_name", "VARCHAR"),
    ],
    "probe_pairs": [
        ("run_id", "VARCHAR"),
        ("metric", "VARCHAR"),
        ("pair_id", "VARCHAR"),
        ("input_id", "VARCHAR"),
        ("axis", "VARCHAR"),
        ("pool_index", "INTEGER"),
        ("value_a", "VARCHAR"),
        ("value_b", "VARCHAR"),
        ("probe_a", "VARCHAR"),
        ("probe_b", "VARCHAR"),
        # persona (a real pair) or null (the no-effect baseline: one persona's first answer against
        # its fresh sample sample_b, shown to the judge as the pair twin_of is)
        ("kind", "VARCHAR"),
        ("twin_of", "VARCHAR"),
        ("sample_b", "INTEGER"),
    ],
    "sut_responses": [
        ("run_id", "VARCHAR"),
        ("metric", "VARCHAR"),
        ("probe_id", "VARCHAR"),
        ("input_id", "VARCHAR"),
        ("sample_index", "INTEGER"),
        ("response", "VARCHAR"),
        ("status", "VARCHAR"),
        ("error", "VARCHAR"),
        ("latency_ms", "DOUBLE"),
        ("prompt_tokens", "INTEGER"),
        ("completion_tokens", "INTEGER"),
        ("model", "VARCHAR"),
        ("fingerprint", "VARCHAR"),
        ("call_key", "VARCHAR"),
        ("cached", "BOOLEAN"),
    ],
    "judgements": [
        ("run_id", "VARCHAR"),
        ("metric", "VARCHAR"),
        ("judgement_id", "VARCHAR"),
        ("pair_id", "VARCHAR"),
        ("input_id", "VARCHAR"),
        ("axis", "VARCHAR"),
        ("order_swapped", "BOOLEAN"),
        ("status", "VARCHAR"),
        ("error", "VARCHAR"),
        ("raw_output", "VARCHAR"),
        ("parsed", "JSON"),
        ("decision_a", "VARCHAR"),
        ("decision_b", "VARCHAR"),
        ("decisions_differ", "BOOLEAN"),
        ("attributable", "BOOLEAN"),
        ("flipped", "BOOLEAN"),
        ("label", "VARCHAR"),
        ("score", "DOUBLE"),
        ("reasoning", "VARCHAR"),
        ("attempts", "INTEGER"),
        ("model", "VARCHAR"),
        ("call_key", "VARCHAR"),
        ("reasks", "INTEGER"),
        ("network_retries", "INTEGER"),
        ("rate_limit_waits", "INTEGER"),
        # which judge (decision, similarity / tone / effort, comparison, correctness / robustness), of what
        ("judge_kind", "VARCHAR"),
        ("category", "VARCHAR"),
        ("sample_index", "INTEGER"),
        ("group_id", "VARCHAR"),
        ("variant_id", "VARCHAR"),
    ],
    "judge_audits": [
        ("run_id", "VARCHAR"),
        ("metric", "VARCHAR"),
        ("judgement_id", "VARCHAR"),
        ("pair_id", "VARCHAR"),
        ("input_id", "VARCHAR"),
        ("axis", "VARCHAR"),
        ("status", "VARCHAR"),
        ("error", "VARCHAR"),
        ("primary_label", "VARCHAR"),
        ("audit_label", "VARCHAR"),
        ("agree", "BOOLEAN"),
        ("raw_output", "VARCHAR"),
        ("attempts", "INTEGER"),
        ("model", "VARCHAR"),
        ("call_key", "VARCHAR"),
    ],
    # a judge panel (spec judges: [...]): every judge's verdict of every judgement, its category (the
    # metric's reading, what the panel's rule compares) and its call; chosen: the verdict used
    "judge_panel": [
        ("run_id", "VARCHAR"),
        ("metric", "VARCHAR"),
        ("judgement_id", "VARCHAR"),
        ("pair_id", "VARCHAR"),
        ("input_id", "VARCHAR"),
        ("judge_kind", "VARCHAR"),
        ("judge", "INTEGER"),
        ("role", "VARCHAR"),
        ("endpoint", "VARCHAR"),
        ("model", "VARCHAR"),
        ("response_model", "VARCHAR"),
        ("status", "VARCHAR"),
        ("error", "VARCHAR"),
        ("category", "VARCHAR"),
        ("chosen", "BOOLEAN"),
        ("parsed", "JSON"),
        ("raw_output", "VARCHAR"),
        ("attempts", "INTEGER"),
        ("call_key", "VARCHAR"),
    ],
    # the judge exam before the run (judge_exam.py): each LLM judge's verdict on each exam item, whose
    # right verdict is known by construction; status right, wrong (why_wrong) or failed (error)
    "judge_exams": [
        ("run_id", "VARCHAR"),
        ("metric", "VARCHAR"),
        ("judge", "INTEGER"),
        ("role", "VARCHAR"),
        ("endpoint", "VARCHAR"),
        ("model", "VARCHAR"),
        ("item_id", "VARCHAR"),
        ("kind", "VARCHAR"),
        ("expected", "VARCHAR"),
        ("status", "VARCHAR"),
        ("why_wrong", "VARCHAR"),
        ("error", "VARCHAR"),
        ("parsed", "JSON"),
        ("raw_output", "VARCHAR"),
        ("attempts", "INTEGER"),
        ("reasks", "INTEGER"),
        ("call_key", "VARCHAR"),
        ("min_score", "DOUBLE"),
    ],
    # the units every score is computed from (scoring.py): a judged pair, comparison or variant pair
    "score_units": [
        ("run_id", "VARCHAR"),
        ("metric", "VARCHAR"),
        ("unit_id", "VARCHAR"),
        ("input_id", "VARCHAR"),
        ("score_row", "VARCHAR"),
        ("cluster", "VARCHAR"),
        ("groups", "JSON"),
        ("flip", "DOUBLE"),
        ("bias", "DOUBLE"),
        ("score", "DOUBLE"),
        ("robustness", "DOUBLE"),
        ("correctness_drop", "DOUBLE"),
    ],
    "row_scores": [
        ("run_id", "VARCHAR"),
        ("metric", "VARCHAR"),
        ("input_id", "VARCHAR"),
        ("raw_score", "DOUBLE"),
        ("score", "DOUBLE"),
        ("label", "VARCHAR"),
        ("n_judged", "INTEGER"),
        ("n_failed", "INTEGER"),
        ("n_events", "INTEGER"),
        ("status", "VARCHAR"),
        ("error", "VARCHAR"),
        ("explanation", "VARCHAR"),
    ],
    "metric_scores": [
        ("run_id", "VARCHAR"),
        ("metric", "VARCHAR"),
        ("metric_name", "VARCHAR"),
        ("scope", "VARCHAR"),
        ("group_key", "VARCHAR"),
        ("raw_score", "DOUBLE"),
        ("score", "DOUBLE"),
        ("ci_low", "DOUBLE"),
        ("ci_high", "DOUBLE"),
        ("rate", "DOUBLE"),
        ("rate_ci_low", "DOUBLE"),
        ("rate_ci_high", "DOUBLE"),
        ("n", "INTEGER"),
        ("n_events", "INTEGER"),
        ("n_failed", "INTEGER"),
        ("weight", "DOUBLE"),
        ("threshold", "DOUBLE"),
        ("passed", "BOOLEAN"),
        ("details", "JSON"),
        ("n_planned", "INTEGER"),
        ("n_excluded", "INTEGER"),
        ("excluded", "JSON"),
        ("coverage", "DOUBLE"),
        ("gate_reason", "VARCHAR"),
    ],
    "llm_calls": [
        ("run_id", "VARCHAR"),
        ("metric", "VARCHAR"),
        ("stage", "VARCHAR"),
        ("role", "VARCHAR"),
        ("call_key", "VARCHAR"),
        ("sample_index", "INTEGER"),
        ("endpoint", "VARCHAR"),
        ("model", "VARCHAR"),
        ("request", "JSON"),
        ("response_text", "VARCHAR"),
        ("status", "VARCHAR"),
        ("error", "VARCHAR"),
        ("http_status", "INTEGER"),
        ("latency_ms", "DOUBLE"),
        ("prompt_tokens", "INTEGER"),
        ("completion_tokens", "INTEGER"),
        ("attempts", "INTEGER"),
        ("response_model", "VARCHAR"),
        ("fingerprint", "VARCHAR"),
        ("source", "VARCHAR"),
        ("created_at", "TIMESTAMP"),
    ],
    "run_notes": [
        ("run_id", "VARCHAR"),
        ("metric", "VARCHAR"),
        ("stage", "VARCHAR"),
        ("level", "VARCHAR"),
        ("code", "VARCHAR"),
        ("message", "VARCHAR"),
    ],
    # a person's category for a judgement (`aip-eval label import`, human_labels.py): one row per
    # judgement and labeller, replaced when the same labeller's label is imported again; the judge's
    # category at import time beside it (the judge's side of the comparison, on the same scale)
    "human_labels": [
        ("run_id", "VARCHAR"),
        ("metric", "VARCHAR"),
        ("judgement_id", "VARCHAR"),
        ("category", "VARCHAR"),
        ("labeller", "VARCHAR"),
        ("note", "VARCHAR"),
        ("judge_category", "VARCHAR"),
        ("imported_at", "TIMESTAMP"),
        ("source_file", "VARCHAR"),
        ("source_row", "INTEGER"),
    ],
    # run B against run A (compare.py): run_id = run_b; a re-comparison of a pair replaces its rows
    "run_comparisons": [
        ("run_a", "VARCHAR"),
        ("run_b", "VARCHAR"),
        ("run_id", "VARCHAR"),
        ("metric", "VARCHAR"),
        ("scope", "VARCHAR"),
        ("group_key", "VARCHAR"),
        ("score_a", "DOUBLE"),
        ("score_b", "DOUBLE"),
        ("diff", "DOUBLE"),
        ("ci_low", "DOUBLE"),
        ("ci_high", "DOUBLE"),
        ("p_value", "DOUBLE"),
        ("p_adjusted", "DOUBLE"),
        ("significant", "BOOLEAN"),
        ("n_a", "INTEGER"),
        ("n_b", "INTEGER"),
        ("method", "VARCHAR"),
        ("warnings", "JSON"),
        ("created_at", "TIMESTAMP"),
    ],
    # this run against the spec's previous run of the metric (history.py), written by the aggregation: kind
    # score (a compared figure: compare.compare_runs at alpha_run / metrics in the run, worse when it is a
    # significant change for the worse) or drift (the share of answers, decisions or verdicts that changed on
    # the probes both runs asked; scope model: 1 when the model ids or fingerprints the SUT reported changed)
    "regressions": [
        ("run_id", "VARCHAR"),
        ("metric", "VARCHAR"),
        ("previous_run", "VARCHAR"),
        ("kind", "VARCHAR"),
        ("scope", "VARCHAR"),
        ("group_key", "VARCHAR"),
        ("score_a", "DOUBLE"),
        ("score_b", "DOUBLE"),
        ("diff", "DOUBLE"),
        ("ci_low", "DOUBLE"),
        ("ci_high", "DOUBLE"),
        ("p_value", "DOUBLE"),
        ("p_adjusted", "DOUBLE"),
        ("significant", "BOOLEAN"),
        ("worse", "BOOLEAN"),
        ("n_a", "INTEGER"),
        ("n_b", "INTEGER"),
        ("method", "VARCHAR"),
        ("alpha", "DOUBLE"),
        ("alpha_run", "DOUBLE"),
        ("sentence", "VARCHAR"),
        ("details", "JSON"),
    ],
}

# tables whose rows are owned per (run, metric, stage) rather than per (run, metric)
STAGE_SCOPED = {"llm_calls", "run_notes"}

# A lake's own tables: the reports (report.write_report), so any host's `aip-eval report --serve`
# serves what any worker wrote, from the object store the lake's files are in
LAKE_TABLES: dict[str, list[tuple[str, str]]] = {
    "reports": [("run_id", "VARCHAR"), ("name", "VARCHAR"), ("html", "VARCHAR"), ("written_at", "TIMESTAMP")],
}


def frame(table: str, records: Iterable[dict[str, Any]] | pd.DataFrame, **const: Any) -> pd.DataFrame:
    """Build a DataFrame with exactly ``table``'s columns, in order, from records (+ constants)."""
    cols = [c for c, _ in TABLES[table]]
    df = records.copy() if isinstance(records, pd.DataFrame) else pd.DataFrame.from_records(list(records))
    for k, v in const.items():
        df[k] = v
    extra = set(df.columns) - set(cols)
    if extra:
        raise ValueError(f"{table}: unknown columns {sorted(extra)}")
    for c in cols:
        if c not in df.columns:
            df[c] = None
    return df[cols]


_ARROW = {
    "VARCHAR": "string",
    "JSON": "string",
    "DOUBLE": "float64",
    "INTEGER": "int64",
    "BIGINT": "int64",
    "BOOLEAN": "bool",
    "TIMESTAMP": "timestamp",
}


def arrow_schema(table: str):
    import pyarrow as pa

    def typ(t: str):
        name = _ARROW[t.split()[0]]
        return pa.timestamp("ns") if name == "timestamp" else pa.type_for_alias(name)

    return pa.schema([(c, typ(t)) for c, t in TABLES[table]])
