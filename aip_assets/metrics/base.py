"""The metric plug-in interface. A metric decides what each of the five stages does for it.

Stages receive a :class:`StageContext` (run, spec, config, journal, a reader for this
partition's tables, a progress reporter) and return ``{table: records}`` to be written, as one
transaction, in place of the partition's previous rows.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, ClassVar, Iterable

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from ..dataset import DatasetRow
from ..models.client import ModelClient
from ..models.journal import Journal
from ..runspec import Connection, RunSpec

logger = logging.getLogger("aip_assets")


class ScoringFields(BaseModel):
    """Fields every metric config shares (x-aip-param-role: scoring_metadata)."""

    model_config = ConfigDict(extra="forbid")
    inverted: bool = False
    max: float = 1.0
    min: float = 0.0
    weight: float = 1.0


class Progress:
    """done/total, calls in flight and failures, logged at most every few seconds."""

    def __init__(self, what: str, total: int, log: Callable[[str], None] | None = None, every_s: float = 2.0):
        self.what, self.total, self.done, self.failed = what, total, 0, 0
        self.log = log or logger.info
        self.every_s = every_s
        self.t0 = time.monotonic()
        self._last = 0.0
        self.in_flight: Callable[[], int] = lambda: 0

    def tick(self, ok: bool = True) -> None:
        self.done += 1
        self.failed += 0 if ok else 1
        now = time.monotonic()
        if now - self._last >= self.every_s or self.done == self.total:
            self._last = now
            rate = self.done / max(now - self.t0, 1e-9)
            self.log(f"{self.what}: {self.done}/{self.total} done, {self.in_flight()} in flight, "
                     f"{self.failed} failed, {rate:.1f}/s")


async def run_bounded(items: Iterable[Any], fn: Callable[[Any], Awaitable[Any]], limit: int,
                      progress: Progress | None = None, ok: Callable[[Any], bool] = lambda r: True) -> list[Any]:
    """Apply ``fn`` to every item with at most ``limit`` in flight; results in item order."""
    items = list(items)
    results: list[Any] = [None] * len(items)
    next_i = 0

    async def worker():
        nonlocal next_i
        while next_i < len(items):
            i = next_i
            next_i += 1
            results[i] = await fn(items[i])
            if progress:
                progress.tick(ok(results[i]))

    await asyncio.gather(*(worker() for _ in range(max(1, min(limit, len(items))))))
    return results


@dataclass
class StageContext:
    run_id: str
    metric: str
    spec: RunSpec
    config: Any
    journal: Journal
    read: Callable[[str], pd.DataFrame]
    log: Callable[[str], None] = field(default=logger.info)
    threshold: float | None = None

    def client(self, role: str, stage: str, concurrency: int) -> ModelClient:
        conn: Connection = self.spec.sut if role == "sut" else self.spec.judge
        return ModelClient(conn, role=role, run_id=self.run_id, metric=self.metric, stage=stage,
                           journal=self.journal, reuse_runs=self.spec.reuse_calls_from, concurrency=concurrency,
                           backoff_s=self.spec.retry_backoff_seconds)

    def progress(self, what: str, total: int) -> Progress:
        return Progress(what, total, self.log)

    def rows(self) -> list[DatasetRow]:
        return [DatasetRow.from_record(r) for r in self.read("dataset_rows").sort_values("row_index").to_dict("records")]


class Metric:
    """Subclass per metric; register an instance in ``aip_assets.metrics.REGISTRY``."""

    name: ClassVar[str]
    version: ClassVar[str]
    config_model: ClassVar[type[BaseModel]]
    samples_sut: ClassVar[bool] = True

    def synthesize(self, ctx: StageContext, rows: list[DatasetRow]) -> dict[str, list[dict]]:
        raise NotImplementedError

    async def sample(self, ctx: StageContext) -> dict[str, list[dict]]:
        raise NotImplementedError

    async def judge(self, ctx: StageContext) -> dict[str, list[dict]]:
        raise NotImplementedError

    def aggregate(self, ctx: StageContext) -> dict[str, list[dict]]:
        raise NotImplementedError

    def summary(self, scores: pd.DataFrame) -> dict[str, Any]:
        """Headline numbers for the CLI and Dagster metadata from this partition's metric_scores."""
        return {}
