"""Dagster Definitions: `dagster dev` in the repo root loads this via workspace.yaml."""

from dagster import Definitions, in_process_executor

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
