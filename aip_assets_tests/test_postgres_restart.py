"""Shared mode through a restart of its Postgres (issue 26.3): Dagster's storage, the call journal,
the shared state and the lake's catalog all live in the database an operator restarts.

A server of this module's own (aip_assets_tests/pg.py), so stopping it disturbs no other test.
The SUT is the builtin model behind the scripted server; the restart comes while the sampling
stage is under way, with answers held until the database is down, so the journal writes of the
calls they complete meet it away (and Dagster's kept connections all die with the restart)."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
import yaml

from aip_assets import warehouse as wh
from aip_assets.cli import main
from aip_assets.models.builtin import handle_chat
from aip_assets.runspec import BuiltinProfile

from .conftest import throwaway_postgres, write_dataset
from .scripted import Reply, is_preflight, is_probe
from .test_pipeline import FLIP, _assert_same, _stable

PASSWORD = "s3cret-pw-26"  # trust authentication: the server never asks for it, the URL carries it anyway


@pytest.fixture(scope="module")
def own_postgres():
    """A server of this module's own: stopping it disturbs no other test."""
    yield from throwaway_postgres()


@pytest.fixture
def shared(own_postgres, tmp_path, monkeypatch):
    """Shared mode on a fresh database of the module's server, its URL with a password; returns
    (the URL, the database as messages name it)."""
    import psycopg

    name = f"restart_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(own_postgres.url, autocommit=True) as con:
        con.execute(f"CREATE DATABASE {name}")
    url = f"postgresql://aip:{PASSWORD}@127.0.0.1:{own_postgres.port}/{name}"
    monkeypatch.setenv("AIP_SHARED_STATE_URL", url)
    monkeypatch.setenv("AIP_LAKE_DATA_PATH", str(tmp_path / "lake"))
    yield url, f"postgresql://aip@127.0.0.1:{own_postgres.port}/{name}"
    wh.release()


class Outage:
    """The builtin model (flip profile) behind a scripted server. Once armed, the ``at``-th
    sampling request starts ``act`` in a thread; that request and every later one are answered
    only once ``act`` has stopped the database (``down`` set), so calls complete while it is away."""

    def __init__(self, scripted, at: int = 8):
        profile = BuiltinProfile.model_validate(FLIP)
        self.at, self.armed, self.seen = at, False, 0
        self.down = threading.Event()
        self.act: threading.Thread | None = None
        self.calls = {"calm": 0, "armed": 0, "after_down": 0}

        def handler(body, n):
            reply = Reply(body=handle_chat(body, profile), delay_s=0.02)
            if is_preflight(body) or is_probe(body):
                return reply
            if not self.armed:
                self.calls["calm"] += 1
                return reply
            self.calls["armed"] += 1
            if self.down.is_set():
                self.calls["after_down"] += 1
            if self.calls["armed"] == self.at:
                self.act.start()
            if self.calls["armed"] >= self.at:
                reply.hold = self.down
            return reply

        self.server = scripted(handler)

    def arm(self, act) -> None:
        def run():
            act(self.down)

        self.act = threading.Thread(target=run, daemon=True)
        self.armed = True

    def finish(self) -> None:
        """Wait for ``act`` to end, if it started (the database is then as it left it)."""
        if self.act is not None and self.act.ident is not None:
            self.act.join(120)


def spec_file(tmp_path, url: str):
    ds = write_dataset(tmp_path / "d.jsonl", 4)
    data = {
        "name": "restart",
        "dataset": str(ds),
        "seed": 3,
        "retry_backoff_seconds": 0.01,
        "batch_rows": 4,
        "sut": {"provider": "openai", "base_url": url, "model": "m", "max_connections": 2},
        "judge": {"provider": "builtin"},
        "metrics": {
            "llm.decision_flip": {
                "baseline_share": 0.0,
                "config": {"dimensions": ["gender"], "num_pairs_per_dimension": 2},
            }
        },
    }
    path = tmp_path / "specs" / "restart.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_restart_of_postgres_mid_sampling_is_ridden_out_to_the_same_scores(
    tmp_path, shared, own_postgres, scripted, monkeypatch, capsys
):
    """Postgres stops while the sampling stage runs (calls completing meanwhile) and is back a
    second later, within AIP_SHARED_RETRY_SECONDS: the run waits for it, says so, and ends as
    the same run without a restart does (its exit code, every stable table equal), having asked
    the endpoint for no call twice."""
    monkeypatch.setenv("AIP_SHARED_RETRY_SECONDS", "60")
    sut = Outage(scripted)
    spec = spec_file(tmp_path, sut.server.url)
    calm = main(["run", str(spec), "--run-id", "calm", "--quiet"])
    assert calm in (0, 1), capsys.readouterr().err
    capsys.readouterr()

    def restart(down: threading.Event) -> None:
        own_postgres.down()
        down.set()  # the held answers go out: their calls complete and are journaled with the database away
        time.sleep(1.0)
        own_postgres.up()

    sut.arm(restart)
    try:
        code = main(["run", str(spec), "--run-id", "bumpy"])
    finally:
        sut.finish()
    out, err = capsys.readouterr()
    assert sut.act is not None and not sut.act.is_alive() and sut.down.is_set()  # the restart happened, and ended
    assert code == calm, err[-3000:]
    assert "the database answers again" in err, err[-3000:]
    assert sut.calls["after_down"] > 0  # sampling went on after the database went down
    assert sut.calls["armed"] == sut.calls["calm"]  # no call made twice
    _assert_same(_stable("calm"), _stable("bumpy"))
    assert PASSWORD not in out + err


def test_postgres_down_past_the_wait_stops_the_run_with_exit_5_and_how_to_resume(
    tmp_path, shared, own_postgres, scripted, monkeypatch, capsys
):
    """Postgres stops mid-sampling and stays down past a short AIP_SHARED_RETRY_SECONDS: exit 5,
    one error naming the database (never the password) and what failed, with the command that
    resumes the run; no word of a bug. Once the database is back, this process uses it again (it
    had given up on it: a later wait is not skipped for ever)."""
    url, named = shared
    monkeypatch.setenv("AIP_SHARED_RETRY_SECONDS", "2")
    sut = Outage(scripted)
    spec = spec_file(tmp_path, sut.server.url)

    def stop(down: threading.Event) -> None:
        own_postgres.down()
        down.set()

    sut.arm(stop)
    try:
        code = main(["run", str(spec), "--run-id", "down-1"])
        out, err = capsys.readouterr()
    finally:
        sut.finish()
        own_postgres.up()
    assert code == 5, err[-3000:]
    errors = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1, err[-3000:]
    msg = errors[0]
    assert named in msg and "AIP_SHARED_RETRY_SECONDS" in msg and "failed" in msg, msg
    assert f"resume with `aip-eval run {spec} --run-id down-1`" in msg, msg
    assert PASSWORD not in out + err
    assert "bug" not in err and "report it" not in err and "internal error" not in err, err[-3000:]
    assert not (tmp_path / "data" / "errors").exists()  # no traceback saved: not a bug

    from aip_assets.shared_state import SharedDb

    assert SharedDb.get(url).run("a statement after the outage", lambda c: c.execute("SELECT 1").fetchone()) == (1,)
