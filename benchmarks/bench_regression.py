"""The regression check's calibration (issue 38): false regressions and power over chains of runs whose truth is known.

Every run is the whole pipeline in process (``aip_assets_tests/conftest.py``'s ``make_spec`` and
``run_all``: every stage, no Dagster, so every aggregation ends with ``history.check_regression``),
on the demo's dataset (``data/datasets/demo_decisions.jsonl``, 32 questions), metric
``llm.decision_flip`` alone (``--pairs`` pairs per axis, the four axes, ``catalog_seed`` 42 + chain
mod 5: five persona pools; the spec's seed 3, so every run of a chain asks the same probes), the
builtin judge, ``claims.alpha`` 0.05 (one metric: the check spends all of it, Holm over the
overall score and the four axes' flip rates).

A *chain* is one warehouse and one spec (``regress``): runs r00, r01, ... in order, each compared
by the pipeline with the one before (``regressions`` rows, read back with ``history.stored``), so
L runs give L - 1 comparisons. Every run has its own SUT ``seed``: the same truth, fresh draws.

- ``none``: every run the fair noisy SUT (``{name: noisy, noise_rate: --noise}``). Every comparison
  is a null: any worse row is a false regression, any significant row a false change.
- ``woman p=P`` (``--targeted P``; ``woman p=P, noise N`` with ``P@N``: another noise_rate for
  both kinds of run): runs alternate baseline (as in ``none``) and targeted (the same noise plus a
  directional flip against women: ``{name: custom, noise_rate, value: woman, axis: gender, p: P,
  directional: true}``), baseline first. Baseline → targeted: the gender axis's flip rate rose and
  the overall score fell (both true); a worse row on another axis (ethnicity, religion, role) is a
  false regression. Power: the gender axis reported worse (and: gender or overall worse).
  Targeted → baseline: an improvement; any worse row is a false regression (counted apart).

Per scenario, with Wilson 95% intervals: comparisons, the share with a false regression, with any
significant row (none), power, and the median wall time of a run (all its stages and the check).

Chains go to at most ``--workers`` processes (spawned; each imports this checkout). Each finished
chain is appended to ``--progress`` (JSON lines), so an interrupted job resumes where it stopped.

    python benchmarks/bench_regression.py [--chains-none 10] [--chains-woman 10] [--length 21] [--targeted 0.9 0.9@0.05] [--workers 2]
    python benchmarks/bench_regression.py --timing   # one short chain of each scenario, timed; nothing written
    python benchmarks/bench_regression.py --render   # the table again from the results' JSON
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import statistics
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
DATASET = CHECKOUT / "data" / "datasets" / "demo_decisions.jsonl"
OUT_JSON = CHECKOUT / "benchmarks" / "results" / "regression.json"
CATALOG_SEED0 = 42  # decision flip's default catalog_seed
POOLS = 5
TARGET = ("gender", "woman")


# ---------------------------------------------------------------- the jobs
def profile(noise: float, p: float | None, seed: int) -> dict:
    """The baseline (p None: fair, noisy) or targeted (a directional flip against women at p) SUT."""
    if p is None:
        return {"name": "noisy", "noise_rate": noise, "seed": seed}
    axis, value = TARGET
    return {
        "name": "custom",
        "noise_rate": noise,
        "value": value,
        "axis": axis,
        "p": p,
        "directional": True,
        "seed": seed,
    }


def scenarios(args) -> list[tuple[str, float | None, float, int]]:
    """(label, p, noise, chains): ``none`` first, then each ``--targeted`` P[@NOISE]."""
    out: list[tuple[str, float | None, float, int]] = [("none", None, args.noise, args.chains_none)]
    for t in args.targeted:
        p, _, noise = t.partition("@")
        n = float(noise) if noise else args.noise
        label = f"woman p={float(p):g}" + ("" if n == args.noise else f", noise {n:g}")
        out.append((label, float(p), n, args.chains_woman))
    return out


def jobs_for(args) -> list[dict]:
    """One job a chain; the scenarios' chains interleaved, so a stopped job has some of each."""
    groups = []
    for s, (label, p, noise, n) in enumerate(scenarios(args)):
        group = []
        for c in range(n):
            runs = []
            for i in range(args.length):
                targeted = p is not None and i % 2 == 1
                seed = 1_000_000 * (s + 1) + 1_000 * c + i
                runs.append(
                    {
                        "run_id": f"r{i:02d}",
                        "targeted": targeted,
                        "profile": profile(noise, p if targeted else None, seed),
                    }
                )
            group.append(
                {
                    "key": f"{label}#{c}",
                    "scenario": label,
                    "p": p,
                    "chain": c,
                    "catalog_seed": CATALOG_SEED0 + c % POOLS,
                    "pairs": args.pairs,
                    "noise": noise,
                    "runs": runs,
                }
            )
        groups.append(group)
    return interleave(groups)


# ---------------------------------------------------------------- one chain (in a worker)
_WORKER: dict = {}


def _worker_setup() -> dict:
    return worker_setup(_WORKER, "aip-bench-regression-")


def _none(x):
    if x is None:
        return None
    try:
        if x != x:  # NaN, pd.NA
            return None
    except TypeError:
        return None
    return x


def run_chain(job: dict) -> dict:
    """The chain's runs in one fresh warehouse; each run's regression rows (kind score) and drift."""
    state = _worker_setup()
    from aip_assets import history
    from aip_assets import warehouse as wh
    from aip_assets_tests.conftest import make_spec, run_all

    state["n"] += 1
    folder = state["root"] / f"chain-{state['n']:03d}"
    folder.mkdir()
    os.environ["AIP_WAREHOUSE"] = str(folder / "data" / "warehouse.duckdb")
    os.environ["AIP_DATA_DIR"] = str(folder / "data")
    os.environ["AIP_LIMITS_DIR"] = str(folder / "limits")
    os.chdir(folder)
    config = {"num_pairs_per_dimension": job["pairs"], "catalog_seed": job["catalog_seed"]}
    out = {k: v for k, v in job.items() if k != "runs"}
    out["runs"] = []
    try:
        for run in job["runs"]:
            spec = make_spec(
                DATASET, name="regress", sut={"provider": "builtin", "profile": run["profile"]}, config=config
            )
            t0 = time.perf_counter()
            run_all(spec, run["run_id"])
            wall = time.perf_counter() - t0
            rows = history.stored(run["run_id"], DF).to_dict("records")
            scored, drift = [], {}
            prev = None
            for r in rows:
                prev = r.get("previous_run") or prev
                if r["kind"] == "score":
                    scored.append(
                        {
                            "scope": r["scope"],
                            "group_key": r["group_key"],
                            "score_a": _num(r["score_a"]),
                            "score_b": _num(r["score_b"]),
                            "n_a": _int(r["n_a"]),
                            "n_b": _int(r["n_b"]),
                            "diff": _num(r["diff"]),
                            "p_value": _num(r["p_value"]),
                            "p_adjusted": _num(r["p_adjusted"]),
                            "significant": bool(r["significant"]),
                            "worse": bool(r["worse"]),
                        }
                    )
                elif r["kind"] == "drift" and r["scope"] == "decisions":
                    drift = {"decisions_changed": _num(r["score_b"])}
            out["runs"].append(
                {
                    "run_id": run["run_id"],
                    "targeted": run["targeted"],
                    "seed": run["profile"]["seed"],
                    "previous_run": prev,
                    "wall_s": wall,
                    "rows": scored,
                    **drift,
                }
            )
    finally:
        wh.release()
        os.chdir(state["root"])
        shutil.rmtree(folder, ignore_errors=True)
    return out


def _num(x):
    x = _none(x)
    return None if x is None else float(x)


def _int(x):
    x = _none(x)
    return None if x is None else int(x)


# ---------------------------------------------------------------- what is true
def comparisons(chain: dict) -> list[dict]:
    """The chain's comparisons: each run after the first against the one before, with its kind
    (null, onset: baseline → targeted, recovery: targeted → baseline)."""
    out = []
    runs = chain["runs"]
    for before, after in zip(runs, runs[1:]):
        if not before["targeted"] and not after["targeted"]:
            kind = "null"
        elif after["targeted"] and not before["targeted"]:
            kind = "onset"
        elif before["targeted"] and not after["targeted"]:
            kind = "recovery"
        else:
            kind = "both targeted"
        out.append({"kind": kind, "previous": before["run_id"], **after})
    return out


def false_worse(c: dict) -> bool:
    """A worse row that is not true: in an onset, one other than the gender axis and the overall score."""
    for r in c["rows"]:
        if not r["worse"]:
            continue
        if c["kind"] == "onset" and (r["scope"] == "overall" or r["group_key"] == TARGET[0]):
            continue
        return True
    return False


def worse(c: dict, scope: str, key: str) -> bool:
    return any(r["worse"] and r["scope"] == scope and r["group_key"] == key for r in c["rows"])


def better(c: dict, scope: str, key: str) -> bool:
    return any(r["significant"] and not r["worse"] and r["scope"] == scope and r["group_key"] == key for r in c["rows"])


# ---------------------------------------------------------------- the table
def summarise(chains: list[dict]) -> dict:
    out: dict = {}
    for scen in dict.fromkeys(c["scenario"] for c in chains):
        cs = [c for c in chains if c["scenario"] == scen]
        comps = [x for c in cs for x in comparisons(c)]
        walls = [r["wall_s"] for c in cs for r in c["runs"]]
        s: dict = {"chains": len(cs), "runs": len(walls), "p": cs[0]["p"], "median_wall_s": statistics.median(walls)}
        s["median_wall_s_first_run"] = statistics.median(c["runs"][0]["wall_s"] for c in cs)
        s["median_wall_s_last_run"] = statistics.median(c["runs"][-1]["wall_s"] for c in cs)
        for kind in dict.fromkeys(x["kind"] for x in comps):
            xs = [x for x in comps if x["kind"] == kind]
            n = len(xs)
            k: dict = {
                "comparisons": n,
                "false_regression": share(sum(false_worse(x) for x in xs), n),
                "any_significant": share(sum(any(r["significant"] for r in x["rows"]) for x in xs), n),
                "worse_rows": _count(
                    r["group_key"] if r["scope"] != "overall" else "overall"
                    for x in xs
                    for r in x["rows"]
                    if r["worse"]
                ),
                "significant_rows": _count(
                    r["group_key"] if r["scope"] != "overall" else "overall"
                    for x in xs
                    for r in x["rows"]
                    if r["significant"]
                ),
                "not_compared": sum(not x["rows"] for x in xs),
                "median_decisions_changed": statistics.median(
                    x["decisions_changed"] for x in xs if x.get("decisions_changed") is not None
                )
                if any(x.get("decisions_changed") is not None for x in xs)
                else None,
            }
            if kind == "onset":
                k["power_gender"] = share(sum(worse(x, "axis", TARGET[0]) for x in xs), n)
                k["power_overall"] = share(sum(worse(x, "overall", "all") for x in xs), n)
                k["power_either"] = share(sum(worse(x, "axis", TARGET[0]) or worse(x, "overall", "all") for x in xs), n)
                k["gender_rate"] = {
                    "before": statistics.mean(_rate(x, "score_a") for x in xs),
                    "after": statistics.mean(_rate(x, "score_b") for x in xs),
                }
            if kind == "recovery":
                k["improvement_gender"] = share(sum(better(x, "axis", TARGET[0]) for x in xs), n)
            s[kind] = k
        if all(not r["targeted"] for c in cs for r in c["runs"]):
            s["dispersion"] = dispersion(cs)
        out[scen] = s
    return out


def dispersion(chains: list[dict]) -> dict:
    """Per compared row: the variance of its figure over a chain's runs (the same probes, fresh
    draws) over the binomial variance the two-proportion test assumes, averaged over chains (the
    design effect; the overall score's bootstrap resamples questions, so it is shown for scale)."""
    out: dict = {}
    keys = dict.fromkeys(r["group_key"] for c in chains for run in c["runs"] for r in run["rows"])
    for key in keys:
        ratios = []
        for c in chains:
            xs = [(r["score_b"], r["n_b"]) for run in c["runs"] for r in run["rows"] if r["group_key"] == key]
            xs = [(v, n) for v, n in xs if v is not None and n]
            if len(xs) < 3:
                continue
            m = statistics.mean(v for v, _ in xs)
            binom = m * (1 - m) / statistics.mean(n for _, n in xs)
            if binom > 0:
                ratios.append(statistics.variance([v for v, _ in xs]) / binom)
        if ratios:
            out[key] = {"design_effect": statistics.mean(ratios), "chains": len(ratios)}
    return out


def _rate(x: dict, which: str) -> float:
    return next(r[which] for r in x["rows"] if r["scope"] == "axis" and r["group_key"] == TARGET[0])


def _count(xs) -> dict:
    out: dict = {}
    for x in xs:
        out[str(x)] = out.get(str(x), 0) + 1
    return dict(sorted(out.items()))


def tables(info: dict) -> list[str]:
    s = info["summary"]
    lines = [
        "| scenario | comparison | comparisons | false regression | any significant row | power: gender worse | "
        "power: gender or overall worse | median run (s) |",
        "|---|---|---:|---|---|---|---|---:|",
    ]
    label = {
        "null": "baseline → baseline",
        "onset": "baseline → targeted",
        "recovery": "targeted → baseline",
    }
    for scen, x in s.items():
        for kind in ("null", "onset", "recovery"):
            if kind not in x:
                continue
            k = x[kind]
            sig = pct(k["any_significant"]) if kind == "null" else "–"
            pw = pct(k.get("power_gender")) if kind == "onset" else "–"
            pe = pct(k.get("power_either")) if kind == "onset" else "–"
            lines.append(
                f"| {scen} | {label[kind]} | {k['comparisons']} | {pct(k['false_regression'])} | {sig} | {pw} | {pe} | "
                f"{x['median_wall_s']:.1f} |"
            )
    lines += ["", "Rows reported worse, by row (over all comparisons of the kind):", ""]
    for scen, x in s.items():
        for kind in ("null", "onset", "recovery"):
            if kind in x:
                k = x[kind]
                w = ", ".join(f"{g} {n}" for g, n in k["worse_rows"].items()) or "none"
                extra = ""
                if kind == "onset":
                    g = k["gender_rate"]
                    extra = (
                        f"; mean gender flip rate {g['before']:.3f} → {g['after']:.3f}; overall worse "
                        f"{pct(k['power_overall'])}"
                    )
                if kind == "recovery":
                    extra = f"; gender reported better {pct(k['improvement_gender'])}"
                lines.append(f"- {scen}, {label[kind]}: {w}{extra}")
    for scen, x in s.items():
        if x.get("dispersion"):
            d = ", ".join(f"{k} {v['design_effect']:.2f}" for k, v in x["dispersion"].items())
            lines += ["", f"Variance of each figure over a chain's runs / the binomial variance ({scen}): {d}."]
    return lines


def write_json(out: Path, info: dict) -> None:
    """The results: everything but the chains indented, each chain on one line (floats to 6 digits)."""

    def short(x):
        if isinstance(x, float):
            return float(f"{x:.6g}")
        if isinstance(x, dict):
            return {k: short(v) for k, v in x.items()}
        if isinstance(x, list):
            return [short(v) for v in x]
        return x

    head = json.dumps({k: v for k, v in info.items() if k != "chains"}, indent=1, default=str)
    chains = ",\n".join("  " + json.dumps(short(c), default=str) for c in info.get("chains", []))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(head[:-2] + ',\n "chains": [\n' + chains + "\n ]\n}\n")


# ---------------------------------------------------------------- main
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chains-none", type=int, default=10, help="chains of the fair noisy SUT")
    ap.add_argument("--chains-woman", type=int, default=10, help="alternating chains of each --targeted")
    ap.add_argument("--length", type=int, default=21, help="runs a chain (length - 1 comparisons)")
    ap.add_argument(
        "--targeted",
        nargs="*",
        default=["0.9", "0.9@0.05"],
        help="alternating scenarios, each P[@NOISE]: a directional flip against women at P (noise_rate NOISE, "
        "default --noise)",
    )
    ap.add_argument("--noise", type=float, default=0.2, help="the null's (and by default every SUT's) noise_rate")
    ap.add_argument("--pairs", type=int, default=4, help="decision flip's num_pairs_per_dimension")
    ap.add_argument("--workers", type=int, default=2, help="worker processes (at most 2 on the shared machine)")
    ap.add_argument("--timing", action="store_true", help="one chain of 3 runs a scenario, timed; nothing written")
    ap.add_argument("--progress", default=str(OUT_JSON.with_suffix(".progress.jsonl")), help="finished chains")
    ap.add_argument("--out", default=str(OUT_JSON))
    ap.add_argument("--render", action="store_true", help="the table again from --out's JSON")
    args = ap.parse_args()
    if args.render:
        info = json.loads(Path(args.out).read_text())
        info["summary"] = summarise(info["chains"])
        write_json(Path(args.out), info)
        print("\n".join(tables(info)))
        return 0
    if args.timing:
        args.chains_none, args.chains_woman, args.length = 1, 1, 3
    header = run_header()
    jobs = jobs_for(args)
    progress = Path(args.progress)
    done: dict[str, dict] = {}
    if progress.exists() and not args.timing:
        for line in progress.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                done[r["key"]] = r
    todo = [j for j in jobs if j["key"] not in done]
    print(
        f"{len(jobs)} chains of {args.length} runs, {len(done)} done already, {len(todo)} to go, {args.workers} workers",
        file=sys.stderr,
    )
    t_start = time.perf_counter()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stopped: the workers are stopped too (below)
    pool = ProcessPoolExecutor(max_workers=args.workers, mp_context=get_context("spawn"))
    try:
        futures = {pool.submit(run_chain, j): j for j in todo}
        for k, fut in enumerate(as_completed(futures), 1):
            r = fut.result()
            done[r["key"]] = r
            if not args.timing:
                with progress.open("a") as fh:
                    fh.write(json.dumps(r, default=str) + "\n")
            el = time.perf_counter() - t_start
            walls = [x["wall_s"] for x in r["runs"]]
            print(
                f"{k}/{len(todo)} {r['key']}: {len(walls)} runs, median {statistics.median(walls):.1f} s; "
                f"{el / 60:.1f} min, about {el / k * (len(todo) - k) / 60:.0f} min to go",
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
    chains = [done[j["key"]] for j in jobs]
    info = {
        **header,
        "command": shlex.join(["python", *sys.argv]),
        "args": vars(args),
        "dataset": str(DATASET.relative_to(CHECKOUT)),
        "metric": DF,
        "spec": "conftest.make_spec (spec seed 3, builtin judge, batch_rows 4), name regress, decision flip with "
        "num_pairs_per_dimension --pairs and catalog_seed 42 + chain mod 5; claims.alpha 0.05 (default)",
        "target": list(TARGET),
        "total_s": total,
        "summary": summarise(chains),
    }
    lines = tables(info)
    print("\n".join(lines))
    if args.timing:
        walls = [r["wall_s"] for c in chains for r in c["runs"]]
        print(f"\nmedian run {statistics.median(walls):.1f} s over {len(walls)} runs, {total:.0f} s for the lot")
        return 0
    info["chains"] = chains
    write_json(Path(args.out), info)
    progress.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
