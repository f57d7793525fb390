"""`aip-eval`'s exit codes (errors.EXIT_*, the table of docs/concepts/exit-codes.md): each produced once
by `aip_assets.cli.main`, and the docs' table listing exactly those codes, each with its meaning.

Local mode, the builtin model, four rows: each run takes a few seconds."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import yaml

from aip_assets import errors
from aip_assets import warehouse as wh
from aip_assets.cli import main
from aip_assets.models.builtin import handle_chat
from aip_assets.runspec import BuiltinProfile

from .conftest import write_dataset
from .scripted import Reply, is_preflight, is_probe
from .test_warehouse_lock import LOCK_HOLDER, hold

EXIT_CODES_PAGE = Path(__file__).resolve().parents[1] / "docs" / "concepts" / "exit-codes.md"
# the words each code's row begins with (issue 26's table); the constants come from errors.py
MEANINGS = {
    "EXIT_PASSED": "passed",
    "EXIT_GATE_FAILED": "gate failed",
    "EXIT_BAD_INPUT": "bad input or configuration",
    "EXIT_INTERNAL": "internal error",
    "EXIT_LIMIT": "stopped at a limit",
    "EXIT_OPERATIONAL": "operational failure",
    "EXIT_INTERRUPTED": "interrupted",
}
FLIP_ALL = {"name": "flip", "value": "woman", "axis": "gender", "p": 1.0}  # every pair with a woman flips


def spec_file(tmp_path: Path, sut: dict | None = None, threshold: float | None = None, **extra) -> Path:
    ds = write_dataset(tmp_path / "in" / "d.jsonl", 4)
    metric = {"baseline_share": 0.0, "config": {"dimensions": ["gender"], "num_pairs_per_dimension": 3}}
    if threshold is not None:
        metric["threshold"] = threshold
    data = {
        "name": "codes",
        "dataset": str(ds),
        "seed": 3,
        "retry_backoff_seconds": 0.01,
        "batch_rows": 4,
        "sut": sut or {"provider": "builtin"},
        "judge": {"provider": "builtin"},
        "metrics": {"llm.decision_flip": metric},
        **extra,
    }
    path = tmp_path / "in" / "codes.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def exit_codes() -> dict[str, int]:
    return {name: getattr(errors, name) for name in dir(errors) if name.startswith("EXIT_")}


def test_the_docs_table_lists_exactly_the_exit_codes_with_their_meanings():
    """The docs' exit-code table: one row per errors.EXIT_* constant (its code, its name, a
    meaning that begins with the words the code stands for), and no other row."""
    text = EXIT_CODES_PAGE.read_text()
    head = text.index("# Exit codes")
    rows = re.findall(r"^\| `(\d+)` \| `(EXIT_[A-Z_]+)` \| (.+?) \|$", text[head : head + 4000], re.M)
    codes = exit_codes()
    assert sorted((name, int(code)) for code, name, _ in rows) == sorted(codes.items()), rows
    assert set(MEANINGS) == set(codes)
    for code, name, meaning in rows:
        assert meaning.lower().startswith(MEANINGS[name]), (code, meaning)
    meaning = {name: m.lower() for _, name, m in rows}
    assert "nothing written" in meaning["EXIT_BAD_INPUT"] and "errors/" in meaning["EXIT_INTERNAL"]
    assert all("resumable" in meaning[n] for n in ("EXIT_LIMIT", "EXIT_OPERATIONAL", "EXIT_INTERRUPTED"))
    assert len(set(codes.values())) == len(codes)


def test_exit_0_every_gate_passed(tmp_path, capsys):
    assert main(["run", str(spec_file(tmp_path, threshold=0.5)), "--quiet"]) == errors.EXIT_PASSED
    assert "PASS" in capsys.readouterr().out


def test_exit_1_a_gate_failed_with_its_tables_written(tmp_path, capsys):
    spec = spec_file(tmp_path, sut={"provider": "builtin", "profile": FLIP_ALL}, threshold=0.99)
    assert main(["run", str(spec), "--run-id", "below", "--quiet"]) == errors.EXIT_GATE_FAILED
    out, err = capsys.readouterr()
    assert "FAIL" in out and "gate failed" in err and "internal error" not in err
    n = wh.query("SELECT count(*) AS n FROM metric_scores WHERE run_id = 'below'", read_only=True).n[0]
    assert n > 0  # written: a failed gate is a result


def test_exit_2_bad_input_writes_nothing(tmp_path, capsys):
    spec = spec_file(tmp_path)
    data = yaml.safe_load(spec.read_text())
    data["metrics"]["llm.decision_flip"]["config"]["num_pairs_per_dimension"] = 99  # out of bounds
    spec.write_text(yaml.safe_dump(data))
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert main(["run", str(spec), "--quiet"]) == errors.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "num_pairs_per_dimension" in err
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_exit_3_a_bug_in_a_stage_saves_its_traceback(tmp_path, capsys, monkeypatch):
    from aip_assets.metrics import get_metric

    metric = type(get_metric("llm.decision_flip"))

    def broken(self, ctx):
        raise ZeroDivisionError("an injected bug in aggregation")

    monkeypatch.setattr(metric, "aggregate", broken)
    assert main(["run", str(spec_file(tmp_path)), "--run-id", "buggy", "--quiet"]) == errors.EXIT_INTERNAL
    err = capsys.readouterr().err
    saved = re.search(r"the traceback is saved in (\S+);", err)
    assert saved, err
    where = Path(saved.group(1))
    assert where.is_file() and where.parent == tmp_path / "data" / "errors"
    text = where.read_text()
    assert "ZeroDivisionError" in text and "an injected bug in aggregation" in text and "broken" in text


def test_exit_4_the_run_stopped_at_its_call_cap(tmp_path, capsys):
    spec = spec_file(tmp_path)
    assert main(["run", str(spec), "--run-id", "capped", "--max-calls", "3", "--quiet"]) == errors.EXIT_LIMIT
    err = capsys.readouterr().err
    assert f"resume with `aip-eval run {spec} --run-id capped`" in err and "internal error" not in err


def test_exit_5_a_warehouse_lock_not_released_in_time(tmp_path, capsys, monkeypatch):
    """Another process holds the warehouse lock past AIP_WAREHOUSE_LOCK_TIMEOUT: exit 5, naming
    the holder, the file, the wait and the variable; not a bug."""
    with wh.connect(create=True):
        pass
    wh.release()
    holder = hold(LOCK_HOLDER)
    try:
        monkeypatch.setenv("AIP_WAREHOUSE_LOCK_TIMEOUT", "0.5")
        assert main(["runs"]) == errors.EXIT_OPERATIONAL
    finally:
        holder.kill()
        holder.wait(30)
    err = capsys.readouterr().err
    assert f"held by pid {holder.pid} (aip-eval sql)" in err and f"{wh.default_path()}.lock" in err, err
    assert "AIP_WAREHOUSE_LOCK_TIMEOUT" in err and "waited 0.5s" in err, err
    assert "bug" not in err and "report it" not in err


def test_exit_130_interrupted(tmp_path, capsys, scripted):
    """A SIGINT to the process while the SUT answers: exit 130, with the way to resume."""
    profile = BuiltinProfile()
    sent = []

    def handler(body, n):
        if not (is_preflight(body) or is_probe(body)) and not sent:
            sent.append(n)
            os.kill(os.getpid(), signal.SIGINT)  # as a terminal's Ctrl-C, while the run samples
        return Reply(body=handle_chat(body, profile), delay_s=0.05)

    server = scripted(handler)
    spec = spec_file(tmp_path, sut=server.conn())
    assert main(["run", str(spec), "--run-id", "stopped", "--quiet"]) == errors.EXIT_INTERRUPTED
    assert sent and f"interrupted; resume with `aip-eval run {spec} --run-id stopped`" in capsys.readouterr().err
