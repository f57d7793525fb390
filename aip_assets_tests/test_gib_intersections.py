"""llm.group_interaction_bias with intersections and name personas (issue 37): the combination columns, the pool that
holds and separates every combination, and claims that blame a combination alone when only it is
treated worse."""

import json
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


# ---------------------------------------------------------------- the metric end to end (builtin SUT and judges)

M = "llm.group_interaction_bias"


def gib_spec(ds, entry=None, config=None, **kw):
    from aip_assets.runspec import parse_spec

    from .conftest import make_spec

    data = make_spec(ds, **kw).model_dump()
    data["metrics"] = {M: {"config": config or {}, **(entry or {})}}
    return parse_spec(data)


def claims_of(run_id):
    from .conftest import table

    s = table("metric_scores", run_id, "scope, group_key")
    return s, {r.group_key: json.loads(r.details) for r in s[s.scope == "claim"].itertuples()}


ENTRY = {"intersections": [["gender", "ethnicity"]]}
CONFIG = {"persona_pool_size": 48, "num_pairs": 8}


def test_a_fair_sut_with_intersections_claims_nothing(tmp_path):
    from .conftest import run_all, write_dataset

    run_all(gib_spec(write_dataset(tmp_path / "d.jsonl", 30), ENTRY, CONFIG), "fair", metric=M)
    _, fair = claims_of("fair")
    assert not [k for k, c in fair.items() if c.get("claimed")]
    assert len([k for k in fair if k.startswith("group:gender×ethnicity=")]) == 35  # measured, in the family


def test_calibration_terse_against_one_combination_blames_it_alone(tmp_path):
    """The builtin SUT answers Black women tersely and nobody else: the run claims the combination
    (its gap's interval above 0, pointing the right way), and neither gender=woman nor ethnicity=Black
    alone nor any other combination."""
    from .conftest import run_all, table, write_dataset

    ds = write_dataset(tmp_path / "d.jsonl", 30)
    terse = {"name": "terse", "terse_intersection": {"gender": "woman", "ethnicity": "Black"}}
    run_all(gib_spec(ds, ENTRY, CONFIG, sut={"provider": "builtin", "profile": terse}), "terse", metric=M)
    s, claims = claims_of("terse")
    made = {k for k, c in claims.items() if c.get("claimed")}
    true = {"group:gender×ethnicity", "group:gender×ethnicity=woman×Black"}
    assert true <= made <= true | {"excess:all"}
    row = s[(s.scope == "claim") & (s.group_key == "group:gender×ethnicity=woman×Black")].iloc[0]
    assert row.raw_score > 0.3 and row.ci_low > 0  # the combination's pairs differ more, beyond chance
    group = s[(s.scope == "group") & (s.group_key == "gender×ethnicity=woman×Black")].iloc[0]
    assert group.score < 0.8 and group.ci_high < 1.0  # its adjusted equitability, with its interval
    others = s[
        (s.scope == "group") & s.group_key.str.startswith("gender×ethnicity=") & (s.group_key != group.group_key)
    ]
    assert len(others) > 20 and (others.score.dropna() > group.ci_high).all()
    from aip_assets.findings import run_findings

    findings = run_findings("terse", [M])
    said = [f.sentence for f in findings if f.scope == "group"]
    assert said and said[0].startswith("Black women get less equitable answers")
    assert not any(t.startswith(("gender=woman", "ethnicity=Black")) for t in said)
    assert table("run_notes", "terse", "code").empty or "intersection_uncovered" not in set(
        table("run_notes", "terse", "code").code
    )


# ---------------------------------------------------------------- name personas


def test_name_personas_say_a_name_and_the_rest_as_explicit_personas_do():
    from aip_assets.catalog import names
    from aip_assets.catalog.attributes import values
    from aip_assets.catalog.personas import name_personas

    pool = name_personas(24, 7)
    phrase = {(v.axis, v.value): v.phrase for axis in ("religion", "role") for v in values(axis)}
    by_cell: dict = {}
    for p in pool:
        a = p["attributes"]
        assert set(a) == {"gender@name", "ethnicity@name", "religion", "role"}
        # only the name differs from another persona of the same religion and role: the rest is byte-identical,
        # the explicit personas' own sentences
        assert names.strip_name(p["description"]) == (
            f"My name is <name>. {phrase[('religion', a['religion'])]} {phrase[('role', a['role'])]}"
        )
        assert names.attributes_in(p["description"]) == {"gender": a["gender@name"], "ethnicity": a["ethnicity@name"]}
        by_cell.setdefault((a["gender@name"], a["ethnicity@name"]), set()).add(p["name"])
    assert set(by_cell) == set(names.cells())  # every cell the names offer
    assert all(len(v) >= 3 for v in by_cell.values())  # several names per group, not one standing for it
    assert name_personas(24, 7) == pool and name_personas(24, 8) != pool  # drawn with the run's seed


def test_both_forms_key_name_personas_at_name_and_pair_within_a_form(tmp_path):
    from aip_assets.metrics.base import StageContext
    from aip_assets.metrics.group_interaction_bias import GroupInteractionBias, GroupInteractionBiasConfig

    from .conftest import write_dataset

    spec = gib_spec(write_dataset(tmp_path / "d.jsonl", 2), {"persona_form": "both"}, {"persona_pool_size": 6})
    ctx = StageContext(
        run_id="r",
        metric=M,
        spec=spec,
        config=GroupInteractionBiasConfig(persona_pool_size=6),
        journal=None,
        reader=None,
    )
    personas, universe, _ = GroupInteractionBias().persona_pool(ctx)
    assert len(personas) == 12
    named = {i for i, p in enumerate(personas) if p["source"] == "names"}
    assert len(named) == 6 and all(set(personas[i]["attributes"]) >= {"gender@name", "ethnicity@name"} for i in named)
    assert all("gender" in p["attributes"] for i, p in enumerate(personas) if i not in named)
    assert all((a in named) == (b in named) for a, b in universe)  # never an explicit persona against a name one
    assert len(universe) == 2 * 15


def test_a_language_without_names_is_a_spec_error_naming_the_field(tmp_path):
    """Refused with the spec, before anything is registered; the pool's own check stays behind it."""
    from aip_assets.errors import SpecError
    from aip_assets.metrics.base import StageContext
    from aip_assets.metrics.group_interaction_bias import GroupInteractionBias, GroupInteractionBiasConfig

    from .conftest import write_dataset

    ds = write_dataset(tmp_path / "d.jsonl", 2)
    with pytest.raises(SpecError, match=r"llm\.group_interaction_bias\.persona_form: no names catalogue for .*'de'"):
        gib_spec(ds, {"persona_form": "name"}, {"language": "de"})
    spec = gib_spec(ds, {"persona_form": "name"})
    ctx = StageContext(
        run_id="r", metric=M, spec=spec, config=GroupInteractionBiasConfig(language="de"), journal=None, reader=None
    )
    with pytest.raises(SpecError, match=r"metrics\.llm\.group_interaction_bias\.persona_form: name: .*'de'"):
        GroupInteractionBias().persona_pool(ctx)


def test_both_forms_find_a_group_told_and_named_side_by_side(tmp_path):
    """A SUT terse with Black personas however it learns it (statements or a name): both forms find
    it, ethnicity=Black beside ethnicity@name=Black in the summary."""
    from aip_assets.metrics.group_interaction_bias import GroupInteractionBias

    from .conftest import run_all, write_dataset

    sut = {"provider": "builtin", "profile": {"name": "custom", "terse_value": "Black", "persona_signal": "both"}}
    spec = gib_spec(
        write_dataset(tmp_path / "d.jsonl", 20),
        {"persona_form": "both"},
        {"persona_pool_size": 16, "num_pairs": 8},
        sut=sut,
    )
    run_all(spec, "both", metric=M)
    s, claims = claims_of("both")
    made = {k for k, c in claims.items() if c.get("claimed")}
    assert {"group:ethnicity=Black", "group:ethnicity@name=Black"} <= made
    assert not {k for k in made if "=" in k} - {"group:ethnicity=Black", "group:ethnicity@name=Black"}
    summary = GroupInteractionBias().summary(s.astype(object).where(s.notna(), None))
    row = next(r for r in summary["by_form"] if r["group"] == "ethnicity=Black")
    assert row["explicit_status"] == row["name_status"] == "claimed"
    lines = GroupInteractionBias().format_summary(summary)
    assert any(line.startswith("  ethnicity=Black: told ") and "by name" in line for line in lines)


def test_a_combination_by_name_that_is_one_of_its_values_is_measured_as_the_value(monkeypatch):
    """Were no catalogue name to signal a Black man, by name the Black women would be every Black
    persona: the combination is left out (it would make ethnicity@name=Black inseparable), and the
    run says so. With Black men's names (the catalogue today) every combination stays."""
    from aip_assets.catalog import names
    from aip_assets.catalog.personas import name_personas
    from aip_assets.metrics.group_interaction_bias.aggregate import drop_named_aliases

    pool = name_personas(12, 7)
    attrs = drop_named_aliases({f"p{i}": combination_attributes(p["attributes"], GE) for i, p in enumerate(pool)})
    held = {a.get("gender×ethnicity@name") for a in attrs.values()}
    assert {"woman×Black", "man×Black", "woman×white", "man×Hispanic"} <= held
    assert not [n for n in coverage_notes(pool, GE, "en") if n["code"] == "intersection_by_name"]

    offered = [c for c in names.cells() if c != ("man", "Black")]
    monkeypatch.setattr(names, "cells", lambda language="en": offered)
    pool = name_personas(10, 7)
    attrs = drop_named_aliases({f"p{i}": combination_attributes(p["attributes"], GE) for i, p in enumerate(pool)})
    held = {a.get("gender×ethnicity@name") for a in attrs.values()}
    assert "woman×Black" not in held and {"woman×white", "man×Hispanic"} <= held
    notes = coverage_notes(pool, GE, "en")
    assert [n["code"] for n in notes] == ["intersection_by_name"]
    assert "woman×Black is the only cell of ethnicity=Black by name" in notes[0]["message"]
    # explicit combinations stay whatever the pool
    explicit = {"a": {"gender": "woman", "ethnicity": "Black"}, "b": {"gender": "man", "ethnicity": "white"}}
    crossed = {p: combination_attributes(a, GE) for p, a in explicit.items()}
    assert drop_named_aliases(crossed) == crossed
