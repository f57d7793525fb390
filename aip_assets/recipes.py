"""Dataset recipes (the spec's "SDG recipes"): generate perturbed variants for off-platform
inference, and answer a dataset outside the pipeline with the builtin model.

    aip-eval perturb data/datasets/demo_decisions.jsonl data/generated/perturbed.jsonl --seed 7
    aip-eval answer data/generated/perturbed.jsonl data/generated/answered.jsonl --profile '{"name": "fair"}'

The first is also the Dagster asset ``perturbation_dataset``. The second stands for what a user
does with their own system: read the export, ask the system, write ``sut_response`` back.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

from .dataset import DatasetRow, load_dataset
from .metrics.perturbation.recipe import ask_paraphrases, check_export_path, export_dataset, generate_variants
from .metrics.perturbation.synthesis import messages_for
from .models.builtin import handle_chat
from .perturbations import ALL_TYPES, RULE_BASED
from .runspec import BuiltinProfile, Connection


def perturb_file(
    seed_path: str | Path,
    out_path: str | Path,
    types: list[str] | None = None,
    seed: int = 0,
    variants_per_type: int = 1,
    paraphraser: Connection | None = None,
) -> dict:
    """Read seed rows, write baseline + variants as gdi_text_v1. Returns counts by perturbation type."""
    check_export_path(out_path)
    rows = load_dataset(seed_path)
    types = list(types or [t for t in ALL_TYPES if t != "paraphrase" or paraphraser is not None])
    unknown = sorted(set(types) - set(ALL_TYPES))
    if unknown:
        raise ValueError(f"unknown perturbation type(s) {unknown}; known: {', '.join(ALL_TYPES)}")
    paraphrases = {}
    if "paraphrase" in types:
        if paraphraser is None:
            raise ValueError("the paraphrase perturbation needs a model connection (--paraphrase-base-url)")
        from .models.client import ModelClient

        async def go():
            async with ModelClient(
                paraphraser, role="synthesis", run_id="recipe", metric="", stage="recipe", journal=None, concurrency=8
            ) as client:
                return await ask_paraphrases(client, rows, variants_per_type, 60.0, 2, 0.7)

        paraphrases = asyncio.run(go())
    out = generate_variants(rows, types, seed, variants_per_type, paraphrases)
    export_dataset(out, out_path)
    return {
        "seed_rows": len(rows),
        "rows": len(out),
        "by_type": dict(Counter(r.metadata["perturbation_type"] for r in out)),
        "path": str(out_path),
    }


def answer_file(in_path: str | Path, out_path: str | Path, profile: BuiltinProfile | None = None) -> int:
    """Fill ``sut_response`` of every row with the builtin model's answer (no pipeline involved)."""
    check_export_path(out_path)
    profile = profile or BuiltinProfile()
    rows = load_dataset(in_path)
    answered = []
    for r in rows:
        body = {"model": "aip-builtin", "messages": messages_for(r), "temperature": 0.0}
        text = handle_chat(body, profile)["choices"][0]["message"]["content"]
        answered.append(DatasetRow(r.input_id, r.prompt, r.task_type, text, r.context, r.metadata))
    export_dataset(answered, out_path)
    return len(answered)


PERTURBATIONS = {name: p.description for name, p in RULE_BASED.items()} | {
    "paraphrase": "a model rewrites the question in other words (needs a model connection)"
}
