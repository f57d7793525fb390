"""The builtin judge's answer to the toy metric's prompt: ``polite`` when the response thanks the
user (the builtin SUT's answers open with "Thanks for the details"), and its word count."""

from __future__ import annotations

from typing import Any

from aip_assets.models.builtin import RESPONSE_BLOCK, BuiltinJudge


def judge_politeness(prompt: str) -> dict[str, Any]:
    answer = dict(RESPONSE_BLOCK.findall(prompt)).get("1", "")
    polite = "thank" in answer.lower()
    return {
        "polite": polite,
        "word_count": len(answer.split()),
        "reasoning": "The response thanks the user." if polite else "The response does not thank the user.",
    }


BUILTIN_JUDGES = {"toy_politeness": BuiltinJudge(judge_politeness)}
