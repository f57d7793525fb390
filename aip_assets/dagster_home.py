"""Where the project keeps its data, and the Dagster instance the CLI shares with `dagster dev`.

The data folder holds the warehouse, its call journal, reports and Dagster's storage
(``dagster_home``). It is, first found:
1. ``$AIP_DATA_DIR``;
2. ``data/`` in the project root: the nearest folder, from the spec's folder (``aip-eval run
   SPEC``) or else the working directory upwards, that holds ``workspace.yaml`` or
   ``dagster.yaml`` (this repository, or a user's own Dagster project);
3. a user-level default, ``$XDG_DATA_HOME/aip-assets`` (``~/.local/share/aip-assets``).
So the CLI never creates a stray ``data/`` folder in whatever directory it is started from.

``$AIP_WAREHOUSE`` (or ``--warehouse``) still picks the warehouse file, and ``$DAGSTER_HOME``
Dagster's storage; a DAGSTER_HOME set by the user wins for the CLI and `dagster dev` alike.
`dagster dev` in the project root reads ``dagster.yaml`` there, which points its storage at
``data/dagster_home``; the CLI opens that same storage, so runs launched from either show in both.
"""

from __future__ import annotations

import os
from pathlib import Path

MARKERS = ("workspace.yaml", "dagster.yaml")
# The specs' execution manifests allow 8 executions of one metric at once. Every evaluation run
# covers one (run, metric) partition, so at most 8 queued runs at once keeps that bound for every
# metric (stricter: 8 in all). A per-metric run-queue limit would need a run tag that carries the
# metric, and runs launched from the asset graph in the UI carry only `dagster/partition`.
MAX_CONCURRENCY = 8


def project_root(start: str | Path | None = None) -> Path | None:
    """The nearest folder from ``start`` (or the working directory) upwards with a project marker."""
    here = Path(start or Path.cwd()).resolve()
    if here.is_file():
        here = here.parent
    for d in (here, *here.parents):
        if any((d / m).is_file() for m in MARKERS):
            return d
    return None


def user_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "aip-assets"


def data_dir(start: str | Path | None = None) -> Path:
    """The data folder (see the module's docstring); nothing is created here."""
    if os.environ.get("AIP_DATA_DIR"):
        return Path(os.environ["AIP_DATA_DIR"]).resolve()
    root = project_root(start)
    return root / "data" if root is not None else user_data_dir()


def use_project_of(spec_path: str | Path) -> Path:
    """Fix the data folder for this process from the spec's project (``AIP_DATA_DIR``), so every
    stage, check and report of the run finds the same warehouse and Dagster storage."""
    if os.environ.get("AIP_DATA_DIR") and os.environ["AIP_DATA_DIR"] == os.environ.get("AIP_DATA_DIR_SET"):
        del os.environ["AIP_DATA_DIR"]  # set by an earlier run in this process, not by the user: find it again
    d = data_dir(Path(spec_path).resolve().parent)
    os.environ["AIP_DATA_DIR"] = os.environ["AIP_DATA_DIR_SET"] = str(d)
    return d


def instance_settings(home: Path) -> str:
    """``dagster.yaml`` for ``home``: the layout of the project's own dagster.yaml (storage under
    ``home/storage``), with absolute paths, so it holds from any working directory. The storage is
    spelled out as the three SQLite storages ``storage: sqlite`` makes, in the same folders, with
    the event log and run storage faster (dagster_storage.py) when this Dagster allows."""
    from .dagster_storage import FAST, FAST_RUNS

    h = home.resolve()
    st = h / "storage"
    if FAST or FAST_RUNS:
        runs = ("module: aip_assets.dagster_storage\n  class: EngineKeepingSqliteRunStorage" if FAST_RUNS
                else "module: dagster._core.storage.runs\n  class: SqliteRunStorage")
        events = ("module: aip_assets.dagster_storage\n  class: EngineKeepingSqliteEventLogStorage" if FAST
                  else "module: dagster._core.storage.event_log\n  class: SqliteEventLogStorage")
        storage = (f"run_storage:\n  {runs}\n  config:\n    base_dir: {st / 'history'}\n"
                   f"event_log_storage:\n  {events}\n  config:\n    base_dir: {st / 'history' / 'runs'}\n"
                   f"schedule_storage:\n  module: dagster._core.storage.schedules\n  class: SqliteScheduleStorage\n"
                   f"  config:\n    base_dir: {st / 'schedules'}\n")
    else:
        storage = f"storage:\n  sqlite:\n    base_dir: {st}\n"
    return (f"# written by aip-assets for the CLI: the same storage as the project's dagster.yaml\n"
            f"{storage}"
            f"local_artifact_storage:\n  module: dagster._core.storage.root\n  class: LocalArtifactStorage\n"
            f"  config:\n    base_dir: {h}\n"
            f"compute_logs:\n  module: dagster._core.storage.local_compute_log_manager\n"
            f"  class: LocalComputeLogManager\n  config:\n    base_dir: {h / 'compute_logs'}\n"
            f"telemetry:\n  enabled: false\n"
            f"run_coordinator:\n  module: dagster._core.run_coordinator\n  class: QueuedRunCoordinator\n"
            f"concurrency:\n  runs:\n    max_concurrent_runs: {MAX_CONCURRENCY}\n")


def get_instance():
    """The project's Dagster instance (public API only): ``$DAGSTER_HOME`` when the user set it,
    else ``data/dagster_home`` with the settings above, used as this process's DAGSTER_HOME."""
    from dagster import DagsterInstance

    if os.environ.get("DAGSTER_HOME") and os.environ.get("AIP_DAGSTER_HOME_SET") != os.environ["DAGSTER_HOME"]:
        return DagsterInstance.get()  # the user's
    home = (data_dir() / "dagster_home").resolve()  # DAGSTER_HOME must be absolute
    home.mkdir(parents=True, exist_ok=True)
    settings = home / "dagster.yaml"
    text = instance_settings(home)
    if not settings.exists() or settings.read_text() != text:  # whole or not at all: another process may read it
        tmp = settings.with_name(f".dagster.yaml.{os.getpid()}")
        tmp.write_text(text)
        os.replace(tmp, settings)
    # DagsterInstance.get() reads $DAGSTER_HOME; remember that we set it (the data folder may change
    # within one process, e.g. between tests, and then so does the home)
    os.environ["DAGSTER_HOME"] = os.environ["AIP_DAGSTER_HOME_SET"] = str(home)
    return DagsterInstance.get()
