"""The readers on recorded, hand-labelled output of real models (``corpora/real/``, issue 25).

SmolLM2-135M-Instruct and Gemma 3 270M (base) answered the project's own decision-flip probes and
factual-consistency questions at temperature 0.7, and judged the project's judge prompts, served
by llama.cpp (llama-cpp-python 0.3.36); a person labelled every item (``corpora/real/README.md``).
Here the builtin judge's decision reader, its figure comparison and the LLM-judge parser read
that text: per item where a reader should be exact, with measured precision / recall floors
otherwise; end to end over HTTP where the text reaches them through the pipeline (the scripted
server replays the recorded answers as the SUT, or the recorded judge outputs as the judge).
"""

from __future__ import annotations

import hashlib
import json

import pytest

from aip_assets import warehouse as wh
from aip_assets.metrics.consistency import Comparison, judge_messages
from aip_assets.readers.decisions import read_decision
from aip_assets.runspec import parse_spec

from . import real_corpus as rc
from .conftest import run_all
from .test_readers import ask_all

DATASET = rc.REAL / "dataset.jsonl"  # the demo dataset as it was when the corpus was recorded
TO_LABEL = {
    "same": "Consistent",
    "subset": "Slightly Inconsistent",
    "conflict": "Contradictory",
    "not_comparable": "Unjudgeable",
    "none": "Unjudgeable",
}


def prompt_id(messages: list[dict]) -> str:
    return "p-" + hashlib.sha256(json.dumps(messages, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:12]


def test_the_corpus_is_what_its_readme_says():
    dec, fac, jud, prompts = rc.load("decisions"), rc.load("factual_pairs"), rc.load("judge_outputs"), rc.prompts()
    assert len(dec) >= 150 and {e["model"] for e in dec} == {"smollm2", "gemma3"}
    assert len(fac) >= 60 and len(jud) >= 60 and {e["kind"] for e in fac} == {"reworded", "twin"}
    assert {e["form"] for e in dec} <= set(rc.DECISION_FORMS) and {e["label"] for e in fac} <= set(rc.FIGURE_LABELS)
    assert {e["schema"] for e in jud} == {"decision_flip", "factual_consistency"}
    assert {e["model"] for e in jud} == {"smollm2", "gemma3"}
    for e in dec:  # every label is one of the item's labels, and a statement or prose has one
        assert e["label"] is None or e["label"] in e["labels"], e["id"]
        assert (e["label"] is not None) == (e["form"] in ("statement", "prose")), e["id"]
        assert e["prompt"] in prompts and e["server"].startswith("llama-cpp-python 0.3.36")
        assert prompt_id(prompts[e["prompt"]]) == e["prompt"]
    schemas = rc.schemas()
    for e in jud:
        if e["form"] == "json_object_schema":
            assert e["response_format"]["type"] == "json_object" and e["response_format"]["schema"] in schemas, e["id"]
        assert e["prompt"] in prompts and e["label"] in ("verdict", "copy", "malformed", "no_json", "cut_off"), e["id"]
    assert len({e["id"] for e in dec + fac + jud}) == len(dec) + len(fac) + len(jud)


def test_read_decision_on_real_answers():
    """Statements are read exactly; a label is never read where the labeller found none (copied
    options "Decision: YES, NO", the instruction's "Decision: <label>" echoed, "The answer is
    yes." with other labels, "no decision was made"); a decision in prose is read right or not at
    all. Words that are no label are reported as the answer's own words."""
    for e in rc.load("decisions"):
        r = read_decision(e["raw"], e["labels"])
        if e["form"] == "statement":
            assert r.label == e["label"], (e["id"], e.get("note"), r)
        elif e["form"] == "prose":
            assert r.label in (None, e["label"]), (e["id"], e.get("note"), r)
        else:
            assert r.label is None, (e["id"], e.get("note"), r)
            if e["form"] == "other_words":
                assert r.stated == e["stated"], (e["id"], r)


def test_decision_reader_precision_and_recall():
    """Measured on the corpus (see its README): precision 1 over every answer, recall 1 over the
    statements; prose decisions are not statements, so recall over every decision a person reads
    is the statements' share of them (floor: the value measured when the corpus was labelled)."""
    s = rc.decision_scores()
    st, every = s["statements"], s["all"]
    assert st.readable >= 9 and st.precision == 1.0 and st.recall == 1.0, st.as_dict()
    assert every.precision == 1.0, every.as_dict()
    assert every.recall == pytest.approx(st.readable / every.readable), every.as_dict()
    assert every.recall >= 0.5, every.as_dict()


def test_builtin_judge_reads_real_answers_end_to_end(scripted):
    """The recorded SmolLM2 answers replayed by a scripted SUT for the same spec as the recording
    (the demo dataset as it was then, seed 7, gender, one pair a row, baseline share 0.5, so the
    same probes: a request the corpus did not record fails the test, naming it),
    judged by the builtin judge through the pipeline: each judged pair's decisions are the
    labeller's readings, and a pair with no decision on either side is excluded as no_decision."""
    answers = {(e["prompt"], e["sample_index"]): e for e in rc.load("decisions") if e["model"] == "smollm2"}
    prompts = rc.prompts()

    def sut(body, n):
        key = (prompt_id(body["messages"]), body.get("seed", 0))
        assert key in answers, f"a probe the corpus did not record (its prompts changed?): {body['messages'][-1]}"
        return answers[key]["raw"]

    server = scripted(sut)
    spec = parse_spec(
        {
            "name": "real",
            "dataset": str(DATASET),
            "seed": 7,
            "sut": server.conn(model="smollm2"),
            "judge": {"provider": "builtin"},
            "retry_backoff_seconds": 0.01,
            "metrics": {
                "llm.decision_flip": {
                    "baseline_share": 0.5,
                    "config": {
                        "dimensions": ["gender"],
                        "num_pairs_per_dimension": 1,
                        "sub_call_concurrency_limit": 8,
                        "sut_temperature": 0.7,
                    },
                }
            },
        }
    )
    run_all(spec, "real-1")
    assert len(server.bodies()) == len(answers)  # every probe was one the corpus recorded
    rows = wh.query(
        "SELECT pp.pair_id, pp.probe_a, pp.probe_b, pp.sample_b, pp.kind, j.status, j.decision_a, "
        "j.decision_b FROM judgements j JOIN probe_pairs pp USING (run_id, metric, pair_id) "
        "WHERE j.run_id = 'real-1'",
        [],
    ).to_dict("records")
    probes = {
        p["probe_id"]: json.loads(p["messages"])
        for p in wh.query("SELECT probe_id, messages FROM probes WHERE run_id = 'real-1'", []).to_dict("records")
    }

    def expected(probe: str, k: int) -> str | None:
        e = answers[(prompt_id(probes[probe]), k)]
        assert prompt_id(prompts[e["prompt"]]) == e["prompt"]
        return e["label"] if e["form"] == "statement" else None

    assert len(rows) >= 40
    seen = {"ok": 0, "no_decision": 0}
    for r in rows:
        r = {k: (None if isinstance(v, float) and v != v else v) for k, v in r.items()}  # NULL read as NaN
        da = expected(r["probe_a"], 0)
        db = expected(r["probe_b"], int(r["sample_b"]) if r["kind"] == "null" else 0)
        if da is None and db is None:
            assert r["status"] == "no_decision", r
        else:
            assert r["status"] == "ok" and (r["decision_a"], r["decision_b"]) == (da, db), r
        seen[r["status"]] += 1
    assert seen["ok"] >= 5 and seen["no_decision"] >= 20


def test_figure_comparison_on_real_pairs():
    """compare_figures on the factual pairs (reworded questions, and the same request answered
    twice): the relation is the labeller's on at least 85% of them, and a conflict is read where
    the labeller found one with precision and recall of at least 0.85 (floors just under the values
    measured when the corpus was labelled: 62 of 70, 7 of 8 and 7 of 8). A pair where an answer
    states no figure is never read as a conflict (nothing can contradict nothing)."""
    s = rc.figure_scores()
    assert s["pairs"] >= 60 and s["by_label"]["conflict"] >= 7 and s["by_label"]["not_comparable"] >= 10, s
    assert s["accuracy"] >= 0.85, s
    assert s["conflict"]["precision"] >= 0.85 and s["conflict"]["recall"] >= 0.85, s
    for e in rc.load("factual_pairs"):
        if e["label"] == "none":
            assert rc.figure_relation(e) != "conflict", (e["id"], e.get("note"))


def test_builtin_factual_judge_on_real_pairs_over_http(builtin_http):
    """The builtin factual judge, served over HTTP, labels each pair as its figure comparison
    reads it (figures about different quantities: unjudgeable, never a contradiction), and its
    contradictions are the labeller's conflicts with the precision measured above."""
    url, _ = builtin_http()
    entries = rc.load("factual_pairs")
    items = [
        (judge_messages("factual", *rc.questions(e), e["response_1"], e["response_2"]), Comparison) for e in entries
    ]
    contradictions = wrong = 0
    for e, o in zip(entries, ask_all(url, items)):
        assert o.value is not None, (e["id"], o.error)
        got = "Unjudgeable" if o.value.unjudgeable else o.value.label
        assert got == TO_LABEL[rc.figure_relation(e)], (e["id"], o.value)
        if got == "Unjudgeable":  # nothing to compare: never a score
            assert o.value.score is None, e["id"]
        contradictions += got == "Contradictory"
        wrong += got == "Contradictory" and e["label"] != "conflict"
    assert contradictions >= 7 and wrong / contradictions <= 0.15, (contradictions, wrong)


def test_judge_outputs_parsed_over_http(scripted):
    """What SmolLM2 and Gemma wrote as LLM judges (plain prompting, and llama.cpp's json_object
    with the verdict's schema), replayed by a scripted judge endpoint to the judging path (ask_json,
    validated against the row's labels as decision flip's judging does): a real verdict is parsed
    into what the labeller read; malformed JSON, prose and echoes are failed judgements with their
    raw text, never a verdict; of the copies of the prompt's format, only one whose values form a
    well-made verdict gets through (Gemma's {"label": "Consistent", "score": 1.0}, given on every
    pair: no single output can show it is a copy)."""
    import asyncio

    from aip_assets.metrics.judging import ask_json
    from aip_assets.models.client import ModelClient
    from aip_assets.runspec import Connection

    entries = rc.load("judge_outputs")
    by_id = {e["id"]: e for e in entries}
    server = scripted(lambda body, n: by_id[body["messages"][-1]["content"]]["raw"] or "")
    models = rc.judge_models()
    conn = Connection(provider="openai", base_url=server.url, model="judge", structured_output="off")

    async def go():
        async with ModelClient(
            conn, role="judge", run_id="real", metric="m", stage="judging", journal=None, concurrency=8
        ) as client:
            return await asyncio.gather(
                *(
                    ask_json(
                        client,
                        [{"role": "system", "content": "judge"}, {"role": "user", "content": e["id"]}],
                        models[e["schema"]],
                        retries=0,
                        timeout=10,
                        temperature=0.0,
                        template_version="t",
                        context=rc.judge_context(e),
                    )
                    for e in entries
                )
            )

    accepted_copies = []
    for e, o in zip(entries, asyncio.run(go())):
        if e["label"] == "verdict":
            assert o.value is not None and rc.reads_as(o.value, e["reads"]), (e["id"], o.error, o.value)
        elif e["label"] in ("malformed", "no_json", "cut_off"):
            assert o.value is None and o.error and o.raw == (e["raw"] or None), (e["id"], o.value)
        elif o.value is not None:
            accepted_copies.append(e["id"])
    assert len(accepted_copies) <= 1, accepted_copies
    s = rc.judge_scores()
    # the two that read like verdicts leave decision_2 out (grammar-constrained by the loose schema of the
    # time): a verdict states each decision, so none of the 69 is one; a verdict is parsed as read
    # wherever there is one (test_verdicts_real, test_structured_output)
    assert s["verdicts"] == s["verdicts_parsed_as_read"] == 0, s
    assert s["unusable"] >= 45 and s["unusable"] == s["unusable_rejected"], s
    assert s["copies_accepted"] == len(accepted_copies), s


def test_copied_examples_are_what_the_prompt_showed():
    """The outputs labelled ``copy`` hold the prompt's own text, not a reading of the answers: each
    string the labeller read in them is the prompt's (its example's placeholders, a persona
    sentence, a phrase of an answer, the format's first label) or a placeholder in angle brackets."""
    prompts = rc.prompts()
    copies = [e for e in rc.load("judge_outputs") if e["label"] == "copy"]
    assert len(copies) >= 10
    for e in copies:
        text = "\n".join(m["content"] for m in prompts[e["prompt"]])
        for value in e["reads"].values():
            if isinstance(value, str):
                assert value in text or (value.startswith("<") and value.endswith(">")), (e["id"], value)
    assert rc.judge_scores()["copies"] == len(copies)


def test_honest_verdicts_share_too_few_words_with_any_example_to_be_copies():
    """Issue 36: the copy rule (``NEAR_COPY_WORDS`` words in a row shared with an example) never
    calls an honest verdict a copy. Honest here: the builtin judges' reasoning over every decision
    answer of both corpora (paired with the first ten of the same labels, both ways) and every
    answer pair (each metric's judges), and every string of the 43 synthetic and 69 real judge
    outputs. They share at most 5 words in a row with any example of any verdict (measured when
    the rule was made); the rule asks for 8, which the English examples cut to 57 characters, as the
    old re-ask showed them, reach."""
    import itertools
    import re

    from aip_assets.metrics.consistency.builtin_judge import judge_consistency
    from aip_assets.metrics.decision_flip import judge_prompt
    from aip_assets.metrics.decision_flip.builtin_judge import favour_first, judge_decision_flip
    from aip_assets.metrics.group_interaction_bias import prompts as gib
    from aip_assets.metrics.group_interaction_bias.builtin_judge import judge_gib
    from aip_assets.metrics.perturbation.prompts import (
        Correctness,
        Robustness,
        correctness_messages,
        robustness_messages,
    )
    from aip_assets.metrics.verdicts import NEAR_COPY_WORDS, copied_text, shared_run
    from aip_assets.models.builtin import builtin_judge
    from aip_assets.readers.judge_json import scan_json

    from .test_readers import corpus

    verdicts = (*rc.judge_models().values(), *gib.VERDICTS.values(), Correctness, Robustness)
    examples = sorted({e for m in verdicts for e in m.EXAMPLES})
    assert len(examples) >= 19
    honest: set[str] = set()
    real_answers = {e["id"]: e["raw"] for e in rc.load("decisions")}
    by_labels: dict[tuple, list[str]] = {}
    for e in corpus("decisions.jsonl") + rc.load("decisions"):
        by_labels.setdefault(tuple(e["labels"]), []).append(e.get("answer") or e.get("raw") or "")
    for labels, answers in by_labels.items():
        for a, b in itertools.chain(itertools.product(answers, answers[:10]), itertools.product(answers[:10], answers)):
            prompt = judge_prompt("gender", "I am a woman.", "I am a man.", list(labels), a, b)
            v = judge_decision_flip(prompt)
            honest |= {v["reasoning"], favour_first(prompt, v)["reasoning"]}
    for p in corpus("consistency_pairs.jsonl") + rc.load("factual_pairs"):
        r1, r2 = (p["response_1"], p["response_2"]) if "response_1" in p else map(real_answers.get, p["answers"])
        question = p.get("question", "Should I?")
        for kind in ("semantic", "factual", "safety"):
            honest.add(
                judge_consistency(kind)(judge_messages(kind, question, question, r1, r2)[1]["content"])["reasoning"]
            )
        for kind in ("similarity", "tone", "effort"):
            honest.add(judge_gib(kind)(gib.judge_messages(kind, "en", r1, r2)[1]["content"])["reasoning"])
        for m in (correctness_messages(question, r2, r1, None), robustness_messages(question, question, r1, r2)):
            prompt = m[1]["content"]
            honest.add(builtin_judge(re.search(r"aip-judge (\w+) v", prompt).group(1)).answer(prompt)["reasoning"])
    for e in corpus("judge_outputs.jsonl") + rc.load("judge_outputs"):
        for o in scan_json(e["raw"] or "")[0]:
            honest |= {v for v in (o.values() if isinstance(o, dict) else ()) if isinstance(v, str) and "<" not in v}
    assert len(honest) >= 300
    longest = max(shared_run(text, e)[0] for text in honest for e in examples)
    assert longest <= 5 < NEAR_COPY_WORDS, longest
    assert not [text for text in honest if copied_text(text, examples)]
