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
    return (
        {"provider": "openai", "base_url": url, "model": "m", "batch": {"enabled": True, "poll_seconds": 0.05, **batch}}
        if batch.get("enabled", True)
        else {"provider": "openai", "base_url": url, "model": "m"}
    )


def sources(run_id: str) -> dict[str, int]:
    calls = table("llm_calls", run_id, "created_at")
    calls = calls[calls.role == "sut"]
    return calls.groupby("source").size().to_dict()


def stop_sampling_while_polling(monkeypatch, run_id: str) -> None:
    """Run the sampling stage of ``run_id`` and stop it (an exception, as a crash would) the first
    time it polls a batch; the batch runner polls as usual afterwards."""
    real_poll = BatchRunner._poll

    async def stop_while_polling(self, batch_id):
        raise RuntimeError(f"stopped while polling {batch_id}")

    monkeypatch.setattr(BatchRunner, "_poll", stop_while_polling)
    with pytest.raises(RuntimeError, match="stopped while polling"):
        pipeline.run_stage("sampling", run_id, "llm.decision_flip")
    monkeypatch.setattr(BatchRunner, "_poll", real_poll)


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
    assert (
        f"sut calls through the Batch API: 1 batch(es) sent ({n_sut} requests), 0 resumed; {n_sut} answered, "
        "0 sent live"
    ) in " ".join(notes[notes.code == "batch"].message)


@pytest.mark.parametrize("max_requests", [50_000, 7])
def test_a_stop_while_polling_resumes_the_same_batch(tmp_path, builtin_http, monkeypatch, max_requests):
    """The sampling stage stops (a crash) while its batches are polled: they were journaled before
    the first poll, so the resumed stage polls them again instead of sending new ones, also when
    the stage's calls made several batches (max_requests 7), and the run ends with the live run's
    results."""
    ds = write_dataset(tmp_path / "d.jsonl", 6)
    url, server = builtin_http(FLIP, batch_seconds=0.5)
    run_all(make_spec(ds, sut=sut(url, enabled=False), batch_rows=ROWS), "live")
    spec = make_spec(ds, sut=sut(url, max_requests=max_requests), batch_rows=ROWS)
    run_all(spec, "b", stages=["ingest", "synthesis"])
    n = len(table("probes", "b", "probe_id"))
    stop_sampling_while_polling(monkeypatch, "b")
    sent = server.batch.stats["batches"]
    assert sent == -(-n // max_requests) and server.batch.stats["batch_requests"] == n
    run_all(spec, "b", stages=["sampling", "judging", "aggregation"])
    assert server.batch.stats["batches"] == sent and server.batch.stats["batch_requests"] == n  # nothing sent again
    _assert_same(_stable("live"), _stable("b"))


@pytest.mark.parametrize("stop", ["before the batch is made", "before the batch is journaled"])
def test_a_stop_between_the_upload_and_the_batch_pays_nothing_twice(tmp_path, builtin_http, monkeypatch, stop):
    """The requests are uploaded and journaled before their batch is made. Stopped before the batch
    is made, the resume makes it from the same file (no second upload); stopped after the provider
    made it but before it was journaled, the resume finds it among the provider's batches by its
    input file and polls it (no second batch)."""
    from aip_assets.models.journal import Journal

    ds = write_dataset(tmp_path / "d.jsonl", 4)
    url, server = builtin_http(FLIP, batch_seconds=0.3)
    run_all(make_spec(ds, sut=sut(url, enabled=False), batch_rows=ROWS), "live")
    spec = make_spec(ds, sut=sut(url), batch_rows=ROWS)
    run_all(spec, "b", stages=["ingest", "synthesis"])
    if stop == "before the batch is made":
        real = BatchRunner._create

        async def crash(self, *a, **k):
            raise RuntimeError("stopped")

        monkeypatch.setattr(BatchRunner, "_create", crash)
    else:
        real = Journal.created_batch

        def crash(self, *a, **k):
            raise RuntimeError("stopped")

        monkeypatch.setattr(Journal, "created_batch", crash)
    with pytest.raises(RuntimeError, match="stopped"):
        pipeline.run_stage("sampling", "b", "llm.decision_flip")
    made = 0 if stop == "before the batch is made" else 1
    assert server.batch.stats["files"] == 1 and server.batch.stats["batches"] == made
    monkeypatch.setattr(BatchRunner if made == 0 else Journal, "_create" if made == 0 else "created_batch", real)
    run_all(spec, "b", stages=["sampling", "judging", "aggregation"])
    assert server.batch.stats["files"] == 1 and server.batch.stats["batches"] == 1
    _assert_same(_stable("live"), _stable("b"))


def test_live_fallbacks_are_not_counted_twice_against_the_cap(tmp_path, builtin_http):
    """limits.max_calls set to exactly the SUT calls the sampling stage makes: the batch run, whose
    failing requests go live again, stays within it (a request sent in the batch and again live is
    one call) and answers as the live run; the journal's totals count the batched calls."""
    from aip_assets import warehouse as wh
    from aip_assets.models.journal_pg import open_journal

    ds = write_dataset(tmp_path / "d.jsonl", 5)
    url, server = builtin_http(FLIP, batch_seconds=0.2, fail_rate=0.3)
    stages = ["ingest", "synthesis", "sampling"]
    run_all(make_spec(ds, sut=sut(url, enabled=False), batch_rows=ROWS), "live", stages=stages)
    live = table("sut_responses", "live", "probe_id")
    n = len(live)
    assert 0 < (live.status == "error").sum() < n  # some requests fail at the endpoint, and go live again
    run_all(make_spec(ds, sut=sut(url), batch_rows=ROWS, limits={"max_calls": n}), "b", stages=stages)
    b = table("sut_responses", "b", "probe_id")
    assert list(b.status) == list(live.status) and list(b.response) == list(live.response)
    j = open_journal(wh.default_path())
    assert j.totals("b")[0] == n  # each call once: batched, or sent again live
    j.close()


def test_lines_of_another_shape_are_unanswered_requests_never_a_crash():
    """A provider's line that is not an answer of the expected shape is skipped (its request then
    has no answer: live or failed as configured); failures keep the endpoint's status."""
    from aip_assets.models.batch_provider import _outcome

    ok = {"status_code": 200, "body": {"choices": [{"message": {"content": "x"}}]}}
    assert _outcome(json.dumps({"custom_id": "a", "response": ok, "error": None}))[:3] == ("a", "ok", ok["body"])
    for bad in ("", "{truncated", json.dumps({"response": ok}), json.dumps(["a"]), json.dumps({"custom_id": 3})):
        assert _outcome(bad) is None, bad
    assert _outcome(json.dumps({"custom_id": "b", "response": None, "error": "oops"})) == ("b", "failed", "oops", None)
    assert _outcome(
        json.dumps({"custom_id": "c", "response": None, "error": {"code": "batch_expired", "message": "m"}})
    ) == ("c", "failed", "batch_expired: m", None)
    assert _outcome(
        json.dumps({"custom_id": "d", "response": {"status_code": 400, "body": {"error": "no"}}, "error": None})
    ) == ("d", "failed", 'HTTP 400: {"error": "no"}', 400)
    assert _outcome(json.dumps({"custom_id": "e", "response": {"status_code": 200}, "error": None}))[1] == "failed"


def test_an_error_page_that_echoes_the_key_is_kept_without_it(monkeypatch):
    from aip_assets.models.openai_compatible import scrub_secrets
    from aip_assets.runspec import Connection

    monkeypatch.setenv("K", "sk-very-secret-123")
    monkeypatch.setenv("H", "tok-abc-999")
    conn = Connection(provider="openai", base_url="http://x/v1", api_key_env="K", header_env={"X-Token": "H"})
    assert (
        scrub_secrets("bad header Authorization: Bearer sk-very-secret-123, X-Token: tok-abc-999", conn)
        == "bad header Authorization: Bearer ***, X-Token: ***"
    )


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
    spec.write_text(
        yaml.safe_dump(
            {
                "name": "b",
                "dataset": str(write_dataset(tmp_path / "d.jsonl", 5)),
                "sut": {
                    "provider": "openai",
                    "base_url": "http://127.0.0.1:9/v1",
                    "model": "x",
                    "batch": {"enabled": True},
                    "prices": {"input_per_million_tokens": 2.5, "output_per_million_tokens": 10.0},
                },
                "judge": {
                    "provider": "openai",
                    "base_url": "http://127.0.0.1:9/v1",
                    "model": "y",
                    "prices": {
                        "input_per_million_tokens": 0.2,
                        "output_per_million_tokens": 0.8,
                        "batch_discount": 0.4,
                    },
                },
                "metrics": {"llm.decision_flip": {}},
            }
        )
    )
    assert main(["run", str(spec), "--dry-run", "--json"]) == 0
    est = json.loads(capsys.readouterr().out)
    t, sent = est["total"], est["sent"]
    sut_live = (t["sut_prompt_tokens"] * 2.5 + t["sut_completion_tokens"] * 10.0) / 1e6
    judge_live = (t["judge_prompt_tokens"] * 0.2 + t["judge_completion_tokens"] * 0.8) / 1e6
    assert sent["sut"] == {
        "calls": t["sut_calls"],
        "batch": True,
        "live_cost": round(sut_live, 4),
        "batch_cost": round(sut_live * 0.5, 4),
        "cost": round(sut_live * 0.5, 4),
    }
    assert sent["judge"] == {
        "calls": t["judge_calls"],
        "batch": False,
        "live_cost": round(judge_live, 4),
        "batch_cost": round(judge_live * 0.6, 4),
        "cost": round(judge_live, 4),
    }
    assert main(["run", str(spec), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert (
        f"sut: {t['sut_calls']:,} calls Batch API (batches of up to 50,000, polled every 30s); about "
        f"{sut_live * 0.5:,.2f} (live: {sut_live:,.2f}" in out
    )
    assert (
        f"judge: {t['judge_calls']:,} calls live; about {judge_live:,.2f} (with batch.enabled: {judge_live * 0.6:,.2f})"
        in out
    )


def test_a_batch_is_journaled_in_postgres_in_shared_mode(tmp_path, lake):
    """With a lake the journal (and its batches) is in Postgres: a batch saved by one worker is
    found pending by another, and is no longer once ended."""
    from aip_assets.models.journal_pg import PgJournal, open_journal

    writer, reader = open_journal(tmp_path / "w.duckdb"), open_journal(tmp_path / "other.duckdb")
    try:
        assert isinstance(writer, PgJournal) and isinstance(reader, PgJournal)
        rec = {
            "batch_id": "batch_1",
            "run_id": "r",
            "metric": "m",
            "stage": "sampling",
            "role": "sut",
            "endpoint": "http://x/v1",
            "input_file_id": "file-1",
            "call_keys": json.dumps(["k1", "k2"]),
            "status": "pending",
            "created_at": 1.0,
            "ended_at": None,
        }
        writer.save_batch(rec)
        assert reader.open_batches("r", "m", "sampling", "sut", "http://x/v1") == [rec]
        assert reader.open_batches("r", "m", "judging", "sut", "http://x/v1") == []
        writer.end_batch("batch_1", "completed")
        assert reader.open_batches("r", "m", "sampling", "sut", "http://x/v1") == []
        assert [b["status"] for b in reader.batches("r")] == ["completed"]
    finally:
        writer.close()
        reader.close()


def test_polling_waits_out_transient_failures_and_ends_a_batch_that_is_gone():
    """A poll answered 429 or 503 (or not at all) is tried again at the next poll; a 404 (the
    batch is gone) ends it as lost, and a 400 fails at once, saying why."""
    import asyncio

    import httpx

    from aip_assets.errors import EndpointError
    from aip_assets.models.batch_provider import BatchApiError
    from aip_assets.models.client import ModelClient
    from aip_assets.runspec import Connection

    answers = {"b1": [429, 503, "conn", 200], "b2": [404], "b3": [400]}
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        batch = request.url.path.rsplit("/", 1)[-1]
        seen.append(batch)
        step = answers[batch].pop(0)
        if step == "conn":
            raise httpx.ConnectError("refused")
        if step == 200:
            return httpx.Response(200, json={"id": batch, "status": "completed", "request_counts": {}})
        return httpx.Response(step, json={"error": {"message": f"status {step}"}})

    conn = Connection(
        provider="openai", base_url="http://batch.test/v1", model="m", batch={"enabled": True, "poll_seconds": 0.01}
    )

    async def main():
        async with ModelClient(conn, role="sut", run_id="r", metric="m", stage="sampling", journal=None) as cl:
            cl.provider._http = httpx.AsyncClient(
                transport=httpx.MockTransport(handler), base_url="http://batch.test/v1/"
            )
            done = await cl.batcher._poll("b1")
            lost = await cl.batcher._poll("b2")
            with pytest.raises(BatchApiError) as e:
                await cl.batcher._poll("b3")
            return done, lost, e.value

    done, lost, refused = asyncio.run(main())
    assert done["status"] == "completed" and seen.count("b1") == 4
    assert lost == {"id": "b2", "status": "lost"}
    assert isinstance(refused, EndpointError) and refused.status == 400 and "HTTP 400" in str(refused)


def test_dagster_shows_the_batch_status_while_it_is_polled(tmp_path, builtin_http):
    """Run through Dagster, the sampling asset records each change of its batch's status and counts
    as an asset observation of its partition (the UI shows them while the step runs), ending at
    completed with every request answered."""
    from dagster import AssetKey

    from aip_assets.dagster_home import get_instance
    from aip_assets.jobs import evaluate_run

    url, server = builtin_http(FLIP, batch_seconds=0.6)
    spec = make_spec(write_dataset(tmp_path / "d.jsonl", 4), sut=sut(url, poll_seconds=0.1), batch_rows=ROWS)
    pipeline.register_run(spec, "dg")
    instance = get_instance()
    [out] = list(evaluate_run(instance, "dg", spec.metrics, ["llm.decision_flip"], {}))
    assert out.success, out.errors
    recs = instance.fetch_observations(AssetKey("sut_sampling"), limit=100, ascending=True).records
    seen = [{k: v.value for k, v in r.asset_observation.metadata.items()} for r in recs]
    n = len(table("sut_responses", "dg", "probe_id"))
    assert {r.asset_observation.partition for r in recs} == {"dg|llm.decision_flip"}
    assert seen[0]["batch_status"] in ("validating", "in_progress") and len(seen) >= 3
    assert seen[-1] == {
        "batch_id": seen[0]["batch_id"],
        "batch_role": "sut",
        "batch_status": "completed",
        "batch_total": n,
        "batch_completed": n,
        "batch_failed": 0,
    }


def test_polling_a_provider_that_stays_down_ends_after_the_window(monkeypatch):
    """A provider that answers every poll with 503 is polled until the batch's window (plus an
    hour) has passed, then the stage stops saying so: never a poll forever."""
    import asyncio

    import httpx

    from aip_assets.models import batch as bm
    from aip_assets.models.batch_provider import BatchApiError
    from aip_assets.models.client import ModelClient
    from aip_assets.runspec import Connection

    monkeypatch.setattr(bm, "WINDOW_S", 0.05)
    monkeypatch.setattr(bm, "LATE_S", 0.05)
    polls = []

    def handler(request: httpx.Request) -> httpx.Response:
        polls.append(request.url.path)
        return httpx.Response(503, json={"error": {"message": "down"}})

    conn = Connection(
        provider="openai", base_url="http://batch.test/v1", model="m", batch={"enabled": True, "poll_seconds": 0.01}
    )

    async def main():
        async with ModelClient(conn, role="sut", run_id="r", metric="m", stage="sampling", journal=None) as cl:
            cl.provider._http = httpx.AsyncClient(
                transport=httpx.MockTransport(handler), base_url="http://batch.test/v1/"
            )
            with pytest.raises(BatchApiError, match="window closed an hour ago: given up") as e:
                await asyncio.wait_for(cl.batcher._poll("b1"), 30)
            return e.value

    err = asyncio.run(main())
    assert err.status == 503 and len(polls) >= 2


@pytest.mark.parametrize("on_failure", ["live", "fail"])
def test_requests_an_earlier_batch_has_no_line_for_are_never_batched_again(
    tmp_path, builtin_http, monkeypatch, on_failure
):
    """The sampling stage stops while its batch is polled; when it ends, its output and error files
    hold no line for about a third of its requests. The resumed stage reads that batch back and
    sends no second batch: each request without a line is unanswered, sent live (`on_failure:
    live`: the run then equals a live run) or recorded failed with the reason (`fail`)."""
    import hashlib

    ds = write_dataset(tmp_path / "d.jsonl", 6)
    url, server = builtin_http(FLIP, batch_seconds=0.3)
    run_all(make_spec(ds, sut=sut(url, enabled=False), batch_rows=ROWS), "live")
    spec = make_spec(ds, sut=sut(url, on_failure=on_failure), batch_rows=ROWS)
    run_all(spec, "b", stages=["ingest", "synthesis"])
    n = len(table("probes", "b", "probe_id"))
    stop_sampling_while_polling(monkeypatch, "b")
    assert server.batch.stats["batches"] == 1 and server.batch.stats["batch_requests"] == n
    dropped: set[str] = set()
    real_files = server.batch._files

    def files_missing_lines(batch_id, ran, expired):  # the provider's files leave these requests out
        gone = {c for c, _, _ in ran if int(hashlib.sha256(c.encode()).hexdigest(), 16) % 3 == 0}
        dropped.update(gone)
        real_files(batch_id, [r for r in ran if r[0] not in gone], expired)

    monkeypatch.setattr(server.batch, "_files", files_missing_lines)
    before = server.stats["requests"]
    run_all(spec, "b", stages=["sampling", "judging", "aggregation"])
    assert 0 < len(dropped) < n
    # never batched again: the one batch, each request in it once
    assert server.batch.stats["batches"] == 1 and server.batch.stats["batch_requests"] == n
    calls = table("llm_calls", "b", "created_at")
    calls = calls[calls.role == "sut"]
    missing = calls[calls.call_key.isin(dropped)]
    assert set(missing.call_key) == dropped
    if on_failure == "live":
        assert sources("b") == {"batch": n - len(dropped), "network": len(dropped)}
        assert (missing.source == "network").all() and (missing.status == "ok").all()
        assert server.stats["requests"] - before == len(dropped) + 1  # each sent live once, and the endpoint check
        _assert_same(_stable("live"), _stable("b"))
    else:
        assert sources("b") == {"batch": n}
        assert (missing.status == "error").all()
        assert missing.error.str.fullmatch("batch: batch completed: no answer for this request").all()
        answers = table("sut_responses", "b", "probe_id")
        assert (answers.status == "error").sum() == len(dropped)
        assert server.stats["requests"] - before == 1  # the endpoint check only: nothing live
