"""The evaluate job, the light Definitions that run it without the automation, and the one loop
that evaluates a registered run's metrics.

``aip-eval run`` and the launcher job resolve ``evaluate`` here: building the full Definitions
would also build a schedule per spec in ``runs/``, and a broken or duplicate spec there must not
stop an evaluation.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

from dagster import Definitions, define_asset_job, in_process_executor

from .assets import STAGE_ASSETS
from .partitions import partition_key, register_partitions
from .resources import SutConnection, Warehouse

# in-process: the stages of a partition run one after another in the run's process (the default
# multiprocess executor starts a Python process per step, which cost minutes per UI launch)
evaluate_job = define_asset_job("evaluate", selection=STAGE_ASSETS,  # partitioned like its assets
                                description="All five stages for one <run>|<metric> partition.",
                                executor_def=in_process_executor)
RESOURCES = {"warehouse": Warehouse(), "sut": SutConnection()}


@functools.cache
def evaluate():
    """The resolved evaluate job (its resources bound), as `dagster dev` has it."""
    return Definitions(assets=STAGE_ASSETS, jobs=[evaluate_job], resources=RESOURCES,
                       executor=in_process_executor).resolve_job_def("evaluate")


def evaluate_run(instance, run_id: str, configured, metrics, tags: dict[str, str],
                 run_config: dict[str, Any] | None = None,
                 on_start: Callable[[str], None] | None = None) -> Iterator[tuple[str, Any]]:
    """Evaluate ``metrics`` of the registered run ``run_id``, one run of the evaluate job each (in
    this process), yielding (metric, result) as each ends; a failed metric does not stop the next.
    First the run's partitions are added: one per ``configured`` metric, the run's real work."""
    from .errors import AipError

    unknown = [m for m in metrics if m not in configured]
    if unknown:
        raise AipError(f"metric {', '.join(unknown)} is not configured in run {run_id} "
                       f"(configured: {', '.join(configured)})")
    register_partitions(instance, run_id, configured)
    job = evaluate()
    for metric in metrics:
        if on_start:
            on_start(metric)
        yield metric, job.execute_in_process(partition_key=partition_key(run_id, metric), instance=instance,
                                             run_config=run_config or {}, raise_on_error=False,
                                             tags={"aip/run_id": run_id, "aip/metric": metric, **tags})
