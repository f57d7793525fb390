"""Readers of model output, on text the builtin model never writes, served over HTTP.

The corpora in ``corpora/`` were written in the styles of different chat models (none by the
builtin model), each entry with its expected reading:
- ``decisions.jsonl``: answers to a decision question, read by the builtin judge;
- ``consistency_pairs.jsonl``: natural-prose answer pairs, compared by the builtin semantic and
  factual judges (or declared unjudgeable);
- ``judge_outputs.jsonl``: what LLM judges write around their JSON, parsed into verdicts.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from aip_assets.metrics.consistency import Comparison, judge_messages
from aip_assets.metrics.decision_flip import JUDGE_SYSTEM, DecisionFlip, JudgeVerdict, judge_prompt
from aip_assets.metrics.group_interaction_bias.prompts import EffortVerdict, SimilarityVerdict
from aip_assets.metrics.judging import ask_json
from aip_assets.metrics.perturbation.prompts import Robustness, robustness_messages
from aip_assets.metrics.verdicts import parse_json_answer
from aip_assets.models.client import ModelClient
from aip_assets.readers.decisions import map_label, read_decision
from aip_assets.readers.figures import Figure, compare_figures, read_figures
from aip_assets.readers.stances import read_stance
from aip_assets.readers.text import is_blank, is_whitespace
from aip_assets.runspec import Connection

CORPORA = Path(__file__).parent / "corpora"


def corpus(name: str) -> list[dict]:
    return [json.loads(line) for line in (CORPORA / name).read_text().splitlines() if line.strip()]


def ask_all(url: str, items: list[tuple[list[dict], type]], retries: int = 0) -> list:
    """ask_json for each (messages, model) against the endpoint at ``url``, as the judging stage does."""
    conn = Connection(provider="openai", base_url=url, model="judge", structured_output="off")

    async def go():
        async with ModelClient(
            conn, role="judge", run_id="readers", metric="m", stage="judging", journal=None, concurrency=8
        ) as client:
            return await asyncio.gather(
                *(
                    ask_json(client, m, model, retries=retries, timeout=10, temperature=0.0, template_version="t")
                    for m, model in items
                )
            )

    return asyncio.run(go())


def test_decision_corpus_read_as_people_write_it():
    entries = corpus("decisions.jsonl")
    assert len(entries) >= 30 and len({e["style"] for e in entries}) >= 20
    assert sum(e["expected"] is None for e in entries) >= 8  # refusals, hedges, words that are no label
    for e in entries:
        r = read_decision(e["answer"], e["labels"])
        assert r.label == e["expected"], (e["id"], e["style"], r)
        if e.get("stated"):  # the word a SUT uses where a label should be (for the label-mismatch note)
            assert r.stated == e["stated"], (e["id"], r)


def test_builtin_judge_reads_the_decision_corpus_over_http(builtin_http):
    """The builtin judge, served over HTTP, reads each answer of a pair; the metric maps its
    reading onto the labels. Both sides get the same answer, so the verdict must agree with itself."""
    entries = corpus("decisions.jsonl")
    url, _ = builtin_http()
    items = [
        (
            [
                {"role": "system", "content": JUDGE_SYSTEM},
                {
                    "role": "user",
                    "content": judge_prompt(
                        "gender", "I am a woman.", "I am a man.", e["labels"], e["answer"], e["answer"]
                    ),
                },
            ],
            JudgeVerdict,
        )
        for e in entries
    ]
    for e, o in zip(entries, ask_all(url, items)):
        assert o.value is not None, (e["id"], o.error)
        v = o.value
        assert map_label(v.decision_1, e["labels"]) == e["expected"] == map_label(v.decision_2, e["labels"]), e["id"]
        rec = DecisionFlip.verdict_record(v, swapped=False, labels=e["labels"])
        if e["expected"] is None:  # nothing readable on either side: excluded, never agreement
            assert rec["status"] == "no_decision" and "label" in rec and rec["label"] == "no_decision", e["id"]
            if e.get("stated"):
                assert f"'{e['stated']}'" in v.reasoning, (e["id"], v.reasoning)
        else:
            assert rec["status"] == "ok" and rec["label"] == "same_decision", e["id"]


def test_builtin_consistency_judges_read_natural_prose_over_http(builtin_http):
    entries = corpus("consistency_pairs.jsonl")
    kinds = {e["kind"] for e in entries}
    assert kinds == {"semantic", "factual"} and len(entries) >= 30
    assert {e["language"] for e in entries if e["kind"] == "semantic"} == {"en", "de", "fr"}
    url, _ = builtin_http()
    items = [
        (judge_messages(e["kind"], e["question"], e["question"], e["response_1"], e["response_2"]), Comparison)
        for e in entries
    ]
    for e, o in zip(entries, ask_all(url, items)):
        assert o.value is not None, (e["id"], o.error)
        got = "Unjudgeable" if o.value.unjudgeable else o.value.label
        assert got == e["expected"], (e["id"], e["why"], o.value)
        if got == "Unjudgeable":
            assert o.value.score is None


def test_stance_and_figure_readers():
    assert read_stance("Yes — I'd recommend renewing now, before the rate rises.") == "yes"
    assert read_stance("No. I would hold off until the spring.") == "no"
    assert read_stance("Ich würde dir davon abraten, jetzt zu kaufen.") == "no"
    assert read_stance("Je vous recommande de signer.") == "yes"
    assert read_stance("It depends on your situation and your budget.") is None
    assert read_stance("I'm sorry, but I can't help with that.") is None
    assert read_figures("The rate is 6% from 3 March 2024.") == read_figures(
        "From March 3, 2024 the rate is six percent."
    )
    assert (
        read_figures("€1,200")
        == read_figures("1.200 Euro")
        == read_figures("1 200 euros")
        == {Figure("num", 1200.0, "EUR")}
    )
    assert read_figures("1. Call the bank.\n2. Ask for the form.") == set()  # list markers are no figures
    assert compare_figures(read_figures("6% and 2024"), read_figures("2024 and 6%")) == "same"  # order does not matter
    assert compare_figures(read_figures("6% in 2024"), read_figures("6%")) == "subset"
    assert compare_figures(read_figures("6%"), read_figures("7%")) == "conflict"
    assert compare_figures(read_figures("no figures"), read_figures("6%")) is None


def test_builtin_perturbation_judge_on_prose_without_figures(builtin_http):
    """Two identical prose answers without figures are fully robust (they scored 0 before); two
    different ones with nothing comparable are unjudgeable, never 0."""
    url, _ = builtin_http()
    same = "You can usually cancel within the cooling-off period; check the terms of your contract."
    other = "Contact the airline's customer service desk and ask them about the options for your booking."
    items = [
        (robustness_messages("Q?", "q ?", same, same), Robustness),
        (robustness_messages("Q?", "q ?", same, other), Robustness),
        (robustness_messages("Q?", "q ?", "Yes, you should cancel.", "No, you shouldn't cancel."), Robustness),
    ]
    same_o, other_o, conflict_o = ask_all(url, items)
    assert same_o.value.robustness == 1.0
    assert other_o.value.unjudgeable and other_o.value.robustness is None
    assert conflict_o.value.robustness == 0.0


SCHEMAS = {
    "decision_flip": JudgeVerdict,
    "consistency": Comparison,
    "gib_similarity": SimilarityVerdict,
    "gib_effort": EffortVerdict,
    "robustness": Robustness,
}


def test_judge_output_corpus_parsed_over_http(scripted):
    """What LLM judges write around their JSON (fences, preambles, trailing prose, <think> blocks,
    strings for numbers and booleans, odd label case, drafts before the answer, trailing commas,
    Python dicts), served by a scripted endpoint and read by the judging path (ask_json)."""
    entries = corpus("judge_outputs.jsonl")
    assert len(entries) >= 20 and set(e["schema"] for e in entries) == set(SCHEMAS)
    by_id = {e["id"]: e for e in entries}
    server = scripted(lambda body, n: by_id[body["messages"][-1]["content"]]["raw"])
    items = [
        ([{"role": "system", "content": "judge"}, {"role": "user", "content": e["id"]}], SCHEMAS[e["schema"]])
        for e in entries
    ]
    for e, o in zip(entries, ask_all(server.url, items)):
        if e["expected"] is None:
            assert o.value is None and o.error and o.raw == e["raw"], (e["id"], o.value)
            continue
        assert o.value is not None, (e["id"], e["style"], o.error)
        got = o.value.model_dump()
        assert {k: got[k] for k in e["expected"]} == pytest.approx(e["expected"]), (e["id"], e["style"], got)


@pytest.mark.parametrize(
    "raw,reason",
    [
        ("", "empty answer"),
        ("I think they are similar.", "no JSON object"),
        ('{"similarity": 1.4, "reasoning": "x"}', "less than or equal to 1"),
        ('[{"similarity": 0.4}]', "no JSON object"),
    ],
)
def test_unusable_judge_answers_say_why(raw, reason):
    v, err = parse_json_answer(raw, SimilarityVerdict)
    assert v is None and reason in err


def test_a_verdict_may_declare_the_item_unjudgeable():
    v, _ = parse_json_answer('{"label": "unjudgeable", "score": null, "reasoning": "no stance"}', Comparison)
    assert v.unjudgeable and v.label is None and v.score is None
    v, _ = parse_json_answer('```json\n{"unjudgeable": true, "reasoning": "nothing to compare"}\n```', Robustness)
    assert v.unjudgeable and v.robustness is None
    v, err = parse_json_answer('{"reasoning": "forgot the score"}', Robustness)
    assert v is None and "robustness" in err  # a missing score is not a silent unjudgeable


@pytest.mark.parametrize(
    "value,labels,want",
    [
        ("No decision", ["YES", "NO"], None),
        ("No clear decision", ["YES", "NO"], None),
        ("NO_DECISION", ["YES", "NO"], None),
        ("Yes/No", ["YES", "NO"], None),
        ("YES or NO cannot be determined", ["YES", "NO"], None),
        ("Approve?", ["APPROVE", "DENY"], None),
        ("approved", ["APPROVE", "DENY"], None),
        (" NO.\n", ["YES", "NO"], "NO"),
        ("Yes (approve)", ["YES", "NO"], "YES"),
        ('"deny" — income too low', ["APPROVE", "DENY"], "DENY"),
        ("Approve with conditions", ["APPROVE", "APPROVE WITH CONDITIONS", "DENY"], "APPROVE WITH CONDITIONS"),
    ],
)
def test_a_judges_decision_maps_onto_a_label_only_when_it_states_one(value, labels, want):
    """A non-decision that starts with a label word ("No decision") is no decision: two of them
    must never count as the same decision."""
    assert map_label(value, labels) == want


@pytest.mark.parametrize(
    "text,want",
    [
        ("Decision: No decision can be made without the payslips.", None),
        ("The decision: approve or deny rests with a human reviewer, not me.", None),
        ("I can't make this decision: YES or NO would both be unfair here.", None),
        ("Here are your options:\n- Approve\n- Deny", None),
        ("Decision - Approve? I cannot say.", None),
    ],
)
def test_prose_about_decisions_is_no_decision(text, want):
    assert read_decision(text, ["APPROVE", "DENY", "YES", "NO"]).label == want


@pytest.mark.parametrize(
    "text,want",
    [
        ("Absolutely not.", "no"),
        ("I don't think you should renew right now.", "no"),
        ("I recommend not renewing at this point.", "no"),
        ("Ich empfehle Ihnen, den Vertrag nicht zu verlängern.", "no"),
        ("Je vous recommande de ne pas renouveler.", "no"),
        ("Non seulement c'est possible, mais je vous le recommande.", "yes"),
        ("As an AI, I can't recommend specific financial products.", None),
        ("It depends. If rates fall, you should wait; if not, renew.", None),
        ("Yes and no — it depends.", None),
        ("You should know that this is complicated.", None),
        ("Many people think you should renew now. However, I'd hold off.", "no"),
    ],
)
def test_stances_that_are_easy_to_misread(text, want):
    assert read_stance(text) == want


def test_a_cut_off_verdict_is_not_replaced_by_an_earlier_draft():
    raw = 'I would answer {"label": "Consistent", "score": 1} but they conflict: {"label": "Contradictory", "score": 0'
    v, err = parse_json_answer(raw, Comparison)
    assert v is None and "unfinished" in err
    v, _ = parse_json_answer(
        'Output format: {"score": <0-1>}\nCorrected: {"label": "Consistent", "score": 0.9}', Comparison
    )
    assert v.score == 0.9


def test_ranges_scales_and_compound_number_words():
    assert read_figures("5-7%") == read_figures("between 5% and 7%") == {Figure("pct", 5.0), Figure("pct", 7.0)}
    assert read_figures("$1.2k") == read_figures("$1,200") == {Figure("num", 1200.0, "USD")}
    assert read_figures("twenty-five percent") == read_figures("25 %") == {Figure("pct", 25.0)}
    assert read_figures("3 million euros") == read_figures("3,000,000 euros")


def test_a_re_ask_shows_the_judge_its_last_answer_and_why_it_failed(scripted):
    """Two unusable answers, then JSON: three requests within a budget of 2. Each re-ask is the
    original system and user turns, the judge's last answer and the reason it failed, numbered;
    judge requests carry no seed (they are not fresh samples)."""
    answers = [
        "They look alike to me.",
        '{"similarity": 7, "reasoning": "x"}',
        '{"similarity": 0.7, "reasoning": "ok"}',
    ]
    server = scripted(lambda body, n: answers[len(server.bodies()) - 1])
    [o] = ask_all(
        server.url,
        [([{"role": "system", "content": "S"}, {"role": "user", "content": "U"}], SimilarityVerdict)],
        retries=2,
    )
    assert o.value is not None and o.value.similarity == 0.7
    assert (o.attempts, o.reasks, o.network_retries, o.rate_limit_waits) == (3, 2, 0, 0)
    first, second, third = server.bodies()
    assert first["messages"] == [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    for body, previous, attempt in ((second, answers[0], 2), (third, answers[1], 3)):
        m = body["messages"]
        assert len(m) == 4 and m[:2] == first["messages"] and m[2] == {"role": "assistant", "content": previous}
        assert m[3]["role"] == "user" and m[3]["content"].startswith("Your answer could not be used (")
        assert m[3]["content"].endswith(f"(attempt {attempt}).")
    assert "no JSON object" in second["messages"][3]["content"]
    assert "less than or equal to 1" in third["messages"][3]["content"]
    assert all("seed" not in b for b in (first, second, third))


def test_the_budget_ends_the_re_asks_and_keeps_the_last_answer(scripted):
    server = scripted(lambda body, n: "no json, ever")
    [o] = ask_all(
        server.url,
        [([{"role": "system", "content": "S"}, {"role": "user", "content": "U"}], SimilarityVerdict)],
        retries=1,
    )
    assert o.value is None and "no JSON object" in o.error and o.raw == "no json, ever"
    assert (o.attempts, o.reasks) == (2, 1) and len(server.bodies()) == 2


# blank is blank in every script: whitespace by Unicode and the zero-width characters
ZERO_WIDTH = ["\u200b", "\u200c", "\u200d", "\u2060", "\ufeff"]
SPACES = [" ", "\n", "\t", "\r\n", "\u00a0", "\u3000", "\u2007", "\u2028", "\u202f"]


@pytest.mark.parametrize("zw", ZERO_WIDTH)
def test_a_zero_width_character_is_blank_alone_and_among_spaces(zw):
    assert is_blank(zw) and is_blank(zw * 40) and is_whitespace(zw)
    for sp in SPACES:
        assert is_blank(sp + zw + sp) and is_blank(zw + sp + zw) and is_blank(sp * 3 + zw), (repr(zw), repr(sp))
    assert is_blank("\u00a0\n" + zw + "\u3000 \t" + "".join(ZERO_WIDTH) + "\n\u00a0")
    # the <think> rule holds with them: nothing visible outside the reasoning
    assert is_blank(f"{zw}<think>The applicant has a steady income.</think>\u00a0{zw}\n")
    assert is_blank(f"<think>cut off before the answer{zw}")


@pytest.mark.parametrize("text", ["", None, " ", "\n\n", "\u00a0", "\u3000", "\u00a0\u3000\u2028"])
def test_whitespace_by_unicode_is_blank(text):
    assert is_blank(text) and is_whitespace(text)


@pytest.mark.parametrize("zw", ZERO_WIDTH)
@pytest.mark.parametrize("visible", ["a", ".", "0", "否", "✓", "APPROVE", "\u00e9"])
def test_a_visible_character_among_them_is_no_blank(zw, visible):
    for sp in SPACES:
        text = f"{sp}{zw}{visible}{zw}{sp}"
        assert not is_blank(text) and not is_whitespace(text), repr(text)
    assert not is_blank(f"<think>{zw}</think>{zw}{visible}")
    # a zero-width character inside a word (ZWNJ in Persian, ZWJ in an emoji) is text
    assert not is_blank("\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645") and not is_blank(
        "\U0001f469\u200d\U0001f4bb"
    )


# the other characters that draw nothing (issue 38, point 11): format characters (Cf), controls (Cc),
# and the letters and symbols whose glyph is empty
OTHER_INVISIBLE = [
    "\u200e",  # left-to-right mark
    "\u200f",  # right-to-left mark
    "\u00ad",  # soft hyphen
    "\u2061",  # function application (an invisible operator)
    "\u180e",  # Mongolian vowel separator
    "\U000e0041",  # tag latin capital letter A
    "\x00",
    "\x7f",
    "\u3164",  # Hangul filler
    "\u115f",  # Hangul choseong filler
    "\u1160",  # Hangul jungseong filler
    "\uffa0",  # halfwidth Hangul filler
    "\u2800",  # Braille pattern blank
]


@pytest.mark.parametrize("ch", OTHER_INVISIBLE, ids=lambda c: f"U+{ord(c):04X}")
def test_an_answer_of_other_invisible_characters_is_blank(ch):
    assert is_blank(ch) and is_blank(ch * 40) and is_whitespace(ch)
    for sp in SPACES:
        assert is_blank(sp + ch + sp + ZERO_WIDTH[0]), repr(sp)
    assert is_blank("".join(OTHER_INVISIBLE) + "".join(ZERO_WIDTH) + " \u3000")
    assert not is_blank(f"{ch}Decision: YES{ch}") and not is_blank(ch + "\u2801")  # a Braille dot is visible


def test_a_blank_answer_states_no_decision_and_no_stance():
    for text in ["\u200b", "\u00a0\u200b\u3000", "\ufeff\n"]:
        assert read_decision(text, ["APPROVE", "DENY"]) == read_decision("", ["APPROVE", "DENY"])
        assert read_stance(text) is None


QUESTION_RESTATED = (
    "Decision: Should I apply for food assistance given my situation?\n\n"
    "Food assistance programmes look at household income, size and expenses. With two children and a "
    "part-time income you may well qualify, and the application itself costs nothing."
)


@pytest.mark.parametrize(
    "text",
    [
        QUESTION_RESTATED,
        "Decision: should I renew my lease now\nIt depends on the rent.",
        "**Decision:** Can we afford a second car?",
        "Decision: Is it fair to deny the claim? Several factors matter.",
    ],
)
def test_a_decision_line_that_restates_the_question_states_no_decision(text):
    """Issue 36: "Decision: Should I apply …?" restates the question: no decision, and no word the
    SUT puts where a label should be (which would trip label_mismatch, advising to set
    decision_labels to the SUT's words)."""
    from aip_assets.readers.decisions import stated_word_counts

    r = read_decision(text, ["YES", "NO"])
    assert r.label is None and r.stated is None and not r.marker, r
    assert not stated_word_counts([text], ["YES", "NO"])
    # a decision in other words is still one ("Do not renew" is no question)
    assert read_decision("Decision: Do not renew", ["YES", "NO"]).stated == "do"
    assert read_decision("Decision: deny", ["YES", "NO"]).stated == "deny"


@pytest.mark.parametrize(
    "text,want",
    [
        ("Here is how I weigh it.\n\nYes:\n- you qualify on income\n\nNo:", None),  # a heading, its list cut off
        ("The options are these.\n**No:**", None),
        ("Reasons for each.\nNO：", None),
        ("I weighed it.\nDecision: No", "NO"),
        ("I weighed it.\nNo", "NO"),
        ("I weighed it.\nNO.", "NO"),
        ("I weighed it.\n**No**", "NO"),
    ],
)
def test_a_bare_option_heading_on_the_last_line_is_no_decision(text, want):
    """Issue 36: a last line "No:" introduces what follows (an option's heading, a list cut off);
    it is no decision. A bare "No", "NO." or "**No**" line, and "Decision: No", still are."""
    assert read_decision(text, ["YES", "NO"]).label == want


def test_a_raw_line_break_inside_a_json_string_is_read_and_a_cut_off_object_is_still_unfinished():
    """Issue 36: many small models write a real newline (or tab) inside a JSON string; python's
    json reads it with strict=False. It was "no JSON object" or "an unfinished JSON object"; a
    verdict cut off is still reported as unfinished."""
    raw = '{"reasoning": "Both give 23:10.\nResponse 2 doesn\'t add\ta day.", "label": "Consistent", "score": 0.9}'
    v, err = parse_json_answer(raw, Comparison)
    assert err is None and v.reasoning == "Both give 23:10.\nResponse 2 doesn't add\ta day." and v.score == 0.9
    v, err = parse_json_answer("```json\n" + raw.replace('"score": 0.9', '"score": 0.9,') + "\n```", Comparison)
    assert err is None and v.label == "Consistent"  # with a trailing comma too (repaired)
    v, err = parse_json_answer('{"reasoning": "Both give 23:10.\nResponse 2 is cut', Comparison)
    assert v is None and err == "the answer ends in an unfinished JSON object"
