"""What `aip-eval run` says on stderr (issue 38, fault 9): a few lines in words at the default level,
no Python dict, rounded numbers, failures and exclusions counted apart as the summary counts them,
the calls a resumed stage sent (not those it found journaled), the report's path at the end of the
summary; each stage's counts with ``-v``; Dagster's notices about its own API left out."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import warnings
from pathlib import Path

import yaml

from aip_assets import pipeline
from aip_assets.cli import main
from aip_assets.logs import gate_words, stage_words

from .conftest import crash_sampling_after, make_spec, run_all, table, write_dataset

REPO = Path(__file__).resolve().parents[1]
PROGRESS = re.compile(r": \d+/\d+ done, ")  # a slow stage's progress (after 2 s): not part of the budget
LONG_FLOAT = re.compile(r"\d\.\d{5,}")


def _spec(tmp_path: Path) -> Path:
    ds = write_dataset(tmp_path / "in" / "d.jsonl", 4)
    data = {
        "name": "quiet",
        "dataset": str(ds),
        "seed": 3,
        "retry_backoff_seconds": 0.01,
        "batch_rows": 4,
        "sut": {"provider": "builtin", "profile": {"name": "flip", "value": "woman", "axis": "gender", "p": 1.0}},
        "judge": {"provider": "builtin"},
        "metrics": {
            "llm.decision_flip": {
                "threshold": 0.99,
                "baseline_share": 0.0,
                "config": {"dimensions": ["gender"], "num_pairs_per_dimension": 3},
            },
            "llm.semantic_consistency": {"threshold": 0.1},
        },
    }
    path = tmp_path / "in" / "quiet.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _said(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.strip()]


def test_a_small_run_says_little_in_words_and_ends_with_its_report(tmp_path, capsys):
    assert main(["run", str(_spec(tmp_path)), "--run-id", "quiet"]) == 1  # decision flip's gate fails
    out, err = capsys.readouterr()
    lines = [line for line in _said(err) if not PROGRESS.search(line)]
    # two endpoint checks, the registration, per metric its start and its result (and the plan's
    # notes), the failed gate's reason: 10 lines here; 27 before (19 without the progress lines: a
    # line per stage with "gate={'passed': ...}", the gate failure twice)
    assert len(lines) <= 12, "\n".join(lines)
    assert not any("{'" in line or "={" in line for line in _said(err)), err
    assert not any(LONG_FLOAT.search(line) for line in lines), err
    assert any(
        re.search(r"llm\.decision_flip: score \d\.\d{3} \[\d\.\d{3}, \d\.\d{3}\].*gate failed", x) for x in lines
    )
    last = out.rstrip().splitlines()[-1]
    assert last.startswith("Report: ") and last.endswith("quiet.html"), out[-500:]
    assert Path(last.removeprefix("Report: ")).is_file()


def test_verbose_adds_each_stages_counts_in_words(tmp_path, capsys):
    assert main(["run", str(_spec(tmp_path)), "--run-id", "loud", "-v", "--metric", "llm.decision_flip"]) == 1
    err = capsys.readouterr().err
    stages = [
        line for line in _said(err) if re.match(r"\[aip\] (ingest|synthesis|sampling|judging|aggregation): ", line)
    ]
    assert [s.split(":")[0] for s in stages] == [
        f"[aip] {s}" for s in ("ingest", "synthesis", "sampling", "judging", "aggregation")
    ]
    assert not any("{'" in line or "={" in line for line in _said(err)), err
    assert "model calls (tokens " in (sampling := next(s for s in stages if "sampling" in s))
    assert "all sent by this process (0 failed)" in sampling


def test_stage_words_round_and_count_failures_apart_from_exclusions():
    meta = {
        "rows.judgements": 637,
        "rows.llm_calls": 607,
        "failed.judgements": 0,
        "excluded.judgements": 4,
        "calls.network": 2,
        "calls.failed": 0,
        "tokens.prompt": 209450,
        "tokens.completion": 8895,
        "rows.judge_panel": 0,
    }
    words = stage_words("judging", meta)
    assert words.startswith("judging: 637 judgements (0 failed, 4 excluded); ")
    assert "607 model calls (tokens 209,450 in / 8,895 out), 2 of them sent by this process (0 failed)" in words
    assert "judge_panel" not in words
    gate = {
        "passed": False,
        "gate_reason": "gender: ...",
        "coverage": 1.0,
        "excluded": {"unjudgeable": 0},
        "score": 0.9549,
        "ci_low": 0.9498439445861043,
        "ci_high": 0.97,
        "threshold": 0.9,
    }
    assert gate_words(gate) == "score 0.955 [0.950, 0.970], coverage 1.000, threshold 0.900: gate failed"
    assert "{" not in stage_words("aggregation", {"rows.row_scores": 32, "gate": gate, "summary": {"a": 1}})


def test_a_resumed_stage_reports_the_calls_it_sent(tmp_path, monkeypatch):
    ds = write_dataset(tmp_path / "d.jsonl", 6)
    run_all(make_spec(ds, config={"sub_call_concurrency_limit": 1}), "resumed", stages=["ingest", "synthesis"])
    crash_sampling_after(monkeypatch, "resumed", 20)
    meta = pipeline.run_stage("sampling", "resumed", "llm.decision_flip")
    calls = table("llm_calls", "resumed", "created_at").query("stage == 'sampling'")
    assert meta["rows.llm_calls"] == len(calls) > 20
    # the crashed process sent 20 (journaled); this one the rest, and says so (it said all of them)
    assert meta["calls.network"] == len(calls) - 20


def test_the_definitions_load_without_dagsters_notices_about_its_own_api():
    code = "import aip_assets.definitions as d; d.defs.get_repository_def(); print('loaded')"
    done = subprocess.run(
        [sys.executable, "-W", "always", "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and "loaded" in done.stdout, done.stderr
    assert "Warning" not in done.stderr, done.stderr  # was: BetaWarning: Parameter `owners` ...


def test_the_ui_command_leaves_out_dagsters_notices_about_its_own_api():
    from dagster import BetaWarning, SupersessionWarning

    from aip_assets.dagster_cli import NOT_READ, quiet

    dagster_log = logging.getLogger("dagster")
    before = list(dagster_log.filters)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet()
        warnings.warn("Function `dev_command` is superseded", SupersessionWarning, stacklevel=1)
        warnings.warn("Parameter `owners` is currently in beta", BetaWarning, stacklevel=1)
        warnings.warn("one of ours", UserWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["one of ours"]
    try:
        record = dagster_log.makeRecord("dagster", logging.WARNING, __file__, 1, NOT_READ + " (dagster.yaml)", (), None)
        assert not all(f.filter(record) for f in dagster_log.filters)
        other = dagster_log.makeRecord("dagster", logging.INFO, __file__, 1, "Serving dagster-webserver on", (), None)
        assert all(f.filter(other) for f in dagster_log.filters)
    finally:
        dagster_log.filters[:] = before
