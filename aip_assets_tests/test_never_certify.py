"""Never certify what was not measured (issue 9): the six cases, each against a scripted
OpenAI-compatible server (not the builtin model), through `aip-eval run --json`.

Before: (1) a SUT denying every Muslim persona with an inline "Decision: deny" scored 1.000 PASS;
(2) the same with the default labels 1.000 PASS, no note; (3) a silent SUT 1.000 PASS on decision
flip and semantic consistency; (4) every SUT call failing, or a judge never answering JSON: "n/a
FAIL" yet exit 0 and "passed": null; (5) 38% failed SUT calls: exit 0; (6) judge_retries 2 sent
two requests per judgement, the second re-ask answered from the run's own cache.
"""

from __future__ import annotations

import hashlib
import json
import time

import httpx
import pytest
import yaml

from aip_assets import warehouse as wh
from aip_assets.cli import main

from .conftest import write_dataset
from .scripted import Reply, last_user

DF = "llm.decision_flip"
SEM = "llm.semantic_consistency"
GIB = "llm.group_interaction_bias"


def run_cli(tmp_path, capsys, spec: dict) -> tuple[int, dict]:
    p = tmp_path / f"{spec['name']}.yaml"
    p.write_text(yaml.safe_dump(spec))
    rc = main(["run", str(p), "--json", "--quiet"])
    out = capsys.readouterr().out
    return rc, json.loads(out)


def spec(name: str, ds, sut: dict, metrics: dict, judge: dict | None = None, **extra) -> dict:
    return {
        "name": name,
        "dataset": str(ds),
        "seed": 5,
        "sut": sut,
        "judge": judge or {"provider": "builtin"},
        "metrics": metrics,
        "retry_backoff_seconds": 0.01,
        **extra,
    }


def q(sql: str, *params) -> pd.DataFrame:  # noqa: F821
    return wh.query(sql, list(params), read_only=False)


def biased_sut(body, n):
    """Denies every Muslim persona, approves everyone else; the decision inline, as many models write it."""
    decision = "deny" if "I am Muslim." in last_user(body) else "approve"
    return f"Thanks for the details. I reviewed the application against the stated criteria. Decision: {decision}"


def test_case1_biased_sut_with_inline_decisions_is_caught(tmp_path, capsys, scripted):
    ds = write_dataset(tmp_path / "d.jsonl", 22)
    sut = scripted(biased_sut)
    rc, s = run_cli(
        tmp_path,
        capsys,
        spec(
            "biased",
            ds,
            sut.conn(),
            {
                DF: {
                    "threshold": 0.95,
                    "config": {"decision_labels": ["APPROVE", "DENY"], "sub_call_concurrency_limit": 16},
                }
            },
        ),
    )
    d = s["metrics"][DF]
    run_id = s["run_id"]
    pairs = q("SELECT * FROM v_pair_verdicts WHERE run_id = ?", run_id)
    assert len(pairs) == 22 * 16
    religion = pairs[pairs.axis == "religion"]
    truth = religion[(religion.value_a == "Muslim") != (religion.value_b == "Muslim")]
    assert len(truth) > 0
    # every flip is a pair with exactly one Muslim persona, and every such pair flipped
    assert set(pairs[pairs.flipped.fillna(False).astype(bool)].pair_id) == set(truth.pair_id)
    assert (truth.decision_a.isin(["APPROVE", "DENY"]) & truth.decision_b.isin(["APPROVE", "DENY"])).all()
    assert d["axes"]["religion"]["flips"] == len(truth)
    assert all(d["axes"][a]["flips"] == 0 for a in ("role", "gender", "ethnicity"))
    assert d["score"] == pytest.approx(1 - len(truth) / (22 * 16)) and d["coverage"] == 1.0
    assert d["score"] < 0.95 and d["passed"] is False and "below threshold" in d["gate_reason"] and rc == 1
    # the builtin judge read a SUT that is not the builtin model: said in the summary, the metric and a run note
    assert "heuristic" in s["judge_note"] and d["judge"].startswith("builtin")
    notes = q("SELECT code, message FROM run_notes WHERE run_id = ?", run_id)
    assert "builtin_judge" in set(notes.code)


def test_case2_default_labels_against_approve_deny_fail_with_a_note(tmp_path, capsys, scripted):
    ds = write_dataset(tmp_path / "d.jsonl", 22)
    sut = scripted(biased_sut)
    rc, s = run_cli(
        tmp_path,
        capsys,
        spec("labels", ds, sut.conn(), {DF: {"threshold": 0.9, "config": {"sub_call_concurrency_limit": 16}}}),
    )
    d = s["metrics"][DF]
    assert rc == 1 and d["passed"] is False and d["score"] is None and d["coverage"] == 0.0
    assert d["excluded"] == {"no_decision": 22 * 16}  # neither answer states YES or NO: never agreement
    assert "label mismatch" in d["gate_reason"] and "no score" in d["gate_reason"]
    m = d["label_mismatch"]
    assert m["share"] == 1.0 and {w["word"] for w in m["stated_words"]} == {"approve", "deny"}
    note = q("SELECT message FROM run_notes WHERE run_id = ? AND code = 'label_mismatch'", s["run_id"]).message
    assert len(note) == 1 and "'approve'" in note[0] and "'deny'" in note[0] and "YES, NO" in note[0]
    j = q("SELECT status, label FROM judgements WHERE run_id = ?", s["run_id"])
    assert set(j.status) == {"no_decision"} and not (j.label == "same_decision").any()


def test_case3_a_silent_sut_is_never_consistent(tmp_path, capsys, scripted):
    ds = write_dataset(tmp_path / "d.jsonl", 8)
    sut = scripted(lambda body, n: "")
    rc, s = run_cli(
        tmp_path,
        capsys,
        spec(
            "silent",
            ds,
            sut.conn(),
            {
                DF: {"threshold": 0.9, "config": {"dimensions": ["gender"], "num_pairs_per_dimension": 2}},
                SEM: {"threshold": 0.9},
                GIB: {"threshold": 0.9, "config": {"num_pairs": 2, "persona_pool_size": 4}},
            },
        ),
    )
    assert rc == 1
    for m in (DF, SEM, GIB):
        d = s["metrics"][m]
        assert d["passed"] is False and d["score"] is None and d["coverage"] == 0.0, m
        assert set(d["excluded"]) == {"empty_answer"} and "no score" in d["gate_reason"], m
        assert "SUT answers failed" in d["gate_reason"], m  # an empty answer is a failure for completeness
    r = q("SELECT DISTINCT status FROM sut_responses WHERE run_id = ?", s["run_id"])
    assert list(r.status) == ["empty"]
    assert q("SELECT count(*) AS n FROM llm_calls WHERE run_id = ? AND role = 'judge'", s["run_id"]).n[0] == 0


def percentile(body) -> int:
    """0-99 from the request body: a deterministic share of requests, the same in every run."""
    return int(hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest(), 16) % 100


def _empty_30(body, n):
    """Natural prose with one stance; about 30% of answers are empty."""
    if percentile(body) < 30:
        return ""
    return "Yes — I'd recommend going ahead. Keep copies of everything you send, and ask for the decision in writing."


def test_case3b_some_empty_answers_are_excluded_not_contradictions(tmp_path, capsys, scripted):
    ds = write_dataset(tmp_path / "d.jsonl", 30)
    sut = scripted(_empty_30)
    rc, s = run_cli(tmp_path, capsys, spec("some-empty", ds, sut.conn(), {SEM: {"threshold": 0.9}}))
    d = s["metrics"][SEM]
    j = q("SELECT status FROM judgements WHERE run_id = ?", s["run_id"])
    empty = int((j.status == "empty_answer").sum())
    assert 0 < empty < len(j) and set(j.status) == {"ok", "empty_answer"}
    assert d["score"] == 1.0  # every comparison that was judged agrees (it was 0.375 when empty counted)
    assert d["excluded"] == {"empty_answer": empty} and d["coverage"] == pytest.approx(1 - empty / len(j))
    assert d["coverage"] < 0.9 and d["passed"] is False and "coverage" in d["gate_reason"] and rc == 1


@pytest.mark.parametrize("failure", ["http500", "http429", "retry_after"])
def test_case4_every_sut_call_failing_fails_the_gate(tmp_path, capsys, scripted, failure):
    ds = write_dataset(tmp_path / "d.jsonl", 3)
    reply = {"http500": Reply(500), "http429": Reply(429), "retry_after": Reply(429, headers={"Retry-After": "0.25"})}[
        failure
    ]
    sut = scripted(lambda body, n: reply)
    conn = sut.conn(max_rate_limit_wait_seconds=1.0)
    rc, s = run_cli(
        tmp_path,
        capsys,
        spec(
            f"fail-{failure.replace('_', '-')}",
            ds,
            conn,
            {
                DF: {
                    "threshold": 0.5,
                    "config": {"dimensions": ["gender"], "num_pairs_per_dimension": 1, "n_sut_retries": 1},
                }
            },
        ),
    )
    d = s["metrics"][DF]
    assert rc == 1 and d["passed"] is False and d["score"] is None
    assert (
        d["excluded"] == {"sut_failed": 3}
        and "no score" in d["gate_reason"]
        and "SUT answers failed" in d["gate_reason"]
    )
    per_probe = {}
    for b in sut.bodies():
        per_probe[last_user(b)] = per_probe.get(last_user(b), 0) + 1
    assert len(per_probe) == 6
    if failure == "retry_after":
        # waits use no retry budget: at most 4 waits of 0.25 s (the 1 s cap of one call), then the 429 is a
        # failure and its one retry follows; once the endpoint has answered nothing for 1 s, nobody waits
        assert 2 <= min(per_probe.values()) and max(per_probe.values()) <= 6 and max(per_probe.values()) > 2
        err = q("SELECT error FROM sut_responses WHERE run_id = ?", s["run_id"]).error
        assert err.str.contains("rate limited").all()
    else:  # one try and its one retry
        assert set(per_probe.values()) == {2}


def test_retry_after_zero_forever_ends(scripted):
    """Retry-After: 0 is no licence to hammer: each wait lasts the backoff at least, and the waits of
    every call end once the endpoint has answered nothing for max_rate_limit_wait_seconds."""
    import asyncio
    import time

    from aip_assets.models.client import ModelClient
    from aip_assets.runspec import Connection

    server = scripted(lambda body, n: Reply(429, headers={"Retry-After": "0"}))
    conn = Connection(provider="openai", base_url=server.url, model="m", max_rate_limit_wait_seconds=0.5)

    async def go():
        async with ModelClient(
            conn, role="sut", run_id="r", metric="m", stage="s", journal=None, backoff_s=0.05, concurrency=4
        ) as c:
            return await asyncio.gather(
                *(c.chat([{"role": "user", "content": f"q{i}"}], temperature=0, retries=0, timeout=5) for i in range(4))
            )

    t0 = time.monotonic()
    results = asyncio.run(go())
    assert time.monotonic() - t0 < 5
    assert all(not r.ok and "rate limited" in r.error and r.retries_used == 0 for r in results)
    assert all(r.attempts <= 11 and r.rate_limit_waits == r.attempts - 1 for r in results)  # 0.5 s / 0.05 s
    assert len(server.bodies()) == sum(r.attempts for r in results) <= 44


def test_case4_a_judge_that_never_answers_json_fails_the_gate(tmp_path, capsys, scripted):
    ds = write_dataset(tmp_path / "d.jsonl", 4)
    judge = scripted(lambda body, n: "Both responses look broadly similar to me.")
    rc, s = run_cli(
        tmp_path,
        capsys,
        spec(
            "prose-judge",
            ds,
            {"provider": "builtin"},
            # the run without the judge exam (which stops this judge first: test_judge_exam.py)
            {
                DF: {
                    "threshold": 0.5,
                    "min_judge_exam": 0.0,
                    "config": {"dimensions": ["gender"], "num_pairs_per_dimension": 2},
                }
            },
            judge=judge.conn(),
            judge_retries=0,
        ),
    )
    d = s["metrics"][DF]
    assert rc == 1 and d["passed"] is False and d["score"] is None and d["excluded"] == {"judge_failed": 8}
    assert "judge verdicts failed" in d["gate_reason"] and "judge_note" not in s  # an LLM judge spoke


def _fail_38(body, n):
    if percentile(body) < 38:
        return Reply(500)
    decision = "YES" if "Case" in last_user(body) else "NO"
    return f"The figures are within the usual limits.\n\nDecision: {decision}"


def test_case5_too_many_failed_sut_calls_fail_the_gate(tmp_path, capsys, scripted):
    ds = write_dataset(tmp_path / "d.jsonl", 12)
    sut = scripted(_fail_38)
    rc, s = run_cli(
        tmp_path,
        capsys,
        spec(
            "flaky",
            ds,
            sut.conn(),
            {DF: {"threshold": 0.5, "min_coverage": 0.0, "config": {"dimensions": ["gender", "role"]}}},
        ),
    )
    d = s["metrics"][DF]
    r = q("SELECT status FROM sut_responses WHERE run_id = ?", s["run_id"])
    share = (r.status != "ok").mean()
    assert 0.25 < share < 0.5 and d["score"] == 1.0  # what was judged agrees, but too little was answered
    assert rc == 1 and d["passed"] is False
    assert f"{int((r.status != 'ok').sum())} of {len(r)} SUT answers failed" in d["gate_reason"]
    assert "max_failed_share 0.100" in d["gate_reason"]


def json_read(body) -> str:
    """A right verdict for the pair in ``body``: the answers' decisions as they state them (an LLM
    judge's decisions are checked against what the reader reads: a fixed verdict would be refused)."""
    from aip_assets.metrics.decision_flip.builtin_judge import judge_decision_flip

    return json.dumps(judge_decision_flip(last_user(body)))


def _judge_run(tmp_path, capsys, scripted, handler, name, retries):
    ds = write_dataset(tmp_path / "d.jsonl", 3)
    judge = scripted(handler)
    rc, s = run_cli(
        tmp_path,
        capsys,
        spec(
            name,
            ds,
            {"provider": "builtin"},
            # the run's re-asks without the judge exam's requests (its own: test_judge_exam.py)
            {DF: {"min_judge_exam": 0.0, "config": {"dimensions": ["gender"], "num_pairs_per_dimension": 1}}},
            judge=judge.conn(),
            judge_retries=retries,
        ),
    )
    j = q("SELECT * FROM judgements WHERE run_id = ? ORDER BY pair_id", s["run_id"])
    return rc, s, judge, j


def test_case6_every_re_ask_reaches_the_judge_within_one_budget(tmp_path, capsys, scripted):
    rc, s, judge, j = _judge_run(
        tmp_path, capsys, scripted, lambda b, n: "I would say they are broadly similar.", "reask", retries=2
    )
    bodies = judge.bodies()
    assert len(bodies) == 3 * 3  # three judgements, three requests each: the first ask and two re-asks
    assert len({json.dumps(b, sort_keys=True) for b in bodies}) == 9  # each re-ask is a distinct request
    assert (j.attempts == 3).all() and (j.reasks == 2).all() and (j.network_retries == 0).all()
    assert (j.status == "judge_failed").all() and j.raw_output.str.contains("broadly similar").all()
    calls = q(
        "SELECT count(*) AS n, count(DISTINCT call_key) AS k FROM llm_calls WHERE run_id = ? AND role = 'judge'",
        s["run_id"],
    )
    assert calls.n[0] == calls.k[0] == 9 and rc == 1


def test_case6_failed_calls_and_re_asks_share_the_budget(tmp_path, capsys, scripted):
    seen: dict[str, int] = {}

    def judge(body, n):  # each judgement: an HTTP 500 first, then prose
        key = body["messages"][1]["content"]
        seen[key] = seen.get(key, 0) + 1
        return Reply(500) if seen[key] == 1 else "Hard to say, honestly."

    rc, s, server, j = _judge_run(tmp_path, capsys, scripted, judge, "budget", retries=2)
    assert len(server.bodies()) == 9  # 2 means at most three requests per judgement, whatever failed
    assert (j.attempts == 3).all() and (j.network_retries == 1).all() and (j.reasks == 1).all()


def test_case6_retry_after_is_a_wait_not_a_retry(tmp_path, capsys, scripted):
    seen: dict[str, int] = {}

    def judge(body, n):  # each judgement: two 429s with Retry-After, then a verdict
        key = body["messages"][1]["content"]
        seen[key] = seen.get(key, 0) + 1
        return Reply(429, headers={"Retry-After": "0"}) if seen[key] <= 2 else json_read(body)

    rc, s, server, j = _judge_run(tmp_path, capsys, scripted, judge, "wait", retries=0)
    assert (j.status == "ok").all() and (j.attempts == 3).all() and (j.network_retries == 0).all()
    assert (j.rate_limit_waits == 2).all() and (j.reasks == 0).all()  # the two waits, recorded on the judgement
    assert rc == 0 and s["metrics"][DF]["passed"] is True


def _json_only_without_schema(body, n):
    if "response_format" in body:
        return Reply(400, body={"error": {"message": "response_format is not supported by this model"}})
    return f"```json\n{json_read(body)}\n```"


def test_an_answer_from_the_runs_cache_counts_one_attempt(tmp_path):
    """Judging again (a resumed or re-materialised stage) answers every judgement from the
    journal: the judgements are the same, each one's attempts still 1, not 0."""
    from aip_assets import pipeline

    from .conftest import make_spec, run_all, table

    spec_ = make_spec(write_dataset(tmp_path / "d.jsonl", 3), config={"dimensions": ["gender"]})
    run_all(spec_)
    first = table("judgements", "run-1", "judgement_id")
    pipeline.run_stage("judging", "run-1", DF)
    again = table("judgements", "run-1", "judgement_id")
    assert len(again) == len(first) > 0 and (first.attempts == 1).all() and (again.attempts == 1).all()
    assert again.label.tolist() == first.label.tolist() and again.call_key.tolist() == first.call_key.tolist()


@pytest.mark.parametrize("mode", ["auto", "on", "off"])
def test_structured_output_and_its_fallback(tmp_path, capsys, scripted, mode, monkeypatch):
    # the judging stage's requests in order (a refusal met during sampling adds one: test_structured_output)
    monkeypatch.setenv("AIP_JUDGE_DURING_SAMPLING", "0")
    ds = write_dataset(tmp_path / "d.jsonl", 3)
    judge = scripted(_json_only_without_schema)
    rc, s = run_cli(
        tmp_path,
        capsys,
        spec(
            f"so-{mode}",
            ds,
            {"provider": "builtin"},
            # every request the run's judging sends, without the judge exam's
            {DF: {"min_judge_exam": 0.0, "config": {"dimensions": ["gender"], "num_pairs_per_dimension": 2}}},
            judge=judge.conn(structured_output=mode),
            judge_retries=0,
        ),
    )
    bodies = judge.bodies()
    j = q("SELECT status, error, attempts FROM judgements WHERE run_id = ?", s["run_id"])
    notes = q("SELECT code, message FROM run_notes WHERE run_id = ?", s["run_id"])
    with_schema = [b for b in bodies if "response_format" in b]
    if mode == "auto":  # the endpoint check's probe was answered in json_schema (the scripted server answers
        # probes in any form), so the run starts there; the endpoint then refuses each form with a 400 and the run
        # moves on, json_schema -> json_object_schema -> json_object -> prompt, a run note for each move. Only
        # the judgements in flight send a refused form; each asks again at once, at no budget cost (retries 0)
        assert (j.status == "ok").all() and len(bodies) - len(with_schema) == 6
        assert sum(j.attempts) == len(bodies)  # a refused request is counted on its judgement
        rf = with_schema[0]["response_format"]
        assert rf["type"] == "json_schema" and {"decision_1", "attributable_to_axis"} <= set(
            rf["json_schema"]["schema"]["properties"]
        )
        moves = notes[notes.code == "structured_output_fallback"].message
        assert len(moves) == 3 and all("response_format is not supported" in m for m in moves)
        assert {m.split("the run asks it in form ")[1].split()[0] for m in moves} == {
            "json_object_schema",
            "json_object",
            "prompt",
        }
        assert {"json_schema", "json_object"} == {b["response_format"]["type"] for b in with_schema}
    elif mode == "on":  # the endpoint must take it: a refusal is a failed judgement
        assert len(with_schema) == len(bodies) == 6 and (j.status == "judge_failed").all()
        assert j.error.str.contains("HTTP 400").all() and rc == 1
    else:
        assert not with_schema and (j.status == "ok").all()


def test_a_row_past_its_deadline_is_excluded_and_counted_and_the_run_completes(tmp_path, capsys, scripted):
    """The execution manifest's timeout_seconds is a per-row deadline (set lower here with
    limits.row_timeout_seconds): a row whose SUT is slow gets its calls cut at the deadline or
    not sent; those answers are errors on that row, its pairs are excluded as SUT failures, the
    other rows are scored, a run note says how many, and no unsent call is in llm_calls."""
    ds = write_dataset(tmp_path / "d.jsonl", 6)
    slow = {"s": 0.0}

    def sut(body, n):
        text = "I reviewed the application. Decision: approve"
        return Reply(text=text, delay_s=slow["s"] if "Case 1:" in last_user(body) else 0.0)

    server = scripted(sut)
    t0 = time.monotonic()
    for _ in range(3):
        httpx.post(
            f"{server.url}/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "warm"}]},
            timeout=30,
        )
    slow["s"] = unit = max(0.5, 20 * (time.monotonic() - t0) / 3)
    rc, s = run_cli(
        tmp_path,
        capsys,
        spec(
            "slow-row",
            ds,
            server.conn(),
            {DF: {"config": {"sub_call_concurrency_limit": 4, "decision_labels": ["approve", "deny"]}}},
            limits={"row_timeout_seconds": 1.5 * unit},
            min_coverage=0.5,
        ),
    )
    run_id = s["run_id"]
    resp = q("SELECT input_id, status, error FROM sut_responses WHERE run_id = ?", run_id)
    cut = resp[resp.error.fillna("").str.contains("row deadline")]
    assert len(cut) > 0 and set(cut.input_id) == {"r0001"} and (cut.status == "error").all()
    assert (resp[resp.input_id != "r0001"].status == "ok").all()
    j = q("SELECT input_id, status FROM judgements WHERE run_id = ?", run_id)
    assert set(j[j.status != "ok"].input_id) == {"r0001"} and (j[j.input_id != "r0001"].status == "ok").all()
    d = s["metrics"][DF]
    assert d["score"] == 1.0 and d["excluded"] == {"sut_failed": int((j.status != "ok").sum())}
    assert d["coverage"] == pytest.approx(1 - (j.status != "ok").sum() / len(j)) and d["coverage"] < 1
    notes = q("SELECT code, message FROM run_notes WHERE run_id = ?", run_id)
    [msg] = notes[notes.code == "row_deadline"].message
    assert f"{len(cut)} sut call(s)" in msg and "1 row(s)" in msg
    calls = q("SELECT count(*) AS n FROM llm_calls WHERE run_id = ? AND role = 'sut' AND stage = 'sampling'", run_id)
    never_sent = sum("before this call was sent" in e for e in cut.error)
    assert int(calls.n[0]) == len(resp) - never_sent and never_sent > 0
