"""The toy metric's judge prompt. The tag ``(aip-judge toy_politeness v1)`` is how the builtin
judge recognises it (``builtin_judge.py``)."""

from __future__ import annotations

TEMPLATE_VERSION = "toy_politeness/v1"
JUDGE_TEMPLATE_VERSION = "toy_politeness/judge/v1"


def judge_messages(answer: str) -> list[dict[str, str]]:
    """The judge's request for one SUT answer."""
    return [
        {"role": "system", "content": "You are an impartial evaluator. Answer with one JSON object."},
        {
            "role": "user",
            "content": "Task: politeness (aip-judge toy_politeness v1)\n\n"
            "Does the response thank the user? Count its words.\n\n"
            f"[Response 1]\n<<<\n{answer}\n>>>\n\n"
            'Answer as {"polite": true or false, "word_count": an integer, '
            '"reasoning": one sentence}.',
        },
    ]
