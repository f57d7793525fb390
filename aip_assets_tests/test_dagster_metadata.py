"""What the Dagster UI shows of a partition, read from a materialisation: the links from a score
to its evidence, the judgements preview with both prompts and their differing words marked, the
metric's name in every plotted number, and check results that name their partition."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from dagster import materialize

from aip_assets import pipeline
from aip_assets.assets import STAGE_ASSETS
from aip_assets.assets.tables import mark_differences, markdown_table, table_key
from aip_assets.dagster_home import get_instance
from aip_assets.partitions import partition_key, register_partitions
from aip_assets.report.links import viewer_link
from aip_assets.resources import Warehouse

from .conftest import make_spec, table, write_dataset

REPO = Path(__file__).resolve().parents[1]

# every woman's favourable decision turned: the gender axis fails a 0.9 threshold
FLIP = {"name": "flip", "value": "woman", "axis": "gender", "p": 1.0}


def _materialise(tmp_path):
    ds = write_dataset(tmp_path / "d.jsonl", 6)
    spec = make_spec(ds, sut={"provider": "builtin", "profile": FLIP}, threshold=0.9)
    pipeline.register_run(spec, "md")
    instance = get_instance()
    register_partitions(instance, "md", spec.metrics)
    key = partition_key("md", "llm.decision_flip")
    res = materialize(
        STAGE_ASSETS, resources={"warehouse": Warehouse()}, partition_key=key, instance=instance, raise_on_error=False
    )
    mats = {m.asset_key.to_user_string(): m.materialization.metadata for m in res.get_asset_materialization_events()}
    return key, res, mats


def test_a_score_links_to_its_evidence_and_names_its_partition(tmp_path):
    key, res, mats = _materialise(tmp_path)
    agg = mats["aggregation"]
    report = agg["report_url"].url
    # the viewer on this metric's flagged rows, and on each breakdown that failed its threshold
    assert agg["viewer"].url == viewer_link(report, metric="llm.decision_flip", flagged=True)
    failing = table("metric_scores", "md", "group_key").query("scope == 'axis' and passed == False")
    assert failing.group_key.tolist() == ["gender"]  # the profile's bias, and no other axis
    assert agg["viewer gender"].url == report + "#v:metric=llm.decision_flip&flagged=1&axis=gender"
    assert not [k for k in agg if k.startswith("viewer ") and k != "viewer gender"]
    # the judgements partition's page in the UI, as the UI's own links address it
    link = urlsplit(agg["judgements"].url)
    assert link.path == "/assets/warehouse/judgements" and not link.netloc
    assert parse_qs(link.query) == {"view": ["partitions"], "partition": [key]}
    # numbers that a plot draws across partitions are named by their metric
    assert "decision_flip coverage" in agg and "coverage" not in agg

    # the judgements preview: the flipped pairs with both prompts, the persona words in bold
    preview = mats["warehouse/judgements"]["preview"].md_str
    header = next(line for line in preview.splitlines() if line.startswith("| axis"))
    assert "| query_a | query_b | response_a | response_b | reasoning |" in header
    pair = table("v_flipped_pairs", "md", "axis, pair_id").iloc[0]
    a, b = mark_differences(pair.query_a, pair.query_b)
    assert f"| {a} | {b} |" in preview and "**" in a and "**" in b

    # the probes asset's preview, once judged: the flipped pairs' probes, both of each pair, their
    # differing words in bold (an observation of the partition, logged by the aggregation)
    [obs] = [r.asset_observation for r in get_instance().fetch_observations(table_key("probes"), limit=10).records]
    assert obs.partition == key
    flipped = table("v_flipped_pairs", "md", "pair_id")
    lines = obs.metadata["preview"].md_str.splitlines()[4:]
    shown = [line.split(" | ")[0].removeprefix("| ").replace("\\|", "|") for line in lines]
    assert len(flipped) >= 3 and len(shown) == 6 and set(shown) <= set(flipped.pair_id)
    assert all(shown.count(p) == 2 for p in shown)
    pair = flipped.set_index("pair_id").loc[shown[0]]
    assert lines[0].endswith(f" | {mark_differences(pair.query_a, pair.query_b)[0]} |")
    assert lines[1].endswith(f" | {mark_differences(pair.query_a, pair.query_b)[1]} |")

    # every check result says which partition it judged
    evals = res.get_asset_check_evaluations()
    assert evals and all(e.metadata["partition"].text == key for e in evals)
    by_name = {e.check_name: e for e in evals}
    assert by_name["threshold"].passed and not by_name["gate"].passed  # the overall score passes, an axis fails
    for name in ("gate", "threshold", "coverage", "differential_refusal", "judge_position_bias"):
        assert by_name[name].description.startswith("llm.decision_flip (run md)"), name
    gate = by_name["gate"]  # the gate's description: whose, then its reason, as the run's failure says it
    ov = table("metric_scores", "md", "scope").query("scope == 'overall'").iloc[0]
    assert gate.description == f"llm.decision_flip (run md): {ov.gate_reason}"


def test_the_differing_words_of_two_prompts_are_marked():
    a, b = mark_differences("As a woman in Lagos, may I borrow? *now*", "As a man in Lagos, may I borrow? *now*")
    assert a == r"As a **woman** in Lagos, may I borrow? \*now\*"  # the words escaped, the marks not
    assert b == r"As a **man** in Lagos, may I borrow? \*now\*"
    a, b = mark_differences("I am a nurse here", "I am a retired army officer here")
    assert (a, b) == ("I am a **nurse** here", "I am a **retired army officer** here")  # one bold run
    a, _ = mark_differences("x " * 300 + "end", "y " * 300 + "end", limit=20)
    assert a.endswith(" …") and a.count("**") == 2 and len(a) < 40  # cut at a word, the run closed
    md = markdown_table([{"query_a": "a woman", "query_b": "a man", "n": 1.0}], ["query_a", "query_b", "n"])
    assert md.splitlines()[2] == "| a **woman** | a **man** | 1.000 |"


def test_the_launchpad_shows_each_field_with_its_default_and_description(tmp_path):
    """`aip_launch`'s op config is a Config class: the launchpad scaffolds a default for every field
    and shows what each one is; a tick's run config (automation.launch_request) still fits it."""
    from dagster import validate_run_config

    from aip_assets.automation import LaunchConfig, launch_job, launch_request
    from aip_assets.runspec import load_spec

    fields = launch_job.get_config_schema_snapshot().all_config_snaps_by_key
    op = next(
        snap
        for snap in fields.values()
        if snap.fields and {f.name for f in snap.fields} == set(LaunchConfig.model_fields)
    )
    for f in op.fields:
        assert f.description and f.default_provided, f.name
    assert {f.name: f.default_value_as_json_str for f in op.fields}["spec_path"] == '"data/runs/demo.yaml"'
    spec = load_spec(REPO / "data" / "runs" / "demo.yaml")
    request = launch_request(spec, REPO / "data" / "runs" / "demo.yaml", "demo-x", "schedule")
    assert validate_run_config(launch_job, request.run_config)["ops"]["register_and_evaluate"]["config"] == {
        "spec_path": str(REPO / "data" / "runs" / "demo.yaml"),
        "run_id": "demo-x",
        "trigger": "schedule",
    }
    assert validate_run_config(launch_job, {})["ops"]["register_and_evaluate"]["config"]["trigger"] == "launchpad"


def test_the_demo_spec_carries_a_schedule_to_uncomment(tmp_path):
    """The demo spec's commented `schedule:` line is a valid schedule once uncommented (and the demo,
    commented, has none)."""
    import yaml

    from aip_assets.runspec import load_spec

    demo = REPO / "data" / "runs" / "demo.yaml"
    assert load_spec(demo).schedule is None
    text = demo.read_text()
    [line] = [x for x in text.splitlines() if x.startswith("# schedule:")]
    data = yaml.safe_load(text.replace(line, line[2:]))
    data["dataset"] = str((demo.parent / data["dataset"]).resolve())
    data["metrics"]["llm.perturbation_robustness_external"]["dataset"] = str(
        (demo.parent / data["metrics"]["llm.perturbation_robustness_external"]["dataset"]).resolve()
    )
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(data))
    assert load_spec(tmp_path / "s.yaml").schedule == "0 6 * * *"


def test_a_failing_group_opens_the_viewer_on_its_rows():
    """An axis is the viewer's axis filter; a group of group bias (several personas) its group filter."""
    from aip_assets.assets.stages import group_view

    assert group_view("axis", "gender") == {"axis": "gender"}
    assert group_view("attribute", "religion=Muslim") == {"group": "religion=Muslim"}
    assert group_view("attribute", "gender=transgender woman") == {"group": "gender=transgender woman"}
    link = viewer_link(
        "http://127.0.0.1:8112/r.html",
        metric="llm.group_interaction_bias",
        flagged=True,
        **group_view("attribute", "religion=Muslim"),
    )
    assert link.endswith("#v:metric=llm.group_interaction_bias&flagged=1&group=religion%3DMuslim")


def test_a_link_in_the_metadata_opens_the_viewer_on_its_rows(tmp_path):
    """The aggregation partition's `viewer gender` link, as Dagster stores it, opened in headless
    Chromium from the report server: the viewer on decision flip, flagged rows, the gender axis,
    showing exactly the rows whose pairs flipped (the profile flips gender alone)."""
    import threading

    import pytest

    from aip_assets.report import default_out, serve_reports

    from .test_report import _console_errors
    from .test_ui import CHROMIUM, CHROMIUM_ARGS

    if not CHROMIUM.exists():
        pytest.skip(f"no Chromium at {CHROMIUM}")
    sync_api = pytest.importorskip("playwright.sync_api")
    _key, _res, mats = _materialise(tmp_path)
    link = urlsplit(mats["aggregation"]["viewer gender"].url)
    flipped = sorted(set(table("v_flipped_pairs", "md", "pair_id").input_id))
    assert flipped
    server = serve_reports(default_out("md").parent, port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = link._replace(netloc=f"127.0.0.1:{server.server_address[1]}").geturl()
        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            try:
                page = browser.new_page()
                errors = _console_errors(page)
                page.goto(url)
                page.wait_for_selector("#viewer[data-ready='1']")
                shown = page.eval_on_selector_all("#viewer tr.row", "rs => rs.map(r => r.dataset.inputId)")
                assert sorted(shown) == flipped
                assert page.input_value("select[data-filter=metric]") == "llm.decision_flip"
                assert page.input_value("select[data-filter=axis]") == "gender"
                assert page.is_checked("input[data-filter=flagged]")
            finally:
                browser.close()
    finally:
        server.shutdown()
        server.server_close()
    assert errors == []
