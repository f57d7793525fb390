"""Ctrl-C and SIGTERM stop `aip-eval run` (aip_assets/interrupts.py): the stage stops with its calls
in flight answered and journaled, no later metric starts, exit 130 with the way to resume, and the
resumed run makes no call twice that had been answered and scores as an uninterrupted run does.

The run is a real `aip-eval run` process; its judge is a scripted loopback server that answers with
the builtin judge's verdicts a little later, so the test interrupts it while it judges, once the
server has seen a given number of judge calls (never after a fixed sleep)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml

from aip_assets import warehouse as wh
from aip_assets.cli import main, print_summary
from aip_assets.dagster_home import get_instance
from aip_assets.models.builtin import JUDGE_TAG, judge_answer
from aip_assets.models.journal import journal_path
from aip_assets.runspec import BuiltinProfile

from .conftest import write_dataset
from .scripted import Reply, ScriptedServer

AIP_EVAL = [sys.executable, "-m", "aip_assets.cli"]
FIRST, SECOND = "llm.semantic_consistency", "llm.factual_consistency"  # in the spec's order
ROWS = 4  # one judge call per row and metric (responses_per_query 2: the base against one variant)
JUDGE = BuiltinProfile()


def kind(body: dict) -> str | None:
    """The metric a judge request is for, from the tag its prompt carries (None: the endpoint check)."""
    m = JUDGE_TAG.search("\n".join(str(m.get("content")) for m in body.get("messages") or []))
    return f"llm.{m.group(1)}" if m else None


def key(body: dict) -> str:
    return json.dumps(body, sort_keys=True)


def judge_server(scripted, pace: dict, hold=lambda k: None) -> ScriptedServer:
    """Answers every judge call with the builtin judge's verdict ``pace["delay_s"]`` later (the
    test sets it to 0 once the interrupted run is over); the k-th judge call (1-based) waits until
    the test sets the event ``hold(k)`` gives (None: it does not wait)."""
    seen = Counter()

    def handler(body, n):
        seen["judge"] += 1
        return Reply(
            text=judge_answer(body["messages"], JUDGE) or "OK", delay_s=pace["delay_s"], hold=hold(seen["judge"])
        )

    return scripted(handler)


def write_spec(tmp_path: Path, judge: ScriptedServer, metrics=(FIRST, SECOND)) -> Path:
    ds = write_dataset(tmp_path / "d.jsonl", ROWS)
    spec = tmp_path / "sig.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "name": "sig",
                "dataset": str(ds),
                "seed": 3,
                "sut": {"provider": "builtin"},
                "judge": judge.conn(),
                # no judge exam: every judge call here is one of the run's, held and counted by the test
                "metrics": {
                    m: {"min_judge_exam": 0.0, "config": {"responses_per_query": 2, "concurrency_limit": 2}}
                    for m in metrics
                },
                "retry_backoff_seconds": 0.01,
                "batch_rows": 4,
            },
            sort_keys=False,
        )
    )
    return spec


def judged(judge: ScriptedServer, metric: str) -> list[dict]:
    return [b for b in judge.bodies() if kind(b) == metric]


def calls(judge: ScriptedServer) -> list[str]:
    """Every judge call the server received (not the endpoint checks), as text, in order."""
    return [key(b) for b in judge.bodies() if kind(b)]


def start(spec: Path, run_id: str, tmp_path: Path, *extra: str) -> tuple[subprocess.Popen, list[str]]:
    """`aip-eval run SPEC --run-id RUN` in its own process; its stderr lines, as they come."""
    proc = subprocess.Popen(
        [*AIP_EVAL, "run", str(spec), "--run-id", run_id, *extra],
        env=dict(os.environ),
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []

    def read():
        for line in proc.stderr:
            lines.append(line.rstrip("\n"))

    threading.Thread(target=read, daemon=True).start()
    return proc, lines


def wait_for(proc: subprocess.Popen, lines: list[str], what: str, cond) -> None:
    """Until ``cond()``; fails if the run ends first (the run paces itself by the server's answers)."""
    while not cond():
        if proc.poll() is not None:
            raise AssertionError(f"the run ended (exit {proc.returncode}) before {what}:\n" + "\n".join(lines))
        time.sleep(0.005)


def journaled(run_id: str, metric: str) -> Counter:
    """The journal's judge calls of ``metric`` by status."""
    with sqlite3.connect(journal_path(wh.default_path())) as con:
        return Counter(
            dict(
                con.execute(
                    "SELECT status, count(*) FROM call_index WHERE run_id = ? AND metric = ? AND stage = 'judging' "
                    "GROUP BY status",
                    [run_id, metric],
                ).fetchall()
            )
        )


def rows(table: str, run_id: str, metric: str) -> int:
    return int(
        wh.query(
            f"SELECT count(*) AS n FROM {table} WHERE run_id = ? AND metric = ?", [run_id, metric], read_only=True
        )["n"][0]
    )


def scores(run_id: str, metric: str):
    return wh.query(
        "SELECT scope, group_key, score, ci_low, ci_high, n FROM metric_scores WHERE run_id = ? AND "
        "metric = ? ORDER BY scope, group_key",
        [run_id, metric],
        read_only=True,
    )


def verdicts(run_id: str, metric: str):
    return wh.query(
        "SELECT judgement_id, status, label, score FROM judgements WHERE run_id = ? AND metric = ? "
        "ORDER BY judgement_id",
        [run_id, metric],
        read_only=True,
    )


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_one_signal_stops_the_run_mid_judging_and_the_resume_repeats_no_answered_call(
    tmp_path, scripted, capsys, signum
):
    pace = {"delay_s": 0.3}
    judge = judge_server(scripted, pace)
    spec = write_spec(tmp_path, judge)
    proc, lines = start(spec, "cut", tmp_path)
    wait_for(proc, lines, "judging began", lambda: len(judged(judge, FIRST)) >= 2)
    proc.send_signal(signum)
    assert proc.wait(timeout=300) == 130, "\n".join(lines)
    assert f"interrupted; resume with `aip-eval run {spec} --run-id cut`" in lines, "\n".join(lines)
    assert not any("internal error" in x or "stage failed" in x for x in lines), "\n".join(lines)

    sent = judged(judge, FIRST)
    assert 2 <= len(sent) < ROWS  # stopped mid-judging
    # every judge call that reached the server was answered and journaled: none was abandoned
    assert journaled("cut", FIRST) == Counter({"ok": len(sent)})
    # the stopped stage wrote nothing; the stages before it stand; the next metric never started
    assert rows("judgements", "cut", FIRST) == 0 and rows("sut_responses", "cut", FIRST) == 2 * ROWS  # base and variant
    assert judged(judge, SECOND) == [] and rows("dataset_rows", "cut", SECOND) == 0
    runs = {
        r.tags["aip/metric"]: r.status.value for r in get_instance().get_runs() if r.tags.get("aip/run_id") == "cut"
    }
    assert runs == {FIRST: "CANCELED"}  # the UI's Runs list says so
    if signum == signal.SIGTERM:
        return

    before = calls(judge)
    pace["delay_s"] = 0.0
    assert main(["run", str(spec), "--run-id", "cut", "--json", "--quiet"]) in (0, 1)
    resumed = calls(judge)[len(before) :]
    assert set(resumed).isdisjoint(before)  # no call answered before the stop was made again
    assert Counter(kind(json.loads(b)) for b in before + resumed) == {FIRST: ROWS, SECOND: ROWS}
    cut = json.loads(capsys.readouterr().out)
    assert set(cut["metrics"]) == {FIRST, SECOND} and cut["failed_metrics"] == []

    n = len(calls(judge))  # the interrupted metric, never interrupted:
    assert main(["run", str(spec), "--run-id", "clean", "--metric", FIRST, "--quiet"]) in (0, 1)
    clean = calls(judge)[n:]
    assert Counter(clean) == Counter(b for b in before + resumed if kind(json.loads(b)) == FIRST)  # each once
    assert scores("cut", FIRST).equals(scores("clean", FIRST)) and len(scores("clean", FIRST))
    assert verdicts("cut", FIRST).equals(verdicts("clean", FIRST)) and len(verdicts("clean", FIRST)) == ROWS


def test_a_second_signal_abandons_the_calls_in_flight_and_the_resume_makes_them_again(tmp_path, scripted, request):
    """The first judge call is not answered: the first Ctrl-C waits for it, the second abandons
    it. It had no answer, so the journal has no record of it and the resume asks it again; every
    other call that was answered is not made again."""
    hold = threading.Event()
    request.addfinalizer(hold.set)  # the held answer goes (to nobody) before the server stops
    pace = {"delay_s": 0.2}
    judge = judge_server(scripted, pace, hold=lambda k: hold if k == 1 else None)
    spec = write_spec(tmp_path, judge)
    proc, lines = start(spec, "twice", tmp_path)
    wait_for(proc, lines, "judging began", lambda: len(judged(judge, FIRST)) >= 3)
    proc.send_signal(signal.SIGINT)
    wait_for(proc, lines, "the first signal was taken", lambda: any("interrupted (SIGINT)" in x for x in lines))
    wait_for(
        proc,
        lines,
        "the fast calls in flight were answered",
        lambda: journaled("twice", FIRST)["ok"] == len(judged(judge, FIRST)) - 1,
    )
    assert proc.poll() is None  # still waiting for the slow call
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=300) == 130, "\n".join(lines)
    assert any("abandoning the calls in flight" in x for x in lines)
    assert f"interrupted; resume with `aip-eval run {spec} --run-id twice`" in lines, "\n".join(lines)
    slow = key(judged(judge, FIRST)[0])
    assert journaled("twice", FIRST) == Counter({"ok": len(judged(judge, FIRST)) - 1})  # the slow one: no record
    assert judged(judge, SECOND) == []

    before = calls(judge)
    pace["delay_s"] = 0.0
    assert main(["run", str(spec), "--run-id", "twice", "--metric", FIRST, "--quiet"]) in (0, 1)
    resumed = calls(judge)[len(before) :]
    assert set(resumed) & set(before) == {slow}  # asked again: it had no answer
    assert len(resumed) == ROWS - len(before) + 1 and rows("judgements", "twice", FIRST) == ROWS


def test_with_parallel_the_workers_stop_and_no_other_metric_starts(tmp_path, scripted, request):
    """`--parallel 2` with three metrics: the workers are in their own process group, and the
    parent passes the signal on (a terminal's Ctrl-C reaches the parent alone, as here). Every
    judge call is held until both workers took the signal: their calls in flight are then
    answered and journaled, and the third metric never starts."""
    third = "llm.safety_consistency"
    gate = threading.Event()
    request.addfinalizer(gate.set)
    judge = judge_server(scripted, {"delay_s": 0.0}, hold=lambda k: gate)
    spec = write_spec(tmp_path, judge, metrics=(FIRST, SECOND, third))
    proc, lines = start(spec, "par", tmp_path, "--parallel", "2")
    wait_for(proc, lines, "both metrics judge", lambda: len(judged(judge, FIRST)) == len(judged(judge, SECOND)) == 2)
    proc.send_signal(signal.SIGINT)
    wait_for(proc, lines, "both workers took the signal", lambda: sum("interrupted (SIGINT)" in x for x in lines) == 2)
    gate.set()
    assert proc.wait(timeout=300) == 130, "\n".join(lines)
    assert f"interrupted; resume with `aip-eval run {spec} --run-id par`" in lines, "\n".join(lines)
    for m in (FIRST, SECOND):
        assert len(judged(judge, m)) == 2 and journaled("par", m) == Counter({"ok": 2}), m
        assert rows("judgements", "par", m) == 0
    assert judged(judge, third) == [] and rows("dataset_rows", "par", third) == 0


def test_a_signal_ends_a_retry_wait_at_once(tmp_path, scripted):
    """A call waiting out a Retry-After is not retried after a Ctrl-C, and the stage stops (in
    process: the signal comes from a thread once the server has answered the first 503)."""
    from aip_assets import pipeline
    from aip_assets.runspec import load_spec

    judge = scripted(lambda body, n: Reply(status=503, headers={"Retry-After": "300"}))
    spec = write_spec(tmp_path, judge)
    pipeline.register_run(load_spec(spec), "wait")
    for stage in ("ingest", "synthesis", "sampling"):
        pipeline.run_stage(stage, "wait", FIRST)

    done = threading.Event()

    def interrupt():  # a judge call is sent only inside the stage, where its handler is the run's
        while len(judged(judge, FIRST)) < 1:
            time.sleep(0.005)
        os.kill(os.getpid(), signal.SIGINT)
        if not done.wait(120):  # a hang guard, not a timing: a wait the signal did not end lasts 300 s
            os.kill(os.getpid(), signal.SIGINT)  # the second abandons it: the match below fails

    threading.Thread(target=interrupt, daemon=True).start()
    try:
        with pytest.raises(KeyboardInterrupt, match="nothing of the stage is written"):
            pipeline.run_stage("judging", "wait", FIRST)
    finally:
        done.set()
    assert len(judged(judge, FIRST)) <= 2  # the calls in flight (concurrency 2), none retried
    assert rows("judgements", "wait", FIRST) == 0


def test_metric_reports_only_the_metrics_asked_for(tmp_path, capsys):
    """`--metric X`: the summary and --json hold X alone, not the spec's other metrics as "not aggregated"."""
    ds = write_dataset(tmp_path / "d.jsonl", 3)
    spec = tmp_path / "two.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "name": "two",
                "dataset": str(ds),
                "seed": 3,
                "sut": {"provider": "builtin"},
                "metrics": {
                    FIRST: {"config": {"responses_per_query": 2}},
                    SECOND: {"config": {"responses_per_query": 2}},
                },
            }
        )
    )
    assert main(["run", str(spec), "--run-id", "one", "--metric", SECOND, "--json", "--quiet"]) in (0, 1)
    out = json.loads(capsys.readouterr().out)
    assert list(out["metrics"]) == [SECOND] and out["metrics"][SECOND]["score"] is not None
    print_summary(out)  # what the command prints without --json
    text = capsys.readouterr().out
    assert f"\n{SECOND}  score" in text and FIRST not in text and "not aggregated" not in text
