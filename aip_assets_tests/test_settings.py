"""The settings object (settings.py): every AIP_* variable, its default, its bad values, and that
nothing configures the project by writing the environment."""

import ast
import json
import os
import re
from pathlib import Path

import pytest

import aip_assets
from aip_assets import settings
from aip_assets import warehouse as wh
from aip_assets.cli import main
from aip_assets.errors import AipError, SettingsError
from aip_assets.settings import Settings, current, override

from .conftest import write_dataset

PACKAGE = Path(aip_assets.__file__).parent

# every variable with the value the code uses when it is not set
DEFAULTS = {
    "AIP_WAREHOUSE": None,
    "AIP_DATA_DIR": None,
    "AIP_RUNS_DIR": None,
    "AIP_LIMITS_DIR": None,
    "AIP_DUCKDB_MEMORY": "1GB",
    "AIP_DUCKDB_WRITE_MEMORY": "256MB",
    "AIP_DUCKDB_LINGER": 0.25,
    "AIP_WAREHOUSE_LOCK_TIMEOUT": 600.0,
    "AIP_JUDGE_DURING_SAMPLING": True,
    "AIP_SHARED_STATE_URL": None,
    "AIP_SHARED_RETRY_SECONDS": 60.0,
    "AIP_LEASE_SECONDS": 30.0,
    "AIP_DEQUEUE_INTERVAL_SECONDS": None,
    "AIP_LAKE_DATA_PATH": None,
    "AIP_S3_ENDPOINT": None,
    "AIP_S3_CREDENTIAL_CHAIN": None,
    "AIP_DAGSTER_STORAGE_URL": None,
    "AIP_CODE_LOCATION": None,
    "AIP_REPORT_PORT": 8112,
    "AIP_DEBUG": False,
}


@pytest.fixture
def bare(monkeypatch):
    """No AIP_* variable set at all."""
    for name in list(os.environ):
        if name.startswith("AIP_"):
            monkeypatch.delenv(name)


def test_every_variable_has_its_default(bare, tmp_path, monkeypatch):
    s = current()
    assert set(settings.VARIABLES) == set(DEFAULTS)
    assert {name: getattr(s, field) for name, field in settings.VARIABLES.items()} == DEFAULTS
    for field in Settings.model_fields.values():  # each documented, with what a value must be
        assert field.description and isinstance(field.json_schema_extra, dict) and field.json_schema_extra["must"]
    # and what reads them gets the same
    from aip_assets.leases import lease_seconds
    from aip_assets.report import report_port
    from aip_assets.run_queue import location_name
    from aip_assets.shared_state import retry_seconds, shared_state_url
    from aip_assets.warehouse import linger, opening

    monkeypatch.chdir(tmp_path)  # no project here: the user's data folder
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert wh.default_path() == tmp_path / "xdg" / "aip-assets" / "warehouse.duckdb"
    assert wh.write_caps() == ["256MB", "1GB"] and opening.duckdb_memory() == "1GB"
    assert opening.lock_timeout_s() == 600 and linger.linger_idle_s() == 0.25
    assert lease_seconds() == 30 and retry_seconds() == 60 and shared_state_url() is None
    assert report_port() == 8112 and location_name() == "aip_assets.definitions"
    assert not wh.lake.enabled()


def test_every_aip_variable_the_code_names_is_a_setting_or_a_marker():
    """A new AIP_* variable read anywhere in the package has its field here (or it is one of the
    markers dagster_home writes beside a value of its own)."""
    named = set()
    for f in PACKAGE.rglob("*.py"):
        named |= set(re.findall(r"\bAIP_[A-Z0-9_]*[A-Z0-9]\b", f.read_text()))
    assert named - set(settings.MARKERS) == set(settings.VARIABLES), named ^ set(settings.VARIABLES)


def test_the_cli_page_documents_every_variable_and_no_other():
    """docs/concepts/cli.md's table of AIP_* variables is the settings object's fields."""
    page = (PACKAGE.parent / "docs" / "concepts" / "cli.md").read_text()
    documented = set(re.findall(r"\bAIP_[A-Z0-9_]*[A-Z0-9]\b", page))
    assert documented == set(settings.VARIABLES), documented ^ set(settings.VARIABLES)


@pytest.mark.parametrize(
    "name, value, message",
    [
        (
            "AIP_SHARED_RETRY_SECONDS",
            "soon",
            "AIP_SHARED_RETRY_SECONDS must be a number of seconds (0 or more), got 'soon'",
        ),
        (
            "AIP_SHARED_RETRY_SECONDS",
            "-1",
            "AIP_SHARED_RETRY_SECONDS must be a number of seconds (0 or more), got '-1'",
        ),
        (
            "AIP_SHARED_RETRY_SECONDS",
            "inf",
            "AIP_SHARED_RETRY_SECONDS must be a number of seconds (0 or more), got 'inf'",
        ),
        ("AIP_LEASE_SECONDS", "0.5", "AIP_LEASE_SECONDS must be a number of seconds of at least 1, got '0.5'"),
        ("AIP_LEASE_SECONDS", "", "AIP_LEASE_SECONDS must be a number of seconds of at least 1, got ''"),
        (
            "AIP_WAREHOUSE_LOCK_TIMEOUT",
            "ten",
            ("AIP_WAREHOUSE_LOCK_TIMEOUT must be a number of seconds (0 or more), got 'ten'"),
        ),
        ("AIP_DUCKDB_LINGER", "-0.1", "AIP_DUCKDB_LINGER must be a number of seconds (0 or more), got '-0.1'"),
        ("AIP_REPORT_PORT", "http", "AIP_REPORT_PORT must be a TCP port (0-65535), got 'http'"),
        ("AIP_REPORT_PORT", "70000", "AIP_REPORT_PORT must be a TCP port (0-65535), got '70000'"),
    ],
)
def test_a_bad_value_is_an_error_naming_the_variable(monkeypatch, capsys, name, value, message):
    monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError) as e:
        current()
    assert str(e.value) == message and isinstance(e.value, AipError)
    assert main(["runs"]) == 2  # bad configuration: said as such by the CLI, nothing written
    assert capsys.readouterr().err == f"error: {message}\n"


@pytest.mark.parametrize(
    "name, value, message",
    [
        (
            "AIP_LAKE_DATA_PATH",
            "gs://bucket/lake",
            (
                "AIP_LAKE_DATA_PATH must be a folder or s3://bucket/prefix (S3 or "
                "S3-compatible storage), got a gs:// URL"
            ),
        ),
        (
            "AIP_LAKE_DATA_PATH",
            "s3:///lake",
            (
                "AIP_LAKE_DATA_PATH must be a folder or s3://bucket/prefix (S3 or "
                "S3-compatible storage), got a s3:// URL without a bucket"
            ),
        ),
        (
            "AIP_S3_ENDPOINT",
            "127.0.0.1:9000",
            ("AIP_S3_ENDPOINT must be http://host:port or https://host, got '127.0.0.1:9000'"),
        ),
    ],
)
def test_a_bad_lake_location_is_said_where_the_lake_is_used(monkeypatch, name, value, message):
    """The lake's folder and S3 endpoint are checked by the lake, as it uses them: everything else
    (a local run, the lake's catalog) still works with them set wrong."""
    monkeypatch.setenv("AIP_LAKE_DATA_PATH", "s3://bucket/lake")
    monkeypatch.setenv(name, value)
    assert getattr(current(), settings.VARIABLES[name]) == value
    with pytest.raises(AipError) as e:
        wh.lake.data_path()
        wh.lake._s3_settings()
    assert str(e.value) == message


def test_two_bad_values_are_both_said(monkeypatch):
    monkeypatch.setenv("AIP_LEASE_SECONDS", "x")
    monkeypatch.setenv("AIP_REPORT_PORT", "y")
    with pytest.raises(
        SettingsError, match="AIP_LEASE_SECONDS must be .*, got 'x'; AIP_REPORT_PORT must be .*, got 'y'"
    ):
        current()


def test_values_read_as_today(monkeypatch):
    """A blank AIP_SHARED_RETRY_SECONDS is its default; an empty AIP_DUCKDB_MEMORY is no cap; any
    non-empty AIP_DEBUG turns it on; an empty path is no path."""
    monkeypatch.setenv("AIP_SHARED_RETRY_SECONDS", "  ")
    monkeypatch.setenv("AIP_DUCKDB_MEMORY", "")
    monkeypatch.setenv("AIP_DEBUG", "0")
    monkeypatch.setenv("AIP_RUNS_DIR", "")
    monkeypatch.setenv("AIP_SHARED_STATE_URL", "postgresql://u:s3cret@db:5432/x")
    s = current()
    assert s.shared_retry_seconds == 60 and s.duckdb_memory == "" and s.debug is True and s.runs_dir is None
    assert wh.write_caps() == ["256MB", None]
    assert "s3cret" not in repr(s) and s.secret("shared_state_url") == "postgresql://u:s3cret@db:5432/x"


def test_the_environment_is_read_when_needed(monkeypatch):
    from aip_assets.warehouse import linger

    monkeypatch.setenv("AIP_DUCKDB_LINGER", "0")
    assert linger.linger_idle_s() == 0
    monkeypatch.setenv("AIP_DUCKDB_LINGER", "1.5")
    assert linger.linger_idle_s() == 1.5
    monkeypatch.delenv("AIP_DUCKDB_LINGER")
    assert linger.linger_idle_s() == 0.25


def test_an_override_holds_within_its_block_and_writes_no_environment(tmp_path, monkeypatch):
    env = os.environ["AIP_WAREHOUSE"]
    with override(warehouse=tmp_path / "a.duckdb"):
        assert wh.default_path() == tmp_path / "a.duckdb"
        with override(warehouse=tmp_path / "b.duckdb"):
            assert wh.default_path() == tmp_path / "b.duckdb"
        assert wh.default_path() == tmp_path / "a.duckdb"
        assert os.environ["AIP_WAREHOUSE"] == env
    assert wh.default_path() == Path(env)
    with pytest.raises(TypeError, match="no such setting: nonsense"), override(nonsense=1):
        pass
    # the lake set aside (a dry run's throwaway warehouse) without touching the variable
    monkeypatch.setenv("AIP_LAKE_DATA_PATH", str(tmp_path / "lake"))
    assert wh.lake.enabled()
    with wh.lake.set_aside():
        assert not wh.lake.enabled() and os.environ["AIP_LAKE_DATA_PATH"] == str(tmp_path / "lake")
    assert wh.lake.enabled()


def test_the_warehouse_resource_chooses_the_file_for_its_run_only(tmp_path):
    from dagster import job, op

    from aip_assets.resources import Warehouse

    seen = []

    @op(required_resource_keys={"warehouse"})
    def where(context) -> None:
        seen.append((wh.default_path(), os.environ["AIP_WAREHOUSE"]))

    @job
    def probe():
        where()

    env = os.environ["AIP_WAREHOUSE"]
    chosen = tmp_path / "chosen" / "w.duckdb"
    assert probe.execute_in_process(resources={"warehouse": Warehouse(path=str(chosen))}).success
    assert probe.execute_in_process(resources={"warehouse": Warehouse()}).success
    assert seen == [(chosen, env), (Path(env), env)]
    assert wh.default_path() == Path(env)  # restored once the run ended


def test_cli_warehouse_reaches_every_worker_without_the_environment(tmp_path, monkeypatch, capsys):
    """`run --warehouse FILE --parallel 2`: both metrics' rows are in FILE (each written by a worker
    process, which gets the file in its run's config), none in $AIP_WAREHOUSE; `sql` and `compare`
    read FILE too; the environment is as it was."""
    ds = write_dataset(tmp_path / "d.jsonl", 3)
    spec = tmp_path / "s.yaml"
    spec.write_text(
        json.dumps(
            {
                "name": "elsewhere",
                "dataset": str(ds),
                "seed": 3,
                "sut": {"provider": "builtin"},
                "metrics": {
                    "llm.decision_flip": {"config": {"dimensions": ["gender"], "num_pairs_per_dimension": 1}},
                    "llm.semantic_consistency": {"config": {"responses_per_query": 2}},
                },
            }
        )
    )
    other = tmp_path / "elsewhere" / "w.duckdb"
    before = {
        k: v for k, v in os.environ.items() if k.startswith("AIP_") and not k.endswith("_SET") and k != "AIP_DATA_DIR"
    }  # the data folder is dagster_home's, written for the workers
    for run_id in ("e-1", "e-2"):
        assert (
            main(
                [
                    "run",
                    str(spec),
                    "--warehouse",
                    str(other),
                    "--run-id",
                    run_id,
                    "--quiet",
                    "--json",
                    "--parallel",
                    "2",
                ]
            )
            == 0
        )
        assert json.loads(capsys.readouterr().out)["warehouse"] == str(other)
    assert {k: v for k, v in os.environ.items() if k in before} == before
    assert not wh.default_path().exists()
    metrics = wh.query("SELECT DISTINCT run_id, metric FROM row_scores ORDER BY 1, 2", path=other)
    assert metrics.values.tolist() == [
        ["e-1", "llm.decision_flip"],
        ["e-1", "llm.semantic_consistency"],
        ["e-2", "llm.decision_flip"],
        ["e-2", "llm.semantic_consistency"],
    ]
    assert main(["sql", "SELECT count(*) AS n FROM eval_runs", "--warehouse", str(other), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"n": 2}]
    assert main(["compare", "e-1", "e-2", "--warehouse", str(other), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["run_b"] == "e-2"
    assert not wh.default_path().exists()


# the environment writes the project keeps: how Dagster itself is configured, in this process and the
# ones it starts (DAGSTER_HOME, the data folder, the storage URL its settings name), with the markers
# saying a value is the project's own
ALLOWED_WRITES = {
    ("dagster_home.py", "del", "'AIP_DATA_DIR'"),
    ("dagster_home.py", "set", "'AIP_DATA_DIR'"),
    ("dagster_home.py", "set", "'AIP_DATA_DIR_SET'"),
    ("dagster_home.py", "set", "STORAGE_URL_ENV"),
    ("dagster_home.py", "set", "STORAGE_URL_ENV + '_SET'"),
    ("dagster_home.py", "set", "'DAGSTER_HOME'"),
    ("dagster_home.py", "set", "'AIP_DAGSTER_HOME_SET'"),
}


def _environ(node: ast.AST) -> bool:
    return ast.unparse(node) in ("os.environ", "environ")


def environment_writes(root: Path) -> set[tuple[str, str, str]]:
    """(file, how, key) of every write of the environment in the package's source."""
    out = set()
    for f in root.rglob("*.py"):
        rel = str(f.relative_to(root))
        for node in ast.walk(ast.parse(f.read_text())):
            targets: list[tuple[str, ast.AST]] = []
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = [("set", t) for t in (node.targets if isinstance(node, ast.Assign) else [node.target])]
            elif isinstance(node, ast.Delete):
                targets = [("del", t) for t in node.targets]
            for how, t in targets:
                if isinstance(t, ast.Subscript) and _environ(t.value):
                    out.add((rel, how, ast.unparse(t.slice)))
            if isinstance(node, ast.Call):
                fn = node.func
                if (
                    isinstance(fn, ast.Attribute)
                    and _environ(fn.value)
                    and fn.attr in ("pop", "update", "setdefault", "clear", "popitem", "__setitem__", "__delitem__")
                ):
                    out.add((rel, fn.attr, ast.unparse(node.args[0]) if node.args else ""))
                if ast.unparse(fn) in ("os.putenv", "os.unsetenv", "putenv", "unsetenv"):
                    out.add((rel, ast.unparse(fn), ast.unparse(node.args[0]) if node.args else ""))
    return out


def test_no_module_writes_the_environment_but_dagster_homes_documented_writes():
    assert environment_writes(PACKAGE) == ALLOWED_WRITES


def test_the_check_sees_every_form_of_write(tmp_path):
    (tmp_path / "m.py").write_text(
        "import os\nos.environ['A'] = '1'\ndel os.environ['B']\nos.environ.pop('C')\n"
        "os.environ.update(D='1')\nos.putenv('E', '1')\nos.environ.setdefault('F', '1')\n"
        "x = os.environ.get('G')\n"
    )
    assert environment_writes(tmp_path) == {
        ("m.py", "set", "'A'"),
        ("m.py", "del", "'B'"),
        ("m.py", "pop", "'C'"),
        ("m.py", "update", ""),
        ("m.py", "os.putenv", "'E'"),
        ("m.py", "setdefault", "'F'"),
    }


def test_a_data_folder_the_user_set_holds_run_after_run(tmp_path, monkeypatch):
    """`aip-eval run` fixes the data folder from the spec's project unless the user set one: the
    user's holds for every run of the process, and one the code found is found again next time."""
    from aip_assets.dagster_home import use_project_of

    project = tmp_path / "proj"
    (project / "runs").mkdir(parents=True)
    (project / "workspace.yaml").write_text("load_from: []\n")
    spec = project / "runs" / "s.yaml"
    monkeypatch.delenv("AIP_DATA_DIR_SET", raising=False)
    monkeypatch.setenv("AIP_DATA_DIR", str(tmp_path / "mine"))
    assert use_project_of(spec) == use_project_of(spec) == (tmp_path / "mine").resolve()
    assert os.environ["AIP_DATA_DIR"] == str(tmp_path / "mine") and "AIP_DATA_DIR_SET" not in os.environ
    monkeypatch.setenv("AIP_DATA_DIR_SET", str(tmp_path / "earlier"))  # an earlier run's, not the user's
    assert use_project_of(spec) == (tmp_path / "mine").resolve()
    monkeypatch.delenv("AIP_DATA_DIR")  # none set: the project's data/, marked ours, found again
    assert use_project_of(spec) == (project / "data").resolve() == Path(os.environ["AIP_DATA_DIR_SET"])
    other = tmp_path / "other" / "runs"
    other.mkdir(parents=True)
    (other.parent / "dagster.yaml").write_text("")
    assert use_project_of(other / "t.yaml") == (other.parent / "data").resolve()
