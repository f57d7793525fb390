"""Dagster Definitions: `dagster dev` in the repo root loads this via workspace.yaml."""

from dagster import Definitions, define_asset_job

from .assets import STAGE_ASSETS
from .assets.recipes import perturbation_dataset
from .automation import build_schedules, build_sensor

evaluate_job = define_asset_job("evaluate", selection=STAGE_ASSETS,  # partitioned like its assets
                                description="All five stages for one run × metric partition.")

defs = Definitions(assets=[*STAGE_ASSETS, perturbation_dataset], jobs=[evaluate_job],
                   schedules=build_schedules(evaluate_job), sensors=[build_sensor(evaluate_job)])
