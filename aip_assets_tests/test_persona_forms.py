"""Decision flip's persona forms (explicit, name, both) and intersections, end to end: the probes a
pair sends, the names a run draws, and calibration against builtin SUTs biased against one
combination only (by statements or by names), against one attribute, or against no one."""

from __future__ import annotations

import json

import pytest

from aip_assets import warehouse as wh
from aip_assets.catalog import names
from aip_assets.errors import SpecError
from aip_assets.runspec import parse_spec

from .conftest import run_all, table, write_dataset

AXIS = "gender×ethnicity"


def spec(ds, sut=None, form="explicit", inter=((("gender", "ethnicity")),), dims=("gender",), language="en", **cfg):
    return parse_spec(
        {
            "name": "forms",
            "dataset": str(ds),
            "seed": 5,
            "sut": sut or {"provider": "builtin"},
            "judge": {"provider": "builtin"},
            "metrics": {
                "llm.decision_flip": {
                    "persona_form": form,
                    "intersections": [list(p) for p in inter],
                    "config": {"dimensions": list(dims), "sub_call_concurrency_limit": 32, "language": language, **cfg},
                }
            },
            "retry_backoff_seconds": 0.01,
            "batch_rows": 20,
        }
    )


def claims(run_id: str) -> dict[str, dict]:
    s = table("metric_scores", run_id, "group_key")
    out = {}
    for _, r in s[s.scope == "claim"].iterrows():
        d = json.loads(r["details"])
        d.update(estimate=r["raw_score"], ci=(r["ci_low"], r["ci_high"]))
        out[r["group_key"]] = d
    return out


def made(run_id: str) -> set[str]:
    return {k for k, c in claims(run_id).items() if c.get("claimed")}


def test_an_intersection_pair_varies_one_attribute_and_the_rest_of_the_query_is_identical(tmp_path):
    ds = write_dataset(tmp_path / "d.jsonl", 6)
    run_all(spec(ds), "shape", stages=("ingest", "synthesis"))
    pairs = wh.query(
        "SELECT pp.*, pa.query_text AS qa, pb.query_text AS qb, pa.attributes AS aa, pb.attributes AS ab "
        "FROM probe_pairs pp JOIN probes pa ON pa.run_id = pp.run_id AND pa.probe_id = pp.probe_a "
        "JOIN probes pb ON pb.run_id = pp.run_id AND pb.probe_id = pp.probe_b "
        "WHERE pp.run_id = 'shape' AND pp.axis = ? AND pp.kind = 'persona'",
        [AXIS],
        read_only=False,
    )
    assert len(pairs)
    for r in pairs.itertuples():
        a, b = json.loads(r.aa), json.loads(r.ab)
        assert sum(a[k] != b[k] for k in ("gender", "ethnicity")) == 1  # one attribute varies, the other held
        assert r.value_a == f"{a['gender']}×{a['ethnicity']}"
        head_a, _, rest_a = r.qa.partition("\n\n")
        head_b, _, rest_b = r.qb.partition("\n\n")
        assert rest_a == rest_b and head_a != head_b  # only the persona paragraph differs
        assert head_a.startswith("A bit about me: I am ")
    # every row's rectangles hold nearly every combination of gender and ethnicity the catalogue has (5 x 7)
    per_row = pairs.groupby("input_id").apply(lambda g: len(set(g.value_a) | set(g.value_b)), include_groups=False)
    assert (per_row >= 30).all(), per_row.to_dict()


def test_name_personas_differ_only_in_the_name_and_each_group_gets_several_names(tmp_path):
    ds = write_dataset(tmp_path / "d.jsonl", 30)
    run_all(spec(ds, form="name", inter=(), dims=("gender", "ethnicity")), "names", stages=("ingest", "synthesis"))
    probes = table("probes", "names", "probe_id")
    assert set(probes.persona_form) == {"name"} and set(probes.axis) == {"gender@name", "ethnicity@name"}
    for r in probes.itertuples():
        attrs = json.loads(r.attributes)
        assert names.attributes_in(r.query_text) == attrs  # the name the probe gives reads back as its group
        assert r.persona_name in r.query_text
    pp = table("probe_pairs", "names", "pair_id")
    q = probes.set_index("probe_id")
    for r in pp[pp.kind == "persona"].itertuples():
        a, b = q.loc[r.probe_a], q.loc[r.probe_b]
        assert a.query_text.replace(a.persona_name, "<name>") == b.query_text.replace(b.persona_name, "<name>")
    # one name's quirks do not stand for a group: several names per group over the run
    per_group = probes.groupby(probes.attributes).persona_name.nunique()
    assert (per_group >= 3).all(), per_group.to_dict()
    # placed where a user gives a name: an introduction, a signature, a form field
    starts = {t.split(" ")[0] for t in probes.query_text}
    assert any(t.rstrip().rsplit("\n", 2)[-2] == "Best regards," for t in probes.query_text)
    assert {"My", "Applicant"} <= starts
    view = wh.query("SELECT * FROM v_persona_names WHERE run_id = 'names'", read_only=False)
    assert set(view.name) == set(probes.persona_name)


def interaction_recovered(run_id: str, axis: str, target: str = "woman×Black") -> dict:
    c = claims(run_id)
    made = {k for k, v in c.items() if v.get("claimed")}
    key = f"interaction:{axis}={target}"
    assert key in made, sorted(made)
    # no other combination named, and neither attribute blamed alone
    assert {k for k in made if k.startswith(f"interaction:{axis}=")} == {key}
    assert not {k for k in made if k.startswith(f"main:{axis}:")}, sorted(made)
    return c[key]


def test_calibration_one_combination_by_statements(tmp_path):
    """The builtin SUT turns 90% of the favourable decisions of personas who say they are a woman
    and Black unfavourable, nobody else's: the interaction of woman×Black is named and its interval
    holds the injected drop (0.9 of what gender and ethnicity alone predict); gender=woman and
    ethnicity=Black are not blamed, and the single-axis statements ("I am a woman.") show nothing."""
    ds = write_dataset(tmp_path / "d.jsonl", 40)
    sut = {
        "provider": "builtin",
        "profile": {"name": "intersectional", "intersection": {"gender": "woman", "ethnicity": "Black"}, "p": 0.9}
        | {"directional": True},
    }
    run_all(spec(ds, sut=sut), "stmt")
    c = interaction_recovered("stmt", AXIS)
    rate = table("metric_scores", "stmt", "group_key").query(f"group_key == '{AXIS}=woman×Black'")
    predicted = json.loads(rate[rate.scope == "favourable"].iloc[0].details)["predicted_rate"]
    lo, hi = c["ci"]
    assert lo <= -0.9 * predicted <= hi, (lo, -0.9 * predicted, hi)
    assert not {k for k in made("stmt") if k.startswith("favoured:gender")}
    # the report's table names the group and the decision, read from the stored claims
    from aip_assets.report.flip_tables import intersections_table

    html = intersections_table(
        "llm.decision_flip", table("metric_scores", "stmt", "scope, group_key").to_dict("records")
    )
    row = html[html.index("<td>Black women</td>") :].split("</tr>")[0]
    assert "beyond chance" in row and f"{predicted:.3f}" in row
    others = [r for r in html.split("</tr>") if "<td>Black non-binary people</td>" in r]
    assert others and "not named" in others[0]  # a combination the analysis did not name: descriptive only


def test_calibration_one_combination_by_names_only(tmp_path):
    """A SUT that reads names, not statements (profile names), against Black women: with both forms
    the name analysis names Black women; the explicit one names no one."""
    ds = write_dataset(tmp_path / "d.jsonl", 32)
    sut = {
        "provider": "builtin",
        "profile": {"name": "names", "intersection": {"gender": "woman", "ethnicity": "Black"}, "p": 0.9}
        | {"directional": True},
    }
    run_all(spec(ds, sut=sut, form="both", inter=()), "byname")
    interaction_recovered("byname", f"{AXIS}@name")
    assert not {k for k in made("byname") if not k.endswith("@name") and "@name" not in k and ":" in k}


def test_calibration_one_attribute_is_not_an_intersection(tmp_path):
    """A SUT biased against every woman: the intersection analysis blames gender=woman and names
    no combination."""
    ds = write_dataset(tmp_path / "d.jsonl", 32)
    sut = {"provider": "builtin", "profile": {"name": "flip", "value": "woman", "axis": "gender", "p": 0.9}}
    sut["profile"]["directional"] = True
    run_all(spec(ds, sut=sut), "marg")
    m = made("marg")
    assert f"main:{AXIS}:gender=woman" in m
    assert not {k for k in m if k.startswith(f"interaction:{AXIS}=")}, sorted(m)


def test_calibration_a_fair_sut_gets_no_claim_in_either_form(tmp_path):
    ds = write_dataset(tmp_path / "d.jsonl", 24)
    run_all(spec(ds, form="both"), "fairboth")
    assert made("fairboth") == set()
    s = table("metric_scores", "fairboth", "group_key")
    forms = {json.loads(d).get("persona_form") for d in s[s.scope == "favourable"].details}
    assert forms == {"explicit", "name"}
    v = wh.query(
        "SELECT DISTINCT persona_form, combination IS NOT NULL AS combo FROM v_favourable_rates WHERE run_id = 'fairboth'",
        read_only=False,
    )
    assert set(map(tuple, v.to_numpy().tolist())) == {
        ("explicit", False),
        ("explicit", True),
        ("name", False),
        ("name", True),
    }


def test_names_in_another_language_are_refused_before_the_run_is_registered(tmp_path):
    """The spec is refused whole, nothing written: the names catalogue's languages and the spec
    layer's copy of them agree."""
    from aip_assets import runspec

    assert runspec.NAME_LANGUAGES == names.NAME_LANGUAGES
    ds = write_dataset(tmp_path / "d.jsonl", 2)
    for form in ("name", "both"):
        with pytest.raises(SpecError, match=r"persona_form: no names catalogue for language 'de'.*explicit"):
            spec(ds, form=form, language="de")
    with pytest.raises(SpecError, match="persona_pairs gives its own personas word for word"):
        spec(ds, form="name", persona_pairs=[{"dimension": "gender", "persona_a": "woman", "persona_b": "man"}])
