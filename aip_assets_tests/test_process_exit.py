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


def test_entry_marks_the_process_as_aip_evals_own(tmp_path):
    """``cli.entry`` tells ``aip-eval run`` that the process is its own (``run.OWN_PROCESS``: it
    may pause the cycle collector for its start-up); ``main`` alone, as tests call it, does not."""
    script = textwrap.dedent(
        """
        from aip_assets import cli
        from aip_assets.cli import run

        before = run.OWN_PROCESS
        cli.main = lambda: 40 + 2 * run.OWN_PROCESS + before
        cli.entry()
        """
    )
    p = subprocess.run([sys.executable, "-c", script], env=_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert p.returncode == 42, p.stderr


def _gc_spy(monkeypatch, own: bool) -> tuple[list[tuple[str, bool]], list[int]]:
    """``aip-eval run`` in this process as its own (``own``) or as a test's: what the collector was
    (enabled or not) when the run was registered and when each stage ran, and the calls of
    ``gc.freeze`` (recorded, not made: this process is the test's)."""
    import gc

    from aip_assets import pipeline
    from aip_assets.assets import stages
    from aip_assets.cli import run

    seen: list[tuple[str, bool]] = []
    frozen: list[int] = []
    monkeypatch.setattr(run, "OWN_PROCESS", own)
    monkeypatch.setattr(gc, "freeze", lambda: frozen.append(1))
    register, stage = pipeline.register_run, stages.run_stage

    def registered(*a, **k):
        seen.append(("register", gc.isenabled()))
        return register(*a, **k)

    def staged(*a, **k):
        seen.append(("stage", gc.isenabled()))
        return stage(*a, **k)

    monkeypatch.setattr(pipeline, "register_run", registered)
    monkeypatch.setattr(stages, "run_stage", staged)  # the assets' stage (each Dagster step)
    return seen, frozen


def test_a_run_of_its_own_process_pauses_the_collector_for_its_start_up_only(tmp_path, monkeypatch):
    """In aip-eval's own process the run's start-up (the imports, Dagster's instance, the
    registration) runs with the cycle collector paused; then its objects are frozen once and every
    stage runs with the collector on; it is on when the command returns. As a test's, nothing
    changes: on throughout, nothing frozen."""
    import gc

    from aip_assets.cli import main

    from .test_exit_codes import spec_file

    assert gc.isenabled()
    seen, frozen = _gc_spy(monkeypatch, own=True)
    assert main(["run", str(spec_file(tmp_path, threshold=0.5)), "--quiet"]) == 0
    assert seen[0] == ("register", False)
    stages = [on for what, on in seen if what == "stage"]
    assert len(stages) == 5 and all(stages), seen
    assert frozen == [1] and gc.isenabled()

    seen, frozen = _gc_spy(monkeypatch, own=False)
    assert main(["run", str(spec_file(tmp_path / "b", threshold=0.5)), "--quiet"]) == 0
    assert seen and all(on for _, on in seen) and frozen == []


def test_a_start_up_that_fails_resumes_the_collector(tmp_path, monkeypatch, capsys):
    """A run of aip-eval's own process whose start-up fails (an unreachable SUT: exit 2, nothing
    written) leaves the collector on."""
    import gc

    from aip_assets.cli import main

    from .test_exit_codes import spec_file

    seen, frozen = _gc_spy(monkeypatch, own=True)
    spec = spec_file(tmp_path, sut={"provider": "openai_compatible", "base_url": "http://127.0.0.1:9/v1", "model": "m"})
    assert main(["run", str(spec), "--quiet"]) == 2  # found at the endpoint checks, before any write
    assert seen == [] and gc.isenabled()
