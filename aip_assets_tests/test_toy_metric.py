"""A metric is one package and one registration: the toy metric of ``aip_assets_tests/toy_metric/``
(config, manifest, prompt, the builtin judge's answer, a view), registered with one call, runs end
to end through Dagster (``aip-eval run``), lands in the warehouse, is scored, and is in the report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from aip_assets import metrics
from aip_assets import warehouse as wh
from aip_assets.cli import main
from aip_assets.metrics import REGISTRY
from aip_assets.models import builtin

from .toy_metric import ToyPoliteness
from .toy_metric.config import ToyPolitenessConfig

NAME = "llm.toy_politeness"
# German questions: the builtin SUT answers them in German, "Danke, ..." (no "thank"): not polite
GERMAN = {1, 4}
N_ROWS = 6


@pytest.fixture
def toy():
    """The toy metric registered: one call (the warehouse makes its view, as every metric's)."""
    metrics.register(ToyPoliteness())
    yield REGISTRY[NAME]
    del REGISTRY[NAME]
    builtin.JUDGES.pop("toy_politeness", None)


def _dataset(path: Path) -> Path:
    rows = []
    for i in range(N_ROWS):
        if i in GERMAN:
            q = (
                f"Fall {i}: Ich beantrage einen Kredit über {1000 + i} Euro. Bitte gib eine Entscheidung: soll er "
                "genehmigt werden?"
            )
        else:
            q = f"Case {i}: I am applying for a loan of {1000 + i} euros. Should it be approved?"
        rows.append({"input_id": f"r{i}", "prompt": q, "task_type": "single_turn_llm"})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_the_toy_metric_runs_end_to_end_from_one_folder_and_one_registration(tmp_path, toy, capsys):
    spec = tmp_path / "toy.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "name": "toy",
                "dataset": str(_dataset(tmp_path / "toy.jsonl")),
                "seed": 5,
                "sut": {"provider": "builtin"},
                "judge": {"provider": "builtin"},
                "metrics": {NAME: {"config": {"concurrency_limit": 2}, "threshold": 0.5}},
            }
        )
    )
    assert main(["run", str(spec), "--run-id", "toy-1", "--json", "--quiet"]) == 0  # 4/6 polite >= 0.5: passed
    out = json.loads(capsys.readouterr().out)
    assert out["metrics"][NAME]["passed"] is True

    # every stage wrote its rows: one probe, one answer, one verdict and one row score per row
    for table in ("dataset_rows", "probes", "sut_responses", "judgements", "score_units", "row_scores"):
        assert len(wh.read_partition(table, "toy-1", NAME)) == N_ROWS, table
    # the verdict's own fields are in judgements.parsed, read through the metric's own view as typed columns
    v = wh.query(
        "SELECT input_id, polite, word_count, status FROM v_toy_politeness WHERE run_id = 'toy-1' ORDER BY input_id"
    )
    assert list(v["status"]) == ["ok"] * N_ROWS
    assert [bool(p) for p in v["polite"]] == [i not in GERMAN for i in range(N_ROWS)]
    answers = wh.query("SELECT input_id, response FROM sut_responses WHERE run_id = 'toy-1' ORDER BY input_id")
    assert list(v["word_count"]) == [len(a.split()) for a in answers["response"]]
    # its score: the mean over rows of 1 (polite) or 0, with the gate applied by the pipeline
    ov = wh.query(
        "SELECT score, n, n_events, passed, threshold, coverage FROM metric_scores "
        "WHERE run_id = 'toy-1' AND metric = ? AND scope = 'overall'",
        [NAME],
    ).iloc[0]
    assert ov.score == pytest.approx((N_ROWS - len(GERMAN)) / N_ROWS) and ov.n == N_ROWS
    assert ov.n_events == N_ROWS - len(GERMAN) and bool(ov.passed) and ov.threshold == 0.5 and ov.coverage == 1.0
    rows = wh.query("SELECT input_id, score FROM row_scores WHERE run_id = 'toy-1' ORDER BY input_id")
    assert list(rows["score"]) == [0.0 if i in GERMAN else 1.0 for i in range(N_ROWS)]
    # the judge was the builtin model, answering the toy's tag from the toy's own answer function
    calls = wh.query("SELECT count(*) AS n FROM llm_calls WHERE run_id = 'toy-1' AND role = 'judge'").iloc[0]
    assert calls.n == N_ROWS

    # and it is in the report, under its own name, with its score
    assert main(["report", "toy-1"]) == 0
    html = Path(capsys.readouterr().out.strip().splitlines()[-1]).read_text()
    assert NAME in html and f"{ov.score:.3f}" in html
    # with its own words for its counts (the metric's count_labels), not the generic ones
    assert "polite answers" in html and "rows excluded" in html


def test_the_toy_metric_declares_its_manifest_beside_its_config(toy):
    """Its parameter manifest is its own file, checked against its config model as the
    project's metrics are against specs/manifests.json."""
    from aip_assets.metrics.base import manifest_of, spec_manifests

    assert NAME not in spec_manifests()
    manifest = manifest_of(toy)["config_schema"]["properties"]
    props = ToyPolitenessConfig.model_json_schema()["properties"]
    assert set(props) == set(manifest)
    cfg = ToyPolitenessConfig()
    for field, want in manifest.items():
        assert props[field]["type"] == want["type"], field
        assert getattr(cfg, field) == want["default"], field
        for key in ("minimum", "maximum", "exclusiveMinimum"):
            assert props[field].get(key) == want.get(key), (field, key)
    from aip_assets.metrics.base import execution_timeout

    assert execution_timeout(NAME) == 120.0  # its execution manifest, read from the same file


def test_a_registered_metric_is_loaded_only_when_looked_up():
    """Naming metrics loads none; looking one up loads that one (a fresh interpreter)."""
    import subprocess
    import sys

    code = (
        "import sys; from aip_assets.runspec import parse_spec; from aip_assets.metrics import REGISTRY; "
        "before = sorted(m for m in sys.modules if m.startswith('aip_assets.metrics.')); "
        "known = 'llm.decision_flip' in REGISTRY and len(REGISTRY) == 7; "
        "REGISTRY['llm.group_interaction_bias']; "
        "after = sorted(m for m in sys.modules if m.startswith('aip_assets.metrics.')); "
        "print(before, known, REGISTRY.loaded(), 'aip_assets.metrics.decision_flip' in after)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[] True ['llm.group_interaction_bias'] False", out


# the views warehouse.py held before the metrics' moved into their packages
METRIC_VIEWS = {
    "v_pair_verdicts",
    "v_baseline_pairs",
    "v_flipped_pairs",
    "v_flip_excess_by_axis",
    "v_favourable_rates",
    "v_impact_ratios",  # issue 35: impact ratios per axis value
    "v_persona_names",  # issue 37: every name a run gave a persona
    "v_group_equitability",
    "v_group_effects",  # issue 35: each value's effect with every other attribute held
    "v_gib_pairs",
    "v_gib_baseline_pairs",
    "v_consistency_rows",
    "v_consistency_comparisons",
    "v_consistency_v1_blend",
}
CORE_VIEW_NAMES = {
    "v_flip_rate_by_axis",
    "v_claims",  # issue 35: every claim of every metric
    "v_human_vs_judge",
    "v_human_agreement",
    "v_judge_panel",
    "v_judge_exams",  # issue 36: the judge exam per judge and kind of item
    "v_position_bias",
    "v_weakest_rows",
    "v_run_summary",
    "v_call_stats",
    "v_run_over_run",
    "v_spec_history",  # issue 38: every figure of every run of a spec
}


def test_the_registry_holds_what_warehouse_and_report_hold_today():
    """The metrics' views, directions and exclusion reasons, moved into their packages, are
    the tables warehouse.py, compare.py and gate.py keyed by metric name."""
    views = metrics.all_views()
    # the warehouse's views: the metrics' (moved from warehouse.py into their packages) and its own
    assert set(views) == METRIC_VIEWS and set(wh.CORE_VIEWS) == CORE_VIEW_NAMES
    assert list(wh.views()) == list(views) + list(wh.CORE_VIEWS)
    # a view reading another comes after it (v_flipped_pairs reads v_pair_verdicts)
    assert list(views).index("v_pair_verdicts") < list(views).index("v_flipped_pairs")
    assert metrics.lower_is_better() == {("llm.decision_flip", "axis")}
    reasons = metrics.exclusion_reasons()
    assert {
        "no_decision",
        "missing_original_query",
        "no_baseline",
        "duplicate_baseline",
        "baseline_only",
        "sut_failed",
        "empty_answer",
        "judge_failed",
        "unjudgeable",
        "judges_disagree",
    } == set(reasons)


# the tables report.py keyed by metric name before they moved into the metrics (its words, its charts' order);
# the third count is metric_scores.n_failed, the units that failed (issue 36: no longer the exclusions too)
REPORT_COUNT_LABELS = {
    "llm.decision_flip": ("pairs judged", "attributable flips", "pairs failed"),
    "llm.group_interaction_bias": ("pairs judged", "pairs with bias ≥ 0.1", "pairs failed"),
    "llm.semantic_consistency": ("rows scored", "contradictory rows", "comparisons failed"),
    "llm.factual_consistency": ("rows scored", "contradictory rows", "comparisons failed"),
    "llm.safety_consistency": ("rows scored", "contradictory rows", "comparisons failed"),
    "llm.perturbation_robustness": ("groups scored", "rows with a correctness drop", "variant pairs failed"),
    "llm.perturbation_robustness_external": ("groups scored", "rows with a correctness drop", "variant pairs failed"),
}
REPORT_SCOPE_ORDER = [
    "axis",
    "group",
    "attribute",
    "persona",
    "pair",
    "judge",
    "category",
    "wrapping",
    "label",
    "perturbation_type",
    "refusal",
    "favourable",
    "baseline",
]
REPORT_NOT_CHARTED = {"overall", "axis_mean", "judge_audit", "judge_position", "judge_panel", "claim", "bias_baseline"}
REPORT_SCOPE_LABELS = {
    "axis_mean": "mean axis flip rate",
    "judge_audit": "judge agreement with the audit judge",
    "judge_position": "judge position bias (difference between orders)",
}


def test_the_report_reads_each_metric_s_own_words_and_charts():
    """The report's words and chart order come from the metric, and are the ones report.py held."""
    from aip_assets.report import labels

    for name in metrics.BUILTIN_METRICS:
        assert labels.count_labels(name) == REPORT_COUNT_LABELS[name], name
        assert labels.rate_label(name) == ("flip rate" if name == "llm.decision_flip" else "rate"), name
        order = labels.chart_order(name)
        own = list(REGISTRY[name].chart_scopes)
        # its own charts first, in the order the report always drew them, then any other metric's
        assert order[: len(own)] == [s for s in REPORT_SCOPE_ORDER if s in own], name
        assert sorted(order) == sorted(REPORT_SCOPE_ORDER), name
    assert set(metrics.chart_scopes()) == set(REPORT_SCOPE_ORDER)
    assert labels.not_charted() == REPORT_NOT_CHARTED
    for scope, words in REPORT_SCOPE_LABELS.items():
        assert labels._scope_label({"scope": scope, "group_key": "x"}) == words
    # a metric the warehouse holds but the registry no longer knows: the generic words
    assert labels.count_labels("llm.retired") == ("n", "events", "failed")
    assert labels.rate_label("llm.retired") == "rate"
    assert labels.chart_config("llm.retired", "axis") == REGISTRY["llm.decision_flip"].chart_scopes["axis"]
