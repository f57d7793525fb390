"""Judges checked against people (`aip-eval label export` / `label import`): the formulas by hand,
the sample's stratification, the file people fill in, the import's checks, the figures stored and
reported."""

from __future__ import annotations

import csv
import json
import shutil

import pandas as pd
import pytest

from aip_assets import human_labels as hl
from aip_assets import label_files, pipeline
from aip_assets import warehouse as wh
from aip_assets.cli import main
from aip_assets.judge_audit import kappa as audit_kappa
from aip_assets.metrics.consistency import HUMAN_CATEGORIES as CONSISTENCY_CATEGORIES
from aip_assets.metrics.decision_flip import HUMAN_CATEGORIES as DF_CATEGORIES
from aip_assets.stats import cohen_kappa, kish_n, rogan_gladen, rogan_gladen_stratified, wilson, wilson_share

from .conftest import built_once, make_spec, run_all, table, write_dataset
from .test_consistency import spec_for

FLIP = "llm.decision_flip"
SEM = "llm.semantic_consistency"


def census(confusion: dict[tuple[str, str], int]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A population and its labels from a confusion {(judge, people): items}: every judgement
    labelled (a census, so every weight is 1)."""
    pop, labels = [], []
    for (judge, people), k in confusion.items():
        for i in range(k):
            jid = f"{judge}>{people}#{i}"
            pop.append(
                {"judgement_id": jid, "judge_kind": "decision", "judge_category": judge, "allowed": list(DF_CATEGORIES)}
            )
            labels.append({"judgement_id": jid, "category": people, "labeller": "ann"})
    return pd.DataFrame(pop), pd.DataFrame(labels)


def rows_by_key(records: list[dict]) -> dict[str, dict]:
    return {r["group_key"]: {**r, "details": json.loads(r["details"])} for r in records}


# ------------------------------------------------------------------ the formulas, by hand
def test_two_by_two_agreement_kappa_sensitivity_specificity_by_hand():
    """Judge / people: flip/flip 7, flip/same 3, same/flip 2, same/same 8 (20 items, all labelled).
    Agreement (7 + 8) / 20 = 0.75. The judge says flip 10/20 = 0.5, people 9/20 = 0.45: chance
    agreement 0.5 * 0.45 + 0.5 * 0.55 = 0.5, kappa (0.75 - 0.5) / (1 - 0.5) = 0.5. Sensitivity for
    flip 7 / (7 + 2) = 7/9, specificity 8 / (8 + 3) = 8/11. Rogan–Gladen of the judge's 0.5:
    (0.5 + 8/11 - 1) / (7/9 + 8/11 - 1) = (5/22) / (50/99) = 0.45, people's own share, as it must be
    for a census."""
    pairs = (
        [("flip", "flip")] * 7
        + [("flip", "same_decision")] * 3
        + [("same_decision", "flip")] * 2
        + [("same_decision", "same_decision")] * 8
    )
    assert cohen_kappa([(a, b, 1.0) for a, b in pairs]) == pytest.approx((0.75, 0.5))
    assert audit_kappa(pairs) == pytest.approx((0.75, 0.5))  # the second judge's kappa is the same formula
    rg = rogan_gladen_stratified({"flip": 10, "same_decision": 10}, {"flip": (10, 7), "same_decision": (10, 2)}, "flip")
    assert (
        rg["p_obs"] == 0.5 and rg["sensitivity"] == pytest.approx(7 / 9) and rg["specificity"] == pytest.approx(8 / 11)
    )
    assert rg["corrected"] == pytest.approx(0.45)
    # another observed rate with the same judge: (0.3 + 8/11 - 1) / (50/99) = (0.3 - 3/11) * 99/50 = 0.054
    assert rogan_gladen(0.3, 7 / 9, 8 / 11) == pytest.approx(0.054)
    assert rogan_gladen(0.1, 7 / 9, 8 / 11) == 0.0  # below what false positives alone give: clipped
    assert rogan_gladen(0.95, 7 / 9, 8 / 11) == 1.0

    pop, labels = census(
        {
            ("flip", "flip"): 7,
            ("flip", "same_decision"): 3,
            ("same_decision", "flip"): 2,
            ("same_decision", "same_decision"): 8,
        }
    )
    r = rows_by_key(hl.agreement_records(FLIP, pop, labels, seed=1, metric_name="decision_flip"))
    a = r["agreement"]
    assert a["rate"] == pytest.approx(0.75) and a["raw_score"] == pytest.approx(0.5) and a["n"] == 20
    assert (a["rate_ci_low"], a["rate_ci_high"]) == pytest.approx(wilson(15, 20))  # weights 1: plain Wilson
    assert a["ci_low"] < 0.5 < a["ci_high"]
    f = r["category:flip"]
    assert f["rate"] == pytest.approx(7 / 9) and (f["rate_ci_low"], f["rate_ci_high"]) == pytest.approx(wilson(7, 9))
    assert f["details"]["specificity"] == pytest.approx(8 / 11)
    assert f["details"]["specificity_ci95"] == pytest.approx(list(wilson(8, 11)))
    assert r["category:same_decision"]["rate"] == pytest.approx(8 / 11)  # the other side of the same table
    # people put 9 items in flip and 11 elsewhere: fewer than 10 on a side, so no corrected rate, and why
    c = r["corrected:flip"]
    assert c["raw_score"] == 0.5 and c.get("rate") is None
    assert c["details"]["why"] == (
        "too few labels: people put 9 labelled item(s) in flip and 11 elsewhere; the "
        "correction needs at least 10 on each side"
    )
    # the table doubled (14/6/4/16): 18 and 22 a side, the same Se, Sp and 0.45, now with its interval
    pop, labels = census(
        {
            ("flip", "flip"): 14,
            ("flip", "same_decision"): 6,
            ("same_decision", "flip"): 4,
            ("same_decision", "same_decision"): 16,
        }
    )
    c = rows_by_key(hl.agreement_records(FLIP, pop, labels, seed=1, metric_name="decision_flip"))["corrected:flip"]
    assert c["rate"] == pytest.approx(0.45) and c["rate_ci_low"] < 0.45 < c["rate_ci_high"]
    assert (c["details"]["sensitivity"], c["details"]["specificity"]) == pytest.approx((7 / 9, 8 / 11))


def test_three_category_kappa_by_hand_unweighted_and_weighted():
    """Judge (rows) / people (columns), Consistent, Slightly Inconsistent, Contradictory:
        6 2 1 | 1 5 2 | 0 1 4   (22 items).
    Unweighted: agreement 15/22; judge margins 9, 8, 5, people's 7, 8, 7; chance
    (63 + 64 + 35) / 484 = 162/484; kappa (330 - 162) / (484 - 162) = 168/322 = 12/23.
    Weighted as a stratified sample of a run with 18, 8 and 15 judgements in the judge's three
    categories (weights 2, 1, 3): the table becomes 12 4 2 | 1 5 2 | 0 3 12 (41); agreement
    29/41; margins 18, 8, 15 and 13, 12, 16; chance (234 + 96 + 240) / 1681 = 570/1681; kappa
    (1189 - 570) / (1681 - 570) = 619/1111. Contradictory's sensitivity: people's Contradictory
    items weigh 1*2 + 2*1 + 4*3 = 16, the judge's share of them 12/16 = 0.75 (Kish's n
    16^2 / (4 + 1 + 1 + 4*9) = 256/42); its specificity: people's other items weigh 8*2 + 6*1 +
    1*3 = 25, the judge put 3 of that weight in Contradictory: 22/25 = 0.88."""
    C, S, X = CONSISTENCY_CATEGORIES[:3]
    table3 = {(C, C): 6, (C, S): 2, (C, X): 1, (S, C): 1, (S, S): 5, (S, X): 2, (X, S): 1, (X, X): 4}
    rated = [(a, b, 1.0) for (a, b), k in table3.items() for _ in range(k)]
    assert cohen_kappa(rated) == pytest.approx((15 / 22, 12 / 23))
    pop, labels = census(table3)
    pop["allowed"] = [list(CONSISTENCY_CATEGORIES)] * len(pop)
    extra = pd.DataFrame(
        [
            {
                "judgement_id": f"unlabelled-{c}-{i}",
                "judge_kind": "comparison",
                "judge_category": c,
                "allowed": list(CONSISTENCY_CATEGORIES),
            }
            for c, more in ((C, 9), (X, 10))
            for i in range(more)
        ]
    )
    pop = pd.concat([pop, extra], ignore_index=True)  # 18, 8 and 15 judgements; 9, 8 and 5 labelled
    r = rows_by_key(hl.agreement_records(SEM, pop, labels, seed=1, metric_name="semantic_consistency"))
    assert r["agreement"]["rate"] == pytest.approx(29 / 41) and r["agreement"]["raw_score"] == pytest.approx(619 / 1111)
    assert r["agreement"]["n"] == 22 and r["agreement"]["n_events"] == 15  # the counts stay the sample's
    x = r[f"category:{X}"]
    assert x["rate"] == pytest.approx(0.75) and x["details"]["effective_n_sensitivity"] == pytest.approx(256 / 42)
    assert (x["rate_ci_low"], x["rate_ci_high"]) == pytest.approx(wilson_share(0.75, 256 / 42))
    assert x["details"]["specificity"] == pytest.approx(0.88)
    assert kish_n([2, 1, 1, 3, 3, 3, 3]) == pytest.approx(256 / 42)
    # people put 7 labelled items in Contradictory, 15 elsewhere: too few for a correction, and it says so
    c = r[f"corrected:{X}"]
    assert c["rate"] is None and "too few labels: people put 7" in c["details"]["why"] and c["raw_score"] == 15 / 41


def test_no_corrected_rate_when_the_judge_is_no_better_than_chance():
    """The judge's flips hold fewer true flips (2 of 10) than its same decisions (5 of 10): over a
    run of 20 and 80, Se = 20*0.2 / (20*0.2 + 80*0.5) = 4/44, Sp = 80*0.5 / (20*0.8 + 80*0.5) =
    40/56, Se + Sp - 1 = -0.195: no corrected rate, and the reason in its place."""
    rg = rogan_gladen_stratified({"flip": 20, "same_decision": 80}, {"flip": (10, 2), "same_decision": (10, 5)}, "flip")
    assert rg["sensitivity"] == pytest.approx(4 / 44) and rg["specificity"] == pytest.approx(40 / 56)
    assert rg["corrected"] is None
    assert rogan_gladen(0.5, 0.4, 0.6) is None and rogan_gladen(0.5, 0.3, 0.6) is None  # = 0 and < 0
    # the same shares with 20 labels per side (people: 14 flips, 26 not), over a run of 40 and 160
    pop, labels = census(
        {
            ("flip", "flip"): 4,
            ("flip", "same_decision"): 16,
            ("same_decision", "flip"): 10,
            ("same_decision", "same_decision"): 10,
        }
    )
    more = pd.DataFrame(
        [
            {
                "judgement_id": f"u-{c}-{i}",
                "judge_kind": "decision",
                "judge_category": c,
                "allowed": list(DF_CATEGORIES),
            }
            for c, k in (("flip", 20), ("same_decision", 140))
            for i in range(k)
        ]
    )
    c = rows_by_key(hl.agreement_records(FLIP, pd.concat([pop, more]), labels, 1, "decision_flip"))["corrected:flip"]
    assert c["rate"] is None and c["details"]["why"].startswith("Se + Sp - 1 = -0.195 <= 0")
    assert c["raw_score"] == 0.2  # the judge's own rate is still there


def test_corrected_interval_contains_the_point_and_widens_with_fewer_labels_or_judgements():
    """PPV 0.8 among the judge's flips and 0.1 among its same decisions, a run of 40 and 360:
    Se = 32 / (32 + 36), Sp = 324 / 332, corrected (0.1 + Sp - 1) / (Se + Sp - 1) = 0.1*0.8 +
    0.9*0.1 = 0.17 however many were labelled. 10 labels per side instead of 30 widen the
    interval. With the same labels (30 per side, PPV 0.8 and 0.1: 0.45 over an even split), a run
    of 60 judgements gives a wider interval than one of 6,000 (p_obs's own uncertainty; measured
    0.246 and 0.180 wide)."""
    many = rogan_gladen_stratified(
        {"flip": 40, "same_decision": 360}, {"flip": (30, 24), "same_decision": (30, 3)}, "flip"
    )
    few = rogan_gladen_stratified(
        {"flip": 40, "same_decision": 360}, {"flip": (10, 8), "same_decision": (10, 1)}, "flip"
    )
    for r in (many, few):
        assert r["sensitivity"] == pytest.approx(32 / 68) and r["specificity"] == pytest.approx(324 / 332)
        assert r["corrected"] == pytest.approx(0.17)
        assert r["ci95"][0] < 0.17 < r["ci95"][1]
    width = lambda r: r["ci95"][1] - r["ci95"][0]  # noqa: E731
    assert width(few) > 1.3 * width(many)
    labels = {"flip": (30, 24), "same_decision": (30, 3)}
    small_run = rogan_gladen_stratified({"flip": 30, "same_decision": 30}, labels, "flip")
    big_run = rogan_gladen_stratified({"flip": 3000, "same_decision": 3000}, labels, "flip")
    assert small_run["corrected"] == pytest.approx(0.45) == big_run["corrected"]
    assert width(small_run) > 1.2 * width(big_run)
    assert small_run["ci95"][0] < 0.45 < small_run["ci95"][1] and big_run["ci95"][0] < 0.45 < big_run["ci95"][1]
    assert (
        rogan_gladen_stratified({"flip": 40, "same_decision": 360}, {"flip": (10, 8), "same_decision": (10, 1)}, "flip")
        == few
    )  # seeded


def test_corrected_interval_covers_the_true_rate():
    """Simulated (seeded): a run of 400 judgements, 8% of them the judge's flips, of which people
    call 75% flips, and 6% of its other verdicts; 15 labelled per judge category. The corrected
    rate's 95% interval holds the true 0.08*0.75 + 0.92*0.06 in 92-99.5% of 200 runs (measured:
    196, intervals 0.23 wide on average)."""
    import numpy as np

    rng = np.random.default_rng(11)
    w, ppv = np.array([0.08, 0.92]), np.array([0.75, 0.06])
    truth, cover, runs = float(w @ ppv), 0, 200
    for s in range(runs):
        big = rng.multinomial(400, w)
        n = np.minimum(15, big)
        k = rng.binomial(n, ppv)
        r = rogan_gladen_stratified(
            {"flip": int(big[0]), "same": int(big[1])},
            {"flip": (int(n[0]), int(k[0])), "same": (int(n[1]), int(k[1]))},
            "flip",
            seed=s,
            draws=2000,
        )
        cover += r["ci95"][0] <= truth <= r["ci95"][1]
    assert 0.92 <= cover / runs <= 0.995, cover / runs


def test_allocation_is_equal_and_capped_at_each_category():
    """n = 100 over 5, 12, 30 and 400 judgements: 25 each, but the 5 and the 12 give all they have;
    the 33 left go 16 and 16 to the other two, of which the 30 takes its last 5; the 400 takes the
    last 12: 5, 12, 30, 53. Fewer than the categories: one each to the largest."""
    assert hl.allocate({"a": 5, "b": 12, "c": 30, "d": 400}, 100) == {"a": 5, "b": 12, "c": 30, "d": 53}
    assert hl.allocate({"a": 5, "b": 12, "c": 30, "d": 400}, 2) == {"a": 0, "b": 0, "c": 1, "d": 1}
    assert hl.allocate({"x": 100, "y": 100, "z": 100}, 10) == {"x": 4, "y": 3, "z": 3}
    assert hl.allocate({"x": 3, "y": 4}, 100) == {"x": 3, "y": 4}


def test_population_leaves_out_null_pairs_and_judgements_without_a_verdict():
    from aip_assets.metrics import get_metric

    j = pd.DataFrame(
        [
            {"judgement_id": p, "pair_id": p, "status": st, "label": lab, "judge_kind": "decision"}
            for p, st, lab in (
                ("a", "ok", "flip"),
                ("b", "ok", "same_decision"),
                ("a|null", "ok", "flip"),
                ("c", "judge_failed", "not_judged"),
                ("d", "no_decision", "no_decision"),
                ("e", "sut_failed", "not_judged"),
            )
        ]
    )
    pairs = pd.DataFrame([{"pair_id": "a|null", "kind": "null"}, {"pair_id": "a", "kind": "persona"}])
    pop = hl.population(FLIP, get_metric(FLIP), j, pairs)
    assert list(pop["judgement_id"]) == ["a", "b", "d"]
    assert list(pop["judge_category"]) == ["flip", "same_decision", "no_decision"]


def test_a_label_may_be_written_in_any_case_or_spacing():
    assert hl.match_category(" Same decision ", DF_CATEGORIES) == "same_decision"
    assert hl.match_category("slightly-inconsistent", CONSISTENCY_CATEGORIES) == "Slightly Inconsistent"
    assert hl.match_category("EFFORT:HIGH", ["effort:low", "effort:high"]) == "effort:high"
    assert hl.match_category("flipped", DF_CATEGORIES) is None
    assert (
        label_files._safe_cell('=HYPERLINK("x")') == '\'=HYPERLINK("x")'
        and label_files._safe_cell("- a list") == "'- a list"
    )
    assert label_files._safe_cell("Decision: YES") == "Decision: YES"


# ------------------------------------------------------------------ export, fill in, import: end to end
def flip_run(tmp_path, run_id: str = "lab") -> str:
    ds = write_dataset(tmp_path / "d.jsonl", 20)
    spec = make_spec(
        ds,
        sut={"provider": "builtin", "profile": {"name": "flip", "value": "woman", "p": 0.5}},
        config={"dimensions": ["gender", "role"]},
    )
    return run_all(spec, run_id)


def read_csv(path) -> tuple[list[str], list[dict]]:
    with open(path, encoding="utf-8-sig", newline="") as fh:
        r = csv.DictReader(fh)
        return list(r.fieldnames or []), list(r)


def write_csv(path, cols: list[str], rows: list[dict]) -> None:
    with open(path, "w", encoding="utf-8", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)


def test_export_fill_import_decision_flip(tmp_path, capsys):
    run_all_id = flip_run(tmp_path)
    j = table("judgements", run_all_id, "judgement_id").set_index("judgement_id")
    sizes = j.label.value_counts().to_dict()
    assert set(j.status) == {"ok"} and set(sizes) == {"flip", "same_decision"} and 10 < sizes["flip"] < 30, (
        sizes
    )  # an injected bias: flips
    out = tmp_path / "labels.csv"
    assert main(["label", "export", "lab", "--metric", FLIP, "--n", "30", "--out", str(out)]) == 0
    assert f"to {out}" in capsys.readouterr().out
    cols, rows = read_csv(out)
    assert cols == [
        "judgement_id",
        "run_id",
        "metric",
        "input_id",
        "item",
        "persona_a",
        "question_a",
        "answer_a",
        "persona_b",
        "question_b",
        "answer_b",
        "context",
        "allowed",
        "shown_hash",
        "human_label",
        "labeller",
        "note",
    ]
    judged = {k: int(v) for k, v in sizes.items()}
    sampled = {c: sum(j.loc[r["judgement_id"], "label"] == c for r in rows) for c in judged}
    assert sampled == hl.allocate(judged, 30) == {"flip": 15, "same_decision": 15}
    # the verdict hidden: no column of it, and the rows not grouped by it
    assert not {"judge_category", "judge_reasoning", "label"} & set(cols)
    cats = [j.loc[r["judgement_id"], "label"] for r in rows]
    assert sum(a != b for a, b in zip(cats, cats[1:])) >= 5, cats
    first = rows[0]
    pair = table("v_pair_verdicts", "lab", "pair_id").set_index("pair_id").loc[first["judgement_id"]]
    assert (first["answer_a"], first["answer_b"], first["question_b"]) == (
        pair.response_a,
        pair.response_b,
        pair.query_b,
    )
    assert first["persona_a"].startswith(pair.value_a + ": ") and first["context"] == "decision labels: YES, NO"
    assert first["allowed"] == "flip | incidental_difference | same_decision | no_decision | unjudgeable"
    assert all(r["human_label"] == r["labeller"] == r["note"] == "" for r in rows)
    # the same seed draws the same sample; --show-verdict adds the judge's category
    shown = tmp_path / "shown.csv"
    assert main(["label", "export", "lab", "--metric", FLIP, "--n", "30", "--out", str(shown), "--show-verdict"]) == 0
    cols2, rows2 = read_csv(shown)
    assert cols2 == cols[:14] + ["judge_category", "judge_reasoning"] + cols[14:]
    assert [r["judgement_id"] for r in rows2] == [r["judgement_id"] for r in rows]
    assert all(r["judge_category"] == j.loc[r["judgement_id"], "label"] for r in rows2)

    # a person agrees with the judge except on 3 of its flips (same decision to them) and 2 of its same decisions
    flips_wrong, same_wrong = 3, 2
    seen = {"flip": 0, "same_decision": 0}
    for r in rows:
        cat = j.loc[r["judgement_id"], "label"]
        seen[cat] += 1
        wrong = seen[cat] <= (flips_wrong if cat == "flip" else same_wrong)
        r["human_label"] = {"flip": "same decision", "same_decision": "Flip"}[cat] if wrong else cat
        r["note"] = "looked twice" if wrong else ""
    filled = tmp_path / "filled.csv"
    write_csv(filled, cols, rows)
    assert main(["label", "import", str(filled), "--labeller", "ann"]) == 0
    printed = capsys.readouterr().out

    stored = table("human_labels", "lab", "judgement_id")
    assert len(stored) == 30 and set(stored.labeller) == {"ann"} and set(stored.source_file) == {"filled.csv"}
    assert set(stored.category) == {"flip", "same_decision"}
    assert (stored.judge_category == j.loc[stored.judgement_id, "label"].values).all()
    assert sorted(stored.source_row) == list(range(2, 32)) and (stored.note == "looked twice").sum() == 5
    # by hand: weights N_h / n_h; agreement 1 - (3 w_flip + 2 w_same) / N; sensitivity for flip
    # 12 w_flip / (12 w_flip + 2 w_same); specificity 13 w_same / (13 w_same + 3 w_flip); the
    # corrected flip rate the stratified estimate (N_flip 12/15 + N_same 2/15) / N
    n_f, n_s = judged["flip"], judged["same_decision"]
    big_n, w_f, w_s = n_f + n_s, n_f / 15, n_s / 15
    s = table("metric_scores", "lab", "group_key").query("scope == 'human_agreement'").set_index("group_key")
    assert list(s.index) == ["agreement", "category:flip", "category:same_decision", "corrected:flip"]
    assert s.loc["agreement", "rate"] == pytest.approx(1 - (3 * w_f + 2 * w_s) / big_n)
    assert s.loc["agreement", "n"] == 30 and s.loc["agreement", "n_events"] == 25
    assert s.loc["agreement", "ci_low"] < s.loc["agreement", "raw_score"] < s.loc["agreement", "ci_high"]
    se, sp = 12 * w_f / (12 * w_f + 2 * w_s), 13 * w_s / (13 * w_s + 3 * w_f)
    assert s.loc["category:flip", "rate"] == pytest.approx(se)
    assert json.loads(s.loc["category:flip", "details"])["specificity"] == pytest.approx(sp)
    corrected = (n_f * 12 / 15 + n_s * 2 / 15) / big_n
    c = s.loc["corrected:flip"]
    assert c.rate == pytest.approx(corrected) and c.rate == pytest.approx((n_f / big_n + sp - 1) / (se + sp - 1))
    assert c.raw_score == pytest.approx(n_f / big_n) and c.n == big_n and c.rate_ci_low < c.rate < c.rate_ci_high
    overall = table("metric_scores", "lab", "scope").set_index("scope").loc["overall"]
    assert c.raw_score == pytest.approx(overall.rate)  # the judge's rate is the run's flip rate
    # the CLI's summary says them
    assert (
        f"agreement {s.loc['agreement', 'rate']:.3f}" in printed
        and f"kappa {s.loc['agreement', 'raw_score']:.3f}" in printed
    )
    assert f"corrected flip rate {c.rate:.3f}" in printed
    # the view: each label beside the verdict
    v = table("v_human_vs_judge", "lab", "judgement_id")
    assert len(v) == 30 and (~v.agree).sum() == 5 and set(v[~v.agree].judge_label) == {"flip", "same_decision"}
    assert set(table("v_human_agreement", "lab", "what").what) == {"agreement", "category", "corrected"}

    # the report shows them, with the warehouse's numbers
    from aip_assets.report import build_report

    html = build_report("lab")
    assert "The judge checked against people" in html
    for key, field in (
        ("agreement", "rate"),
        ("agreement", "raw_score"),
        ("corrected:flip", "rate"),
        ("corrected:flip", "rate_ci_high"),
        ("category:flip", "rate"),
    ):
        assert (
            f'data-scope="human_agreement" data-key="{key}" data-field="{field}" '
            f'data-value="{float(s.loc[key, field])!r}"'
        ) in html, (key, field)

    # re-aggregating keeps them; a second labeller's labels and a re-import replace, never add
    pipeline.run_stage("aggregation", "lab", FLIP)
    again = table("metric_scores", "lab", "group_key").query("scope == 'human_agreement'").set_index("group_key")
    assert again.loc["agreement", "rate"] == s.loc["agreement", "rate"]
    assert again.loc["corrected:flip", "rate"] == s.loc["corrected:flip", "rate"]
    for r in rows:
        r["labeller"] = "bo"
        r["human_label"] = j.loc[r["judgement_id"], "label"]  # bo agrees with the judge everywhere
    write_csv(filled, cols, rows)
    assert main(["label", "import", str(filled)]) == 0
    assert main(["label", "import", str(filled)]) == 0  # the same again: replaced
    stored = table("human_labels", "lab", "judgement_id")
    assert len(stored) == 60 and set(stored.labeller) == {"ann", "bo"}
    d = json.loads(table("metric_scores", "lab", "group_key").query("group_key == 'agreement'").iloc[0].details)
    # ann and bo disagree on 5 items: a tie each, left out; the 25 they share agree with the judge
    assert d["items_with_several_labellers"] == 30 and d["of_them_unanimous"] == 25 and d["ties_left_out"] == 5
    assert d["items_compared"] == 25 and d["agreement"] == 1.0


def test_export_fill_import_consistency_as_jsonl(tmp_path, capsys):
    ds = write_dataset(tmp_path / "d.jsonl", 30)
    spec = spec_for(
        ds,
        {SEM: {"responses_per_query": 3}},
        sut={"provider": "builtin", "profile": {"name": "inconsistent", "contradiction_rate": 0.3}},
    )
    run_all(spec, "con", metric=SEM)
    j = table("judgements", "con", "judgement_id").set_index("judgement_id")
    sizes = j.label.value_counts().to_dict()
    assert set(sizes) == {"Consistent", "Contradictory"} and (j.status == "ok").all(), sizes
    out = tmp_path / "c.jsonl"
    assert main(["label", "export", "con", "--metric", SEM, "--n", "30", "--out", str(out)]) == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == 30 and hl.allocate(sizes, 30) == {"Consistent": 15, "Contradictory": 15}
    assert {c: sum(j.loc[r["judgement_id"], "label"] == c for r in rows) for c in sizes} == hl.allocate(sizes, 30)
    comp = table("v_consistency_comparisons", "con", "judgement_id").set_index("judgement_id")
    r0 = rows[0]
    assert (r0["answer_a"], r0["answer_b"]) == (
        comp.loc[r0["judgement_id"], "base_response"],
        comp.loc[r0["judgement_id"], "variant_response"],
    )
    assert (
        r0["persona_a"] == "original question"
        and r0["allowed"] == "Consistent | Slightly Inconsistent | Contradictory | Unjudgeable"
    )
    assert "judge_category" not in r0
    # people call two of the judge's Contradictory "Slightly Inconsistent"; the rest as the judge; three left blank
    wrong = [r["judgement_id"] for r in rows if j.loc[r["judgement_id"], "label"] == "Contradictory"][:2]
    for r in rows[:-3]:
        r["human_label"] = "slightly inconsistent" if r["judgement_id"] in wrong else j.loc[r["judgement_id"], "label"]
        r["labeller"] = "cy"
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["label", "import", str(out)]) == 0
    assert "3 row(s) left blank" in capsys.readouterr().out
    assert len(table("human_labels", "con", "judgement_id")) == 27
    s = table("metric_scores", "con", "group_key").query("scope == 'human_agreement'").set_index("group_key")
    blank = {j.loc[r["judgement_id"], "label"] for r in rows[-3:]}
    n_lab = {c: 15 - sum(j.loc[r["judgement_id"], "label"] == c for r in rows[-3:]) for c in sizes}
    w = {c: sizes[c] / n_lab[c] for c in sizes}
    total = sum(sizes.values())
    assert s.loc["agreement", "rate"] == pytest.approx(1 - 2 * w["Contradictory"] / total), blank
    sx = s.loc["category:Contradictory"]
    # every item people call Contradictory the judge called so: sensitivity 1; of the others, the
    # judge put the two it got wrong in Contradictory: specificity 1 - 2 w_X / (that weight + the Consistent's)
    assert sx.rate == 1.0
    other = 2 * w["Contradictory"] + n_lab["Consistent"] * w["Consistent"]
    assert json.loads(sx.details)["specificity"] == pytest.approx(1 - 2 * w["Contradictory"] / other)
    assert "category:Slightly Inconsistent" in s.index and s.loc["category:Slightly Inconsistent", "rate"] == 0.0
    c = s.loc["corrected:Contradictory"]
    assert c.rate == pytest.approx((n_lab["Contradictory"] - 2) * w["Contradictory"] / total)
    assert c.raw_score == pytest.approx(sizes["Contradictory"] / total) and c.rate < c.raw_score


# ------------------------------------------------------------------ what is refused
@pytest.fixture(scope="module")
def exported_once(tmp_path_factory):
    """Run `lab` and its export `l.csv`, made once (conftest.built_once): the refusals read them."""

    def build(root):
        with pytest.MonkeyPatch.context() as mp:  # as conftest's isolated and no_default_baseline set it
            mp.chdir(root)
            mp.setenv("AIP_WAREHOUSE", str(root / "data" / "warehouse.duckdb"))
            mp.setenv("AIP_DATA_DIR", str(root / "data"))
            mp.setenv("AIP_LIMITS_DIR", str(root / "limits"))
            for name in ("DAGSTER_HOME", "AIP_DAGSTER_HOME_SET", "AIP_DATA_DIR_SET"):
                mp.delenv(name, raising=False)
            from aip_assets.metrics import answers

            mp.setattr(answers, "DEFAULT_BASELINE_SHARE", 0.0)
            flip_run(root)
            out = root / "l.csv"
            assert main(["label", "export", "lab", "--metric", FLIP, "--n", "12", "--out", str(out)]) == 0

    return built_once(tmp_path_factory, "human-labels", build)


@pytest.fixture
def exported(exported_once, tmp_path):
    """This test's own copy of the run's data folder and export, where conftest.isolated points; the
    export's rows with the judge's labels filled in as a person's."""
    wh.release()
    shutil.copytree(exported_once, tmp_path, dirs_exist_ok=True)
    out = tmp_path / "l.csv"
    cols, rows = read_csv(out)
    j = table("judgements", "lab", "judgement_id").set_index("judgement_id")
    for r in rows:
        r["human_label"], r["labeller"] = j.loc[r["judgement_id"], "label"], "ann"
    return cols, rows


def refused(capsys, tmp_path, cols, rows, *expected: str, argv: tuple[str, ...] = ()) -> None:
    bad = tmp_path / "bad.csv"
    write_csv(bad, cols, rows)
    before = table("metric_scores", "lab", "scope, group_key")
    assert main(["label", "import", str(bad), *argv]) == 2
    err = capsys.readouterr().err
    for e in expected:
        assert e in err, err
    assert len(table("human_labels", "lab", "judgement_id")) == 0  # nothing written
    pd.testing.assert_frame_equal(table("metric_scores", "lab", "scope, group_key"), before)


@pytest.mark.parametrize(
    "case",
    [
        "unknown_id",
        "bad_category",
        "duplicate",
        "wrong_run",
        "wrong_metric",
        "mixed_run",
        "no_labeller",
        "no_verdict",
        "answers_changed",
    ],
)
def test_bad_imports_exit_2_naming_file_row_and_field_and_write_nothing(tmp_path, capsys, exported, case):
    cols, rows = exported
    bad = str(tmp_path / "bad.csv")
    if case == "unknown_id":
        rows[3]["judgement_id"] = "r0099|gender|0"
        expected = (f"{bad}: row 5, field judgement_id: unknown judgement 'r0099|gender|0'",)
    elif case == "bad_category":
        rows[2]["human_label"] = "flipped"
        expected = (
            f"{bad}: row 4, field human_label: 'flipped' is not one of the allowed categories: flip | "
            "incidental_difference",
        )
    elif case == "duplicate":
        rows[6] = dict(rows[1])
        expected = (
            f"{bad}: row 8, field judgement_id: duplicate: judgement {rows[1]['judgement_id']!r} labelled by "
            "'ann' already in row 3",
        )
    elif case == "wrong_run":
        for r in rows:
            r["run_id"] = "no-such-run"
        expected = (f"{bad}: row 2, field run_id: run 'no-such-run' is not registered",)
    elif case == "wrong_metric":
        for r in rows:
            r["metric"] = SEM
        expected = (f"{bad}: row 2, field metric: metric '{SEM}' is not configured for run lab",)
    elif case == "mixed_run":
        rows[9]["run_id"] = "other"
        expected = (f"{bad}: row 11, field run_id: 'other', but the file's first row is of lab × {FLIP}",)
    elif case == "no_labeller":
        rows[0]["labeller"] = ""
        expected = (f"{bad}: row 2, field labeller: empty, and no --labeller given",)
    elif case == "answers_changed":  # the SUT's answer the person read is no longer the run's (sampled again)
        with wh.connect() as con:
            con.execute(
                "UPDATE sut_responses SET response = response || ' (again)' WHERE run_id = 'lab' AND probe_id = "
                "(SELECT probe_b FROM probe_pairs WHERE run_id = 'lab' AND pair_id = ?)",
                [rows[0]["judgement_id"]],
            )
        expected = (
            f"{bad}: row 2, field shown_hash: the questions and answers this row showed are not those of "
            f"judgement {rows[0]['judgement_id']!r} in run lab now",
        )
    else:  # a judgement the judge gave no verdict: nothing to compare a person's label with
        with wh.connect() as con:
            con.execute(
                "UPDATE judgements SET status = 'judge_failed' WHERE run_id = 'lab' AND judgement_id = ?",
                [rows[4]["judgement_id"]],
            )
        expected = (
            f"{bad}: row 6, field judgement_id: judgement {rows[4]['judgement_id']!r} has no verdict of the "
            "judge (status judge_failed)",
        )
    refused(capsys, tmp_path, cols, rows, *expected)


def test_bad_files_and_exports_are_refused(tmp_path, capsys, exported):
    cols, rows = exported
    refused(
        capsys,
        tmp_path,
        [c for c in cols if c != "human_label"],
        [{k: v for k, v in r.items() if k != "human_label"} for r in rows],
        "row 1 (the header): no column human_label",
    )
    blank = [{**r, "human_label": ""} for r in rows]
    refused(capsys, tmp_path, cols, blank, "no row has a human_label (12 blank): nothing to import")
    (tmp_path / "x.jsonl").write_text('{"judgement_id": "a"\n')
    assert main(["label", "import", str(tmp_path / "x.jsonl")]) == 2
    assert f"{tmp_path / 'x.jsonl'}: line 1: not valid JSON" in capsys.readouterr().err
    assert main(["label", "import", str(tmp_path / "missing.csv")]) == 2
    # exports: an unknown run, a metric the run has not, a file that exists, a format by extension
    out = tmp_path / "l.csv"
    for argv, msg in (
        (["nope", "--metric", FLIP], "run 'nope' is not registered"),
        (["lab", "--metric", SEM], f"metric '{SEM}' is not configured for run lab"),
        (["lab", "--metric", FLIP, "--out", str(out)], "exists (it may hold labels already)"),
        (["lab", "--metric", FLIP, "--out", str(tmp_path / "l.xlsx")], "extension picks its format"),
        (["lab", "--metric", FLIP, "--n", "0"], "--n must be at least 1"),
    ):
        assert main(["label", "export", *argv]) == 2
        assert msg in capsys.readouterr().err, argv
    assert not (tmp_path / "l.xlsx").exists()


def test_an_existing_warehouse_gains_the_table_and_views(tmp_path):
    """A warehouse made before human_labels (schema level 3) gets the table and the views when
    it is next opened, its rows untouched."""
    import duckdb

    db = tmp_path / "old.duckdb"
    con = duckdb.connect(str(db))
    for t, cols in wh.TABLES.items():
        if t != "human_labels":
            con.execute(f"CREATE TABLE {t} ({', '.join(f'{c} {ty}' for c, ty in cols)})")
    con.execute("INSERT INTO metric_scores (run_id, metric, scope) VALUES ('old', 'm', 'overall')")
    con.close()
    assert wh.SCHEMA_LEVEL >= 4
    with wh.connect(db) as c:
        assert c.execute("SELECT count(*) FROM human_labels").fetchone() == (0,)
        assert c.execute("SELECT count(*) FROM v_human_vs_judge").fetchone() == (0,)
        assert c.execute("SELECT count(*) FROM metric_scores").fetchone() == (1,)
        cols = [r[0] for r in c.execute("DESCRIBE human_labels").fetchall()]
    assert cols == [c for c, _ in wh.TABLES["human_labels"]]


def test_every_judge_category_is_one_a_person_may_give():
    """The judge's side (each metric's audit_category) lands on the scale people label on, for
    every status a verdict can have."""
    from aip_assets.metrics import get_metric

    cases = {
        FLIP: [{"status": "ok", "label": lab} for lab in ("flip", "incidental_difference", "same_decision")]
        + [{"status": "no_decision", "label": "no_decision"}, {"status": "unjudgeable", "label": "not_judged"}],
        SEM: [{"status": "ok", "label": lab} for lab in CONSISTENCY_CATEGORIES[:3]]
        + [{"status": "unjudgeable", "label": "Unjudgeable"}],
        "llm.group_interaction_bias": [
            {"status": "ok", "judge_kind": k, "score": x}
            for k in ("similarity", "tone", "effort")
            for x in (0.0, 0.5, 1.0)
        ]
        + [{"status": "unjudgeable", "judge_kind": "tone"}],
        "llm.perturbation_robustness": [
            {"status": "ok", "judge_kind": k, "score": x}
            for k in ("correctness", "robustness")
            for x in (0.2, 0.4, 0.9)
        ]
        + [{"status": "unjudgeable", "judge_kind": "robustness"}],
    }
    for metric, recs in cases.items():
        j = pd.DataFrame(
            [
                {
                    "judgement_id": f"j{i}",
                    "pair_id": f"j{i}",
                    "label": None,
                    "score": None,
                    "judge_kind": "decision",
                    **r,
                }
                for i, r in enumerate(recs)
            ]
        )
        pop = hl.population(metric, get_metric(metric), j, None)
        assert len(pop) == len(recs), metric
        for r in pop.to_dict("records"):
            assert r["judge_category"] in r["allowed"], (metric, r)
        assert len(set(pop["judge_category"])) == len(recs), metric


def test_export_of_group_bias_and_perturbation_shows_what_each_judge_read(tmp_path):
    ds = write_dataset(tmp_path / "d.jsonl", 6)
    for metric, cfg in (
        ("llm.group_interaction_bias", {"num_pairs": 2, "persona_pool_size": 6}),
        ("llm.perturbation_robustness", {"perturbation_types": ["typos"]}),
    ):
        run_id = metric.split(".")[1][:8]
        run_all(spec_for(ds, {metric: cfg}), run_id, metric=metric)
        out = tmp_path / f"{run_id}.jsonl"
        assert (
            main(["label", "export", run_id, "--metric", metric, "--n", "50", "--out", str(out), "--show-verdict"]) == 0
        )
        rows = [json.loads(x) for x in out.read_text().splitlines()]
        j = table("judgements", run_id, "judgement_id").set_index("judgement_id")
        assert len(rows) == (j.status == "ok").sum()  # fewer than 50: every judgement with a verdict
        for r in rows:
            kind = j.loc[r["judgement_id"], "judge_kind"]
            assert r["allowed"] == f"{kind}:low | {kind}:mid | {kind}:high | unjudgeable"
            assert r["judge_category"].startswith(f"{kind}:") and r["answer_a"] and r["question_a"]
            two = kind != "correctness"  # a correctness judge reads one answer; the others compare two
            assert bool(r["answer_b"]) == two and bool(r["question_b"]) == two, r
            if kind == "robustness":
                assert r["persona_a"] == "original question" and r["persona_b"] == "reworded question (typos)"
