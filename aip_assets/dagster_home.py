"""The Dagster instance the CLI shares with `dagster dev`.

`dagster dev` without DAGSTER_HOME reads ``dagster.yaml`` in the working directory, which points
its storage at ``data/dagster_home``. The CLI opens the same storage the same way, so runs and
partitions launched from either appear in both. A DAGSTER_HOME set by the user wins for both.
"""

from __future__ import annotations

import os
from pathlib import Path

from dagster import DagsterInstance
from dagster._core.instance.ref import InstanceRef


def get_instance() -> DagsterInstance:
    if os.environ.get("DAGSTER_HOME"):
        return DagsterInstance.get()
    cwd = Path.cwd()
    home = cwd / "data" / "dagster_home"
    home.mkdir(parents=True, exist_ok=True)
    config_dir = cwd if (cwd / "dagster.yaml").exists() else home
    return DagsterInstance.from_ref(InstanceRef.from_dir(str(home), config_dir=str(config_dir)))
