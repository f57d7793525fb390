"""Judging ahead (metrics/ahead.py): decision flip's judge is asked about a pair as soon as both of
its answers are in, during sampling, and the judging stage finds those answers in the journal.

SUT and judge are scripted servers on loopback that answer as the builtin model does, so the
judge reads real answers; each test compares a run judged ahead with one that is not."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from aip_assets import warehouse as wh
from aip_assets.cli import main
from aip_assets.metrics import ahead, get_metric
from aip_assets.metrics.base import StageContext
from aip_assets.models import builtin
from aip_assets.runspec import BuiltinProfile, RunSpec

from .conftest import table, write_dataset
from .scripted import Reply, is_preflight, is_probe

# what makes a judgement: everything but when and how long
SAME = [
    "pair_id",
    "status",
    "label",
    "decision_a",
    "decision_b",
    "flipped",
    "order_swapped",
    "raw_output",
    "call_key",
    "attempts",
    "reasks",
    "network_retries",
    "rate_limit_waits",
]


def answer(body) -> str:
    return builtin.handle_chat(body, BuiltinProfile())["choices"][0]["message"]["content"]


def spec_file(tmp_path: Path, sut: dict, judge: dict, concurrency: int = 8, judge_retries: int = 2) -> Path:
    ds = write_dataset(tmp_path / "in" / "d.jsonl", 6)
    p = tmp_path / "in" / "spec.yaml"
    config = {
        "num_pairs_per_dimension": 3,
        "dimensions": ["gender", "religion"],
        "sub_call_concurrency_limit": concurrency,
    }
    p.write_text(
        json.dumps(
            {
                "name": "ahead",
                "dataset": str(ds),
                "seed": 5,
                "retry_backoff_seconds": 0.01,
                "judge_retries": judge_retries,
                "sut": sut,
                "judge": judge,
                "metrics": {"llm.decision_flip": {"baseline_share": 0.5, "config": config}},
            }
        )
    )
    return p


def run(spec: Path, monkeypatch, ahead_on: bool) -> str:
    monkeypatch.setenv("AIP_JUDGE_DURING_SAMPLING", "1" if ahead_on else "0")
    assert main(["run", str(spec), "--quiet"]) in (0, 1)
    return wh.query("SELECT run_id FROM eval_runs ORDER BY created_at DESC LIMIT 1").run_id[0]


def judgements(run_id: str):
    return table("judgements", run_id, "pair_id")[SAME].reset_index(drop=True)


def after_last_check(server) -> list[dict]:
    """The judge requests that came after the judge's last endpoint check (the judging stage's)."""
    bodies = server.bodies(preflight=True)
    last = max(i for i, b in enumerate(bodies) if is_preflight(b))
    return [b for b in bodies[last + 1 :] if not is_probe(b)]


def judging_starts(monkeypatch, server) -> list[int]:
    """Where each judging stage started in ``server``'s requests (their count then), one per run."""
    from aip_assets.assets import stages

    marks: list[int] = []
    stage = stages.run_stage

    def marked(name, *a, **k):
        if name == "judging":
            marks.append(len(server.bodies(preflight=True)))
        return stage(name, *a, **k)

    monkeypatch.setattr(stages, "run_stage", marked)
    return marks


def checks(bodies: list[dict]) -> int:
    """How many endpoint checks ``bodies`` hold."""
    return sum(is_preflight(b) for b in bodies)


def test_pairs_are_judged_during_sampling_and_the_judgements_are_the_same(tmp_path, scripted, monkeypatch):
    sut = scripted(lambda body, n: answer(body))
    judge = scripted(lambda body, n: answer(body))
    spec = spec_file(tmp_path, sut.conn(), judge.conn())

    starts = judging_starts(monkeypatch, judge)
    off = run(spec, monkeypatch, ahead_on=False)
    judged_after = after_last_check(judge)
    pairs = table("probe_pairs", off, "pair_id")
    assert len(pairs) > 20 and (pairs.kind == "null").any()  # null pairs too (their twins' personas)
    first = judge.bodies(preflight=True)
    assert checks(first[starts[0] :]) == 1  # not ahead: the judging stage checked the judge

    on = run(spec, monkeypatch, ahead_on=True)
    second = judge.bodies(preflight=True)[len(first) :]
    # ahead: the judge's endpoint check was made before the first judgement ahead, during sampling,
    # and nothing was left to ask in the judging stage, not even the check (as many checks in all)
    assert judge.bodies(preflight=True)[starts[1] :] == []
    assert checks(second) == checks(first)
    assert len(after_last_check(judge)) == len(judged_after)  # and every judgement came after it
    a, b = judgements(off), judgements(on)
    assert len(a) == len(pairs) and (a.status == "ok").all()
    # not ahead: every judgement's request came after the judging stage's endpoint check, each
    # distinct request once (pairs whose answers and personas shown are the same ask the same)
    assert len(judged_after) == a.call_key.nunique() < len(a)
    assert a.drop(columns="call_key").equals(b.drop(columns="call_key"))
    assert a.call_key.tolist() == b.call_key.tolist()  # the same requests (a key is the request's hash)
    calls = {r: table("llm_calls", r, "call_key") for r in (off, on)}
    for r in (off, on):  # the judge's calls are the judging stage's, journaled and stored as such
        judging = calls[r][calls[r].role == "judge"].query("stage != 'exam'")
        assert set(judging.stage) == {"judging"} and set(judging.call_key) == set(a.call_key)
        assert (judging.source == "network").all() and (judging.status == "ok").all()
        assert len(judging) == a.call_key.nunique()  # a request asked again while in flight waits for its answer


def test_group_bias_judges_ahead_too(tmp_path, scripted, monkeypatch):
    """Group interaction bias: three judges per pair, all asked during sampling; the same judgements."""
    sut = scripted(lambda body, n: answer(body))
    judge = scripted(lambda body, n: answer(body))
    ds = write_dataset(tmp_path / "in" / "d.jsonl", 3)
    p = tmp_path / "in" / "gib.json"
    metric = {"config": {"num_pairs": 3, "persona_pool_size": 8, "sub_call_concurrency_limit": 8}}
    p.write_text(
        json.dumps(
            {
                "name": "gib-ahead",
                "dataset": str(ds),
                "seed": 2,
                "sut": sut.conn(),
                "judge": judge.conn(),
                "metrics": {"llm.group_interaction_bias": metric},
            }
        )
    )
    starts = judging_starts(monkeypatch, judge)
    off = run(p, monkeypatch, ahead_on=False)
    assert len(after_last_check(judge)) > 0
    on = run(p, monkeypatch, ahead_on=True)
    assert judge.bodies(preflight=True)[starts[1] :] == []  # nothing asked in the judging stage, not even the check
    cols = ["judgement_id", "status", "score", "parsed", "order_swapped", "call_key"]
    a, b = (table("judgements", r, "judgement_id")[cols].reset_index(drop=True) for r in (off, on))
    assert len(a) > 0 and set(a.judgement_id.str.rsplit("|", n=1).str[1]) == {"similarity", "effort", "tone"}
    assert a.equals(b)


def test_a_judge_failing_during_sampling_fails_those_judgements_within_their_budget(tmp_path, scripted, monkeypatch):
    """The judge fails every request from the SUT's sampling on until the judging stage starts.
    Judged ahead, a judgement gets its whole budget (judge_retries 1: two requests) and no more: the
    judge failed within it, as it would have in the judging stage. After MAX_FAILURES such
    judgements no more are started (with 2 in flight, at most 2 more fail); the judging stage takes
    the failed ones as they are and judges the others, which equal a run's not judged ahead."""
    # the judging stage's check of the judge is its third with judging ahead (the run's, judging ahead's
    # during sampling, which the judge answers: then its judgements fail and judging ahead stops, so
    # the judging stage checks it again), its second without
    state = {"sampling": False, "judge_checks": 0, "stage_check": 3, "failing": False, "failed": 0}

    def sut_handler(body, n):
        if is_preflight(body):
            return "OK"
        if not state["sampling"]:  # the SUT's first call: sampling has started
            state["sampling"] = state["failing"] = True
        return answer(body)

    def judge_handler(body, n):
        if is_preflight(body):
            state["judge_checks"] += 1
            if state["judge_checks"] == state["stage_check"]:  # the judging stage's check
                state["failing"] = False
            return "OK"
        if state["failing"]:
            state["failed"] += 1
            return Reply(status=500)
        return answer(body)

    sut = scripted(sut_handler, answer_preflight=False)
    judge = scripted(judge_handler, answer_preflight=False)
    spec = spec_file(tmp_path, sut.conn(), judge.conn(), concurrency=2, judge_retries=1)
    on = run(spec, monkeypatch, ahead_on=True)
    got, failed = judgements(on), state["failed"]
    bad = got[got.status == "judge_failed"]
    assert ahead.MAX_FAILURES <= len(bad) <= ahead.MAX_FAILURES + 2
    assert (bad.attempts == 2).all() and (bad.network_retries == 1).all() and failed == 2 * len(bad)
    assert state["judge_checks"] == 3  # judging ahead stopped: the judging stage checked the judge again
    state.update(sampling=False, judge_checks=0, stage_check=2, failed=0)
    off = run(spec, monkeypatch, ahead_on=False)
    assert state["failed"] == 0
    good = got.status != "judge_failed"
    assert got[good].to_dict("records") == judgements(off)[good].to_dict("records")
    calls = table("llm_calls", on, "call_key").query("role == 'judge' and stage == 'judging'")
    assert (calls.status != "ok").sum() == len(bad)  # a judgement's failed call is on record (once: its retry inside)


def test_no_judgement_ahead_before_the_judges_check_answers_and_the_judging_stage_checks_again(
    tmp_path, scripted, monkeypatch, capsys
):
    """The judge answers the run's endpoint check, then 401 (a revoked key): judging ahead's check
    during sampling fails, so no judgement is asked ahead, and the judging stage checks the judge
    itself and stops the run as misconfigured (exit 2), as without judging ahead."""
    state = {"checks": 0, "after": 0}

    def judge_handler(body, n):
        if is_preflight(body):
            state["checks"] += 1
            # judging ahead's check answers late: the pairs completed meanwhile wait for it
            late = 0.5 if state["checks"] == 2 else 0.0
            return "OK" if state["checks"] == 1 else Reply(401, body={"error": {"message": "bad key"}}, delay_s=late)
        state["after"] += state["checks"] >= 2  # a judge request after the failed check
        return answer(body)

    sut = scripted(lambda body, n: answer(body))
    judge = scripted(judge_handler, answer_preflight=False)
    monkeypatch.setenv("AIP_JUDGE_DURING_SAMPLING", "1")
    assert main(["run", str(spec_file(tmp_path, sut.conn(), judge.conn())), "--quiet"]) == 2
    assert state == {"checks": 3, "after": 0}  # the run's, judging ahead's, the judging stage's; nothing judged
    assert f"judge endpoint {judge.url} (model scripted): unauthorised (HTTP 401)" in capsys.readouterr().err


def _ctx(tmp_path, **spec) -> StageContext:
    ds = write_dataset(tmp_path / "d.jsonl", 2)
    s = RunSpec.model_validate({"name": "x", "dataset": str(ds), "metrics": {"llm.decision_flip": {}}, **spec})
    return StageContext("r", "llm.decision_flip", s, None, None, Pairs())


class Pairs:
    """A stage's reader that counts 40 pairs."""

    def count(self, table: str) -> int:
        return 40


@pytest.mark.parametrize(
    "setting, spec, expected",
    [
        ("1", {}, True),
        ("0", {}, False),
        ("1", {"limits": {"max_calls": 100}}, False),  # a judge call made early could take the SUT's budget
        ("1", {"limits": {"max_tokens": 1000}}, False),
        (
            "1",
            {
                "judge": {
                    "provider": "openai",
                    "base_url": "http://127.0.0.1:9/v1",
                    "model": "m",
                    "batch": {"enabled": True},
                }
            },
            False,
        ),
    ],
)
def test_when_pairs_are_judged_ahead(tmp_path, monkeypatch, setting, spec, expected):
    monkeypatch.setenv("AIP_JUDGE_DURING_SAMPLING", setting)
    plugin = get_metric("llm.decision_flip")
    assert ahead.wanted(_ctx(tmp_path, **spec), plugin) is expected
    assert not ahead.wanted(_ctx(tmp_path), get_metric("llm.semantic_consistency"))  # it has no pair_judge


def test_not_ahead_in_shared_mode_nor_above_the_pairs_kept(tmp_path, monkeypatch):
    """Another worker may judge in shared mode (nothing kept for it); above MAX_KEPT pairs the
    judgements kept until the judging stage would take too much memory."""
    monkeypatch.setenv("AIP_JUDGE_DURING_SAMPLING", "1")
    plugin = get_metric("llm.decision_flip")
    ctx = _ctx(tmp_path)
    assert ahead.wanted(ctx, plugin)
    ctx.reader.count = lambda table: ahead.MAX_KEPT + 1
    assert not ahead.wanted(ctx, plugin)
    monkeypatch.setenv("AIP_SHARED_STATE_URL", "postgresql://u@127.0.0.1:9/db")
    assert not ahead.wanted(_ctx(tmp_path), plugin)


def test_a_judgement_kept_is_taken_only_for_the_answers_it_was_made_of():
    pair = {"pair_id": "p", "probe_a": "x", "probe_b": "y", "kind": "persona"}
    resp = {("x", 0): {"status": "ok", "response": "yes"}, ("y", 0): {"status": "ok", "response": "no"}}
    asked: list[str] = []

    async def one(p):
        asked.append(p["pair_id"])
        return "asked"

    def judged(kept, answers):
        return asyncio.run(ahead.kept_first(kept, one, answers)(pair))

    assert judged({"p": (ahead.seen(pair, resp), "kept")}, resp) == "kept" and asked == []
    changed = {**resp, ("y", 0): {"status": "ok", "response": "changed"}}
    assert judged({"p": (ahead.seen(pair, resp), "kept")}, changed) == "asked"
    assert judged({}, resp) == "asked" and judged({"q": (ahead.seen(pair, resp), "kept")}, resp) == "asked"


def test_an_error_judging_ahead_never_fails_the_sampling(tmp_path, scripted, monkeypatch):
    """Reading a batch's pairs for judging ahead fails: the sampling goes on, and the judging stage
    judges every pair, as without judging ahead."""
    read = ahead.pair_batch
    failed = []

    def broken(ctx, ids, answers=True):  # judging ahead reads a batch's pairs without answers; the stage with
        if not answers:
            failed.append(ids)
            raise OSError("disk gone")
        return read(ctx, ids, answers)

    monkeypatch.setattr(ahead, "pair_batch", broken)
    sut = scripted(lambda body, n: answer(body))
    judge = scripted(lambda body, n: answer(body))
    on = run(spec_file(tmp_path, sut.conn(), judge.conn()), monkeypatch, ahead_on=True)
    got = judgements(on)
    assert len(got) > 20 and (got.status == "ok").all()
    assert failed and len(after_last_check(judge)) == got.call_key.nunique()  # all asked by the judging stage
