"""Operating evaluations: asset checks, schedules, the new-spec sensor."""

import json
import os
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from dagster import AssetCheckSeverity, build_schedule_context, build_sensor_context, materialize

from aip_assets import pipeline
from aip_assets import warehouse as wh
from aip_assets.assets import STAGE_ASSETS
from aip_assets.automation import build_schedules, build_sensor, launch_job
from aip_assets.dagster_home import get_instance
from aip_assets.definitions import defs
from aip_assets.partitions import evaluations, partition_key, register_partitions
from aip_assets.resources import Warehouse

from .conftest import make_spec, write_dataset

RESOURCES = {"warehouse": Warehouse()}  # what Definitions binds; the stages declare it

FLIP = {"name": "flip", "value": "woman", "axis": "gender", "p": 0.3}


def _checks(result):
    return {e.check_name: e for e in result.get_asset_check_evaluations()}


def test_asset_checks_on_every_stage(tmp_path, builtin_http):
    ds = write_dataset(tmp_path / "d.jsonl", 8)
    instance = get_instance()
    url, _ = builtin_http({**FLIP, "p": 1.0}, fail_rate=0.3)
    spec = make_spec(
        ds,
        sut={"provider": "openai", "base_url": url, "model": "m"},
        config={"dimensions": ["gender", "role"]},
        threshold=0.99,
        max_failed_share=0.1,
    )
    pipeline.register_run(spec, "chk")
    register_partitions(instance, "chk", ["llm.decision_flip"])
    res = materialize(
        STAGE_ASSETS,
        resources=RESOURCES,
        partition_key=partition_key("chk", "llm.decision_flip"),
        instance=instance,
        raise_on_error=False,
    )
    # failed checks are shown beside the materialisation; only the gate's fails the run, and last
    [failure] = res.get_step_failure_events()
    assert not res.success and failure.step_key == "aggregation"
    assert failure.event_specific_data.error.cls_name == "GateFailed"
    c = _checks(res)
    assert set(c) == {
        "dataset_quality",
        "sut_completeness",
        "judge_completeness",
        "gate",
        "threshold",
        "coverage",
        "differential_refusal",
        "judge_position_bias",
        "regression",
    }
    # the spec's first run: nothing to compare with, a passed WARN (history.py)
    assert c["regression"].passed and c["regression"].severity == AssetCheckSeverity.WARN
    assert "no earlier completed run of spec" in c["regression"].description
    assert not c["gate"].passed and c["gate"].blocking and "SUT answers failed" in c["gate"].description
    assert not any(e.blocking for name, e in c.items() if name != "gate")
    assert c["dataset_quality"].passed and c["dataset_quality"].metadata["decision_flip rows"].value == 8
    # failed SUT answers above max_failed_share fail at ERROR, like the run's gate
    assert not c["sut_completeness"].passed and c["sut_completeness"].severity == AssetCheckSeverity.ERROR
    assert c["sut_completeness"].metadata["decision_flip failed_share"].value > 0.1
    assert not c["threshold"].passed and c["threshold"].severity == AssetCheckSeverity.ERROR
    # pairs with a failed answer are excluded: coverage falls below min_coverage (0.9)
    cov = c["coverage"].metadata  # its numbers named by the metric (checks.per_metric)
    assert not c["coverage"].passed and cov["decision_flip coverage"].value < 0.9
    assert cov["excluded"].value == {
        "sut_failed": cov["decision_flip planned"].value
        - round(cov["decision_flip coverage"].value * cov["decision_flip planned"].value)
    }
    assert c["judge_completeness"].passed and c["differential_refusal"].passed
    # the judgements table asset previews the flipped pairs (every woman's pair flips here)
    [j] = [
        m.materialization.metadata
        for m in res.get_asset_materialization_events()
        if m.asset_key.to_user_string() == "warehouse/judgements"
    ]
    flipped = wh.query("SELECT * FROM v_flipped_pairs WHERE run_id = 'chk' ORDER BY axis, pair_id", read_only=False)
    assert len(flipped) > 0 and "of `v_flipped_pairs`" in j["preview"].md_str
    row = flipped.iloc[0]
    assert (
        f"| {row.axis} | {row.value_a} | {row.value_b} | {row.decision_a} | {row.decision_b} |" in j["preview"].md_str
    )
    # a clean run passes every check
    spec = make_spec(ds, threshold=0.5)
    pipeline.register_run(spec, "clean")
    register_partitions(instance, "clean", ["llm.decision_flip"])
    res = materialize(
        STAGE_ASSETS, resources=RESOURCES, partition_key=partition_key("clean", "llm.decision_flip"), instance=instance
    )
    assert res.success and all(e.passed for e in res.get_asset_check_evaluations())


def _spec_file(tmp_path, ds, profile, name="nightly", schedule="0 2 * * *"):
    runs = tmp_path / "data" / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    p = runs / f"{name}.yaml"
    p.write_text(
        yaml.safe_dump(
            {
                "name": name,
                "dataset": str(ds),
                "schedule": schedule,
                "seed": 1,
                "sut": {"provider": "builtin", "profile": profile},
                "metrics": {"llm.decision_flip": {"config": {"num_pairs_per_dimension": 1}}},
            }
        )
    )
    return p


def _tick(sched, instance, when):
    ctx = build_schedule_context(
        instance=instance, scheduled_execution_time=when, repository_def=defs.get_repository_def()
    )
    return sched.evaluate_tick(ctx)


def _execute(requests, instance):
    """Run what a tick requested as the daemon would: the launcher job, which registers the run and
    evaluates each metric as a run of the evaluate job."""
    for r in requests:
        assert r.job_name == "aip_launch" and r.partition_key is None
        launcher = defs.resolve_job_def("aip_launch")  # with the resources Definitions binds
        assert launcher.execute_in_process(run_config=r.run_config, instance=instance, tags=r.tags).success


def test_schedule_ticks_register_distinct_runs_and_skip_while_busy(tmp_path, monkeypatch):
    # 24 rows (was 60): the changed SUT's drop on the gender
    # axis is significant at Holm-adjusted p = 0.011, and the other axes do not move at all
    ds = write_dataset(tmp_path / "d.jsonl", 24)
    _spec_file(tmp_path, ds, FLIP)
    instance = get_instance()
    [sched] = build_schedules(launch_job)
    assert sched.cron_schedule == "0 2 * * *"
    t1, t2 = datetime(2026, 11, 1, 2, tzinfo=UTC), datetime(2026, 11, 2, 2, tzinfo=UTC)
    first = _tick(sched, instance, t1)
    assert [r.tags["aip/run_id"] for r in first.run_requests] == ["nightly-261101-0200"]
    # evaluating a tick (as "Preview tick result" does) changes nothing: no run, no partition
    assert _tick(sched, instance, t1).run_requests == first.run_requests
    assert not pipeline.run_exists("nightly-261101-0200")
    assert not instance.get_dynamic_partitions(evaluations.name)
    _execute(first.run_requests, instance)
    assert pipeline.run_exists("nightly-261101-0200")
    evaluated = [r for r in instance.get_runs() if r.job_name == "evaluate"]
    assert [r.tags["dagster/partition"] for r in evaluated] == [
        partition_key("nightly-261101-0200", "llm.decision_flip")
    ]
    assert evaluated[0].tags["aip/trigger"] == "schedule" and evaluated[0].is_success
    # a tick while the previous run of the spec is still going skips with the reason
    import aip_assets.automation as automation

    real = automation.still_going
    monkeypatch.setattr(automation, "still_going", lambda inst, name: ["nightly-261101-0200"])
    busy = _tick(sched, instance, t2)
    assert not busy.run_requests and "still going" in busy.skip_message
    monkeypatch.setattr(automation, "still_going", real)
    second = _tick(sched, instance, t2)
    _execute(second.run_requests, instance)
    assert instance.get_dynamic_partitions(evaluations.name) == [
        "nightly-261101-0200|llm.decision_flip",
        "nightly-261102-0200|llm.decision_flip",
    ]
    s = wh.query(
        "SELECT run_id, scope, group_key, score, n, n_events FROM metric_scores ORDER BY scope, group_key, run_id"
    )
    a, b = (
        s[s.run_id.str.endswith("1101-0200")].drop(columns="run_id"),
        s[s.run_id.str.endswith("1102-0200")].drop(columns="run_id"),
    )
    assert a.reset_index(drop=True).equals(b.reset_index(drop=True))  # same SUT, same spec: zero difference
    # the same tick again does not overwrite the run
    assert "already registered" in _tick(sched, instance, t2).skip_message
    # changing the SUT between ticks: a drop on the gender axis only
    _spec_file(tmp_path, ds, {**FLIP, "p": 0.9})
    third = _tick(sched, instance, datetime(2026, 11, 3, 2, tzinfo=UTC))
    _execute(third.run_requests, instance)
    from aip_assets.compare import compare_runs

    same, warnings = compare_runs("nightly-261101-0200", "nightly-261102-0200")
    assert (same["diff"].fillna(0) == 0).all() and not same.significant.any()
    drop, _ = compare_runs("nightly-261102-0200", "nightly-261103-0200")
    sig = drop[drop.significant]
    assert set(zip(sig.scope, sig.group_key)) >= {("axis", "gender")}
    assert not sig[(sig.scope == "axis") & (sig.group_key != "gender")].shape[0]


def test_sensor_launches_new_and_changed_specs_and_reports_invalid_ones(tmp_path):
    ds = write_dataset(tmp_path / "d.jsonl", 5)
    _spec_file(tmp_path, ds, FLIP, name="a", schedule=None)
    bad = tmp_path / "data" / "runs" / "broken.yaml"
    bad.write_text(
        yaml.safe_dump(
            {
                "name": "broken",
                "dataset": str(ds),
                "metrics": {"llm.decision_flip": {"config": {"num_pairs_per_dimension": 99}}},
            }
        )
    )
    instance = get_instance()
    sensor = build_sensor(launch_job)
    # its first tick records the specs already there as seen and launches none (turning the sensor
    # on must not launch every spec in the folder)
    first = _sensor_tick(
        sensor, build_sensor_context(instance=instance, repository_def=defs.get_repository_def()), instance
    )
    assert not first.run_requests and "first tick: 2 spec file(s)" in first.skip_message
    # the UI's "Preview tick result" passes an empty cursor: a first tick, not a crash (issue 38)
    preview = _sensor_tick(
        sensor, build_sensor_context(instance=instance, cursor="", repository_def=defs.get_repository_def()), instance
    )
    assert not preview.run_requests and "first tick: 2 spec file(s)" in preview.skip_message
    (tmp_path / "data" / "runs" / "a.yaml").rename(tmp_path / "data" / "runs" / "a2.yaml")  # a new file
    ctx = build_sensor_context(instance=instance, cursor=first.cursor, repository_def=defs.get_repository_def())
    out = _sensor_tick(sensor, ctx, instance)
    assert len(out.run_requests) == 1 and out.run_requests[0].tags["aip/spec"] == "a"
    assert "broken" not in {r.tags["aip/spec"] for r in out.run_requests}
    assert not wh.default_path().exists()  # a tick registers nothing (no warehouse yet); the launched run does
    _execute(out.run_requests, instance)
    assert len(pipeline.list_runs()) == 1
    cursor = out.cursor
    bad.write_text(bad.read_text() + "\n# edited, still invalid\n")
    only_bad = _sensor_tick(
        sensor,
        build_sensor_context(instance=instance, cursor=cursor, repository_def=defs.get_repository_def()),
        instance,
    )
    assert not only_bad.run_requests
    assert "broken.yaml not launched" in only_bad.skip_message and "num_pairs_per_dimension" in only_bad.skip_message
    cursor = only_bad.cursor
    again = _sensor_tick(
        sensor,
        build_sensor_context(instance=instance, cursor=cursor, repository_def=defs.get_repository_def()),
        instance,
    )
    assert not again.run_requests and "no new or changed spec" in again.skip_message
    _spec_file(tmp_path, ds, {**FLIP, "p": 0.5}, name="a2", schedule=None)  # changed (same file, new content)
    changed = _sensor_tick(
        sensor,
        build_sensor_context(instance=instance, cursor=cursor, repository_def=defs.get_repository_def()),
        instance,
    )
    assert len(changed.run_requests) == 1
    _execute(changed.run_requests, instance)
    runs = pipeline.list_runs()
    assert len(runs) == 2 and set(runs.spec_name) == {"a", "a2"}
    assert "broken" not in set(runs.spec_name)


def _sensor_tick(sensor, ctx, instance):
    """Evaluate a tick as the daemon does: partition keys resolve against the instance."""
    from dagster import partition_loading_context

    with partition_loading_context(dynamic_partitions_store=instance):
        out = sensor.evaluate_tick(ctx)
    return out


def _spec_yaml(tmp_path, ds, **extra):
    p = tmp_path / "s.yaml"
    p.write_text(
        yaml.safe_dump(
            {
                "name": "cost",
                "dataset": str(ds),
                "retry_backoff_seconds": 0.01,
                "metrics": {
                    "llm.decision_flip": {"config": {"dimensions": ["gender", "role"]}},
                    "llm.semantic_consistency": {},
                },
                **extra,
            }
        )
    )
    return p


@pytest.mark.default_baseline  # the null pairs' fresh samples are counted too
def test_dry_run_estimates_calls_without_calling_or_writing(tmp_path, capsys, monkeypatch):
    from aip_assets.cli import main

    ds = write_dataset(tmp_path / "d.jsonl", 12)
    spec = _spec_yaml(tmp_path, ds, limits={"max_calls": 10})
    assert main(["run", str(spec), "--dry-run", "--json"]) == 0
    est = json.loads(capsys.readouterr().out)
    assert not wh.default_path().exists()  # nothing written
    assert est["within_limits"] is False and est["total"]["tokens"] > 0
    import aip_assets.report as report_mod

    written, real = [], report_mod.write_report

    def spy(run_id, *a, **k):
        out = real(run_id, *a, **k)
        written.append((run_id, out.read_text()))
        return out

    monkeypatch.setattr(report_mod, "write_report", spy)
    assert main(["run", str(spec), "--json", "--quiet", "--max-calls", "100000"]) == 0
    run_id = json.loads(capsys.readouterr().out)["run_id"]
    # a run of two metrics writes its report once, after the last, with both; each aggregation links it
    assert [r for r, _ in written] == [run_id]
    assert all(f"llm.{m}" in written[0][1] for m in ("decision_flip", "semantic_consistency"))
    from dagster import AssetKey, AssetRecordsFilter

    recs = (
        get_instance()
        .fetch_materializations(
            AssetRecordsFilter(
                asset_key=AssetKey("aggregation"), asset_partitions=[f"{run_id}|{m}" for m in est["metrics"]]
            ),
            limit=10,
        )
        .records
    )
    assert len(recs) == 2
    for rec in recs:
        meta = rec.asset_materialization.metadata
        assert meta["report"].value == str(report_mod.default_out(run_id).resolve())
        assert "written when the run's last metric ends" in meta["report_how"].text
    calls = wh.query("SELECT metric, role, count(*) AS n FROM llm_calls WHERE run_id = ? GROUP BY ALL", [run_id])
    got = {(r.metric, r.role): r.n for r in calls.itertuples()}
    for m, e in est["metrics"].items():
        assert got[(m, "sut")] == e["sut_calls"]  # SUT calls are counted exactly
        assert got[(m, "judge")] <= e["judge_calls"]  # identical judge prompts may be answered from the cache
    # the CLI's runs are the evaluate job's (in-process) runs, one per metric partition, as in the UI
    runs = [r for r in get_instance().get_runs() if r.tags.get("aip/run_id") == run_id]
    assert sorted(r.tags["aip/metric"] for r in runs) == sorted(est["metrics"])
    assert sorted(r.tags["dagster/partition"] for r in runs) == sorted(f"{run_id}|{m}" for m in est["metrics"])
    # the run's partitions are exactly its configured metrics (of this run; the instance holds others)
    assert sorted(
        k for k in get_instance().get_dynamic_partitions(evaluations.name) if k.startswith(f"{run_id}|")
    ) == sorted(f"{run_id}|{m}" for m in est["metrics"])
    assert {r.job_name for r in runs} == {"evaluate"} and all(r.is_success for r in runs)
    assert defs.resolve_job_def("evaluate").executor_def.name == "in_process"
    assert defs.resolve_implicit_global_asset_job_def().executor_def.name == "in_process"  # UI launches too


def test_run_stops_at_its_call_cap_and_resumes(tmp_path, capsys, builtin_http):
    from aip_assets.cli import main

    ds = write_dataset(tmp_path / "d.jsonl", 10)
    url, server = builtin_http()
    spec = _spec_yaml(tmp_path, ds, limits={"max_calls": 25}, sut={"provider": "openai", "base_url": url, "model": "m"})
    assert main(["run", str(spec), "--json", "--quiet", "--metric", "llm.decision_flip"]) == 4
    err = capsys.readouterr()
    run_id = json.loads(err.out)["run_id"]
    assert "reached limits.max_calls = 25" in err.err
    assert (
        wh.query("SELECT count(*) AS n FROM sut_responses WHERE run_id = ?", [run_id]).n[0] == 0
    )  # nothing half-written
    probes = {b for b in server.ok_bodies if "Reply with OK." not in b}
    assert len(probes) == 25
    assert (
        main(
            [
                "run",
                str(spec),
                "--run-id",
                run_id,
                "--max-calls",
                "100000",
                "--json",
                "--quiet",
                "--metric",
                "llm.decision_flip",
            ]
        )
        == 0
    )
    n_probes = wh.query("SELECT count(*) AS n FROM probes WHERE run_id = ?", [run_id]).n[0]
    bodies = {b: c for b, c in server.ok_bodies.items() if "Reply with OK." not in b}
    assert len(bodies) == n_probes and set(bodies.values()) == {1}  # resumed without repeating a call
    stored = json.loads(wh.query("SELECT spec FROM eval_runs WHERE run_id = ?", [run_id]).spec[0])
    assert stored["limits"]["max_calls"] == 100000


def test_requests_per_minute_spaces_request_starts():
    import asyncio
    import time

    from aip_assets.models.ratelimit import SharedRate

    limiter = SharedRate("http://example.invalid/v1", rpm=1200, tpm=None)  # one start every 50 ms

    async def go():
        t0 = time.monotonic()
        for _ in range(6):
            await limiter.wait()
        return time.monotonic() - t0

    assert asyncio.run(go()) >= 5 * 0.05 * 0.99  # a lower bound: a slow machine only adds to it


def test_a_launch_points_a_spec_at_another_sut_through_the_sut_resource(tmp_path, scripted, monkeypatch):
    """The launcher's `sut` resource (set in the UI's launch dialog) replaces the spec's SUT for
    that run: the scripted endpoint answers every probe, the stored spec records it (the key's
    variable name, never the key), and the Resources tab lists both resources."""
    from aip_assets.automation import launch_request
    from aip_assets.resources import SutConnection

    monkeypatch.setenv("UI_SUT_KEY", "sk-test-secret-value-123456")
    server = scripted(lambda body, n: "I reviewed it. Decision: YES")
    ds = write_dataset(tmp_path / "d.jsonl", 3)
    path = _spec_file(tmp_path, ds, FLIP, name="other", schedule=None)
    instance = get_instance()
    from aip_assets.runspec import load_spec

    r = launch_request(load_spec(path), path, "other-1", "ui")
    sut = SutConnection(base_url=server.url, model="scripted", api_key_env="UI_SUT_KEY")
    result = launch_job.execute_in_process(
        run_config=r.run_config, instance=instance, tags=r.tags, resources={"sut": sut, "warehouse": Warehouse()}
    )
    assert result.success
    spec, _ = pipeline.load_run("other-1")
    assert spec.sut.base_url == server.url and spec.sut.api_key_env == "UI_SUT_KEY"
    probes = wh.query("SELECT count(*) AS n FROM probes WHERE run_id = 'other-1'", read_only=False).n[0]
    bodies = server.bodies()
    assert len(bodies) == probes > 0
    stored = wh.query("SELECT * FROM eval_runs WHERE run_id = 'other-1'", read_only=False).to_json()
    assert "sk-test-secret-value-123456" not in stored and "UI_SUT_KEY" in stored
    assert set(defs.resources) == {"warehouse", "sut"}
    # an unusable endpoint in the resource fails the launch with the field named, and registers nothing
    bad = SutConnection(base_url="http://user:pw@localhost:1/v1", model="m")
    failed = launch_job.execute_in_process(
        run_config=launch_request(load_spec(path), path, "other-2", "ui").run_config,
        instance=instance,
        resources={"sut": bad, "warehouse": Warehouse()},
        raise_on_error=False,
    )
    assert not failed.success and not pipeline.run_exists("other-2")
    [err] = [e.event_specific_data.error.message for e in failed.get_step_failure_events()]
    assert "base_url" in err and "pw" not in err


def test_two_specs_of_one_name_get_one_schedule_and_the_cli_still_runs(tmp_path, capsys, caplog):
    """A copied spec (same name, both scheduled) must not break the code location or `aip-eval run`:
    the first file keeps the schedule, the copy is named in a warning."""
    import shutil

    from aip_assets.cli import main

    ds = write_dataset(tmp_path / "d.jsonl", 3)
    first = _spec_file(tmp_path, ds, FLIP, name="twin")
    shutil.copy(first, first.with_name("twin_copy.yaml"))
    [sched] = build_schedules(launch_job)
    assert sched.name == "aip_twin_schedule" and "give this spec another name" in caplog.text
    from dagster import Definitions

    from aip_assets.definitions import RESOURCES

    Definitions.validate_loadable(
        Definitions(jobs=[launch_job], schedules=build_schedules(launch_job), resources=RESOURCES)
    )
    assert main(["run", str(first), "--quiet", "--json"]) == 0


def test_parallel_metrics_give_the_same_scores_as_one_at_a_time(tmp_path, capsys):
    """`aip-eval run --parallel 2`: each metric in a worker process, the same evaluate runs in the
    same Dagster storage, and exactly the scores of a sequential run of the same spec."""
    from aip_assets.cli import main

    ds = write_dataset(tmp_path / "d.jsonl", 4)
    spec = tmp_path / "p.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "name": "par",
                "dataset": str(ds),
                "seed": 5,
                "sut": {"provider": "builtin", "profile": FLIP},
                "metrics": {
                    "llm.decision_flip": {"config": {"num_pairs_per_dimension": 1}},
                    "llm.semantic_consistency": {"config": {"responses_per_query": 2}},
                    "llm.group_interaction_bias": {"config": {"num_pairs": 2, "persona_pool_size": 4}},
                },
            }
        )
    )
    summaries = {}
    for parallel in (1, 2):
        assert main(["run", str(spec), "--json", "--quiet", "--parallel", str(parallel)]) in (0, 1)
        summaries[parallel] = json.loads(capsys.readouterr().out)
    one, two = summaries[1], summaries[2]
    assert two["failed_metrics"] == [] and set(two["metrics"]) == set(one["metrics"])
    for m, s in one["metrics"].items():
        assert (s["score"], s["ci95"], s["passed"]) == (
            two["metrics"][m]["score"],
            two["metrics"][m]["ci95"],
            two["metrics"][m]["passed"],
        ), m
    runs = [r for r in get_instance().get_runs() if r.tags.get("aip/run_id") == two["run_id"]]
    assert sorted(r.tags["aip/metric"] for r in runs) == sorted(one["metrics"])
    assert {r.job_name for r in runs} == {"evaluate"}
    # a metric's Dagster run succeeds exactly when its gate passed (a failed gate fails it)
    assert {r.tags["aip/metric"]: r.is_success for r in runs} == {m: s["passed"] for m, s in two["metrics"].items()}
    # call caps are counted per process: refused with --parallel, before anything is written
    assert main(["run", str(spec), "--parallel", "2", "--max-calls", "10"]) == 2
    assert "--parallel" in capsys.readouterr().err


def test_the_run_queue_follower_tells_a_failed_gate_from_a_failed_stage(tmp_path):
    """`aip-eval run --submit` follows Dagster runs (run_queue.wait): a run that failed on its gate
    alone is a completed evaluation whose gate failed (exit 1), a run whose stage failed is not."""
    from aip_assets.jobs import evaluate
    from aip_assets.run_queue import wait

    ds = write_dataset(tmp_path / "d.jsonl", 6)
    instance = get_instance()
    runs = {}
    for run_id, threshold in (("gate", 1.0), ("ok", 0.0)):
        spec = make_spec(ds, sut={"provider": "builtin", "profile": {**FLIP, "p": 1.0}}, threshold=threshold)
        pipeline.register_run(spec, run_id)
        register_partitions(instance, run_id, spec.metrics)
        runs[run_id] = (
            evaluate()
            .execute_in_process(
                partition_key=partition_key(run_id, "llm.decision_flip"), instance=instance, raise_on_error=False
            )
            .run_id
        )
    instance.add_dynamic_partitions(evaluations.name, ["typed|llm.decision_flip"])  # no such run: ingest fails
    runs["broken"] = (
        evaluate()
        .execute_in_process(partition_key="typed|llm.decision_flip", instance=instance, raise_on_error=False)
        .run_id
    )
    assert [instance.get_run_by_id(runs[k]).status.value for k in ("gate", "ok", "broken")] == [
        "FAILURE",
        "SUCCESS",
        "FAILURE",
    ]
    out = {o.metric: o for o in wait(instance, runs, poll_seconds=0.01)}
    assert out["gate"].gate_failed and out["gate"].completed and not out["gate"].success
    assert "gate failed: score" in out["gate"].errors[0]
    assert not out["broken"].gate_failed and not out["broken"].completed
    assert "run 'typed' is not registered" in out["broken"].errors[0]
    assert out["ok"].success and not out["ok"].gate_failed and out["ok"].errors == []


def test_a_launch_whose_gate_failed_fails_saying_so_not_as_a_failed_stage(tmp_path):
    """The launcher job (schedules, the sensor) evaluates every stage of a metric whose gate fails,
    and ends as a failed run that says the gate failed, not that a stage did."""
    from aip_assets.automation import launch_request
    from aip_assets.runspec import load_spec

    ds = write_dataset(tmp_path / "d.jsonl", 6)
    path = _spec_file(tmp_path, ds, {**FLIP, "p": 1.0}, name="gated", schedule=None)
    data = yaml.safe_load(path.read_text())
    data["metrics"]["llm.decision_flip"]["threshold"] = 1.0
    path.write_text(yaml.safe_dump(data))
    instance = get_instance()
    r = launch_request(load_spec(path), path, "gated-1", "ui")
    res = defs.resolve_job_def("aip_launch").execute_in_process(
        run_config=r.run_config, instance=instance, tags=r.tags, raise_on_error=False
    )
    assert not res.success
    [failure] = res.get_step_failure_events()
    desc = failure.event_specific_data.user_failure_data.description
    assert "gate failed for llm.decision_flip" in desc and "stage failed" not in desc
    [evaluated] = [x for x in instance.get_runs() if x.job_name == "evaluate"]
    assert evaluated.status.value == "FAILURE"
    scores = wh.query(
        "SELECT passed FROM metric_scores WHERE run_id = 'gated-1' AND scope = 'overall'", read_only=False
    )
    assert scores.passed.tolist() == [False]


def test_a_clients_calls_in_flight_stay_within_the_endpoints_connections():
    """A client's concurrency is capped by the connection's max_connections before any slot is
    taken (the workers of --parallel share them through slot files: test_ratelimit.py)."""
    from aip_assets.models.client import ModelClient
    from aip_assets.runspec import Connection

    for max_conn, concurrency, want in ((64, 32, 32), (16, 32, 16), (1, 8, 1)):
        conn = Connection(provider="openai", base_url="http://127.0.0.1:9/v1", model="m", max_connections=max_conn)
        c = ModelClient(conn, role="sut", run_id="r", metric="m", stage="s", journal=None, concurrency=concurrency)
        assert c.sem.ceiling == want and c.slots is None  # no slot before a call is sent


def test_the_cli_keeps_dagster_engines_and_the_ui_reads_the_same_storage(tmp_path, capsys, monkeypatch):
    """The CLI's Dagster instance stores events with EngineKeepingSqliteEventLogStorage (one
    SQLAlchemy engine per database kept, at most KEEP); Dagster's plain `storage: sqlite` (what
    `dagster dev` opens from the project's dagster.yaml) on the same folder sees its runs and
    materialisations. On a Dagster whose internals differ, the CLI writes the plain settings."""
    import yaml
    from dagster import AssetKey, DagsterInstance

    from aip_assets import dagster_storage
    from aip_assets.cli import main
    from aip_assets.dagster_home import instance_settings

    ds = write_dataset(tmp_path / "d.jsonl", 3)
    spec = _spec_yaml(tmp_path, ds)
    assert main(["run", str(spec), "--json", "--quiet"]) == 0
    run_id = json.loads(capsys.readouterr().out)["run_id"]
    inst = get_instance()
    store = inst._event_storage
    runs = inst.get_runs()
    assert len(runs) == 2
    if dagster_storage.FAST:  # the Dagster this override was written for (AUDITED_CONNECT)
        assert type(store).__name__ == "EngineKeepingSqliteEventLogStorage"
        sql = dagster_storage._dagster_sqlite
        made, real = [], sql.create_engine
        monkeypatch.setattr(sql, "create_engine", lambda *a, **k: made.append(a[0]) or real(*a, **k))
        for _ in range(3):  # each run's events read three times: one engine per run's database
            for r in runs:
                assert inst.all_logs(r.run_id)
        assert len(made) == 2 and len(store._engines) == 2
        monkeypatch.setattr(dagster_storage, "KEEP", 1)
        for r in runs:
            inst.all_logs(r.run_id)
        assert len(store._engines) == 1  # the oldest let go
        # each database written keeps an idle connection (its anchor), so a statement's connection
        # is never the last to close: the WAL is not checkpointed away and made again per statement
        db = Path(store.conn_string_for_shard(runs[0].run_id).split("///", 1)[1])
        assert any(k[0] == str(db) for k in dagster_storage.ANCHORS._held)
        assert db.with_name(db.name + "-wal").exists()
        with store.run_connection(runs[0].run_id) as conn:  # commits wait for no disk flush (1 = NORMAL)
            assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 1
    else:  # another Dagster: its own storage, and the CLI wrote the plain settings
        assert type(store).__name__ == "SqliteEventLogStorage"
    if dagster_storage.FAST_RUNS:
        assert type(inst._run_storage).__name__ == "EngineKeepingSqliteRunStorage"
        with inst._run_storage.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 1
        engine = inst._run_storage._kept_engine
        inst.get_runs()
        assert inst._run_storage._kept_engine is engine  # one engine for every statement
    ui_home = tmp_path / "ui_home"
    ui_home.mkdir()
    storage = Path(os.environ["AIP_DATA_DIR"]) / "dagster_home" / "storage"
    (ui_home / "dagster.yaml").write_text(yaml.safe_dump({"storage": {"sqlite": {"base_dir": str(storage)}}}))
    ui = DagsterInstance.from_config(str(ui_home))
    assert type(ui._event_storage).__name__ == "SqliteEventLogStorage"
    assert sorted(r.run_id for r in ui.get_runs()) == sorted(r.run_id for r in inst.get_runs())
    assert len([r for r in ui.get_runs() if r.tags.get("aip/run_id") == run_id]) == 2
    ev = ui.get_latest_materialization_event(AssetKey("aggregation"))
    assert ev is not None and ev.dagster_event.partition.startswith(f"{run_id}|")
    written = instance_settings(tmp_path / "h")  # what this Dagster gets
    monkeypatch.setattr(dagster_storage, "FAST", False)
    if dagster_storage.FAST_RUNS:  # each storage on its own: the run storage still the faster one
        assert (
            yaml.safe_load(instance_settings(tmp_path / "h"))["run_storage"]["class"] == "EngineKeepingSqliteRunStorage"
        )
    monkeypatch.setattr(dagster_storage, "FAST_RUNS", False)
    plain = yaml.safe_load(instance_settings(tmp_path / "h"))
    assert plain["storage"] == {"sqlite": {"base_dir": str((tmp_path / "h" / "storage").resolve())}}
    assert "event_log_storage" not in plain
    # a dagster.yaml written while FAST held still loads after an upgrade turned it off: the class
    # is there, as Dagster's own
    home = tmp_path / "stale_home"
    home.mkdir()
    (home / "dagster.yaml").write_text(written.replace(str((tmp_path / "h").resolve()), str(home)))
    stale = DagsterInstance.from_config(str(home))
    assert stale.get_runs() == [] and list(stale.all_logs("no-such-run")) == []


def test_an_anchor_holds_no_read_open_so_the_wal_stays_bounded(tmp_path):
    """The idle connection kept per database (dagster_storage.ANCHORS) must not hold a read: one
    would stop every checkpoint, and the WAL would grow with every event ever written."""
    import sqlite3

    from aip_assets import dagster_storage

    db = tmp_path / "events.db"
    c = sqlite3.connect(db)
    c.execute("PRAGMA journal_mode=WAL")
    c.execute("CREATE TABLE t (x BLOB)")
    c.close()
    dagster_storage.ANCHORS.hold(str(db))
    try:
        assert any(k[0] == str(db) for k in dagster_storage.ANCHORS._held)
        for _ in range(3000):  # 12 MB through connections of their own, as Dagster writes
            c = sqlite3.connect(db)
            c.execute("INSERT INTO t VALUES (?)", (os.urandom(4000),))
            c.commit()
            c.close()
            assert db.with_name("events.db-wal").exists()  # never the last connection: the WAL stays
        # SQLite checkpoints every 1,000 pages (4 MB) and starts the WAL over: it stays near that
        assert db.with_name("events.db-wal").stat().st_size < 6_000_000
    finally:
        dagster_storage.ANCHORS.release(str(db))
    assert not db.with_name("events.db-wal").exists()  # the last one out checkpointed and removed it
    # a fork: the anchors are closed before it (a child must not lean on its parent's), and the
    # child holds none
    dagster_storage.ANCHORS.hold(str(db))
    assert len(dagster_storage.ANCHORS) >= 1
    pid = os.fork()
    if pid == 0:  # the child
        os._exit(0 if len(dagster_storage.ANCHORS) == 0 else 1)
    assert os.waitpid(pid, 0)[1] == 0
    assert len(dagster_storage.ANCHORS) == 0
    c = sqlite3.connect(db)
    assert c.execute("SELECT count(*) FROM t").fetchone()[0] == 3000
    c.close()


def test_the_ui_watching_a_run_sees_each_event_the_cli_writes(tmp_path):
    """The UI (Dagster's own SqliteEventLogStorage) follows a running run by watching its
    <run_id>.db; the CLI's storage keeps the log open (its anchor), so each write is in the -wal
    file and the .db is touched for it: the watcher still gets every event as it is written."""
    import logging
    import threading

    from dagster._core.events.log import EventLogEntry
    from dagster._core.storage.event_log.sqlite.sqlite_event_log import SqliteEventLogStorage

    from aip_assets import dagster_storage

    if not dagster_storage.FAST:
        pytest.skip("this Dagster gets the plain settings: nothing to check")
    base = str(tmp_path / "runs")
    cli = dagster_storage.EngineKeepingSqliteEventLogStorage(base)
    ui = SqliteEventLogStorage(base)

    def entry(msg):
        return EventLogEntry(
            error_info=None,
            level=logging.INFO,
            user_message=msg,
            run_id="r1",
            timestamp=time.time(),
            step_key=None,
            job_name=None,
            dagster_event=None,
        )

    cli.store_event(entry("first"))
    seen, got = [], threading.Event()

    def callback(ev, cursor):
        seen.append(ev.user_message)
        if ev.user_message == "third":
            got.set()

    ui.watch("r1", None, callback)
    try:
        time.sleep(0.2)  # the watcher's observer starts
        cli.store_event(entry("second"))
        cli.store_event(entry("third"))
        # patience: the watcher answers within a second here; 60 s for a loaded machine
        assert got.wait(60), seen
        assert seen[-2:] == ["second", "third"]
    finally:
        ui.end_watch("r1", callback)
        ui.dispose()
        cli.dispose()
        dagster_storage.ANCHORS.release()


def test_parallel_workers_share_the_runs_call_cap_through_postgres(tmp_path, capsys, monkeypatch, postgres):
    """With AIP_SHARED_STATE_URL, `--parallel` takes a capped run: its metrics' worker processes
    draw from one budget in Postgres. Three metrics, max_calls 30: the run stops at its cap
    (exit 4) having made 30 calls in all, not 30 per worker."""
    from aip_assets.cli import main

    monkeypatch.setenv("AIP_SHARED_STATE_URL", postgres.url)
    ds = write_dataset(tmp_path / "d.jsonl", 4)
    spec = tmp_path / "cap.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "name": f"cap{os.getpid()}",
                "dataset": str(ds),
                "seed": 5,
                "sut": {"provider": "builtin", "profile": FLIP},
                "metrics": {
                    "llm.decision_flip": {"config": {"num_pairs_per_dimension": 1}},
                    "llm.semantic_consistency": {"config": {"responses_per_query": 2}},
                    "llm.group_interaction_bias": {"config": {"num_pairs": 2, "persona_pool_size": 4}},
                },
            }
        )
    )
    assert main(["run", str(spec), "--json", "--quiet", "--parallel", "2", "--max-calls", "30"]) == 4
    run_id = json.loads(capsys.readouterr().out)["run_id"]
    import psycopg

    with psycopg.connect(postgres.url) as con:
        assert con.execute("SELECT calls FROM aip_run_budget WHERE run_id = %s", [run_id]).fetchone()[0] == 30
    from aip_assets.models.journal import Journal, journal_path

    j = Journal(journal_path(wh.default_path()))  # no lake: the journal is this machine's, beside its warehouse
    try:
        assert j.totals(run_id)[0] == 30  # every call the workers made, journaled: 30 in all
    finally:
        j.close()
