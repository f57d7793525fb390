"""The builtin judge's answers to the perturbation prompts (tags ``perturbation_correctness``,
``perturbation_robustness``) and its paraphrases (``paraphrase``): stance and figures compared
with the reference or the baseline answer."""

from __future__ import annotations

import re
from typing import Any

from ...models.builtin import RESPONSE_BLOCK, BuiltinJudge
from ...readers.figures import compare_figures, read_figures
from ...readers.stances import read_stance
from ...readers.text import is_blank


def _agreement(a: str, b: str) -> float | None:
    """How far two answers agree on what can be read in both: stance and figures (each 1 when
    they agree, 0 when they conflict, 0.5 when they agree on some and state others only one of
    them does; figures about different quantities are not compared). Identical
    answers agree fully; None when nothing can be compared."""
    parts = []
    s1, s2 = read_stance(a), read_stance(b)
    if s1 is not None and s2 is not None:
        parts.append(float(s1 == s2))
    rel = compare_figures(read_figures(a), read_figures(b))
    if rel is not None and rel != "not_comparable":  # figures about different quantities: nothing to compare
        parts.append({"same": 1.0, "subset": 0.5, "conflict": 0.0}[rel])
    if parts:
        return sum(parts) / len(parts)
    if " ".join(a.lower().split()) == " ".join(b.lower().split()):
        return 1.0
    return None


_REF_BLOCK = re.compile(r"\[Reference answer\]\n<<<\n(.*?)\n>>>", re.S)


def judge_correctness(prompt: str) -> dict[str, Any]:
    blocks = dict(RESPONSE_BLOCK.findall(prompt))
    ref = _REF_BLOCK.search(prompt)
    answer = blocks.get("1", "")
    if ref is None:
        score = 0.0 if is_blank(answer) else 1.0
        return {"correctness": score, "reasoning": "No reference answer; judged on whether the question is answered."}
    agreed = _agreement(answer, ref.group(1))
    if agreed is None:
        return {
            "unjudgeable": True,
            "correctness": None,
            "reasoning": "Neither a stance nor a figure can be compared with the reference answer.",
        }
    return {
        "correctness": agreed,
        "reasoning": f"Stance and figures agree with the reference on {agreed:.0%} of checks.",
    }


def judge_robustness(prompt: str) -> dict[str, Any]:
    blocks = dict(RESPONSE_BLOCK.findall(prompt))
    score = _agreement(blocks.get("2", ""), blocks.get("1", ""))
    if score is None:
        return {
            "unjudgeable": True,
            "robustness": None,
            "reasoning": "The answers differ, and neither a stance nor a figure can be read in both to compare.",
        }
    return {"robustness": score, "reasoning": f"The answers agree on {score:.0%} of stance and figures."}


def paraphrase(prompt: str) -> dict[str, Any]:
    m = re.search(r"<<<\n(.*?)\n>>>", prompt, re.S)
    import random as _random

    from ...perturbations import RULE_BASED

    q = m.group(1) if m else ""
    out = RULE_BASED["synonyms"](q, _random.Random(q)) or q
    return {"paraphrase": f"Put differently, {out[0].lower()}{out[1:]}" if out else out}


BUILTIN_JUDGES = {
    "perturbation_correctness": BuiltinJudge(judge_correctness),
    "perturbation_robustness": BuiltinJudge(judge_robustness),
    "paraphrase": BuiltinJudge(paraphrase),
}
