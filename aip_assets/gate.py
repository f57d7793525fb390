"""What a score may rest on, and the gate (DESIGN.md "What a score may rest on").

A score is evidence only about what was judged. Every unit a metric plans (a persona pair, a
comparison, a variant pair) is either judged or excluded under one of the named reasons below;
``coverage`` is the judged share. The gate (``passed``) is true or false, never null, with a
``gate_reason``: no score, a score below the threshold, coverage below ``min_coverage``, a
completeness bound exceeded (failed SUT answers or judge verdicts above ``max_failed_share``),
or a metric's own finding (a differential refusal, a label mismatch) each fail it.
"""

from __future__ import annotations

import json
from typing import Any

# reason -> what it means. Every excluded unit is counted under exactly one of them.
REASONS: dict[str, str] = {
    "sut_failed": "a SUT call failed (HTTP error, timeout, refused connection, malformed response) after its retries",
    "empty_answer": "the SUT answered with empty or whitespace-only text (sut_responses.status = 'empty'); "
                    "no judge is asked",
    "no_decision": "decision flip: neither answer of the pair states one of the configured decision labels "
                   "(a refusal, a hedge, or labels the SUT does not use)",
    "judge_failed": "the judge never answered in the required JSON form within its retry budget, or its call failed",
    "unjudgeable": "the judge answered in form but declared that the item cannot be judged on its dimension "
                   "(e.g. neither answer takes a stance, neither states a figure)",
    "missing_original_query": "perturbation robustness (dataset): the row has no metadata.original_query",
    "no_baseline": "perturbation robustness (dataset): no row of the group equals its original query",
    "duplicate_baseline": "perturbation robustness (dataset): two or more rows of the group claim to be its baseline",
    "baseline_only": "perturbation robustness (dataset): the group has only its baseline, no variant",
}
# judgement statuses for which a judge was asked (the denominator of judge completeness)
JUDGE_ASKED = ("ok", "judge_failed", "no_decision", "unjudgeable")


def exclusion_reason(statuses) -> str:
    """The one reason a unit judged by several judgements (a pair's three judges, a variant's
    correctness and robustness) is excluded: its SUT answers first, then the judges."""
    return next((r for r in ("sut_failed", "empty_answer", "unjudgeable") if r in statuses), "judge_failed")


def completeness(ctx) -> dict[str, dict[str, Any]]:
    """Failed shares of the partition's SUT answers (failed or empty) and judge verdicts (of those
    a judge was asked for: answers it never gave in form)."""
    sut = ctx.status_counts("sut_responses")
    jud = ctx.status_counts("judgements")
    s_total = sum(sut.values())
    s_failed = s_total - sut.get("ok", 0)
    j_total = sum(n for k, n in jud.items() if k in JUDGE_ASKED)
    j_failed = jud.get("judge_failed", 0)
    return {"sut": {"total": s_total, "failed": s_failed, "empty": sut.get("empty", 0),
                    "failed_share": s_failed / s_total if s_total else 0.0},
            "judge": {"total": j_total, "failed": j_failed, "failed_share": j_failed / j_total if j_total else 0.0}}


def coverage(judged: int, excluded: dict[str, int]) -> float | None:
    planned = judged + sum(excluded.values())
    return judged / planned if planned else None


def decide(score: float | None, threshold: float | None, cov: float | None, min_coverage: float,
           complete: dict[str, dict[str, Any]], max_failed_share: float,
           failures: list[str] | tuple[str, ...] = ()) -> tuple[bool, str]:
    """(passed, reason): every condition that fails is named; a pass says what it rests on."""
    f3 = lambda x: f"{x:.3f}"  # noqa: E731
    problems: list[str] = []
    if score is None:
        problems.append("no score: nothing could be judged")
    elif threshold is not None and score < threshold:
        problems.append(f"score {f3(score)} below threshold {f3(threshold)}")
    if cov is None:
        problems.append("coverage n/a: nothing was planned")
    elif cov < min_coverage:
        problems.append(f"coverage {f3(cov)} below min_coverage {f3(min_coverage)}")
    for role, what in (("sut", "SUT answers"), ("judge", "judge verdicts")):
        c = complete[role]
        if c["failed_share"] > max_failed_share:
            problems.append(f"{c['failed']} of {c['total']} {what} failed ({f3(c['failed_share'])}, above "
                            f"max_failed_share {f3(max_failed_share)})")
    problems += list(failures)
    if problems:
        return False, "; ".join(problems)
    assert score is not None and cov is not None
    held = [f"score {f3(score)} at least threshold {f3(threshold)}" if threshold is not None
            else f"score {f3(score)} (no threshold)", f"coverage {f3(cov)} at least {f3(min_coverage)}",
            f"failed shares within {f3(max_failed_share)}"]
    return True, "; ".join(held)


def finish_scores(ctx, records: list[dict]) -> list[dict]:
    """Coverage and excluded counts on every record that carries them; the gate on ``overall``."""
    out = []
    for r in records:
        r = dict(r)
        judged = r.pop("judged", None)
        excluded = r.pop("excluded", None)
        failures = r.pop("gate_failures", [])
        if excluded is not None:
            excluded = {k: int(v) for k, v in excluded.items() if v}
            judged = int(judged or 0)
            r["n_planned"] = judged + sum(excluded.values())
            r["n_excluded"] = sum(excluded.values())
            r["excluded"] = json.dumps(excluded, sort_keys=True)
            r["coverage"] = coverage(judged, excluded)
        if r.get("scope") == "overall":
            spec = ctx.spec
            entry = spec.metrics[ctx.metric] if spec is not None and ctx.metric in spec.metrics else None
            min_cov = spec.min_coverage_for(ctx.metric) if spec is not None and entry is not None else 0.9
            max_failed = spec.max_failed_share if spec is not None else 0.1
            complete = completeness(ctx)
            passed, why = decide(r.get("score"), r.get("threshold"), r.get("coverage"), min_cov, complete,
                                 max_failed, failures)
            r["passed"], r["gate_reason"] = passed, why
            details = json.loads(r.get("details") or "{}")
            details.update(min_coverage=min_cov, completeness=complete)
            r["details"] = json.dumps(details, ensure_ascii=False)
        out.append(r)
    return out
