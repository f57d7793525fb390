"""Partitions: one dynamic key per (run, metric) the run configures, ``<run_id>|<metric>``.

Only real work can be launched: a run's keys are added when the code registers the run
(``aip-eval run``, the launcher job of schedules and the sensor), one per configured metric. A
run × metric grid (a multi-partition) would offer every metric for every run, configured or not.

Dagster's launch dialog still offers "+ Add a partition" for any dynamic partition set; a key
typed there names no registered run (or a metric the run does not configure), and its run fails
at its first step with that said, writing nothing.
"""

from dagster import DynamicPartitionsDefinition

from .errors import AipError

SEP = "|"
evaluations = DynamicPartitionsDefinition(name="aip_evaluations")


def partition_key(run_id: str, metric: str) -> str:
    return f"{run_id}{SEP}{metric}"


def split_key(key: str) -> tuple[str, str]:
    """(run_id, metric) of a partition key; a key of another shape is the user's mistake."""
    from .metrics import REGISTRY

    run_id, sep, metric = key.rpartition(SEP)
    if not sep or not run_id or metric not in REGISTRY:
        raise AipError(
            f"partition {key!r} is not <run_id>{SEP}<metric> with a known metric ({', '.join(sorted(REGISTRY))}); "
            "partitions are added when a run is registered (`aip-eval run`, or a schedule or the sensor), "
            "not by hand"
        )
    return run_id, metric


def register_partitions(instance, run_id: str, metrics) -> None:
    """Add the run's keys (one per configured metric) that the instance does not have yet."""
    new = [
        k
        for k in (partition_key(run_id, m) for m in metrics)
        if not instance.has_dynamic_partition(evaluations.name, k)
    ]
    if new:
        instance.add_dynamic_partitions(evaluations.name, new)
