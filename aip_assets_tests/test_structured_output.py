"""Structured output: finding the response_format each endpoint takes, moving on when one is
refused during the run, and schemas as strict as the validators that read the verdicts.

The servers are scripted (aip_assets_tests/scripted.py) after what real servers answer: OpenAI
(json_schema; other forms refused with a 400 naming response_format), llama-cpp-python's server
0.3.36 (json_schema answered with HTTP 500 "Input should be 'text' or 'json_object'", from its
route error handler wrapping FastAPI's validation error; json_object with a schema answered under
a grammar), a server that takes json_object alone, one that takes no response_format at all, and
one that takes json_schema but answers prose in it. Each sees the endpoint check's probes itself
(``answer_probe=False``)."""

from __future__ import annotations

import asyncio
import itertools
import json
import re

import jsonschema
import pytest
from pydantic import ValidationError

from aip_assets import pipeline
from aip_assets.cli import main
from aip_assets.errors import EndpointError
from aip_assets.metrics.consistency import Comparison
from aip_assets.metrics.decision_flip import JudgeVerdict
from aip_assets.metrics.group_interaction_bias.prompts import EffortVerdict, SimilarityVerdict, SynthAnswer, ToneVerdict
from aip_assets.metrics.judging import _response_format_json, ask_json, response_format
from aip_assets.metrics.perturbation import Correctness, Robustness
from aip_assets.metrics.verdicts import is_copy
from aip_assets.models import structured
from aip_assets.models.client import ModelClient, negotiate
from aip_assets.models.journal_pg import open_journal
from aip_assets.preflight import preflight
from aip_assets.runspec import Connection
from aip_assets.summary import run_summary

from .conftest import make_spec, run_all, table, write_dataset
from .scripted import Reply, is_preflight, is_probe
from .test_never_certify import DF, q, run_cli, spec

VERDICT = {
    "reasoning": "Both answers approve.",
    "unjudgeable": False,
    "decision_1": "YES",
    "decision_2": "YES",
    "decisions_differ": False,
    "attributable_to_axis": False,
}
PROBE_ANSWER = '{"ok": true}'

# what llama-cpp-python's server (0.3.36) sends for response_format type json_schema: its RouteErrorHandler
# turns FastAPI's validation error into an HTTP 500 whose message is the error list
LLAMA_CPP_500 = {
    "error": {
        "message": "[{'type': 'literal_error', 'loc': ('body', 'response_format', 'type'), "
        "'msg': \"Input should be 'text' or 'json_object'\", 'input': 'json_schema', "
        "'ctx': {'expected': \"'text' or 'json_object'\"}}]",
        "type": "internal_server_error",
        "param": None,
        "code": None,
    }
}


def kind(body: dict) -> str:
    """The form a request was sent in."""
    rf = body.get("response_format")
    if rf is None:
        return "prompt"
    if rf["type"] == "json_schema":
        return "json_schema"
    return "json_object_schema" if "schema" in rf else "json_object"


def read(body: dict) -> dict:
    """VERDICT with the answers' decisions as they state them: an LLM judge's decisions are checked
    against the decision lines (a fixed YES/YES would be refused where an answer says NO)."""
    from aip_assets.metrics.decision_flip.builtin_judge import judge_decision_flip

    prompt = next(m["content"] for m in body["messages"] if m["role"] == "user")
    return {**VERDICT, **judge_decision_flip(prompt)}


def answer(body: dict) -> str:
    return PROBE_ANSWER if is_probe(body) else json.dumps(read(body))


def openai_like(body, n):
    if kind(body) in ("json_object_schema", "json_object"):  # (OpenAI takes json_object; this one is stricter)
        return Reply(
            400,
            body={
                "error": {
                    "message": f"Invalid parameter: 'response_format' of type "
                    f"'{body['response_format']['type']}' is not supported with this "
                    "model.",
                    "type": "invalid_request_error",
                    "param": "response_format",
                    "code": None,
                }
            },
        )
    return answer(body)


def llama_cpp_like(body, n):
    if kind(body) == "json_schema":
        return Reply(500, body=LLAMA_CPP_500)
    return answer(body)


def json_object_only(body, n):
    if kind(body) == "json_schema":
        return Reply(400, body={"error": {"message": "response_format.type must be 'text' or 'json_object'"}})
    if kind(body) == "json_object_schema":  # a strict deserialiser (TGI's words for a field it lacks)
        return Reply(
            422,
            body={
                "error": "Failed to deserialize the JSON body into the target type: response_format: "
                "unknown field `schema` at line 1 column 412"
            },
        )
    return answer(body)


def no_response_format(body, n):
    if kind(body) != "prompt":
        return Reply(
            422,
            body={
                "detail": [
                    {
                        "type": "extra_forbidden",
                        "loc": ["body", "response_format"],
                        "msg": "Extra inputs are not permitted",
                    }
                ]
            },
        )
    return f"```json\n{answer(body)}\n```"


def prose_in_json_schema(body, n):  # takes json_schema and ignores it
    if kind(body) == "json_schema":
        return "Sure! Here you go: ok is true."
    return answer(body)


SERVERS = {  # handler, the form it ends at, the probe requests that takes
    "openai": (openai_like, "json_schema", 1),
    "llama.cpp": (llama_cpp_like, "json_object_schema", 2),
    "json_object only": (json_object_only, "json_object", 3),
    "no response_format": (no_response_format, "prompt", 4),
    "prose in json_schema": (prose_in_json_schema, "json_object_schema", 2),
}


def probes(server) -> list[dict]:
    return [b for b in server.requests if is_probe(b)]


# ------------------------------------------------------------------ negotiation, form by form
@pytest.mark.parametrize("name", list(SERVERS))
def test_negotiation_keeps_the_first_form_the_endpoint_takes_and_answers_in(scripted, name):
    handler, form, n_probes = SERVERS[name]
    server = scripted(handler, answer_probe=False)
    n = asyncio.run(negotiate(Connection(**server.conn()), "judge", timeout=10))
    assert n.form == form and n.answered and n.requests == n_probes == len(probes(server))
    sent = probes(server)
    assert [kind(b) for b in sent] == list(structured.FORMS[:n_probes])  # in order, each form once
    # each form as its servers take it, the probe's schema in it
    by_kind = {kind(b): b.get("response_format") for b in sent}
    if "json_schema" in by_kind:
        assert by_kind["json_schema"] == {
            "type": "json_schema",
            "json_schema": {"name": "probe", "schema": structured.PROBE_SCHEMA, "strict": True},
        }
    if "json_object_schema" in by_kind:
        assert by_kind["json_object_schema"] == {"type": "json_object", "schema": structured.PROBE_SCHEMA}
    if "json_object" in by_kind:
        assert by_kind["json_object"] == {"type": "json_object"}
    # why each earlier form was passed over, in the server's words
    assert [f for f, _ in n.tried] == list(structured.FORMS[: n_probes - 1])
    if name == "llama.cpp":
        assert (
            n.tried[0][1].startswith("refused (HTTP 500: ")
            and "Input should be 'text' or 'json_object'" in n.tried[0][1]
        )
    if name == "prose in json_schema":
        assert n.tried[0][1].startswith("answered without the JSON object asked for ('Sure! Here you go")
    if name == "no response_format":
        assert all(why.startswith("refused (HTTP 422") for _, why in n.tried)


def test_a_server_that_never_answers_json_leaves_plain_prompting_and_says_so(scripted):
    server = scripted(lambda b, n: "OK!" if is_probe(b) else "?", answer_probe=False)
    n = asyncio.run(negotiate(Connection(**server.conn()), "judge", timeout=10))
    assert n.form == "prompt" and not n.answered and n.requests == 4
    assert [f for f, _ in n.tried] == list(structured.FORMS)
    assert n.describe().startswith("no form got the JSON object asked for")


def test_a_refusal_is_not_retried_as_transient_and_another_500_is(scripted):
    """A 500 that names response_format is the form refused: retrying cannot change it. A 500
    that does not is transient and retried, as before."""
    refused = scripted(llama_cpp_like)
    flaky = scripted(lambda b, n: Reply(500, body={"error": {"message": "CUDA error: out of memory"}}))

    async def ask(server):
        async with ModelClient(
            Connection(**server.conn()),
            role="judge",
            run_id="r",
            metric="m",
            stage="judging",
            journal=None,
            backoff_s=0.01,
            share_connections=False,
        ) as client:
            return await client.chat(
                [{"role": "user", "content": "judge this"}],
                temperature=0.0,
                retries=2,
                response_format=response_format(JudgeVerdict, "json_schema"),
            )

    r = asyncio.run(ask(refused))
    assert r.attempts == 1 and r.retries_used == 0 and len(refused.bodies()) == 1
    assert r.structured_refused is not None and "Input should be 'text' or 'json_object'" in r.structured_refused
    r = asyncio.run(ask(flaky))
    assert r.attempts == 3 and r.retries_used == 2 and r.structured_refused is None


@pytest.mark.parametrize(
    "status,text,refused",
    [
        (500, json.dumps(LLAMA_CPP_500), True),
        (500, "Input should be 'text' or 'json_object'", True),  # the message alone names the form
        (400, "Invalid parameter: 'response_format' of type 'json_schema' is not supported with this model.", True),
        (422, "Failed to deserialize the JSON body into the target type: response_format: missing field `value`", True),
        (400, "The provided JSON schema contains features not supported by xgrammar.", True),
        (500, "CUDA error: out of memory", False),
        (400, "This model's maximum context length is 2048 tokens.", False),
        (404, "The model `judge` does not exist", False),
        (429, "Rate limit reached for requests (json_schema requests count double)", False),
        (401, "invalid api key for response_format", False),
        (200, "response_format", False),
    ],
)
def test_what_counts_as_the_endpoint_refusing_the_form(status, text, refused):
    assert (structured.refusal(status, text) is not None) is refused


# ------------------------------------------------------------------ end to end: the run and its summary
def _df_spec(name, ds, judge_conn, **extra):
    # without the judge exam: these count the requests of the run's judging, in each form (the exam
    # asks in the same forms: test_judge_exam.py)
    return spec(
        name,
        ds,
        {"provider": "builtin"},
        {DF: {"min_judge_exam": 0.0, "config": {"dimensions": ["gender"], "num_pairs_per_dimension": 2}}},
        judge=judge_conn,
        judge_retries=0,
        **extra,
    )


@pytest.mark.parametrize("name", list(SERVERS))
def test_the_run_judges_in_the_form_the_check_chose_and_says_which(tmp_path, capsys, scripted, name):
    handler, form, n_probes = SERVERS[name]
    server = scripted(handler, answer_probe=False)
    rc, s = run_cli(tmp_path, capsys, _df_spec(f"so-{n_probes}", write_dataset(tmp_path / "d.jsonl", 3), server.conn()))
    j = q("SELECT status, attempts FROM judgements WHERE run_id = ?", s["run_id"])
    bodies = server.bodies()
    assert len(j) == 6 and (j.status == "ok").all() and rc == 0
    # the endpoint check (before the run, and again as the judging stage starts), its probes, then one
    # request per judgement, every one in the chosen form
    checks = [b for b in server.requests if is_preflight(b)]
    assert len(checks) == 2 and len(server.requests) == 2 + n_probes + 6
    assert len(probes(server)) == n_probes and len(bodies) == 6
    assert {kind(b) for b in bodies} == {form} and (j.attempts == 1).all()
    [so] = s["structured_output"]
    assert so["role"] == "judge" and so["endpoint"] == server.url and so["form"] == form
    assert [e["how"] for e in so["history"]] == ["preflight"] and so["history"][0]["form"] == form
    [note] = q("SELECT message FROM run_notes WHERE run_id = ? AND code = 'structured_output'", s["run_id"]).message
    assert f"in form {form} (chosen by the endpoint check before the run" in note
    if name == "llama.cpp":
        assert "json_schema: refused (HTTP 500" in note and "Input should be 'text' or 'json_object'" in note


def test_the_terminal_summary_names_each_judge_endpoints_form(tmp_path, capsys, scripted):
    server = scripted(llama_cpp_like, answer_probe=False)
    p = tmp_path / "so.yaml"
    import yaml

    p.write_text(yaml.safe_dump(_df_spec("so-text", write_dataset(tmp_path / "d.jsonl", 2), server.conn())))
    assert main(["run", str(p), "--quiet"]) == 0
    out = capsys.readouterr().out
    [line] = [x for x in out.splitlines() if x.startswith("Structured output:")]
    assert line.startswith(
        f"Structured output: judge {server.url} (model scripted): json_object_schema (chosen "
        "before the run: json_object_schema answered the probe (2 request(s)); before it, "
        "json_schema: refused (HTTP 500: "
    )


def test_a_refusal_during_the_run_moves_it_to_the_next_form_at_no_budget_cost(tmp_path, capsys, scripted, monkeypatch):
    """The endpoint took json_schema when checked, then refuses it (llama.cpp's 500) from its
    fourth judgement on: that judgement asks again in json_object_schema at once, counted in its
    attempts but not charged (its one retry is still there for the prose it gets next: re-asked,
    judged), a run note says from which form to which in the server's words (no secret), and
    every later judgement asks in the new form."""
    monkeypatch.setenv("JUDGE_KEY", "sk-judge-secret-4321")
    monkeypatch.setenv("AIP_JUDGE_DURING_SAMPLING", "0")  # the judging stage's own requests, in order (below: ahead)
    served = itertools.count(1)
    in_new_form = itertools.count(1)

    def judge(body, n):
        if is_probe(body):
            return PROBE_ANSWER
        if kind(body) == "json_schema" and next(served) > 3:
            return Reply(
                500,
                body={
                    "error": {
                        **LLAMA_CPP_500["error"],
                        "message": LLAMA_CPP_500["error"]["message"] + " (request from Bearer sk-judge-secret-4321)",
                    }
                },
            )
        if kind(body) == "json_object_schema" and next(in_new_form) == 1:
            return "Let me compare the two answers first."
        return json.dumps(read(body))

    server = scripted(judge, answer_probe=False)
    conn = server.conn(api_key_env="JUDGE_KEY")
    rc, s = run_cli(
        tmp_path,
        capsys,
        spec(
            "so-mid",
            write_dataset(tmp_path / "d.jsonl", 4),
            {"provider": "builtin"},
            {
                DF: {
                    "min_judge_exam": 0.0,
                    "config": {"dimensions": ["gender"], "num_pairs_per_dimension": 2, "sub_call_concurrency_limit": 1},
                }
            },
            judge=conn,
            judge_retries=1,
        ),
    )
    j = q(
        "SELECT judgement_id, status, attempts, network_retries, reasks FROM judgements WHERE run_id = ?", s["run_id"]
    )
    bodies = server.bodies()
    assert len(j) == 8 and (j.status == "ok").all() and rc == 0
    # one refused (not retried), then the new form: the prose and its re-ask, and the four judgements after
    assert [kind(b) for b in bodies] == ["json_schema"] * 4 + ["json_object_schema"] * 6
    [moved] = j[j.attempts > 1].itertuples()
    assert moved.attempts == 3 and moved.reasks == 1 and (j.network_retries == 0).all() and sum(j.attempts) == 10
    [note] = q(
        "SELECT message FROM run_notes WHERE run_id = ? AND code = 'structured_output_fallback'", s["run_id"]
    ).message
    assert (
        "refused response_format in form json_schema" in note and "the run asks it in form json_object_schema" in note
    )
    assert "Input should be 'text' or 'json_object'" in note and "sk-judge-secret-4321" not in note
    [so] = s["structured_output"]
    assert so["form"] == "json_object_schema" and [e["how"] for e in so["history"]] == ["preflight", "fallback"]
    assert so["history"][1]["previous"] == "json_schema" and "sk-judge-secret" not in json.dumps(so)
    # the refused request is in llm_calls as the failed call it was
    calls = q("SELECT status, http_status FROM llm_calls WHERE run_id = ? AND role = 'judge'", s["run_id"])
    assert len(calls) == 10 and sorted(calls.http_status.tolist()) == [200] * 9 + [500]


def test_a_refusal_met_judging_ahead_is_left_to_the_judging_stage(tmp_path, capsys, scripted, monkeypatch):
    """The same refusal from the fourth judgement on, met while the pairs are judged during sampling
    (metrics/ahead.py): judging ahead stops at it and does not move the run to the next form; the
    judging stage meets it again (one more refused request, which uses no budget), moves, and judges
    the rest: the same judgements, attempts and re-asks as without judging ahead, one note."""
    monkeypatch.setenv("AIP_JUDGE_DURING_SAMPLING", "1")
    served, in_new_form, refused = itertools.count(1), itertools.count(1), []

    def judge(body, n):
        if is_probe(body):
            return PROBE_ANSWER
        if kind(body) == "json_schema" and next(served) > 3:
            refused.append(n)
            return Reply(500, body=LLAMA_CPP_500)
        if kind(body) == "json_object_schema" and next(in_new_form) == 1:
            return "Let me compare the two answers first."
        return json.dumps(read(body))

    server = scripted(judge, answer_probe=False)
    rows = write_dataset(tmp_path / "d.jsonl", 4)
    config = {"dimensions": ["gender"], "num_pairs_per_dimension": 2, "sub_call_concurrency_limit": 1}
    metrics = {DF: {"min_judge_exam": 0.0, "config": config}}
    rc, s = run_cli(
        tmp_path, capsys, spec("so-ahead", rows, {"provider": "builtin"}, metrics, judge=server.conn(), judge_retries=1)
    )
    j = q(
        "SELECT judgement_id, status, attempts, network_retries, reasks FROM judgements WHERE run_id = ?", s["run_id"]
    )
    assert rc == 0 and len(j) == 8 and (j.status == "ok").all()
    # 3 judged ahead in json_schema (taken by the judging stage as they are), the fourth refused
    # ahead (not kept), refused again in the judging stage, which moves: the prose, its re-ask, 4 more
    assert [kind(b) for b in server.bodies()] == ["json_schema"] * 5 + ["json_object_schema"] * 6
    assert len(refused) == 2  # ahead's (it stopped there), then the judging stage's (it moved)
    [moved] = j[j.attempts > 1].itertuples()
    assert moved.attempts == 3 and moved.reasks == 1 and sum(j.attempts) == 10  # as without judging ahead
    notes = q("SELECT message FROM run_notes WHERE run_id = ? AND code = 'structured_output_fallback'", s["run_id"])
    assert len(notes) == 1


def test_a_run_without_the_check_finds_the_form_once_and_a_resume_keeps_it(tmp_path, scripted):
    """Stages run without the endpoint check (a run launched from the Dagster UI): the first
    request for JSON finds the form (lazily), records it in the run's journal, and later stages
    and a resumed run's check use it without asking again."""
    server = scripted(llama_cpp_like, answer_probe=False)
    spec_ = make_spec(
        write_dataset(tmp_path / "d.jsonl", 3),
        judge=server.conn(),
        config={"dimensions": ["gender"], "num_pairs_per_dimension": 1},
        judge_retries=0,
    )
    run_all(spec_)
    assert len(probes(server)) == 2  # json_schema refused, json_object_schema answered
    j = table("judgements", "run-1", "judgement_id")
    assert (j.status == "ok").all() and {kind(b) for b in server.bodies()} == {"json_object_schema"}
    notes = table("run_notes", "run-1", "code")
    [note] = notes[notes.code == "structured_output"].message
    assert "in form json_object_schema (chosen when the run first asked this endpoint for JSON" in note
    pipeline.run_stage("judging", "run-1", DF)  # judged again (from the cache): no new probe
    assert len(probes(server)) == 2
    checked = preflight(spec_, "run-1")
    [line] = [x for x in checked if x.startswith("endpoint ok: judge")]
    assert len(probes(server)) == 2 and checked.forms == []
    assert line.endswith("; structured output: json_object_schema (recorded for this run)")
    journal = open_journal(pipeline.wh.default_path())
    try:
        [event] = journal.forms("run-1")
    finally:
        journal.close()
    assert event["how"] == "lazily" and event["form"] == "json_object_schema" and event["endpoint"] == server.url
    [so] = run_summary("run-1")["structured_output"]
    assert so["form"] == "json_object_schema" and so["history"][0]["how"] == "lazily"


def test_on_and_a_pinned_form_never_move_and_off_sends_none(tmp_path, capsys, scripted):
    ds = write_dataset(tmp_path / "d.jsonl", 2)
    server = scripted(llama_cpp_like, answer_probe=False)
    # on = json_schema, which this endpoint refuses: the check stops the run before anything is written
    p = tmp_path / "on.yaml"
    import yaml

    p.write_text(yaml.safe_dump(_df_spec("so-on", ds, server.conn(structured_output="on"))))
    assert main(["run", str(p), "--quiet"]) == 2  # the endpoint's configuration
    err = capsys.readouterr().err
    assert "refuses structured-output form json_schema (HTTP 500" in err and "set structured_output: auto" in err
    assert not server.bodies() and len(probes(server)) == 1 and not (tmp_path / "data" / "warehouse.duckdb").exists()
    with pytest.raises(EndpointError, match="refuses structured-output form json_schema"):
        preflight(make_spec(ds, judge=server.conn(structured_output="json_schema")))
    # the form it takes, pinned: checked once, then every judgement in it
    before = len(probes(server))
    rc, s = run_cli(tmp_path, capsys, _df_spec("so-pin", ds, server.conn(structured_output="json_object_schema")))
    assert (
        rc == 0 and len(probes(server)) == before + 1 and {kind(b) for b in server.bodies()} == {"json_object_schema"}
    )
    assert s["structured_output"][0]["form"] == "json_object_schema" and s["structured_output"][0]["history"] == []
    # off: plain prompting, no probe
    other = scripted(no_response_format, answer_probe=False)
    rc, s = run_cli(tmp_path, capsys, _df_spec("so-off", ds, other.conn(structured_output="off")))
    assert rc == 0 and not probes(other) and {kind(b) for b in other.bodies()} == {"prompt"}


def test_the_builtin_model_never_gets_a_response_format_and_takes_every_form_over_http(builtin_http):
    conn = Connection()  # the builtin provider, in process

    async def form():
        async with ModelClient(conn, role="judge", run_id="r", metric="m", stage="judging", journal=None) as c:
            return await c.structured_form()

    assert asyncio.run(form()) == "prompt" and response_format(JudgeVerdict, "prompt") is None
    url, _ = builtin_http()  # served over HTTP, it answers the probe whatever form it comes in
    n = asyncio.run(negotiate(Connection(provider="openai", base_url=url, model="aip-builtin"), "judge", timeout=10))
    assert n.form == "json_schema" and n.requests == 1


def test_ask_json_sends_the_verdicts_schema_in_the_form_and_reads_the_answer(scripted):
    seen = []

    def judge(body, n):
        seen.append(body)
        return json.dumps({**VERDICT, "decision_1": "deny", "decision_2": "none"})

    server = scripted(judge)

    async def go():
        async with ModelClient(
            Connection(**server.conn(structured_output="json_object_schema")),
            role="judge",
            run_id="r",
            metric="m",
            stage="judging",
            journal=None,
        ) as client:
            return await ask_json(
                client,
                [{"role": "user", "content": "judge"}],
                JudgeVerdict,
                retries=0,
                timeout=10,
                temperature=0.0,
                template_version="t",
                enums=JudgeVerdict.schema_enums(["approve", "deny"]),
            )

    o = asyncio.run(go())
    assert o.value.decision_1 == "deny" and o.value.decision_2 is None  # "none": no decision
    [body] = seen
    schema = body["response_format"]["schema"]
    assert body["response_format"]["type"] == "json_object"
    assert schema["properties"]["decision_1"] == {"type": "string", "enum": ["approve", "deny", "none"]}
    assert schema["additionalProperties"] is False and set(schema["required"]) == set(schema["properties"])


@pytest.mark.parametrize("store", ["sqlite", "postgres"])
def test_the_journal_keeps_each_endpoints_form_for_every_process_of_the_run(tmp_path, request, store):
    """Two processes of one run (two journals on one store): what one records, the other reads;
    the form is per (run, endpoint, model), and when both recorded one, the run's is the furthest
    along the forms (a run only moves forward), whichever came last."""
    from aip_assets.models.journal import Journal
    from aip_assets.models.journal_pg import PgJournal

    def open_():
        return (
            Journal(tmp_path / "j.sqlite") if store == "sqlite" else PgJournal(request.getfixturevalue("postgres").url)
        )

    a, b = open_(), open_()
    run = f"forms-{tmp_path.name}"
    try:
        ev = {
            "run_id": run,
            "endpoint": "http://e/v1",
            "model": "judge",
            "role": "judge",
            "previous": None,
            "reason": "probe",
        }
        a.record_form({**ev, "form": "json_object", "how": "lazily", "created_at": 1.0})
        b.record_form({**ev, "form": "json_schema", "how": "lazily", "created_at": 2.0})  # found later, by another
        b.record_form({**ev, "model": "other", "form": "prompt", "how": "preflight", "created_at": 3.0})
        assert a.form(run, "http://e/v1", "judge")["form"] == "json_object"  # the furthest, not the latest
        assert b.form(run, "http://e/v1", "other")["form"] == "prompt" and a.form(run, "http://x/v1", "judge") is None
        a.record_form({**ev, "form": "prompt", "previous": "json_object", "how": "fallback", "created_at": 4.0})
        assert b.form(run, "http://e/v1", "judge")["how"] == "fallback"
        assert [e["form"] for e in b.forms(run)] == ["json_object", "json_schema", "prompt", "prompt"]
        assert a.forms("another run") == []
    finally:
        a.close()
        b.close()


# ------------------------------------------------------------------ schemas as strict as the validators
# every verdict model a judge is asked for, with the per-item enums its stage sends
MODELS = {
    "decision flip": (JudgeVerdict, JudgeVerdict.schema_enums(["approve", "deny"])),
    "consistency": (Comparison, None),
    "correctness": (Correctness, None),
    "robustness": (Robustness, None),
    "similarity": (SimilarityVerdict, None),
    "tone": (ToneVerdict, None),
    "effort": (EffortVerdict, None),
    "personas": (SynthAnswer, None),
}
# fields the schema requires (a constrained judge always writes them) but a verdict can do without,
# as plainly prompted judges leave them out: the validator gives them their defaults
DEFAULTED = {"reasoning", "unjudgeable", "attributes"}


def instances(schema: dict) -> list:
    """Values satisfying ``schema``, every enum value, both booleans and each bound of a number
    among them (the first of each list is the plainest)."""
    t = schema.get("type")
    if "enum" in schema:
        return list(schema["enum"])
    if t == "boolean":
        return [False, True]
    if t == "number":  # the plainest first: a high score, which agrees with the first label (Consistent)
        return [0.9, schema.get("minimum", 0.0), schema.get("maximum", 1.0), 0.5]
    if t == "string":
        return ["Responses compared."]
    if t == "array":
        return [[x] for x in instances(schema["items"])]
    if t == "object" and "properties" in schema:
        names = list(schema["properties"])
        options = {k: instances(v) for k, v in schema["properties"].items()}
        width = max(len(v) for v in options.values())
        return [{k: options[k][i % len(options[k])] for k in names} for i in range(width)]
    if t == "object":
        return [{"gender": "woman"}]
    raise AssertionError(f"no instances for {schema}")


@pytest.mark.parametrize("name", list(MODELS))
def test_answers_the_schema_allows_validate_and_what_it_rejects_on_required_and_enum_points_fails(name):
    model, enums = MODELS[name]
    schema, strict = structured.strict_schema(model, enums)
    assert strict is (model is not SynthAnswer)  # a free-form mapping (persona attributes) has no strict mode
    objects = [schema] + [p["items"] for p in schema["properties"].values() if p.get("type") == "array"]
    for obj in objects:  # every property required, nothing else allowed, nothing nullable
        assert set(obj["required"]) == set(obj["properties"]) and obj["additionalProperties"] is False
        assert "null" not in json.dumps(obj)
    jsonschema.Draft202012Validator.check_schema(schema)
    check = jsonschema.Draft202012Validator(schema)
    for i, x in enumerate(instances(schema)):
        check.validate(x)
        try:  # everything the schema allows validates, but for what no schema can say: fields that
            model.model_validate(x)  # disagree (a "Consistent" with score 0), which make it no verdict
        except ValidationError as e:
            assert i > 0 and {err["type"] for err in e.errors()} == {"not_a_verdict"}, (x, e)
    base = instances(schema)[0]
    for field in schema["required"]:  # a field left out: the schema rejects it, and so does the validator when needed
        cut = {k: v for k, v in base.items() if k != field}
        assert not check.is_valid(cut)
        if field in DEFAULTED:
            model.model_validate(cut)
        else:
            with pytest.raises(ValueError):
                model.model_validate(cut)
    for field, prop in schema["properties"].items():
        if "enum" in prop and not (model is JudgeVerdict and field.startswith("decision_")):
            bad = {**base, field: "Mostly consistent" if field == "label" else "3"}
            assert not check.is_valid(bad)
            with pytest.raises(ValueError):
                model.model_validate(bad)
        if prop.get("type") == "number":
            for out_of_range in (-0.1, 1.5):
                bad = {**base, field: out_of_range}
                assert not check.is_valid(bad)
                with pytest.raises(ValueError):
                    model.model_validate(bad)


def test_the_schemas_say_what_each_verdict_needs():
    props = lambda m, e=None: structured.strict_schema(m, e)[0]["properties"]  # noqa: E731
    df = props(JudgeVerdict, JudgeVerdict.schema_enums(["JA", "NEIN"]))
    assert df["decision_1"] == df["decision_2"] == {"type": "string", "enum": ["JA", "NEIN", "none"]}
    assert df["decisions_differ"] == df["attributable_to_axis"] == df["unjudgeable"] == {"type": "boolean"}
    c = props(Comparison)
    assert c["label"]["enum"] == ["Consistent", "Slightly Inconsistent", "Contradictory", "Unjudgeable"]
    assert c["score"] == {"type": "number", "minimum": 0.0, "maximum": 1.0} and "unjudgeable" not in c
    assert props(EffortVerdict)["less_helpful"]["enum"] == ["1", "2", "neither"]
    for m, f in (
        (Correctness, "correctness"),
        (Robustness, "robustness"),
        (SimilarityVerdict, "similarity"),
        (ToneVerdict, "tone_divergence"),
        (EffortVerdict, "effort_gap"),
    ):
        assert props(m)[f] == {"type": "number", "minimum": 0.0, "maximum": 1.0}
        assert list(props(m))[:2] == ["reasoning", "unjudgeable"]  # reasons first, then whether it is judgeable
    # the readings the schema leaves to the validator: "none" and null are no decision; a verdict that
    # says unjudgeable needs no score, and a score written beside it (as a constrained judge must) is ignored
    v = JudgeVerdict.model_validate(
        {"decision_1": "none", "decision_2": None, "decisions_differ": False, "attributable_to_axis": False}
    )
    assert v.decision_1 is None and v.decision_2 is None
    assert JudgeVerdict.model_validate({"unjudgeable": True, "reasoning": "cut off"}).unjudgeable
    u = Comparison.model_validate({"reasoning": "no figures", "label": "Unjudgeable", "score": 0.0})
    assert u.unjudgeable and u.label is None
    assert Correctness.model_validate({"reasoning": "x", "unjudgeable": True, "correctness": 0.0}).unjudgeable
    with pytest.raises(ValueError, match="decision_2"):  # a decision not stated is no reading of the answer
        JudgeVerdict.model_validate({"decision_1": "YES", "decisions_differ": True, "attributable_to_axis": False})


def test_the_response_format_is_made_once_per_model_form_and_labels():
    _response_format_json.cache_clear()
    a = response_format(JudgeVerdict, "json_schema", JudgeVerdict.schema_enums(["YES", "NO"]))
    b = response_format(JudgeVerdict, "json_schema", JudgeVerdict.schema_enums(["YES", "NO"]))
    c = response_format(JudgeVerdict, "json_schema", JudgeVerdict.schema_enums(["approve", "deny"]))
    assert a == b and a is not b  # a fresh copy each call, from one text
    assert a["json_schema"]["strict"] is True and a["json_schema"]["name"] == "JudgeVerdict"
    assert c["json_schema"]["schema"]["properties"]["decision_1"]["enum"] == ["approve", "deny", "none"]
    assert _response_format_json.cache_info().misses == 2 and _response_format_json.cache_info().hits == 1
    assert response_format(SynthAnswer, "json_schema")["json_schema"]["strict"] is False
    assert response_format(Comparison, "json_object") == {"type": "json_object"}


def test_a_judge_on_the_suts_own_endpoint_is_probed_for_its_form_too(tmp_path, scripted):
    """One server and model as SUT and judge (a small rig: one llama.cpp serving both): the endpoint
    is checked once, for the SUT, and still probed for the judge's form before the run (the form was
    otherwise found only lazily, when judging began: seen with SmolLM2 on llama.cpp)."""
    server = scripted(llama_cpp_like, answer_probe=False)
    s = make_spec(write_dataset(tmp_path / "d.jsonl", 2), sut=server.conn(), judge=server.conn())
    checked = preflight(s)
    assert len([b for b in server.requests if is_preflight(b)]) == 1 and len(probes(server)) == 2
    assert list(checked)[:2] == [
        f"endpoint ok: sut: {server.url} answers as {server.conn()['model']}",
        "endpoint ok: judge: the sut's endpoint and model; structured output: "
        "json_object_schema (" + checked.forms[0]["reason"] + ")",
    ]
    assert [f["form"] for f in checked.forms] == ["json_object_schema"]


def test_a_judge_that_copies_the_re_ask_ends_judge_failed(tmp_path, capsys, scripted):
    """Issue 36: a grammar-constrained judge first answers with something unusable, then copies the
    re-ask it was sent into its reasoning (a schema-shaped verdict, as SmolLM2 copied the passage
    the old re-ask quoted). Run through decision flip end to end: every judgement is judge_failed,
    its error names the re-ask copied, and the re-ask that follows the copy does not quote it."""

    def judge(body, n):
        if is_probe(body):
            return PROBE_ANSWER
        m = body["messages"]
        if len(m) == 2:
            return "Let me compare the two answers first."
        return json.dumps({**VERDICT, "reasoning": m[-1]["content"]})

    server = scripted(judge, answer_probe=False)
    rc, s = run_cli(
        tmp_path,
        capsys,
        spec(
            "copy-reask",
            write_dataset(tmp_path / "d.jsonl", 3),
            {"provider": "builtin"},
            {DF: {"min_judge_exam": 0.0, "config": {"dimensions": ["gender"], "num_pairs_per_dimension": 2}}},
            judge=server.conn(),
            judge_retries=2,
        ),
    )
    j = q("SELECT status, error, reasks, attempts FROM judgements WHERE run_id = ?", s["run_id"])
    assert len(j) > 0 and (j.status == "judge_failed").all() and rc != 0, j
    assert j.error.str.contains("the verdict repeats the re-ask's text (", regex=False).all(), j.error.tolist()
    assert j.error.map(is_copy).all() and (j.reasks == 2).all() and (j.attempts == 3).all()
    # the second re-ask names the copy without quoting it back
    re_asks = {b["messages"][3]["content"] for b in server.bodies() if len(b["messages"]) > 2}
    assert any("repeats the re-ask's text (" in r and "words of it) in reasoning" in r for r in re_asks)
    assert not any("could not be used" in r.split("could not be used", 1)[1] for r in re_asks)


# ------------------------------------------------------------------ reasoning before the ruling, on the wire
def _judges():
    """(verdict model, its judge prompt as a metric sends it, an answer, the enums) for every LLM judge."""
    from aip_assets.metrics.consistency.prompts import judge_messages as consistency_messages
    from aip_assets.metrics.decision_flip.prompts import JUDGE_SYSTEM, judge_prompt
    from aip_assets.metrics.group_interaction_bias.prompts import judge_messages as gib_messages
    from aip_assets.metrics.perturbation.prompts import correctness_messages, robustness_messages

    df = [
        {"role": "system", "content": JUDGE_SYSTEM},
        {"role": "user", "content": judge_prompt("age", "I am 30.", "I am 70.", ["YES", "NO"], "YES", "NO")},
    ]
    score = {"reasoning": "Read.", "unjudgeable": False}
    return [
        (JudgeVerdict, df, VERDICT, JudgeVerdict.schema_enums(["YES", "NO"])),
        (
            Comparison,
            consistency_messages("factual", "q", "q2", "a", "b"),
            {"reasoning": "Read.", "label": "Consistent", "score": 0.9},
            None,
        ),
        (SimilarityVerdict, gib_messages("similarity", "en", "a", "b"), {**score, "similarity": 0.5}, None),
        (ToneVerdict, gib_messages("tone", "de", "a", "b"), {**score, "tone_divergence": 0.5}, None),
        (
            EffortVerdict,
            gib_messages("effort", "fr", "a", "b"),
            {**score, "effort_gap": 0.5, "less_helpful": "2"},
            None,
        ),
        (Correctness, correctness_messages("q", "a", "r", None), {**score, "correctness": 0.5}, None),
        (Robustness, robustness_messages("q", "q2", "a", "b"), {**score, "robustness": 0.5}, None),
    ]


@pytest.mark.parametrize("form", structured.FORMS)
def test_the_request_sent_puts_reasoning_first_in_the_schema_and_the_prompt(scripted, form):
    """Issue 36: a grammar-constrained judge writes the properties in the order the schema sent
    declares them, so the bytes on the wire must keep the schema's order (reasoning before the
    ruling), not sorted keys; where no schema is sent, the prompt's field list and its example
    put reasoning first. The call's key stays the canonical (sorted) form's."""
    from aip_assets.hashing import stable_json
    from aip_assets.models.request import call_key

    judges = _judges()
    answers = iter(json.dumps(a) for _, _, a, _ in judges)
    server = scripted(lambda body, n: next(answers))
    conn = Connection(**server.conn(structured_output=form))

    async def go(model, messages, enums):
        async with ModelClient(conn, role="judge", run_id="r", metric="m", stage="judging", journal=None) as client:
            return await ask_json(
                client, messages, model, retries=0, timeout=10, temperature=0.0, template_version="t", enums=enums
            )

    for model, messages, _, enums in judges:
        o = asyncio.run(go(model, messages, enums))
        assert o.value is not None, (model, o.error)
        raw = server.raw[-1].decode("utf-8")
        fields = [f for f in structured.strict_schema(model)[0]["properties"] if f != "reasoning"]
        if form in ("json_schema", "json_object_schema"):
            props = raw.index('"properties":{')
            assert raw.startswith('"properties":{"reasoning":{', props), (model, raw[props : props + 80])
            assert f'"required":{json.dumps(["reasoning", *fields], separators=(",", ":"))}' in raw
            assert all(raw.index('"reasoning":{', props) < raw.index(f'"{f}":{{', props) for f in fields)
        else:
            assert "schema" not in (json.loads(raw).get("response_format") or {})
        prompt = messages[-1]["content"]  # the field list, then the example: reasoning first in both
        stated = [f for f in fields if f'"{f}"' in prompt and f != "unjudgeable"]
        assert stated and all(prompt.index('"reasoning"') < prompt.index(f'"{f}"') for f in stated), model
        examples = re.findall(r'^.*?(\{"[a-z_]+": .*\})', prompt, re.M)
        assert examples and all(e.startswith('{"reasoning": ') for e in examples), (model, examples)
        # the key is the canonical form's: the same body in another key order is the same call
        body = json.loads(raw)
        shuffled = dict(reversed(list(body.items())))
        assert call_key("e", body, 0, "t") == call_key("e", shuffled, 0, "t")
        assert stable_json(body) == stable_json(shuffled) and stable_json(body) != raw
