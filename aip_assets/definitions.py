"""Dagster Definitions: `dagster dev` in the repo root loads this via workspace.yaml."""

from dagster import Definitions, define_asset_job, in_process_executor

from .assets import STAGE_ASSETS
from .assets.recipes import perturbation_dataset
from .automation import build_schedules, build_sensor, launch_job
from .resources import SutConnection, Warehouse

# in-process: the stages of a partition run one after another in the run's process (the default
# multiprocess executor starts a Python process per step, which cost minutes per UI launch)
evaluate_job = define_asset_job("evaluate", selection=STAGE_ASSETS,  # partitioned like its assets
                                description="All five stages for one run × metric partition.",
                                executor_def=in_process_executor)

defs = Definitions(assets=[*STAGE_ASSETS, perturbation_dataset], jobs=[evaluate_job, launch_job],
                   schedules=build_schedules(launch_job), sensors=[build_sensor(launch_job)],
                   resources={"warehouse": Warehouse(), "sut": SutConnection()},
                   executor=in_process_executor)
