"""gdi_text_v1: the dataset schema every metric accepts.

Columns:
  input_id      str, unique, non-empty                                   (required)
  prompt        str, or a list of {"role", "content"} turns (multi-turn)  (required)
  task_type     single_turn_llm | multi_turn_llm | single_turn_rag | multi_turn_rag (required)
  sut_response  str or null (optional where the metric samples the SUT itself)
  context       str or list of str: RAG passages (required for *_rag task types)
  metadata      JSON object (optional)

Readers for CSV, JSONL and Parquet. In CSV, ``prompt`` (when a turn list), ``context`` (when a
list) and ``metadata`` are JSON text. Every problem is reported with file, row and field, and
all problems of a file are gathered before raising, so a user fixes them in one pass.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import DatasetError, symlink_loop
from .readers.text import is_whitespace

TASK_TYPES = ("single_turn_llm", "multi_turn_llm", "single_turn_rag", "multi_turn_rag")
REQUIRED = ("input_id", "prompt", "task_type")
COLUMNS = ("input_id", "prompt", "sut_response", "task_type", "context", "metadata")
ROLES = ("system", "user", "assistant")
MAX_ERRORS_SHOWN = 20


@dataclass
class DatasetRow:
    input_id: str
    prompt: str | list[dict[str, str]]
    task_type: str
    sut_response: str | None = None
    context: list[str] | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def turns(self) -> list[dict[str, str]]:
        """The conversation as turns; a single-turn prompt is one user turn."""
        if isinstance(self.prompt, str):
            return [{"role": "user", "content": self.prompt}]
        return [dict(t) for t in self.prompt]

    @property
    def last_user_text(self) -> str:
        return self.turns[-1]["content"]

    def to_record(self) -> dict[str, Any]:
        return {
            "input_id": self.input_id,
            "prompt": self.prompt if isinstance(self.prompt, str) else json.dumps(self.prompt, ensure_ascii=False),
            "prompt_is_turns": not isinstance(self.prompt, str),
            "sut_response": self.sut_response,
            "task_type": self.task_type,
            "context": None if self.context is None else json.dumps(self.context, ensure_ascii=False),
            "metadata": json.dumps(self.metadata, ensure_ascii=False, sort_keys=True),
        }

    @classmethod
    def from_record(cls, r: dict[str, Any]) -> DatasetRow:
        return cls(
            input_id=r["input_id"],
            prompt=json.loads(r["prompt"]) if r["prompt_is_turns"] else r["prompt"],
            task_type=r["task_type"],
            sut_response=r["sut_response"],
            context=None if r["context"] is None else json.loads(r["context"]),
            metadata=json.loads(r["metadata"]) if r["metadata"] else {},
        )


def _is_missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def _maybe_json(v: Any, want: tuple[type, ...]) -> Any:
    """CSV cells hold JSON for structured fields; parse text that looks like JSON."""
    if isinstance(v, str) and v.strip()[:1] in ("[", "{"):
        try:
            parsed = json.loads(v)
        except json.JSONDecodeError:
            return v
        return parsed if isinstance(parsed, want) else v
    return v


def _to_python(v: Any) -> Any:
    """numpy / pyarrow values from Parquet to plain Python."""
    if hasattr(v, "tolist") and not isinstance(v, (str, bytes)):
        v = v.tolist()
    if isinstance(v, list):
        return [_to_python(x) for x in v]
    if isinstance(v, dict):
        return {k: _to_python(x) for k, x in v.items()}
    return v


def _validate_row(raw: dict[str, Any], where: str, errors: list[str]) -> DatasetRow | None:
    n_before = len(errors)

    def err(fld: str, msg: str) -> None:
        errors.append(f"{where}: field '{fld}': {msg}")

    input_id = raw.get("input_id")
    if _is_missing(input_id) or is_whitespace(str(input_id)):
        err("input_id", "is empty")
    elif isinstance(input_id, float) and input_id.is_integer():
        input_id = str(int(input_id))
    input_id = None if _is_missing(input_id) else str(input_id)

    task_type = raw.get("task_type")
    if task_type not in TASK_TYPES:
        err("task_type", f"must be one of {', '.join(TASK_TYPES)} (got {task_type!r})")

    prompt = _maybe_json(_to_python(raw.get("prompt")), (list,))
    if _is_missing(prompt) or (isinstance(prompt, str) and is_whitespace(prompt)):
        err("prompt", "is empty")
    elif isinstance(prompt, list):
        if not prompt:
            err("prompt", "turn list is empty")
        for i, t in enumerate(prompt):
            if not isinstance(t, dict) or set(t) - {"role", "content"} or "role" not in t or "content" not in t:
                err("prompt", f"turn {i + 1} must be an object with exactly 'role' and 'content'")
                break
            if t["role"] not in ROLES:
                err("prompt", f"turn {i + 1}: role must be one of {', '.join(ROLES)} (got {t['role']!r})")
                break
            if not isinstance(t["content"], str) or is_whitespace(t["content"]):
                err("prompt", f"turn {i + 1}: content is empty")
                break
        else:
            if prompt and prompt[-1]["role"] != "user":
                err("prompt", "the last turn must be a user turn (the persona and instruction apply to it)")
        if task_type in ("single_turn_llm", "single_turn_rag") and isinstance(prompt, list) and len(prompt) > 1:
            err("prompt", f"task_type {task_type} takes a single prompt, got {len(prompt)} turns")
    elif not isinstance(prompt, str):
        err("prompt", f"must be text or a list of turns (got {type(prompt).__name__})")
    if task_type in ("multi_turn_llm", "multi_turn_rag") and isinstance(prompt, str):
        err("prompt", f"task_type {task_type} needs a list of {{role, content}} turns")

    sut_response = raw.get("sut_response")
    sut_response = None if _is_missing(sut_response) else sut_response
    if sut_response is not None and not isinstance(sut_response, str):
        err("sut_response", f"must be text (got {type(sut_response).__name__})")

    context = _maybe_json(_to_python(raw.get("context")), (list,))
    if _is_missing(context) or context == "":
        context = None
    elif isinstance(context, str):
        context = [context]
    elif not (isinstance(context, list) and all(isinstance(c, str) for c in context)):
        err("context", "must be text or a list of text passages")
    if task_type in ("single_turn_rag", "multi_turn_rag") and not context:
        err("context", f"task_type {task_type} needs context passages")

    metadata = _maybe_json(_to_python(raw.get("metadata")), (dict,))
    if _is_missing(metadata) or metadata == "":
        metadata = {}
    elif not isinstance(metadata, dict):
        err("metadata", "must be a JSON object")

    if len(errors) > n_before or input_id is None or task_type is None:
        return None
    return DatasetRow(input_id, prompt, str(task_type), sut_response, context, metadata)


def _read_records(path: Path) -> list[dict[str, Any]]:
    suffix = path.suffix.lower()
    try:
        if suffix in (".jsonl", ".ndjson"):
            records: list[dict[str, Any]] = []
            with path.open(encoding="utf-8-sig") as f:  # a byte order mark (some editors write one) is dropped
                for i, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        obj = json.loads(line)
                    except json.JSONDecodeError as e:
                        raise DatasetError(
                            f"{path}: row {len(records) + 1} (line {i}): not valid JSON: {e.msg}"
                        ) from None
                    if not isinstance(obj, dict):
                        raise DatasetError(f"{path}: row {len(records) + 1} (line {i}): must be a JSON object")
                    records.append(obj)
            return records
        if suffix == ".csv":
            import pandas as pd

            df = pd.read_csv(path, dtype=str, keep_default_na=False, na_values=[""], encoding="utf-8-sig")
            return [{k: (None if _is_missing(v) else v) for k, v in r.items()} for r in df.to_dict("records")]
        if suffix in (".parquet", ".pq"):
            import pyarrow.parquet as pq

            return pq.read_table(path).to_pylist()
    except DatasetError:
        raise
    except Exception as e:  # unreadable file: say which and why
        raise DatasetError(f"{path}: cannot read as {suffix.lstrip('.')}: {e}") from None
    if not suffix:
        raise DatasetError(
            f"{path}: the file name has no suffix, so its type is unknown; name the file for its "
            "format: .csv, .jsonl (or .ndjson) or .parquet (or .pq)"
        )
    raise DatasetError(f"{path}: unsupported file type {suffix!r}; use .csv, .jsonl (or .ndjson) or .parquet (or .pq)")


DATASET_SUFFIXES = (".csv", ".jsonl", ".ndjson", ".parquet", ".pq")


def _not_a_folder(path: Path) -> None:
    """A dataset path that is a folder: say so, and which dataset files it holds, if any."""
    if not path.is_dir():
        return
    try:
        inside = sorted(p.name for p in path.iterdir() if p.is_file() and p.suffix.lower() in DATASET_SUFFIXES)
    except OSError:
        inside = []
    held = (
        f" (it holds {', '.join(inside[:5])}{', ...' if len(inside) > 5 else ''})"
        if inside
        else " (it holds no .csv, .jsonl, .ndjson or .parquet file)"
    )
    raise DatasetError(
        f"{path}: is a folder, not a dataset file{held}; give the path of one dataset file: "
        ".csv, .jsonl (or .ndjson) or .parquet (or .pq)"
    )


def load_dataset(path: str | Path) -> list[DatasetRow]:
    """Read and validate a gdi_text_v1 file. Raises DatasetError listing every problem found."""
    path = Path(path)
    if (loop := symlink_loop(path)) is not None:
        raise DatasetError(f"{path}: {loop}")
    if not path.exists():
        raise DatasetError(f"{path}: dataset file not found")
    _not_a_folder(path)
    records = _read_records(path)
    if not records:
        raise DatasetError(f"{path}: the dataset has no rows")
    errors: list[str] = []
    columns: set[str] = set()
    for r in records:
        columns.update(r)
    unknown = sorted(columns - set(COLUMNS))
    if unknown:
        errors.append(f"{path}: unknown column(s) {unknown}; gdi_text_v1 columns are {', '.join(COLUMNS)}")
    missing = [c for c in REQUIRED if c not in columns]
    if missing:
        raise DatasetError(f"{path}: missing required column(s) {missing}; gdi_text_v1 needs {', '.join(REQUIRED)}")
    rows: list[DatasetRow] = []
    seen: dict[str, int] = {}
    for i, raw in enumerate(records, 1):
        where = f"{path}: row {i}" + (
            f" (input_id {raw.get('input_id')!r})" if not _is_missing(raw.get("input_id")) else ""
        )
        row = _validate_row(raw, where, errors)
        if row is None:
            continue
        if row.input_id in seen:
            errors.append(f"{where}: field 'input_id': duplicate of row {seen[row.input_id]}")
            continue
        seen[row.input_id] = i
        rows.append(row)
    if errors:
        shown = errors[:MAX_ERRORS_SHOWN]
        more = f"\n... and {len(errors) - len(shown)} more" if len(errors) > len(shown) else ""
        raise DatasetError("invalid dataset:\n" + "\n".join(shown) + more)
    return rows
