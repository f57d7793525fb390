"""The intersection analysis's calibration: false claims, power and coverage on synthetic answers whose truth is known.

At the analysis level (no model calls): per run, decision flip's design for an intersection is
drawn as the metric draws it (``metrics/decision_flip/personas.py``: a pool of
``--pool`` rectangles, two values of each attribute, drawn once per run from every rectangle the
values allow so each combination is held about equally often, ``balanced``; per question at
least ``--per-row`` of them, enough to hold every combination once, ``row_picks``; each persona a question's
rectangles hold is asked once, as the metric's probes are deduplicated), every question has its
own base favourable rate (uniform ``--base-low``..``--base-high``), and each answer is favourable
at its question's rate, unless the SUT's directional flip turns a targeted persona's favourable
decision unfavourable with probability p. The answers go to ``analysis.intersections.
interaction_claims`` and its claims alone are decided as one family (``claims.decide``, Holm,
alpha 0.05; in a run they share the family with the metric's other claims, which only makes
Holm stricter).

Designs: ``names`` (the names catalogue's cells: woman/man x Black/white/Hispanic: 6 combinations, 3
rectangles, so the pool is all of them) and ``explicit`` (the catalogue's 5 genders x 7
ethnicities: 35 combinations, 210 rectangles, 16 drawn a run). Scenarios: ``fair``; ``combo``
(woman x Black targeted); ``marginal`` (every woman targeted); ``other`` (man x Hispanic
targeted); each biased one at p 0.5 and 0.9.

What is true: in ``fair`` nothing. In ``combo``/``other``: ``interaction:A×B`` and the target's
``interaction:A×B=g×e`` with direction less; everything else claimed is false (a main claim, an
interaction claim on another combination, the target's with the wrong sign). In ``marginal``:
``main:…:gender=woman`` with direction less; a main claim that another gender value is favoured
(direction greater) against the rest is true as stated (the rest holds the women) and is counted
apart ("by contrast"); everything else claimed is false. The targeted effect's truth is the
mean drop -p * E[base rate] = -p * (low + high) / 2 (its conditional value in the run, -p times
the mean base rate of the targeted answers' questions, is recorded too). Coverage is of the
claim's unadjusted 95% interval (the same test inverted), over the runs where the claim is tested
(the target's interaction only exists when forward selection names it).

    python benchmarks/bench_intersections.py [--runs 400] [--runs-explicit 400] [--n-boot 999] [--questions 32] [--workers 2]
    python benchmarks/bench_intersections.py --render   # the table again from the progress file
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from itertools import combinations
from pathlib import Path

import numpy as np
import pandas as pd

CHECKOUT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(CHECKOUT))
from _common import run_header  # noqa: E402

from aip_assets.analysis.claims import Policy, decide  # noqa: E402
from aip_assets.analysis.intersections import interaction_claims  # noqa: E402
from aip_assets.catalog.groups import CROSS  # noqa: E402
from aip_assets.metrics.decision_flip.personas import balanced, row_picks  # noqa: E402
from aip_assets.stats import wilson  # noqa: E402

OUT_JSON = CHECKOUT / "benchmarks" / "results" / "intersections_calibration.json"
PROGRESS = CHECKOUT / "benchmarks" / "results" / "intersections_progress.jsonl"

DESIGNS = {
    "names": (
        "gender×ethnicity@name",
        ["woman", "man"],
        ["Black", "white", "Hispanic"],
    ),
    "explicit": (
        "gender×ethnicity",
        ["woman", "man", "non-binary person", "transgender woman", "transgender man"],
        ["Black", "white", "East Asian", "South Asian", "Hispanic", "Middle Eastern", "Indigenous"],
    ),
}
# name -> (kind, target): kind none | combo (a gender×ethnicity cell) | marginal (a gender value)
TARGETS = {
    "fair": ("none", None),
    "combo": ("combo", ("woman", "Black")),
    "marginal": ("marginal", "woman"),
    "other": ("combo", ("man", "Hispanic")),
}


def scenarios(ps: list[float]) -> list[tuple[str, float]]:
    return [("fair", 0.0)] + [(s, p) for s in ("combo", "marginal", "other") for p in ps]


# ---------------------------------------------------------------- the simulator
def draw_design(
    genders: list[str], ethnicities: list[str], rng: random.Random, questions: int, pool: int = 16, per_row: int = 4
) -> list[list[tuple[str, str]]]:
    """Per question, the combinations asked: the run's pool of rectangles drawn once as the metric
    draws it (``balanced``: the combinations held about equally often), ``row_picks`` of them per
    question (at least ``per_row``, enough to hold every combination once), each persona once per
    question."""
    cands = [(a1, a2, b1, b2) for a1, a2 in combinations(genders, 2) for b1, b2 in combinations(ethnicities, 2)]
    rects = balanced(cands, pool, rng)
    pairs = [  # four pairs per rectangle, as the pool holds them
        {"rect": r, "value_a": f"{a}{CROSS}{b}", "value_b": f"{a}{CROSS}{b}"}
        for r, (a1, a2, b1, b2) in enumerate(rects)
        for a, b in ((a1, b1), (a2, b1), (a1, b2), (a2, b2))
    ]
    out = []
    for _ in range(questions):
        chosen = sorted({pairs[i]["rect"] for i in row_picks(pairs, per_row, rng)})
        cells = {(g, e) for r in chosen for g in rects[r][:2] for e in rects[r][2:]}
        out.append(sorted(cells))
    return out


def hit(scenario: str, g: str, e: str) -> bool:
    kind, target = TARGETS[scenario]
    if kind == "combo":
        return (g, e) == target
    if kind == "marginal":
        return g == target
    return False


def simulate(
    design: str, scenario: str, p: float, seed: int, questions: int = 32, base: tuple[float, float] = (0.2, 0.8)
) -> tuple[pd.DataFrame, float]:
    """One run's answers (question, value, favourable) and the targeted effect's truth in the run
    (-p times the mean base rate over the targeted answers' questions; 0 when nothing is targeted)."""
    _, genders, ethnicities = DESIGNS[design]
    rng = random.Random(f"bench_intersections:{design}:{seed}")
    nrng = np.random.default_rng(rng.getrandbits(64))
    plan = draw_design(genders, ethnicities, rng, questions)
    rows, drops = [], []
    for qi, cells in enumerate(plan):
        b = float(nrng.uniform(*base))
        for g, e in cells:
            fav = nrng.random() < b
            if fav and hit(scenario, g, e) and nrng.random() < p:
                fav = False
            if hit(scenario, g, e):
                drops.append(-p * b)
            rows.append((f"q{qi:03d}", f"{g}{CROSS}{e}", float(fav)))
    answers = pd.DataFrame(rows, columns=["question", "value", "favourable"])
    return answers, float(np.mean(drops)) if drops else 0.0


# ---------------------------------------------------------------- judging a run's claims
def target_id(axis: str, scenario: str) -> str | None:
    kind, target = TARGETS[scenario]
    if kind == "combo":
        return f"interaction:{axis}={target[0]}{CROSS}{target[1]}"
    if kind == "marginal":
        return f"main:{axis}:gender={target}"
    return None


def verdict(c, axis: str, scenario: str) -> str:
    """A made claim: ``true``, ``contrast`` (true as stated only through the rest's make-up) or ``false``."""
    kind, _ = TARGETS[scenario]
    less = c.direction == "less"
    if kind == "none":
        return "false"
    if kind == "combo":
        if c.id == f"interaction:{axis}":
            return "true"
        return "true" if (c.id == target_id(axis, scenario) and less) else "false"
    # marginal: every woman flipped
    if c.id == target_id(axis, scenario):
        return "true" if less else "false"
    if c.kind == "main" and str(c.value).startswith("gender=") and not less:
        return "contrast"
    return "false"


def run_one(design: str, scenario: str, p: float, seed: int, questions: int = 32, n_boot: int = 999) -> dict:
    """One simulated run: its claims decided and judged against the truth."""
    axis = DESIGNS[design][0]
    answers, truth_run = simulate(design, scenario, p, seed, questions)
    t0 = time.perf_counter()
    made, cells = interaction_claims(answers, axis, seed, 0.05, n_boot, n_perm=n_boot)
    claims = decide(made, Policy())
    seconds = time.perf_counter() - t0
    claimed = [c for c in claims if c.status == "claimed"]
    verdicts = {c.id: verdict(c, axis, scenario) for c in claimed}
    tid = target_id(axis, scenario)
    tc = next((c for c in claims if c.id == tid), None)
    lo = hi = None
    if tc is not None and tc.test is not None:
        lo, hi = tc.test.interval(0.05, "two-sided")
    named = [c.value for c in claims if c.kind == "interaction" and c.value is not None]
    return {
        "design": design,
        "scenario": scenario,
        "p": p,
        "seed": seed,
        "n": len(answers),
        "target_asked": bool(tid is None or any(hit(scenario, *v.split(CROSS)) for v in answers["value"].unique())),
        "claimed": {k: v for k, v in verdicts.items()},
        "false": sorted(k for k, v in verdicts.items() if v == "false"),
        "contrast": sorted(k for k, v in verdicts.items() if v == "contrast"),
        "named": named,
        "power": bool(tid is not None and verdicts.get(tid) == "true"),
        "target_tested": tc is not None and tc.test is not None,
        "estimate": None if tc is None else tc.estimate,
        "ci95": [lo, hi],
        "truth": -p * 0.5,
        "truth_run": truth_run,
        "seconds": seconds,
    }


# ---------------------------------------------------------------- the table
def _rate(k: int, n: int) -> str:
    if not n:
        return "n/a"
    lo, hi = wilson(k, n)
    return f"{k}/{n} {k / n:.1%} [{lo:.1%}, {hi:.1%}]"


def summarise(records: list[dict]) -> list[dict]:
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault((r["design"], r["scenario"], r["p"]), []).append(r)
    out = []
    for (design, scenario, p), rs in groups.items():
        n = len(rs)
        tested = [r for r in rs if r["target_tested"] and r["ci95"][0] is not None]
        cover = sum(1 for r in tested if r["ci95"][0] <= r["truth"] <= r["ci95"][1])
        cover_run = sum(1 for r in tested if r["ci95"][0] <= r["truth_run"] <= r["ci95"][1])
        kind, target = TARGETS[scenario]
        wrong_named = 0
        if kind == "combo":
            want = f"{target[0]}{CROSS}{target[1]}"
            wrong_named = sum(1 for r in rs if r["named"] and r["named"][0] != want)
        false_kinds: dict[str, int] = {}
        for r in rs:
            for k in r["false"]:
                key = k.split("=")[0] if k.startswith("interaction:") and "=" not in k else k
                false_kinds[key] = false_kinds.get(key, 0) + 1
        out.append(
            {
                "design": design,
                "scenario": scenario,
                "p": p,
                "runs": n,
                "false_any": sum(1 for r in rs if r["false"]),
                "contrast_any": sum(1 for r in rs if r["contrast"]),
                "power": sum(1 for r in rs if r["power"]) if kind != "none" else None,
                "target_asked": sum(1 for r in rs if r["target_asked"]),
                "target_tested": len(tested),
                "first_named_wrong": wrong_named,
                "coverage": cover,
                "coverage_run": cover_run,
                "mean_estimate": statistics.fmean(r["estimate"] for r in tested) if tested else None,
                "truth": -p * 0.5,
                "mean_truth_run": statistics.fmean(r["truth_run"] for r in rs) if kind != "none" else 0.0,
                "median_seconds": statistics.median(r["seconds"] for r in rs),
                "mean_seconds": statistics.fmean(r["seconds"] for r in rs),
                "false_by_claim": dict(sorted(false_kinds.items(), key=lambda kv: -kv[1])[:6]),
            }
        )
    order = {s: i for i, s in enumerate(TARGETS)}
    return sorted(out, key=lambda s: (list(DESIGNS).index(s["design"]), order[s["scenario"]], s["p"]))


def table(summary: list[dict]) -> str:
    lines = [
        "| design | SUT | runs | any false claim | by contrast | power | target named first wrong | coverage (95%, tested) "
        "| mean estimate (truth) | s/run |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summary:
        sut = "fair" if s["scenario"] == "fair" else f"{s['scenario']} p={s['p']:g}"
        power = "—" if s["power"] is None else _rate(s["power"], s["runs"])
        cov = "—" if not s["target_tested"] else _rate(s["coverage"], s["target_tested"])
        est = "—" if s["mean_estimate"] is None else f"{s['mean_estimate']:+.3f} ({s['truth']:+.3f})"
        wrong = "—" if s["scenario"] in ("fair", "marginal") else str(s["first_named_wrong"])
        lines.append(
            f"| {s['design']} | {sut} | {s['runs']} | {_rate(s['false_any'], s['runs'])} | {s['contrast_any']} | "
            f"{power} | {wrong} | {cov} | {est} | {s['mean_seconds']:.2f} |"
        )
    return "\n".join(lines)


def _job(args: tuple) -> dict:
    return run_one(*args)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=400, help="runs per scenario (names design)")
    ap.add_argument(
        "--runs-explicit", type=int, default=None, help="runs per scenario, explicit design (default --runs)"
    )
    ap.add_argument("--n-boot", type=int, default=999)
    ap.add_argument("--questions", type=int, default=32)
    ap.add_argument("--p", type=float, nargs="+", default=[0.5, 0.9])
    ap.add_argument("--designs", nargs="+", default=list(DESIGNS), choices=list(DESIGNS))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--progress", type=Path, default=PROGRESS, help="finished runs, JSON lines (resumed)")
    ap.add_argument("--out", type=Path, default=OUT_JSON)
    ap.add_argument("--render", action="store_true", help="the table again from the progress file")
    args = ap.parse_args()
    header = run_header()
    done: dict[tuple, dict] = {}
    if args.progress.exists():
        for line in args.progress.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                done[(r["design"], r["scenario"], r["p"], r["seed"])] = r
    if not args.render:
        jobs = []
        for design in args.designs:
            runs = args.runs if design == "names" or args.runs_explicit is None else args.runs_explicit
            for scenario, p in scenarios(args.p):
                for i in range(runs):
                    if (design, scenario, p, i) not in done:
                        jobs.append((design, scenario, p, i, args.questions, args.n_boot))
        jobs.sort(key=lambda j: (j[3], list(DESIGNS).index(j[0])))  # interleaved: a stopped job has some of each
        args.progress.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.time()
        with ProcessPoolExecutor(max_workers=args.workers) as ex, args.progress.open("a") as prog:
            futs = [ex.submit(_job, j) for j in jobs]
            for k, f in enumerate(as_completed(futs), 1):
                r = f.result()
                done[(r["design"], r["scenario"], r["p"], r["seed"])] = r
                prog.write(json.dumps(r) + "\n")
                prog.flush()
                if k % 50 == 0 or k == len(jobs):
                    print(f"{k}/{len(jobs)} runs, {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    summary = summarise(list(done.values()))
    text = table(summary)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {"header": header, "args": {k: str(v) for k, v in vars(args).items()}, "summary": summary, "table": text},
            indent=1,
        )
    )
    print(f"written {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
