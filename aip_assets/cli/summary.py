"""`aip-eval run`'s summary in words: each metric's score, interval, gate and exclusions, the
findings, and the structured-output form each LLM judge was asked in."""

from __future__ import annotations

import math
import sys


def _fmt(x, nd=3) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{nd}f}"


def print_summary(summary: dict, out=None) -> None:
    p = lambda s="": print(s, file=out or sys.stdout)  # noqa: E731
    from ..metrics import get_metric
    from ..metrics.words import failed_and_excluded, reasons_phrase

    p(f"Run {summary['run_id']}  (spec {summary['spec']}, dataset {summary['dataset']})")
    if summary.get("judge_note"):
        p(f"Note: {summary['judge_note']}")
    for line in structured_lines(summary.get("structured_output") or []):
        p(line)
    for e in summary.get("judge_exam") or []:
        p(e["line"][:1].upper() + e["line"][1:])
    from ..findings import finding_lines

    p()
    for line in finding_lines(summary_findings(summary)):
        p(line)
    for metric, s in summary["metrics"].items():
        verdict = "PASS" if s.get("passed") else "FAIL"
        if "ci95" not in s:
            p(f"\n{metric}: {s.get('status')}  {verdict}: {s.get('gate_reason')}")
            continue
        th = "" if s.get("threshold") is None else f"  threshold {s['threshold']:.3f}"
        own = f" ({s['metric_name']})" if s.get("metric_name") and s["metric_name"] != metric.rsplit(".", 1)[-1] else ""
        p(
            f"\n{metric}{own}  score {_fmt(s['score'])}  95% CI [{_fmt(s['ci95'][0])}, "
            f"{_fmt(s['ci95'][1])}]  coverage {_fmt(s.get('coverage'))}{th}  {verdict}"
        )
        if not s.get("passed"):
            p(f"  gate: {s.get('gate_reason')}")
        if kinds := failed_and_excluded(s.get("excluded")):  # failures (stored as errors) apart from exclusions
            p(
                "  "
                + "; ".join(f"{word}: {reasons_phrase(items)}" for word, items in kinds)
                + f" (of {s.get('n_planned')} planned)"
            )
        for r in s.get("judge_reading") or []:
            p(
                f"  judge {r['judge']} ({r['model']}): {r['contradicted']} of {r['asked']} verdicts contradicted a "
                "decision or stance the answer plainly states (judge_failed, excluded)"
            )
        if s.get("judge_panel"):
            from ..judge_panel import format_panel

            for line in format_panel(s["judge_panel"]):
                p(line)
        for line in get_metric(metric).format_summary(s):
            p(line)


def summary_findings(summary: dict) -> list[dict]:
    """The run's findings as dicts (``Finding.to_dict``): the summary's ``findings``, else read
    from the warehouse for the summary's metrics."""
    if "findings" not in summary:
        from ..findings import run_findings

        summary["findings"] = [f.to_dict() for f in run_findings(summary["run_id"], list(summary["metrics"]))]
    return summary["findings"]


_HOW = {
    "preflight": "chosen before the run",
    "lazily": "chosen when the run first asked it (no choice was recorded)",
    "fallback": "moved to during the run",
}


def structured_lines(forms: list[dict]) -> list[str]:
    """The summary's lines on the structured-output form of each LLM judge endpoint."""
    out = []
    for f in forms:
        head = f"Structured output: {f['role']} {f['endpoint']} (model {f['model']}): "
        if not f["history"]:
            out.append(
                head
                + (
                    f"{f['form']} (structured_output: {f['structured_output']})"
                    if f["form"]
                    else "none chosen yet (no request for JSON reached it)"
                )
            )
            continue
        steps = [f"{_HOW.get(e['how'], e['how'])}: {e['reason'][:240]}" for e in f["history"]]
        out.append(head + f"{f['form']} ({'; then '.join(steps)})")
    return out
