"""`aip-eval run --dry-run`: the calls, tokens and cost a spec would spend, and what it can detect;
with `--exam`, the judge exam alone."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

log = logging.getLogger("aip_assets")


def dry_exam(spec, as_json: bool) -> int:
    """``--dry-run --exam``: the endpoint check and the judge exam alone, in a scratch folder (its
    calls are not kept), printed; exit 2 when a judge fails."""
    import tempfile

    from .. import judge_exam
    from ..preflight import preflight, record_forms

    if not judge_exam.examined(spec):
        print(
            f"{spec.name}: no judge takes an exam (the builtin judge, or min_judge_exam: 0 on every metric)",
            file=sys.stderr,
        )
        return 0
    checked = preflight(spec)
    for line in checked:
        log.info(line)
    with tempfile.TemporaryDirectory(prefix="aip-exam-") as tmp:
        path = Path(tmp) / "exam.duckdb"
        run_id = f"exam-{spec.name}"
        record_forms(run_id, checked.forms, path)
        exam = judge_exam.run_exam(spec, run_id, path, log=(lambda m: None) if as_json else log.info)
    if as_json:
        print(json.dumps(judge_exam.summary(exam.rows()), indent=2))
    exam.raise_if_failed()
    return 0


def dry_run(spec, as_json: bool) -> int:
    from ..estimate import estimate

    est = estimate(spec)
    est["sent"] = _how_sent(spec, est["total"])
    if as_json:
        print(json.dumps(est, indent=2))
    else:
        print(f"Dry run of {spec.name}: no model is called. Estimated spend:")
        print(f"  {'metric':<40}{'SUT calls':>11}{'judge calls':>13}{'synth calls':>13}{'tokens':>14}")
        for m, e in est["metrics"].items():
            tokens = sum(v for k, v in e.items() if k.endswith("_tokens"))
            print(f"  {m:<40}{e['sut_calls']:>11,}{e['judge_calls']:>13,}{e['synthesis_calls']:>13,}{tokens:>14,}")
        t = est["total"]
        print(
            f"  {'total':<40}{t['sut_calls']:>11,}{t['judge_calls']:>13,}{t['synthesis_calls']:>13,}{t['tokens']:>14,}"
        )
        a = est["assumptions"]
        print(
            f"  (tokens: 4 characters a token; SUT answers {a['sut_answer_tokens']} tokens; judge prompts "
            f"{a['judge_prompt_tokens']} + both answers; judge answers {a['judge_answer_tokens']})"
        )
        if not est["within_limits"]:
            print(f"  over the spec's limits {est['limits']}: the run would stop at the cap (resumable)")
        for line in _batch_lines(spec, est["sent"]):
            print(line)
        for m, e in est["metrics"].items():
            plan = e.get("detectable")
            if not plan:
                continue
            print(
                f"What {m} can detect with 80% power (each claim at Holm's first step over its "
                f"{plan['claims']} planned claims, alpha {plan['alpha']:g}):"
            )
            for line in plan["lines"]:
                print(line)
            for w in plan["warnings"]:
                print(f"  warning: {w['message']}")
    return 0


def _how_sent(spec, total: dict) -> dict[str, dict]:
    """Per role with calls: how they go (the Batch API or live) and, where the connection's prices
    are configured, what they cost live and as configured."""
    out = {}
    for role in ("sut", "judge"):
        conn, calls = getattr(spec, role), total[f"{role}_calls"]
        if not calls:
            continue
        row: dict = {"calls": calls, "batch": conn.batch.enabled}
        if conn.prices is not None:
            p = conn.prices
            live = (
                total[f"{role}_prompt_tokens"] * p.input_per_million_tokens
                + total[f"{role}_completion_tokens"] * p.output_per_million_tokens
            ) / 1e6
            row.update(live_cost=round(live, 4), batch_cost=round(live * (1 - p.batch_discount), 4))
            row["cost"] = row["batch_cost"] if conn.batch.enabled else row["live_cost"]
        out[role] = row
    return out


def _batch_lines(spec, sent: dict[str, dict]) -> list[str]:
    out = []
    for role, r in sent.items():
        conn = getattr(spec, role)
        how = (
            f"Batch API (batches of up to {conn.batch.max_requests:,}, polled every {conn.batch.poll_seconds:g}s)"
            if r["batch"]
            else "live"
        )
        line = f"  {role}: {r['calls']:,} calls {how}"
        if "cost" in r:
            line += (
                f"; about {r['cost']:,.2f} (live: {r['live_cost']:,.2f}, saving {r['live_cost'] - r['cost']:,.2f})"
                if r["batch"]
                else f"; about {r['cost']:,.2f} (with batch.enabled: {r['batch_cost']:,.2f})"
            )
        out.append(line)
    return out
