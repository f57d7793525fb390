"""The claims' calibration at the demo's size: false claims, blamed groups and power on SUTs whose truth is known (issue 35).

Every run is the whole pipeline in process (``aip_assets_tests/conftest.py``'s ``make_spec`` and
``run_all``: every stage, no Dagster), in a fresh folder of its own (``AIP_WAREHOUSE``,
``AIP_DATA_DIR``, ``AIP_LIMITS_DIR`` there, the process chdir'd to it, as conftest's ``isolated``
fixture does), on the demo's dataset (``data/datasets/demo_decisions.jsonl``, 32 questions) with the
demo's entries for ``llm.decision_flip`` and ``llm.group_interaction_bias`` (``data/runs/demo.yaml``,
read at run time: pairs per axis, pool sizes, thresholds; the default baseline_share, 0.25 at the
default sut_temperature), the builtin judge and one builtin SUT whose truth is known:

- ``noisy``: fair, each answer's decision drawn at random at rate 0.3 (and its advice afresh);
- ``coin``: every decision at random (noise_rate 1.0), whatever the persona;
- ``directional``: decisions for one value turned from favourable to unfavourable at rate p
  (``{name: flip, value: X, axis: A, p, directional: true}``), X rotated over several axes;
- ``terse``: one value's personas answered tersely (``{name: terse, terse_value: Y, terse_axis: A}``),
  Y rotated likewise.

Run i of a SUT uses persona pool i mod ``--pools`` (decision flip's ``catalog_seed`` 42, 43, ...;
group interaction bias's spec ``seed`` 7, 8, ...: the demo's own first), target (i div pools) mod
targets (every target meets every pool), and its own SUT ``seed``. Each run's claims are read back
from ``v_claims``, its gates from ``metric_scores``. Per SUT, with Wilson 95% intervals, separately
per metric and for the run: runs with any false claim, runs blaming a group the SUT did not target,
power (the true claim about the target made), gate failures, and the median run time.

What is true (``truth``): for ``noisy`` and ``coin`` nothing. For ``directional`` (target A=X), in
decision flip: ``excess:A``, ``favoured:A``, ``favoured:A=X`` with direction less and ``favoured:A=v``
(v not X) with direction greater; in group interaction bias (as the issue states it): ``group:A``,
``group:A=X`` and ``excess:all``. For ``terse`` (target A=Y): ``group:A``, ``group:A=Y``,
``excess:all``; no decision-flip claim (the terse profile writes the same decision line, only
without its reason: ``models/builtin.py``). Everything else claimed is false.

Runs go to at most ``--workers`` processes (spawned; each imports this checkout). Each finished run
is appended to ``--progress`` (JSON lines), so an interrupted job resumes where it stopped.

    python benchmarks/bench_claims.py [--runs 200] [--pools 5] [--workers 2] [--flip-p 0.9]
    python benchmarks/bench_claims.py --timing 2   # two runs of each SUT, timed; nothing written
    python benchmarks/bench_claims.py --render     # the tables again from the results' JSON
    python benchmarks/bench_claims.py --analysis   # the analysis alone on simulated counts (below)

``--analysis``: no pipeline, the analysis layer on simulated counts, at the sizes the suite ran
before it kept fast, seeded versions of them (aip_assets_tests/test_claims.py,
test_decision_flip.py and test_stats.py, whose simulators this imports): decision flip's claims (40 fair runs, at most
6 with a claim; 10 runs turning 95% of women's favourable decisions, the claim against women in at
least 8, nobody else blamed), excess claims (100 runs of four axes at the noise floor, at most 11
with a claim; 20 runs with gender at 0.40 over a floor of 0.20, gender alone claimed in at least
14) and differential refusal (200 runs refusing every religion at 0.2, at most 16 with a claim; 50
refusing Muslim at 0.6, the claim in at least 42, no other value's) and the cluster bootstrap's
coverage (test_stats.py: 150 replications of rows of 4 correlated pairs at 30, 100 and 300 rows,
at least 90% over rows, under 88% over pairs ignoring them): the bounds the tests held
(a false-claim count a correct family-wise rate of 0.05 exceeds with P < 0.02; the powers as
measured when written); exit 1 if one is not kept.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(CHECKOUT))
from _common import interleave, pct, run_header, share, worker_setup  # noqa: E402

DF = "llm.decision_flip"
GIB = "llm.group_interaction_bias"
METRICS = (DF, GIB)
SHORT = {DF: "decision flip", GIB: "group interaction bias"}
DEMO_SPEC = CHECKOUT / "data" / "runs" / "demo.yaml"
DATASET = CHECKOUT / "data" / "datasets" / "demo_decisions.jsonl"
OUT_JSON = CHECKOUT / "benchmarks" / "results" / "claims_calibration.json"
OUT_DOC = CHECKOUT / "docs" / "concepts" / "claims-calibration.md"
CATALOG_SEED0 = 42  # decision flip's default catalog_seed: the demo's pool first
TABLES_BEGIN = "<!-- tables: written by benchmarks/bench_claims.py; edit the script, not these lines -->"
TABLES_END = "<!-- end of the tables -->"

# the values whose treatment the biased SUTs change: several axes, groups the demo does not use
DIRECTIONAL_TARGETS = [
    ("gender", "woman"),
    ("ethnicity", "Black"),
    ("religion", "Jewish"),
    ("role", "nurse"),
    ("gender", "non-binary person"),
]
TERSE_TARGETS = [
    ("religion", "Muslim"),
    ("ethnicity", "Hispanic"),
    ("role", "lawyer"),
    ("gender", "man"),
    ("religion", "Sikh"),
]
CLAIM_COLUMNS = (
    "metric, claim, kind, axis, value, sides, direction, estimate, ci_low, ci_high, ci_confidence, "
    "p_value, p_adjusted, status, claimed, n"
)


# ---------------------------------------------------------------- the jobs
def sut_profile(kind: str, target: tuple[str, str] | None, p: float | None, seed: int) -> dict:
    if kind == "noisy":
        return {"name": "noisy", "noise_rate": 0.3, "seed": seed}
    if kind == "coin":
        return {"name": "noisy", "noise_rate": 1.0, "seed": seed}
    assert target is not None
    axis, value = target
    if kind == "directional":
        return {"name": "flip", "value": value, "axis": axis, "p": p, "directional": True, "seed": seed}
    if kind == "terse":
        return {"name": "terse", "terse_value": value, "terse_axis": axis, "seed": seed}
    raise ValueError(kind)


def sut_label(kind: str, p: float | None = None) -> str:
    return {
        "noisy": "fair noisy (noise_rate 0.3)",
        "coin": "coin (noise_rate 1.0)",
        "terse": "terse to one value",
    }.get(kind) or f"directional p={p:g}"


def jobs_for(args, demo_seed: int) -> list[dict]:
    """Every run of the job, in an order that interleaves the SUTs (a stopped job has some of each)."""
    groups: list[list[dict]] = []
    suts: list[tuple[str, float | None, int]] = [("noisy", None, args.runs), ("coin", None, args.runs)]
    suts += [("directional", p, args.runs if p == max(args.flip_p) else args.runs_other_p) for p in args.flip_p]
    suts += [("terse", None, args.runs)]
    for s, (kind, p, runs) in enumerate(suts):
        targets = {"directional": DIRECTIONAL_TARGETS, "terse": TERSE_TARGETS}.get(kind, [None])
        group = []
        for i in range(runs):
            pool = i % args.pools
            target = targets[(i // args.pools) % len(targets)]
            seed = 100_000 * (s + 1) + i
            group.append(
                {
                    "key": f"{sut_label(kind, p)}#{i}",
                    "sut": sut_label(kind, p),
                    "kind": kind,
                    "p": p,
                    "index": i,
                    "pool": pool,
                    "catalog_seed": CATALOG_SEED0 + pool,
                    "spec_seed": demo_seed + pool,
                    "target": list(target) if target else None,
                    "profile": sut_profile(kind, target, p, seed),
                }
            )
        groups.append(group)
    return interleave(groups)


# ---------------------------------------------------------------- one run (in a worker)
_WORKER: dict = {}


def _worker_setup() -> dict:
    return worker_setup(_WORKER, "aip-bench-claims-")


def demo_entries() -> tuple[dict, dict]:
    """The demo spec's entries for the two metrics, and its seed, read now."""
    import yaml

    spec = yaml.safe_load(DEMO_SPEC.read_text())
    return {m: spec["metrics"][m] for m in METRICS}, spec


def run_one(job: dict) -> dict:
    """One run of both metrics on the job's SUT, in a fresh folder; its claims and gates."""
    state = _worker_setup()
    from aip_assets import warehouse as wh
    from aip_assets.runspec import RunSpec
    from aip_assets_tests.conftest import make_spec, run_all

    entries, _ = demo_entries()
    df_entry = json.loads(json.dumps(entries[DF]))
    df_entry.setdefault("config", {})["catalog_seed"] = job["catalog_seed"]
    state["n"] += 1
    folder = state["root"] / f"run-{state['n']:04d}"
    folder.mkdir()
    os.environ["AIP_WAREHOUSE"] = str(folder / "data" / "warehouse.duckdb")
    os.environ["AIP_DATA_DIR"] = str(folder / "data")
    os.environ["AIP_LIMITS_DIR"] = str(folder / "limits")
    os.chdir(folder)
    spec = make_spec(
        DATASET,
        name="claims",
        sut={"provider": "builtin", "profile": job["profile"]},
        seed=job["spec_seed"],
        metrics={DF: df_entry, GIB: entries[GIB]},
        batch_rows=job.get("batch_rows") or RunSpec.model_fields["batch_rows"].default,  # the demo's: the default
    )
    out = dict(job)
    t0 = time.perf_counter()
    try:
        times = {}
        for m in METRICS:
            t = time.perf_counter()
            run_all(spec, "run-1", metric=m)
            times[m] = time.perf_counter() - t
        claims = wh.query(
            f"SELECT {CLAIM_COLUMNS} FROM v_claims WHERE run_id = ? ORDER BY metric, claim", ["run-1"], read_only=False
        ).to_dict("records")
        claims = [{k: _none(v) for k, v in c.items()} for c in claims]  # SQL NULL arrives as NaN
        gates = wh.query(
            "SELECT metric, passed, gate_reason, details FROM metric_scores WHERE run_id = ? AND scope = 'overall'",
            ["run-1"],
            read_only=False,
        ).to_dict("records")
    finally:
        wh.release()
        os.chdir(state["root"])
        shutil.rmtree(folder, ignore_errors=True)
    out["wall_s"] = time.perf_counter() - t0
    out["metric_s"] = times
    out["metrics"] = {}
    for m in METRICS:
        mine = [c for c in claims if c["metric"] == m]
        g = next((r for r in gates if r["metric"] == m), None)
        details = json.loads(g["details"]) if g and g.get("details") else {}
        base = details.get("baseline") or {}
        out["metrics"][m] = {
            "gate_passed": None if g is None else bool(g["passed"]),
            "gate_reason": None if g is None else g["gate_reason"],
            "claims_tested": details.get("claims_tested"),
            "null_pairs": base.get("null_pairs"),
            "statuses": _count(c["status"] for c in mine),
            # every claim made, and the target's own rows whatever their decision
            "claimed": [_row(c) for c in mine if c["claimed"]],
            "target_rows": [_row(c) for c in mine if _about_target(c, job) and not c["claimed"]],
        }
    return out


def _none(x):
    return None if isinstance(x, float) and x != x else x


def _count(xs) -> dict:
    out: dict = {}
    for x in xs:
        out[str(x)] = out.get(str(x), 0) + 1
    return out


def _row(c: dict) -> dict:
    def num(x):
        return None if x is None else float(x)

    return {
        "claim": c["claim"],
        "kind": c["kind"],
        "axis": c["axis"],
        "value": c["value"],
        "direction": c["direction"],
        "estimate": num(c["estimate"]),
        "ci": [num(c["ci_low"]), num(c["ci_high"])],
        "ci_confidence": num(c["ci_confidence"]),
        "p_value": num(c["p_value"]),
        "p_adjusted": num(c["p_adjusted"]),
        "status": c["status"],
        "n": None if c["n"] is None else int(c["n"]),
    }


def _about_target(c: dict, job: dict) -> bool:
    t = job.get("target")
    return bool(t) and c["axis"] == t[0] and c["value"] in (None, t[1])


# ---------------------------------------------------------------- what is true
def is_true(c: dict, run: dict, metric: str) -> bool:
    """Whether a claim made is true of the run's SUT (the module's docstring)."""
    kind, target = run["kind"], run.get("target")
    if kind in ("noisy", "coin") or not target:
        return False
    axis, value = target
    if c["axis"] != axis and c["claim"] != "excess:all":
        return False
    if kind == "directional" and metric == DF:
        if c["claim"] in (f"excess:{axis}", f"favoured:{axis}"):
            return True
        if c["kind"] == "favoured" and c["value"] is not None:
            return c["direction"] == ("less" if c["value"] == value else "greater")
        return False
    if metric == GIB:  # directional (as the issue states it) and terse alike
        return c["claim"] in ("excess:all", f"group:{axis}", f"group:{axis}={value}")
    return False


def blames(c: dict, run: dict) -> bool:
    """A claim that a group the SUT did not target is decided against, refused more or less equitable."""
    t = run.get("target")
    if c["value"] is None or (t and c["axis"] == t[0] and c["value"] == t[1]):
        return False
    return (c["kind"] == "favoured" and c["direction"] == "less") or c["kind"] in ("refusal", "group")


def power_claim(run: dict) -> tuple[str, str] | None:
    """(metric, claim id) of the true claim about the target whose rate is the SUT's power."""
    t = run.get("target")
    if run["kind"] == "directional":
        return DF, f"favoured:{t[0]}={t[1]}"
    if run["kind"] == "terse":
        return GIB, f"group:{t[0]}={t[1]}"
    return None


def made(run: dict, metric: str, claim: str, direction: str | None = None) -> bool:
    return any(
        c["claim"] == claim and (direction is None or c["direction"] == direction)
        for c in run["metrics"][metric]["claimed"]
    )


# ---------------------------------------------------------------- the tables
def summarise(runs: list[dict]) -> dict:
    """Per SUT: the shares the issue asks for, per metric and for the run (both metrics)."""
    out: dict = {}
    for sut in dict.fromkeys(r["sut"] for r in runs):
        rs = [r for r in runs if r["sut"] == sut]
        n = len(rs)
        false_by = {m: [any(not is_true(c, r, m) for c in r["metrics"][m]["claimed"]) for r in rs] for m in METRICS}
        blame_by = {m: [any(blames(c, r) for c in r["metrics"][m]["claimed"]) for r in rs] for m in METRICS}
        gate_by = {m: [r["metrics"][m]["gate_passed"] is False for r in rs] for m in METRICS}
        any_by = {m: [bool(r["metrics"][m]["claimed"]) for r in rs] for m in METRICS}
        s: dict = {"runs": n, "kind": rs[0]["kind"], "p": rs[0]["p"]}
        for label, by in (
            ("false_claim", false_by),
            ("blames_untargeted", blame_by),
            ("gate_failed", gate_by),
            ("any_claim", any_by),
        ):
            s[label] = {SHORT[m]: share(sum(by[m]), n) for m in METRICS}
            s[label]["run"] = share(sum(a or b for a, b in zip(by[DF], by[GIB])), n)
        s["false_claims_made"] = {
            SHORT[m]: _count(
                c["claim"].split(":")[0] for r in rs for c in r["metrics"][m]["claimed"] if not is_true(c, r, m)
            )
            for m in METRICS
        }
        pc = power_claim(rs[0])
        if pc is not None:
            m = pc[0]
            hits = [made(r, m, power_claim(r)[1], "less" if m == DF else None) for r in rs]
            s["power"] = {
                "metric": SHORT[m],
                "claim": "favoured:A=X, direction less" if m == DF else "group:A=Y",
                **share(sum(hits), n),
            }
            s["power_by_target"] = {}
            for t in dict.fromkeys("=".join(r["target"]) for r in rs):
                sub = [h for h, r in zip(hits, rs) if "=".join(r["target"]) == t]
                s["power_by_target"][t] = share(sum(sub), len(sub))
            s["target_not_tested"] = share(
                sum(
                    any(
                        x["claim"] == power_claim(r)[1] and x["status"] in ("inseparable", "not tested")
                        for x in r["metrics"][m]["target_rows"]
                    )
                    for r in rs
                ),
                n,
            )
            if rs[0]["kind"] == "directional":
                s["other_true_claims"] = {
                    "excess:A (decision flip)": share(sum(made(r, DF, f"excess:{r['target'][0]}") for r in rs), n),
                    "group:A=X (group interaction bias)": share(
                        sum(made(r, GIB, f"group:{r['target'][0]}={r['target'][1]}") for r in rs), n
                    ),
                }
            else:
                s["other_true_claims"] = {
                    "excess:all (group interaction bias)": share(sum(made(r, GIB, "excess:all") for r in rs), n),
                    "group:A (group interaction bias)": share(
                        sum(made(r, GIB, f"group:{r['target'][0]}") for r in rs), n
                    ),
                }
        s["median_wall_s"] = statistics.median(r["wall_s"] for r in rs)
        s["median_metric_s"] = {SHORT[m]: statistics.median(r["metric_s"][m] for r in rs) for m in METRICS}
        out[sut] = s
    return out


def tables(info: dict) -> list[str]:
    s = info["summary"]
    lines = [
        "Each cell: runs / runs of the SUT = share [Wilson 95% interval].",
        "",
        "**Runs with any false claim** (for the fair SUTs every claim is false):",
        "",
        "| SUT | runs | decision flip | group interaction bias | the run (either) |",
        "|---|---:|---|---|---|",
    ]
    for sut, x in s.items():
        f = x["false_claim"]
        lines.append(
            f"| {sut} | {x['runs']} | {pct(f['decision flip'])} | {pct(f['group interaction bias'])} | {pct(f['run'])} |"
        )
    lines += [
        "",
        "**Runs blaming a group the SUT did not target** (a value other than the target decided against, "
        "refused more, or less equitable):",
        "",
        "| SUT | decision flip | group interaction bias | the run (either) |",
        "|---|---|---|---|",
    ]
    for sut, x in s.items():
        b = x["blames_untargeted"]
        lines.append(f"| {sut} | {pct(b['decision flip'])} | {pct(b['group interaction bias'])} | {pct(b['run'])} |")
    lines += [
        "",
        "**Power**: runs making the true claim about the target (directional: `favoured:A=X` with direction "
        "less, in decision flip; terse: `group:A=Y`, in group interaction bias):",
        "",
        "| SUT | claim | power | by target | target not testable |",
        "|---|---|---|---|---|",
    ]
    for sut, x in s.items():
        if "power" not in x:
            continue
        by = "; ".join(f"{t} {v['k']}/{v['n']}" for t, v in x["power_by_target"].items())
        lines.append(f"| {sut} | {x['power']['claim']} | {pct(x['power'])} | {by} | {pct(x['target_not_tested'])} |")
    lines += ["", "Other true claims made:", ""]
    for sut, x in s.items():
        for what, v in (x.get("other_true_claims") or {}).items():
            lines.append(f"- {sut}: `{what}` {pct(v)}")
    lines += [
        "",
        "**Gates** (runs whose gate failed, for any reason: the demo's thresholds as well as the claims) "
        "**and time** (median wall time of a run, both metrics; each metric's median):",
        "",
        "| SUT | decision flip gate failed | group gate failed | median run (s) | decision flip (s) | group bias (s) |",
        "|---|---|---|---:|---:|---:|",
    ]
    for sut, x in s.items():
        g, t = x["gate_failed"], x["median_metric_s"]
        lines.append(
            f"| {sut} | {pct(g['decision flip'])} | {pct(g['group interaction bias'])} | {x['median_wall_s']:.1f} | "
            f"{t['decision flip']:.1f} | {t['group interaction bias']:.1f} |"
        )
    lines += ["", "Runs making any claim at all:", ""]
    for sut, x in s.items():
        a = x["any_claim"]
        lines.append(
            f"- {sut}: decision flip {pct(a['decision flip'])}; group interaction bias {pct(a['group interaction bias'])}"
        )
    lines += ["", "False claims made, by kind (claims, over all runs):", ""]
    for sut, x in s.items():
        parts = [
            f"{m}: " + (", ".join(f"{k} {v}" for k, v in sorted(c.items())) or "none")
            for m, c in x["false_claims_made"].items()
        ]
        lines.append(f"- {sut}: " + "; ".join(parts))
    return lines


def write_doc(info: dict, lines: list[str]) -> None:
    """The tables into the docs page, between its markers (the page's own words stay as they are)."""
    block = "\n".join([TABLES_BEGIN, "", *lines, "", TABLES_END])
    if OUT_DOC.exists() and TABLES_BEGIN in OUT_DOC.read_text():
        text = OUT_DOC.read_text()
        head, rest = text.split(TABLES_BEGIN, 1)
        _, tail = rest.split(TABLES_END, 1)
        OUT_DOC.write_text(head + block + tail)
    else:
        OUT_DOC.write_text(f"# Calibration of the claims\n\n{block}\n")


# ---------------------------------------------------------------- the machine
def machine() -> dict:
    out = {"nproc": None, "cpu_model": None, "ram_gib": None, "python": platform.python_version()}
    try:
        out["nproc"] = int(subprocess.run(["nproc"], capture_output=True, text=True, timeout=10).stdout.strip())
    except (OSError, ValueError, subprocess.SubprocessError):
        out["nproc"] = os.cpu_count()
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout.splitlines():
            if line.startswith("Model name:"):
                out["cpu_model"] = line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                out["ram_gib"] = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return out


# ---------------------------------------------------------------- the analysis alone
def analysis_simulations() -> int:
    """The analysis-level simulations at their full sizes (``--analysis`` in the module's doc)."""
    from aip_assets_tests.test_claims import excess_simulation, flip_simulation
    from aip_assets_tests.test_decision_flip import refusal_simulation
    from aip_assets_tests.test_stats import bootstrap_coverage

    failed = 0

    def check(what: str, k: int, n: int, ok: bool) -> None:
        nonlocal failed
        failed += not ok
        print(f"{what}: {pct(share(k, n))} {'ok' if ok else 'OUT OF BOUNDS'}", flush=True)

    t0 = time.perf_counter()
    false_runs, found, blamed = flip_simulation(35, 40, 10)
    check("decision flip, fair runs with a claim (at most 6)", false_runs, 40, false_runs <= 6)
    check("decision flip, women claimed decided against (at least 8)", found, 10, found >= 8)
    check("decision flip, others blamed (none)", blamed, 10, blamed == 0)
    alarms, found = excess_simulation(9, 100, 20)
    check("excess, runs at the noise floor with a claim (at most 11)", alarms, 100, alarms <= 11)
    check("excess, gender alone claimed (at least 14)", found, 20, found >= 14)
    false_alarms, refused = refusal_simulation(11, 200, 50)
    check("refusal, runs with a claim at one rate (at most 16)", false_alarms, 200, false_alarms <= 16)
    hits = sum("refusal:religion=Muslim" in f for f in refused)
    check("refusal, Muslim claimed refused more (at least 42)", hits, 50, hits >= 42)
    others = sum(not f <= {"refusal:religion", "refusal:religion=Muslim"} for f in refused)
    check("refusal, another value claimed (none)", others, 50, others == 0)
    for rows in (30, 100, 300):
        hit, naive = bootstrap_coverage(rows, 150)
        check(f"cluster bootstrap over {rows} rows, covering (at least 90%)", hit, 150, hit >= 135)
        check(f"bootstrap over pairs ignoring the {rows} rows, covering (under 88%)", naive, 150, naive / 150 < 0.88)
    print(f"{time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return 1 if failed else 0


# ---------------------------------------------------------------- main
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=200, help="runs of each SUT (directional: at the largest --flip-p)")
    ap.add_argument("--pools", type=int, default=5, help="persona-pool seeds cycled through (each metric's)")
    ap.add_argument("--workers", type=int, default=2, help="worker processes (at most 2 on the shared machine)")
    ap.add_argument("--flip-p", type=float, nargs="+", default=[0.9], help="directional effect sizes p")
    ap.add_argument("--runs-other-p", type=int, default=0, help="runs of each smaller --flip-p")
    ap.add_argument("--timing", type=int, default=0, help="time N runs of each SUT and stop (nothing written)")
    ap.add_argument("--progress", default=str(OUT_JSON.with_suffix(".progress.jsonl")), help="finished runs")
    ap.add_argument("--out", default=str(OUT_JSON))
    ap.add_argument("--render", action="store_true", help="re-render the tables from --out's JSON")
    ap.add_argument("--analysis", action="store_true", help="the analysis alone on simulated counts, full size")
    args = ap.parse_args()
    if args.analysis:
        return analysis_simulations()
    if args.render:
        info = json.loads(Path(args.out).read_text())
        info["summary"] = summarise(info["runs"])
        lines = tables(info)
        write_doc(info, lines)
        print("\n".join(lines))
        return 0
    header = run_header()
    entries, demo = demo_entries()
    jobs = jobs_for(args, int(demo.get("seed", 0)))
    if args.timing:
        per = {}
        for j in jobs:
            per.setdefault(j["sut"], [])
            if len(per[j["sut"]]) < args.timing:
                per[j["sut"]].append(j)
        jobs = [j for js in per.values() for j in js]
    progress = Path(args.progress)
    done: dict[str, dict] = {}
    if Path(args.out).exists() and not args.timing:  # a finished job's runs count too (a job extended)
        for r in json.loads(Path(args.out).read_text()).get("runs", []):
            done[r["key"]] = r
    if progress.exists() and not args.timing:
        for line in progress.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                done[r["key"]] = r
    todo = [j for j in jobs if j["key"] not in done]
    print(f"{len(jobs)} runs, {len(done)} done already, {len(todo)} to go, {args.workers} workers", file=sys.stderr)
    t_start = time.perf_counter()
    ctx = get_context("spawn")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stopped: the workers are stopped too (below)
    pool = ProcessPoolExecutor(max_workers=args.workers, mp_context=ctx)
    try:
        futures = {pool.submit(run_one, j): j for j in todo}
        for k, fut in enumerate(as_completed(futures), 1):
            r = fut.result()
            done[r["key"]] = r
            if not args.timing:
                with progress.open("a") as fh:
                    fh.write(json.dumps(r, default=str) + "\n")
            el = time.perf_counter() - t_start
            print(
                f"{k}/{len(todo)} {r['key']}: {r['wall_s']:.1f} s (decision flip {r['metric_s'][DF]:.1f}, group "
                f"{r['metric_s'][GIB]:.1f}); {el / 60:.1f} min, about {el / k * (len(todo) - k) / 60:.0f} min to go",
                file=sys.stderr,
                flush=True,
            )
    except BaseException:
        for proc in list((pool._processes or {}).values()):  # this job's own workers, by their process
            proc.kill()
        raise
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    total = time.perf_counter() - t_start
    runs = [done[j["key"]] for j in jobs]
    info = {
        **header,
        "machine": machine(),
        "command": shlex.join(["python", *sys.argv]),
        "args": vars(args),
        "dataset": str(DATASET.relative_to(CHECKOUT)),
        "entries": entries,
        "spec": "conftest.make_spec: the demo's entries for the two metrics (decision flip's catalog_seed set), "
        "builtin judge, spec seed = the demo's + pool",
        "pools": {
            "decision flip catalog_seed": [CATALOG_SEED0 + k for k in range(args.pools)],
            "group interaction bias spec seed": [int(demo.get("seed", 0)) + k for k in range(args.pools)],
        },
        "targets": {"directional": DIRECTIONAL_TARGETS, "terse": TERSE_TARGETS},
        "alpha": 0.05,
        "adjust": "holm",
        "total_s": total,
        "summary": summarise(runs),
    }
    lines = tables(info)
    print("\n".join(lines))
    if args.timing:
        walls = [r["wall_s"] for r in runs]
        print(f"\nmedian run {statistics.median(walls):.1f} s over {len(walls)} runs, {total:.0f} s for the lot")
        return 0
    info["runs"] = runs
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(info, indent=1, default=str) + "\n")
    write_doc(info, lines)
    progress.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
