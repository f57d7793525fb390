"""Wall time and peak memory of the whole pipeline on a large dataset, builtin model in-process.

Generates ``--rows`` rows (default 10,000) into a temp dir by replicating
``data/datasets/demo_decisions.jsonl`` with unique input_ids (``<id>-r00042``) and a small change
to the question (`` (case 42)``), writes a run spec beside it (builtin judge, ``batch_rows`` from
``--batch-rows``, one metric with ``sub_call_concurrency_limit: 64``):

- ``--metric llm.decision_flip`` (default): builtin flip SUT {value: woman, axis: gender, p: 0.3};
- ``--metric llm.group_interaction_bias``: builtin terse SUT {terse_value: Muslim}, metric defaults
  otherwise (persona_pool_size 16, num_pairs 4);

then runs

    python -m aip_assets.cli run <spec> --warehouse <tmp>/wh.duckdb --json --quiet   (this checkout, this interpreter)

as a subprocess with cwd = the temp dir (so Dagster's storage lands there), measuring wall time
and the child's peak RSS (``RUSAGE_CHILDREN.ru_maxrss``; ``/usr/bin/time -v`` as a cross-check
when present). Counts come from the JSON summary and from ``aip-eval sql`` on ``llm_calls``;
per-stage times from the Dagster event log in the temp dir, per-stage call rates from the call
journal (also when the run is killed by ``--timeout``), and the sizes of the warehouse and journal
files at the end. The RSS samples (every 0.25 s, summed over the child's process tree) are written
beside the report as ``<out stem>-rss.csv``.

    python benchmarks/bench_pipeline.py [--metric llm.decision_flip|llm.group_interaction_bias]
        [--rows 10000] [--batch-rows 5000] [--timeout 1800] [--keep] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import yaml
from _common import code_fingerprint, run_header

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "data" / "datasets" / "demo_decisions.jsonl"
OUT_DIR = Path(__file__).resolve().parent / "out"
METRICS = ("llm.decision_flip", "llm.group_interaction_bias")
# per metric: the builtin SUT profile, the metric config, how to describe them, and the tables it fills
SETUPS = {
    "llm.decision_flip": {
        "profile": {"name": "flip", "value": "woman", "axis": "gender", "p": 0.3},
        "config": {"sub_call_concurrency_limit": 64},
        "spec_text": "SUT builtin flip {value: woman, axis: gender, p: 0.3}, judge builtin, "
        "llm.decision_flip defaults + sub_call_concurrency_limit: 64",
        "tables": (
            "dataset_rows",
            "probes",
            "probe_pairs",
            "sut_responses",
            "judgements",
            "row_scores",
            "metric_scores",
        ),
    },
    "llm.group_interaction_bias": {
        "profile": {"name": "terse", "terse_value": "Muslim"},
        "config": {"sub_call_concurrency_limit": 64},
        "spec_text": "SUT builtin terse {terse_value: Muslim}, judge builtin, llm.group_interaction_bias defaults "
        "(persona_pool_size 16, num_pairs 4) + sub_call_concurrency_limit: 64",
        "tables": (
            "dataset_rows",
            "personas",
            "probes",
            "probe_pairs",
            "sut_responses",
            "judgements",
            "row_scores",
            "metric_scores",
        ),
    },
}

STAGE_TIMES = r"""
import json
from aip_assets.dagster_home import get_instance
inst = get_instance()
out = []
for run in inst.get_runs(limit=10):
    stats = inst.get_run_stats(run.run_id)
    steps = [{"step": s.step_key, "start": s.start_time, "end": s.end_time, "status": str(s.status)}
             for s in inst.get_run_step_stats(run.run_id)]
    out.append({"dagster_run": run.run_id, "status": str(run.status), "start": stats.start_time,
                "end": stats.end_time, "steps": steps})
print(json.dumps(out))
"""


def make_dataset(n_rows: int, path: Path) -> None:
    base = [json.loads(line) for line in DEMO.read_text().splitlines() if line.strip()]
    with open(path, "w") as f:
        for i in range(n_rows):
            row = json.loads(json.dumps(base[i % len(base)]))
            row["input_id"] = f"{row['input_id']}-r{i:05d}"
            suffix = f" (case {i})"
            if isinstance(row["prompt"], str):
                row["prompt"] += suffix
            else:  # multi-turn: vary the last user turn
                last = max(k for k, t in enumerate(row["prompt"]) if t["role"] == "user")
                row["prompt"][last]["content"] += suffix
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def make_spec(dataset: Path, path: Path, metric: str, batch_rows: int) -> dict:
    setup = SETUPS[metric]
    spec = {
        "name": "bench",
        "dataset": str(dataset),
        "sut": {"provider": "builtin", "profile": dict(setup["profile"])},
        "judge": {"provider": "builtin"},
        "batch_rows": batch_rows,
        "metrics": {metric: {"config": dict(setup["config"])}},
    }
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return spec


def file_sizes(wh: Path) -> list[tuple[str, int | None]]:
    """Sizes (bytes) of the warehouse, its WAL, the call journal (+ SQLite WAL/SHM) and leftover staging."""
    from aip_assets.models.journal import journal_path

    jp = journal_path(wh)
    out: list[tuple[str, int | None]] = []
    for f in (wh, Path(str(wh) + ".wal"), jp, Path(str(jp) + "-wal"), Path(str(jp) + "-shm")):
        out.append((f.name, f.stat().st_size if f.exists() else None))
    staging = wh.parent / "staging"
    out.append(
        (
            "staging/ (left over)",
            sum(f.stat().st_size for f in staging.rglob("*") if f.is_file()) if staging.exists() else None,
        )
    )
    return out


def journal_rates(wh: Path) -> list[dict]:
    """Per stage: calls journaled, first/last completion time (epoch s). Read-only; works on a killed run."""
    import sqlite3

    from aip_assets.models.journal import journal_path

    jp = journal_path(wh)
    if not jp.exists():
        return []
    try:
        con = sqlite3.connect(f"file:{jp}?mode=ro", uri=True, timeout=30)
        try:
            cur = con.execute(
                "SELECT stage, count(*), sum(status = 'ok'), min(created_at), max(created_at) "
                "FROM call_index GROUP BY stage ORDER BY min(created_at)"
            )
            return [{"stage": s, "calls": n, "ok": ok, "first": t0, "last": t1} for s, n, ok, t0, t1 in cur]
        finally:
            con.close()
    except sqlite3.Error as e:
        print(f"(could not read the journal: {e})", file=sys.stderr)
        return []


CHECKOUT = Path(__file__).resolve().parents[1]


def cli() -> list[str]:
    """This checkout's CLI under this interpreter; never whichever `aip-eval` is first on PATH
    (it once measured another checkout's code). child_env(work) puts the checkout first on the path,
    and check_code() proves the child imports it."""
    return [sys.executable, "-m", "aip_assets.cli"]


def child_env(work: Path) -> dict[str, str]:
    """The children's environment: this checkout first on the path, and the work folder as the
    data folder, so Dagster's storage is the run's own (in a shared one the step times of another
    process's runs were read once)."""
    env = dict(os.environ)
    for name in ("DAGSTER_HOME", "AIP_WAREHOUSE", "AIP_DAGSTER_HOME_SET", "AIP_DATA_DIR_SET"):
        env.pop(name, None)
    env["AIP_DATA_DIR"] = str(work)
    env["PYTHONPATH"] = os.pathsep.join([str(CHECKOUT), *filter(None, [env.get("PYTHONPATH")])])
    return env


def check_code(cwd: Path) -> str:
    """Where the child process imports aip_assets from; stops the benchmark unless it is this checkout."""
    p = subprocess.run(
        [sys.executable, "-c", "import aip_assets; print(aip_assets.__file__)"],
        cwd=cwd,
        env=child_env(cwd),
        capture_output=True,
        text=True,
        check=True,
    )
    where = Path(p.stdout.strip()).resolve()
    if CHECKOUT not in where.parents:
        raise SystemExit(f"the child imports aip_assets from {where}, not this checkout {CHECKOUT}")
    return str(where.parent)


def tree_rss_kib(pid: int) -> int:
    """Summed VmRSS of pid and its descendants (Linux /proc), KiB; 0 when gone."""
    total, todo, seen = 0, [pid], set()
    while todo and len(seen) < 64:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
                    break
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(x) for x in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
    return total


class RssSampler(threading.Thread):
    """Samples the child tree's RSS every `every` s until stopped (bounded by max_s)."""

    def __init__(self, pid: int, every: float = 0.25, max_s: float = 4000.0):
        super().__init__(daemon=True)
        self.pid, self.every, self.max_s = pid, every, max_s
        self.samples: list[tuple[float, int]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        end = time.monotonic() + self.max_s
        while not self.stop.is_set() and time.monotonic() < end:
            self.samples.append((time.time(), tree_rss_kib(self.pid)))
            self.stop.wait(self.every)


def run_pipeline(spec: Path, wh: Path, work: Path, timeout: float) -> dict:
    time_bin = "/usr/bin/time" if os.access("/usr/bin/time", os.X_OK) else None
    time_log = work / "time-v.txt"
    cmd = cli() + ["run", str(spec), "--warehouse", str(wh), "--json", "--quiet"]
    if time_bin:
        cmd = [time_bin, "-v", "-o", str(time_log)] + cmd
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(work / "run.stdout", "w") as out, open(work / "run.stderr", "w") as err:
        t0, t_start = time.perf_counter(), time.time()
        # own session so a timeout can end the wrapper and the pipeline together (by our child's id)
        proc = subprocess.Popen(
            cmd, cwd=work, env=child_env(work), stdout=out, stderr=err, stdin=subprocess.DEVNULL, start_new_session=True
        )
        sampler = RssSampler(proc.pid, max_s=timeout + 60)
        sampler.start()
        try:
            rc = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(20)
            rc = None
        except BaseException:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(20)
            raise
        finally:
            sampler.stop.set()
            sampler.join(5)
        wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    res = {
        "rc": rc,
        "wall": wall,
        "t_start": t_start,
        "maxrss_kib": after.ru_maxrss,
        "child_user_s": after.ru_utime - before.ru_utime,
        "child_sys_s": after.ru_stime - before.ru_stime,
        "stdout": (work / "run.stdout").read_text(),
        "stderr": (work / "run.stderr").read_text(),
        "time_v": None,
        "rss_samples": sampler.samples,
    }
    if time_bin and time_log.exists():
        tv = time_log.read_text()
        m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", tv)
        e = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", tv)
        c = re.search(r"Percent of CPU this job got: (\d+)%", tv)
        res["time_v"] = {
            "maxrss_kib": int(m.group(1)) if m else None,
            "elapsed": e.group(1) if e else None,
            "cpu_percent": int(c.group(1)) if c else None,
        }
    return res


def sql(query: str, wh: Path, work: Path) -> tuple[list[dict] | None, str]:
    p = subprocess.run(
        cli() + ["sql", query, "--warehouse", str(wh), "--format", "json"],
        cwd=work,
        env=child_env(work),
        capture_output=True,
        text=True,
        timeout=300,
    )
    if p.returncode != 0:
        return None, p.stderr.strip()
    return json.loads(p.stdout), ""


def stage_times(work: Path) -> list[dict]:
    p = subprocess.run(
        [sys.executable, "-c", STAGE_TIMES], cwd=work, env=child_env(work), capture_output=True, text=True, timeout=300
    )
    if p.returncode != 0:
        print(f"(could not read Dagster step times: {p.stderr.strip()[-500:]})", file=sys.stderr)
        return []
    try:
        return json.loads(p.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return []


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--metric", choices=METRICS, default="llm.decision_flip")
    ap.add_argument("--rows", type=int, default=10000)
    ap.add_argument("--batch-rows", type=int, default=5000, help="written into the spec as batch_rows")
    ap.add_argument("--timeout", type=float, default=1800.0, help="kill the pipeline after this many seconds")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (dataset, warehouse, logs)")
    ap.add_argument(
        "--out", default=None, help="report path (default benchmarks/out/pipeline-<short metric name>-<rows>.md)"
    )
    args = ap.parse_args(argv)
    if not 1 <= args.rows <= 1_000_000:
        ap.error("--rows must be in 1..1000000")
    if not 1 <= args.batch_rows <= 100_000:
        ap.error("--batch-rows must be in 1..100000 (the run spec's bounds)")
    metric, setup = args.metric, SETUPS[args.metric]
    short = metric.split(".", 1)[-1]
    out = Path(args.out) if args.out else OUT_DIR / f"pipeline-{short}-{args.rows}.md"
    info = run_header()
    work = Path(tempfile.mkdtemp(prefix="aip-bench-pipeline-"))
    try:
        info["code_imported_from"] = check_code(work)
        ds, spec, wh = work / "bench.jsonl", work / "bench.yaml", work / "wh.duckdb"
        make_dataset(args.rows, ds)
        make_spec(ds, spec, metric, args.batch_rows)
        print(
            f"work dir {work}: {metric}, {args.rows} rows, batch_rows {args.batch_rows}; running the pipeline "
            f"(timeout {args.timeout:g} s)...",
            file=sys.stderr,
            flush=True,
        )
        r = run_pipeline(spec, wh, work, args.timeout)
        print(f"pipeline exit {r['rc']} after {r['wall']:.1f} s", file=sys.stderr, flush=True)
        sizes = file_sizes(wh)  # right after the pipeline, before our read-only queries
        rates = journal_rates(wh)
        summary = None
        try:
            summary = json.loads(r["stdout"]) if r["stdout"].strip() else None
        except ValueError:
            pass
        m = (summary or {}).get("metrics", {}).get(metric, {})
        calls, sql_err = (
            sql("SELECT stage, count(*) AS calls FROM llm_calls GROUP BY ALL ORDER BY stage", wh, work)
            if wh.exists()
            else (None, "no warehouse")
        )
        tables, _ = (
            sql(
                " UNION ALL ".join(
                    f"SELECT '{t}' AS t, count(*) AS n FROM {t} WHERE metric = '{metric}'" for t in setup["tables"]
                ),
                wh,
                work,
            )
            if wh.exists()
            else (None, "")
        )
        calls_by = {c["stage"]: int(c["calls"]) for c in calls or []}
        tab = {t["t"]: int(t["n"]) for t in tables or []}
        steps = stage_times(work)

        sut_calls, judge_calls = calls_by.get("sampling"), calls_by.get("judging")
        total_calls = (sut_calls or 0) + (judge_calls or 0)
        wall = r["wall"]
        peak_mib = r["maxrss_kib"] / 1024
        tv = r["time_v"] or {}
        tv_mib = "n/a" if tv.get("maxrss_kib") is None else f"{tv['maxrss_kib'] / 1024:.0f}"

        def fmt(x):
            if isinstance(x, float):
                return f"{x:.4f}"
            return "n/a" if x is None else (f"{x:,}" if isinstance(x, int) else str(x))

        if metric == "llm.decision_flip":
            summary_rows = [
                f"| pairs judged (JSON summary: pairs_evaluated) | {fmt(m.get('pairs_evaluated'))} |",
                f"| pairs failed (JSON summary) | {fmt(m.get('pairs_failed'))} |",
                f"| score / flip rate (JSON summary) | {fmt(m.get('score'))} / {fmt(m.get('flip_rate'))} |",
            ]
        else:
            lea = m.get("least_equitable_attributes")
            lea_txt = (
                "n/a"
                if lea is None
                else ", ".join(
                    f"{g['group']} {g['equitability']:.3f}"
                    if isinstance(g.get("equitability"), (int, float))
                    else f"{g['group']} n/a"
                    for g in lea
                )
                or "none"
            )
            ci = m.get("ci95") or [None, None]
            summary_rows = [
                f"| personas in the pool | {fmt(tab.get('personas'))} |",
                f"| pairs judged (JSON summary: pairs_evaluated) | {fmt(m.get('pairs_evaluated'))} |",
                f"| pairs failed (JSON summary) | {fmt(m.get('pairs_failed'))} |",
                f"| rows errored (JSON summary) | {fmt(m.get('rows_errored'))} |",
                f"| score [95% CI] (JSON summary) | {fmt(m.get('score'))} [{fmt(ci[0])}, {fmt(ci[1])}] |",
                f"| least equitable attributes (JSON summary, equitability) | {lea_txt} |",
            ]
        title_metric = metric + ("" if args.batch_rows == 5000 else f", batch_rows {args.batch_rows}")
        lines = [
            f"# Pipeline benchmark: builtin model in-process, {title_metric}",
            "",
            f"- date: {info['date']}",
            f"- code: {info['code']}"
            + (
                ""
                if code_fingerprint() == info["code"]
                else f" — WARNING: the sources changed during the run (now {code_fingerprint()})"
            ),
            f"- aip_assets {info['version']} at commit {info['commit']}",
            f"- machine: nproc {info['nproc']}, CPU {info['cpu']}, Python {info['python']}",
            f"- command: `{info['interpreter']} -m aip_assets.cli run bench.yaml --warehouse wh.duckdb --json --quiet` "
            f"(cwd = fresh temp dir, no dagster.yaml; aip_assets imported from {info['code_imported_from']}); "
            f"exit code {fmt(r['rc'])}" + (" (killed: timeout)" if r["rc"] is None else ""),
            f"- dataset: {args.rows:,} rows replicated from demo_decisions.jsonl (unique input_id, ' (case i)' appended)",
            f"- spec: {setup['spec_text']}; batch_rows: {args.batch_rows:,}",
            "",
            "| measure | value |",
            "|---|---:|",
            f"| rows | {args.rows:,} |",
            f"| rows ingested (dataset_rows) | {fmt(tab.get('dataset_rows'))} |",
            f"| batch_rows | {args.batch_rows:,} |",
            f"| probes / probe pairs | {fmt(tab.get('probes'))} / {fmt(tab.get('probe_pairs'))} |",
            f"| SUT responses / judgements | {fmt(tab.get('sut_responses'))} / {fmt(tab.get('judgements'))} |",
            *summary_rows,
            f"| SUT calls (llm_calls, stage sampling) | {fmt(sut_calls)} |",
            f"| judge calls (llm_calls, stage judging) | {fmt(judge_calls)} |",
            f"| wall seconds | {wall:.1f} |",
            f"| rows/s | {args.rows / wall:.1f} |",
            f"| calls/s (SUT + judge) | {total_calls / wall:.1f} |",
            f"| peak RSS MiB (RUSAGE_CHILDREN.ru_maxrss) | {peak_mib:.0f} |",
            f"| peak RSS MiB (/usr/bin/time -v) | {tv_mib} |",
            f"| child CPU user + sys s (CPU % of wall) | {r['child_user_s']:.1f} + {r['child_sys_s']:.1f} "
            f"({100 * (r['child_user_s'] + r['child_sys_s']) / wall:.0f}%) |",
        ]
        lines += ["", "Files at the end of the run (bytes):", "", "| file | bytes | MiB |", "|---|---:|---:|"]
        lines += [
            f"| {name} | {'absent' if n is None else f'{n:,}'} | {'' if n is None else f'{n / 2**20:.1f}'} |"
            for name, n in sizes
        ]
        if calls is not None:
            lines += [
                "",
                '`aip-eval sql "SELECT stage, count(*) FROM llm_calls GROUP BY ALL"`:',
                "",
                "| stage | calls |",
                "|---|---:|",
            ] + [f"| {s} | {n:,} |" for s, n in calls_by.items()]
        elif sql_err:
            lines += ["", f"llm_calls query failed: {sql_err[-300:]}"]
        if steps:
            run0 = steps[0]
            lines += [
                "",
                (
                    f"Per-stage wall time (Dagster step events; Dagster run {run0['dagster_run'][:8]}, "
                    f"{run0['status']}; RSS summed over the process tree, sampled every 0.25 s):"
                ),
                "",
                "| step | seconds | share of wall | peak RSS MiB | RSS MiB at start → end |",
                "|---|---:|---:|---:|---:|",
            ]
            for s in sorted(run0["steps"], key=lambda s: s["start"] or 0):
                if s["start"]:
                    end = s["end"] or (r["t_start"] + wall)
                    d = end - s["start"]
                    inside = [kib for t, kib in r["rss_samples"] if s["start"] <= t <= end and kib]
                    peak = max(inside, default=None)
                    se = "n/a" if not inside else f"{inside[0] / 1024:.0f} → {inside[-1] / 1024:.0f}"
                    lines.append(
                        f"| {s['step']}{'' if s['end'] else ' (' + s['status'] + ', unfinished)'} | {d:.1f} "
                        f"| {100 * d / wall:.0f}% | {'n/a' if peak is None else f'{peak / 1024:.0f}'} | {se} |"
                    )
                else:
                    lines.append(f"| {s['step']} | {s['status']} | | | |")
            if run0["start"] and run0["end"]:
                d = run0["end"] - run0["start"]
                lines.append(f"| (Dagster run total) | {d:.1f} | {100 * d / wall:.0f}% | | |")
            if run0["start"]:
                pre = max((kib for t, kib in r["rss_samples"] if t < run0["start"]), default=None)
                lines.append(
                    f"| (before the Dagster run: imports, preflight, register) | {run0['start'] - r['t_start']:.1f} "
                    f"| {100 * (run0['start'] - r['t_start']) / wall:.0f}% "
                    f"| {'n/a' if pre is None else f'{pre / 1024:.0f}'} | |"
                )
        if rates:
            lines += [
                "",
                "Model calls per stage from the call journal (completion timestamps; also for a killed run):",
                "",
                (
                    "| stage | calls (ok) | first → last completion, s after start | calls/s "
                    "| rows/s (stage committed only) |"
                ),
                "|---|---:|---:|---:|---:|",
            ]
            for x in rates:
                span = (x["last"] or 0) - (x["first"] or 0)
                cps = x["calls"] / span if span > 0 else None
                done = calls_by.get(x["stage"]) == x["calls"]  # folded into llm_calls: the stage finished
                lines.append(
                    f"| {x['stage']} | {x['calls']:,} ({x['ok'] or 0:,}) "
                    f"| {x['first'] - r['t_start']:.1f} → {x['last'] - r['t_start']:.1f} "
                    f"| {'n/a' if cps is None else f'{cps:.0f}'} "
                    f"| {f'{args.rows / span:.1f}' if done and span > 0 else 'n/a'} |"
                )
        if r["rc"] not in (0, 1):
            lines += ["", "stderr (tail):", "", "```", r["stderr"][-2000:], "```"]
        text = "\n".join(lines) + "\n"
        print(text)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        rss_csv = out.with_name(out.stem + "-rss.csv")
        rss_csv.write_text(
            "seconds_after_start,rss_mib\n"
            + "".join(f"{t - r['t_start']:.2f},{kib / 1024:.1f}\n" for t, kib in r["rss_samples"])
        )
        out.with_suffix(".json").write_text(
            json.dumps(
                {
                    **info,
                    "metric": metric,
                    "rows": args.rows,
                    "batch_rows": args.batch_rows,
                    "exit_code": r["rc"],
                    "wall_s": wall,
                    "peak_rss_mib": peak_mib,
                    "child_cpu_s": r["child_user_s"] + r["child_sys_s"],
                    "sut_calls": sut_calls,
                    "judge_calls": judge_calls,
                    "tables": tab,
                    "summary": m,
                    "files_bytes": dict(sizes),
                    "steps": steps,
                    "journal_rates": rates,
                },
                indent=2,
                default=str,
            )
        )
        print(f"written to {out}, {out.with_suffix('.json')} (RSS samples: {rss_csv})", file=sys.stderr)
        return 0 if r["rc"] in (0, 1) else 1
    finally:
        if args.keep:
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
