"""Two attributes at once (analysis/intersections.py): which combination departs from what its
two attributes alone predict, on hand-derived inputs with exclusions and shuffled orders; the
benchmark (benchmarks/bench_intersections.py) measures false claims and power over hundreds of runs."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from aip_assets.analysis.claims import Policy, decide
from aip_assets.analysis.intersections import interaction_claims

AXIS = "gender×ethnicity"


def rectangle_answers(n_q: int, bad: int) -> pd.DataFrame:
    """n_q questions, each asking the four personas of one rectangle once; every answer favourable
    except woman×Black's in the first ``bad`` questions and man×Black's in the last one; plus an
    answer without a decision (NaN)."""
    rows = []
    for q in range(n_q):
        for g in ("woman", "man"):
            for e in ("Black", "white"):
                y = (
                    0.0
                    if ((g, e) == ("woman", "Black") and q < bad) or ((g, e) == ("man", "Black") and q == n_q - 1)
                    else 1.0
                )
                rows.append({"question": f"q{q:02d}", "value": f"{g}×{e}", "favourable": y})
    rows.append({"question": "q00", "value": "man×white", "favourable": float("nan")})
    return pd.DataFrame(rows)


def test_one_rectangle_per_question_by_hand():
    """Within each question the difference in differences (wB - wW - mB + mW) is -1 where only
    woman×Black is unfavourable (14 of 16 questions), 0 in one, +1 where only man×Black is (1): the
    interaction is their mean, -13/16; its prediction from gender and ethnicity alone is wW + mB - mW
    averaged, 15/16. Of the four combinations, which fit a 2 × 2 table equally, the one named
    leaves gender and ethnicity least to explain (woman×Black). Held apart from it, gender=woman's
    contrast is wW - mW = 0, ethnicity=Black's mB - mW = -1/16, neither beyond chance (nor testable:
    each rests on the one combination left)."""
    a = rectangle_answers(16, 14)
    claims, cells = interaction_claims(a, AXIS, seed=1, n_boot=999)
    by = {c.id: c for c in claims}
    assert [c.value for c in claims if c.kind == "interaction" and c.value] == ["woman×Black"]
    c = by[f"interaction:{AXIS}=woman×Black"]
    assert c.estimate == pytest.approx(-13 / 16)
    assert cells["woman×Black"] == pytest.approx(
        {"rate": 2 / 16, "answers": 16, "named": True, "interaction": -13 / 16, "predicted": 15 / 16}
    )
    assert cells["man×white"]["answers"] == 16  # the answer without a decision is not counted
    # the single-attribute contrasts with woman×Black held apart
    expect = {"gender=woman": 0.0, "gender=man": 0.0, "ethnicity=Black": -1 / 16, "ethnicity=white": 1 / 16}
    for key, value in expect.items():
        m = by[f"main:{AXIS}:{key}"]
        assert m.facts["estimate_all"] == pytest.approx(value, abs=1e-9), key
        # in a 2 x 2 table with one combination apart, each value's contrast rests on one combination
        # (woman's on woman×white): it cannot be told from that combination's own treatment, never tested
        assert m.test is None and "rests on one combination" in m.why, key
    decided = {c.id: c for c in decide(claims, Policy())}
    assert decided[f"interaction:{AXIS}"].claimed and decided[f"interaction:{AXIS}=woman×Black"].claimed
    assert not any(c.claimed for c in decided.values() if c.kind == "main")


def test_shuffled_order_gives_the_same_claims():
    a = rectangle_answers(16, 14)
    b = a.sample(frac=1.0, random_state=5).reset_index(drop=True)
    ca, _ = interaction_claims(a, AXIS, seed=4, n_boot=499)
    cb, _ = interaction_claims(b, AXIS, seed=4, n_boot=499)
    assert [(c.id, c.estimate, c.p_value) for c in ca] == [(c.id, c.estimate, c.p_value) for c in cb]


def simulate(target=None, marginal=None, seed=0, n_q=40, drop=0.9):
    """Questions each asking 3 rectangles of gender (woman, man) × ethnicity (4 values); a
    favourable decision turned unfavourable with probability ``drop`` for the ``target`` combination
    or every persona holding the ``marginal`` value."""
    rng = np.random.default_rng(seed)
    eth = ("Black", "white", "Hispanic", "Asian")
    rows = []
    for q in range(n_q):
        base = rng.uniform(0.3, 0.9)
        for _ in range(3):
            for e in rng.choice(4, 2, replace=False):
                for g in ("woman", "man"):
                    y = float(rng.random() < base)
                    hit = (g, eth[e]) == target or marginal in (g, eth[e])
                    if hit and y and rng.random() < drop:
                        y = 0.0
                    rows.append({"question": f"q{q}", "value": f"{g}×{eth[e]}", "favourable": y})
    return pd.DataFrame(rows)


def claimed(a: pd.DataFrame, seed: int) -> set[str]:
    claims, _ = interaction_claims(a, AXIS, seed=seed, n_boot=499)
    return {c.id for c in decide(claims, Policy()) if c.claimed}


def test_one_combination_is_named_and_neither_of_its_attributes_blamed():
    made = claimed(simulate(target=("woman", "Black"), seed=11), 11)
    assert f"interaction:{AXIS}=woman×Black" in made
    assert not {m for m in made if m.startswith("main:")}, made
    assert {m for m in made if m.startswith(f"interaction:{AXIS}=")} == {f"interaction:{AXIS}=woman×Black"}


def test_one_attribute_is_blamed_and_no_combination_named():
    made = claimed(simulate(marginal="woman", seed=12), 12)
    assert f"main:{AXIS}:gender=woman" in made
    assert not {m for m in made if m.startswith(f"interaction:{AXIS}=")}, made


def test_a_fair_system_gets_no_claim():
    assert claimed(simulate(seed=13), 13) == set()


def test_a_value_is_claimed_only_if_it_holds_with_any_one_combination_left_out():
    """Every woman treated worse: gender=woman's contrast holds without any one ethnicity, claimed.
    Black women alone, with too few answers for the interaction to be named: ethnicity=Black's and
    gender=woman's contrasts vanish once woman×Black is left out, so neither is claimed."""
    assert f"main:{AXIS}:gender=woman" in claimed(simulate(marginal="woman", seed=21, n_q=24), 21)
    for seed in range(22, 26):
        made = claimed(simulate(target=("woman", "Black"), seed=seed, n_q=12, drop=0.6), seed)
        assert not {m for m in made if m.startswith("main:")}, (seed, made)


def test_one_value_of_an_attribute_is_not_tested_but_said():
    a = rectangle_answers(6, 3)
    a = a[a["value"].str.startswith("woman")]
    claims, _ = interaction_claims(a, AXIS, seed=1, n_boot=199)
    assert len(claims) == 1 and claims[0].why == "the answers hold one value of gender only"
