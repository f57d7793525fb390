"""Dagster Definitions: `dagster dev` in the repo root loads this via workspace.yaml."""

import warnings

from dagster import BetaWarning, Definitions, PreviewWarning, SupersessionWarning, in_process_executor

from .assets import STAGE_ASSETS
from .assets.recipes import perturbation_dataset
from .automation import build_schedules, build_sensor, launch_job
from .jobs import RESOURCES, evaluate_job

defs = Definitions(
    assets=[*STAGE_ASSETS, perturbation_dataset],
    jobs=[evaluate_job, launch_job],
    schedules=build_schedules(launch_job),
    sensors=[build_sensor(launch_job)],
    resources=RESOURCES,
    executor=in_process_executor,
)
# Resolved now (Dagster keeps the result), with Dagster's notices about its own API left out: its
# own code passes the beta `owners` to each sensor it copies, which would warn in every process
# that loads these definitions (the UI's code server, each run).
with warnings.catch_warnings():
    for _category in (BetaWarning, PreviewWarning, SupersessionWarning):
        warnings.simplefilter("ignore", _category)
    defs.get_repository_def()
