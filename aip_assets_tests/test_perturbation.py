"""Perturbation robustness: the recipe, the external scorer, the hosted variant, edge cases."""

import json
import random
import subprocess
import sys

import pandas as pd
import pytest

from aip_assets.dataset import load_dataset
from aip_assets.metrics.base import FrameReader, StageContext
from aip_assets.metrics.perturbation import PerturbationRobustnessExternal, PerturbationRobustnessExternalConfig
from aip_assets.metrics.perturbation.aggregate import group_score
from aip_assets.models.builtin import handle_chat
from aip_assets.perturbations import RULE_BASED, canonical_tokens
from aip_assets.preflight import preflight
from aip_assets.recipes import perturb_file
from aip_assets.runspec import BuiltinProfile, parse_spec

from .conftest import make_spec, run_all, table, write_dataset

EXT, HOST = "llm.perturbation_robustness_external", "llm.perturbation_robustness"
Q = "Should I buy a used car for 12,500 euros? My job pays enough, about 3,000 a month, and the loan would run 4 years."


def spec_for(ds, metric, config=None, **kw):
    kw.setdefault("batch_rows", 50)
    data = make_spec(ds, **kw).model_dump()
    data["metrics"] = {metric: {"config": config or {}}}
    return parse_spec(data)


def scores(run_id):
    return table("metric_scores", run_id, "scope, group_key")


@pytest.mark.parametrize("name", sorted(RULE_BASED))
def test_each_perturbation_changes_text_deterministically_and_keeps_meaning(name):
    p = RULE_BASED[name]
    a, b = p(Q, random.Random(3)), p(Q, random.Random(3))
    assert a == b and a is not None and a != Q
    assert canonical_tokens(a) == canonical_tokens(Q)  # what the builtin model reads stays the same
    assert canonical_tokens(a, skip=(name,)) != canonical_tokens(Q, skip=(name,)) or name == "casing"


def test_config_mirrors_the_spec_schema():
    props = PerturbationRobustnessExternalConfig.model_json_schema()["properties"]
    assert set(props) == {
        "groundtruth_context",
        "inverted",
        "max",
        "metric_name",
        "min",
        "reference_answer",
        "sub_call_concurrency_limit",
        "timeout_seconds",
        "weight",
    }
    c = PerturbationRobustnessExternalConfig()
    assert (
        c.groundtruth_context,
        c.reference_answer,
        c.metric_name,
        c.sub_call_concurrency_limit,
        c.timeout_seconds,
    ) == (None, None, "perturbation_robustness_external", 5, 60.0)
    assert props["sub_call_concurrency_limit"]["maximum"] == 64 and props["timeout_seconds"]["exclusiveMinimum"] == 0


def test_worked_example_robustness_09_drop_01_gives_09():
    assert group_score([0.9], [0.1]) == pytest.approx(0.9)
    assert group_score([1.0, 0.8], [0.0, 0.2]) == pytest.approx(0.9)
    assert group_score([1.0], [-0.5]) == 1.0  # a variant answered better does not lift the score above 1
    # through the aggregation: one group, baseline + two variants; the score replicated to its 3 rows
    probes = pd.DataFrame(
        [
            {"input_id": i, "role": ax, "category": c, "group_id": "g", "variant_id": None}
            for i, ax, c in (("b", "baseline", "baseline"), ("v1", "variant", "typos"), ("v2", "variant", "casing"))
        ]
    )
    j = [
        {
            "pair_id": "g|base",
            "input_id": "b",
            "category": "baseline",
            "judge_kind": "correctness",
            "status": "ok",
            "score": 1.0,
        }
    ]
    for v, rob, cor in (("v1", 0.8, 0.8), ("v2", 1.0, 1.0)):
        j += [
            {"pair_id": f"g|{v}", "input_id": v, "judge_kind": "robustness", "status": "ok", "score": rob},
            {"pair_id": f"g|{v}", "input_id": v, "judge_kind": "correctness", "status": "ok", "score": cor},
        ]
    spec = make_spec(write_dataset(__import__("pathlib").Path("d.jsonl"), 1))
    ctx = StageContext(
        run_id="r",
        metric=EXT,
        spec=spec,
        config=PerturbationRobustnessExternalConfig(),
        journal=None,
        reader=FrameReader(
            {
                "probes": probes,
                "judgements": pd.DataFrame(j).assign(error=None),
                "dataset_rows": pd.DataFrame([{"row_index": 0, "input_id": "b"}]),
            }
        ),
    )
    out = {}
    for t in PerturbationRobustnessExternal().aggregate(ctx):
        for k, v in t.items():
            out.setdefault(k, []).extend(v)
    assert [r["raw_score"] for r in out["row_scores"]] == pytest.approx([0.9] * 3)
    overall = next(s for s in out["metric_scores"] if s["scope"] == "overall")
    assert overall["score"] == pytest.approx(0.9)


def test_recipe_exports_gdi_rows_with_original_query(tmp_path):
    ds = write_dataset(tmp_path / "seed.jsonl", 6, multi_turn_every=3)
    for ext in ("jsonl", "csv", "parquet"):
        out = perturb_file(ds, tmp_path / f"p.{ext}", seed=5)
        rows = load_dataset(tmp_path / f"p.{ext}")
        assert len(rows) == out["rows"] and out["by_type"]["baseline"] == 6
        for r in rows:
            assert r.metadata["original_query"] and r.metadata["perturbation_type"]
            if r.metadata["perturbation_type"] == "baseline":
                assert r.last_user_text == r.metadata["original_query"]
            else:
                assert r.last_user_text != r.metadata["original_query"]
    again = perturb_file(ds, tmp_path / "again.jsonl", seed=5)
    assert (tmp_path / "again.jsonl").read_text() == (tmp_path / "p.jsonl").read_text() and again["rows"] == out["rows"]
    multi = [r for r in load_dataset(tmp_path / "p.jsonl") if r.task_type == "multi_turn_llm"]
    assert multi and all(len(r.turns) == 3 for r in multi)  # history kept, the last turn perturbed


def _references(seed_path, out_path, profile=None):
    """Seed rows with metadata.reference_answer: the SUT's own answer to the clean question (its
    reading of clean text is the truth; what changes under a perturbation is the error)."""
    rows = [json.loads(x) for x in seed_path.read_text().splitlines()]
    for r in rows:
        body = {
            "model": "x",
            "messages": [
                {"role": "user", "content": r["prompt"] if isinstance(r["prompt"], str) else r["prompt"][-1]["content"]}
            ],
            "temperature": 0.0,
        }
        r["metadata"] = {
            "reference_answer": handle_chat(body, profile or BuiltinProfile())["choices"][0]["message"]["content"]
        }
    out_path.write_text("\n".join(json.dumps(r) for r in rows))
    return out_path


def test_calibration_fragile_to_typos_and_round_trip(tmp_path):
    seed = _references(write_dataset(tmp_path / "seed.jsonl", 30), tmp_path / "seed_ref.jsonl")
    run_all(spec_for(seed, HOST), "robust", metric=HOST)
    assert scores("robust").query("scope == 'overall'").iloc[0].score == 1.0
    fragile = {"provider": "builtin", "profile": {"name": "fragile", "fragile_to": "typos"}}
    seed = _references(
        tmp_path / "seed.jsonl", tmp_path / "seed_ref_fragile.jsonl", BuiltinProfile.model_validate(fragile["profile"])
    )
    run_all(spec_for(seed, HOST, sut=fragile), "hosted", metric=HOST)
    s = scores("hosted")
    assert s.query("scope == 'overall'").iloc[0].ci_high < 1.0
    types = s[s.scope == "perturbation_type"].sort_values("score")
    assert types.iloc[0].group_key == "typos" and types.iloc[0].score < 0.8
    assert (types.iloc[1:].score == 1.0).all()
    assert json.loads(types.iloc[0].details)["mean_correctness_drop"] > 0.2
    # round trip: generate -> export -> answer outside the pipeline -> ingest -> score
    perturb_file(seed, tmp_path / "export.jsonl", seed=3)
    cmd = [
        sys.executable,
        "-m",
        "aip_assets.cli",
        "answer",
        str(tmp_path / "export.jsonl"),
        str(tmp_path / "answered.csv"),
        "--profile",
        json.dumps(fragile["profile"]),
    ]
    subprocess.run(cmd, check=True, capture_output=True)
    # the external scorer needs no SUT: an unreachable one is never asked
    no_sut = {"provider": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m"}
    assert preflight(spec_for(tmp_path / "answered.csv", EXT, sut=no_sut)) == [
        "endpoint ok: judge: builtin model (fair)"
    ]
    run_all(spec_for(tmp_path / "answered.csv", EXT, sut=no_sut), "external", metric=EXT)
    ext, host = scores("external"), scores("hosted")
    cols = ["scope", "group_key", "raw_score", "n"]
    assert (
        ext[ext.scope == "perturbation_type"][cols]
        .reset_index(drop=True)
        .equals(host[host.scope == "perturbation_type"][cols].reset_index(drop=True))
    )
    e, h = ext.query("scope == 'overall'").iloc[0], host.query("scope == 'overall'").iloc[0]
    assert e.raw_score == pytest.approx(h.raw_score)
    assert table("llm_calls", "external", "created_at").query("role == 'sut'").empty  # the scorer calls no SUT


def test_edge_cases_have_clear_outcomes(tmp_path):
    base = {"task_type": "single_turn_llm"}
    ok = "On balance, my answer is yes. The key figure to keep in mind is 12, and the relevant date is 3 May 2024."
    rows = [
        {**base, "input_id": "good", "prompt": "Q1?", "sut_response": ok, "metadata": {"original_query": "Q1?"}},
        {
            **base,
            "input_id": "good-t",
            "prompt": "q1?",
            "sut_response": ok,
            "metadata": {"original_query": "Q1?", "perturbation_type": "casing"},
        },
        {
            **base,
            "input_id": "good-e",
            "prompt": "Q1 ?",
            "sut_response": "",
            "metadata": {"original_query": "Q1?", "perturbation_type": "punctuation"},
        },
        {**base, "input_id": "nometa", "prompt": "Q2?", "sut_response": ok},
        {**base, "input_id": "nobase", "prompt": "q3?", "sut_response": ok, "metadata": {"original_query": "Q3?"}},
        {**base, "input_id": "dup1", "prompt": "Q4?", "sut_response": ok, "metadata": {"original_query": "Q4?"}},
        {**base, "input_id": "dup2", "prompt": "Q4?", "sut_response": ok, "metadata": {"original_query": "Q4?"}},
        {**base, "input_id": "alone", "prompt": "Q5?", "sut_response": ok, "metadata": {"original_query": "Q5?"}},
        {**base, "input_id": "emptybase", "prompt": "Q6?", "sut_response": "", "metadata": {"original_query": "Q6?"}},
        {**base, "input_id": "emptybase-v", "prompt": "q6?", "sut_response": ok, "metadata": {"original_query": "Q6?"}},
    ]
    ds = tmp_path / "edge.jsonl"
    ds.write_text("\n".join(json.dumps(r) for r in rows))
    run_all(spec_for(ds, EXT), "edge", metric=EXT)
    rs = table("row_scores", "edge", "input_id").set_index("input_id")
    assert rs.loc["nometa"].error.startswith("the row has no metadata.original_query")
    assert "no baseline" in rs.loc["nobase"].error
    assert "claim to be the baseline" in rs.loc["dup1"].error and "claim to be the baseline" in rs.loc["dup2"].error
    assert "only the baseline row" in rs.loc["alone"].error
    assert "baseline: the SUT answer: empty" in rs.loc["emptybase"].error
    # nothing failed in these rows: each is excluded (status and label), never an error
    edge = rs.loc[["nometa", "nobase", "dup1", "dup2", "alone", "emptybase", "emptybase-v"]]
    assert (edge.status == "excluded").all() and (edge.label == "excluded").all()
    # the good group: the empty variant is excluded and counted without a judge call, never scored as 0
    good = rs.loc[["good", "good-t", "good-e"]]
    assert (good.status == "ok").all() and good.raw_score.nunique() == 1
    assert good.raw_score.iloc[0] == pytest.approx(group_score([1.0], [0.0])) == 1.0
    j = table("judgements", "edge", "judgement_id")
    ge = j[j.input_id == "good-e"]
    assert len(ge) == 2 and (ge.status == "empty_answer").all() and ge.call_key.isna().all() and ge.score.isna().all()
    sr = table("sut_responses", "edge", "probe_id").set_index("input_id")
    assert sr.loc["good-e"].status == "empty" and sr.loc["emptybase"].status == "empty"
    notes = set(table("run_notes", "edge", "code").code)
    assert {"missing_original_query", "no_baseline", "duplicate_baseline", "baseline_only"} <= notes
    overall = scores("edge").query("scope == 'overall'").iloc[0]
    assert overall.n == 1 and json.loads(overall.details)["rows_scored"] == 3  # one group, three rows
    # every planned variant pair is judged or excluded under its named reason: 1 judged of 5 (rows that
    # claim to be a baseline plan no pair: dup1, dup2, alone; the empty baseline's variant is excluded under it)
    assert json.loads(overall.excluded) == {"empty_answer": 2, "missing_original_query": 1, "no_baseline": 1}
    assert overall.n_planned == 5 and overall.coverage == pytest.approx(1 / 5) and not overall.passed
    assert "coverage 0.200 below min_coverage 0.900" in overall.gate_reason


def test_a_rows_reference_answer_overrides_the_configs(tmp_path):
    """The correctness judge is given the baseline row's metadata.reference_answer when it has one,
    the config's reference_answer otherwise."""
    rows = []
    for g, ref in (("Q1?", "ROW-REFERENCE"), ("Q2?", None)):
        meta = {"original_query": g, **({"reference_answer": ref} if ref else {})}
        rows += [
            {
                "input_id": f"{g}-b",
                "prompt": g,
                "task_type": "single_turn_llm",
                "sut_response": "Yes.",
                "metadata": meta,
            },
            {
                "input_id": f"{g}-v",
                "prompt": g.lower(),
                "task_type": "single_turn_llm",
                "sut_response": "Yes.",
                "metadata": {**meta, "perturbation_type": "casing"},
            },
        ]
    ds = tmp_path / "ref.jsonl"
    ds.write_text("\n".join(json.dumps(r) for r in rows))
    run_all(spec_for(ds, EXT, config={"reference_answer": "CONFIG-REFERENCE"}), "ref", metric=EXT)
    calls = table("llm_calls", "ref", "created_at")
    prompts = calls[calls.role == "judge"].request.map(lambda r: json.loads(r)["messages"][-1]["content"])
    correctness = prompts[prompts.str.contains("aip-judge perturbation_correctness")]
    q1 = correctness[correctness.str.contains("Q1\\?|q1\\?", regex=True)]
    q2 = correctness[correctness.str.contains("Q2\\?|q2\\?", regex=True)]
    assert len(q1) == len(q2) == 2
    assert q1.str.contains("ROW-REFERENCE").all() and not q1.str.contains("CONFIG-REFERENCE").any()
    assert q2.str.contains("CONFIG-REFERENCE").all()


def test_hosted_variants_of_ids_that_contain_double_dashes(tmp_path):
    """Variant ids are the seed row's id + "--type-k"; a seed id that itself contains "--" must still
    find its variants (their batch is the seed row's, taken from metadata, not from the id's text)."""
    rows = [json.loads(x) for x in write_dataset(tmp_path / "d.jsonl", 4).read_text().splitlines()]
    for i, r in enumerate(rows):
        r["input_id"] = f"case--{i}"
    ds = tmp_path / "dashes.jsonl"
    ds.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run_all(spec_for(ds, HOST), "dashes", metric=HOST)
    o = scores("dashes").query("scope == 'overall'").iloc[0]
    assert o.coverage == 1.0 and o.raw_score is not None and json.loads(o.excluded) == {}
    probes = table("probes", "dashes", "probe_id")
    assert set(probes.input_id) == {f"case--{i}" for i in range(4)}
