"""Perturbation's judge exam: robustness of an answer against itself (``same_answer``: at least
0.7) and against its negation (``negation``: at most 0.4); correctness of an answer against a
reference it repeats (``matches_reference``: at least 0.7) and one it negates
(``contradicts_reference``: at most 0.4). Built on the run's own questions."""

from __future__ import annotations

from typing import Any

from ..exam import NO_ANSWER, YES_ANSWER, ExamItem, pick, within
from .prompts import Correctness, Robustness, correctness_messages, robustness_messages

# kind -> (judge kind, the judged answer, the bounds of its score)
PLAN: dict[str, tuple[str, str, float, float]] = {
    "same_answer": ("robustness", YES_ANSWER, 0.7, 1.0),
    "negation": ("robustness", NO_ANSWER, 0.0, 0.4),
    "matches_reference": ("correctness", YES_ANSWER, 0.7, 1.0),
    "contradicts_reference": ("correctness", NO_ANSWER, 0.0, 0.4),
}


def items(rows: list[Any], seed: int, n: int) -> list[ExamItem]:
    out: list[ExamItem] = []
    for kind, (judge_kind, answer, lo, hi) in PLAN.items():
        for i, row in enumerate(pick(rows, n, seed, f"perturbation:{kind}")):
            q = row.last_user_text
            robust = judge_kind == "robustness"
            out.append(
                ExamItem(
                    item_id=f"{kind}:{row.input_id}:{i}",
                    kind=kind,
                    messages=robustness_messages(q, q, YES_ANSWER, answer)
                    if robust
                    else correctness_messages(q, answer, YES_ANSWER, None),
                    verdict=Robustness if robust else Correctness,
                    expected=f"{judge_kind} from {lo:g} to {hi:g}",
                    grade=_grader(judge_kind, lo, hi),
                )
            )
    return out


def _grader(field: str, lo: float, hi: float):
    def grade(v: Any) -> str | None:
        if v.unjudgeable:
            return "it called two plain answers unjudgeable"
        return within(getattr(v, field), lo, hi, field)

    return grade
