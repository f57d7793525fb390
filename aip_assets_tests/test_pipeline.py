"""End to end: the real transport on loopback, crash and resume, failures as data, Dagster, the CLI."""

import json
import os
import re
import time

import pytest
from dagster import materialize

from aip_assets import pipeline
from aip_assets import warehouse as wh
from aip_assets.assets import STAGE_ASSETS
from aip_assets.cli import main
from aip_assets.dagster_home import get_instance
from aip_assets.partitions import evaluations, partition_key, register_partitions
from aip_assets.resources import Warehouse
from aip_assets.warehouse import connection as whc
from aip_assets.warehouse import linger as wh_linger
from aip_assets.warehouse import opening as wh_opening

from .conftest import crash_sampling_after, make_spec, run_all, run_in_worker, table, write_dataset

RESOURCES = {"warehouse": Warehouse()}  # what Definitions binds; the stages declare it

FLIP = {"name": "flip", "value": "woman", "axis": "gender", "p": 0.3}
STABLE = {
    "probes": ("probe_id", ["probe_id", "input_id", "axis", "attribute_value", "query_text", "messages"]),
    "sut_responses": ("probe_id", ["probe_id", "response", "status", "model", "fingerprint", "prompt_tokens"]),
    "judgements": (
        "pair_id",
        ["pair_id", "order_swapped", "status", "raw_output", "decision_a", "decision_b", "flipped", "reasoning"],
    ),
    "row_scores": ("input_id", ["input_id", "raw_score", "score", "label", "n_judged", "n_failed", "n_events"]),
    "metric_scores": ("scope, group_key", ["scope", "group_key", "score", "ci_low", "ci_high", "n", "n_events"]),
}


def _stable(run_id):
    return {t: table(t, run_id, order)[cols].reset_index(drop=True) for t, (order, cols) in STABLE.items()}


def _assert_same(a, b):
    for t in STABLE:
        assert a[t].equals(b[t]), t


def test_http_transport_gives_identical_tables(tmp_path, builtin_http):
    ds = write_dataset(tmp_path / "d.jsonl", 15, multi_turn_every=3)
    url, server = builtin_http(FLIP)
    run_all(make_spec(ds, sut={"provider": "builtin", "profile": FLIP}), "inproc")
    run_all(make_spec(ds, sut={"provider": "openai", "base_url": url, "model": "aip-builtin-flip"}), "http")
    _assert_same(_stable("inproc"), _stable("http"))
    calls = table("llm_calls", "http", "created_at")
    assert server.stats["ok"] >= len(calls[calls.role == "sut"]) > 0
    sut_calls = calls[calls.role == "sut"]
    assert set(sut_calls.response_model) == {"aip-builtin-flip"} and calls.fingerprint.notna().all()


def test_crash_mid_sampling_resumes_without_repeating_calls(tmp_path, builtin_http, monkeypatch):
    ds = write_dataset(tmp_path / "d.jsonl", 10)
    url, server = builtin_http(FLIP)
    spec = make_spec(
        ds, sut={"provider": "openai", "base_url": url, "model": "m"}, config={"sub_call_concurrency_limit": 1}
    )
    run_all(spec, "crash", stages=["ingest", "synthesis"])
    n_probes = len(table("probes", "crash", "probe_id"))

    def probe_bodies():  # successful SUT calls counted at the server, endpoint checks left out
        return {b: n for b, n in server.ok_bodies.items() if "Reply with OK." not in b}

    crash_sampling_after(monkeypatch, "crash", 37)
    assert table("sut_responses", "crash", "probe_id").empty  # nothing written by the crashed stage
    done_before = len(probe_bodies())
    assert 30 <= done_before <= 37
    run_all(spec, "crash", stages=["sampling", "judging", "aggregation"])
    bodies = probe_bodies()
    assert len(bodies) == n_probes and set(bodies.values()) == {1}  # no successful call made twice
    resp = table("sut_responses", "crash", "probe_id")
    assert resp.cached.sum() == done_before and len(resp) == n_probes
    # the resumed run's tables equal an uninterrupted run's
    run_all(
        make_spec(
            ds, sut={"provider": "openai", "base_url": url, "model": "m"}, config={"sub_call_concurrency_limit": 1}
        ),
        "clean",
    )
    _assert_same(_stable("crash"), _stable("clean"))
    assert len(table("llm_calls", "crash", "created_at").query("stage == 'sampling'")) == n_probes


@pytest.mark.parametrize("shared", [False, True], ids=["local", "shared"])
def test_a_killed_stage_loses_only_unwritten_calls_and_resumes(tmp_path, builtin_http, shared, request, monkeypatch):
    """SIGKILL a process in the middle of sampling. The journal is written off the event loop in
    batches, so a kill loses the calls answered but not yet written (in flight, or queued for the
    next flush) and nothing else: on resume exactly those are asked again, every journaled call is
    answered from the journal, and the tables equal an uninterrupted run's. Shared mode
    (AIP_SHARED_STATE_URL): the journal is in Postgres (no file beside the warehouse), and the
    resume runs in another process and another working folder, as another worker would."""
    import os
    import signal
    import sqlite3
    import subprocess
    import sys

    from aip_assets.models.journal import journal_path

    rid = "kill"
    if shared:  # the warehouse a DuckLake, the journal in its Postgres database
        db_url = request.getfixturevalue("lake")
        # the killed worker's lease ends after 3 s, not the default 30, when the resume takes it over
        monkeypatch.setenv("AIP_LEASE_SECONDS", "3")
    ds = write_dataset(tmp_path / "d.jsonl", 10)
    url, server = builtin_http(FLIP, latency_ms=5)
    spec = make_spec(
        ds, sut={"provider": "openai", "base_url": url, "model": "m"}, config={"sub_call_concurrency_limit": 2}
    )
    run_all(spec, rid, stages=["ingest", "synthesis"])
    n_probes = len(table("probes", rid, "probe_id"))

    def probe_bodies():  # successful SUT calls counted at the server, endpoint checks left out
        return {b: n for b, n in server.ok_bodies.items() if "Reply with OK." not in b}

    def journaled_ok() -> int:
        sql = f"SELECT count(*) FROM {{}}call_index WHERE run_id = '{rid}' AND stage = 'sampling' AND status = 'ok'"
        if shared:
            import psycopg

            with psycopg.connect(db_url) as con:
                return con.execute(sql.format("aip_journal.")).fetchone()[0]
        with sqlite3.connect(journal_path(wh.default_path())) as con:
            return con.execute(sql.format("")).fetchone()[0]

    code = f"from aip_assets import pipeline; pipeline.run_stage('sampling', {rid!r}, 'llm.decision_flip')"
    (tmp_path / "worker1").mkdir()
    proc = subprocess.Popen([sys.executable, "-c", code], env=dict(os.environ), cwd=tmp_path / "worker1")
    while proc.poll() is None and len(probe_bodies()) < 40:  # mid-stage: 40 of about 220 answered
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL, "the stage ended before it could be killed"
    answered = set(probe_bodies())
    journaled = journaled_ok()
    assert 0 < journaled <= len(answered) < n_probes
    assert table("sut_responses", rid, "probe_id").empty  # the killed stage wrote no rows
    assert journal_path(wh.default_path()).exists() != shared

    if shared:  # the rest of the stage on another worker: another process, another working folder
        (tmp_path / "worker2").mkdir()
        subprocess.run(
            [sys.executable, "-c", code], env=dict(os.environ), cwd=tmp_path / "worker2", check=True, timeout=600
        )
        run_all(spec, rid, stages=["judging", "aggregation"])
    else:
        run_all(spec, rid, stages=["sampling", "judging", "aggregation"])
    bodies = probe_bodies()
    assert len(bodies) == n_probes and set(bodies.values()) <= {1, 2}
    asked_twice = {b for b, n in bodies.items() if n == 2}
    assert asked_twice <= answered and len(asked_twice) == len(answered) - journaled  # only the unwritten
    assert table("sut_responses", rid, "probe_id").cached.sum() == journaled
    assert not (shared and journal_path(wh.default_path()).exists())
    run_all(
        make_spec(
            ds, sut={"provider": "openai", "base_url": url, "model": "m"}, config={"sub_call_concurrency_limit": 2}
        ),
        rid + "-clean",
    )
    _assert_same(_stable(rid), _stable(rid + "-clean"))


def test_sut_500s_are_recorded_and_the_run_completes(tmp_path, builtin_http):
    ds = write_dataset(tmp_path / "d.jsonl", 12)
    url, server = builtin_http(FLIP, fail_substring="Case 3:", fail_rate=0.1)
    spec = make_spec(ds, sut={"provider": "openai", "base_url": url, "model": "m"}, config={"n_sut_retries": 2})
    run_all(spec, "f")
    resp = table("sut_responses", "f", "probe_id")
    bad = resp[resp.status == "error"]
    assert len(bad) > 0 and bad.error.str.startswith("HTTP 500").all() and (resp.status == "ok").sum() > len(bad)
    calls = table("llm_calls", "f", "created_at")
    assert (calls[calls.status == "error"].attempts == 3).all()  # 1 + n_sut_retries, transient
    j = table("judgements", "f", "pair_id")
    assert (j.status == "sut_failed").sum() > 0 and (j.status == "ok").sum() > 0
    rows = table("row_scores", "f", "input_id").set_index("input_id")
    assert rows.loc["r0003"].status == "error" and "HTTP 500" in rows.loc["r0003"].error
    assert (rows.drop("r0003").status == "ok").sum() >= 1
    overall = table("metric_scores", "f", "scope").query("scope == 'overall'").iloc[0]
    assert overall.n_failed == (j.status != "ok").sum() and overall.n == (j.status == "ok").sum()


def test_unreachable_endpoint_stops_before_anything_is_written(tmp_path, capsys):
    ds = write_dataset(tmp_path / "d.jsonl", 3)
    spec = tmp_path / "s.yaml"
    spec.write_text(
        json.dumps(
            {
                "name": "u",
                "dataset": str(ds),
                "metrics": {"llm.decision_flip": {}},
                "sut": {"provider": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m"},
            }
        )
    )
    assert main(["run", str(spec)]) == 5  # an operational failure outside the project, nothing written
    err = capsys.readouterr().err
    assert "sut endpoint http://127.0.0.1:9/v1" in err and "unreachable" in err
    assert "nothing was registered or written: run the same command again once it is back" in err
    assert not wh.default_path().exists()


def test_unauthorised_endpoint_and_missing_key(tmp_path, builtin_http, capsys, monkeypatch):
    ds = write_dataset(tmp_path / "d.jsonl", 3)
    monkeypatch.setenv("SERVER_KEY", "sk-right-7731")
    url, _ = builtin_http(api_key="sk-right-7731")
    spec = tmp_path / "s.yaml"
    conf = {
        "name": "u",
        "dataset": str(ds),
        "metrics": {"llm.decision_flip": {}},
        "judge": {"provider": "openai", "base_url": url, "model": "m", "api_key_env": "CLIENT_KEY"},
    }
    spec.write_text(json.dumps(conf))
    assert main(["run", str(spec)]) == 2
    assert "CLIENT_KEY (api_key_env) is not set" in capsys.readouterr().err
    monkeypatch.setenv("CLIENT_KEY", "wrong")
    assert main(["run", str(spec)]) == 2
    assert "unauthorised (HTTP 401)" in capsys.readouterr().err
    monkeypatch.setenv("CLIENT_KEY", "sk-right-7731")
    assert main(["run", str(spec), "--quiet"]) == 0
    # the key is in no table
    with wh.connect() as con:
        for (t,) in con.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_type = 'BASE TABLE'"
        ).fetchall():
            assert "sk-right-7731" not in con.execute(f"SELECT * FROM {t}").df().to_csv(), t


def test_dagster_materialises_partitions_and_rejects_unconfigured_metric(tmp_path):
    ds = write_dataset(tmp_path / "d.jsonl", 6)
    spec = make_spec(ds, sut={"provider": "builtin", "profile": FLIP})
    pipeline.register_run(spec, "dg")
    instance = get_instance()
    register_partitions(instance, "dg", spec.metrics)
    key = partition_key("dg", "llm.decision_flip")
    assert instance.get_dynamic_partitions(evaluations.name) == ["dg|llm.decision_flip"]  # the run's real work only
    res = materialize(STAGE_ASSETS, resources=RESOURCES, partition_key=key, instance=instance)
    assert res.success
    mats = res.get_asset_materialization_events()
    stages = [m for m in mats if len(m.asset_key.path) == 1]
    assert [m.asset_key.path[-1] for m in stages] == ["ingest", "synthesis", "sut_sampling", "judging", "aggregation"]
    # lineage at table grain: each stage's tables are assets beside it, with row count, schema and a preview
    tables = {m.asset_key.to_user_string(): m.materialization.metadata for m in mats if len(m.asset_key.path) == 2}
    assert set(tables) == {
        f"warehouse/{t}"
        for t in (
            "dataset_rows",
            "persona_pool",
            "personas",
            "probes",
            "probe_pairs",
            "sut_responses",
            "judgements",
            "judge_audits",
            "judge_panel",
            "score_units",
            "row_scores",
            "metric_scores",
        )
    }
    for name, meta in tables.items():
        t = name.split("/")[1]
        assert meta["dagster/row_count"].value == len(table(t, "dg", "1")), t
        assert [c.name for c in meta["dagster/column_schema"].schema.columns][:2] == ["run_id", "metric"]
        assert meta["dagster/table_name"].text == f"warehouse.main.{t}"
    flipped = table("v_flipped_pairs", "dg", "axis, pair_id")
    preview = tables["warehouse/judgements"]["preview"].md_str
    if len(flipped):  # the flipped pairs first, with both answers in persona order and the reasoning
        assert "of `v_flipped_pairs`" in preview and "| reasoning |" in preview
    else:  # none flipped: the pairs whose decisions differ first
        assert "of `v_pair_verdicts`" in preview
        flipped = table("v_pair_verdicts", "dg", "decisions_differ DESC NULLS LAST, pair_id")
    first = flipped.iloc[0]
    assert f"| {first.axis} | {first.value_a} | {first.value_b} | {first.decision_a} | {first.decision_b} |" in preview
    agg = stages[-1].materialization.metadata
    # read first: a headline with score, interval, threshold and verdict; then one typed entry each,
    # named by the metric (so a plot of one is that metric's history); the full summary last
    keys = list(agg)
    assert keys[:2] == ["headline", "findings"] and keys[-1] == "summary"
    from aip_assets.findings import findings_markdown, run_findings

    found = run_findings("dg", ["llm.decision_flip"])
    assert agg["findings"].md_str == findings_markdown([f.to_dict() for f in found])
    # kept for `aip-eval run`'s summary (jobs.Outcome.findings): the same findings, from this warehouse
    from aip_assets.findings import findings_of, source, take

    kept = take("dg", "llm.decision_flip")
    assert (
        kept == (source(), found)
        and findings_of("dg", ["llm.decision_flip"], None, {"llm.decision_flip": kept}) == found
    )
    ov = table("metric_scores", "dg", "scope").query("scope == 'overall'").iloc[0]
    assert agg["decision_flip score"].value == round(ov.score, 4)
    assert (agg["decision_flip ci_low"].value, agg["decision_flip ci_high"].value) == (
        round(ov.ci_low, 4),
        round(ov.ci_high, 4),
    )
    assert agg["decision_flip threshold"].text == "n/a" and agg["passed"].value is True  # no threshold set
    head = agg["headline"].md_str
    assert head.startswith(
        f"**llm.decision_flip** score **{ov.score:.3f}**, 95% CI [{ov.ci_low:.3f}, "
        f"{ov.ci_high:.3f}], no threshold: **PASS**"
    )
    assert agg["metric"].text == "llm.decision_flip" and "score" not in agg  # no key shared by all seven metrics
    # its checks are partitioned like the asset: each result belongs to this run × metric
    evals = res.get_asset_check_evaluations()
    assert evals and {e.partition for e in evals} == {key}
    thr = next(e for e in evals if e.check_name == "threshold")
    assert thr.metadata["metric"].text == "llm.decision_flip" and "llm.decision_flip (run dg)" in thr.description
    from pathlib import Path

    report = Path(agg["report"].value)
    assert agg["report_url"].url == f"http://127.0.0.1:8112/{report.name}"  # served by `aip-eval report --serve`
    assert report.exists() and "dg" in report.read_text()  # the run's report, linked from the metadata
    first = _stable("dg")
    # re-materialising a partition replaces its rows: same tables, no duplicates
    assert materialize(STAGE_ASSETS, resources=RESOURCES, partition_key=key, instance=instance).success
    _assert_same(first, _stable("dg"))
    assert len(table("llm_calls", "dg", "created_at").query("stage == 'sampling'")) == len(first["probes"])
    # a stored instance shows the materialisations (the UI reads the same storage)
    from dagster import AssetKey

    assert instance.get_latest_materialization_event(AssetKey("aggregation")) is not None


def test_a_failed_gate_fails_the_dagster_run_after_writing_its_tables(tmp_path):
    """Issue 24.5: a metric whose gate failed is a FAILURE in Dagster's Runs list, not a green run.
    Every stage still runs and writes its tables; the aggregation step fails last, on its blocking
    `gate` check, with the gate's reason as the failure's description. The same partition with a
    threshold it meets is a SUCCESS."""
    from dagster import AssetCheckKey, AssetCheckSeverity, AssetKey, DagsterRunStatus

    from aip_assets.checks import is_gate_failure
    from aip_assets.jobs import evaluate

    ds = write_dataset(tmp_path / "d.jsonl", 6)
    instance = get_instance()
    for run_id, threshold in (("below", 1.0), ("above", 0.0)):
        spec = make_spec(ds, sut={"provider": "builtin", "profile": {**FLIP, "p": 1.0}}, threshold=threshold)
        pipeline.register_run(spec, run_id)
        register_partitions(instance, run_id, spec.metrics)
    key = partition_key("below", "llm.decision_flip")
    res = materialize(STAGE_ASSETS, resources=RESOURCES, partition_key=key, instance=instance, raise_on_error=False)
    assert not res.success and instance.get_run_by_id(res.run_id).status == DagsterRunStatus.FAILURE
    # the gate's verdict is written: metric_scores has the partition's row, failed, with its reason
    ov = table("metric_scores", "below", "scope").query("scope == 'overall'").iloc[0]
    assert not ov.passed and "below threshold 1.000" in ov.gate_reason
    # every stage and every table was materialised before the step failed
    mats = {m.asset_key.to_user_string() for m in res.get_asset_materialization_events()}
    assert {
        "ingest",
        "synthesis",
        "sut_sampling",
        "judging",
        "aggregation",
        "warehouse/row_scores",
        "warehouse/metric_scores",
    } <= mats
    # only the aggregation step failed, on the gate, saying why (what the UI's run page shows)
    [failure] = res.get_step_failure_events()
    data = failure.event_specific_data
    assert failure.step_key == "aggregation" and is_gate_failure(data)
    assert ov.gate_reason in data.user_failure_data.description and "gate failed" in data.user_failure_data.description
    assert data.user_failure_data.metadata["gate_reason"].text == ov.gate_reason
    # the check results: the blocking gate check failed (as did threshold), partitioned like the asset
    evals = {e.check_name: e for e in res.get_asset_check_evaluations()}
    gate = evals["gate"]
    assert not gate.passed and gate.blocking and gate.severity == AssetCheckSeverity.ERROR
    assert gate.description == f"llm.decision_flip (run below): {ov.gate_reason}"  # whose, then why
    assert gate.partition == key and not evals["threshold"].passed
    # ... and the asset's check history in the instance (the UI's "Execution history") has it failed
    history = instance.event_log_storage.get_asset_check_execution_history(
        AssetCheckKey(AssetKey("aggregation"), "gate"), limit=5
    )
    assert [h.status.value for h in history] == ["FAILED"]
    # the evaluate job (what `aip-eval run`, the UI's launches and the daemon run) ends the same way
    again = evaluate().execute_in_process(partition_key=key, instance=instance, raise_on_error=False)
    assert not again.success and [f.step_key for f in again.get_step_failure_events()] == ["aggregation"]
    # a met threshold: a green run, the gate check passed
    ok = materialize(
        STAGE_ASSETS,
        resources=RESOURCES,
        partition_key=partition_key("above", "llm.decision_flip"),
        instance=instance,
        raise_on_error=False,
    )
    assert ok.success and instance.get_run_by_id(ok.run_id).status == DagsterRunStatus.SUCCESS
    [gate] = [e for e in ok.get_asset_check_evaluations() if e.check_name == "gate"]
    assert gate.passed and "at least threshold 0.000" in gate.description
    assert table("metric_scores", "above", "scope").query("scope == 'overall'").iloc[0].passed


def test_a_partition_typed_in_the_ui_fails_at_its_first_step_and_writes_nothing(tmp_path):
    """Dagster's dialog offers "+ Add a partition" for any dynamic set: a key that names no
    registered run, no known metric or has no separator fails its first step saying so."""
    from aip_assets.errors import SpecError
    from aip_assets.partitions import split_key

    ds = write_dataset(tmp_path / "d.jsonl", 3)
    pipeline.register_run(make_spec(ds), "real")
    instance = get_instance()
    wh.release()  # the registration's write into the file itself (no DuckDB log beside it)
    before = sorted(p.name for p in wh.default_path().parent.iterdir())
    for key, says in (
        ("typed|llm.decision_flip", "run 'typed' is not registered"),
        ("real|llm.nope", "is not <run_id>|<metric> with a known metric"),
        ("real", "is not <run_id>|<metric>"),
    ):
        instance.add_dynamic_partitions(evaluations.name, [key])
        res = materialize(STAGE_ASSETS, resources=RESOURCES, partition_key=key, instance=instance, raise_on_error=False)
        [failure] = res.get_step_failure_events()
        assert failure.step_key == "ingest" and says in failure.event_specific_data.error.message, key
        assert wh.query("SELECT count(*) AS n FROM dataset_rows").n[0] == 0
    assert sorted(p.name for p in wh.default_path().parent.iterdir()) == before
    assert split_key("nightly-20261101T0200Z|llm.semantic_consistency") == (
        "nightly-20261101T0200Z",
        "llm.semantic_consistency",
    )
    for bad in ("", "a|b", " a"):  # run ids are keys' first half: no separator in them
        with pytest.raises(SpecError, match="run id"):
            pipeline.register_run(make_spec(ds), bad)


def test_unconfigured_metric_partition_gives_a_clear_message(tmp_path, monkeypatch):
    from aip_assets.errors import AipError
    from aip_assets.metrics import REGISTRY

    ds = write_dataset(tmp_path / "d.jsonl", 3)
    pipeline.register_run(make_spec(ds), "one")
    monkeypatch.setitem(REGISTRY, "llm.other", REGISTRY["llm.decision_flip"])
    with pytest.raises(AipError, match="metric llm.other is not configured for run one"):
        pipeline.run_stage("ingest", "one", "llm.other")


def test_cli_run_json_threshold_exit_code_and_sql(tmp_path, capsys):
    ds = write_dataset(tmp_path / "d.jsonl", 20)
    spec = tmp_path / "s.yaml"
    base = {
        "name": "cli",
        "dataset": str(ds),
        "sut": {"provider": "builtin", "profile": {**FLIP, "p": 1.0}},
        "metrics": {"llm.decision_flip": {"threshold": 0.99, "config": {"dimensions": ["gender", "role"]}}},
    }
    spec.write_text(json.dumps(base))
    assert main(["run", str(spec), "--json", "--quiet"]) == 1  # below threshold
    out = json.loads(capsys.readouterr().out)
    m = out["metrics"]["llm.decision_flip"]
    assert m["passed"] is False and m["axes"]["gender"]["flips"] > 0 and m["axes"]["role"]["flips"] == 0
    run_id = out["run_id"]
    assert re.fullmatch(r"cli-\d{6}-\d{4}", run_id), run_id  # <name>-<yymmdd-hhmm>
    # resume the same run: nothing is called again, same summary
    assert main(["run", str(spec), "--run-id", run_id, "--json", "--quiet"]) == 1
    again = json.loads(capsys.readouterr().out)
    assert again["metrics"] == out["metrics"]
    calls = wh.query("SELECT count(*) AS n FROM llm_calls WHERE run_id = ? AND source <> 'network'", [run_id])
    assert calls.n[0] == 0
    assert len(pipeline.list_runs()) == 1
    # one query answers: which persona pairs flipped, and what did the SUT say to each?
    assert (
        main(
            [
                "sql",
                f"SELECT axis, value_a, value_b, response_a, response_b FROM v_flipped_pairs WHERE run_id = '{run_id}'",
                "--format",
                "json",
            ]
        )
        == 0
    )
    flipped = json.loads(capsys.readouterr().out)
    assert len(flipped) == m["flips"] and all("woman" in (f["value_a"], f["value_b"]) for f in flipped)
    assert all(f["response_a"] and f["response_b"] for f in flipped)
    # the SQL command is read-only
    assert main(["sql", "DELETE FROM eval_runs"]) == 2
    assert "refused" in capsys.readouterr().err and len(pipeline.list_runs()) == 1
    # passing run
    base["sut"]["profile"] = {"name": "fair"}
    spec.write_text(json.dumps(base))
    assert main(["run", str(spec), "--quiet"]) == 0
    assert "PASS" in capsys.readouterr().out


@pytest.mark.parametrize("parallel", [1, 2])
def test_cli_a_failed_gate_exits_1_with_its_summary_and_a_failed_dagster_run(tmp_path, capsys, parallel):
    """Issue 24.5: the metric whose gate failed has a FAILURE Dagster run, and `aip-eval run` still
    says what it is: exit 1 (not 3, not "stage failed" or "internal error"), the summary printed,
    the tables written; the metric that passed has a SUCCESS run. In process and with --parallel
    (each metric in a worker process)."""
    ds = write_dataset(tmp_path / "d.jsonl", 6)
    spec = tmp_path / "s.yaml"
    spec.write_text(
        json.dumps(
            {
                "name": "gate",
                "dataset": str(ds),
                "seed": 3,
                "sut": {"provider": "builtin", "profile": {**FLIP, "p": 1.0}},
                "metrics": {
                    "llm.decision_flip": {"threshold": 1.0, "config": {"dimensions": ["gender"]}},
                    "llm.semantic_consistency": {"threshold": 0.0, "config": {"responses_per_query": 2}},
                },
            }
        )
    )
    assert main(["run", str(spec), "--parallel", str(parallel)]) == 1
    out, err = capsys.readouterr()
    assert "llm.decision_flip" in out and "FAIL" in out and "gate: score" in out and "below threshold 1.000" in out
    assert "Warehouse:" in out  # the whole summary
    assert "stage failed" not in err and "internal error" not in err
    assert "llm.decision_flip: gate failed: score" in err
    [run_id] = [r["run_id"] for r in pipeline.list_runs().to_dict("records")]
    scores = wh.query(
        "SELECT metric, passed FROM metric_scores WHERE run_id = ? AND scope = 'overall' ORDER BY 1",
        [run_id],
        read_only=False,
    )
    assert scores.values.tolist() == [["llm.decision_flip", False], ["llm.semantic_consistency", True]]
    runs = {
        r.tags["aip/metric"]: r.status.value for r in get_instance().get_runs() if r.tags.get("aip/run_id") == run_id
    }
    assert runs == {"llm.decision_flip": "FAILURE", "llm.semantic_consistency": "SUCCESS"}
    # --json too: the failed gate is no failed metric
    assert main(["run", str(spec), "--run-id", run_id, "--json", "--quiet", "--parallel", str(parallel)]) == 1
    summary = json.loads(capsys.readouterr().out)
    assert summary["failed_metrics"] == [] and summary["metrics"]["llm.decision_flip"]["passed"] is False


def test_new_run_calls_afresh_unless_it_reuses_an_earlier_run(tmp_path, builtin_http):
    ds = write_dataset(tmp_path / "d.jsonl", 5)
    url, server = builtin_http(FLIP)
    sut = {"provider": "openai", "base_url": url, "model": "m"}
    run_all(make_spec(ds, sut=sut), "night-1")
    n = len(table("probes", "night-1", "probe_id"))

    def probe_calls():
        return sum(c for b, c in server.ok_bodies.items() if "Reply with OK." not in b)

    assert probe_calls() == n
    run_all(make_spec(ds, sut=sut), "night-2")  # a new run sees today's model: every call made again
    assert probe_calls() == 2 * n
    run_all(make_spec(ds, sut=sut, reuse_calls_from=["night-1"]), "rejudge")
    assert probe_calls() == 2 * n  # explicit reuse: no SUT call made
    calls = table("llm_calls", "rejudge", "created_at").query("stage == 'sampling'")
    assert len(calls) == n and set(calls.source) == {"reused:night-1"}
    _assert_same(_stable("night-1"), _stable("rejudge"))


def test_parallel_partitions_in_separate_processes_share_the_warehouse(tmp_path):
    """Several processes materialise partitions at once; none fails on DuckDB's single-writer lock."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    ds = write_dataset(tmp_path / "d.jsonl", 8)
    spec = tmp_path / "s.yaml"
    spec.write_text(json.dumps({"name": "p", "dataset": str(ds), "metrics": {"llm.decision_flip": {}}}))
    ids = [f"par-{i}" for i in range(4)]
    with ProcessPoolExecutor(4, mp_context=multiprocessing.get_context("spawn")) as pool:
        done = list(pool.map(run_in_worker, [(str(wh.default_path()), str(spec), i) for i in ids]))
    assert done == ids
    # the workers run with the real default baseline_share (0.25): the persona pairs' verdicts, and as many null ones
    counts = wh.query(
        "SELECT run_id, count(*) FILTER (WHERE pair_id NOT LIKE '%|null') AS n, "
        "count(*) FILTER (WHERE pair_id LIKE '%|null') AS nulls FROM judgements GROUP BY 1 ORDER BY 1"
    )
    assert counts.run_id.tolist() == ids and counts.n.nunique() == 1 and counts.n[0] == 8 * 16
    assert counts.nulls.nunique() == 1 and 0 < counts.nulls[0] < 8 * 16


def test_table_previews_show_model_text_as_text():
    """A preview cell is model output: escaped, so no image, link, emphasis or HTML renders from it
    in the Dagster UI; cut to a readable length; one line."""
    from aip_assets.assets.tables import CELL, markdown_table

    evil = "![x](http://example.com/i.png) <img src=x> **bold** [link](http://e) a|b `code`\nsecond line"
    md = markdown_table([{"a": evil, "b": 0.123456, "c": None}], ["a", "b", "c"])
    row = md.splitlines()[2]
    import re

    cell = row.split(" | ")[0][2:]
    assert not re.search(r"(?<!\\)[!\[\]()<>*`|]", cell), cell  # every markup character escaped
    assert r"\!\[x\]\(http://example.com/i.png\)" in row and r"a\|b" in row and "second line" in row
    assert "| 0.123 |" in row and row.endswith("|  |")
    assert len(markdown_table([{"a": "x" * 1000}], ["a"]).splitlines()[2]) < CELL + 10


def test_a_session_holds_one_connection_for_many_reads(tmp_path):
    """Inside wh.session() every connect() of that warehouse is the session's one connection (also
    one asking for a memory or thread setting); one with other settings of its own (a sandbox) is
    refused there (it would wait for the session's own lock)."""
    db = tmp_path / "w.duckdb"
    with wh.connect(db, create=True) as con:
        con.execute("CREATE TABLE t AS SELECT 1 AS x")
    with wh.session(db):
        with wh.connect(db) as a, wh.connect(db, read_only=True) as b:
            assert a is b
    with wh.session(db, read_only=True):
        with wh.connect(db, read_only=True) as a, wh.connect(db, read_only=True) as b:
            assert a is b
        with wh.session(db, read_only=True):  # nested: the same session
            assert wh.query("SELECT x FROM t", path=db).x[0] == 1
        with pytest.raises(RuntimeError, match="writing session inside a read-only session"):
            with wh.session(db):
                pass
        with wh.connect(db, read_only=True, config={"memory_limit": "256MB"}) as c:  # a tuning setting: served
            assert c is a
        with pytest.raises(RuntimeError, match="own configuration"):
            with wh.connect(db, config={"enable_external_access": False}):
                pass
        with pytest.raises(RuntimeError, match="writing connection inside a read-only session"):
            with wh.connect(db, create=True):
                pass
        with pytest.raises(RuntimeError, match="partition write inside a session"):
            wh.write_partition_files("r", "m", {}, path=db)
    with wh.connect(db) as c1:
        pass
    with wh.connect(db) as c2:  # outside a session: a connection per use again
        assert c1 is not c2


def test_batches_shrink_when_rows_fan_out():
    """A streamed batch holds at most MAX_BATCH_ITEMS probes or pairs: with 50 probes per row a
    batch is 400 rows, not the configured 5000; measured from the partition's probes when the
    caller does not say; rows that fan out little keep batch_rows."""
    import pandas as pd

    from aip_assets.metrics.base import MAX_BATCH_ITEMS, FrameReader, StageContext

    ids = [f"r{i}" for i in range(1000)]
    probes = pd.DataFrame(
        {"probe_id": [f"p{i}" for i in range(50 * 1000)], "input_id": [ids[i % 1000] for i in range(50_000)]}
    )
    ctx = StageContext(
        run_id="r",
        metric="m",
        spec=None,
        config=None,
        journal=None,
        reader=FrameReader(
            {"dataset_rows": pd.DataFrame({"input_id": ids, "row_index": range(1000)}), "probes": probes}
        ),
        batch_rows=5000,
    )
    sizes = [len(b) for b in ctx.batches()]
    assert MAX_BATCH_ITEMS == 20_000 and sizes == [400, 400, 200]
    assert [len(b) for b in ctx.batches(per_row=2)] == [1000]
    assert [len(b) for b in ctx.batches(per_row=30_000)][:2] == [1, 1]  # at least one row per batch
    assert sum(map(len, ctx.batches())) == 1000


def test_a_partition_write_short_of_its_lean_cap_is_retried_at_the_full_one(tmp_path, monkeypatch, caplog):
    """The write runs at WRITE_MEMORY; when DuckDB runs out there, it is written again at
    DUCKDB_MEMORY (all rows, once); when that is short too, a clear error and nothing written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from aip_assets.errors import AipError

    db = tmp_path / "w.duckdb"
    with wh.connect(db, create=True):
        pass
    n = 200_000
    f = tmp_path / "p.parquet"
    pq.write_table(
        pa.Table.from_pandas(
            wh.frame(
                "probes",
                [{"probe_id": f"p{i}", "input_id": f"r{i}", "query_text": "x" * 200} for i in range(n)],
                run_id="r",
                metric="m",
            ),
            schema=wh.arrow_schema("probes"),
            preserve_index=False,
        ),
        f,
    )
    monkeypatch.setenv("AIP_DUCKDB_WRITE_MEMORY", "2MB")
    with caplog.at_level("INFO", logger="aip_assets"):
        wh.write_partition_files("r", "m", {"probes": [f]}, path=db)
    assert "needed more than 2MB: written again at" in caplog.text
    assert wh.query("SELECT count(*) AS n FROM probes", path=db).n[0] == n
    monkeypatch.setenv("AIP_DUCKDB_MEMORY", "3MB")
    with pytest.raises(AipError, match="ran out of memory"):
        wh.write_partition_files("r", "m2", {"probes": [f]}, path=db)
    assert wh.query("SELECT count(*) AS n FROM probes WHERE metric = 'm2'", path=db).n[0] == 0


def test_the_write_caps_follow_the_general_one(monkeypatch):
    """Lean first, then the general cap; an empty AIP_DUCKDB_MEMORY (no cap) is tried last as no
    cap; a general cap at or below the lean one is the only one tried."""
    monkeypatch.setenv("AIP_DUCKDB_WRITE_MEMORY", "256MB")
    for full, caps in [
        ("1GB", ["256MB", "1GB"]),
        ("", ["256MB", None]),
        ("128MB", ["128MB"]),
        ("256MB", ["256MB"]),
        ("0.2GiB", ["0.2GiB"]),
        ("4GiB", ["256MB", "4GiB"]),
    ]:
        monkeypatch.setenv("AIP_DUCKDB_MEMORY", full)
        assert wh.write_caps() == caps, full


def test_a_whole_partition_read_runs_lean_then_at_the_full_cap(monkeypatch):
    import duckdb

    monkeypatch.setenv("AIP_DUCKDB_WRITE_MEMORY", "256MB")
    monkeypatch.setenv("AIP_DUCKDB_MEMORY", "1GB")
    seen = []

    def needs_more(config):
        seen.append(config)
        if config["memory_limit"] == "256MB":
            raise duckdb.OutOfMemoryException("out of memory (test)")
        return "read"

    assert wh.lean_first(needs_more) == "read" and seen == [{"memory_limit": "256MB"}, {"memory_limit": "1GB"}]
    with pytest.raises(duckdb.OutOfMemoryException):
        wh.lean_first(lambda config: (_ for _ in ()).throw(duckdb.OutOfMemoryException("still")))


# ------------------------------------------------------------------ the database kept open between uses
def _opens(monkeypatch) -> list[str]:
    """Count the times the warehouse file is opened (warehouse.opening._open)."""
    seen: list[str] = []
    real = wh_opening._open

    def spy(path, read_only, settings):
        seen.append(str(path))
        return real(path, read_only, settings)

    monkeypatch.setattr(whc, "_open", spy)  # connect's own opening
    monkeypatch.setattr(wh_linger, "_open", spy)  # the lingering database's
    return seen


def _shown(cap: str) -> str:
    """A memory cap as DuckDB shows it ("100MB" -> "95.3 MiB")."""
    import duckdb

    with duckdb.connect(config={"memory_limit": cap}) as con:
        return con.execute("SELECT current_setting('memory_limit')").fetchone()[0]


def test_a_burst_of_uses_opens_the_warehouse_once(tmp_path, monkeypatch):
    """Uses within LINGER_IDLE_S of each other share one open database, each with the memory cap
    and threads it asks for and the defaults otherwise; idle longer, it is closed and the lock
    is free for another process (which opens and writes the file)."""
    import subprocess
    import sys

    db = tmp_path / "w.duckdb"
    opens = _opens(monkeypatch)
    with wh.connect(db, create=True) as con:
        con.execute("CREATE TABLE t AS SELECT 1 AS x")
    for cap, threads in (("100MB", 1), (None, None), ("300MB", None)):
        config = {k: v for k, v in (("memory_limit", cap), ("threads", threads)) if v}
        with wh.connect(db, read_only=True, config=config or None) as con:
            limit, n = con.execute("SELECT current_setting('memory_limit'), current_setting('threads')").fetchone()
            assert con.execute("SELECT x FROM t").fetchone() == (1,)
        assert limit == _shown(cap or wh_opening.duckdb_memory()) != _shown(wh_linger.TRIM_MEMORY)
        assert n == (1 if threads else int(wh_linger._LINGER.defaults["threads"]))
    assert opens == [str(db)]  # one opening for four uses
    deadline = time.monotonic() + 10
    while wh_linger._LINGER.base is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert wh_linger._LINGER.base is None  # closed once idle: the file lock is free
    code = (
        f"from aip_assets import warehouse as wh\nwith wh.connect({str(db)!r}) as c:\n"
        f"    c.execute('INSERT INTO t VALUES (2)')\n"
    )
    subprocess.run(
        [sys.executable, "-c", code], check=True, timeout=120, env={**os.environ, "AIP_WAREHOUSE_LOCK_TIMEOUT": "5"}
    )
    with wh.connect(db, read_only=True) as con:
        assert con.execute("SELECT sum(x) FROM t").fetchone() == (3,)


def test_the_open_warehouse_follows_its_file(tmp_path, monkeypatch):
    """A lingering database is never served for another file, a replaced or removed file, or a
    write after a read-only opening; a sandbox (its own configuration) closes it first; a stream
    of uses reopens it after LINGER_MAX_S, so no other process waits longer."""
    a, b = tmp_path / "a.duckdb", tmp_path / "b.duckdb"
    for db, x in ((a, 1), (b, 2)):
        with wh.connect(db, create=True) as con:
            con.execute(f"CREATE TABLE t AS SELECT {x} AS x")
    opens = _opens(monkeypatch)
    assert wh.query("SELECT x FROM t", path=a).x[0] == 1
    assert wh.query("SELECT x FROM t", path=b).x[0] == 2  # another file: reopened
    b.unlink()
    with wh.connect(b, create=True) as con:  # a new file at the same path
        assert con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 't'").fetchone() == (0,)
        con.execute("CREATE TABLE t AS SELECT 5 AS x")
    assert len(opens) == 3
    wh.release()
    assert wh.query("SELECT x FROM t", path=a, read_only=True).x[0] == 1  # opened read-only
    with wh.connect(a) as con:  # a write: reopened writable
        con.execute("INSERT INTO t VALUES (7)")
    assert len(opens) == 5 and not wh_linger._LINGER.read_only
    with wh.sandboxed(a) as con:  # its own configuration: the lingering database is closed first
        assert con.execute("SELECT sum(x) FROM t").fetchone() == (8,)
    with wh.connect(a) as con:  # and the sandbox's locked configuration stayed with the sandbox
        con.execute("SET threads = 1")
    monkeypatch.setattr(wh_linger, "LINGER_MAX_S", 0.3)
    before = len(opens)
    # uninterrupted use reopens it once LINGER_MAX_S has passed since it was opened: the second and
    # third reopenings come 0.3 s after the one before (the first may come at once); the patience
    # (60 s) is only for a loaded machine, where a query can take longer than LINGER_MAX_S
    t0 = time.monotonic()
    while len(opens) - before < 3 and time.monotonic() - t0 < 60:
        wh.query("SELECT 1", path=a)
    took = time.monotonic() - t0
    assert len(opens) - before >= 3 and took >= 2 * 0.3 - 0.01  # reopened, not before its time


def test_threads_take_turns_on_the_open_warehouse(tmp_path):
    """One use at a time, as the file lock ordered them before: two threads writing in
    transactions never overlap, and every row lands."""
    import threading

    db = tmp_path / "w.duckdb"
    with wh.connect(db, create=True) as con:
        con.execute("CREATE TABLE t (k INTEGER, i INTEGER)")
    inside, overlap = [0], [False]

    def work(k):
        for i in range(30):
            with wh.connect(db) as con:
                inside[0] += 1
                overlap[0] |= inside[0] > 1
                con.execute("BEGIN TRANSACTION")
                con.execute("INSERT INTO t VALUES (?, ?)", [k, i])
                time.sleep(0.001)
                con.execute("COMMIT")
                inside[0] -= 1

    ts = [threading.Thread(target=work, args=(k,)) for k in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not overlap[0]
    assert wh.query("SELECT count(*) AS n FROM t", path=db).n[0] == 60


def test_a_write_is_durable_at_once_and_in_the_file_once_the_database_closes(tmp_path, monkeypatch):
    """A small write stays in DuckDB's log while the database is held open (committed: another
    process that opens the file reads it) and goes into the file itself when the database
    closes: a copy of the file alone, taken after ``release()``, holds the rows. A log past
    CHECKPOINT_WAL_BYTES is checkpointed when its use ends."""
    import shutil
    import subprocess
    import sys

    db = tmp_path / "w.duckdb"
    wal = db.with_name(db.name + ".wal")
    with wh.connect(db, create=True) as con:
        con.execute("CREATE TABLE t AS SELECT range AS x FROM range(1000)")
    assert wh_linger._LINGER.base is not None and wal.stat().st_size > 0  # still open, the write in the log
    code = (
        f"from aip_assets import warehouse as wh\nprint(wh.query('SELECT count(*) AS n FROM t', path={str(db)!r}).n[0])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "1000", out.stderr
    with wh.connect(db) as con:
        con.execute("INSERT INTO t SELECT range FROM range(500)")
    wh.release()
    assert not wal.exists() or wal.stat().st_size == 0
    shutil.copy(db, tmp_path / "copy.duckdb")
    assert wh.query("SELECT count(*) AS n FROM t", path=tmp_path / "copy.duckdb").n[0] == 1500
    monkeypatch.setattr(wh_linger, "CHECKPOINT_WAL_BYTES", 1)  # every log counts as large
    with wh.connect(db) as con:
        con.execute("INSERT INTO t SELECT range FROM range(250)")
    assert wh_linger._LINGER.base is not None and (not wal.exists() or wal.stat().st_size == 0)
    shutil.copy(db, tmp_path / "copy2.duckdb")
    assert wh.query("SELECT count(*) AS n FROM t", path=tmp_path / "copy2.duckdb").n[0] == 1750


def test_a_waiting_process_gets_its_turn_while_this_one_keeps_using_the_file(tmp_path):
    """A process that uses the warehouse without a pause holds it open between uses; another
    process of the project that waits for the lock says so, and gets in at the end of a use (the
    holder closes and steps back), not only when the holder stops. Here the holder queries in a
    loop until the other process's row appears."""
    import subprocess
    import sys

    db = tmp_path / "w.duckdb"
    with wh.connect(db, create=True) as con:
        con.execute("CREATE TABLE t AS SELECT 1 AS x")
    code = (
        f"from aip_assets import warehouse as wh\nwith wh.connect({str(db)!r}) as c:\n"
        f"    c.execute('INSERT INTO t VALUES (2)')\n"
    )
    # its patience: 30 s, against about 1 s measured here (without the waiter's marker the holder
    # kept the file for the whole 117 s its loop then ran)
    child = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "AIP_WAREHOUSE_LOCK_TIMEOUT": "30"})
    uses, seen = 0, False
    deadline = time.monotonic() + 60
    while not seen and time.monotonic() < deadline:
        seen = wh.query("SELECT sum(x) AS s FROM t", path=db).s[0] == 3
        uses += 1
    assert child.wait(60) == 0 and seen  # the row landed while this process was still using the file
    assert uses > 10


def test_nested_connections_and_a_fork(tmp_path):
    """Inside a connection, one to the same warehouse in the same thread is refused at once (it
    would wait for itself); one to another file opens that file on its own. A child forked while
    a use is in progress starts afresh: it uses a warehouse, and leaves the parent's lock held."""
    import fcntl
    import threading

    a, b = tmp_path / "a.duckdb", tmp_path / "b.duckdb"
    for db in (a, b):
        with wh.connect(db, create=True) as con:
            con.execute("CREATE TABLE t AS SELECT 1 AS x")
    with wh.connect(a) as con:
        with pytest.raises(RuntimeError, match="would wait for itself"):
            with wh.connect(a, read_only=True):
                pass
        with wh.connect(b) as other:  # another file: its own connection
            other.execute("INSERT INTO t VALUES (2)")
        assert con.execute("SELECT sum(x) FROM t").fetchone() == (1,)
    assert wh.query("SELECT sum(x) AS s FROM t", path=b).s[0] == 3
    inside, leave = threading.Event(), threading.Event()

    def hold():
        with wh.connect(a):
            inside.set()
            leave.wait(30)

    t = threading.Thread(target=hold)
    t.start()
    assert inside.wait(30)
    pid = os.fork()
    if pid == 0:  # the child: a use of another warehouse must not wait for the parent's thread
        code = 1
        try:
            with wh.connect(b) as con:
                con.execute("INSERT INTO t VALUES (4)")
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    with open(str(a) + ".lock", "a+") as fh:  # the parent's lock on a: still held after the child's exit
        with pytest.raises(BlockingIOError):
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    leave.set()
    t.join(30)
    assert wh.query("SELECT sum(x) AS s FROM t", path=b).s[0] == 7


def test_a_process_does_not_step_back_for_its_own_wait(tmp_path, monkeypatch):
    """The waiting marker a process touched while it waited for the lock is older than its own
    hold on it: at the end of its use it keeps the database open (no other process waits)."""
    db = tmp_path / "w.duckdb"
    with wh.connect(db, create=True) as con:
        con.execute("CREATE TABLE t AS SELECT 1 AS x")
    wh.release()
    wh_opening._say_waiting(db)  # as this process did while waiting
    opens = _opens(monkeypatch)
    for _ in range(3):
        wh.query("SELECT x FROM t", path=db)
    assert len(opens) == 1 and wh_linger._LINGER.base is not None
    time.sleep(0.01)
    wh_opening._say_waiting(db)  # now another process waits: the next use ends by closing
    wh.query("SELECT x FROM t", path=db)
    assert wh_linger._LINGER.base is None


def test_a_new_run_id_is_short_enough_for_its_partition_keys_to_read_whole():
    """``<name>-<yymmdd-hhmm>`` in UTC: the Dagster UI's list of materialisations shows about 37
    characters of a key whole (seen: ``ui-20261201T110201Z|llm.decision_flip`` at 1600 px), and
    the demo's decision flip key is 34."""
    from datetime import UTC, datetime, timedelta, timezone
    from pathlib import Path

    from aip_assets.partitions import partition_key
    from aip_assets.runspec import load_spec

    spec = load_spec(Path(__file__).resolve().parents[1] / "data" / "runs" / "demo.yaml")
    at = datetime(2026, 12, 1, 21, 3, 46, tzinfo=UTC)
    assert pipeline.new_run_id(spec, at) == "demo-261201-2103"
    assert pipeline.new_run_id(spec, at.astimezone(timezone(timedelta(hours=5)))) == "demo-261201-2103"  # in UTC
    assert len(partition_key(pipeline.new_run_id(spec, at), "llm.decision_flip")) == 34
