"""The metric plug-in interface. A metric decides what each of the five stages does for it.

Stages receive a :class:`StageContext` (run, spec, config, journal, a reader for this
partition's tables, a progress reporter) and return ``{table: records}`` to be written, as one
transaction, in place of the partition's previous rows.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable, ClassVar, Iterable, Iterator

import pandas as pd
from pydantic import BaseModel, ConfigDict, ValidationError

from ..dataset import DatasetRow
from ..models.client import ChatResult, ModelClient
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


def check_persona_pairs(v: list[dict[str, str]] | None, keys: tuple[str, ...], empty_hint: str):
    """Validate a ``persona_pairs`` override: known keys only, both personas given and distinct."""
    if v is None:
        return v
    if not v:
        raise ValueError(f"persona_pairs is empty; {empty_hint}")
    for i, p in enumerate(v):
        extra = set(p) - set(keys)
        if extra:
            raise ValueError(f"persona_pairs[{i}]: unknown key(s) {sorted(extra)}; use {', '.join(keys)}")
        for k in ("persona_a", "persona_b"):
            if not p.get(k, "").strip():
                raise ValueError(f"persona_pairs[{i}]: '{k}' is required")
        if p["persona_a"].strip() == p["persona_b"].strip():
            raise ValueError(f"persona_pairs[{i}]: persona_a and persona_b are the same")
    return v


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


async def gather_all(*aws: Awaitable[Any]) -> list[Any]:
    """Like asyncio.gather, but every awaitable runs to its end before the first error is raised,
    so no call in flight is abandoned (its answer would be lost to the journal)."""
    results = await asyncio.gather(*aws, return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return list(results)


async def run_bounded(items: Iterable[Any], fn: Callable[[Any], Awaitable[Any]], limit: int,
                      progress: Progress | None = None, ok: Callable[[Any], bool] = lambda r: True) -> list[Any]:
    """Apply ``fn`` to every item with at most ``limit`` in flight; results in item order.

    When one item fails (e.g. the run reached its call cap), no new item starts, the items in
    flight finish (and are journaled), then the first error is raised."""
    items = list(items)
    results: list[Any] = [None] * len(items)
    next_i = 0
    error: BaseException | None = None

    async def worker():
        nonlocal next_i, error
        while next_i < len(items) and error is None:
            i = next_i
            next_i += 1
            try:
                results[i] = await fn(items[i])
            except Exception as e:  # noqa: BLE001 - re-raised below, after the others finish
                error = error or e
                return
            if progress:
                progress.tick(ok(results[i]))

    await asyncio.gather(*(worker() for _ in range(max(1, min(limit, len(items))))))
    if error is not None:
        raise error
    return results


class FrameReader:
    """A partition held in memory (tests, small runs): ``{table: DataFrame}``."""

    def __init__(self, tables: dict[str, pd.DataFrame]):
        self.tables = tables

    def read(self, table: str, ids: list[str] | None = None, columns: list[str] | None = None) -> pd.DataFrame:
        df = self.tables.get(table, pd.DataFrame())
        if ids is not None and len(df):
            df = df[df["input_id"].isin(ids)]
        return df[columns] if columns is not None and len(df) else df

    def count(self, table: str) -> int:
        return len(self.tables.get(table, ()))

    def input_ids(self) -> list[str]:
        df = self.tables["dataset_rows"]
        return list(df.sort_values("row_index")["input_id"]) if "row_index" in df else list(df["input_id"])


@dataclass
class StageContext:
    """What a metric's stage sees: the run, its config, the journal and this partition's tables.

    Stages stream: ``batches()`` yields the run's input ids ``batch_rows`` at a time, and
    ``read(table, ids)`` loads only that batch's rows, so memory is bounded by the batch.
    """

    run_id: str
    metric: str
    spec: RunSpec
    config: Any
    journal: Journal | None
    reader: Any  # FrameReader or pipeline.WarehouseReader
    log: Callable[[str], None] = field(default=logger.info)
    threshold: float | None = None
    batch_rows: int = 5000

    def read(self, table: str, ids: list[str] | None = None, columns: list[str] | None = None) -> pd.DataFrame:
        return self.reader.read(table, ids, columns)

    def count(self, table: str) -> int:
        return self.reader.count(table)

    def input_ids(self) -> list[str]:
        if not hasattr(self, "_ids"):
            self._ids = self.reader.input_ids()
        return self._ids

    def batches(self) -> Iterator[list[str]]:
        ids = self.input_ids()
        for i in range(0, len(ids), self.batch_rows):
            yield ids[i:i + self.batch_rows]

    def client(self, role: str, stage: str, concurrency: int) -> ModelClient:
        from ..models.client import Budget

        conn: Connection = {"sut": self.spec.sut, "judge": self.spec.judge}.get(role) or self.spec.synthesis_connection()
        lim = self.spec.limits
        budget = Budget(self.run_id, self.journal, lim.max_calls, lim.max_tokens) if lim.max_calls or lim.max_tokens else None
        return ModelClient(conn, role=role, run_id=self.run_id, metric=self.metric, stage=stage,
                           journal=self.journal, reuse_runs=self.spec.reuse_calls_from, concurrency=concurrency,
                           backoff_s=self.spec.retry_backoff_seconds, budget=budget)

    def progress(self, what: str, total: int) -> Progress:
        return Progress(what, total, self.log)

    def rows(self, ids: list[str] | None = None) -> list[DatasetRow]:
        df = self.read("dataset_rows", ids)
        return [DatasetRow.from_record(r) for r in df.sort_values("row_index").to_dict("records")]


# ------------------------------------------------------------------ shared stage mechanics
_JSON_OBJ = re.compile(r"\{.*\}", re.S)


def parse_json_answer(text: str | None, model: type[BaseModel]) -> tuple[BaseModel | None, str | None]:
    """A judge/synthesis answer validated against ``model``: (value, None) or (None, reason)."""
    if not text:
        return None, "empty answer"
    m = _JSON_OBJ.search(text)
    if not m:
        return None, "no JSON object in the answer"
    try:
        return model.model_validate(json.loads(m.group(0))), None
    except json.JSONDecodeError as e:
        return None, f"answer is not valid JSON: {e.msg}"
    except ValidationError as e:
        return None, "JSON does not match the expected schema: " + "; ".join(
            f"{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in e.errors())


@dataclass
class JsonOutcome:
    value: BaseModel | None
    error: str | None
    raw: str | None
    attempts: int
    last: ChatResult | None


async def ask_json(client: ModelClient, messages: list[dict[str, str]], model: type[BaseModel], *, retries: int,
                   timeout: float, temperature: float, template_version: str) -> JsonOutcome:
    """Ask for a JSON answer; an unparseable one is re-asked (up to ``retries`` times) with the
    reason, then reported as failed with the raw text, never silently scored."""
    value, err, raw, attempts, last = None, None, None, 0, None
    for _ in range(retries + 1):
        r = await client.chat(messages, temperature=temperature, sample_index=0, retries=retries, timeout=timeout,
                              template_version=template_version)
        attempts += r.attempts
        last = r
        if not r.ok:
            return JsonOutcome(None, f"call failed: {r.error}", None, attempts, last)
        raw = r.text
        value, err = parse_json_answer(raw, model)
        if value is not None:
            break
        messages = messages[:2] + [{"role": "assistant", "content": raw or ""}, {"role": "user", "content": (
            f"Your answer could not be used ({err}). Answer again with the JSON object only.")}]
    return JsonOutcome(value, err, raw, attempts, last)


async def sample_probes(ctx: StageContext, *, concurrency: int, temperature: float, retries: int, timeout: float,
                        template_version: str):
    """Send every probe of the partition to the SUT (one sample each), a batch of rows at a time."""
    progress = ctx.progress("SUT sampling", ctx.count("probes"))
    async with ctx.client("sut", "sampling", concurrency) as client:
        progress.in_flight = lambda: client.stats["in_flight"]

        async def one(p):
            r = await client.chat(json.loads(p["messages"]), temperature=temperature, sample_index=0,
                                  retries=retries, timeout=timeout, template_version=template_version)
            return {"probe_id": p["probe_id"], "input_id": p["input_id"], "sample_index": 0, "response": r.text,
                    "status": r.status, "error": r.error, "latency_ms": r.latency_ms,
                    "prompt_tokens": r.prompt_tokens, "completion_tokens": r.completion_tokens, "model": r.model,
                    "fingerprint": r.fingerprint, "call_key": r.call_key, "cached": r.cached}

        for ids in ctx.batches():
            probes = ctx.read("probes", ids, ["probe_id", "input_id", "messages"]).sort_values("probe_id").to_dict("records")
            yield {"sut_responses": await run_bounded(probes, one, concurrency, progress, lambda r: r["status"] == "ok")}


def pair_batch(ctx: StageContext, ids: list[str]) -> tuple[list[dict], dict[str, dict], dict[str, dict]]:
    """(pairs, probes by id, first SUT answers by probe id) for a batch of rows."""
    pairs = ctx.read("probe_pairs", ids).sort_values("pair_id").to_dict("records")
    probes = {p["probe_id"]: p for p in ctx.read("probes", ids, ["probe_id", "attribute_value", "persona"]).to_dict("records")}
    resp = {r["probe_id"]: r for r in ctx.read("sut_responses", ids, ["probe_id", "sample_index", "status", "error",
                                                                      "response"]).to_dict("records")
            if r["sample_index"] == 0}
    return pairs, probes, resp


def sut_failure(pair: dict, probes: dict[str, dict], resp: dict[str, dict]) -> str | None:
    """Why a pair cannot be judged (a SUT answer missing or failed), or None."""
    why = []
    for m in (pair["probe_a"], pair["probe_b"]):
        if m not in resp:
            why.append(f"SUT answer for {probes[m]['attribute_value']!r}: missing")
        elif resp[m]["status"] != "ok":
            why.append(f"SUT answer for {probes[m]['attribute_value']!r}: {resp[m]['error']}")
    return "; ".join(why) or None


class Metric:
    """Subclass per metric; register an instance in ``aip_assets.metrics.REGISTRY``.

    Each stage is a generator of ``{table: records}`` batches: the pipeline stages every batch
    on disk as it comes and writes the partition, in one transaction, when the stage is done.
    """

    name: ClassVar[str]
    version: ClassVar[str]
    config_model: ClassVar[type[BaseModel]]
    calls_sut: ClassVar[bool] = True  # False for pure scorers of answers given in the dataset

    def synthesize(self, ctx: StageContext) -> Iterator[dict[str, list[dict]]]:
        raise NotImplementedError

    def sample(self, ctx: StageContext) -> AsyncIterator[dict[str, list[dict]]]:
        raise NotImplementedError

    def judge(self, ctx: StageContext) -> AsyncIterator[dict[str, list[dict]]]:
        raise NotImplementedError

    def aggregate(self, ctx: StageContext) -> Iterator[dict[str, list[dict]]]:
        raise NotImplementedError

    def estimate(self, ctx: StageContext) -> dict[str, int]:
        """Calls this metric will make, from its synthesised probes: {sut_calls, judge_calls,
        synthesis_calls, sut_prompt_chars} (used by ``aip-eval run --dry-run``)."""
        probes = ctx.read("probes", None, ["messages"])
        pairs = ctx.count("probe_pairs")
        return {"sut_calls": len(probes), "judge_calls": pairs * self.judges_per_pair, "synthesis_calls": 0,
                "sut_prompt_chars": int(probes["messages"].str.len().sum()) if len(probes) else 0}

    judges_per_pair: ClassVar[int] = 1

    def summary(self, scores: pd.DataFrame) -> dict[str, Any]:
        """Headline numbers for the CLI and Dagster metadata from this partition's metric_scores."""
        raise NotImplementedError

    def format_summary(self, summary: dict[str, Any]) -> list[str]:
        """The summary as indented text lines for the terminal and the Dagster UI."""
        raise NotImplementedError
