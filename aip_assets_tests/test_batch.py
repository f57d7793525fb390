"""A connection's calls through the provider's Batch API (issue 15), against the builtin server's
Batch API over HTTP (models/builtin_batch.py)."""

from __future__ import annotations

import json

import pytest

from aip_assets import pipeline
from aip_assets.models.batch import BatchRunner

from .conftest import make_spec, run_all, table, write_dataset
from .test_pipeline import FLIP, _assert_same, _stable


# one streamed chunk of rows per stage: its calls are one batch (chunks go one after another,
# each its own batch; make_spec's default of 4 rows a chunk would make several)
ROWS = 100


def sut(url: str, **batch) -> dict:
    return {"provider": "openai", "base_url": url, "model": "m",
            "batch": {"enabled": True, "poll_seconds": 0.05, **batch}} if batch.get("enabled", True) else \
        {"provider": "openai", "base_url": url, "model": "m"}


def sources(run_id: str) -> dict[str, int]:
    calls = table("llm_calls", run_id, "created_at")
    calls = calls[calls.role == "sut"]
    return calls.groupby("source").size().to_dict()


def test_a_batch_run_gives_exactly_the_scores_of_a_live_run(tmp_path, builtin_http):
    """The SUT's calls as one batch: every stable table (probes, answers, verdicts, scores) equals
    the live run's on the same seed; the endpoint got one file, one batch holding every SUT call
    and no live SUT call; each call is journaled with source `batch`."""
    ds = write_dataset(tmp_path / "d.jsonl", 8)
    url, server = builtin_http(FLIP, batch_seconds=0.3)
    run_all(make_spec(ds, sut=sut(url, enabled=False), batch_rows=ROWS), "live")
    live_requests = server.stats["requests"]
    run_all(make_spec(ds, sut=sut(url), batch_rows=ROWS), "batched")
    _assert_same(_stable("live"), _stable("batched"))
    n_sut = len(table("sut_responses", "batched", "probe_id"))
    assert server.batch.stats["batches"] == 1 and server.batch.stats["batch_requests"] == n_sut > 0
    assert server.stats["requests"] == live_requests + 1  # the endpoint check only
    assert sources("batched") == {"batch": n_sut} and sources("live") == {"network": n_sut}
    notes = table("run_notes", "batched", "code")
    assert (f"sut calls through the Batch API: 1 batch(es) sent ({n_sut} requests), 0 resumed; {n_sut} answered, "
            "0 sent live") in " ".join(notes[notes.code == "batch"].message)


def test_a_stop_while_polling_resumes_the_same_batch(tmp_path, builtin_http, monkeypatch):
    """The sampling stage stops (a crash) while its batch is polled: the batch was journaled
    before the first poll, so the resumed stage polls that batch again instead of sending a second
    one, and the run ends with the live run's results."""
    ds = write_dataset(tmp_path / "d.jsonl", 6)
    url, server = builtin_http(FLIP, batch_seconds=0.5)
    run_all(make_spec(ds, sut=sut(url, enabled=False), batch_rows=ROWS), "live")
    spec = make_spec(ds, sut=sut(url), batch_rows=ROWS)
    run_all(spec, "b", stages=["ingest", "synthesis"])
    real_finish = BatchRunner._finish

    async def stop_while_polling(self, batch_id):
        raise RuntimeError(f"stopped while polling {batch_id}")

    monkeypatch.setattr(BatchRunner, "_finish", stop_while_polling)
    with pytest.raises(RuntimeError, match="stopped while polling"):
        pipeline.run_stage("sampling", "b", "llm.decision_flip")
    assert server.batch.stats["batches"] == 1
    monkeypatch.setattr(BatchRunner, "_finish", real_finish)
    run_all(spec, "b", stages=["sampling", "judging", "aggregation"])
    assert server.batch.stats["batches"] == 1  # no second batch: the first one was polled again
    _assert_same(_stable("live"), _stable("b"))


@pytest.mark.parametrize("on_failure", ["live", "fail"])
def test_expired_and_failed_requests_go_live_or_fail_as_configured(tmp_path, builtin_http, on_failure):
    """The first batch expires whole (the window missed) and a quarter of the bodies fail at the
    endpoint: with `on_failure: live` each of them is sent again as a live call (the expired ones
    answered, the failing bodies failing again, as live), so the results equal a live run's; with
    `fail` each is recorded as failed with the batch's reason and nothing is sent live."""
    ds = write_dataset(tmp_path / "d.jsonl", 6)
    url, server = builtin_http(FLIP, batch_seconds=0.2, batch_expire_first=1, fail_rate=0.25)
    run_all(make_spec(ds, sut=sut(url, enabled=False), batch_rows=ROWS), "live")
    assert 0 < (table("sut_responses", "live", "probe_id").status == "error").sum()  # the bodies that fail
    before = server.stats["requests"]
    run_all(make_spec(ds, sut=sut(url, on_failure=on_failure), batch_rows=ROWS), "b")
    answers = table("sut_responses", "b", "probe_id")
    n = len(answers)
    assert server.batch.stats["batches"] == 1 and server.batch.stats["batch_requests"] == n
    if on_failure == "live":
        _assert_same(_stable("live"), _stable("b"))
        assert server.stats["requests"] - before > n  # every SUT call again, live (the failing ones retried)
        assert sources("b") == {"network": n}
    else:
        assert (answers.status == "error").all()
        errors = table("llm_calls", "b", "created_at")
        errors = errors[errors.role == "sut"]
        assert errors.error.str.startswith("batch: batch_expired: This request could not be executed").all()
        assert server.stats["requests"] - before == 1 and sources("b") == {"batch": n}


def test_a_batch_answers_from_the_cache_first_and_sends_only_the_rest(tmp_path, builtin_http):
    """Requests the journal already answers are not sent: a run that reuses an earlier live run's
    calls (reuse_calls_from) sends a batch only for calls it has not made."""
    ds = write_dataset(tmp_path / "d.jsonl", 6)
    url, server = builtin_http(FLIP, batch_seconds=0.2)
    run_all(make_spec(write_dataset(tmp_path / "half.jsonl", 3), sut=sut(url, enabled=False)), "first")
    first = len(table("sut_responses", "first", "probe_id"))
    run_all(make_spec(ds, sut=sut(url), reuse_calls_from=["first"], batch_rows=ROWS), "second")
    total = len(table("sut_responses", "second", "probe_id"))
    assert 0 < first < total
    assert server.batch.stats["batch_requests"] == total - first
    assert json.loads(json.dumps(sources("second"))) == {"batch": total - first, "reused:first": first}


def test_requests_the_batch_failed_are_recorded_with_the_endpoints_reason(tmp_path, builtin_http):
    """No expiry, a quarter of the bodies failing at the endpoint, `on_failure: fail`: those are
    errors with the batch's HTTP status and body as the reason, the others answered, none sent
    live; the answered ones equal the live run's."""
    ds = write_dataset(tmp_path / "d.jsonl", 6)
    url, server = builtin_http(FLIP, batch_seconds=0.2, fail_rate=0.25)
    run_all(make_spec(ds, sut=sut(url, enabled=False), batch_rows=ROWS), "live")
    before = server.stats["requests"]
    run_all(make_spec(ds, sut=sut(url, on_failure="fail"), batch_rows=ROWS), "b")
    assert server.stats["requests"] - before == 1  # the endpoint check only
    live, b = (table("sut_responses", r, "probe_id").set_index("probe_id") for r in ("live", "b"))
    failed = b[b.status == "error"]
    assert set(failed.index) == set(live[live.status == "error"].index) and len(failed) > 0
    assert failed.error.str.startswith('batch: HTTP 500: {"error": {"message": "injected failure"').all()
    ok = b.status == "ok"
    assert ok.sum() > 0 and (b[ok].response == live.loc[b[ok].index].response).all()


def test_dry_run_shows_batch_and_live_calls_and_what_they_cost(tmp_path, capsys):
    """--dry-run says which role's calls go through the Batch API and, with prices configured,
    the cost live and as configured (the batch discount off the live price); a role without
    prices shows no cost. Nothing is called (the endpoint does not exist)."""
    import yaml

    from aip_assets.cli import main

    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "b", "dataset": str(write_dataset(tmp_path / "d.jsonl", 5)),
        "sut": {"provider": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "x", "batch": {"enabled": True},
                "prices": {"input_per_million_tokens": 2.5, "output_per_million_tokens": 10.0}},
        "judge": {"provider": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "y",
                  "prices": {"input_per_million_tokens": 0.2, "output_per_million_tokens": 0.8, "batch_discount": 0.4}},
        "metrics": {"llm.decision_flip": {}}}))
    assert main(["run", str(spec), "--dry-run", "--json"]) == 0
    est = json.loads(capsys.readouterr().out)
    t, sent = est["total"], est["sent"]
    sut_live = (t["sut_prompt_tokens"] * 2.5 + t["sut_completion_tokens"] * 10.0) / 1e6
    judge_live = (t["judge_prompt_tokens"] * 0.2 + t["judge_completion_tokens"] * 0.8) / 1e6
    assert sent["sut"] == {"calls": t["sut_calls"], "batch": True, "live_cost": round(sut_live, 4),
                           "batch_cost": round(sut_live * 0.5, 4), "cost": round(sut_live * 0.5, 4)}
    assert sent["judge"] == {"calls": t["judge_calls"], "batch": False, "live_cost": round(judge_live, 4),
                             "batch_cost": round(judge_live * 0.6, 4), "cost": round(judge_live, 4)}
    assert main(["run", str(spec), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"sut: {t['sut_calls']:,} calls Batch API (batches of up to 50,000, polled every 30s); about " \
           f"{sut_live * 0.5:,.2f} (live: {sut_live:,.2f}" in out
    assert f"judge: {t['judge_calls']:,} calls live; about {judge_live:,.2f} (with batch.enabled: {judge_live * 0.6:,.2f})" in out


def test_a_batch_is_journaled_in_postgres_in_shared_mode(tmp_path, lake):
    """With a lake the journal (and its batches) is in Postgres: a batch saved by one worker is
    found pending by another, and is no longer once ended."""
    from aip_assets.models.journal import PgJournal, open_journal

    writer, reader = open_journal(tmp_path / "w.duckdb"), open_journal(tmp_path / "other.duckdb")
    try:
        assert isinstance(writer, PgJournal) and isinstance(reader, PgJournal)
        rec = {"batch_id": "batch_1", "run_id": "r", "metric": "m", "stage": "sampling", "role": "sut",
               "endpoint": "http://x/v1", "input_file_id": "file-1", "call_keys": json.dumps(["k1", "k2"]),
               "status": "pending", "created_at": 1.0, "ended_at": None}
        writer.save_batch(rec)
        assert reader.open_batches("r", "m", "sampling", "sut", "http://x/v1") == [rec]
        assert reader.open_batches("r", "m", "judging", "sut", "http://x/v1") == []
        writer.end_batch("batch_1", "completed")
        assert reader.open_batches("r", "m", "sampling", "sut", "http://x/v1") == []
        assert [b["status"] for b in reader.batches("r")] == ["completed"]
    finally:
        writer.close()
        reader.close()
