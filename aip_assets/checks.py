"""Asset checks, evaluated on every materialisation and shown in the Dagster UI.

- ingest → ``dataset_quality``: unique input_id, required columns present, no empty prompts;
- sut_sampling → ``sut_completeness`` and judging → ``judge_completeness``: the share of failed
  calls/verdicts is at most the spec's ``max_failed_share``;
- aggregation → ``threshold``: the metric's score is at least the spec's threshold (severity
  ERROR: a nightly regression is visible and can gate a release).
"""

from __future__ import annotations

from pathlib import Path

from dagster import AssetCheckResult, AssetCheckSeverity, AssetCheckSpec, MetadataValue

from . import warehouse as wh

CHECKS = {
    "ingest": ("dataset_quality", "unique input_id, required columns present, no empty prompts"),
    "sampling": ("sut_completeness", "share of failed SUT answers at most the spec's max_failed_share"),
    "judging": ("judge_completeness", "share of failed judge verdicts at most the spec's max_failed_share"),
    "aggregation": ("threshold", "the metric's score is at least the spec's threshold (ERROR when below)"),
}


def spec_for(stage: str, asset_key) -> list[AssetCheckSpec]:
    name, description = CHECKS[stage]
    return [AssetCheckSpec(name=name, asset=asset_key, description=description)]


def evaluate(stage: str, run_id: str, metric: str, spec, path: Path | None = None) -> AssetCheckResult:
    name, _ = CHECKS[stage]
    with wh.connect(path) as con:
        q = lambda sql: con.execute(sql, [run_id, metric]).fetchone()  # noqa: E731
        if stage == "ingest":
            n, dup, empty, bad_type = q(
                "SELECT count(*), count(*) - count(DISTINCT input_id), "
                "count(*) FILTER (WHERE prompt IS NULL OR trim(prompt) = '' OR prompt = '[]'), "
                "count(*) FILTER (WHERE task_type IS NULL) FROM dataset_rows WHERE run_id = ? AND metric = ?")
            ok = n > 0 and dup == 0 and empty == 0 and bad_type == 0
            return AssetCheckResult(check_name=name, passed=bool(ok), severity=AssetCheckSeverity.ERROR, metadata={
                "rows": n, "duplicate_input_ids": dup, "empty_prompts": empty, "missing_task_type": bad_type})
        if stage in ("sampling", "judging"):
            table = "sut_responses" if stage == "sampling" else "judgements"
            n, failed = q(f"SELECT count(*), count(*) FILTER (WHERE status <> 'ok') FROM {table} "
                          "WHERE run_id = ? AND metric = ?")
            share = failed / n if n else 0.0
            bound = spec.max_failed_share
            return AssetCheckResult(check_name=name, passed=bool(share <= bound), severity=AssetCheckSeverity.WARN,
                                    metadata={"total": n, "failed": failed, "failed_share": MetadataValue.float(share),
                                              "max_failed_share": MetadataValue.float(bound)})
        row = q("SELECT score, threshold FROM metric_scores WHERE run_id = ? AND metric = ? AND scope = 'overall'")
    score, threshold = (row or (None, None))
    if threshold is None:
        return AssetCheckResult(check_name=name, passed=True, metadata={
            "score": MetadataValue.float(float(score)) if score is not None else MetadataValue.text("n/a"),
            "threshold": MetadataValue.text("none set")})
    passed = score is not None and score >= threshold
    return AssetCheckResult(check_name=name, passed=bool(passed), severity=AssetCheckSeverity.ERROR, metadata={
        "score": MetadataValue.float(float(score)) if score is not None else MetadataValue.text("n/a"),
        "threshold": MetadataValue.float(float(threshold))},
        description=None if passed else f"{metric} scored {score if score is None else round(score, 4)} "
                                        f"below its threshold {threshold}")
