"""The evaluate job, and the light Definitions that run it without the automation.

``aip-eval run`` and the launcher job resolve ``evaluate`` here: building the full Definitions
would also build a schedule per spec in ``runs/``, and a broken or duplicate spec there must not
stop an evaluation.
"""

from __future__ import annotations

import functools

from dagster import Definitions, define_asset_job, in_process_executor

from .assets import STAGE_ASSETS
from .resources import SutConnection, Warehouse

# in-process: the stages of a partition run one after another in the run's process (the default
# multiprocess executor starts a Python process per step, which cost minutes per UI launch)
evaluate_job = define_asset_job("evaluate", selection=STAGE_ASSETS,  # partitioned like its assets
                                description="All five stages for one run × metric partition.",
                                executor_def=in_process_executor)
RESOURCES = {"warehouse": Warehouse(), "sut": SutConnection()}


@functools.cache
def evaluate():
    """The resolved evaluate job (its resources bound), as `dagster dev` has it."""
    return Definitions(assets=STAGE_ASSETS, jobs=[evaluate_job], resources=RESOURCES,
                       executor=in_process_executor).resolve_job_def("evaluate")
