"""Perturbation robustness's recipe: meaning-preserving variants of seed rows, each tagged with its
perturbation type and deterministic under a seed (rule-based, or paraphrases asked of a model),
and their export as a gdi_text_v1 dataset (the ``perturbation_dataset`` asset, ``aip-eval
perturb``; the hosted metric makes its variants with it within the run)."""

from __future__ import annotations

import json
import random
from typing import ClassVar

import pandas as pd
from pydantic import Field

from ...dataset import DatasetRow
from ...perturbations import RULE_BASED
from ..running import run_bounded
from ..verdicts import JsonAnswer

# the paraphrase prompt's example, of an unrelated question: an answer repeating it copies the prompt
PARAPHRASE_EXAMPLE = ("What is the warranty period of this laptop?", "How long is this laptop under warranty?")


class Paraphrase(JsonAnswer):
    NOUN: ClassVar[str] = "paraphrase"
    EXAMPLES: ClassVar[tuple[str, ...]] = PARAPHRASE_EXAMPLE
    paraphrase: str = Field(..., min_length=1)


def paraphrase_messages(query: str) -> list[dict[str, str]]:
    example = json.dumps({"paraphrase": PARAPHRASE_EXAMPLE[1]})
    return [
        {
            "role": "system",
            "content": "You rewrite questions without changing their meaning. You answer with JSON only.",
        },
        {
            "role": "user",
            "content": (
                "Task: paraphrase (aip-judge paraphrase v2)\n\nRewrite the question below in different words. Keep "
                "its meaning, every fact, number and date, and its language.\n\n<<<\n" + query + "\n>>>\n\n"
                'Answer with one JSON object with one field, "paraphrase" (string): the question above in your '
                'words. For example, for the unrelated question "' + PARAPHRASE_EXAMPLE[0] + '", a correct answer '
                "was: " + example + "\nAnswer with the JSON object only, for the question above."
            ),
        },
    ]


def generate_variants(
    rows: list[DatasetRow],
    types: list[str],
    seed: int,
    variants_per_type: int = 1,
    paraphrases: dict[tuple[str, int], str] | None = None,
) -> list[DatasetRow]:
    """Baseline + perturbed rows (gdi_text_v1) for each seed row; deterministic under ``seed``.

    ``paraphrases``: model paraphrases keyed by (input_id, k), when a model was asked."""
    out: list[DatasetRow] = []
    for row in rows:
        q = row.last_user_text
        meta = {**row.metadata, "original_query": q, "perturbation_type": "baseline", "seed_input_id": row.input_id}
        out.append(DatasetRow(row.input_id, row.prompt, row.task_type, None, row.context, meta))
        seen = {q}
        for t in types:
            for k in range(variants_per_type):
                if t == "paraphrase":
                    v = (paraphrases or {}).get((row.input_id, k))
                else:
                    v = RULE_BASED[t](q, random.Random(f"perturb:{seed}:{row.input_id}:{t}:{k}"))
                if not v or v in seen:
                    continue
                seen.add(v)
                prompt = v if isinstance(row.prompt, str) else row.turns[:-1] + [{"role": "user", "content": v}]
                out.append(
                    DatasetRow(
                        f"{row.input_id}--{t}-{k + 1}",
                        prompt,
                        row.task_type,
                        None,
                        row.context,
                        {**meta, "perturbation_type": t},
                    )
                )
    return out


async def ask_paraphrases(
    client, rows: list[DatasetRow], variants_per_type: int, timeout: float, retries: int, temperature: float
) -> dict[tuple[str, int], str]:
    async def one(item):
        row, k = item
        msgs = paraphrase_messages(row.last_user_text)
        r = await client.chat(
            msgs,
            temperature=temperature,
            sample_index=k,
            retries=retries,
            timeout=timeout,
            template_version="perturbation/paraphrase/v2",
        )
        from ..verdicts import parse_json_answer

        v, _ = parse_json_answer(r.text, Paraphrase) if r.ok else (None, r.error)
        return (row.input_id, k), (v.paraphrase.strip() if v else None)

    items = [(r, k) for r in rows for k in range(variants_per_type)]
    return {key: val for key, val in await run_bounded(items, one, 8) if val}


EXPORT_SUFFIXES = (".jsonl", ".ndjson", ".csv", ".parquet", ".pq")


def check_export_path(path) -> None:
    """Refuse an output file the exporter cannot write, before any work (and before any folder is made)."""
    from pathlib import Path

    if Path(path).suffix.lower() not in EXPORT_SUFFIXES:
        raise ValueError(f"{path}: the output must end in .jsonl, .csv or .parquet")


def export_dataset(rows: list[DatasetRow], path) -> None:
    """Write rows as gdi_text_v1: .jsonl, .csv (JSON in structured cells) or .parquet."""
    from pathlib import Path

    check_export_path(path)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    recs = [
        {
            "input_id": r.input_id,
            "prompt": r.prompt,
            "sut_response": r.sut_response,
            "task_type": r.task_type,
            "context": r.context,
            "metadata": r.metadata,
        }
        for r in rows
    ]
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        path.write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in recs))
        return
    flat = [
        {
            **x,
            "prompt": x["prompt"] if isinstance(x["prompt"], str) else json.dumps(x["prompt"], ensure_ascii=False),
            "context": None if x["context"] is None else json.dumps(x["context"], ensure_ascii=False),
            "metadata": json.dumps(x["metadata"], ensure_ascii=False),
        }
        for x in recs
    ]
    if suffix == ".csv":
        pd.DataFrame(flat).to_csv(path, index=False)
    else:
        pd.DataFrame(flat).to_parquet(path, index=False)
