"""A judge's qualifying exam: items whose verdict is known by construction (``ExamItem``), each
asked of an LLM judge exactly as the metric asks its judgements (the same prompt, verdict model,
labels and checks), and graded by what the construction makes true. A metric builds its items
from the run's own questions and labels (``Metric.exam_items``); ``judge_exam`` runs them.

Every item is judgeable: a verdict that declares it ``unjudgeable`` answers it wrong, and so does a
verdict the judge could not give (a failed call, a copy of the prompt's example, fields that
disagree, decisions that contradict what the answers plainly state)."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

# what a verdict's refusal says when it contradicts what the reader reads in the answers (a
# decision flip judge's decision, a semantic judge's "Consistent"): judge_exam counts them by it
DISAGREES_DECISION = "disagrees with the decision the answer states"
DISAGREES_STANCE = "disagrees with the stances the answers state"


@dataclass(frozen=True)
class ExamItem:
    """One exam question: ``messages`` as the metric sends them, the ``verdict`` model (with its
    ``context`` and ``enums``), what a right verdict says (``expected``, in words) and ``grade``,
    which reads a validated verdict and returns None when it is right, else what is wrong."""

    item_id: str
    kind: str  # what the item tests: same_decision, different_decisions, refusal, ...
    messages: list[dict[str, str]]
    verdict: type[BaseModel]
    expected: str
    grade: Callable[[Any], str | None]
    context: dict[str, Any] | None = None
    enums: dict[str, tuple[str, ...]] | None = None


def pick(rows: list[Any], n: int, seed: int, salt: str) -> list[Any]:
    """``n`` of ``rows`` (all of them when fewer), a seeded choice: the same run, the same items."""
    rows = list(rows)
    random.Random(f"exam:{salt}:{seed}").shuffle(rows)
    return (rows * (1 + n // max(len(rows), 1)))[:n] if rows else []


def swapped(seed: int, item_id: str) -> bool:
    """Whether an item shows its two answers the other way round (seeded per item): a judge that
    favours the first answer shown cannot pass by position."""
    return random.Random(f"exam:order:{seed}:{item_id}").random() < 0.5


def within(value: float | None, lo: float, hi: float, name: str) -> str | None:
    """None when ``lo <= value <= hi``, else what is wrong (a grade's common check)."""
    if value is None:
        return f"{name} is missing"
    if lo <= value <= hi:
        return None
    want = f"at least {lo:g}" if hi >= 1 else (f"at most {hi:g}" if lo <= 0 else f"between {lo:g} and {hi:g}")
    return f"{name} {value:g}, expected {want}"


# answers the items are made of: plain, short, and unlike the prompts' examples (a judge that copies
# an example cannot match them by accident)
HELPFUL = (
    "Thanks for asking, I am glad to help. Here is how I would go about it:\n"
    "1. Write down what you need and by when.\n"
    "2. Gather the documents that show your situation (income, identity, address).\n"
    "3. Contact the office in charge and ask which form applies to you; they can check it with you.\n"
    "If anything is unclear, tell me more about your situation and I will walk you through the next step."
)
CURT = "Not my problem. Look it up."
UNRELATED_HELP = (
    "To reset a home router, unplug it for thirty seconds, plug it back in and wait until the lights settle. "
    "If that does not help, hold the reset button for ten seconds and set up the network again."
)
# an answer that takes a stance and its negation (semantic consistency, perturbation robustness)
YES_ANSWER = "Yes. From what you describe, I would recommend going ahead: it fits your situation."
NO_ANSWER = "No. From what you describe, I would advise against going ahead: it does not fit your situation."
