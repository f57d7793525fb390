"""A run launcher for the daemon test (issue 14): every run in a process of its own, in a working
folder of its own, as a Kubernetes pod runs it.

It starts the command ``K8sRunLauncher`` gives a run pod, ``dagster api execute_run`` with the
run's code origin, in a fresh folder under ``root`` whose ``data/`` is the run's data folder
(``AIP_DATA_DIR``), with rate schedules of its own (``AIP_LIMITS_DIR``), so nothing on local disk is
shared between runs: what they share goes through
Postgres and the lake, as on separate machines. It reports the run worker's health (alive, or
exited), so Dagster's run monitoring marks a run whose process was killed as failed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from dagster import Field, StringSource
from dagster._core.launcher import CheckRunHealthResult, LaunchRunContext, RunLauncher, WorkerStatus
from dagster._grpc.types import ExecuteRunArgs
from dagster._serdes import ConfigurableClass, ConfigurableClassData


class PodLikeRunLauncher(RunLauncher, ConfigurableClass):
    def __init__(self, root: str, inst_data: ConfigurableClassData | None = None):
        self.root = Path(root)
        self._inst_data = inst_data
        super().__init__()

    @property
    def inst_data(self):
        return self._inst_data

    @classmethod
    def config_type(cls):
        return {"root": Field(StringSource)}

    @classmethod
    def from_config_value(cls, inst_data, config_value):
        return cls(inst_data=inst_data, **config_value)

    def _folder(self, run_id: str) -> Path:
        return self.root / run_id

    def launch_run(self, context: LaunchRunContext) -> None:
        run = context.dagster_run
        folder = self._folder(run.run_id)
        (folder / "data").mkdir(parents=True)
        (folder / "limits").mkdir(mode=0o700)  # rate schedules on local disk: this "machine's" own
        args = ExecuteRunArgs(
            job_origin=run.job_code_origin, run_id=run.run_id, instance_ref=None, set_exit_code_on_failure=True
        ).get_command_args()
        env = {**os.environ, "AIP_DATA_DIR": str(folder / "data"), "AIP_LIMITS_DIR": str(folder / "limits")}
        env.pop("AIP_WAREHOUSE", None)
        env.pop("AIP_DATA_DIR_SET", None)
        with open(folder / "out.log", "wb") as out:
            p = subprocess.Popen(
                [sys.executable, "-m", *args] if args[0] == "dagster" else list(args),
                cwd=folder,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        (folder / "worker.json").write_text(json.dumps({"pid": p.pid, "cwd": str(folder)}))
        self._procs[run.run_id] = p

    @property
    def _procs(self) -> dict:
        if not hasattr(self, "_p"):
            self._p: dict = {}
        return self._p

    def _pid(self, run_id: str) -> int | None:
        f = self._folder(run_id) / "worker.json"
        return json.loads(f.read_text())["pid"] if f.exists() else None

    def terminate(self, run_id: str) -> bool:
        pid = self._pid(run_id)
        if pid is None:
            return False
        try:
            os.kill(pid, 15)
        except ProcessLookupError:
            return False
        return True

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run) -> CheckRunHealthResult:
        p = self._procs.get(run.run_id)
        if p is not None:  # launched by this daemon process: its exit code is known
            code = p.poll()
            if code is None:
                return CheckRunHealthResult(WorkerStatus.RUNNING)
            return CheckRunHealthResult(
                WorkerStatus.SUCCESS if code == 0 else WorkerStatus.FAILED, f"run worker exited with {code}"
            )
        pid = self._pid(run.run_id)
        if pid is None:
            return CheckRunHealthResult(WorkerStatus.NOT_FOUND, "no run worker was started")
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return CheckRunHealthResult(WorkerStatus.FAILED, "run worker is gone")
        return CheckRunHealthResult(WorkerStatus.RUNNING)
