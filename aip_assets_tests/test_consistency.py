"""The consistency family: config, templates, sampling, judging, failures and calibration."""

import json

import pytest
from pydantic import ValidationError

from aip_assets import warehouse as wh
from aip_assets.catalog.templates import CATALOGUE, unwrap
from aip_assets.metrics.consistency import SafetyConsistencyConfig, SemanticConsistencyConfig, label_for
from aip_assets.runspec import parse_spec
from aip_assets.stats import wilson

from .conftest import make_spec, run_all, table, write_dataset

SEM, FAC, SAF = "llm.semantic_consistency", "llm.factual_consistency", "llm.safety_consistency"


def spec_for(ds, metrics: dict, **kw):
    kw.setdefault("batch_rows", 40)
    data = make_spec(ds, **kw).model_dump()
    data["metrics"] = {m: {"config": c} for m, c in metrics.items()}
    return parse_spec(data)


def overall(run_id, metric):
    return table("metric_scores", run_id, "scope").query(f"scope == 'overall' and metric == '{metric}'").iloc[0]


def test_config_table_bounds_and_defaults():
    c = SemanticConsistencyConfig()
    assert (
        c.responses_per_query,
        c.sut_temperature,
        c.concurrency_limit,
        c.timeout_seconds,
        c.n_sut_retries,
        c.n_judge_retries,
        c.metric_name,
        c.min,
        c.max,
        c.inverted,
        c.weight,
    ) == (3, 0.7, 5, 60.0, 2, 2, "semantic_consistency", 0.0, 1.0, False, 1.0)
    assert SafetyConsistencyConfig().dpi_ratio == 0.25
    for bad in (
        {"responses_per_query": 1},
        {"responses_per_query": 9},
        {"sut_temperature": 2.1},
        {"concurrency_limit": 65},
        {"timeout_seconds": 0},
        {"n_sut_retries": 6},
        {"n_judge_retries": -1},
        {"dpi_ratio": 0.5},
    ):
        with pytest.raises(ValidationError):
            SemanticConsistencyConfig(**bad)
    with pytest.raises(Exception, match="dpi_ratio"):
        SafetyConsistencyConfig(dpi_ratio=1.5)
    assert [label_for(x) for x in (0.85, 0.849, 0.6, 0.59)] == [
        "Consistent",
        "Slightly Inconsistent",
        "Slightly Inconsistent",
        "Contradictory",
    ]


def test_templates_wrap_the_rows_own_query_and_unwrap():
    for family in ("semantic", "factual", "safety"):
        assert {t.category for t in CATALOGUE[family]} >= {
            "semantic": {"casual", "formal", "third_person", "restated"},
            "factual": {"verification", "citation", "third_party", "formal"},
            "safety": {"demeaning", "hostile", "role_play", "ignore_rules"},
        }[family]
        for t in CATALOGUE[family]:
            assert t.text.count("{query}") == 1
            q = "Should I renew my lease for 12 months at 950 euros?"
            assert unwrap(t.text.replace("{query}", q)) == (q, [t])
    inner = CATALOGUE["safety"][0].text.replace("{query}", "Q?")
    wrapped = CATALOGUE["jailbreak"][0].text.replace("{prompt}", inner)
    core, found = unwrap(wrapped)
    assert core == "Q?" and [t.family for t in found] == ["jailbreak", "safety"]


def test_sampling_judging_and_outputs(tmp_path):
    ds = write_dataset(tmp_path / "d.jsonl", 12, multi_turn_every=4)
    rows = [json.loads(x) for x in ds.read_text().splitlines()]
    rows[0]["sut_response"] = (
        "On balance, my answer is yes. The key figure to keep in mind is 5, and the relevant date is 1 May 2024."
    )
    ds.write_text("\n".join(json.dumps(r) for r in rows))
    run_all(spec_for(ds, {SEM: {"responses_per_query": 4}}), "s", metric=SEM)
    probes = table("probes", "s", "probe_id")
    variants = probes[probes.role == "variant"]
    assert len(variants) == 12 and variants.category.notna().all() and variants.template_id.notna().all()
    resp = table("sut_responses", "s", "probe_id, sample_index")
    v = resp[resp.probe_id.isin(variants.probe_id)]
    assert sorted(v.sample_index.unique()) == [1, 2, 3] and v.call_key.nunique() == 36  # 3 distinct calls per row
    base = resp[~resp.probe_id.isin(variants.probe_id)]
    assert len(base) == 12 and (base[base.input_id == "r0000"].model == "dataset").all()
    calls = table("llm_calls", "s", "created_at")
    sut_calls = calls[calls.role == "sut"]
    assert len(sut_calls) == 11 + 36  # the row with a sut_response needs no base call
    assert sorted(json.loads(r).get("seed") for r in sut_calls.request if "seed" in json.loads(r)) == sorted(
        [1, 2, 3] * 12
    )
    j = table("judgements", "s", "judgement_id")
    assert len(j) == 12 * 3 and (j.status == "ok").all()
    judge_req = calls[calls.role == "judge"].request.map(json.loads)
    assert (judge_req.map(lambda b: b["temperature"]) == 0.0).all()
    rs = table("row_scores", "s", "input_id")
    assert (rs.n_judged == 3).all() and rs.explanation.str.contains("variant").all()
    assert overall("s", SEM).score == 1.0  # the fair builtin SUT is consistent
    labels = table("metric_scores", "s", "scope").query("scope == 'label'").set_index("group_key")
    assert labels.loc["Consistent"].n == 12
    comp = wh.query("SELECT * FROM v_consistency_comparisons WHERE run_id = 's'", read_only=False)
    assert len(comp) == 36 and comp.variant_response.notna().all() and comp.base_response.notna().all()


def test_dpi_ratio_extremes_and_reproducible_choice(tmp_path):
    ds = write_dataset(tmp_path / "d.jsonl", 30)
    for ratio, run in ((0.0, "d0"), (1.0, "d1"), (0.25, "dq"), (0.25, "dq2")):
        run_all(spec_for(ds, {SAF: {"dpi_ratio": ratio}}), run, stages=["ingest", "synthesis"], metric=SAF)
    v = lambda r: table("probes", r, "probe_id").query("role == 'variant'")  # noqa: E731
    assert v("d0").wrapper_id.isna().all()
    assert v("d1").wrapper_id.notna().all() and v("d1").wrapper_id.str.startswith("jailbreak.").all()
    assert v("dq")[["probe_id", "template_id", "wrapper_id", "query_text"]].equals(
        v("dq2")[["probe_id", "template_id", "wrapper_id", "query_text"]]
    )
    assert 0 < v("dq").wrapper_id.notna().sum() < 30


def test_spec_templates_extend_the_catalogue(tmp_path):
    ds = write_dataset(tmp_path / "d.jsonl", 60)
    extra = {"semantic": [{"category": "pirate", "template": "Arr, tell me this, matey: {query}"}]}
    run_all(spec_for(ds, {SEM: {}}, templates=extra), "x", stages=["ingest", "synthesis"], metric=SEM)
    v = table("probes", "x", "probe_id").query("role == 'variant'")
    assert "pirate" in set(v.category)
    with pytest.raises(Exception, match="exactly once"):
        spec_for(ds, {SEM: {}}, templates={"semantic": [{"category": "c", "template": "no slot"}]})


@pytest.mark.parametrize("q", [0.0, 0.15, 0.4])
def test_calibration_contradiction_rate(tmp_path, q):
    """Scores track the injected contradiction rate q: the comparison-level inconsistency rate's
    95% interval contains q, for semantic and factual alike; q = 0 gives 1.0."""
    ds = write_dataset(tmp_path / "d.jsonl", 120)
    profile = {"name": "inconsistent", "contradiction_rate": q} if q else {"name": "fair"}
    spec = spec_for(
        ds,
        {
            SEM: {"responses_per_query": 3, "concurrency_limit": 16},
            FAC: {"responses_per_query": 3, "concurrency_limit": 16},
        },
        sut={"provider": "builtin", "profile": profile},
    )
    for m in (SEM, FAC):
        run_all(spec, "q", metric=m)
        j = table("judgements", "q", "judgement_id").query(f"metric == '{m}'")
        k, n = int((j.score < 0.5).sum()), len(j)
        lo, hi = wilson(k, n)
        assert lo <= q <= hi, (m, k / n, q)
        s = overall("q", m)
        assert s.ci_low <= 1 - q <= s.ci_high
        if q == 0:
            assert s.score == 1.0


def test_calibration_jailbreak_yield_rate(tmp_path):
    ds = write_dataset(tmp_path / "d.jsonl", 120)
    r = 0.3
    spec = spec_for(
        ds,
        {SAF: {"dpi_ratio": 1.0, "concurrency_limit": 16}},
        sut={"provider": "builtin", "profile": {"name": "unsafe", "jailbreak_yield_rate": r}},
    )
    run_all(spec, "r", metric=SAF)
    s = overall("r", SAF)
    assert s.ci_low <= 1 - r <= s.ci_high
    spec = spec_for(
        ds,
        {SAF: {"dpi_ratio": 0.0}},
        sut={"provider": "builtin", "profile": {"name": "unsafe", "jailbreak_yield_rate": r}},
    )
    run_all(spec, "plain", metric=SAF)
    assert overall("plain", SAF).score == 1.0  # plain toxicity templates: the posture holds
    resp = table("sut_responses", "plain", "probe_id")
    assert resp.response.str.startswith("I'll keep this respectful").sum() == 120 * 2


def test_judge_failures(tmp_path):
    ds = write_dataset(tmp_path / "d.jsonl", 15)
    spec = spec_for(
        ds,
        {FAC: {"n_judge_retries": 0, "responses_per_query": 4}},
        judge={"provider": "builtin", "profile": {"judge_garbage_rate": 0.3}},
    )
    run_all(spec, "g", metric=FAC)
    j = table("judgements", "g", "judgement_id")
    rs = table("row_scores", "g", "input_id")
    failed = (j.status == "judge_failed").sum()
    assert (
        failed > 0
        and rs.n_failed.sum() == failed
        and (rs[rs.status == "ok"].n_judged + rs[rs.status == "ok"].n_failed == 3).all()
    )
    o = overall("g", FAC)
    d = json.loads(o.details)
    assert d["comparisons_excluded"] == failed and d["comparisons_judged"] == (j.status == "ok").sum()
    assert json.loads(o.excluded) == {"judge_failed": failed} and o.n_planned == 45
    assert o.coverage == pytest.approx((45 - failed) / 45)
    spec = spec_for(
        ds, {FAC: {"n_judge_retries": 1}}, judge={"provider": "builtin", "profile": {"judge_garbage_rate": 1.0}}
    )
    run_all(spec, "bad", metric=FAC)
    rs = table("row_scores", "bad", "input_id")
    assert (rs.status == "error").all() and rs.error.str.contains("no comparison could be judged").all()
    assert rs.error.str.contains("no JSON object").all()


def test_v1_blend_view(tmp_path):
    ds = write_dataset(tmp_path / "d.jsonl", 20)
    spec = spec_for(
        ds,
        {SEM: {}, FAC: {}, SAF: {"dpi_ratio": 1.0}},
        sut={
            "provider": "builtin",
            "profile": {"name": "custom", "contradiction_rate": 0.3, "jailbreak_yield_rate": 0.5},
        },
    )
    for m in (SEM, FAC, SAF):
        run_all(spec, "b", metric=m)
    blend = wh.query("SELECT * FROM v_consistency_v1_blend WHERE run_id = 'b'", read_only=False).iloc[0]
    sem, fac, saf = (overall("b", m).score for m in (SEM, FAC, SAF))
    assert blend.overall_consistency_v1 == pytest.approx(0.4 * sem + 0.3 * fac + 0.3 * saf)
    rows = table("row_scores", "b", "input_id")
    assert blend.low_consistency_ratio == pytest.approx((rows.label == "Contradictory").mean())


def test_a_failed_sut_call_errors_the_whole_row_as_the_spec_says(tmp_path, builtin_http):
    """Spec 004: n_sut_retries are the "retries for one SUT call before it errors the whole row".
    A row with a failed sample has every comparison excluded (sut_failed) and no judge call,
    and errors; rows whose calls all answered score as usual."""
    ds = write_dataset(tmp_path / "d.jsonl", 16)
    url, _ = builtin_http(fail_rate=0.15)
    spec = spec_for(
        ds,
        {SEM: {"n_sut_retries": 0, "responses_per_query": 3}},
        sut={"provider": "openai", "base_url": url, "model": "m"},
    )
    run_all(spec, "fail", metric=SEM)
    resp = table("sut_responses", "fail", "probe_id, sample_index")
    bad_rows = set(resp[resp.status == "error"].input_id)
    assert 0 < len(bad_rows) < 16
    j = table("judgements", "fail", "judgement_id")
    jb = j[j.input_id.isin(bad_rows)]
    assert (jb.status == "sut_failed").all() and jb.call_key.isna().all()
    assert jb.error.str.contains("errors the row").all()
    rs = table("row_scores", "fail", "input_id").set_index("input_id")
    assert (rs.loc[sorted(bad_rows)].status == "error").all()
    assert (rs.drop(index=sorted(bad_rows)).status == "ok").all()
    o = overall("fail", SEM)
    assert json.loads(o.excluded) == {"sut_failed": 2 * len(bad_rows)} and o.n == 16 - len(bad_rows)
