"""Partitions: run (dynamic: one key per registered evaluation run) × metric (static)."""

from dagster import DynamicPartitionsDefinition, MultiPartitionKey, MultiPartitionsDefinition, StaticPartitionsDefinition

from .metrics import REGISTRY

runs_partitions = DynamicPartitionsDefinition(name="aip_runs")
metric_partitions = StaticPartitionsDefinition(sorted(REGISTRY))
run_metric_partitions = MultiPartitionsDefinition({"run": runs_partitions, "metric": metric_partitions})


def partition_key(run_id: str, metric: str) -> MultiPartitionKey:
    return MultiPartitionKey({"run": run_id, "metric": metric})
