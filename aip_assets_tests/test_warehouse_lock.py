"""A warehouse held by another process past AIP_WAREHOUSE_LOCK_TIMEOUT (issue 26.5): an operational
failure (exit 5) that names the holder, the file, the wait and the variable, and says how to
resume; never "internal error ... report it". The wait is the module's constant (read when
aip_assets.warehouse is imported), patched small here."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import yaml

from aip_assets import warehouse as wh
from aip_assets.cli import main
from aip_assets.models.builtin import handle_chat
from aip_assets.runspec import BuiltinProfile

from .conftest import write_dataset
from .scripted import Reply, is_preflight, is_probe

LOCK_HOLDER = textwrap.dedent("""
    import sys, time
    sys.argv = ["aip-eval", "sql"]  # what the lock file says of its holder
    from aip_assets import warehouse as wh
    from aip_assets.warehouse import opening
    with opening._file_lock(wh.default_path()):
        print("held", flush=True)
        time.sleep(600)
""")
# a program outside aip-eval (the DuckDB CLI, a notebook): it opens the file itself, no lock file
FILE_HOLDER = textwrap.dedent("""
    import sys, time, duckdb
    con = duckdb.connect(sys.argv[1])
    print("held", flush=True)
    time.sleep(600)
""")


def hold(code: str, *args: str) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True, env=dict(os.environ))
    assert p.stdout.readline().strip() == "held"
    return p


def test_a_lock_held_by_another_process_stops_a_stage_with_exit_5(tmp_path, scripted, monkeypatch, capsys):
    """While the run samples, `aip-eval sql` (as its lock file says) takes the warehouse lock and
    keeps it: the sampling stage's write gives up after the wait, and the run exits 5 with the
    holder, the lock file, the wait, the variable and the resume command."""
    profile = BuiltinProfile()
    held = threading.Event()
    holder: list[subprocess.Popen] = []
    taker = threading.Thread(target=lambda: (holder.append(hold(LOCK_HOLDER)), held.set()), daemon=True)

    def handler(body, n):
        reply = Reply(body=handle_chat(body, profile))
        if not (is_preflight(body) or is_probe(body)):
            if taker.ident is None:  # the first sampling call: the other process takes the lock
                taker.start()
            reply.hold = held  # every answer waits until it holds it
        return reply

    server = scripted(handler)
    ds = write_dataset(tmp_path / "d.jsonl", 4)
    spec = tmp_path / "lock.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "name": "lock",
                "dataset": str(ds),
                "seed": 3,
                "retry_backoff_seconds": 0.01,
                "sut": server.conn(),
                "judge": {"provider": "builtin"},
                "metrics": {"llm.decision_flip": {"config": {"dimensions": ["gender"], "num_pairs_per_dimension": 2}}},
            }
        )
    )
    monkeypatch.setenv("AIP_WAREHOUSE_LOCK_TIMEOUT", "0.5")
    try:
        code = main(["run", str(spec), "--run-id", "locked"])
    finally:
        taker.join(60)
        for p in holder:
            p.kill()
            p.wait(30)
    err = capsys.readouterr().err
    assert code == 5, err[-3000:]
    assert holder and held.is_set()
    stage = next(ln for ln in err.splitlines() if "llm.decision_flip: stopped by a failure outside aip-eval" in ln)
    assert f"{wh.default_path()}.lock), held by pid {holder[0].pid} (aip-eval sql)" in stage, stage
    assert "waited 0.5s" in stage and "AIP_WAREHOUSE_LOCK_TIMEOUT" in stage, stage
    assert f"resume with `aip-eval run {spec} --run-id locked`" in err
    assert "internal error" not in err and "bug" not in err and "report it" not in err, err[-3000:]
    assert not (tmp_path / "data" / "errors").exists()


def test_a_warehouse_file_held_open_outside_aip_eval_is_exit_5(tmp_path, monkeypatch, capsys):
    """A program outside aip-eval keeps the DuckDB file open (it takes no lock file): the wait
    for it ends in exit 5, naming the file, the program's process (DuckDB's own words), the
    wait and the variable."""
    with wh.connect(create=True):
        pass
    wh.release()
    holder = hold(FILE_HOLDER, str(wh.default_path()))
    monkeypatch.setenv("AIP_WAREHOUSE_LOCK_TIMEOUT", "0.5")
    try:
        assert main(["runs"]) == 5
    finally:
        holder.kill()
        holder.wait(30)
    err = capsys.readouterr().err
    assert err.startswith(
        f"error: {wh.default_path()}: waited 0.5s for the file, held open by a program outside aip-eval"
    ), err
    assert f"PID {holder.pid}" in err and "AIP_WAREHOUSE_LOCK_TIMEOUT" in err, err
    assert "internal error" not in err and "report it" not in err
    assert main(["runs"]) == 0  # and the file is used again once the program lets it go
