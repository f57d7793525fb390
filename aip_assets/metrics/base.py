"""The metric plug-in interface. A metric decides what each of the five stages does for it.

Stages receive a :class:`StageContext` (run, spec, config, journal, a reader for this
partition's tables, a progress reporter) and return ``{table: records}`` to be written, as one
transaction, in place of the partition's previous rows.

Here: :class:`Metric` (its stages, and the hooks of the judge audit, a panel, people's labels and
findings), :class:`StageContext`, the fields every config shares (:class:`ScoringFields`), people's
labels' :class:`KeyRate` and a scored verdict's :data:`THIRDS`. What a metric's stages and words use
besides, in modules of their own beside this one:

- ``answers``: the SUT's answers (sampling, null twins for the baseline, a pair's answers, why
  they cannot be judged);
- ``verdicts``: what a judge's answer must be and how it is read; ``judging``: asking a judge or a
  panel; ``running``: a stage's bounded calls and progress;
- ``words``: why a row has no score, in words, and the findings (:class:`~.words.Finding`,
  :class:`~.words.Evidence`).
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, cast

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from ..dataset import DatasetRow
from ..gate import FAILURE_REASONS, failed_count  # noqa: F401 - the metrics' aggregations find them here
from ..models.builtin import BuiltinJudge, register_judge_source
from ..models.client import ModelClient
from ..models.journal import Journal
from ..runspec import Connection, RunSpec, metric_registry  # the registry: metrics/__init__.py
from ..scoring import Formula
from .exam import ExamItem
from .judging import JudgePanel, panel_role, split_panel
from .running import Progress
from .words import Evidence, Finding

logger = logging.getLogger("aip_assets")


class ScoringFields(BaseModel):
    """Fields every metric config shares (x-aip-param-role: scoring_metadata)."""

    model_config = ConfigDict(extra="forbid")
    inverted: bool = Field(
        False,
        description="Report 1 minus the normalised score, for a raw score where lower is better. The default "
        "(false) keeps the direction: higher is better.",
    )
    max: float = Field(
        1.0,
        description="The raw score that normalises to 1: a raw score is mapped to clip((raw - min) / (max - min), "
        "0, 1). The default (1.0) fits every metric's 0-1 raw score; with min == max the normalised score is 1 at "
        "or above it, else 0.",
    )
    min: float = Field(
        0.0,
        description="The raw score that normalises to 0 (see max). The default (0.0) fits every metric's 0-1 raw "
        "score.",
    )
    weight: float = Field(
        1.0,
        description="The score's weight for reports that blend metrics, stored with each score "
        "(metric_scores.weight). Nothing in this project blends metrics, so it changes no score; default 1.0.",
    )


METRIC_NAME = (
    "The metric's short name, stored with each of its scores (metric_scores.metric_name); it names the metric in "
    "tables and changes nothing measured. The default is the metric's own name."
)
# descriptions of fields several metrics' configs declare alike
N_SUT_RETRIES = (
    "Retries of a SUT call that fails with a transient error (0-5) before its answer is recorded as failed; default 0."
)
PAIR_CONCURRENCY = "SUT calls, and judge calls, in flight at once for this metric (1-64); default 5."
PAIR_SUT_TEMPERATURE = (
    "Sampling temperature of the SUT's answers (0-2); default 0.7. Above 0, part of the pairs get a no-effect "
    "baseline by default (the metric entry's baseline_share)."
)


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


class FrameReader:
    """A partition held in memory (tests, small runs): ``{table: DataFrame}``."""

    def __init__(self, tables: dict[str, pd.DataFrame]):
        self.tables = tables

    def read(self, table: str, ids: list[str] | None = None, columns: list[str] | None = None) -> pd.DataFrame:
        df = self.tables.get(table, pd.DataFrame())
        if ids is not None and len(df):
            df = df[df["input_id"].isin(ids)]
        if columns is None or not len(df):
            return df
        return df.reindex(columns=columns).astype(object).where(lambda d: d.notna(), None)  # a missing column is NULL

    def count(self, table: str) -> int:
        return len(self.tables.get(table, ()))

    def status_counts(self, table: str) -> dict[str, int]:
        df = self.tables.get(table)
        if df is None or not len(df) or "status" not in df:
            return {}
        return {str(k): int(v) for k, v in df["status"].fillna("ok").value_counts().items()}

    def input_ids(self) -> list[str]:
        df = self.tables["dataset_rows"]
        return list(df.sort_values("row_index")["input_id"]) if "row_index" in df else list(df["input_id"])


class OverlayReader:
    """A reader with some tables replaced (a stage's own output, before it is committed)."""

    def __init__(self, base: Any, tables: dict[str, pd.DataFrame]):
        self.base, self.frames = base, FrameReader(tables)

    def read(self, table: str, ids: list[str] | None = None, columns: list[str] | None = None) -> pd.DataFrame:
        return (self.frames if table in self.frames.tables else self.base).read(table, ids, columns)

    def count(self, table: str) -> int:
        return (self.frames if table in self.frames.tables else self.base).count(table)

    def status_counts(self, table: str) -> dict[str, int]:
        return (self.frames if table in self.frames.tables else self.base).status_counts(table)

    def input_ids(self) -> list[str]:
        return self.base.input_ids()


@functools.cache
def spec_manifests() -> dict[str, Any]:
    """The metric specs' manifests kept in the repo (``aip_assets/specs/manifests.json``)."""
    return json.loads((Path(__file__).parent.parent / "specs" / "manifests.json").read_text())


def manifest_of(plugin: Metric) -> dict[str, Any]:
    """A metric's parameter manifest: its own (``Metric.manifest``), else its entry in
    ``specs/manifests.json`` (``spec_manifest`` or its name); empty when it has neither."""
    if plugin.manifest is not None:
        return plugin.manifest
    return spec_manifests().get(plugin.spec_manifest or plugin.name) or {}


def execution_timeout(metric: str) -> float | None:
    """The ``timeout_seconds`` of a metric's execution manifest (None when its spec has none)."""
    plugin = metric_registry().get(metric)
    manifest = manifest_of(plugin) if plugin is not None else spec_manifests().get(metric) or {}
    execution = manifest.get("execution") or {}
    t = execution.get("timeout_seconds")
    return float(t) if t else None


MAX_BATCH_ITEMS = 20_000  # probes or pairs in one streamed batch: what a stage holds in memory at once


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
    notes: list[dict] = field(default_factory=list)  # run notes raised while the stage ran (e.g. by a client)
    observe: Callable[[dict[str, Any]], None] | None = None  # progress as metadata (pipeline.run_stage)

    def read(self, table: str, ids: list[str] | None = None, columns: list[str] | None = None) -> pd.DataFrame:
        return self.reader.read(table, ids, columns)

    @property
    def seed(self) -> int:
        """The run seed (0 without a spec, in unit tests of a stage)."""
        return self.spec.seed if self.spec is not None else 0

    def count(self, table: str) -> int:
        return self.reader.count(table)

    def status_counts(self, table: str) -> dict[str, int]:
        return self.reader.status_counts(table)

    def input_ids(self) -> list[str]:
        if not hasattr(self, "_ids"):
            self._ids = self.reader.input_ids()
        return self._ids

    def batches(self, per_row: int | None = None) -> Iterator[list[str]]:
        """The run's input ids, ``batch_rows`` at a time, or fewer when every row fans out into many
        probes or pairs: a batch holds at most :data:`MAX_BATCH_ITEMS` of them. ``per_row`` is the
        fan-out; without it, it is measured from this partition's probes and pairs (a synthesis,
        which makes them, says how many it will make)."""
        ids = self.input_ids()
        if per_row is None:
            per_row = self._fanout(len(ids))
        step = max(1, min(self.batch_rows, MAX_BATCH_ITEMS // per_row)) if per_row > 0 else self.batch_rows
        for i in range(0, len(ids), step):
            yield ids[i : i + step]

    def _fanout(self, n_rows: int) -> int:
        if not hasattr(self, "_per_row"):
            items = max(self.count("probes"), self.count("probe_pairs")) if n_rows else 0
            self._per_row = -(-items // n_rows) if n_rows else 0
        return self._per_row

    def client(self, role: str, stage: str, concurrency: int) -> ModelClient:
        """The role's client. With a judge panel (``judges``), the judge is a :class:`JudgePanel`:
        one client per judge (roles ``judge``, ``judge-2``, ...: each its own calls, keys and cache),
        one budget for them all; it stands in for a client (what it does not do, the primary does)."""
        from ..models.budget import Budget

        audit = self.spec.judge_audit.judge if self.spec.judge_audit else None
        conn: Connection = {"sut": self.spec.sut, "judge": self.spec.judge, "audit": audit}.get(
            role
        ) or self.spec.synthesis_connection()
        lim = self.spec.limits
        budget = (
            Budget.for_run(self.run_id, self.journal, lim.max_calls, lim.max_tokens)
            if lim.max_calls or lim.max_tokens
            else None
        )

        def make(conn: Connection, role: str) -> ModelClient:
            return ModelClient(
                conn,
                role=role,
                run_id=self.run_id,
                metric=self.metric,
                stage=stage,
                journal=self.journal,
                reuse_runs=self.spec.reuse_calls_from,
                concurrency=concurrency,
                backoff_s=self.spec.retry_backoff_seconds,
                budget=budget,
                on_note=self.notes.append,
                row_timeout_s=self.row_timeout_s,
                on_progress=self.observe,
            )

        if role == "judge" and self.spec.judges:
            return cast(
                ModelClient,
                JudgePanel([make(c, panel_role(i)) for i, c in enumerate(self.spec.judges)], self.spec.judge_rule),
            )
        return make(conn, role)

    def progress(self, what: str, total: int) -> Progress:
        return Progress(what, total, self.log)

    @property
    def row_timeout_s(self) -> float | None:
        """Seconds one dataset row's calls may take in one stage: the spec's
        ``limits.row_timeout_seconds``, else the metric's execution manifest ``timeout_seconds``
        (900 decision flip and perturbation, 21600 group bias; none for the consistency metrics)."""
        if self.spec is not None and self.spec.limits.row_timeout_seconds is not None:
            return self.spec.limits.row_timeout_seconds
        return execution_timeout(self.metric)

    def rows(self, ids: list[str] | None = None) -> list[DatasetRow]:
        key = None if ids is None else tuple(ids)
        last = getattr(self, "_rows_read", None)  # the last batch's rows, read once (an aggregation asks twice)
        if last is not None and last[0] == key:
            df = last[1]
        else:
            df = self.read("dataset_rows", ids)
            self._rows_read = (key, df)
        return [DatasetRow.from_record(r) for r in df.sort_values("row_index").to_dict("records")]


# ------------------------------------------------------------------ people's labels (human_labels.py)
@dataclass(frozen=True)
class KeyRate:
    """The rate people's labels correct (human_labels.py): the share of ``category`` among the
    judgements whose judge category is one of ``population`` (the run's own denominator for that rate)."""

    category: str
    population: tuple[str, ...]
    what: str


THIRDS = ("low", "mid", "high")  # a score's third, the category a scored verdict is labelled by
THIRDS_TEXT = "low < 1/3 <= mid < 2/3 <= high"


def thirds(kind: str) -> list[str]:
    """The categories people may give a scored verdict of a judge kind: its third, or unjudgeable."""
    return [f"{kind}:{t}" for t in THIRDS] + ["unjudgeable"]


class Metric:
    """A metric plug-in: subclass it in the metric's package and register it (``metrics.BUILTIN_METRICS``
    or ``metrics.register``).

    Each stage is a generator of ``{table: records}`` batches: the pipeline stages every batch
    on disk as it comes and writes the partition, in one transaction, when the stage is done. The
    pipeline, not the metric, applies the gate, the judge audit, a panel's agreement and people's
    labels to what :meth:`aggregate` returns (``pipeline.finished_aggregate``).

    Everything the rest of the project knows about a metric is an attribute here, so nothing
    outside the metric's package is keyed by its name: the direction of its breakdowns
    (:attr:`lower_is_better`), the report's words (:attr:`count_labels`, :attr:`rate_label`), the
    previews of its judgements (:attr:`judgement_previews`), its SQL views (:meth:`views`), the
    reasons it excludes units for (:attr:`exclusion_reasons`), the builtin judge's answers to its
    prompts (:attr:`builtin_judges`) and its parameter manifest (:attr:`manifest`).

    Verdict fields of its own: the ``judgements`` table has the columns every metric shares
    (status, label, score, reasoning, raw output, ...) and does not grow per metric. A metric whose
    judge returns other fields declares them as a pydantic model (its judge's verdict model),
    writes ``model.model_dump_json()`` into the ``parsed`` JSON column, and reads them back through a
    view of its own (:meth:`views`) that casts ``parsed ->> 'field'`` to a typed column. The toy
    metric of the tests (``aip_assets_tests/toy_metric``) does exactly that.
    """

    name: ClassVar[str]
    version: ClassVar[str]
    config_model: ClassVar[type[BaseModel]]
    formula: ClassVar[Formula]  # how its units become scores (scoring.py)
    # the breakdown `aip-eval compare` tests, and whether it is a rate (a two-proportion test)
    compare_scope: ClassVar[str | None] = None
    calls_sut: ClassVar[bool] = True  # False for pure scorers of answers given in the dataset
    spec_manifest: ClassVar[str | None] = None  # its manifest in specs/manifests.json, when not its name
    # its parameter manifest, when it is kept beside the metric instead of in specs/manifests.json
    manifest: ClassVar[dict[str, Any] | None] = None
    # the run spec's per-metric entry fields it takes beyond the shared ones (runspec.OWN_ENTRY_FIELDS)
    entry_fields: ClassVar[frozenset[str]] = frozenset()
    # breakdown scopes whose numbers are rates where lower is better (`aip-eval compare`'s direction)
    lower_is_better: ClassVar[frozenset[str]] = frozenset()
    # the report's words for its counts (units judged, events, units failed) and its rate (None: generic)
    count_labels: ClassVar[tuple[str, str, str] | None] = None
    rate_label: ClassVar[str | None] = None
    # the report: breakdown scope -> how to chart it (value, interval, kind, title), in chart order;
    # scopes of its own shown as facts, not charts; names of scopes shown as a row of facts
    chart_scopes: ClassVar[dict[str, dict[str, Any]]] = {}
    uncharted_scopes: ClassVar[frozenset[str]] = frozenset()
    scope_labels: ClassVar[dict[str, str]] = {}
    # (view or table, columns, ORDER BY, WHERE) of the judgements' preview in Dagster, the first
    # with rows for the partition shown; empty: the lowest-scored judgements
    judgement_previews: ClassVar[tuple[tuple[str, tuple[str, ...], str, str], ...]] = ()
    # reason -> what it means, for the reasons this metric excludes units for beyond the shared ones
    exclusion_reasons: ClassVar[dict[str, str]] = {}
    # prompt tag -> the builtin judge's answers to the prompts carrying it (models.builtin)
    builtin_judges: ClassVar[Mapping[str, BuiltinJudge]] = {}

    # people's labels (human_labels.py): the rate they correct, None when the metric has none; what
    # the labelling file shows of a judgement: its persona pair, a row and its variant, or a
    # perturbation group's baseline and variant
    human_key_rate: ClassVar[KeyRate | None] = None
    human_shown: ClassVar[Literal["pairs", "variants", "groups"]] = "groups"

    def human_categories(self, judgement: dict[str, Any]) -> list[str] | None:
        """The categories a person may give this judgement (those :meth:`audit_category` returns
        for it); None: its verdicts have none to label."""
        return None

    def human_item(self, judgement: dict[str, Any]) -> str | None:
        """The question a person answers about this judgement, in the labelling file."""
        return None

    def human_context(self, config: Any, row: DatasetRow, judgement: dict[str, Any]) -> str:
        """What else the judge was given for this judgement (decision labels, a reference answer)."""
        return ""

    def exam_items(self, config: Any, rows: list[DatasetRow], seed: int, n: int) -> list[ExamItem]:
        """The judge exam's items for this metric (``metrics.exam``): ``n`` of each kind it has,
        made from the run's own ``rows`` and labels; empty (the default): its judge takes no exam."""
        return []

    def views(self) -> dict[str, str]:
        """This metric's own SQL views, name -> SELECT (each with ``run_id`` and ``metric``), in the
        order they are created (a view may read an earlier one)."""
        return {}

    def synthesize(self, ctx: StageContext) -> Iterator[dict[str, list[dict]]]:
        raise NotImplementedError

    def sample(self, ctx: StageContext) -> AsyncIterator[dict[str, list[dict]]]:
        raise NotImplementedError

    def judge(self, ctx: StageContext) -> AsyncIterator[dict[str, list[dict]]]:
        raise NotImplementedError

    def aggregate(self, ctx: StageContext) -> Iterator[dict[str, list[dict]]]:
        """Row and run scores. The ``overall`` metric_scores record carries ``judged`` (units
        scored), ``excluded`` ({reason: units}) and optionally ``gate_failures`` (metric-specific
        reasons to fail the gate); the pipeline turns them into coverage and the gate
        (``pipeline.finished_aggregate``)."""
        raise NotImplementedError

    async def run_judge(self, ctx: StageContext) -> AsyncIterator[dict[str, list[dict]]]:
        """``judge`` with a panel's votes taken out of the judgements into ``judge_panel`` (every
        batch names the table, so a partition judged again replaces its rows)."""
        async for tables in self.judge(ctx):
            if "judgements" in tables:
                rows, panel = split_panel(tables["judgements"])
                tables = {**tables, "judgements": rows, "judge_panel": panel}
            yield tables

    def estimate(self, ctx: StageContext) -> dict[str, int]:
        """Calls this metric will make, from its synthesised probes: {sut_calls, judge_calls,
        synthesis_calls, sut_prompt_chars} (used by ``aip-eval run --dry-run``)."""
        probes = ctx.read("probes", None, ["probe_id", "messages"])
        pairs = ctx.read("probe_pairs", None, ["probe_b", "kind"])
        # a null pair's fresh sample is one more call of its probe's request
        twins = pairs[pairs["kind"] == "null"] if len(pairs) and "kind" in pairs else pairs.iloc[0:0]
        chars = probes.set_index("probe_id")["messages"].str.len() if len(probes) else pd.Series(dtype=float)
        return {
            "sut_calls": len(probes) + len(twins),
            "judge_calls": len(pairs) * self.judges_per_pair,
            "synthesis_calls": 0,
            "sut_prompt_chars": int(chars.sum() + chars.reindex(twins["probe_b"]).sum()) if len(probes) else 0,
        }

    judges_per_pair: ClassVar[int] = 1

    def pair_judge(
        self,
        ctx: StageContext,
        client: Any,
        ids: list[str],
        pairs: list[dict],
        probes: dict[str, dict],
        resp: dict[tuple[str, int], dict],
        retries: int,
    ) -> Callable[[dict], Awaitable[Any]]:
        """The judging of one pair of a batch of rows (``pair_batch``'s pairs, probes and answers;
        ``resp`` may fill as the answers come in), with ``retries`` as the judgement's budget: the
        judging stage's own work item, used by :meth:`judge` and to judge ahead: a metric that gives
        it passes ``ahead.judge_ahead(...)`` to ``sample_probes`` (``ahead.py``)."""
        raise NotImplementedError(f"{self.name} judges no pairs ahead")

    def plan(self, ctx: StageContext) -> dict[str, Any] | None:
        """What the run can detect, from its synthesised design (``analysis.power``): a dict with
        ``lines`` (for ``aip-eval run --dry-run``), ``warnings`` (run notes said before the first SUT
        call: a threshold asking for less than the run can show, values the pool cannot tell apart)
        and the figures. None: the metric makes no claims."""
        return None

    def summary(self, scores: pd.DataFrame) -> dict[str, Any]:
        """Headline numbers for the CLI and Dagster metadata from this partition's metric_scores."""
        raise NotImplementedError

    # ---- judge validation (judge_audit.py): which verdict a judgement holds, as a category
    def audit_model(self, judgement: dict[str, Any]) -> type[BaseModel] | None:
        """The verdict model a second judge answers for this judgement (None: not audited)."""
        return None

    def audit_context(self, ctx: StageContext, judgement: dict[str, Any]) -> dict[str, Any] | None:
        """What the auditor's verdict is validated against, as the run judge's was (decision flip:
        the row's labels); None when the verdict model needs nothing."""
        return None

    def verdict_category(self, verdict: BaseModel, *context: Any) -> str:
        """A verdict as the category judges are compared by (a panel's vote; the audit's reading):
        decision flip's label, a consistency label, a score's third. ``context``: what the metric
        needs to read it (decision flip: the row's labels; a judge kind)."""
        raise NotImplementedError

    def audit_enums(self, ctx: StageContext, judgement: dict[str, Any]) -> dict[str, tuple[str, ...]] | None:
        """Per-item enums of the audit verdict's schema (as the run's judge was given them), or None."""
        return None

    def audit_category(self, ctx: StageContext, judgement: dict[str, Any], verdict: BaseModel | None) -> str:
        """The verdict as a category to compare two judges by: from ``verdict`` (the auditor's)
        or, when None, from the stored judgement (the run's judge)."""
        raise NotImplementedError

    # position bias: for judgements shown in a seeded random order, the verdict whose rate should
    # not depend on the order (None: this metric shows its answers in a fixed order)
    def position_outcome(self, judgement: dict[str, Any], pair: dict[str, Any]) -> bool | None:
        return None

    def format_summary(self, summary: dict[str, Any]) -> list[str]:
        """The summary as indented text lines for the terminal and the Dagster UI."""
        raise NotImplementedError

    def findings(self, scores: pd.DataFrame, evidence: Evidence) -> list[Finding]:
        """What this partition found, in plain words (``aip_assets.findings`` ranks every metric's):
        each a :class:`Finding` built from its metric_scores (``scores``) and, for its example rows,
        the run's tables (``evidence``). Nothing notable gives no finding; a failed gate none of
        these explains gets a finding of its ``gate_reason`` from ``findings.py``."""
        return []


def builtin_judge_answers(tag: str) -> BuiltinJudge | None:
    """The builtin judge's answers for a prompt tag, from the registered metric that owns the tag."""
    for metric in metric_registry().values():
        if tag in metric.builtin_judges:
            return metric.builtin_judges[tag]
    return None


register_judge_source(builtin_judge_answers)  # the builtin model finds each metric's answers here
