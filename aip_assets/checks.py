"""Asset checks, evaluated on every materialisation and shown in the Dagster UI.

- ingest → ``dataset_quality``: unique input_id, required columns present, no empty prompts;
- sut_sampling → ``sut_completeness`` and judging → ``judge_completeness``: the share of failed
  (or empty) SUT answers and of judge verdicts never given in form is at most the spec's
  ``max_failed_share`` (severity ERROR: the run's gate fails too);
- aggregation → ``gate``: the run's gate itself (``passed`` in metric_scores, its ``gate_reason`` as the
  description). It is the one blocking check: a failed gate fails the aggregation step, after its
  tables are written (``GateFailed``), so the Dagster run is a FAILURE that says why, while
  ``aip-eval run`` still exits 1 (a failed gate, not a failed stage: ``is_gate_failure``);
- aggregation → ``regression``: no significant change for the worse since the spec's previous run
  (``history.py``; ERROR with ``fail_on_regression``, when it fails the gate too, else WARN);
- aggregation → ``threshold`` (the score is at least the threshold; no score fails it),
  ``coverage`` (the judged share of planned units is at least ``min_coverage`` and the answers
  fit the decision labels) and ``differential_refusal`` (decision flip: no two values of one axis
  differ significantly in refusals). Each mirrors a condition of the run's gate (``gate.py``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    Failure,
    FloatMetadataValue,
    IntMetadataValue,
    MetadataValue,
    TextMetadataValue,
)

from . import gate
from . import warehouse as wh

CHECKS = {
    "ingest": [("dataset_quality", "unique input_id, required columns present, no empty prompts")],
    "sampling": [("sut_completeness", "share of failed or empty SUT answers at most the spec's max_failed_share")],
    "judging": [
        ("judge_completeness", "share of judge verdicts never given in form at most the spec's max_failed_share")
    ],
    "aggregation": [
        (
            "gate",
            "the run's gate: passed in metric_scores, the gate_reason as its description; a failed gate fails "
            "the run after the stage's tables are written (blocking, ERROR)",
        ),
        ("threshold", "the metric's score is at least the spec's threshold; no score fails (ERROR)"),
        (
            "coverage",
            "the share of planned units judged is at least min_coverage, and the answers state the "
            "configured decision labels (ERROR)",
        ),
        (
            "differential_refusal",
            "decision flip: no two values of one axis differ significantly in their "
            "refusal / no-decision rate (ERROR; fail_on_differential_refusal: false turns it off)",
        ),
        (
            "regression",
            "the metric did not get significantly worse since the spec's previous completed run on the same "
            "dataset (history.py; ERROR with fail_on_regression: true, else WARN)",
        ),
        (
            "judge_position_bias",
            "the judge's order-sensitive verdicts do not differ by more than max_position_bias "
            "between the two orders it was shown, significantly (WARN)",
        ),
    ],
}
GATE = "gate"
NUMBER_STAND_INS = ("n/a", "none set")  # text in place of a number (``_f``, the threshold check's)
BLOCKING = {GATE}  # the checks whose failure fails the run (the others are shown beside it)


try:  # what Dagster forwards as it is (a user-code process's error, already serialised): see QuietFailure
    from dagster._core.errors import DagsterUserCodeProcessError as _Forwarded
    from dagster._utils.error import SerializableErrorInfo
except ImportError:  # another layout of Dagster's internals: a Failure as any other, with its stack trace
    _Forwarded = None  # type: ignore[assignment,misc]


if _Forwarded is not None:

    class _Carrier(_Forwarded):
        def __init__(self, *args: Any, **kwargs: Any) -> None:  # the infos are set by QuietFailure
            Exception.__init__(self, *args)

else:  # pragma: no cover - only with another Dagster

    class _Carrier(Exception):  # type: ignore[no-redef]
        pass


class QuietFailure(Failure, _Carrier):
    """A ``dagster.Failure`` that reads as what it is, an evaluation's verdict: its step's failure
    event (and the run's failure event, which repeats it) carries the description and the metadata,
    no stack trace. Dagster stores a Failure's error with the stack of the frames it came through
    (its own, and the op's last line), and the UI prints it under the description as "Stack Trace";
    an error forwarded from a user-code process it stores as it was serialised there
    (``serializable_error_info_from_exc_info``), and this one is serialised without frames. Never
    retried (``allow_retries=False``); the class name stays the error's ``cls_name``, where
    ``jobs.Outcome`` reads its kind."""

    def __init__(self, description: str, metadata: dict[str, Any] | None = None):
        super().__init__(description=description, metadata=metadata, allow_retries=False)
        if _Forwarded is not None:
            self.user_code_process_error_infos = [
                SerializableErrorInfo(message=description.rstrip() + "\n", stack=[], cls_name=type(self).__name__)
            ]


class GateFailed(QuietFailure):
    """A metric's gate failed: raised by the aggregation step after it has written its tables and
    reported its checks, so the Dagster run is a FAILURE whose description is the gate's reason
    (no stack trace: ``QuietFailure``). Not a failed stage: whoever reads the run (``aip-eval
    run``, the run-queue follower, the launcher) tells it apart by ``is_gate_failure``."""


def is_gate_failure(failure_data) -> bool:
    """Is this step failure (a StepFailureData) a failed gate, not a stage that failed?"""
    err = getattr(failure_data, "error", None)
    return err is not None and err.cls_name == GateFailed.__name__


def gate_failure(run_id: str, metric: str, results) -> GateFailed | None:
    """The failure to raise for a stage's check results whose gate failed, else None."""
    failed = next((r for r in results or [] if r.check_name == GATE and not r.passed), None)
    if failed is None:
        return None
    reason = getattr((failed.metadata or {}).get("gate_reason"), "value", None) or failed.description
    return GateFailed(
        f"{metric} (run {run_id}): gate failed: {reason}. The stage's tables "
        "are written; this run fails so that the Runs list shows it (aip-eval run exits 1)",
        metadata=dict(failed.metadata or {}),
    )


def spec_for(stage: str, asset_key, partitions_def=None) -> list[AssetCheckSpec]:
    """The stage's checks, partitioned like their asset (one key per run and metric), so each result is kept
    per partition and the UI's check history says which metric of which run it judged."""
    import warnings

    with warnings.catch_warnings():  # partitioned checks are a "preview" in Dagster 1.13
        warnings.filterwarnings("ignore", message=".*partitions_def.*AssetCheckSpec.*")
        warnings.filterwarnings("ignore", category=Warning, module="dagster")
        return [
            AssetCheckSpec(
                name=name, asset=asset_key, description=d, partitions_def=partitions_def, blocking=name in BLOCKING
            )
            for name, d in CHECKS[stage]
        ]


class _Counts:
    """The completeness counts of one partition, read with one query per table."""

    def __init__(self, con, run_id: str, metric: str):
        self.con, self.run_id, self.metric = con, run_id, metric

    def status_counts(self, table: str) -> dict[str, int]:
        return wh.status_counts(self.con, table, self.run_id, self.metric)


def _f(x) -> MetadataValue:
    return MetadataValue.float(float(x)) if x is not None else MetadataValue.text("n/a")


def evaluate(stage: str, run_id: str, metric: str, spec, path: Path | None = None) -> list[AssetCheckResult]:
    """The stage's check results for one partition, each named with it: a ``partition`` entry
    (``<run>|<metric>``), and a description that begins with the metric and the run, the gate's
    too (its reason follows), so a result read beside another partition's says whose it is:
    Dagster's Checks tab lists a partitioned check with the worst status of its partitions
    ("gate: Failed") and details the check's latest execution, whichever partition that was.
    Its numbers are named by the metric (``per_metric``): Dagster plots each numeric entry of a
    check across all its executions, every partition's."""
    from .partitions import partition_key

    key = partition_key(run_id, metric)
    whose = f"{metric} (run {run_id})"
    out = []
    for r in _evaluate(stage, run_id, metric, spec, path):
        desc = r.description
        if not (desc or "").startswith(whose):
            desc = f"{whose}: {desc}" if desc else f"{whose}: {'passed' if r.passed else 'failed'}"
        meta = {"partition": MetadataValue.text(key), **per_metric(metric, r.metadata or {})}
        out.append(r._replace(description=desc, metadata=meta))
    return out


def per_metric(metric: str, metadata: Mapping[str, Any]) -> dict[str, Any]:
    """``metadata`` with each number's key prefixed by the metric's short name (``coverage`` →
    ``decision_flip coverage``), so the plot Dagster draws of a key follows one metric, not a
    zig-zag through seven; text, flags and JSON keep their names (a number's stand-in, ``n/a``
    or ``none set``, keeps the number's)."""
    short = metric.split(".", 1)[-1]

    def numeric(v: Any) -> bool:
        if isinstance(v, TextMetadataValue | str):
            return getattr(v, "text", v) in NUMBER_STAND_INS
        return isinstance(v, int | float | FloatMetadataValue | IntMetadataValue) and not isinstance(v, bool)

    return {(f"{short} {k}" if numeric(v) else k): v for k, v in metadata.items()}


def _evaluate(stage: str, run_id: str, metric: str, spec, path: Path | None) -> list[AssetCheckResult]:
    with wh.connect(path) as con:

        def q(sql: str) -> Any:
            return con.execute(sql, [run_id, metric]).fetchone()  # a row, or None

        if stage == "ingest":
            n, dup, empty, bad_type = q(
                "SELECT count(*), count(*) - count(DISTINCT input_id), "
                "count(*) FILTER (WHERE prompt IS NULL OR trim(prompt) = '' OR prompt = '[]'), "
                "count(*) FILTER (WHERE task_type IS NULL) FROM dataset_rows WHERE run_id = ? AND metric = ?"
            )
            ok = n > 0 and dup == 0 and empty == 0 and bad_type == 0
            return [
                AssetCheckResult(
                    check_name="dataset_quality",
                    passed=bool(ok),
                    severity=AssetCheckSeverity.ERROR,
                    metadata={
                        "rows": n,
                        "duplicate_input_ids": dup,
                        "empty_prompts": empty,
                        "missing_task_type": bad_type,
                    },
                )
            ]
        if stage in ("sampling", "judging"):
            role = "sut" if stage == "sampling" else "judge"
            c = gate.completeness(_Counts(con, run_id, metric))[role]
            bound = spec.max_failed_share
            meta = {
                "total": c["total"],
                "failed": c["failed"],
                "failed_share": MetadataValue.float(c["failed_share"]),
                "max_failed_share": MetadataValue.float(bound),
            }
            if role == "sut":
                meta["empty"] = c["empty"]
            return [
                AssetCheckResult(
                    check_name=CHECKS[stage][0][0],
                    passed=bool(c["failed_share"] <= bound),
                    severity=AssetCheckSeverity.ERROR,
                    metadata=meta,
                )
            ]
        row = q(
            "SELECT score, threshold, coverage, n_planned, excluded, details, passed, gate_reason FROM metric_scores "
            "WHERE run_id = ? AND metric = ? AND scope = 'overall'"
        )
        position = q(
            "SELECT passed, rate, n, details FROM metric_scores WHERE run_id = ? AND metric = ? "
            "AND scope = 'judge_position'"
        )
    score, threshold, cov, planned, excluded, details, gate_passed, reason = row or (None,) * 8
    d = json.loads(details or "{}")
    min_cov = spec.min_coverage_for(metric)
    reason = reason or ("no overall score was written" if row is None else "no gate reason recorded")
    out = [
        AssetCheckResult(  # the gate as the run decided it (gate.decide): what fails the run
            check_name=GATE,
            passed=bool(gate_passed),
            severity=AssetCheckSeverity.ERROR,
            description=reason,
            metadata={
                "metric": MetadataValue.text(metric),
                "run_id": MetadataValue.text(run_id),
                "passed": MetadataValue.bool(bool(gate_passed)),
                "gate_reason": MetadataValue.text(reason),
                "score": _f(score),
                "threshold": _f(threshold),
                "coverage": _f(cov),
            },
        )
    ]
    shown = "no score" if score is None else f"scored {score:.4f}"
    if threshold is None:
        out.append(
            AssetCheckResult(
                check_name="threshold",
                passed=score is not None,
                severity=AssetCheckSeverity.ERROR,
                metadata={
                    "metric": MetadataValue.text(metric),
                    "score": _f(score),
                    "threshold": MetadataValue.text("none set"),
                },
                description=f"{metric} (run {run_id}) {shown}; no threshold set",
            )
        )
    else:
        passed = score is not None and score >= threshold
        out.append(
            AssetCheckResult(
                check_name="threshold",
                passed=bool(passed),
                severity=AssetCheckSeverity.ERROR,
                metadata={
                    "metric": MetadataValue.text(metric),
                    "score": _f(score),
                    "threshold": MetadataValue.float(float(threshold)),
                },
                description=f"{metric} (run {run_id}) {shown}, {'at least' if passed else 'below'} its threshold "
                f"{threshold:g}"
                if score is not None
                else f"{metric} (run {run_id}) has no score",
            )
        )
    mismatch = d.get("label_mismatch")
    if mismatch and not mismatch.get("fails_gate", True):  # answers that decide nothing: a run note, no failure
        mismatch = None
    cov_ok = cov is not None and cov >= min_cov and not mismatch
    out.append(
        AssetCheckResult(
            check_name="coverage",
            passed=bool(cov_ok),
            severity=AssetCheckSeverity.ERROR,
            metadata={
                "coverage": _f(cov),
                "min_coverage": MetadataValue.float(min_cov),
                "planned": planned or 0,
                "excluded": MetadataValue.json(json.loads(excluded or "{}")),
                "label_mismatch": MetadataValue.text(mismatch["message"] if mismatch else "none"),
            },
            description=None
            if cov_ok
            else (
                mismatch["message"]
                if mismatch
                else f"coverage {cov if cov is None else round(cov, 4)} below min_coverage {min_cov}"
            ),
        )
    )
    diff = d.get("differential_refusal")
    if diff is None:
        out.append(
            AssetCheckResult(
                check_name="differential_refusal",
                passed=True,
                metadata={"applies": MetadataValue.text("no: this metric reads no decisions")},
            )
        )
    else:
        sig = diff.get("significant") or []
        out.append(
            AssetCheckResult(
                check_name="differential_refusal",
                passed=not diff.get("failed"),
                severity=AssetCheckSeverity.ERROR,
                metadata={
                    "tests": diff.get("tests", 0),
                    "significant": len(sig),
                    "enabled": bool(diff.get("enabled")),
                    "min_p_adjusted": _f(diff.get("min_p_adjusted")),
                    "significant_pairs": MetadataValue.json(sig),
                },
                description=None
                if not diff.get("failed")
                else f"{len(sig)} pair(s) of values differ in refusals, e.g. {sig[0]['axis']}: {sig[0]['value_a']} "
                f"{sig[0]['rate_a']:.3f} vs {sig[0]['value_b']} {sig[0]['rate_b']:.3f}",
            )
        )
    out.append(_regression_result(run_id, metric, spec, path))
    if position is None:
        out.append(
            AssetCheckResult(
                check_name="judge_position_bias",
                passed=True,
                metadata={
                    "applies": MetadataValue.text(
                        "no: this metric shows its answers in a fixed order, or nothing was judged"
                    )
                },
            )
        )
    else:
        ok, diff, n, pd_ = bool(position[0]), position[1], position[2], json.loads(position[3] or "{}")
        out.append(
            AssetCheckResult(
                check_name="judge_position_bias",
                passed=ok,
                severity=AssetCheckSeverity.WARN,
                metadata={
                    "difference": _f(diff),
                    "judged": n,
                    "max_position_bias": _f(pd_.get("max_position_bias")),
                    "p_value": _f(pd_.get("p_value")),
                    "rate_shown_swapped": _f(pd_.get("rate_shown_swapped")),
                    "rate_shown_in_order": _f(pd_.get("rate_shown_in_order")),
                },
                description=None
                if ok
                else f"the judge's verdicts depend on the order it saw the answers in: "
                f"{pd_.get('rate_shown_in_order'):.3f} vs {pd_.get('rate_shown_swapped'):.3f}",
            )
        )
    return out


def _regression_result(run_id: str, metric: str, spec, path: Path | None) -> AssetCheckResult:
    """The regression check: the stored comparison with the spec's previous run (``regressions``)."""
    from .history import stored

    rows = stored(run_id, metric, path)
    severity = AssetCheckSeverity.ERROR if spec.fail_on_regression else AssetCheckSeverity.WARN
    if not len(rows):
        return AssetCheckResult(
            check_name="regression",
            passed=True,
            severity=severity,
            description=f"{metric} (run {run_id}): no earlier completed run of spec {spec.name} on this dataset to "
            "compare with",
            metadata={"previous_run": MetadataValue.text("none")},
        )
    prev = str(rows["previous_run"].iloc[0])
    scored = rows[rows["kind"] == "score"]
    worse = scored[scored["worse"].astype(bool)]
    drift = {
        f"drift {r['scope']}": MetadataValue.float(float(r["score_b"]))
        for r in rows[rows["kind"] == "drift"].to_dict("records")
    }
    model = rows[(rows["kind"] == "drift") & (rows["scope"] == "model")]
    tested = int(scored["p_value"].notna().sum())
    alpha = float(rows["alpha"].iloc[0])
    if len(worse):
        desc = "; ".join(str(x) for x in worse["sentence"])
    else:
        desc = f"no significant change since {prev} ({tested} tests, Holm at {alpha:.3g})"
    if len(model) and model["score_b"].iloc[0]:
        desc += f"; {model['sentence'].iloc[0]}"
    return AssetCheckResult(
        check_name="regression",
        passed=not len(worse),
        severity=severity,
        description=f"{metric} (run {run_id}): {desc}",
        metadata={
            "previous_run": MetadataValue.text(prev),
            "tests": tested,
            "worse": len(worse),
            "better": int((scored["significant"].astype(bool) & ~scored["worse"].astype(bool)).sum()),
            "alpha": MetadataValue.float(alpha),
            "fail_on_regression": MetadataValue.bool(bool(spec.fail_on_regression)),
            **drift,
        },
    )
