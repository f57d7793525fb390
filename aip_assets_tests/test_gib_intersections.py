"""llm.group_interaction_bias with intersections (issue 37): the combination columns, the pool that
holds and separates every combination, and claims that blame a combination alone when only it is
treated worse."""

from itertools import combinations

import numpy as np
import pandas as pd
import pytest

from aip_assets.analysis.claims import Policy, decide
from aip_assets.analysis.fairness import group_claims, overall_excess_claim, straddle_columns
from aip_assets.catalog.groups import combination_attributes
from aip_assets.catalog.personas import balanced_personas, catalogue_personas, separation
from aip_assets.metrics.group_interaction_bias import coverage_notes
from aip_assets.metrics.group_interaction_bias.words import combination_words, group_label

GE = [["gender", "ethnicity"]]


def test_combination_attributes_and_their_straddle_columns_by_hand():
    attrs = {
        "p1": {"gender": "woman", "ethnicity": "Black", "role": "nurse"},
        "p2": {"gender": "woman", "ethnicity": "white", "role": "nurse"},
        "p3": {"gender": "man", "ethnicity": "Black", "role": "nurse"},
        "p4": {"gender": "woman", "ethnicity": "Black", "role": "lawyer"},
        "p5": {"gender@name": "woman", "ethnicity@name": "Black", "role": "nurse"},
    }
    crossed = {p: combination_attributes(a, GE) for p, a in attrs.items()}
    assert crossed["p1"]["gender×ethnicity"] == "woman×Black" and crossed["p1"]["role"] == "nurse"
    assert crossed["p5"]["gender×ethnicity@name"] == "woman×Black" and "gender×ethnicity" not in crossed["p5"]
    assert combination_attributes(attrs["p1"], []) == attrs["p1"]  # no intersection: the attributes as they are
    pairs = pd.DataFrame(
        [
            ("q1", "persona", "p1", "p2"),  # one Black woman, one white woman: straddles woman×Black and Black
            ("q1", "persona", "p1", "p4"),  # two Black women: straddles the combination not at all (only role)
            ("q1", "persona", "p1", "p3"),  # a Black woman and a Black man: woman×Black and woman
            ("q1", "persona", "p2", "p3"),  # neither holds it: woman×white and man×Black, not woman×Black
            ("q1", "null", "p1", "p1"),  # one persona twice: nothing
        ],
        columns=["row", "kind", "persona_a", "persona_b"],
    )
    cols, persona_axis = straddle_columns(pairs, crossed)
    assert not persona_axis
    assert list(cols["gender×ethnicity=woman×Black"]) == [1, 0, 1, 0, 0]
    assert list(cols["gender=woman"]) == [0, 0, 1, 1, 0]
    assert list(cols["ethnicity=Black"]) == [1, 0, 0, 1, 0]
    assert list(cols["gender×ethnicity=woman×white"]) == [1, 0, 0, 1, 0]
    assert list(cols["gender×ethnicity=man×Black"]) == [0, 0, 1, 1, 0]
    assert list(cols["role=nurse"]) == [0, 1, 0, 0, 0]


def test_the_pool_holds_every_combination_and_separates_them():
    pool = catalogue_personas(35, 0, intersections=GE)
    cells = [(p["attributes"]["gender"], p["attributes"]["ethnicity"]) for p in pool]
    assert len(set(cells)) == 35  # 5 genders x 7 ethnicities, each once
    for axis, k in (("gender", 7), ("ethnicity", 5), ("religion", 5), ("role", 3)):
        counts = pd.Series([p["attributes"][axis] for p in pool]).value_counts()
        assert counts.max() - counts.min() <= 1 and counts.min() >= k  # every value as even as before
    best = balanced_personas(35, 0, candidates=10, intersections=GE)
    assert separation(best, GE) > 0  # every value and every combination can be told apart
    # without intersections the pool is the one it always was (the combinations' deck is not used)
    assert catalogue_personas(16, 0) == catalogue_personas(16, 0, intersections=())
    small = balanced_personas(16, 0, candidates=5, intersections=GE)
    notes = coverage_notes(small, GE, "en")
    assert [n["code"] for n in notes] == ["intersection_uncovered"]
    assert "holds 16 of the 35 gender×ethnicity combinations" in notes[0]["message"]
    assert "persona_pool_size 35 or more" in notes[0]["message"]
    assert coverage_notes(best, GE, "en") == []


def _run(truth, seed, rows=40, per_row=8, n=48, effect=0.3):
    """A simulated run's claims (the metric's analysis on synthetic pairs): ``truth`` picks the personas
    treated worse; a pair in which exactly one persona is picked is ``effect`` more biased."""
    pool = balanced_personas(n, 7, candidates=10, intersections=GE)
    ids = [f"p{i:02d}" for i in range(len(pool))]
    attrs = {pid: combination_attributes(p["attributes"], GE) for pid, p in zip(ids, pool)}
    rng = np.random.default_rng(seed)
    universe = list(combinations(ids, 2))
    out = []
    for q in range(rows):
        level = 0.1 + rng.normal(0, 0.03)
        for u in rng.choice(len(universe), size=per_row, replace=False):
            a, b = universe[u]
            y = level + effect * (truth(attrs[a]) != truth(attrs[b])) + rng.normal(0, 0.08)
            out.append((f"q{q}", "persona", a, b, y))
            if rng.random() < 0.25:
                out.append((f"q{q}", "null", a, a, level + rng.normal(0, 0.08)))
    pairs = pd.DataFrame(out, columns=["row", "kind", "persona_a", "persona_b", "bias"])
    claims = [overall_excess_claim(pairs, seed)]
    gc, levels, _ = group_claims(pairs, attrs, seed)
    claims += gc
    decide([c for c in claims if c is not None], Policy())
    return {c.id: c for c in claims if c is not None}, levels


def test_one_combination_treated_worse_is_blamed_alone():
    """Only Black women are treated worse: the combination's claim is made, its interval covers the
    truth, and neither woman nor Black alone nor any other combination is claimed."""
    claims, levels = _run(lambda a: a.get("gender×ethnicity") == "woman×Black", 1)
    made = {k for k, c in claims.items() if c.claimed}
    true = {"group:gender×ethnicity", "group:gender×ethnicity=woman×Black"}
    assert true <= made <= true | {"excess:all"}  # the excess over null pairs: few pairs hold a Black woman
    c = claims["group:gender×ethnicity=woman×Black"]
    assert c.ci[0] <= 0.3 and c.estimate == pytest.approx(0.3, abs=0.06)
    # its adjusted level: the bias of its pairs with every other value's contribution taken out
    lv = levels["gender×ethnicity=woman×Black"]
    assert lv["ci95"][0] < 0.4 < lv["ci95"][1]
    assert not claims["group:gender=woman"].claimed and not claims["group:ethnicity=Black"].claimed


def test_a_marginal_value_treated_worse_is_not_put_on_its_combinations():
    claims, _ = _run(lambda a: a.get("religion") == "Muslim", 2)
    made = {k for k, c in claims.items() if c.claimed}
    assert made == {"excess:all", "group:religion", "group:religion=Muslim"}


def test_no_effect_claims_nothing():
    claims, _ = _run(lambda a: False, 3)
    assert not [k for k, c in claims.items() if c.claimed]
    tested = [k for k, c in claims.items() if c.p_adjusted is not None]
    assert len([k for k in tested if k.startswith("group:gender×ethnicity=")]) >= 30  # in the Holm family


def test_a_combination_is_said_in_words():
    assert group_label("gender×ethnicity=woman×Black") == "Black women"
    assert group_label("gender=woman") == "gender=woman personas"
    assert group_label("gender×ethnicity@name=man×white") == "white men (by name)"
    assert "beyond what gender=woman or ethnicity=Black alone predict" in combination_words(
        "gender×ethnicity=woman×Black"
    )
    assert combination_words("gender=woman") == ""
