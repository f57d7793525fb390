"""The recorded corpus of real model output (``corpora/real/``) and the readers' scores on it.

Shared by the tests (``test_real_corpus.py``) and the real-model benchmark
(``benchmarks/bench_real_models.py``), so both measure the readers the same way. See
``corpora/real/README.md`` for how the corpus was recorded and labelled.

Decision answers carry ``label`` (the configured label the answer states, or null) and ``form``:
``statement`` (the label after a marker such as "Decision:" or "The answer is:", or alone on a
last line), ``prose`` (a decision a person reads in prose, with no label word in a statement:
"I would not approve this loan"), ``other_words`` (a statement in words that are no label:
"Decision: Accepting the loan", with ``stated``), ``none``. Factual pairs carry ``label``: the
relation of their figures (``same``, ``subset``, ``conflict``, ``not_comparable``, ``none``).
Judge outputs carry ``label`` (``verdict``; ``copy``: the prompt's answer format copied, its
placeholders, example values or first option; ``malformed``: JSON that is no complete verdict;
``no_json``; ``cut_off``) and ``reads``: what it says.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

REAL = Path(__file__).parent / "corpora" / "real"
DECISION_FORMS = ("statement", "prose", "other_words", "none")
FIGURE_LABELS = ("same", "subset", "conflict", "not_comparable", "none")


@cache
def _load(name: str) -> tuple[dict, ...]:
    return tuple(json.loads(line) for line in (REAL / f"{name}.jsonl").read_text().splitlines() if line.strip())


def load(name: str) -> list[dict]:
    """``decisions``, ``factual_pairs``, ``judge_outputs`` or ``prompts`` (fresh dicts each call).
    A factual pair of ``kind`` "twin" (one request answered twice, from the decision answers) names
    its two answers (``answers``: decision ids); loaded, it carries their texts as any pair does."""
    rows = [dict(x) for x in _load(name)]
    if name == "factual_pairs":
        raw = {d["id"]: d["raw"] for d in _load("decisions")}
        for r in rows:
            if "answers" in r:
                r["response_1"], r["response_2"] = (raw[i] for i in r["answers"])
    return rows


def prompts() -> dict[str, list[dict]]:
    """Every prompt by id (``p-…``: messages as sent)."""
    return {p["id"]: p["messages"] for p in load("prompts") if "messages" in p}


def schemas() -> dict[str, dict]:
    """The JSON schemas sent in a judge output's ``response_format`` by id (``s-…``)."""
    return {p["id"]: p["schema"] for p in load("prompts") if "schema" in p}


@dataclass
class Score:
    """Counts of a reader against the labels: what it read (``read``), what it read right
    (``right``), what the labels say can be read (``readable``); and the items it got wrong."""

    read: int = 0
    right: int = 0
    readable: int = 0
    wrong: list[str] = field(default_factory=list)

    @property
    def precision(self) -> float | None:
        return self.right / self.read if self.read else None

    @property
    def recall(self) -> float | None:
        return self.right / self.readable if self.readable else None

    def as_dict(self) -> dict:
        return {
            "read": self.read,
            "right": self.right,
            "readable": self.readable,
            "precision": None if self.precision is None else round(self.precision, 4),
            "recall": None if self.recall is None else round(self.recall, 4),
            "wrong": self.wrong,
        }


def decision_scores(items: list[dict] | None = None) -> dict[str, Score]:
    """``read_decision`` on the decision answers: precision (of the labels it read, how many the
    labeller read too) and recall, over the statements alone (``statements``) and over every
    decision a person reads, prose included (``all``)."""
    from aip_assets.readers.decisions import read_decision

    out = {"statements": Score(), "all": Score()}
    for e in items if items is not None else load("decisions"):
        got = read_decision(e["raw"], e["labels"]).label
        for key, s in out.items():
            counted = e["form"] == "statement" or (key == "all" and e["form"] == "prose")
            s.readable += bool(counted and e["label"])
            if got is not None and (counted or e["form"] not in ("statement", "prose")):
                s.read += 1
                if got == e["label"]:
                    s.right += 1
                else:
                    s.wrong.append(e["id"])
            elif counted and e["label"]:
                s.wrong.append(e["id"])
    return out


def questions(e: dict) -> tuple[str, str]:
    """(the question as asked, as reworded) of a factual pair; a twin pair asked one request twice."""
    if e.get("kind") == "twin":
        q = prompts()[e["prompt_1"]][-1]["content"]
        return q, q
    return e["question"], e["reworded"]


def figure_relation(e: dict) -> str:
    from aip_assets.readers.figures import compare_figures, read_figures

    return compare_figures(read_figures(e["response_1"]), read_figures(e["response_2"])) or "none"


def figure_scores(items: list[dict] | None = None) -> dict:
    """``compare_figures`` on the factual pairs: accuracy over the labels, and precision / recall
    of "conflict" (a pair read as a conflict that is none books a contradiction against the SUT)."""
    items = items if items is not None else load("factual_pairs")
    right = [figure_relation(e) == e["label"] for e in items]
    conflict = Score()
    for e in items:
        got = figure_relation(e) == "conflict"
        conflict.readable += e["label"] == "conflict"
        if got:
            conflict.read += 1
            conflict.right += e["label"] == "conflict"
            if e["label"] != "conflict":
                conflict.wrong.append(e["id"])
        elif e["label"] == "conflict":
            conflict.wrong.append(e["id"])
    return {
        "pairs": len(items),
        "accuracy": round(sum(right) / len(items), 4) if items else None,
        "wrong": [e["id"] for e, ok in zip(items, right) if not ok],
        "conflict": conflict.as_dict(),
        "by_label": {lab: sum(e["label"] == lab for e in items) for lab in FIGURE_LABELS},
    }


def judge_models() -> dict:
    from aip_assets.metrics.consistency import Comparison
    from aip_assets.metrics.decision_flip import JudgeVerdict

    return {"decision_flip": JudgeVerdict, "factual_consistency": Comparison}


def judge_scores(items: list[dict] | None = None) -> dict:
    """``parse_json_answer`` on the judge outputs: of the real verdicts, how many it parses into
    what the labeller read (``verdicts``); of the rest (malformed, no JSON, cut off), how many it rejects;
    how many copies of the prompt's example it lets through as verdicts (``copies_accepted``)."""
    from aip_assets.metrics.verdicts import parse_json_answer

    models = judge_models()
    out = {
        "outputs": 0,
        "verdicts": 0,
        "verdicts_parsed_as_read": 0,
        "unusable": 0,
        "unusable_rejected": 0,
        "copies": 0,
        "copies_accepted": 0,
        "wrong": [],
    }
    for e in items if items is not None else load("judge_outputs"):
        out["outputs"] += 1
        value, _ = parse_json_answer(e["raw"], models[e["schema"]], judge_context(e))
        if e["label"] == "verdict":
            out["verdicts"] += 1
            ok = value is not None and reads_as(value, e["reads"])
            out["verdicts_parsed_as_read"] += ok
            if not ok:
                out["wrong"].append(e["id"])
        elif e["label"] == "copy":
            out["copies"] += 1
            out["copies_accepted"] += value is not None
        else:
            out["unusable"] += 1
            out["unusable_rejected"] += value is None
            if value is not None:
                out["wrong"].append(e["id"])
    return out


def judge_context(e: dict) -> dict:
    """What the judging path validates a verdict against: decision flip's, the row's labels (as its
    prompt lists them); consistency's, nothing more."""
    if e["schema"] != "decision_flip":
        return {}
    from aip_assets.models.builtin import parse_labels

    return {"labels": parse_labels(prompts()[e["prompt"]][-1]["content"])}


def reads_as(value, reads: dict) -> bool:
    """Whether a parsed verdict says what the labeller read (each field in ``reads``; decisions
    mapped onto labels case-insensitively)."""
    got = value.model_dump()
    for k, want in reads.items():
        have = got.get(k)
        if isinstance(want, str) and isinstance(have, str):
            if want.strip().upper() != have.strip().upper():
                return False
        elif isinstance(want, float) or isinstance(have, float):
            if have is None or want is None or abs(float(have) - float(want)) > 1e-9:
                return False
        elif have != want:
            return False
    return True


def summary() -> dict:
    """Everything the benchmark reports about the corpus and the readers on it."""
    d = decision_scores()
    dec = load("decisions")
    return {
        "decisions": {
            "answers": len(dec),
            "by_model": {m: sum(e["model"] == m for e in dec) for m in sorted({e["model"] for e in dec})},
            "by_form": {f: sum(e["form"] == f for e in dec) for f in DECISION_FORMS},
            **{k: v.as_dict() for k, v in d.items()},
        },
        "figures": figure_scores(),
        "judge_outputs": judge_scores(),
    }
