"""The command's way out (``cli.entry``): after ``main``, the threads that are not daemons are
joined, the exit handlers run and the output is flushed, then the process ends at once with
main's code, skipping the interpreter's teardown (0.75 s of a small run, issue 39)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DAGSTER_HOME", "AIP_WAREHOUSE")}
    return {**env, "AIP_DATA_DIR": str(tmp_path / "data"), "PYTHONPATH": str(REPO)}


def test_the_command_and_python_m_both_go_through_entry():
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["aip-eval"] == "aip_assets.cli:entry"
    assert "entry()" in (REPO / "aip_assets" / "cli" / "__main__.py").read_text()


def test_entry_joins_threads_runs_exit_handlers_and_flushes_before_it_exits_with_mains_code(tmp_path):
    """A thread still working when main returns finishes; a thread pool left idle does not hold the
    exit (its worker is told to stop, as at a normal exit); an exit handler runs; what was printed
    without a newline (still in the buffer) is out; the code is main's (7), not 0."""
    done, handled = tmp_path / "thread-done", tmp_path / "handler-ran"
    script = textwrap.dedent(
        f"""
        import atexit, concurrent.futures, threading, time
        from aip_assets import cli

        def main():
            threading.Thread(target=lambda: (time.sleep(0.3), open({str(done)!r}, "w").write("1"))).start()
            pool = concurrent.futures.ThreadPoolExecutor(1)  # its idle worker, never shut down, must not hold the exit
            pool.submit(time.sleep, 0.01).result()
            atexit.register(lambda: open({str(handled)!r}, "w").write("1"))
            print("no newline yet", end="")
            return 7

        cli.main = main
        cli.entry()
        print("never reached")
        """
    )
    p = subprocess.run([sys.executable, "-c", script], env=_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert p.returncode == 7, p.stderr
    assert p.stdout == "no newline yet"
    assert done.read_text() == "1" and handled.read_text() == "1"


def test_a_run_ends_with_its_output_whole_and_no_database_left_unclosed(tmp_path):
    """``python -m aip_assets.cli run``: the JSON summary is whole, the exit code is the gate's,
    and no SQLite or DuckDB log is left beside a database (the exit handlers closed them all);
    a second command reads the run."""
    env = _env(tmp_path)
    cmd = [sys.executable, "-m", "aip_assets.cli", "run", str(REPO / "data/runs/demo.yaml")]
    p = subprocess.run(
        [*cmd, "--metric", "llm.decision_flip", "--json", "--quiet"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    summary = json.loads(p.stdout)
    passed = summary["metrics"]["llm.decision_flip"]["passed"]
    assert p.returncode == (0 if passed else 1), p.stderr
    left = [f for f in (tmp_path / "data").rglob("*") if f.name.endswith(("-wal", ".wal", "-shm", "-journal"))]
    assert not left
    q = subprocess.run(
        [sys.executable, "-m", "aip_assets.cli", "sql", "SELECT count(*) AS n FROM eval_runs", "--format", "json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert q.returncode == 0 and json.loads(q.stdout)[0]["n"] == 1, q.stderr
