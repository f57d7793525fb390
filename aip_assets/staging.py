"""A stage's output: written to Parquet batch by batch (memory bounded by the batch), then swapped
into the warehouse as one transaction (``StagedTables``), with the counts the stage's metadata
reports (rows, failed and excluded records, calls and tokens)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from . import warehouse as wh
from .metrics.running import FAILED_OUTCOMES


class StagedTables:
    """A stage's output, written to Parquet batch by batch (memory bounded by the batch), then
    swapped into the warehouse as one transaction by :meth:`commit`."""

    def __init__(self, root: Path, run_id: str, metric: str, stage: str):
        self.dir = root / "staging" / run_id.replace("/", "_") / metric / stage
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True)
        self.run_id, self.metric, self.stage = run_id, metric, stage
        wh.release_memory()  # also puts Arrow on the system allocator, so later releases reach its pages
        self.files: dict[str, list[Path]] = {}
        self.rows: dict[str, int] = {}
        self.failed: dict[str, int] = {}  # records that failed (FAILED_OUTCOMES: an error, a SUT or judge failure)
        self.excluded: dict[str, int] = {}  # records excluded (no decision, an empty answer, unjudgeable...)
        self.calls = {"network": 0, "failed": 0, "prompt_tokens": 0, "completion_tokens": 0}

    def add(self, tables: dict[str, Any]) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        for table, recs in tables.items():
            const = {"run_id": self.run_id, "metric": self.metric}
            if table in wh.STAGE_SCOPED:
                const["stage"] = self.stage
            df = wh.frame(table, recs, **const)
            self.files.setdefault(table, [])
            self.rows[table] = self.rows.get(table, 0) + len(df)
            if not len(df):
                continue
            if "status" in df.columns and table != "llm_calls":
                status = df["status"].fillna("ok")
                failed = status.isin(FAILED_OUTCOMES)
                self.failed[table] = self.failed.get(table, 0) + int(failed.sum())
                self.excluded[table] = self.excluded.get(table, 0) + int(((status != "ok") & ~failed).sum())
            if table == "llm_calls":
                self.calls["network"] += len(df)
                self.calls["failed"] += int((df["status"] != "ok").sum())
                self.calls["prompt_tokens"] += int(pd.to_numeric(df["prompt_tokens"]).fillna(0).sum())
                self.calls["completion_tokens"] += int(pd.to_numeric(df["completion_tokens"]).fillna(0).sum())
            f = self.dir / f"{table}-{len(self.files[table]):05d}.parquet"
            pq.write_table(pa.Table.from_pandas(df, schema=wh.arrow_schema(table), preserve_index=False), f)
            self.files[table].append(f)

    def frame(self, table: str) -> pd.DataFrame:
        """What this stage has staged for ``table`` so far (before it is committed)."""
        files = self.files.get(table) or []
        return pd.concat([pd.read_parquet(f) for f in files], ignore_index=True) if files else pd.DataFrame()

    def commit(self, path: Path, guard: Callable[[], None] | None = None) -> None:
        wh.write_partition_files(self.run_id, self.metric, self.files, stage=self.stage, path=path, guard=guard)
        shutil.rmtree(self.dir, ignore_errors=True)

    def metadata(self) -> dict[str, Any]:
        meta: dict[str, Any] = {f"rows.{t}": n for t, n in self.rows.items()}
        meta.update({f"failed.{t}": n for t, n in self.failed.items()})
        meta.update({f"excluded.{t}": n for t, n in self.excluded.items()})
        if "llm_calls" in self.rows:
            meta.update(
                {
                    "calls.network": self.calls["network"],
                    "calls.failed": self.calls["failed"],
                    "tokens.prompt": self.calls["prompt_tokens"],
                    "tokens.completion": self.calls["completion_tokens"],
                }
            )
        return meta
