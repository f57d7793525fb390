"""Faults an operator meets (issue 38, faults 12-15): a damaged warehouse file, a full disk, a
dataset path that loops, duplicate keys in a spec, bad numbers on the command line, two workers
making Dagster's storage at once, a byte order mark, a run id with a control character. Each is
said with the file (and row, field or key) and what to do, with its exit code; none is a bug."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import duckdb
import pytest

from aip_assets import errors
from aip_assets import warehouse as wh
from aip_assets.cli import main

from .test_exit_codes import spec_file


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------ fault 12: a damaged warehouse
def _damage(path: Path, how: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if how == "zero bytes":
        path.write_bytes(b"")
    elif how == "garbage header":
        path.write_bytes(b"not a database at all\n" * 500)
    else:  # truncated: a real warehouse with a table of some size, cut short
        con = duckdb.connect(str(path))
        con.execute("CREATE TABLE t AS SELECT range AS i, repeat('x', 100) AS s FROM range(100000)")
        con.close()
        os.truncate(path, path.stat().st_size // 2)


@pytest.mark.parametrize("how", ["zero bytes", "garbage header", "truncated"])
@pytest.mark.parametrize("argv", [["runs"], ["report", "some-run"], ["sql", "SELECT 1"]])
def test_a_damaged_warehouse_is_named_with_what_to_do(tmp_path, capsys, how, argv):
    """Exit 2 (not 3, "a bug"), naming the file and what to do; the file is left as it was."""
    path = wh.default_path()
    _damage(path, how)
    before = path.read_bytes()
    assert main(argv) == errors.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}: the warehouse file is damaged"), err
    assert f"mv {path} {path}.damaged" in err and "restore it from a backup" in err
    assert "internal error" not in err and "please report" not in err
    assert path.read_bytes() == before


def test_a_run_on_a_damaged_warehouse_is_named_with_what_to_do(tmp_path, capsys):
    path = wh.default_path()
    _damage(path, "garbage header")
    assert main(["run", str(spec_file(tmp_path)), "--quiet"]) == errors.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert f"error: {path}: the warehouse file is damaged" in err and "internal error" not in err


# ------------------------------------------------------------------ fault 12: a full disk
def _enospc(filename: str) -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), filename)


def test_a_full_disk_before_a_run_leaves_no_temporary_file(tmp_path, capsys, monkeypatch):
    """The disk fills while Dagster's settings are written: exit 5 naming the file, saying to free
    space and run again; no half-written ``.dagster.yaml.<pid>`` is left behind."""
    real = Path.write_text

    def full(self, text, *a, **k):
        if self.name.startswith(".dagster.yaml."):
            real(self, text[:10], *a, **k)  # a part written, then the disk is full
            raise _enospc(str(self))
        return real(self, text, *a, **k)

    monkeypatch.setattr(Path, "write_text", full)
    assert main(["run", str(spec_file(tmp_path)), "--quiet"]) == errors.EXIT_OPERATIONAL
    err = capsys.readouterr().err
    home = tmp_path / "data" / "dagster_home"
    assert f"no space left on the disk of {home / 'dagster.yaml'}" in err, err
    assert "free space" in err and "run the same command again" in err and "internal error" not in err
    assert not list(home.glob(".dagster.yaml.*"))


def test_a_full_disk_during_a_run_says_how_to_resume(tmp_path, capsys, monkeypatch):
    """A stage's write meets a full disk (DuckDB's error): exit 5 (not 3), naming the file, saying
    to free space, and how to resume."""
    spec = spec_file(tmp_path)

    def full(*a, **k):
        raise duckdb.IOException(f'IO Error: Could not write file "{wh.default_path()}.wal": No space left on device')

    monkeypatch.setattr(wh, "write_partition_files", full)
    assert main(["run", str(spec), "--run-id", "full", "--quiet"]) == errors.EXIT_OPERATIONAL
    err = capsys.readouterr().err
    assert f"no space left on the disk of {wh.default_path()}.wal" in err, err
    assert "free space" in err and f"resume with `aip-eval run {spec} --run-id full`" in err
    assert "internal error" not in err and "a bug" not in err


# ------------------------------------------------------------------ fault 12: a dataset path that loops
@pytest.mark.parametrize("relative", [True, False])
def test_a_dataset_path_that_loops_is_named(tmp_path, capsys, relative):
    spec = spec_file(tmp_path)
    loop = tmp_path / "in" / "loop.jsonl"
    os.symlink(tmp_path / "in" / "loop2.jsonl", loop)
    os.symlink(loop, tmp_path / "in" / "loop2.jsonl")
    spec.write_text(spec.read_text().replace(str(tmp_path / "in" / "d.jsonl"), "loop.jsonl" if relative else str(loop)))
    before = tree(tmp_path)
    assert main(["run", str(spec), "--quiet"]) == errors.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.startswith(f"error: {spec}: dataset: ") and "loop.jsonl is a symbolic link that loops" in err, err
    assert tree(tmp_path) == before


# ------------------------------------------------------------------ fault 13: duplicate keys, bad numbers
SPEC_WITH = {  # the spec's text, the key given twice, its lines (first, second)
    "metric": (
        "name: dup\ndataset: {ds}\nmetrics:\n  llm.decision_flip:\n    threshold: 0.9\n"
        "  llm.decision_flip:\n    threshold: 0.1\n",
        "llm.decision_flip",
        (4, 6),
    ),
    "config": (
        "name: dup\ndataset: {ds}\nmetrics:\n  llm.decision_flip:\n    config: {{}}\n"
        "    threshold: 0.9\n    config: {{num_pairs_per_dimension: 2}}\n",
        "config",
        (5, 7),
    ),
    "top level": ("name: dup\nseed: 3\ndataset: {ds}\nseed: 4\nmetrics: {{llm.decision_flip: {{}}}}\n", "seed", (2, 4)),
    "flow mapping": (
        "name: dup\ndataset: {ds}\nmetrics: {{llm.decision_flip: {{}}, llm.decision_flip: {{}}}}\n",
        "llm.decision_flip",
        (3, 3),
    ),
}


@pytest.mark.parametrize("where", list(SPEC_WITH))
def test_a_key_given_twice_in_a_spec_is_refused(tmp_path, capsys, where):
    """YAML keeps the last of two equal keys silently: a metric listed twice would run with its
    second entry alone. Refused, naming the file, the key and both lines; nothing written."""
    text, key, (first, second) = SPEC_WITH[where]
    spec = spec_file(tmp_path)
    spec.write_text(text.format(ds=tmp_path / "in" / "d.jsonl"))
    before = tree(tmp_path)
    assert main(["run", str(spec), "--quiet"]) == errors.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.startswith(
        f"error: {spec}: line {second}: key {key!r} is given twice in one mapping (first on line {first})"
    ), err
    assert tree(tmp_path) == before


def test_a_key_overriding_a_merged_one_is_not_a_duplicate(tmp_path):
    from aip_assets.runspec import load_yaml

    p = tmp_path / "m.yaml"
    p.write_text("base: &b {threshold: 0.7, weight: 1}\nmetric: {<<: *b, threshold: 0.8}\n")
    assert load_yaml(p)["metric"] == {"threshold": 0.8, "weight": 1}


@pytest.mark.parametrize("flag", ["--max-calls", "--max-tokens", "--parallel"])
@pytest.mark.parametrize("value", ["-5", "0"])
def test_bad_numbers_on_the_command_line_are_refused_before_anything_is_written(tmp_path, capsys, flag, value):
    spec = spec_file(tmp_path)
    before = tree(tmp_path)
    assert main(["run", str(spec), flag, value, "--quiet"]) == errors.EXIT_BAD_INPUT
    assert capsys.readouterr().err.strip() == f"error: {flag} must be at least 1, got {value}"
    assert tree(tmp_path) == before


# ------------------------------------------------------------------ fault 14: two workers, a new folder
FIRST_USE = r"""
import sys, time
from dagster._core.storage.runs.schema import RunStorageSqlMetadata
from sqlalchemy import inspect

real = RunStorageSqlMetadata.create_all


def slow_create_all(bind, **kw):  # Dagster's check-then-create, its window held open a moment
    missing = [t for t in RunStorageSqlMetadata.sorted_tables if t.name not in inspect(bind).get_table_names()]
    time.sleep(0.5)
    real(bind, tables=missing, checkfirst=False)


RunStorageSqlMetadata.create_all = slow_create_all
from aip_assets.dagster_home import get_instance
from aip_assets.errors import AipError

import os, pathlib

barrier = pathlib.Path(sys.argv[1])  # both imported, then both open the instance
(barrier / str(os.getpid())).touch()
while len(list(barrier.iterdir())) < 2:
    time.sleep(0.001)
try:
    get_instance()
except AipError as e:
    print(e)
    sys.exit(2)
"""


def test_two_workers_make_a_new_folders_dagster_storage_once(tmp_path):
    """Two processes opening the Dagster instance of a data folder never used before, at once (as
    two workers starting one new run id do): both succeed. Without the lock each found the tables
    missing and made them, and the slower failed: "table runs already exists"."""
    import subprocess
    import sys

    for attempt in range(2):
        env = {**os.environ, "AIP_DATA_DIR": str(tmp_path / f"fresh-{attempt}" / "data")}
        env.pop("AIP_WAREHOUSE", None)
        barrier = tmp_path / f"barrier-{attempt}"
        barrier.mkdir()
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", FIRST_USE, str(barrier)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
            for _ in range(2)
        ]
        outs = [p.communicate(timeout=120)[0].decode() for p in procs]
        assert [p.returncode for p in procs] == [0, 0], outs


# ------------------------------------------------------------------ fault 15: size, progress, BOM, run ids
def test_a_pair_of_5_mb_prompts_is_marked_comparing_only_what_a_cell_shows(monkeypatch):
    """The previews mark the words that differ between a pair's prompts. Compared whole (difflib,
    quadratic at worst), two 5 MB prompts held an aggregation's previews past 300 s; only what a
    cell can show is compared now, whatever the prompts' size, and it is marked as before."""
    import difflib

    from aip_assets.assets import tables

    compared: list[int] = []
    real = difflib.SequenceMatcher

    class Counting(real):  # type: ignore[misc,valid-type]
        def __init__(self, isjunk=None, a="", b="", autojunk=True):
            compared.append(max(len(a), len(b)))
            if compared[-1] > 2 * tables.PROMPT_CELL:
                raise AssertionError(f"compared {compared[-1]} words, more than a cell shows")
            super().__init__(isjunk, a, b, autojunk)

    monkeypatch.setattr(difflib, "SequenceMatcher", Counting)
    body = " ".join(f"word{i % 97} clause{i % 13}" for i in range(400_000))  # about 5 MB
    assert len(body) > 5_000_000
    a, b = tables.mark_differences("As a woman, " + body, "As a man, " + body)
    assert a.startswith("As a **woman,** word0 clause0") and b.startswith("As a **man,** word0 clause0")
    assert a.endswith("…") and len(a) < 2 * tables.PROMPT_CELL
    assert tables.mark_differences("a b c", "a x c") == ("a **b** c", "a **x** c")  # short: compared whole
    assert compared and max(compared) <= 2 * tables.PROMPT_CELL


def test_a_long_aggregation_says_what_it_is_doing(tmp_path, monkeypatch, caplog):
    """An aggregation has no calls to count: while it takes long it says what it is doing and for
    how long (every HEARTBEAT_S seconds; here made short, and the aggregation waits for the word)."""
    import logging
    import threading

    from aip_assets.metrics import get_metric, running

    from .conftest import make_spec, run_all, write_dataset

    monkeypatch.setattr(running, "HEARTBEAT_S", 0.01)
    said = threading.Event()

    class Listen(logging.Handler):
        def emit(self, record):
            if "so far" in record.getMessage():
                said.set()

    listener = Listen()
    logging.getLogger("aip_assets").addHandler(listener)
    metric = type(get_metric("llm.decision_flip"))
    real = metric.aggregate

    def slow(self, ctx):
        said.wait(60)  # a long aggregation: long enough for the heartbeat to speak
        yield from real(self, ctx)

    monkeypatch.setattr(metric, "aggregate", slow)
    caplog.set_level(logging.INFO, logger="aip_assets")
    try:
        run_all(make_spec(write_dataset(tmp_path / "d.jsonl", 2)), "beat")
    finally:
        logging.getLogger("aip_assets").removeHandler(listener)
    assert said.is_set()
    beats = [r.getMessage() for r in caplog.records if "so far" in r.getMessage()]
    assert beats[0].startswith("aggregation [beat × llm.decision_flip]: scoring"), beats


@pytest.mark.parametrize("kind", ["jsonl", "csv"])
def test_a_dataset_with_a_byte_order_mark_is_read(tmp_path, kind):
    from aip_assets.dataset import load_dataset

    path = tmp_path / f"bom.{kind}"
    if kind == "jsonl":
        text = '{"input_id": "a", "prompt": "Should it be approved?", "task_type": "single_turn_llm"}\n'
    else:
        text = "input_id,prompt,task_type\na,Should it be approved?,single_turn_llm\n"
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())
    rows = load_dataset(path)
    assert [(r.input_id, r.prompt) for r in rows] == [("a", "Should it be approved?")]


@pytest.mark.parametrize("run_id", ["bad\nid", "tab\there", "nul\x00", "zero\u200bwidth", "bidi\u202eid"])
def test_a_run_id_with_a_control_character_is_refused_before_anything_is_written(tmp_path, capsys, run_id):
    from aip_assets import pipeline

    from .conftest import make_spec, write_dataset

    spec = spec_file(tmp_path)
    before = tree(tmp_path)
    assert main(["run", str(spec), "--run-id", run_id, "--quiet"]) == errors.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.startswith(f"error: --run-id {run_id!r}: must not contain control or invisible characters"), err
    assert tree(tmp_path) == before
    with pytest.raises(errors.SpecError, match="run id .*must not contain control"):  # any way a run is registered
        pipeline.register_run(make_spec(write_dataset(tmp_path / "d2.jsonl", 2)), run_id)
