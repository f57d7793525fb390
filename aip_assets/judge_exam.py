"""The judge exam: before a run's first SUT call, each LLM judge (each judge of a panel) answers
each of its metrics' exam items (``metrics.exam``), asked exactly as the metric asks its
judgements, with the same re-asks and checks. An item is right when the judge's verdict says what
the item's construction makes true; a verdict the judge could not give (a failed call, a copy of
the prompt's example, fields that disagree, a decision that contradicts the answer's own decision
line) answers it wrong.

A judge passes a metric's exam when its share of right answers is at least the metric entry's
``min_judge_exam`` (default :data:`DEFAULT_MIN`) and its verdicts contradict what the answers
plainly state in at most :data:`MAX_DISAGREEMENT` of the items. A judge that fails stops the run
before any SUT call (``ExamFailed``, exit 2), named with its score and the kinds it got wrong;
the exam stops at the first judge that fails (the rest would only spend calls: Gemma 3 270M took
341 s to fail decision flip's exam, 631 s with semantic consistency's after it).

The calls are the run's (journaled under its run id, stage ``exam``, answered from the cache when
asked again, charged to its budget); a passed exam's items are stored in ``judge_exams`` with the
run's registration, and its calls in ``llm_calls``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .dataset import load_dataset
from .errors import SpecError
from .metrics import get_metric
from .metrics.exam import DISAGREES_DECISION, DISAGREES_STANCE
from .metrics.judging import ask_json
from .metrics.verdicts import is_copy
from .runspec import MetricEntry, RunSpec
from .stats import wilson

DEFAULT_MIN: float = MetricEntry.model_fields["min_judge_exam"].default  # the share a judge must get right
MAX_DISAGREEMENT = 0.1  # the share of items whose verdict may contradict the answers' own statements
EXAM_STAGE = "exam"
_DISAGREES = (DISAGREES_DECISION, DISAGREES_STANCE)


class ExamFailed(SpecError):
    """A judge failed its exam: the run stops before any SUT call (exit 2)."""


@dataclass
class JudgeExam:
    """One judge's exam for one metric: its items' outcomes (``judge_exams`` rows) and the verdict."""

    metric: str
    judge: int  # its place in the panel, from 1
    role: str
    endpoint: str
    model: str
    min_score: float
    rows: list[dict[str, Any]] = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.rows)

    @property
    def right(self) -> int:
        return sum(r["status"] == "right" for r in self.rows)

    @property
    def score(self) -> float | None:
        return self.right / self.n if self.n else None

    @property
    def interval(self) -> tuple[float | None, float | None]:
        return wilson(self.right, self.n)

    def count(self, test: Callable[[dict[str, Any]], bool]) -> int:
        return sum(bool(test(r)) for r in self.rows)

    @property
    def disagreements(self) -> int:
        return self.count(lambda r: any(d in (r["error"] or "") for d in _DISAGREES))

    @property
    def copies(self) -> int:
        return self.count(lambda r: r["status"] == "failed" and is_copy(r["error"]))

    def by_kind(self) -> dict[str, tuple[int, int]]:
        out: dict[str, tuple[int, int]] = {}
        for r in self.rows:
            k, n = out.get(r["kind"], (0, 0))
            out[r["kind"]] = (k + (r["status"] == "right"), n + 1)
        return out

    @property
    def passed(self) -> bool:
        return (self.score or 0.0) >= self.min_score and self.disagreements <= MAX_DISAGREEMENT * self.n

    def who(self) -> str:
        return f"judge {self.endpoint} (model {self.model})" + (
            f", judge {self.judge} of the panel" if self.judge > 1 or self.role != "judge" else ""
        )

    def line(self) -> str:
        lo, hi = self.interval
        kinds = ", ".join(f"{k} {r}/{n}" for k, (r, n) in self.by_kind().items())
        extra = ""
        if self.disagreements:
            extra += f"; {self.disagreements} verdicts contradict the answers' own decisions"
        if self.copies:
            extra += f"; {self.copies} copied the prompt"
        return (
            f"judge exam, {self.metric}: {self.who()}: {self.right}/{self.n} right "
            f"({self.score or 0:.2f} [{lo or 0:.2f}, {hi or 0:.2f}], at least {self.min_score:g} needed): "
            f"{'PASS' if self.passed else 'FAIL'} ({kinds}{extra})"
        )

    def failure(self) -> str:
        """Why the judge fails, naming its score and the item kinds it got wrong, with an example."""
        wrong = [f"{k} {r}/{n}" for k, (r, n) in self.by_kind().items() if r < n]
        lo, hi = self.interval
        why = [
            f"{self.who()} failed its exam for {self.metric}: {self.right} of {self.n} items right "
            f"({self.score or 0:.2f} [{lo or 0:.2f}, {hi or 0:.2f}]; min_judge_exam {self.min_score:g})"
        ]
        if wrong:
            why.append("wrong: " + ", ".join(wrong))
        if self.disagreements > MAX_DISAGREEMENT * self.n:
            why.append(
                f"{self.disagreements} of {self.n} verdicts contradict a decision the answer plainly states "
                f"(at most {MAX_DISAGREEMENT:.0%} allowed)"
            )
        if self.copies * 2 > self.n:
            why.append("the judge copies the prompt's example: it cannot do this task")
        first = next((r for r in self.rows if r["status"] != "right"), None)
        if first is not None:
            said = first["why_wrong"] or first["error"] or ""
            why.append(f"e.g. item {first['item_id']} (expected {first['expected']}): {said[:200]}")
        return "; ".join(why)


@dataclass
class Exam:
    """Every judge's exam of a run (empty: no LLM judge, or every metric's ``min_judge_exam`` is 0)."""

    run_id: str
    judges: list[JudgeExam] = field(default_factory=list)
    not_examined: list[str] = field(default_factory=list)  # metrics left once a judge failed

    @property
    def passed(self) -> bool:
        return all(j.passed for j in self.judges)

    def lines(self) -> list[str]:
        return [j.line() for j in self.judges]

    def raise_if_failed(self) -> None:
        failed = [j for j in self.judges if not j.passed]
        if failed:
            raise ExamFailed(
                " | ".join(j.failure() for j in failed)
                + (f" (not examined further: {', '.join(self.not_examined)})" if self.not_examined else "")
                + ". Nothing was sent to the SUT and nothing was written: "
                "choose a judge that passes (`aip-eval run SPEC --dry-run --exam` runs only the exam), or set "
                "min_judge_exam: 0 on the metric's entry to run without it"
            )

    def rows(self, run_id: str | None = None) -> list[dict[str, Any]]:
        return [{**r, "run_id": run_id or self.run_id} for j in self.judges for r in j.rows]


def examined(spec: RunSpec, metrics: list[str] | None = None) -> list[str]:
    """The metrics whose judges take the exam: an LLM judge, a metric with exam items and a
    ``min_judge_exam`` above 0."""
    from .metrics.base import Metric

    if all(c.provider == "builtin" for c in spec.panel()):
        return []
    return [
        m
        for m in (metrics or list(spec.metrics))
        if spec.metrics[m].min_judge_exam > 0 and type(get_metric(m)).exam_items is not Metric.exam_items
    ]


def run_exam(
    spec: RunSpec,
    run_id: str,
    path: Path | None = None,
    log: Callable[[str], None] = print,
    metrics: list[str] | None = None,
) -> Exam:
    """Examine every LLM judge of ``spec`` for each of its ``metrics`` (default: all), with the calls
    journaled under ``run_id`` beside the warehouse at ``path``."""
    from .models.journal_pg import open_journal
    from .warehouse import default_path

    exam = Exam(run_id)
    todo = examined(spec, metrics)
    if not todo:
        return exam
    journal = open_journal(Path(path or default_path()))
    try:
        exam.judges = asyncio.run(_examine(spec, run_id, journal, todo, log))
        exam.not_examined = [m for m in todo if m not in {j.metric for j in exam.judges}]
    finally:
        journal.close()
    for line in exam.lines():
        log(line)
    return exam


async def _examine(spec: RunSpec, run_id: str, journal, metrics: list[str], log) -> list[JudgeExam]:
    """Each metric's items asked of each LLM judge through the client a judging stage uses
    (``StageContext.client``: the panel's clients, the run's budget), at the metric's concurrency."""
    from .metrics.base import StageContext
    from .metrics.judging import JudgePanel
    from .metrics.running import run_bounded

    out: list[JudgeExam] = []
    for metric in metrics:
        plugin, entry, cfg = get_metric(metric), spec.metrics[metric], spec.metric_config(metric)
        items = plugin.exam_items(cfg, load_dataset(spec.dataset_for(metric)), spec.seed, entry.judge_exam_items)
        concurrency = int(getattr(cfg, "sub_call_concurrency_limit", 0) or getattr(cfg, "concurrency_limit", 5))
        timeout = float(getattr(cfg, "timeout_seconds", 60.0))
        retries = int(getattr(cfg, "n_judge_retries", spec.judge_retries))  # as the metric asks its judge
        ctx = StageContext(run_id=run_id, metric=metric, spec=spec, config=cfg, journal=journal, reader=None, log=log)
        async with ctx.client("judge", EXAM_STAGE, concurrency) as judge:
            clients = judge.clients if isinstance(judge, JudgePanel) else [judge]
            examinees = [(i, c) for i, c in enumerate(clients) if c.conn.provider != "builtin"]
            log(f"judge exam, {metric}: {len(items)} items for {len(examinees)} judge(s), before any SUT call")
            for i, client in examinees:

                async def one(item, client=client, i=i):
                    o = await ask_json(
                        client,
                        item.messages,
                        item.verdict,
                        retries=retries,
                        timeout=timeout,
                        temperature=spec.judge_temperature,
                        template_version=f"exam/{metric}",
                        context=item.context,
                        enums=item.enums,
                    )
                    why = item.grade(o.value) if o.value is not None else None
                    return {
                        "metric": metric,
                        "judge": i + 1,
                        "role": client.role,
                        "endpoint": client.endpoint_id,
                        "model": client.conn.model,
                        "item_id": item.item_id,
                        "kind": item.kind,
                        "expected": item.expected,
                        "status": "failed" if o.value is None else ("wrong" if why else "right"),
                        "why_wrong": why,
                        "error": o.error,
                        "parsed": o.value.model_dump_json() if o.value is not None else None,
                        "raw_output": o.raw,
                        "attempts": o.attempts,
                        "reasks": o.reasks,
                        "call_key": o.last.call_key if o.last else None,
                        "min_score": entry.min_judge_exam,
                    }

                progress = ctx.progress(f"judge exam, {metric}, judge {i + 1}", len(items))
                rows_out = await run_bounded(items, one, concurrency, progress, lambda r: r["status"] != "failed")
                exam = JudgeExam(
                    metric, i + 1, client.role, client.endpoint_id, client.conn.model, entry.min_judge_exam, rows_out
                )
                out.append(exam)
                if not exam.passed:  # the run cannot go on: the rest of the exam would only spend calls
                    rest = metrics[metrics.index(metric) + 1 :]
                    if rest:
                        log(f"judge exam: {exam.who()} failed; not examined further: {', '.join(rest)}")
                    return out
    return out


def exam_tables(exam: Exam, run_id: str, path: Path | None = None) -> dict[str, Any]:
    """The warehouse rows of a passed exam for run ``run_id``: ``judge_exams`` and its calls'
    ``llm_calls`` (from the journal, where they were recorded under ``exam.run_id``)."""
    import pandas as pd

    from .models.journal_pg import open_journal
    from .warehouse import default_path
    from .warehouse import tables as wh

    tables: dict[str, Any] = {"judge_exams": wh.frame("judge_exams", exam.rows(run_id))}
    if not exam.judges:
        return tables
    journal = open_journal(Path(path or default_path()))
    try:
        frames = [f for m in {j.metric for j in exam.judges} for f in journal.frames(exam.run_id, m, EXAM_STAGE)]
    finally:
        journal.close()
    if frames:
        calls = pd.concat(frames, ignore_index=True)
        calls["run_id"] = run_id
        tables["llm_calls"] = wh.frame(
            "llm_calls", calls[[c for c in calls.columns if c in dict(wh.TABLES["llm_calls"])]]
        )
    return tables


def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (metric, judge) of stored ``judge_exams`` rows: the figures the summary, ``--json``, the
    report and Dagster's metadata show."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["metric"], int(r["judge"])), []).append(r)
    out = []
    for (metric, judge), rs in sorted(groups.items()):
        j = JudgeExam(
            metric, judge, rs[0]["role"], rs[0]["endpoint"], rs[0]["model"], float(rs[0]["min_score"] or 0), rs
        )
        lo, hi = j.interval
        out.append(
            {
                "metric": metric,
                "judge": judge,
                "role": j.role,
                "endpoint": j.endpoint,
                "model": j.model,
                "right": j.right,
                "n": j.n,
                "score": j.score,
                "ci_low": lo,
                "ci_high": hi,
                "min_score": j.min_score,
                "passed": j.passed,
                "disagreements": j.disagreements,
                "copies": j.copies,
                "by_kind": {k: {"right": r, "n": n} for k, (r, n) in j.by_kind().items()},
                "line": j.line(),
            }
        )
    return out


def stored(run_id: str, path: Path | None = None) -> list[dict[str, Any]]:
    """The run's exam (``summary`` of its ``judge_exams`` rows); empty when no judge took one."""
    from .warehouse import query

    df = query("SELECT * FROM judge_exams WHERE run_id = ? ORDER BY metric, judge, item_id", [run_id], path)
    return summary(df.to_dict("records"))


def reading_checks(run_id: str, metric: str, path: Path | None = None) -> list[dict[str, Any]]:
    """Per judge of the run's ``metric``: how many of its verdicts were refused because they
    contradict what the answers plainly state (``DISAGREES``: judge_failed), of the verdicts it was
    asked for. A panel's judges from ``judge_panel``, a lone judge from ``judgements``."""
    from .warehouse import query

    like = " OR ".join("error LIKE ?" for _ in _DISAGREES)
    args = [f"%{d}%" for d in _DISAGREES]
    sql = f"""
        SELECT judge, role, model, count(*) AS asked, count(*) FILTER (WHERE {like}) AS contradicted FROM (
            SELECT judge, role, model, error FROM judge_panel WHERE run_id = ? AND metric = ?
            UNION ALL
            SELECT 1 AS judge, 'judge' AS role, model, error FROM judgements
            WHERE run_id = ? AND metric = ? AND attempts > 0
              AND NOT EXISTS (SELECT 1 FROM judge_panel WHERE run_id = ? AND metric = ?))
        GROUP BY ALL ORDER BY judge"""
    df = query(sql, [*args, run_id, metric, run_id, metric, run_id, metric], path)
    return [
        {**r, "asked": int(r["asked"]), "contradicted": int(r["contradicted"])}
        for r in df.to_dict("records")
        if r["contradicted"]
    ]
