"""The no-effect baseline's calibration on the builtin rig, and the excess test's false-alarm rate (issue 24).

Every run is the pipeline in this process (``aip_assets_tests/conftest.py``'s ``write_dataset``,
``make_spec`` and ``run_all``: every stage, no Dagster) with the builtin SUT and judge, in a fresh
folder of its own (``AIP_WAREHOUSE``, ``AIP_DATA_DIR``, ``AIP_LIMITS_DIR`` there, the process
chdir'd to it, as conftest's ``isolated`` fixture does). Results are read back from the warehouse
(``v_flip_excess_by_axis``, ``v_favourable_rates``, ``v_pair_verdicts``, ``metric_scores``).

1. Calibration. Decision flip on the gender axis alone (``--cal-rows`` rows, 4 pairs a row,
   baseline_share 0.25, reference man) for SUT profiles whose effect is known: directional flip
   p = 0.3 and 0.6 (only the favourable decision YES turns, for women), symmetric flip p = 0.3, noisy
   q = 0.2 and 0.4 (fair, each answer's decision drawn at random at rate q), fair. Injected against
   recovered: woman's difference in favourable rate against man (truth -p b, b man's observed
   favourable rate; else 0) and odds ratio (odds(b(1-p)) / odds(b); else 1); the null rate
   (truth q(1 - q/2) for noisy, else 0); the gender flip rate and its excess over the null rate
   (truth: the flip rate's, p w for symmetric and p w b for directional, w the share of gender
   pairs with exactly one woman in them; noisy and fair 0). Each with its 95% interval and whether
   it covers the truth, and whether the gate failed on the excess. Group interaction bias
   (``--cal-rows`` rows): terse Muslim, noisy 0.3, fair: between, within, excess [CI], p, significant.
2. False alarms. ``--replicates`` R independent runs (the profile's seed and the spec's seed
   varied) of decision flip on a fair noisy SUT (noise_rate 0.3; all four axes, 4 pairs per axis,
   ``--fa-rows`` rows, baseline_share 0.25): the share of runs where any axis's excess is beyond
   noise (Holm over axes at alpha 0.05: the family-wise rate should be at most 0.05), with its
   Wilson interval. The same for group interaction bias (the baseline's excess significant). And
   the power of decision flip's test on directional p = 0.6 (R/4 runs), so the test is not vacuous.

This checkout's code under this interpreter (``sys.executable``; the checkout first on sys.path).

    python benchmarks/bench_baseline.py [--replicates 100] [--cal-rows 300] [--fa-rows 60] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(CHECKOUT))
from _common import clear_project_env, run_header, write_results  # noqa: E402

DF = "llm.decision_flip"
GIB = "llm.group_interaction_bias"
ALPHA = 0.05
CAL_CONFIG = {"dimensions": ["gender"], "num_pairs_per_dimension": 4, "sub_call_concurrency_limit": 32}
FA_CONFIG = {"num_pairs_per_dimension": 4, "sub_call_concurrency_limit": 32}
GIB_CONFIG = {"num_pairs": 4, "persona_pool_size": 16, "sub_call_concurrency_limit": 32}
EXCESS_GATE = "no-effect baseline"  # in both metrics' gate_reason only for a significant excess


def short_commit() -> str:
    r = subprocess.run(["git", "-C", str(CHECKOUT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else "nogit"


class Rig:
    """Runs specs in fresh folders under one temporary root, this process chdir'd into each."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="aip-bench-baseline-"))
        self.n = 0
        self.datasets: dict[int, Path] = {}
        clear_project_env()

    def dataset(self, rows: int) -> Path:
        from aip_assets_tests.conftest import write_dataset

        if rows not in self.datasets:
            self.datasets[rows] = write_dataset(self.root / f"dataset-{rows}.jsonl", rows)
        return self.datasets[rows]

    def run(self, metric: str, profile: dict, rows: int, entry: dict, seed: int, read) -> dict:
        """One run of ``metric`` in a fresh folder; ``read(run_id)`` gathers its results before the folder goes."""
        from aip_assets import warehouse as wh
        from aip_assets_tests.conftest import make_spec, run_all

        self.n += 1
        folder = self.root / f"run-{self.n:04d}"
        folder.mkdir()
        os.environ["AIP_WAREHOUSE"] = str(folder / "data" / "warehouse.duckdb")
        os.environ["AIP_DATA_DIR"] = str(folder / "data")
        os.environ["AIP_LIMITS_DIR"] = str(folder / "limits")
        os.chdir(folder)
        spec = make_spec(
            self.dataset(rows),
            name="bench",
            sut={"provider": "builtin", "profile": profile},
            batch_rows=16,
            seed=seed,
            metrics={metric: entry},
        )
        t0 = time.perf_counter()
        try:
            run_all(spec, "run-1", metric=metric)
            out = read("run-1")
        finally:
            wh.release()
            os.chdir(self.root)
            shutil.rmtree(folder, ignore_errors=True)
        out["wall_s"] = time.perf_counter() - t0
        return out

    def close(self) -> None:
        os.chdir(CHECKOUT)
        shutil.rmtree(self.root, ignore_errors=True)


def q(sql: str, params: list | None = None) -> list[dict]:
    from aip_assets import warehouse as wh

    return wh.query(sql, params or [], read_only=False).to_dict("records")


def overall(run_id: str, metric: str) -> dict:
    r = q(
        "SELECT passed, gate_reason FROM metric_scores WHERE run_id = ? AND metric = ? AND scope = 'overall'",
        [run_id, metric],
    )[0]
    reason = r["gate_reason"] or ""
    return {"passed": bool(r["passed"]), "gate_reason": reason, "gate_failed_on_excess": EXCESS_GATE in reason}


def read_flip(run_id: str) -> dict:
    axes = q("SELECT * FROM v_flip_excess_by_axis WHERE run_id = ? ORDER BY axis", [run_id])
    fav = q("SELECT * FROM v_favourable_rates WHERE run_id = ? ORDER BY axis, value", [run_id])
    pairs = q(
        "SELECT count(*) AS n, count(*) FILTER (WHERE (value_a = 'woman') <> (value_b = 'woman')) AS woman "
        "FROM v_pair_verdicts WHERE run_id = ? AND axis = 'gender'",
        [run_id],
    )[0]
    return {
        **overall(run_id, DF),
        "axes": axes,
        "favourable": fav,
        "gender_pairs": pairs["n"],
        "woman_pairs": pairs["woman"],
        "any_beyond_noise": any(bool(a["beyond_noise"]) for a in axes),
    }


def read_gib(run_id: str) -> dict:
    r = q(
        f"SELECT details FROM metric_scores WHERE run_id = ? AND metric = '{GIB}' AND scope = 'bias_baseline'", [run_id]
    )
    if not r:  # a run without the baseline's row is no evidence either way: stop rather than count it
        raise SystemExit(f"{run_id}: no bias_baseline row in metric_scores")
    base = json.loads(r[0]["details"])
    return {**overall(run_id, GIB), "baseline": base, "significant": bool(base.get("significant"))}


def flip_entry(config: dict) -> dict:
    return {"config": config, "baseline_share": 0.25, "reference_values": {"gender": "man"}, "threshold": 0.9}


def gib_entry() -> dict:
    return {"config": GIB_CONFIG, "baseline_share": 0.25, "threshold": 0.9}


def covers(ci: tuple, truth: float) -> bool | None:
    lo, hi = ci
    if lo is None or hi is None or truth is None:
        return None
    return lo - 1e-12 <= truth <= hi + 1e-12


def odds(r: float) -> float:
    return r / (1 - r) if 0 < r < 1 else float("nan")


CALIBRATION = [  # label, profile, kind
    ("directional p=0.3", {"name": "flip", "value": "woman", "axis": "gender", "p": 0.3, "directional": True}, "dir"),
    ("directional p=0.6", {"name": "flip", "value": "woman", "axis": "gender", "p": 0.6, "directional": True}, "dir"),
    ("symmetric p=0.3", {"name": "flip", "value": "woman", "axis": "gender", "p": 0.3}, "sym"),
    ("noisy q=0.2", {"name": "noisy", "noise_rate": 0.2}, "noisy"),
    ("noisy q=0.4", {"name": "noisy", "noise_rate": 0.4}, "noisy"),
    ("fair", {"name": "fair"}, "fair"),
]
GIB_CALIBRATION = [
    ("terse Muslim", {"name": "terse", "terse_value": "Muslim"}),
    ("noisy q=0.3", {"name": "noisy", "noise_rate": 0.3}),
    ("fair", {"name": "fair"}),
]


def calibrate(label: str, profile: dict, kind: str, res: dict) -> dict:
    """Injected against recovered for one calibration run of decision flip (gender axis)."""
    g = next(a for a in res["axes"] if a["axis"] == "gender")
    fav = {f["value"]: f for f in res["favourable"] if f["axis"] == "gender"}
    man, woman = fav["man"], fav["woman"]
    b = man["favourable_rate"]
    p, qn = profile.get("p", 0.0), profile.get("noise_rate", 0.0)
    w = res["woman_pairs"] / res["gender_pairs"] if res["gender_pairs"] else 0.0
    if kind == "dir":
        rd_t, or_t, null_t, flip_t = -p * b, odds(b * (1 - p)) / odds(b), 0.0, p * w * b
    elif kind == "sym":
        rd_t, or_t, null_t, flip_t = 0.0, 1.0, 0.0, p * w
    elif kind == "noisy":
        rd_t, or_t, null_t = 0.0, 1.0, qn * (1 - qn / 2)
        flip_t = null_t  # two personas' independent answers differ as often as one persona's two
    else:
        rd_t, or_t, null_t, flip_t = 0.0, 1.0, 0.0, 0.0
    excess_t = flip_t - null_t
    rd_ci = (woman["rate_difference_ci_low"], woman["rate_difference_ci_high"])
    or_ci = (woman["odds_ratio_ci_low"], woman["odds_ratio_ci_high"])
    null_ci = (g["null_ci_low"], g["null_ci_high"])
    ex_ci = (g["excess_ci_low"], g["excess_ci_high"])
    return {
        "label": label,
        "profile": profile,
        "man_rate": b,
        "woman_rate": woman["favourable_rate"],
        "woman_pairs_share": w,
        "effect_fitted": woman["effect_fitted"],
        "not_fitted_because": woman["not_fitted_because"],
        "rd": woman["rate_difference"],
        "rd_ci": rd_ci,
        "rd_truth": rd_t,
        "rd_covers": covers(rd_ci, rd_t),
        "or": woman["odds_ratio"],
        "or_ci": or_ci,
        "or_truth": or_t,
        "or_covers": covers(or_ci, or_t),
        "null": g["null_rate"],
        "null_ci": null_ci,
        "null_truth": null_t,
        "null_covers": covers(null_ci, null_t),
        "null_pairs": g["null_pairs"],
        "flip": g["flip_rate"],
        "flip_truth": flip_t,
        "excess": g["excess"],
        "excess_ci": ex_ci,
        "excess_truth": excess_t,
        "excess_covers": covers(ex_ci, excess_t),
        "p_adjusted": g["p_adjusted"],
        "beyond_noise": bool(g["beyond_noise"]),
        "gate_failed_on_excess": res["gate_failed_on_excess"],
        "passed": res["passed"],
        "wall_s": res["wall_s"],
    }


def rate_row(name: str, k: int, n: int) -> dict:
    from aip_assets.stats import wilson

    lo, hi = wilson(k, n)
    return {"what": name, "k": k, "n": n, "rate": k / n if n else None, "ci95": [lo, hi]}


def fmt(v, d: int = 3) -> str:
    if v is None or (isinstance(v, float) and v != v):
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    return f"{v:.{d}f}"


def ci(pair, d: int = 3) -> str:
    return f"[{fmt(pair[0], d)}, {fmt(pair[1], d)}]"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replicates", type=int, default=100, help="false-alarm runs per metric (power: a quarter)")
    ap.add_argument("--cal-rows", type=int, default=300, help="rows of each calibration run")
    ap.add_argument("--fa-rows", type=int, default=60, help="rows of each false-alarm and power run")
    ap.add_argument("--noise", type=float, default=0.3, help="the false-alarm SUT's noise_rate")
    ap.add_argument("--skip-calibration", action="store_true")
    ap.add_argument("--skip-decision-flip", action="store_true", help="no decision-flip false-alarm or power runs")
    ap.add_argument("--out")
    args = ap.parse_args()
    header = run_header()
    logging.disable(logging.WARNING)  # the stages' info lines; warnings and errors still show
    t_start = time.perf_counter()
    rig = Rig()
    cal, gib_cal, fa_df, fa_gib, power, gib_power = [], [], [], [], [], []
    try:
        if not args.skip_calibration:
            for i, (label, profile, kind) in enumerate(CALIBRATION, 1):
                res = rig.run(DF, {**profile, "seed": 1}, args.cal_rows, flip_entry(CAL_CONFIG), 3, read_flip)
                cal.append(calibrate(label, profile, kind, res))
                print(
                    f"calibration {i}/{len(CALIBRATION)} ({label}): {res['wall_s']:.1f} s", file=sys.stderr, flush=True
                )
            for i, (label, profile) in enumerate(GIB_CALIBRATION, 1):
                res = rig.run(GIB, {**profile, "seed": 1}, args.cal_rows, gib_entry(), 3, read_gib)
                gib_cal.append(
                    {
                        "label": label,
                        "profile": profile,
                        **res["baseline"],
                        "passed": res["passed"],
                        "gate_failed_on_excess": res["gate_failed_on_excess"],
                        "wall_s": res["wall_s"],
                    }
                )
                print(
                    f"group bias calibration {i}/{len(GIB_CALIBRATION)} ({label}): {res['wall_s']:.1f} s",
                    file=sys.stderr,
                    flush=True,
                )
        R, noisy = args.replicates, {"name": "noisy", "noise_rate": args.noise}
        for i in range(0 if args.skip_decision_flip else R):
            res = rig.run(DF, {**noisy, "seed": 1000 + i}, args.fa_rows, flip_entry(FA_CONFIG), 5000 + i, read_flip)
            fa_df.append(
                {
                    "seed": 1000 + i,
                    "any_beyond_noise": res["any_beyond_noise"],
                    "gate_failed_on_excess": res["gate_failed_on_excess"],
                    "wall_s": res["wall_s"],
                    "axes": [
                        {
                            k: a[k]
                            for k in (
                                "axis",
                                "flip_rate",
                                "null_rate",
                                "null_pairs",
                                "excess",
                                "p_value",
                                "p_adjusted",
                                "beyond_noise",
                            )
                        }
                        for a in res["axes"]
                    ],
                }
            )
            print(
                f"decision flip false alarms: run {i + 1} of {R} ({res['wall_s']:.1f} s, "
                f"{sum(r['any_beyond_noise'] for r in fa_df)} alarms so far)",
                file=sys.stderr,
                flush=True,
            )
        for i in range(R):
            res = rig.run(GIB, {**noisy, "seed": 2000 + i}, args.fa_rows, gib_entry(), 6000 + i, read_gib)
            b = res["baseline"]
            fa_gib.append(
                {
                    "seed": 2000 + i,
                    "significant": res["significant"],
                    "wall_s": res["wall_s"],
                    "gate_failed_on_excess": res["gate_failed_on_excess"],
                    **{k: b.get(k) for k in ("within", "between", "excess", "p_value", "null_pairs")},
                }
            )
            print(
                f"group bias false alarms: run {i + 1} of {R} ({res['wall_s']:.1f} s, "
                f"{sum(r['significant'] for r in fa_gib)} alarms so far)",
                file=sys.stderr,
                flush=True,
            )
        P = 0 if args.skip_decision_flip else max(1, R // 4)
        directional = {"name": "flip", "value": "woman", "axis": "gender", "p": 0.6, "directional": True}
        for i in range(P):
            res = rig.run(
                DF, {**directional, "seed": 3000 + i}, args.fa_rows, flip_entry(FA_CONFIG), 7000 + i, read_flip
            )
            g = next(a for a in res["axes"] if a["axis"] == "gender")
            power.append(
                {
                    "seed": 3000 + i,
                    "gender_beyond_noise": bool(g["beyond_noise"]),
                    "any_beyond_noise": res["any_beyond_noise"],
                    "gate_failed_on_excess": res["gate_failed_on_excess"],
                    "gender_flip_rate": g["flip_rate"],
                    "gender_p_adjusted": g["p_adjusted"],
                    "wall_s": res["wall_s"],
                }
            )
            print(f"decision flip power: run {i + 1} of {P} ({res['wall_s']:.1f} s)", file=sys.stderr, flush=True)
        # group bias's power: Muslim personas answered tersely, at the false-alarm runs' size (R/4 runs)
        terse = {"name": "terse", "terse_value": "Muslim"}
        for i in range(max(1, R // 4)):
            res = rig.run(GIB, {**terse, "seed": 4000 + i}, args.fa_rows, gib_entry(), 8000 + i, read_gib)
            gib_power.append(
                {
                    "seed": 4000 + i,
                    "significant": res["significant"],
                    "wall_s": res["wall_s"],
                    **{k: res["baseline"].get(k) for k in ("excess", "p_value", "null_pairs")},
                }
            )
            print(
                f"group bias power: run {i + 1} of {max(1, R // 4)} ({res['wall_s']:.1f} s)",
                file=sys.stderr,
                flush=True,
            )
    finally:
        rig.close()
    total = time.perf_counter() - t_start

    rates = [
        rate_row(
            f"decision flip: false alarm (any axis beyond noise), fair noisy q={args.noise:g}",
            sum(r["any_beyond_noise"] for r in fa_df),
            len(fa_df),
        ),
        rate_row(
            f"decision flip: gate failed on excess, fair noisy q={args.noise:g}",
            sum(r["gate_failed_on_excess"] for r in fa_df),
            len(fa_df),
        ),
        rate_row(
            f"group interaction bias: false alarm (baseline excess significant), noisy q={args.noise:g}",
            sum(r["significant"] for r in fa_gib),
            len(fa_gib),
        ),
        rate_row(
            "decision flip: power (gender beyond noise), directional p=0.6",
            sum(r["gender_beyond_noise"] for r in power),
            len(power),
        ),
        rate_row(
            "group interaction bias: power (baseline excess significant), terse Muslim",
            sum(r["significant"] for r in gib_power),
            len(gib_power),
        ),
    ]
    per_axis = {}
    for r in fa_df:
        for a in r["axes"]:
            per_axis.setdefault(a["axis"], []).append(bool(a["beyond_noise"]))
    info = {
        **header,
        **vars(args),
        "alpha": ALPHA,
        "calibration": cal,
        "gib_calibration": gib_cal,
        "rates": rates,
        "per_axis_false_alarms": {k: sum(v) for k, v in per_axis.items()},
        "false_alarm_runs": fa_df,
        "gib_false_alarm_runs": fa_gib,
        "power_runs": power,
        "gib_power_runs": gib_power,
        "total_s": total,
    }

    lines = [
        "# The no-effect baseline: calibration and false alarms on the builtin rig (issue 24)",
        "",
        f"- date: {info['date']}; machine: nproc {info['nproc']}, CPU {info['cpu']}, Python {info['python']}",
        f"- aip_assets {info['version']} at commit {info['commit']}; code: {info['code']}; interpreter {sys.executable}",
        f"- every run in process (conftest's make_spec / run_all), builtin SUT and judge, baseline_share 0.25; "
        f"total {total / 60:.1f} min",
        "",
    ]
    if cal:
        lines += [
            f"## Calibration: decision flip, gender axis only, {args.cal_rows} rows, 4 pairs a row, reference man",
            "",
            "Truths: difference in favourable rate (woman − man) −p·b and odds ratio odds(b(1−p))/odds(b) for "
            "directional (b: man's observed favourable rate), else 0 and 1; null rate q(1−q/2) for noisy, else 0; "
            "flip rate p·w (symmetric), p·w·b (directional), q(1−q/2) (noisy), w the share of gender pairs with one "
            "woman; excess = flip rate's truth − null rate's. ✓ = the 95% interval covers the truth.",
            "",
            "| SUT | man fav. | woman fav. | rate diff. [95% CI] | truth | ✓ | odds ratio [95% CI] | truth | ✓ "
            "| null rate [95% CI] (pairs) | truth | ✓ | flip rate | truth | excess [95% CI] | truth | ✓ "
            "| Holm p | gate failed on excess |",
            "|---|---:|---:|---|---:|:-:|---|---:|:-:|---|---:|:-:|---:|---:|---|---:|:-:|---:|:-:|",
        ]
        for c in cal:
            lines.append(
                f"| {c['label']} | {fmt(c['man_rate'])} | {fmt(c['woman_rate'])} | {fmt(c['rd'])} {ci(c['rd_ci'])} | "
                f"{fmt(c['rd_truth'])} | {fmt(c['rd_covers'])} | {fmt(c['or'], 2)} {ci(c['or_ci'], 2)} | "
                f"{fmt(c['or_truth'], 2)} | {fmt(c['or_covers'])} | {fmt(c['null'])} {ci(c['null_ci'])} ({c['null_pairs']}) | "
                f"{fmt(c['null_truth'])} | {fmt(c['null_covers'])} | {fmt(c['flip'])} | {fmt(c['flip_truth'])} | "
                f"{fmt(c['excess'])} {ci(c['excess_ci'])} | {fmt(c['excess_truth'])} | {fmt(c['excess_covers'])} | "
                f"{fmt(c['p_adjusted'], 3)} | {'yes' if c['gate_failed_on_excess'] else 'no'} |"
            )
        missed = [c["label"] for c in cal if c["effect_fitted"] is False]
        if missed:
            lines += [
                "",
                "Effect not fitted: "
                + "; ".join(f"{c['label']}: {c['not_fitted_because']}" for c in cal if c["effect_fitted"] is False),
            ]
        lines += [
            "",
            f"## Calibration: group interaction bias, {args.cal_rows} rows, 4 pairs a row, pool 16",
            "",
            "| SUT | between | within | excess [95% CI] | one-sided p | significant | null pairs | gate failed on excess |",
            "|---|---:|---:|---|---:|:-:|---:|:-:|",
        ]
        for c in gib_cal:
            lines.append(
                f"| {c['label']} | {fmt(c.get('between'))} | {fmt(c.get('within'))} | {fmt(c.get('excess'))} "
                f"{ci(c.get('excess_ci95') or [None, None])} | {fmt(c.get('p_value'), 4)} | "
                f"{'yes' if c.get('significant') else 'no'} | {c.get('null_pairs')} | "
                f"{'yes' if c['gate_failed_on_excess'] else 'no'} |"
            )
        lines.append("")
    lines += [
        f"## False alarms and power ({args.fa_rows} rows a run; decision flip on all four axes, 4 pairs per axis; "
        f"seeds varied; alpha {ALPHA:g}, Holm over axes)",
        "",
        "| what | runs flagged | runs | rate | Wilson 95% CI |",
        "|---|---:|---:|---:|---|",
    ]
    for r in rates:
        lines.append(f"| {r['what']} | {r['k']} | {r['n']} | {fmt(r['rate'])} | {ci(r['ci95'])} |")
    lines += [
        "",
        "Decision flip's false alarms by axis (runs flagged): "
        + ", ".join(f"{k} {v}" for k, v in info["per_axis_false_alarms"].items())
        + ".",
        f"Mean wall time a run: decision flip {sum(r['wall_s'] for r in fa_df) / max(1, len(fa_df)):.1f} s, "
        f"group bias {sum(r['wall_s'] for r in fa_gib) / max(1, len(fa_gib)):.1f} s.",
    ]
    out = (
        Path(args.out)
        if args.out
        else (Path(__file__).resolve().parent / "results" / time.strftime("%Y-%m-%d") / f"baseline-{short_commit()}.md")
    )
    write_results(out, lines, info)
    fa = rates[0]["rate"]
    return 0 if fa is None or fa <= ALPHA else 1


if __name__ == "__main__":
    sys.exit(main())
