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
from collections.abc import Mapping
from typing import Any

# reason -> what it means, for the reasons every metric shares; a metric adds its own
# (``Metric.exclusion_reasons``; all of them: ``metrics.exclusion_reasons()``). Every excluded unit is
# counted under exactly one reason.
REASONS: dict[str, str] = {
    "sut_failed": "a SUT call failed (HTTP error, timeout, refused connection, malformed response) after its retries",
    "empty_answer": "the SUT answered with nothing visible: empty text, whitespace by Unicode (NBSP, U+3000…) or "
    "zero-width characters (U+200B-U+200D, U+2060, U+FEFF) only, or only a <think> block "
    "(sut_responses.status = 'empty'); "
    "no judge is asked",
    "judge_failed": "the judge never answered in the required JSON form within its retry budget, or its call failed",
    "unjudgeable": "the judge answered in form but declared that the item cannot be judged on its dimension "
    "(e.g. neither answer takes a stance, neither states a figure)",
    "judges_disagree": "a judge panel (judges: [...]) reached no verdict under its judge_rule: no strict majority of "
    "the judges' verdicts (majority), or not all alike (unanimous); every judge's verdict is in "
    "judge_panel",
}
# judgement statuses for which a judge was asked (the denominator of judge completeness)
JUDGE_ASKED = ("ok", "judge_failed", "no_decision", "unjudgeable", "judges_disagree")


def exclusion_reason(statuses) -> str:
    """The one reason a unit judged by several judgements (a pair's three judges, a variant's
    correctness and robustness) is excluded: its SUT answers first, then the judges."""
    return next(
        (r for r in ("sut_failed", "empty_answer", "unjudgeable", "judges_disagree") if r in statuses), "judge_failed"
    )


def completeness(ctx) -> dict[str, dict[str, Any]]:
    """Failed shares of the partition's SUT answers (failed or empty) and judge verdicts (of those
    a judge was asked for: answers it never gave in form; a panel's disagreement is an exclusion,
    counted in coverage, not a failed verdict)."""
    sut = ctx.status_counts("sut_responses")
    jud = ctx.status_counts("judgements")
    s_total = sum(sut.values())
    s_failed = s_total - sut.get("ok", 0)
    j_total = sum(n for k, n in jud.items() if k in JUDGE_ASKED)
    j_failed = jud.get("judge_failed", 0)
    return {
        "sut": {
            "total": s_total,
            "failed": s_failed,
            "empty": sut.get("empty", 0),
            "failed_share": s_failed / s_total if s_total else 0.0,
        },
        "judge": {"total": j_total, "failed": j_failed, "failed_share": j_failed / j_total if j_total else 0.0},
    }


def coverage(judged: int, excluded: dict[str, int]) -> float | None:
    planned = judged + sum(excluded.values())
    return judged / planned if planned else None


def axis_threshold(entry, threshold: float | None) -> float | None:
    """Decision flip's per-axis threshold: the entry's ``axis_threshold``, else the metric's."""
    own = getattr(entry, "axis_threshold", None)
    return threshold if own is None else own


def group_threshold(entry, threshold: float | None) -> float | None:
    """Group interaction bias's per-group threshold: the entry's ``group_threshold``, else the metric's."""
    own = getattr(entry, "group_threshold", None)
    return threshold if own is None else own


def gate_on(entry) -> str:
    """``point`` (a score passes at its threshold) or ``interval`` (its 95% lower end must)."""
    return getattr(entry, "gate_on", None) or "point"


def gated_value(score: float | None, ci_low: float | None, on: str) -> float | None:
    """The number held to a threshold: the score, or the conservative end of its interval."""
    return score if on == "point" else ci_low


def gate_groups(
    records: list, scope: str, threshold: float | None, on: str, rate_label: str | None = None
) -> list[str]:
    """Hold every breakdown record of ``scope`` (an axis, an attribute value) to ``threshold``:
    each gets ``threshold``, ``passed`` and ``gate_reason``; the failures are returned, each
    naming the group, its figure with its interval and the threshold ("gender: flip rate 0.133
    [0.085, 0.202], score 0.867 below 0.900"). No threshold: nothing is gated."""
    if threshold is None:
        return []
    f3 = lambda x: "n/a" if x is None else f"{x:.3f}"  # noqa: E731
    failures = []
    for r in records:
        if r.get("scope") != scope:
            continue
        score, lo = r.get("score"), r.get("ci_low")
        value = gated_value(score, lo, on)
        if rate_label:
            shown = f"{rate_label} {f3(r.get('rate'))} [{f3(r.get('rate_ci_low'))}, {f3(r.get('rate_ci_high'))}], score {f3(score)}"
        else:
            shown = f"score {f3(score)} [{f3(lo)}, {f3(r.get('ci_high'))}]"
        if on == "interval":
            shown += f" (95% lower end {f3(lo)})"
        if score is None or value is None:
            why = f"{r['group_key']}: no score (nothing judged)"
        elif value < threshold:
            why = f"{r['group_key']}: {shown} below {f3(threshold)}"
        else:
            r.update(threshold=threshold, passed=True, gate_reason=f"{shown} at least {f3(threshold)}")
            continue
        r.update(threshold=threshold, passed=False, gate_reason=why)
        failures.append(why)
    return failures


def failed_groups(scores, scope: str) -> dict[str, str]:
    """{group: gate_reason} of the stored breakdown rows of ``scope`` whose gate failed."""
    import pandas as pd

    rows = scores[scores["scope"] == scope]
    return {
        str(r["group_key"]): str(r["gate_reason"])
        for _, r in rows.iterrows()
        if r.get("passed") is not None and not pd.isna(r.get("passed")) and not bool(r["passed"])
    }


def decide(
    score: float | None,
    threshold: float | None,
    cov: float | None,
    min_coverage: float,
    complete: dict[str, dict[str, Any]],
    max_failed_share: float,
    failures: list[str] | tuple[str, ...] = (),
    on: str = "point",
    ci_low: float | None = None,
) -> tuple[bool, str]:
    """(passed, reason): every condition that fails is named; a pass says what it rests on. With
    ``on="interval"`` the score's 95% lower end (``ci_low``) must clear the threshold."""
    f3 = lambda x: f"{x:.3f}"  # noqa: E731
    problems: list[str] = []
    gated = gated_value(score, ci_low, on)
    if score is None:
        problems.append("no score: nothing could be judged")
    elif threshold is not None and gated is None:
        problems.append("no interval: gate_on interval needs one")
    elif threshold is not None and gated is not None and gated < threshold:
        problems.append(
            f"score {f3(score)} below threshold {f3(threshold)}"
            if on == "point"
            else f"score {f3(score)}: its 95% lower end {f3(gated)} below threshold {f3(threshold)}"
        )
    if cov is None:
        problems.append("coverage n/a: nothing was planned")
    elif cov < min_coverage:
        problems.append(f"coverage {f3(cov)} below min_coverage {f3(min_coverage)}")
    for role, what in (("sut", "SUT answers"), ("judge", "judge verdicts")):
        c = complete[role]
        if c["failed_share"] > max_failed_share:
            problems.append(
                f"{c['failed']} of {c['total']} {what} failed ({f3(c['failed_share'])}, above "
                f"max_failed_share {f3(max_failed_share)})"
            )
    problems += list(failures)
    if problems:
        return False, "; ".join(problems)
    assert score is not None and cov is not None
    held = [
        (
            f"score {f3(score)} at least threshold {f3(threshold)}"
            if on == "point"
            else f"score {f3(score)}, its 95% lower end {f3(gated)} at least threshold {f3(threshold)}"
        )
        if threshold is not None and gated is not None
        else f"score {f3(score)} (no threshold)",
        f"coverage {f3(cov)} at least {f3(min_coverage)}",
        f"failed shares within {f3(max_failed_share)}",
    ]
    return True, "; ".join(held)


FAILURE_REASONS = frozenset({"sut_failed", "judge_failed", "not_judged"})  # what failed, not what was excluded


def failed_count(excluded: Mapping[str, int]) -> int:
    """Of the units without a verdict, counted by reason, those that failed (``FAILURE_REASONS``: a
    SUT call, a judge): ``metric_scores.n_failed``. The others (no decision, an empty answer,
    unjudgeable, judges that disagree...) are exclusions, never failures."""
    return sum(int(n) for k, n in excluded.items() if k in FAILURE_REASONS)


def finish_scores(ctx, records: list[dict]) -> list[dict]:
    """Coverage and excluded counts on every record that carries them (``n_excluded``: every unit
    without a verdict, by reason in ``excluded``; ``n_failed``: those of them that failed, a SUT
    call or a judge, not the exclusions); the gate on ``overall``."""
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
            r["n_failed"] = failed_count(excluded)
            r["excluded"] = json.dumps(excluded, sort_keys=True)
            r["coverage"] = coverage(judged, excluded)
        if r.get("scope") == "overall":
            spec = ctx.spec
            entry = spec.metrics[ctx.metric] if spec is not None and ctx.metric in spec.metrics else None
            min_cov = spec.min_coverage_for(ctx.metric) if spec is not None and entry is not None else 0.9
            max_failed = spec.max_failed_share if spec is not None else 0.1
            complete = completeness(ctx)
            passed, why = decide(
                r.get("score"),
                r.get("threshold"),
                r.get("coverage"),
                min_cov,
                complete,
                max_failed,
                failures,
                gate_on(entry),
                r.get("ci_low"),
            )
            r["passed"], r["gate_reason"] = passed, why
            details = json.loads(r.get("details") or "{}")
            details.update(min_coverage=min_cov, completeness=complete)
            r["details"] = json.dumps(details, ensure_ascii=False)
        out.append(r)
    return out
