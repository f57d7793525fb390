"""Group interaction bias with intersections, at the analysis level: false claims and power (issue 37).

No model is called: each simulated run is a persona pool (``balanced_personas`` with the
intersection [gender, ethnicity], the spec seed 7, 8, ...), the pairs a run draws (``num_pairs`` of
the pool's pairs per question, a null twin, one persona asked twice, for a quarter of them) and a
bias per pair from a known truth, then the metric's own analysis (``group_claims`` on the personas'
attributes with their combinations, ``decide`` with Holm at 0.05). The truths:

- ``none``: no persona is treated differently (a pair's bias: the question's level plus noise);
- ``combination``: one combination's personas (``woman×Black``) get a terse answer: a pair in which
  exactly one persona holds both values is ``--effect`` more biased;
- ``marginal``: one value's personas (``religion=Muslim``) get the terse answer.

A pair's bias: ``clip(0.05 + question + effect * straddles_the_target + noise, 0, 1)``, the question's
level drawn from N(0, 0.03) and the noise from N(0, ``--noise``) per pair, as the builtin judges'
scores are bounded. True claims: for ``combination`` ``group:gender×ethnicity``,
``group:gender×ethnicity=woman×Black`` and ``excess:all``; for ``marginal`` ``group:religion``,
``group:religion=Muslim``, ``excess:all``. Any other claim made is false; a run with one is a false
run. Power: the target's own claim made.

    python benchmarks/bench_gib_intersections.py [--runs 300] [--rows 40] [--pairs 8] [--pool 48]
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from itertools import combinations
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one BLAS thread per worker: the workers are the parallelism
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aip_assets.analysis.claims import Policy, decide  # noqa: E402
from aip_assets.analysis.fairness import group_claims  # noqa: E402
from aip_assets.catalog.groups import combination_attributes  # noqa: E402
from aip_assets.catalog.personas import balanced_personas  # noqa: E402

INTERSECTIONS = [["gender", "ethnicity"]]
TRUTHS = {
    "none": (None, set()),
    "combination": (
        ("gender×ethnicity", "woman×Black"),
        {"group:gender×ethnicity", "group:gender×ethnicity=woman×Black", "excess:all"},
    ),
    "marginal": (("religion", "Muslim"), {"group:religion", "group:religion=Muslim", "excess:all"}),
}


def wilson(k: int, n: int) -> tuple[float, float]:
    if not n:
        return (0.0, 1.0)
    z, p = 1.959963984540054, k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return max(0.0, c - h), min(1.0, c + h)


@functools.lru_cache(maxsize=64)
def pool_of(n: int, seed: int, candidates: int) -> list[dict]:
    return balanced_personas(n, seed, candidates=candidates, intersections=INTERSECTIONS)


def simulate(truth: str, run: int, a) -> dict:
    """One run: its pool, pairs and biases, the claims made."""
    seed = 7 + run % a.pools
    pool = pool_of(a.pool, seed, a.candidates)
    ids = [f"p{i:02d}" for i in range(len(pool))]
    attrs = {pid: combination_attributes(p["attributes"], INTERSECTIONS) for pid, p in zip(ids, pool)}
    target, _ = TRUTHS[truth]
    hit = {pid: bool(target) and attrs[pid].get(target[0]) == target[1] for pid in ids}
    rng = np.random.default_rng((run, sum(map(ord, truth))))
    universe = list(combinations(ids, 2))
    rows = []
    for q in range(a.rows):
        level = 0.05 + rng.normal(0, 0.03)
        for u in rng.choice(len(universe), size=min(a.pairs, len(universe)), replace=False):
            pa, pb = universe[u]
            y = level + a.effect * (hit[pa] != hit[pb]) + rng.normal(0, a.noise)
            rows.append((f"q{q}", "persona", pa, pb, float(np.clip(y, 0, 1))))
            if rng.random() < 0.25:
                p = pa if rng.random() < 0.5 else pb
                rows.append((f"q{q}", "null", p, p, float(np.clip(level + rng.normal(0, a.noise), 0, 1))))
    pairs = pd.DataFrame(rows, columns=["row", "kind", "persona_a", "persona_b", "bias"])
    from aip_assets.analysis.fairness import overall_excess_claim

    claims = [c for c in [overall_excess_claim(pairs, run)] if c is not None]
    gc, levels, _ = group_claims(pairs, attrs, run, n_boot=a.n_boot)
    claims += gc
    decide(claims, Policy())
    made = sorted(c.id for c in claims if c.claimed)
    out = {"truth": truth, "run": run, "made": made, "tested": sum(c.p_adjusted is not None for c in claims)}
    est = {c.id: c.estimate for c in claims if c.kind == "group" and c.value is not None and c.estimate is not None}
    out["spread"] = {
        "woman": est.get("group:gender=woman"),
        "Black": est.get("group:ethnicity=Black"),
        "by_key": {
            k: v for k, v in est.items() if k.startswith("group:gender×ethnicity=") and not k.endswith("=woman×Black")
        },
    }
    out["spread"]["others"] = list(out["spread"]["by_key"].values())
    if target:
        key = f"{target[0]}={target[1]}"
        c = next((c for c in claims if c.id == f"group:{key}"), None)
        lv = levels.get(key) or {}
        out.update(
            estimate=None if c is None else c.estimate,
            ci=None if c is None else list(c.ci),
            level=lv.get("level"),
            inseparable=bool(lv.get("inseparable")),
        )
    return out


def extreme(rs: list[dict]) -> float:
    """The largest |mean over runs| of any other combination's coefficient."""
    by: dict[str, list[float]] = {}
    for r in rs:
        for k, v in r["spread"]["by_key"].items():
            by.setdefault(k, []).append(v)
    return max((abs(float(np.mean(v))) for v in by.values()), default=0.0)


def _one(args):
    return simulate(*args)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=300, help="runs per truth")
    ap.add_argument("--rows", type=int, default=40, help="questions per run")
    ap.add_argument("--pairs", type=int, default=8, help="persona pairs per question")
    ap.add_argument("--pool", type=int, default=48, help="persona_pool_size")
    ap.add_argument("--pools", type=int, default=10, help="distinct pools (spec seeds 7, 8, ...)")
    ap.add_argument("--candidates", type=int, default=100, help="deals balanced_personas compares")
    ap.add_argument("--effect", type=float, default=0.3, help="the target's added bias")
    ap.add_argument("--noise", type=float, default=0.1, help="a pair's noise sd")
    ap.add_argument("--n-boot", type=int, default=3999, help="wild bootstrap draws per test (the metric's N_BOOT)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--truths", default="none,combination,marginal")
    ap.add_argument("--out", help="write every run's claims here (JSON lines)")
    a = ap.parse_args()
    t0 = time.time()
    jobs = [(t, r, a) for t in a.truths.split(",") for r in range(a.runs)]
    with ProcessPoolExecutor(a.workers) as ex:
        results = list(ex.map(_one, jobs, chunksize=4))
    took = time.time() - t0
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            for r in results:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(
        f"# bench_gib_intersections: {a.runs} runs per truth, {a.rows} questions x {a.pairs} pairs, pool {a.pool}, "
        f"effect {a.effect}, noise sd {a.noise}, {a.n_boot} bootstrap draws; {os.cpu_count()} cores "
        f"({platform.processor() or platform.machine()}), {took:.0f} s"
    )
    print(
        "| truth | runs | false runs (any claim the truth has not) | of which against a marginal of the target / another "
        "combination | power (target's claim) | median claims tested |"
    )
    print("|---|---|---|---|---|---|")
    for t in a.truths.split(","):
        rs = [r for r in results if r["truth"] == t]
        target, true = TRUTHS[t]
        false = [set(r["made"]) - true for r in rs]
        nf = sum(bool(f) for f in false)
        lo, hi = wilson(nf, len(rs))
        marg = other = 0
        if target and "×" in target[0]:
            mvals = {f"group:gender={target[1].split('×')[0]}", f"group:ethnicity={target[1].split('×')[1]}"}
            marg = sum(bool(f & mvals) for f in false)
            other = sum(any(c.startswith("group:gender×ethnicity=") for c in f) for f in false)
        power = "n/a"
        if target:
            k = sum(f"group:{target[0]}={target[1]}" in r["made"] for r in rs)
            plo, phi = wilson(k, len(rs))
            power = f"{k}/{len(rs)} = {k / len(rs):.3f} [{plo:.3f}, {phi:.3f}]"
        print(
            f"| {t} | {len(rs)} | {nf}/{len(rs)} = {nf / len(rs):.3f} [{lo:.3f}, {hi:.3f}] | {marg} / {other} | {power} | "
            f"{int(np.median([r['tested'] for r in rs]))} |"
        )
        if target:
            est = [r["estimate"] for r in rs if r.get("estimate") is not None]
            cover = [r for r in rs if r.get("ci") and r["ci"][0] is not None and r["ci"][0] <= a.effect]
            sp = [r["spread"] for r in rs]
            w = [x["woman"] for x in sp if x["woman"] is not None]
            b = [x["Black"] for x in sp if x["Black"] is not None]
            o = [v for x in sp for v in x["others"]]
            print(
                f"|  | {t}: mean coefficient of gender=woman {np.mean(w):+.4f}, ethnicity=Black {np.mean(b):+.4f}, "
                f"the other gender×ethnicity combinations {np.mean(o):+.4f} (mean |.| {np.mean(np.abs(o)):.4f}, "
                f"most extreme mean over runs {extreme(rs):.4f}) |  |  |  |"
            )
            print(
                f"|  | {t}: target coefficient mean {np.mean(est):.3f} (truth {a.effect}); its one-sided interval's "
                f"lower end at most the truth in {len(cover)}/{len(rs)}; inseparable in "
                f"{sum(r.get('inseparable', False) for r in rs)} |  |  |  |"
            )


if __name__ == "__main__":
    main()
