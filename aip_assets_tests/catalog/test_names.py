"""The names catalogue: its figures, its rule, its seeded draws and its reading of names back."""

from __future__ import annotations

import csv
from importlib.resources import files

import pytest

from aip_assets.catalog import names
from aip_assets.catalog.attributes import values


def _raw(name: str) -> list[dict[str, str]]:
    text = files("aip_assets.catalog").joinpath(name).read_text(encoding="utf-8")
    return list(csv.DictReader(text.splitlines()))


def test_every_row_has_a_known_source_and_a_known_value():
    keys = set(names.sources())
    assert keys == {"crabtree2023", "tzioumis2018", "ssa_national"}
    for src in names.sources().values():
        assert src["citation"] and src["what_was_measured"] and src["read_from"]
    ethnicities = {v.value for v in values("ethnicity")}
    genders = {v.value for v in values("gender")}
    for r in _raw("names.csv"):
        assert r["part"] in ("first", "last")
        assert r["ethnicity"] in ethnicities and r["ethnicity_source"] in keys
        assert r["ethnicity_measure"] == names.sources()[r["ethnicity_source"]]["measure"]
        if r["part"] == "first":
            assert r["gender"] in genders and r["gender_source"] == "ssa_national"
        else:
            assert r["gender"] == r["gender_share"] == r["gender_source"] == ""
    for r in _raw("names_full.csv"):
        assert r["ethnicity_source"] == "crabtree2023"


def test_every_shipped_row_meets_the_thresholds():
    rows = _raw("names.csv")
    assert len(names.catalogue_rows()) == len(rows)  # nothing shipped that the rule would drop
    for r in rows:
        share = float(r["ethnicity_share"])
        if r["ethnicity_measure"] == "perception":
            assert share >= names.PERCEPTION_MIN
        else:
            assert share >= names.COMPOSITION_MIN and int(r["ethnicity_n"]) >= names.COMPOSITION_N_MIN
        if r["part"] == "first":
            assert float(r["gender_share"]) >= names.GENDER_MIN
    # a first name is catalogued once: one gender, one ethnicity
    firsts = [r["name"] for r in rows if r["part"] == "first"]
    assert len(firsts) == len(set(firsts))


def test_cells_offered_and_not_offered():
    assert names.cells() == [
        ("woman", "Black"),
        ("woman", "white"),
        ("woman", "Hispanic"),
        ("man", "white"),
        ("man", "Hispanic"),
    ]
    assert names.name_values("gender") == ["woman", "man"]
    assert names.name_values("ethnicity") == ["Black", "white", "Hispanic"]
    with pytest.raises(KeyError, match="names signal no axis 'religion'"):
        names.name_values("religion")
    with pytest.raises(KeyError, match="no catalogue names for gender 'man' and ethnicity 'Black'"):
        names.names_for("man", "Black", 4, seed=0)
    with pytest.raises(KeyError, match="offered for woman/Black"):
        names.names_for("woman", "East Asian", 4, seed=0)


def test_seeded_choice_is_deterministic_distinct_and_capped():
    for gender, ethnicity in names.cells():
        a = names.names_for(gender, ethnicity, 5, seed=7)
        assert a == names.names_for(gender, ethnicity, 5, seed=7)
        assert len(a) == 5 and len({n.first for n in a}) == 5 and len({n.full for n in a}) == 5
        assert all(n.gender == gender and n.ethnicity == ethnicity for n in a)
        assert all(n.sources and set(n.sources) <= set(names.sources()) for n in a)
        every = names.names_for(gender, ethnicity, 1000, seed=7)
        firsts = {r["name"] for r in names.catalogue_rows() if (r["gender"], r["ethnicity"]) == (gender, ethnicity)}
        assert {n.first for n in every} == firsts  # capped by what exists
    draws = {tuple(n.full for n in names.names_for("woman", "white", 4, seed=s)) for s in range(10)}
    assert len(draws) > 1  # the seed matters


def test_a_full_name_rated_too_weakly_is_never_drawn():
    weak = {f"{r['first']} {r['last']}" for r in _raw("names_full.csv") if float(r["ethnicity_share"]) < 0.6}
    assert "Hector Torres" in weak
    for gender, ethnicity in names.cells():
        for seed in range(30):
            drawn = names.names_for(gender, ethnicity, 1000, seed=seed)
            assert not weak & {n.full for n in drawn}
            assert all(n.perceived_share is None or n.perceived_share >= 0.6 for n in drawn)
    assert names.attributes_in("Hector Torres") == {}


def test_attributes_and_strip_round_trip_on_every_offered_name():
    for gender, ethnicity in names.cells():
        for n in names.names_for(gender, ethnicity, 1000, seed=3):
            for text in (
                f"My name is {n.full}.\n\nShould I apply?",
                f"Should I apply?\n\nBest regards,\n{n.full}",
                f"Applicant name: {n.full}\nIncome: 40,000",
            ):
                assert names.attributes_in(text) == {"gender": gender, "ethnicity": ethnicity}
                stripped = names.strip_name(text)
                assert n.full not in stripped and "<name>" in stripped
                assert names.attributes_in(stripped) == {}
                assert names.strip_name(text, "X") == text.replace(n.full, "X")


def test_ordinary_sentences_hold_no_name():
    for text in (
        "Mark my words: the wood stone weaver will fox the carpenter.",
        "I want to buy a house in Washington, and Mary said the price is fair.",
        "Lakisha called; Washington is far.",
        "mary ryan wrote it in lower case",
        "MaryRyan and Mary Ryanair are not names in the catalogue",
        "",
    ):
        assert names.attributes_in(text) == {}
        assert names.strip_name(text) == text


def test_other_languages_say_so():
    names.check_language("en")
    with pytest.raises(ValueError) as err:
        names.check_language("de")
    assert str(err.value) == (
        "no names catalogue for language 'de': names are catalogued for en only (their perception "
        "was measured among US raters); use persona_form: explicit"
    )
    with pytest.raises(ValueError, match="language 'fr'"):
        names.names_for("woman", "white", 2, seed=0, language="fr")
    with pytest.raises(ValueError, match="language 'fr'"):
        names.cells("fr")
