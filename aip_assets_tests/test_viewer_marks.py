"""A person marks the judge's verdicts right or wrong in the viewer: the data each checkable verdict
carries equals what ``aip-eval label export`` writes for it, and the file the viewer downloads is
one ``aip-eval label import`` takes unchanged (in headless Chromium, on a real run's report)."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pandas as pd
import pytest

from aip_assets import label_files
from aip_assets import warehouse as wh
from aip_assets.errors import AipError
from aip_assets.metrics.decision_flip import HUMAN_CATEGORIES as DF_CATEGORIES
from aip_assets.report import viewer
from aip_assets.report.queries import _Reader

from .test_report import METRICS, RUN, q, report, warehouse  # noqa: F401  (the run and its report: fixtures)

FLIP = "llm.decision_flip"
GIB = "llm.group_interaction_bias"


def viewer_data(db: Path) -> dict:
    with wh.session(db, read_only=True):
        return viewer.read(_Reader(RUN, db).records, list(METRICS), run_id=RUN, labels_dir=str(db.parent / "labels"))


def verdicts(data: dict, metric: str) -> list[dict]:
    rows = [r for r in data["rows"] if r["m"] == metric]
    return [v for r in rows for it in r["items"] for v in it["v"]] + [v for r in rows for v in r["single"]]


def test_a_checkable_verdict_carries_what_export_writes_for_it(warehouse, tmp_path):  # noqa: F811
    """For every metric: the verdicts with a judgement id are exactly the judgements export samples
    from (a verdict of the judge, not a null pair's, not a failed judge's), each with export's
    judge category, allowed categories and shown_hash; the allowed lists are once per metric."""
    data = viewer_data(warehouse)
    meta = {m["metric"]: m for m in data["metrics"]}
    assert data["label_file"] == {
        "columns": label_files.EXPORT_COLUMNS + label_files.VERDICT_COLUMNS + label_files.PERSON_COLUMNS,
        "formula_prefixes": ["=", "+", "-", "@", "\t", "\r"],
        "dir": str(warehouse.parent / "labels"),
    }
    for metric in METRICS:
        out = tmp_path / f"{metric}.csv"
        label_files.export(RUN, metric, 100_000, out, show_verdict=True, path=warehouse)
        with open(out, encoding="utf-8-sig", newline="") as fh:
            exported = {r["judgement_id"]: r for r in csv.DictReader(fh)}
        shown = verdicts(data, metric)
        checkable = {v["j"]: v for v in shown if "j" in v}
        assert set(checkable) == set(exported), metric
        lists = meta[metric]["allowed"]
        assert len(lists) == len({tuple(x) for x in lists})  # each list once
        for jid, v in checkable.items():
            e = exported[jid]
            assert (v["jc"], " | ".join(lists[v["la"]]), v["sh"]) == (
                e["judge_category"],
                e["allowed"],
                e["shown_hash"],
            ), (metric, jid)
    # group bias's three judges each have their own categories; decision flip one list
    assert sorted(x[0].split(":")[0] for x in meta[GIB]["allowed"]) == ["effort", "similarity", "tone"]
    assert len(meta[FLIP]["allowed"]) == 1


def test_null_pairs_and_failed_judgements_are_not_checkable(warehouse):  # noqa: F811
    """What the import would refuse is never offered: a judgement of a null pair (the no-effect
    baseline) and one whose judge failed have no judgement id in the viewer's data; every other
    judgement of a shown row has one."""
    data = viewer_data(warehouse)
    j = q(
        warehouse,
        """SELECT j.metric, j.judgement_id, j.status, p.kind FROM judgements j
           LEFT JOIN probe_pairs p USING (run_id, metric, pair_id) WHERE j.run_id = ?""",
        [RUN],
    )
    seen = {"failed": 0, "null": 0}
    for metric in METRICS:
        mine = j[j.metric == metric]
        refused = set(
            mine[~mine.status.isin(["ok", "no_decision", "unjudgeable"]) | (mine.kind == "null")].judgement_id
        )
        shown = verdicts(data, metric)
        assert len(shown) == len(mine)  # a small run: every verdict is in the file
        assert {v["j"] for v in shown if "j" in v} == set(mine.judgement_id) - refused, metric
        seen["failed"] += int((~mine.status.isin(["ok", "no_decision", "unjudgeable"])).sum())
        seen["null"] += int((mine.kind == "null").sum())
    assert seen["failed"] and seen["null"]  # the run has both (its judge answers garbage at times)


def test_a_formula_guard_reads_back_as_written(tmp_path):
    """Export's (and the viewer's) ' before a formula-looking cell is taken off on import; a text
    that only starts with ' stays as it is."""
    cells = ["=SUM(A1)", "- too strict", "+1", "@me", "'quoted", "plain, with a comma", 'a "quote"']
    out = tmp_path / "l.csv"
    with open(out, "w", encoding="utf-8-sig", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["judgement_id", "run_id", "metric", "human_label", "note"])
        for c in cells:
            w.writerow(["j", "r", "m", "flip", label_files._safe_cell(c)])
    assert [r["note"] for _, r in label_files.read_filled(out)] == cells


def _open_first_flagged(page, metric: str) -> None:
    page.select_option("select[data-filter=metric]", metric)
    page.check("input[data-filter=flagged]")
    page.click("#viewer tr.row >> nth=0")


def test_marks_in_headless_chromium_survive_a_reload_and_import_unchanged(warehouse, report, tmp_path):  # noqa: F811
    """Mark one verdict right and one wrong (a corrected category, a note that looks like a formula
    and holds a comma and quotes), and one of group bias; reload (the marks are kept); download: a
    file per metric that ``label import`` takes as it is, its labels those marked. A file whose
    answers were sampled again since is refused by its shown_hash."""
    from .test_ui import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS

    if not CHROMIUM.exists():
        pytest.skip(f"no Chromium at {CHROMIUM}")
    sync_api = pytest.importorskip("playwright.sync_api")
    out = report[0]
    note = '- missed the hedge, "really"'
    errors: list[str] = []
    files: dict[str, Path] = {}
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            ctx = browser.new_context(accept_downloads=True, viewport={"width": 1200, "height": 1600})
            page = ctx.new_page()
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(f"file://{out}")
            page.wait_for_selector("#viewer[data-ready='1']")
            assert page.inner_text("#viewer-marked") == "0 verdicts marked"
            assert page.is_disabled("[data-mark=download]")
            _open_first_flagged(page, FLIP)
            boxes = page.locator("#viewer td.detail .mark")
            first, second = boxes.nth(0), boxes.nth(1)
            ids = [first.get_attribute("data-mark-for"), second.get_attribute("data-mark-for")]
            first.locator("[data-mark=right]").click()
            second.locator("[data-mark=wrong]").click()
            # "judge wrong" offers the allowed categories but the judge's own
            options = second.locator("[data-mark=category] option").all_inner_texts()[1:]
            second.locator("[data-mark=note]").fill(note)
            second.locator("[data-mark=category]").select_option(options[0])
            assert first.get_attribute("data-marked") == "right" and second.get_attribute("data-marked") == "wrong"
            # one of group bias: its third of a judge, marked wrong
            page.uncheck("input[data-filter=flagged]")
            page.select_option("select[data-filter=metric]", GIB)
            page.click("#viewer tr.row >> nth=0")
            third = page.locator("#viewer td.detail .mark").first
            ids.append(third.get_attribute("data-mark-for"))
            third_category = page.evaluate(
                "id => JSON.parse(document.getElementById('aip-viewer-data').textContent).rows"
                ".flatMap(r => r.items.flatMap(it => it.v)).find(v => v.j === id).jc",
                ids[2],
            )
            third.locator("[data-mark=wrong]").click()
            gib_options = third.locator("[data-mark=category] option").all_inner_texts()[1:]
            third.locator("[data-mark=category]").select_option(gib_options[-1])
            assert page.inner_text("#viewer-marked") == "3 verdicts marked"
            # without a labeller, no file: the import would refuse it
            page.fill("[data-mark=labeller]", "")
            page.click("[data-mark=download]")
            assert "Write your name in labeller first" in page.inner_text("#viewer-marks-msg")
            page.fill("[data-mark=labeller]", "ann")

            page.reload()
            page.wait_for_selector("#viewer[data-ready='1']")
            assert page.inner_text("#viewer-marked") == "3 verdicts marked"
            assert page.input_value("[data-mark=labeller]") == "ann"
            _open_first_flagged(page, FLIP)
            second = page.locator(f"#viewer .mark[data-mark-for='{ids[1]}']")
            assert page.get_attribute(f"#viewer .mark[data-mark-for='{ids[0]}']", "data-marked") == "right"
            assert second.get_attribute("data-marked") == "wrong"
            assert second.locator("[data-mark=note]").input_value() == note
            assert second.locator("[data-mark=category]").input_value() == options[0]
            page.locator("#viewer td.detail .pair").nth(1).scroll_into_view_if_needed()
            page.screenshot(path=str(tmp_path / "viewer_marks.png"))

            downloads = []
            page.on("download", lambda d: downloads.append(d))
            page.click("[data-mark=download]")
            page.wait_for_function("document.querySelectorAll('[data-mark-file]').length === 2")
            for _ in range(200):  # both downloads' events, however late the second
                if len(downloads) == 2:
                    break
                page.wait_for_timeout(50)
            assert len(downloads) == 2
            for d in downloads:
                files[d.suggested_filename] = tmp_path / d.suggested_filename
                d.save_as(files[d.suggested_filename])
            commands = page.locator("[data-mark-command]").all_inner_texts()
        finally:
            browser.close()
    assert errors == []
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(tmp_path / "viewer_marks.png", ARTIFACTS / "viewer_marks.png")
    labels = warehouse.parent / "labels"
    assert sorted(files) == [f"{RUN}--{FLIP}--viewer.csv", f"{RUN}--{GIB}--viewer.csv"]
    assert commands == [f"aip-eval label import {labels}/{name}" for name in sorted(files)]
    flip_file = files[f"{RUN}--{FLIP}--viewer.csv"]
    raw = flip_file.read_bytes()
    assert raw.startswith(b"\xef\xbb\xbfjudgement_id,run_id,") and b"\r\n" in raw  # as export writes
    with open(flip_file, encoding="utf-8-sig", newline="") as fh:
        reader = csv.DictReader(fh)
        rows = list(reader)
    assert reader.fieldnames == label_files.EXPORT_COLUMNS + label_files.VERDICT_COLUMNS + label_files.PERSON_COLUMNS
    assert [r["judgement_id"] for r in rows] == sorted(ids[:2])
    by_id = {r["judgement_id"]: r for r in rows}
    assert by_id[ids[1]]["note"] == "'" + note  # guarded as export guards a cell that looks like a formula

    judge = q(
        warehouse,
        "SELECT judgement_id, CASE WHEN status = 'ok' THEN label ELSE status END AS category FROM judgements "
        "WHERE run_id = ? AND metric = ?",
        [RUN, FLIP],
    )
    judge = dict(zip(judge.judgement_id, judge.category))
    for name, metric in ((flip_file, FLIP), (files[f"{RUN}--{GIB}--viewer.csv"], GIB)):
        result = label_files.import_labels(name, path=warehouse)
        assert (result["metric"], result["imported"], result["blank"]) == (metric, 2 if metric == FLIP else 1, 0)
    stored = q(
        warehouse,
        "SELECT judgement_id, category, judge_category, labeller, note FROM human_labels WHERE run_id = ? "
        "AND labeller = 'ann'",
        [RUN],
    ).to_dict("records")
    got = {
        r["judgement_id"]: (
            r["category"],
            r["judge_category"],
            r["labeller"],
            None if pd.isna(r["note"]) else r["note"],
        )
        for r in stored
    }
    assert judge[ids[0]] == "flip"  # the flagged row's first pair
    flip_wrong = judge[ids[1]]  # the second pair's verdict: marked wrong, whatever the judge said
    assert flip_wrong not in options and len(options) == len(DF_CATEGORIES) - 1  # all the allowed but the judge's
    gib_judge = third_category
    assert gib_judge not in gib_options and len(gib_options) == 3
    assert got == {
        ids[0]: ("flip", "flip", "ann", None),  # the flagged row's first pair: a flip, marked right; no note
        ids[1]: (options[0], flip_wrong, "ann", note),
        ids[2]: (gib_options[-1], gib_judge, "ann", None),
    }

    # the answers of the judgement marked wrong sampled again: the same file is refused, nothing written
    with wh.connect(warehouse) as con:
        con.execute(
            "UPDATE sut_responses SET response = response || ' (again)' WHERE run_id = ? AND metric = ? AND "
            "probe_id = (SELECT probe_b FROM probe_pairs p JOIN judgements j USING (run_id, metric, pair_id) "
            "WHERE j.run_id = ? AND j.metric = ? AND j.judgement_id = ?)",
            [RUN, FLIP, RUN, FLIP, ids[1]],
        )
    before = q(warehouse, "SELECT count(*) AS n, max(imported_at) AS t FROM human_labels WHERE run_id = ?", [RUN])
    row = 2 + sorted(ids[:2]).index(ids[1])
    with pytest.raises(AipError, match=rf"row {row}, field shown_hash: the questions and answers this row showed"):
        label_files.import_labels(flip_file, path=warehouse)
    after = q(warehouse, "SELECT count(*) AS n, max(imported_at) AS t FROM human_labels WHERE run_id = ?", [RUN])
    assert after.to_dict("records") == before.to_dict("records")


def test_marks_download_from_the_report_server_too(warehouse, report, tmp_path):  # noqa: F811
    """Served by ``aip-eval report --serve`` (read-only: it has no way to write), the page makes the
    file itself: a mark downloads as the same file, which the import takes."""
    import threading

    from aip_assets.report import report_url, serve_reports

    from .test_ui import CHROMIUM, CHROMIUM_ARGS

    if not CHROMIUM.exists():
        pytest.skip(f"no Chromium at {CHROMIUM}")
    sync_api = pytest.importorskip("playwright.sync_api")
    out = report[0]
    before = sorted(p.name for p in out.parent.iterdir())
    server = serve_reports(out.parent, port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            try:
                page = browser.new_context(accept_downloads=True).new_page()
                page.goto(report_url(out, server.server_address[1]))
                page.wait_for_selector("#viewer[data-ready='1']")
                assert page.inner_text("#viewer-marked") == "0 verdicts marked"  # another origin: its own marks
                _open_first_flagged(page, FLIP)
                box = page.locator("#viewer td.detail .mark").first
                jid = box.get_attribute("data-mark-for")
                box.locator("[data-mark=right]").click()
                page.fill("[data-mark=labeller]", "bo")
                with page.expect_download() as d:
                    page.click("[data-mark=download]")
                file = tmp_path / d.value.suggested_filename
                d.value.save_as(file)
            finally:
                browser.close()
    finally:
        server.shutdown()
        server.server_close()
    assert file.name == f"{RUN}--{FLIP}--viewer.csv"
    assert sorted(p.name for p in out.parent.iterdir()) == before  # nothing written beside the reports
    result = label_files.import_labels(file, path=warehouse)
    assert result["imported"] == 1
    got = q(
        warehouse,
        "SELECT category, judge_category FROM human_labels WHERE run_id = ? AND metric = ? AND judgement_id = ? "
        "AND labeller = 'bo'",
        [RUN, FLIP, jid],
    )
    assert got.to_dict("records") == [{"category": "flip", "judge_category": "flip"}]


def test_a_mark_made_on_other_answers_is_shown_stale_and_left_out(report, tmp_path):  # noqa: F811
    """A mark kept from a report built before the run's answers were sampled again (its shown_hash
    is not this report's) is shown as such and left out of the file, which the import would refuse
    whole; marked again, it is in the file."""
    from .test_ui import CHROMIUM, CHROMIUM_ARGS

    if not CHROMIUM.exists():
        pytest.skip(f"no Chromium at {CHROMIUM}")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_context(accept_downloads=True).new_page()
            page.goto(f"file://{report[0]}")
            page.wait_for_selector("#viewer[data-ready='1']")
            _open_first_flagged(page, FLIP)
            box = page.locator("#viewer td.detail .mark").first
            jid = box.get_attribute("data-mark-for")
            old = {"m": FLIP, "j": jid, "i": "x", "jc": "flip", "h": "flip", "n": "", "sh": "sha256:0000000000000000"}
            page.evaluate(
                "([key, mark]) => localStorage.setItem(key, JSON.stringify({marks: {[mark.m + '\\u001f' + mark.j]: mark}}))",
                [f"aip-viewer-marks:{RUN}", old],
            )
            page.reload()
            page.wait_for_selector("#viewer[data-ready='1']")
            _open_first_flagged(page, FLIP)
            box = page.locator(f"#viewer td.detail .mark[data-mark-for='{jid}']")
            assert box.get_attribute("data-marked") == "stale"
            assert "since sampled again" in box.locator("[data-mark=state]").inner_text()
            page.fill("[data-mark=labeller]", "cy")
            page.click("[data-mark=download]")
            assert page.get_attribute("[data-mark-stale]", "data-mark-stale") == "1"
            assert page.locator("[data-mark-file]").count() == 0  # nothing left to write
            box.locator("[data-mark=right]").click()
            assert box.get_attribute("data-marked") == "right"
            with page.expect_download() as d:
                page.click("[data-mark=download]")
            file = tmp_path / d.value.suggested_filename
            d.value.save_as(file)
            assert page.locator("[data-mark-stale]").count() == 0
        finally:
            browser.close()
    with open(file, encoding="utf-8-sig", newline="") as fh:
        [row] = list(csv.DictReader(fh))
    assert row["judgement_id"] == jid and row["shown_hash"] != old["sh"] and row["shown_hash"].startswith("sha256:")
