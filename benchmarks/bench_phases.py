"""A small run's phases (issue 39): where `aip-eval run` spends its wall time, against its calls.

The small run of bench_peers.py (the demo's decision flip alone, SUT and judge each a
``serve-builtin --latency-ms L``, ``--concurrency`` in flight). After ``--warmup`` plain runs
(not timed), each in a fresh data folder:

1. ``--repeat`` plain runs, ``python -m aip_assets.cli run spec.yaml --json --quiet``, timed from
   process start to exit: the reference wall time;
2. one run through ``benchmarks/_phase_probe.py`` (the CLI with its phases' functions wrapped):
   process start to the interpreter, the imports, the CLI's phases (spec, endpoint checks, the
   Dagster instance, the judge exam, registration, the Dagster run, the summary), each stage
   and inside it the endpoint check, the model calls, the analysis, the rows staged and the
   warehouse's commit, the report, Dagster's own share (a metric's run less its stages), and
   the SUT and judge requests each phase sent;
3. ``python -X importtime``: the imports by top-level package;
4. a run under cProfile (``--no-profile`` to skip): own time by package and the functions with
   the most cumulative time (a profile slows Python code, not waits: read its shares, not its
   seconds).

    python benchmarks/bench_phases.py [--latency-ms 100] [--concurrency 64] [--repeat 1] [--warmup 1]
        [--no-profile] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import json
import pstats
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import run_header, write_results  # noqa: E402
from bench_peers import CHECKOUT, RESULTS, child_env, short, small_spec, start_server, timed  # noqa: E402

PROBE = Path(__file__).resolve().parent / "_phase_probe.py"
TOP = [  # the CLI's phases, in the order they run (disjoint)
    "imports: aip_assets.cli (what the CLI imports at start)",
    "imports: the run's other modules (the CLI imports them within its phases)",
    "spec loaded and validated",
    "project folders chosen",
    "definitions: the evaluate job resolved",
    "datasets validated",
    "endpoint checks (preflight)",
    "Dagster instance opened",
    "judge exam",
    "registration (warehouse)",
    "Dagster: the metrics' runs",
    "summary read (run_summary)",
    "findings",
]
IN_STAGE = [  # disjoint within a stage
    "endpoint check at the stage's start",
    "model calls (the metric's sample/judge)",
    "analysis (aggregate, gate, judges' checks)",
    "rows staged to Parquet",
    "warehouse write (the stage's commit)",
    "regression check against the previous run",
    "aggregation's summary read back",
]


def importtime(modules: list[str]) -> dict[str, float]:
    """Seconds of import by top-level package (self times summed), for importing ``modules`` in a new process."""
    code = f"import importlib\nfor m in {modules!r}:\n    importlib.import_module(m)"
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code], env=child_env(), capture_output=True, text=True
    )
    by: dict[str, float] = defaultdict(float)
    for line in out.stderr.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|(\s*)(\S+)", line)
        if m:
            by[m.group(4).strip().split(".")[0]] += int(m.group(1)) / 1e6
    return dict(sorted(by.items(), key=lambda kv: -kv[1]))


BUILTIN_KINDS = [  # a C function's kind, by its name in the profile
    (("poll", "select", "acquire", "sleep", "'wait'"), "waiting (poll, locks, sleep)"),
    (("compile", "marshal", "__build_class__", "builtins.exec", "_imp."), "imports and generated code (compile, exec)"),
    (("_duckdb",), "duckdb (C)"),
    (("sqlite3",), "sqlite3 (C)"),
    (("pyarrow", "parquet"), "pyarrow (C)"),
    (("zlib", "hashlib", "json", "_pickle"), "zlib, hashlib, json (C)"),
]


def package_of(filename: str, func: str = "") -> str:
    if filename.startswith("~") or filename.startswith("<"):
        if filename.startswith("<frozen importlib"):
            return "imports and generated code (compile, exec)"
        for keys, kind in BUILTIN_KINDS:
            if any(k in func for k in keys):
                return kind
        return "other C calls (isinstance, object creation...)"
    p = Path(filename)
    parts = p.parts
    for anchor in ("site-packages", "dist-packages"):
        if anchor in parts:
            return parts[parts.index(anchor) + 1].removesuffix(".py")
    if str(CHECKOUT) in filename:
        rel = p.relative_to(CHECKOUT).parts
        return ".".join(rel[:2]).removesuffix(".py") if rel[0] == "aip_assets" else rel[0]
    return "stdlib"


def profile_summary(prof: Path, top: int = 25) -> dict:
    st = pstats.Stats(str(prof))
    by_pkg: dict[str, float] = defaultdict(float)
    rows = []
    for (fname, line, func), (_cc, nc, tt, ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        by_pkg[package_of(fname, func)] += tt
        rows.append((ct, tt, nc, f"{package_of(fname, func)}:{Path(fname).name}:{line}({func})"))
    total = st.total_tt  # type: ignore[attr-defined]
    rows.sort(reverse=True)
    ours = [r for r in rows if ":" in r[3] and r[3].startswith("aip_assets")]
    return {
        "total_s": total,
        "own_time_by_package": {k: v for k, v in sorted(by_pkg.items(), key=lambda kv: -kv[1])[:20]},
        "top_cumulative_aip_assets": [
            {"function": f, "cumulative_s": ct, "own_s": tt, "calls": nc} for ct, tt, nc, f in ours[:top]
        ],
        "top_own": [
            {"function": f, "own_s": tt, "cumulative_s": ct, "calls": nc}
            for ct, tt, nc, f in sorted(rows, key=lambda r: -r[1])[:top]
        ],
    }


def calls_by_stage(data: Path) -> list[dict]:
    import duckdb

    con = duckdb.connect(str(data / "warehouse.duckdb"), read_only=True)
    try:
        rows = con.execute(
            "SELECT stage, role, count(*), epoch(max(created_at)) - epoch(min(created_at)) FROM llm_calls "
            "GROUP BY ALL ORDER BY min(created_at)"
        ).fetchall()
    finally:
        con.close()
    return [{"stage": s, "role": r, "calls": n, "first_to_last_s": w} for s, r, n, w in rows]


def phases(probe: dict, launch: float, wall: float) -> dict:
    """The probe's intervals as a table: the CLI's phases, the stages and what is inside them."""
    ev = probe["events"]
    t_start = probe["t0_wall"] - launch  # the probe's clock starts here after the launch
    top: list[dict] = [{"phase": "process start → Python running the CLI's first line", "s": t_start}]
    for label in TOP:
        got = [e for e in ev if e["label"] == label and e["stage"] is None]
        if got:
            req = [sum(x) for x in zip(*[e["requests"] for e in got if "requests" in e], strict=False)]
            top.append(
                {
                    "phase": label,
                    "s": sum(e["end"] - e["start"] for e in got),
                    "cpu_s": sum(e.get("cpu", 0.0) for e in got),
                    "start_s": t_start + got[0]["start"],
                    **({"requests": req} if req else {}),
                }
            )
    marks = ("cli.main returned", "exit: atexit handlers start", "exit: atexit handlers done")
    mark = {e["label"]: e["end"] for e in ev if e["label"] in marks}
    cpu = {e["label"]: e.get("cpu", 0.0) for e in ev if e["label"] in marks}  # the process's CPU so far
    returned = mark.get("cli.main returned")
    begun, done = mark.get("exit: atexit handlers start"), mark.get("exit: atexit handlers done")
    if returned is not None and begun is not None and done is not None:
        top += [
            {
                "phase": "exit: cli.main returned → atexit (threads joined)",
                "s": begun - returned,
                "cpu_s": cpu["exit: atexit handlers start"] - cpu["cli.main returned"],
            },
            {
                "phase": "exit: atexit handlers (the warehouse's and Dagster's databases released)",
                "s": done - begun,
                "cpu_s": cpu["exit: atexit handlers done"] - cpu["exit: atexit handlers start"],
            },
            {"phase": "exit: interpreter teardown → process gone", "s": wall - t_start - done},
        ]
    elif returned is not None:
        top.append({"phase": "exit: cli.main returned → process gone", "s": wall - t_start - returned})
    tracked = sum(p["s"] for p in top)
    top.append(
        {
            "phase": "untracked (between the phases above: printing, logging, the rest of cli.run._run)",
            "s": wall - tracked,
        }
    )
    stages = []
    for e in ev:
        if e["label"].startswith("stage "):
            stage = e["label"].split(" ", 1)[1]
            inside = [
                x
                for x in ev
                if x is not e and x["stage"] == stage and x["start"] >= e["start"] and x["end"] <= e["end"]
            ]
            parts: dict[str, dict] = {}
            for x in inside:
                p = parts.setdefault(x["label"], {"s": 0.0, "cpu_s": 0.0, "n": 0})
                p["s"] += x["end"] - x["start"]
                p["cpu_s"] += x.get("cpu", 0.0)
                p["n"] += 1
                if "requests" in x:
                    p["requests"] = [
                        a + b for a, b in zip(p.get("requests", [0] * len(x["requests"])), x["requests"], strict=True)
                    ]
            rest = (e["end"] - e["start"]) - sum(parts[k]["s"] for k in IN_STAGE if k in parts)
            rest_cpu = e.get("cpu", 0.0) - sum(parts[k]["cpu_s"] for k in IN_STAGE if k in parts)
            stages.append(
                {
                    "stage": stage,
                    "s": e["end"] - e["start"],
                    "cpu_s": e.get("cpu", 0.0),
                    "requests": e.get("requests"),
                    "parts": parts,
                    "rest_s": rest,
                    "rest_cpu_s": rest_cpu,
                }
            )
    executes = [e for e in ev if e["label"] == "Dagster: one metric's run (execute)"]
    dagster = {}
    if executes:
        ex = sum(e["end"] - e["start"] for e in executes)
        ex_cpu = sum(e.get("cpu", 0.0) for e in executes)
        st = sum(s["s"] for s in stages)
        st_cpu = sum(s["cpu_s"] for s in stages)
        outside = {
            label: sum(e["end"] - e["start"] for e in ev if e["label"] == label and e["stage"] is None)
            for label in ("score metadata for Dagster (and the report)", "report written (HTML)", "asset checks")
        }
        dagster = {
            "execute_s": ex,
            "stages_s": st,
            "outside_stages_s": ex - st,
            "outside_stages_cpu_s": ex_cpu - st_cpu,
            **outside,
        }
    own: dict[str, float] = {}  # a wrapped call's CPU in its own thread (the CPU column counts every thread)
    for e in ev:
        if "thread_cpu" in e:
            own[e["label"]] = own.get(e["label"], 0.0) + e["thread_cpu"]
    return {
        "top": top,
        "stages": stages,
        "dagster": dagster,
        "thread_cpu": own,
        "not_found": probe["not_found"],
        "events": ev,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--latency-ms", type=float, default=100.0)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=1, help="plain runs timed (the reference)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--out", help="the Markdown table (JSON beside it); default benchmarks/results/phases-<commit>.md")
    args = ap.parse_args()
    header = run_header()
    profile = yaml.safe_load((CHECKOUT / "data" / "runs" / "demo.yaml").read_text())["sut"]["profile"]
    work = Path(tempfile.mkdtemp(prefix="aip-bench-phases-"))
    sut, sut_url = start_server(profile, args.latency_ms)
    judge, judge_url = start_server(None, args.latency_ms)
    try:
        spec_path = work / "spec.yaml"
        spec_path.write_text(yaml.safe_dump(small_spec(sut_url, judge_url, args.concurrency), sort_keys=False))
        run_args = ["run", str(spec_path), "--json", "--quiet"]
        k = 0

        def data() -> Path:
            nonlocal k
            k += 1
            return work / f"data-{k}"

        def check(r: dict, what: str) -> dict:
            if r["rc"] not in (0, 1):
                print(r["stderr"][-3000:], file=sys.stderr)
                raise SystemExit(f"{what}: exit {r['rc']}")
            return r

        for _ in range(args.warmup):
            check(
                timed(
                    [sys.executable, "-m", "aip_assets.cli", *run_args],
                    {**child_env(), "AIP_DATA_DIR": str(data())},
                    work,
                ),
                "warm-up",
            )
        plain = []
        for _ in range(args.repeat):
            r = check(
                timed(
                    [sys.executable, "-m", "aip_assets.cli", *run_args],
                    {**child_env(), "AIP_DATA_DIR": str(data())},
                    work,
                ),
                "run",
            )
            plain.append({"wall_s": r["wall_s"], "cpu_s": r["cpu_s"], "load1": r["load1"]})
            print(
                f"plain run: {r['wall_s']:.2f} s, CPU {r['cpu_s']:.2f} s, load {r['load1']:.1f}",
                file=sys.stderr,
                flush=True,
            )
        probe_data, probe_out = data(), work / "phases.json"
        env = {
            **child_env(),
            "AIP_DATA_DIR": str(probe_data),
            "AIP_PHASES_OUT": str(probe_out),
            "AIP_PHASES_SERVERS": f"{sut_url},{judge_url}",
        }
        launch = time.time()
        r = check(timed([sys.executable, str(PROBE), *run_args], env, work), "probe run")
        print(f"probe run: {r['wall_s']:.2f} s, load {r['load1']:.1f}", file=sys.stderr, flush=True)
        table = phases(json.loads(probe_out.read_text()), launch, r["wall_s"])
        table["probe_wall_s"], table["probe_cpu_s"] = r["wall_s"], r["cpu_s"]
        calls = calls_by_stage(probe_data)
        imports = {
            "cli": importtime(["aip_assets.cli"]),
            "run": importtime(["aip_assets.cli", "aip_assets.pipeline", "aip_assets.jobs", "aip_assets.definitions"]),
        }
        prof = None
        if not args.no_profile:
            pfile, script = work / "run.prof", work / "profiled_main.py"
            # cli.main, not the command's way out (cli.entry ends with os._exit: no profile would be written)
            script.write_text("import sys\nfrom aip_assets.cli import main\nsys.exit(main(sys.argv[1:]))\n")
            cmd = [sys.executable, "-m", "cProfile", "-o", str(pfile), str(script), *run_args]
            r = check(timed(cmd, {**child_env(), "AIP_DATA_DIR": str(data())}, work), "profiled run")
            prof = {"wall_s": r["wall_s"], **profile_summary(pfile)}
            print(f"profiled run: {r['wall_s']:.2f} s", file=sys.stderr, flush=True)
    finally:
        for p in (sut, judge):
            p.terminate()
            p.wait(10)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    info = {
        **header,
        "benchmark": "bench_phases",
        "latency_ms": args.latency_ms,
        "concurrency": args.concurrency,
        "plain_runs": plain,
        "phases": table,
        "calls": calls,
        "imports_by_package_s": imports,
        "profile": prof,
    }
    med = statistics.median(p["wall_s"] for p in plain) if plain else float("nan")
    wall = table["probe_wall_s"]
    walls, loads = [p["wall_s"] for p in plain], [p["load1"] for p in plain]

    def req(x: dict | None) -> str:
        r = (x or {}).get("requests")
        return f"{r[0]} / {r[1]}" if r and any(r) else ""

    lines = [
        f"# A small run's phases: decision flip on the demo, {args.latency_ms:g} ms endpoints, {args.concurrency} in flight",
        "",
        f"- date: {info['date']}; machine: nproc {info['nproc']}, CPU {info['cpu']}, Python {info['python']}",
        f"- aip_assets {info['version']} at commit {info['commit']}; code: {info['code']}",
        f"- plain runs (no probe): {', '.join(f'{x:.2f}' for x in walls)} s (median {med:.2f}); "
        f"the probed run {wall:.2f} s, CPU {table['probe_cpu_s']:.2f} s; load (1 min) "
        f"{', '.join(f'{x:.1f}' for x in loads)}",
        "",
        "| phase | wall s | CPU s | share of wall | SUT / judge requests |",
        "|---|---:|---:|---:|---:|",
    ]

    def c(x: dict, key: str = "cpu_s") -> str:
        return f"{x[key]:.3f}" if key in x else ""

    for p in table["top"]:
        lines.append(f"| {p['phase']} | {p['s']:.3f} | {c(p)} | {p['s'] / wall:.0%} | {req(p)} |")
        if p["phase"] == "Dagster: the metrics' runs":
            for s in table["stages"]:
                lines.append(
                    f"| &nbsp;&nbsp;stage {s['stage']} | {s['s']:.3f} | {c(s)} | {s['s'] / wall:.0%} | {req(s)} |"
                )
                for label, part in s["parts"].items():
                    if label in IN_STAGE:
                        lines.append(
                            f"| &nbsp;&nbsp;&nbsp;&nbsp;{label} (×{part['n']}) | {part['s']:.3f} | {c(part)} | "
                            f"{part['s'] / wall:.0%} | {req(part)} |"
                        )
                lines.append(
                    f"| &nbsp;&nbsp;&nbsp;&nbsp;rest of the stage | {s['rest_s']:.3f} | {c(s, 'rest_cpu_s')} | "
                    f"{s['rest_s'] / wall:.0%} | |"
                )
            d = table["dagster"]
            if d:
                lines.append(
                    f"| &nbsp;&nbsp;Dagster's own (a metric's run less its stages; the report {d['report written (HTML)']:.3f} s, "
                    f"score metadata {d['score metadata for Dagster (and the report)']:.3f} s and asset checks "
                    f"{d['asset checks']:.3f} s within it) | {d['outside_stages_s']:.3f} | "
                    f"{c(d, 'outside_stages_cpu_s')} | {d['outside_stages_s'] / wall:.0%} | |"
                )
    own = table.get("thread_cpu") or {}
    if own:
        lines += [
            "",
            "CPU of the thread that ran it (the CPU column above counts every thread of the process while the "
            "phase lasts, the Dagster instance opening beside the exam, the journal's writer beside a stage): "
            + "; ".join(f"{label} {v:.3f} s" for label, v in own.items() if v >= 0.005),
        ]
    lines += [
        "",
        "Calls (llm_calls): "
        + "; ".join(f"{c['stage']} {c['role']} {c['calls']} in {c['first_to_last_s']:.2f} s" for c in calls),
    ]
    for k, v in imports.items():
        total = sum(v.values())
        lines.append(
            f"Imports ({'`import aip_assets.cli`' if k == 'cli' else 'the run’s modules'}, -X importtime, {total:.2f} s): "
            + ", ".join(f"{p} {s:.2f}" for p, s in list(v.items())[:8])
        )
    if prof:
        tot = prof["total_s"]
        lines += [
            "",
            f"Profile (cProfile, run {prof['wall_s']:.1f} s): own time by package: "
            + ", ".join(f"{p} {s / tot:.0%}" for p, s in list(prof["own_time_by_package"].items())[:10]),
            "",
            "| aip_assets function (cProfile) | cumulative s | own s | calls |",
            "|---|---:|---:|---:|",
        ]
        for f in prof["top_cumulative_aip_assets"][:15]:
            lines.append(f"| `{f['function']}` | {f['cumulative_s']:.2f} | {f['own_s']:.2f} | {f['calls']} |")
    if table["not_found"]:
        lines += ["", "Not found in this code (phases missing): " + ", ".join(table["not_found"])]
    out = Path(args.out) if args.out else RESULTS / f"phases-{short(header['commit'])}.md"
    write_results(out, lines, info)
    return 0


if __name__ == "__main__":
    sys.exit(main())
