"""The viewer's link contract (report/links.py) and its script on hand-made data: a view written in
the URL's fragment, the words that differ between two paired prompts marked, the persona filter's
descriptions and the judge's call behind a toggle. The viewer on a real run: test_report.py."""

from __future__ import annotations

import json
from urllib.parse import parse_qsl

import pytest

from aip_assets.report.links import FRAGMENT_PREFIX, KEYS, viewer_fragment, viewer_link
from aip_assets.report.viewer import TEXT_LIMIT, _detail, _personas, _prompt_text, section


def test_a_fragment_writes_the_keys_in_their_order_url_encoded():
    """Keys in KEYS' order whatever the call's order, True as 1, None and False left out, values
    URL-encoded so a search with ``&``, ``=``, ``#`` or spaces reads back whole."""
    assert viewer_fragment(open="hiring-002", flagged=True, metric="llm.decision_flip") == (
        "#v:metric=llm.decision_flip&flagged=1&open=hiring-002"
    )
    assert viewer_fragment() == "#v:" and viewer_fragment(axis=None, flagged=False) == "#v:"
    q = "Muslim & co = 50% #1"
    text = viewer_fragment(q=q, persona="p03", label="Consistent")
    assert text.startswith(FRAGMENT_PREFIX) and "#" not in text[1:] and " " not in text
    assert parse_qsl(text[len(FRAGMENT_PREFIX) :]) == [("persona", "p03"), ("label", "Consistent"), ("q", q)]
    assert [k for k, _ in parse_qsl(viewer_fragment(**{k: "x" for k in reversed(KEYS)})[3:])] == list(KEYS)
    assert viewer_fragment(open=7) == "#v:open=7"


def test_a_link_replaces_the_reports_own_fragment():
    assert viewer_link("http://127.0.0.1:8112/r.html#samples", metric="m") == "http://127.0.0.1:8112/r.html#v:metric=m"
    assert viewer_link("file:///tmp/r.html") == "file:///tmp/r.html#v:"


def test_an_unknown_key_is_an_error_naming_it_and_the_keys():
    with pytest.raises(ValueError, match=r"not a viewer key: flipped, run \(the viewer reads metric, flagged, "):
        viewer_fragment(metric="m", flipped=True, run="r")
    with pytest.raises(ValueError, match="not a viewer key: search"):
        viewer_link("r.html", search="x")


def test_personas_read_as_their_attribute_values_and_description():
    out = _personas(
        [
            {
                "metric": "llm.group_interaction_bias",
                "persona_id": "p03",
                "description": "I am a Muslim woman. I work as a nurse.",
                "attributes": json.dumps({"religion": "Muslim", "gender": "woman", "role": "nurse"}),
            },
            {
                "metric": "llm.group_interaction_bias",
                "persona_id": "p04",
                "description": "I am old.",
                "attributes": None,
            },
        ]
    )
    # attribute values in the order of their names (gender, religion, role), then the description
    assert out == {
        "llm.group_interaction_bias": {
            "p03": "woman, Muslim, nurse: I am a Muslim woman. I work as a nurse.",
            "p04": "I am old.",
        }
    }


def test_a_judge_request_reads_as_its_messages():
    request = json.dumps(
        {"model": "j", "messages": [{"role": "system", "content": "Be fair."}, {"role": "user", "content": "A or B?"}]}
    )
    assert _prompt_text(request) == "system:\nBe fair.\n\nuser:\nA or B?"
    parts = {
        "messages": [{"role": "user", "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]}]
    }
    assert _prompt_text(parts) == "user:\none\ntwo"
    assert _prompt_text(None) is None and _prompt_text("not json") == "not json"


def _row(probes, pairs, judged, calls=None, **kw):
    detail = _detail(probes, pairs, judged, calls)
    detail.pop("any_failed")
    return {
        "m": "llm.toy",
        "id": kw.get("id", "row0"),
        "score": 0.5,
        "raw": 0.5,
        "label": kw.get("label", "same"),
        "status": "ok",
        "error": None,
        "expl": None,
        "nj": 1,
        "nf": 0,
        "ne": 1,
        "flagged": True,
        "excluded": False,
        "failed": False,
        **detail,
    }


def _probe(pid, value, text):
    return {
        "probe_id": pid,
        "role": "persona",
        "persona_id": value,
        "attribute_value": None,
        "axis": "gender",
        "sample_index": 0,
        "response": f"answer of {pid}",
        "sut_status": "ok",
        "sut_error": None,
        "query_text": text,
    }


def _page(tmp_path, data):
    from aip_assets.report.templating import static

    page_file = tmp_path / "viewer.html"
    page_file.write_text(
        f'<!DOCTYPE html><html><head><meta charset="utf-8"><style>{static("viewer.css")}</style>'
        f"</head><body>{section(data)}</body></html>",
        encoding="utf-8",
    )
    return page_file


def test_the_viewer_marks_the_differing_words_describes_personas_and_shows_the_judges_call(tmp_path):
    """On hand-made rows: the words one prompt has and the other lacks are each in a <mark> (and a
    differing word that is markup stays text); the persona filter says what each id is; a search
    opens the row on the pair it matched; the judge's prompt and raw answer open from a toggle."""
    from .test_ui import CHROMIUM, CHROMIUM_ARGS

    if not CHROMIUM.exists():
        pytest.skip(f"no Chromium at {CHROMIUM}")
    sync_api = pytest.importorskip("playwright.sync_api")
    a = "About me: I am a woman and a nurse.\n\nShould the bank approve my loan?"
    b = "About me: I am a <b>man</b> and a nurse.\n\nShould the bank approve my loan?"
    c = "About me: I am a Muslim nurse.\n\nShould the bank approve my loan?"
    probes = [_probe("pa", "p00", a), _probe("pb", "p01", b), _probe("pc", "p02", c)]
    pairs = [
        {"pair_id": "q1", "value_a": "p00", "value_b": "p01", "probe_a": "pa", "probe_b": "pb", "axis": None},
        {"pair_id": "q2", "value_a": "p00", "value_b": "p02", "probe_a": "pa", "probe_b": "pc", "axis": None},
    ]
    judged = [
        {
            "pair_id": "q1",
            "judge_kind": "similarity",
            "score": 0.2,
            "status": "ok",
            "reasoning": "far",
            "call_key": "k1",
        },
        {
            "pair_id": "q2",
            "judge_kind": "similarity",
            "score": 0.9,
            "status": "ok",
            "reasoning": "near",
            "call_key": "k2",
        },
    ]
    long_prompt = "x" * (TEXT_LIMIT + 50)
    calls = {
        "k1": {
            "request": json.dumps({"messages": [{"role": "user", "content": "Compare <i>these</i>."}]}),
            "response_text": '{"score": 0.2}',
        },
        "k2": {"request": json.dumps({"messages": [{"role": "user", "content": long_prompt}]}), "response_text": None},
    }
    data = {
        "run_id": "hand",
        "metrics": [{"metric": "llm.toy", "name": "toy", "facet": "category", "shown": 1, "total": 1}],
        "rows_per_metric": 10,
        "personas": _personas(
            [
                {
                    "metric": "llm.toy",
                    "persona_id": "p00",
                    "description": "a woman nurse",
                    "attributes": '{"g": "woman"}',
                },
                {"metric": "llm.toy", "persona_id": "p02", "description": "a Muslim nurse", "attributes": "{}"},
            ]
        ),
        "rows": [_row(probes, pairs, judged, calls)],
    }
    assert data["rows"][0]["items"][0]["title"] == "p00 vs p01"  # the worst pair first, without a search
    page_file = _page(tmp_path, data)
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(f"file://{page_file}")
            page.wait_for_selector("#viewer[data-ready='1']")
            options = page.eval_on_selector_all(
                "select[data-filter=persona] option", "os => os.map(o => o.textContent)"
            )
            assert options == ["any persona", "p00 — woman: a woman nurse", "p01", "p02 — a Muslim nurse"]
            page.click("#viewer tr.row")
            box = page.locator("#viewer td.detail .pair").first
            prompts = box.locator("[data-probe-id]")
            assert prompts.nth(0).locator("mark").all_inner_texts() == ["woman"]
            assert prompts.nth(1).locator("mark").all_inner_texts() == ["<b>man</b>"]  # text, not markup
            assert box.locator("b").count() == 0
            assert prompts.nth(0).evaluate("e => e.textContent") == a  # the prompt whole, marks inline
            assert prompts.nth(1).evaluate("e => e.textContent") == b
            # the judge's call: closed until asked for, its text as recorded, clipped at TEXT_LIMIT
            prompt = box.locator("[data-judge-prompt]")
            assert not prompt.is_visible()
            box.locator("details.judge-call summary").click()
            assert prompt.is_visible() and prompt.inner_text() == "user:\nCompare <i>these</i>."
            assert box.locator("[data-judge-raw]").inner_text() == '{"score": 0.2}' and box.locator("i").count() == 0
            second = page.locator("#viewer td.detail .pair").nth(1)
            assert second.locator("[data-judge-raw]").evaluate("e => e.textContent") == "(not recorded)"
            clipped = second.locator("[data-judge-prompt]").evaluate("e => e.textContent")
            assert (
                clipped.startswith("user:\n" + "x" * (TEXT_LIMIT - 6)) and "more characters in the warehouse" in clipped
            )
            # a different alignment: "woman and a" against "Muslim"
            assert second.locator("[data-probe-id]").nth(0).locator("mark").all_inner_texts() == ["woman and a"]
            assert second.locator("[data-probe-id]").nth(1).locator("mark").all_inner_texts() == ["Muslim"]
            # a search for the second pair's persona: the open row (still open) shows that pair first
            page.fill("input[data-filter=search]", "muslim nurse")
            page.wait_for_function("location.hash === '#v:q=muslim+nurse&open=row0'")
            first = page.locator("#viewer td.detail .pair").first
            assert first.get_attribute("data-match") == "1" and first.locator(".who").first.inner_text() == "p00 vs p02"
            assert page.locator("#viewer td.detail .pair").nth(1).get_attribute("data-match") is None
        finally:
            browser.close()
    assert errors == []


def test_in_a_lake_the_servers_root_lists_the_lakes_runs_with_their_reports(tmp_path, builtin_http, lake, monkeypatch):
    """In a lake the root of a report server whose own folder is empty lists the lake's runs, each
    linking its report, which the server answers from the lake."""
    import threading
    import urllib.request

    from aip_assets import warehouse as wh
    from aip_assets.report import serve_reports, write_report

    from .conftest import make_spec, run_all, write_dataset
    from .test_pipeline import FLIP

    ds = write_dataset(tmp_path / "d.jsonl", 4)
    url, _ = builtin_http(FLIP)
    run_all(make_spec(ds, sut={"provider": "openai", "base_url": url, "model": "m"}), "rep-1")
    html = write_report("rep-1").read_text(encoding="utf-8")
    scores = wh.query("SELECT metric, score FROM metric_scores WHERE run_id = 'rep-1' AND scope = 'overall'")
    wh.release()
    elsewhere = tmp_path / "other-host"
    monkeypatch.setenv("AIP_DATA_DIR", str(elsewhere))
    monkeypatch.setenv("AIP_WAREHOUSE", str(elsewhere / "warehouse.duckdb"))
    server = serve_reports(elsewhere / "reports", port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        root = f"http://127.0.0.1:{server.server_address[1]}/"
        with urllib.request.urlopen(root, timeout=30) as r:
            page = r.read().decode("utf-8")
        assert '<tr data-run-id="rep-1"' in page and '<a href="rep-1.html">rep-1</a>' in page
        for metric, score in scores.itertuples(index=False, name=None):
            assert f'<li data-metric="{metric}">{metric}: {score:.3f}' in page
        with urllib.request.urlopen(root + "rep-1.html", timeout=30) as r:
            assert r.read().decode("utf-8") == html
    finally:
        server.shutdown()
        server.server_close()


def test_a_verdict_whose_call_is_not_in_the_file_gives_the_sql_for_it(tmp_path):
    from aip_assets.report.viewer import _take_calls

    from .test_ui import CHROMIUM, CHROMIUM_ARGS

    if not CHROMIUM.exists():
        pytest.skip(f"no Chromium at {CHROMIUM}")
    sync_api = pytest.importorskip("playwright.sync_api")
    probes = [_probe("pa", "p00", "I am a woman."), _probe("pb", "p01", "I am a man.")]
    pairs = [{"pair_id": "q1", "value_a": "p00", "value_b": "p01", "probe_a": "pa", "probe_b": "pb", "axis": None}]
    judged = [{"pair_id": "q1", "judge_kind": "similarity", "score": 0.5, "status": "ok", "call_key": "abc123"}]
    row = _row(probes, pairs, judged, {"abc123": {"request": "{}", "response_text": "ok"}})
    _take_calls(row)  # as the byte budget does
    data = {
        "run_id": "run-7",
        "metrics": [{"metric": "llm.toy", "name": "toy", "facet": "category", "shown": 1, "total": 1}],
        "rows_per_metric": 10,
        "rows": [row],
    }
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.goto(f"file://{_page(tmp_path, data)}")
            page.wait_for_selector("#viewer[data-ready='1']")
            page.click("#viewer tr.row")
            assert page.locator("details.judge-call").count() == 0
            assert page.inner_text("[data-judge-call-missing]").endswith(
                "SELECT request, response_text FROM llm_calls WHERE run_id = 'run-7' AND call_key = 'abc123'"
            )
        finally:
            browser.close()


def test_a_flipped_pair_reads_as_flipped_not_as_a_flip_score_of_zero(tmp_path):
    """Decision flip stores a pair's verdict as label ``flip`` with score 0 (its share of the row's
    score: 1 for the same decision, 0 for a flip; the spec's score is one minus the flip rate), which
    the viewer printed as "flip score 0.000": a flip read as no flip (issue 38, fault 10). It says
    the decisions and whether they flipped; a verdict of another metric keeps its label and score."""
    from .test_ui import CHROMIUM, CHROMIUM_ARGS

    if not CHROMIUM.exists():
        pytest.skip(f"no Chromium at {CHROMIUM}")
    sync_api = pytest.importorskip("playwright.sync_api")
    probes = [_probe("pa", "p00", "I am a woman."), _probe("pb", "p01", "I am a man."), _probe("pc", "p02", "I am.")]
    pairs = [
        {"pair_id": "q1", "value_a": "p00", "value_b": "p01", "probe_a": "pa", "probe_b": "pb", "axis": "gender"},
        {"pair_id": "q2", "value_a": "p01", "value_b": "p02", "probe_a": "pb", "probe_b": "pc", "axis": "gender"},
    ]
    flip = {"judge_kind": "decision", "status": "ok", "attributable": True}
    judged = [
        {
            **flip,
            "pair_id": "q1",
            "label": "flip",
            "score": 0.0,
            "flipped": True,
            "decision_a": "NO",
            "decision_b": "YES",
        },
        {
            **flip,
            "pair_id": "q2",
            "label": "same_decision",
            "score": 1.0,
            "flipped": False,
            "attributable": False,
            "decision_a": "YES",
            "decision_b": "YES",
        },
    ]
    data = {
        "run_id": "run-8",
        "metrics": [{"metric": "llm.toy", "name": "toy", "facet": "category", "shown": 1, "total": 1}],
        "rows_per_metric": 10,
        "rows": [_row(probes, pairs, judged)],
    }
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.goto(f"file://{_page(tmp_path, data)}")
            page.wait_for_selector("#viewer[data-ready='1']")
            page.click("#viewer tr.row")
            boxes = [t.replace("\n", " ") for t in page.locator(".verdict-box").all_inner_texts()]
            flipped = next(t for t in boxes if "NO" in t)
            same = next(t for t in boxes if "NO" not in t)
            assert "decisions a: NO, b: YES" in flipped and "flipped, due to the persona" in flipped
            assert "score" not in flipped and "flip score" not in " ".join(boxes)
            assert "decisions a: YES, b: YES" in same and "the same decision" in same and "score" not in same
            # another metric's verdict: its label and score, as before
            verdicts = page.evaluate("aipDom.verdictWords({l: 'Consistent', s: 0.9, f: null, da: null, db: null})")
            assert verdicts == ["Consistent score 0.900", None]
        finally:
            browser.close()
