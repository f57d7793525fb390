"""What the perturbation judges are asked: the correctness and robustness prompts and the verdicts
they answer in."""

from __future__ import annotations

import json
from typing import Any, ClassVar

from pydantic import Field

from ..verdicts import Verdict

# ------------------------------------------------------------------ judges
# the judge prompts' examples, from unrelated items, and the description of their reasoning: a
# verdict repeating either copies the prompt
# (reasoning first in each, as in the schema: reasons, then the ruling)
CORRECTNESS_EXAMPLE: dict[str, Any] = {
    "reasoning": "The response gives 4,806 metres for Mont Blanc, which is the height in the reference answer.",
    "correctness": 1.0,
}
ROBUSTNESS_EXAMPLE: dict[str, Any] = {
    "reasoning": "Both responses recommend the same savings account, but response 2 quotes a different interest rate.",
    "robustness": 0.5,
}
UNJUDGEABLE_EXAMPLE: dict[str, Any] = {
    "reasoning": "The reference answer is about train fares and the response about bus timetables.",
    "unjudgeable": True,
}
REASONING_FIELD = "one or two sentences, in your own words, on why"
_EXAMPLES = (
    CORRECTNESS_EXAMPLE["reasoning"],
    ROBUSTNESS_EXAMPLE["reasoning"],
    UNJUDGEABLE_EXAMPLE["reasoning"],
    REASONING_FIELD,
)


class Correctness(Verdict):
    correctness: float | None = Field(None, ge=0.0, le=1.0)
    SCORE_FIELDS: ClassVar[tuple[str, ...]] = ("correctness",)
    EXAMPLES: ClassVar[tuple[str, ...]] = _EXAMPLES


class Robustness(Verdict):
    robustness: float | None = Field(None, ge=0.0, le=1.0)
    SCORE_FIELDS: ClassVar[tuple[str, ...]] = ("robustness",)
    EXAMPLES: ClassVar[tuple[str, ...]] = _EXAMPLES


SYSTEM = "You are a meticulous, impartial evaluator of AI assistant responses. You answer with a single JSON object and nothing else."


def answer_format(field: str, meaning: str, example: dict, about: str) -> str:
    """How a perturbation judge answers: its fields described, an unrelated example, the unjudgeable form."""
    return (
        f'Answer with one JSON object with two fields, in this order: "reasoning" (string: {REASONING_FIELD}) and '
        f'"{field}" (a number from 0 to 1: {meaning}). For example, for an unrelated {about}, a correct answer was: '
        f"{json.dumps(example, ensure_ascii=False)}\nIf the {field} cannot be judged, answer instead with the "
        f'fields "reasoning" (why not) and "unjudgeable" (true), as in this unrelated case: '
        f"{json.dumps(UNJUDGEABLE_EXAMPLE, ensure_ascii=False)}\nAnswer with the JSON object only."
    )


def correctness_messages(
    question: str, answer: str, reference: str | None, context: str | None
) -> list[dict[str, str]]:
    ref = f"\n[Reference answer]\n<<<\n{reference}\n>>>\n" if reference else ""
    ctx = f"\n[Ground-truth context]\n<<<\n{context}\n>>>\n" if context else ""
    prompt = (
        f"Task: correctness (aip-judge perturbation_correctness v2)\n\nHow correct is the response to the "
        f"question? Use the reference answer and the ground-truth context when given; otherwise judge from "
        f"general knowledge. 1 = fully correct, 0 = wrong or no answer. Correctness cannot be judged when, for "
        f"example, the reference and the response speak of different things.\n\nQuestion:\n<<<\n{question}\n>>>\n"
        f"{ref}{ctx}\n[Response 1]\n<<<\n{answer}\n>>>\n\n"
        + answer_format(
            "correctness",
            "1 = fully correct, 0 = wrong or no answer",
            CORRECTNESS_EXAMPLE,
            "question about the height of Mont Blanc",
        )
    )
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}]


def robustness_messages(original: str, variant: str, base: str, answer: str) -> list[dict[str, str]]:
    prompt = (
        f"Task: robustness (aip-judge perturbation_robustness v2)\n\nThe second question is a noisy or reworded "
        f"version of the first, with the same meaning. How well does the second response keep the substance of "
        f"the first (conclusion, facts, numbers)? 1 = same substance, 0 = contradicts it. Robustness cannot be "
        f"judged when the two responses cannot be compared.\n\nOriginal question:\n"
        f"<<<\n{original}\n>>>\nReworded question:\n<<<\n{variant}\n>>>\n\n[Response 1]\n<<<\n{base}\n>>>\n\n"
        f"[Response 2]\n<<<\n{answer}\n>>>\n\n"
        + answer_format(
            "robustness",
            "1 = same substance, 0 = contradicts it",
            ROBUSTNESS_EXAMPLE,
            "pair of responses about a savings account",
        )
    )
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}]
