"""Launches as an operator sees them (issue 38): the launchpad's default run id, a failed gate read
as a verdict (no stack trace), check metadata that plots one metric, and the CLI's runs on
Dagster's Overview."""

from __future__ import annotations

import yaml
from dagster import AssetCheckSeverity, DagsterEventType

from aip_assets.dagster_home import get_instance
from aip_assets.definitions import defs

from .conftest import write_dataset

FLIP = {"name": "flip", "value": "woman", "axis": "gender", "p": 1.0}


def _spec(tmp_path, name="gated", threshold: float | None = None):
    ds = write_dataset(tmp_path / "d.jsonl", 4)
    path = tmp_path / "data" / "runs" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    metric: dict = {"config": {"dimensions": ["gender"], "num_pairs_per_dimension": 1}}
    if threshold is not None:
        metric["threshold"] = threshold
    path.write_text(
        yaml.safe_dump(
            {
                "name": name,
                "dataset": str(ds),
                "seed": 1,
                "sut": {"provider": "builtin", "profile": FLIP},
                "metrics": {"llm.decision_flip": metric},
            }
        )
    )
    return path


def _launch(path, run_id: str | None = None):
    config = {"spec_path": str(path), **({"run_id": run_id} if run_id is not None else {})}
    return defs.resolve_job_def("aip_launch").execute_in_process(
        run_config={"ops": {"register_and_evaluate": {"config": config}}},
        instance=get_instance(),
        raise_on_error=False,
    )


def _registered() -> list[str]:
    from aip_assets import warehouse as wh

    return wh.query("SELECT run_id FROM eval_runs ORDER BY run_id", read_only=False).run_id.tolist()


def test_each_launch_from_the_launchpad_evaluates_a_new_run_and_a_named_run_resumes(tmp_path):
    """Fault 3: the launchpad's default run id is empty, and each launch with it registers a new run
    (named from the spec and the time, ``-2`` when that name is taken), kept as the launch's
    ``aip/run_id`` tag; a launch that names a registered run resumes it and registers none."""
    from aip_assets.automation import LaunchConfig

    assert LaunchConfig().run_id == ""
    path = _spec(tmp_path, name="pad")
    instance = get_instance()
    first, second = _launch(path), _launch(path)
    assert first.success and second.success
    ids = [instance.get_run_by_id(r.run_id).tags["aip/run_id"] for r in (first, second)]
    assert ids[0] != ids[1] and all(i.startswith("pad-") for i in ids)
    assert _registered() == sorted(ids)
    evaluated = sorted(r.tags["aip/run_id"] for r in instance.get_runs() if r.job_name == "evaluate")
    assert evaluated == sorted(ids)  # each launch evaluated its own run
    again = _launch(path, run_id=ids[0])
    assert again.success and _registered() == sorted(ids)
    logs = [e.user_message for e in instance.all_logs(again.run_id)]
    assert any(f"run {ids[0]} is registered: resuming it" in m for m in logs)


def _failure_events(instance, dagster_run_id: str):
    types = (DagsterEventType.STEP_FAILURE, DagsterEventType.RUN_FAILURE)
    return {
        e.dagster_event.event_type: e.dagster_event
        for e in instance.all_logs(dagster_run_id)
        if e.dagster_event is not None and e.dagster_event.event_type in types
    }


def test_a_failed_gate_fails_the_launch_and_the_metrics_run_with_its_reason_and_no_stack_trace(tmp_path, capsys):
    """Fault 4: a gate that fails is a verdict, not a crash. The metric's evaluate run and the
    launcher's run both fail; each one's step failure and run failure events carry the reason (the
    launcher's names the metric and the axis that failed), as a dagster.Failure's description, and no
    stack trace; the aggregation's gate check fails at ERROR. `aip-eval run` exits 1, no traceback."""
    from aip_assets.cli import main

    path = _spec(tmp_path, threshold=1.0)
    instance = get_instance()
    launch = _launch(path)
    assert not launch.success
    [evaluated] = [r for r in instance.get_runs() if r.job_name == "evaluate"]
    assert evaluated.status.value == "FAILURE"
    run_id = evaluated.tags["aip/run_id"]
    reason = pipeline_reason(run_id)
    assert "gender" in reason
    for dagster_run_id, says in (
        (evaluated.run_id, f"llm.decision_flip (run {run_id}): gate failed: {reason}"),
        (launch.run_id, f"gate failed for llm.decision_flip (Dagster run {evaluated.run_id}): {reason}"),
    ):
        events = _failure_events(instance, dagster_run_id)
        step = events[DagsterEventType.STEP_FAILURE].event_specific_data
        assert step.user_failure_data is not None and says in step.user_failure_data.description
        assert step.error.cls_name == "GateFailed"
        run = events[DagsterEventType.RUN_FAILURE]
        text = f"{run.message}\n{run.event_specific_data.error.to_string()}"  # what the run's page shows
        assert says in text, text
        for err in (step.error, run.event_specific_data.error):
            assert err.stack == [] and err.cause is None, err.to_string()
            assert "Traceback" not in err.to_string() and "Stack Trace" not in err.to_string()
    [gate] = [
        e.dagster_event.event_specific_data
        for e in instance.all_logs(evaluated.run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION)
        if e.dagster_event.event_specific_data.check_name == "gate"
    ]
    assert not gate.passed and gate.severity == AssetCheckSeverity.ERROR and reason in gate.description
    capsys.readouterr()
    assert main(["run", str(path), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "gate failed" in err and "Traceback" not in err and "Stack Trace" not in err


def pipeline_reason(run_id: str) -> str:
    from aip_assets import warehouse as wh

    return wh.query(
        "SELECT gate_reason FROM metric_scores WHERE run_id = ? AND scope = 'overall'", [run_id], read_only=False
    ).gate_reason[0]


def test_check_numbers_are_named_by_their_metric_so_each_plot_follows_one_metric(tmp_path):
    """Fault 5: Dagster plots each numeric entry of a check across every execution of the check,
    all partitions' (every metric's); a key per metric (``decision_flip coverage``) keeps each plot
    to one metric. Text and JSON keep their names; each description says whose result it is."""
    path = _spec(tmp_path, name="plots")
    launch = _launch(path, run_id="plots-1")
    assert launch.success
    instance = get_instance()
    [evaluated] = [r for r in instance.get_runs() if r.job_name == "evaluate"]
    results = {
        e.dagster_event.event_specific_data.check_name: e.dagster_event.event_specific_data
        for e in instance.all_logs(evaluated.run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION)
    }
    assert {"gate", "threshold", "coverage", "sut_completeness"} <= set(results)
    for name, r in results.items():
        assert r.description.startswith("llm.decision_flip (run plots-1)"), (name, r.description)
        for key, value in r.metadata.items():
            if isinstance(value.value, int | float) and not isinstance(value.value, bool):
                assert key.startswith("decision_flip "), (name, key)
    assert {"decision_flip score", "decision_flip coverage", "decision_flip threshold"} <= set(results["gate"].metadata)
    assert results["gate"].metadata["gate_reason"].text and results["gate"].metadata["metric"].text
    # a stand-in for a missing number keeps the number's name
    from aip_assets.checks import per_metric

    assert set(per_metric("llm.x", {"score": 0.5, "threshold": "none set", "why": "text"})) == {
        "x score",
        "x threshold",
        "why",
    }


def test_the_clis_runs_belong_to_the_code_location_the_ui_shows(tmp_path, capsys):
    """Fault 7: Dagster's Overview (its timeline and jobs) groups runs by the code location and
    repository that hold their job, and leaves out a run that names none, as `execute_in_process`
    creates them. `aip-eval run`'s evaluate runs, and those the launcher starts, name the code
    location that `aip-eval ui` loads (``aip_assets.definitions``, repository ``__repository__``)."""
    from dagster._core.workspace.context import WorkspaceProcessContext
    from dagster._core.workspace.load_target import ModuleTarget

    from aip_assets.cli import main
    from aip_assets.run_queue import location_name

    path = _spec(tmp_path, name="overview")
    assert main(["run", str(path), "--quiet"]) == 0
    instance = get_instance()
    [run] = [r for r in instance.get_runs() if r.job_name == "evaluate"]
    origin = run.remote_job_origin
    assert origin is not None and origin.job_name == "evaluate"
    # the names the UI gives the job (workspace.yaml names the module; the Overview groups runs by them)
    target = ModuleTarget(
        module_name="aip_assets.definitions", attribute=None, working_directory=None, location_name=None
    )
    with WorkspaceProcessContext(instance, target) as ctx:
        ws = ctx.create_request_context()
        [loc] = [ws.get_code_location(name) for name in ws.code_location_names]
        [repo] = loc.get_repositories().values()
        job = repo.get_full_job("evaluate")
        ui = job.get_remote_origin()
    assert origin.repository_origin.code_location_origin.location_name == ui.location_name == location_name()
    assert origin.repository_origin.repository_name == ui.repository_origin.repository_name
