"""Perturbation robustness's synthesis: the rows grouped by their original query, one probe per
row (its role: baseline, variant, or excluded under a dataset edge case), and what a probe stands
for."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ...dataset import DatasetRow


def _h(*parts: Any) -> str:
    return hashlib.sha256("\x1f".join(map(str, parts)).encode()).hexdigest()[:16]


def messages_for(row: DatasetRow) -> list[dict[str, str]]:
    """The chat messages a row stands for: its turns, with RAG context before the last one."""
    turns = row.turns
    if row.context:
        ctx = "Context:\n" + "\n".join(f"- {p}" for p in row.context) + "\n\n"
        turns = turns[:-1] + [{"role": "user", "content": ctx + turns[-1]["content"]}]
    return turns


def member(probe: dict) -> str:
    """The row a probe stands for: a dataset row (external), or a generated variant (hosted)."""
    return probe.get("variant_id") or probe["input_id"]


EDGE_MESSAGES = {
    "missing_original_query": "the row has no metadata.original_query, so it belongs to no group",
    "no_baseline": "no row of its group has a query equal to metadata.original_query (no baseline)",
    "duplicate_baseline": "two or more rows of its group claim to be the baseline (their query equals "
    "metadata.original_query); keep exactly one",
    "baseline_only": "its group has only the baseline row: no perturbed variant to compare",
}


def group_rows(plugin, rows: list[DatasetRow]) -> tuple[list[dict], list[dict]]:
    """(probes, notes): one probe per row; rows in a broken group become ``excluded`` probes."""
    groups: dict[str, list[DatasetRow]] = {}
    probes, notes = [], []
    for row in rows:
        oq = row.metadata.get("original_query")
        if not isinstance(oq, str) or not oq.strip():
            probes.append(_probe(plugin, row, "excluded", "missing_original_query", None))
            continue
        groups.setdefault(oq, []).append(row)
    for oq, members in groups.items():
        gid = _h(oq)
        base = [r for r in members if r.last_user_text == oq]
        problem = (
            "no_baseline"
            if not base
            else "duplicate_baseline"
            if len(base) > 1
            else "baseline_only"
            if len(members) == 1
            else None
        )
        if problem:
            ids = [r.input_id for r in members]
            notes.append(
                {
                    "level": "warning",
                    "code": problem,
                    "message": f"group {gid} ({len(ids)} rows: {', '.join(ids[:5])}{'…' if len(ids) > 5 else ''}): "
                    f"{EDGE_MESSAGES[problem]}",
                }
            )
            probes += [_probe(plugin, r, "excluded", problem, gid) for r in members]
            continue
        for r in members:
            kind = "baseline" if r is base[0] else "variant"
            probes.append(
                _probe(
                    plugin,
                    r,
                    kind,
                    r.metadata.get("perturbation_type") or ("baseline" if kind == "baseline" else "unknown"),
                    gid,
                )
            )
    missing = sum(1 for p in probes if p["exclusion"] == "missing_original_query")
    if missing:
        notes.append(
            {
                "level": "warning",
                "code": "missing_original_query",
                "message": f"{missing} rows have no metadata.original_query and are not scored",
            }
        )
    return probes, notes


def _probe(plugin, row: DatasetRow, role: str, category: str, gid: str | None) -> dict:
    """A row's probe: its role (baseline, variant, excluded), its perturbation type (or, when
    excluded, why), its group."""
    msgs = messages_for(row)
    excluded = role == "excluded"
    return {
        "probe_id": _h(row.input_id, "perturbation"),
        "input_id": row.input_id,
        "role": role,
        "category": None if excluded else category,
        "exclusion": category if excluded else None,
        "group_id": gid,
        "query_text": row.last_user_text,
        "messages": json.dumps(msgs, ensure_ascii=False),
        "template_version": plugin.template_version,
    }
