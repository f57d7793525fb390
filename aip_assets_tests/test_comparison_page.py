"""The comparison page (`aip-eval compare A B --html`): rows of two runs paired and ordered on
hand-made uneven inputs, comparisons matched across runs, and the demo run twice (the fair builtin
SUT, then the demo's flawed one) in headless Chromium: its numbers are `compare --json`'s, the
changed rows come first, and a link reproduces a filtered view."""

from __future__ import annotations

import json
import shutil
import threading
import urllib.request
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

import pandas as pd
import pytest
import yaml

from aip_assets import compare
from aip_assets import warehouse as wh
from aip_assets.cli import main
from aip_assets.report.comparison import KINDS, align, default_out, pair_rows
from aip_assets.report.links import comparison_fragment, comparison_link, viewer_link

from .conftest import built_once

REPO = Path(__file__).resolve().parents[1]
A, B = "demo-fair", "demo-flawed"
METRICS = ["llm.decision_flip", "llm.group_interaction_bias", "llm.semantic_consistency", "llm.perturbation_robustness"]


def row(metric, input_id, score, label, status="ok", nj=2, nf=0):
    return {
        "metric": metric,
        "input_id": input_id,
        "score": score,
        "label": label,
        "status": status,
        "n_judged": nj,
        "n_failed": nf,
        "n_events": 0,
    }


def test_rows_pair_by_metric_and_id_the_differences_first():
    """A changed label first (the larger |diff| first, an unscored side last among them), then a
    row scored in one run only or whose status changed, then changed scores by |diff|, then the
    unchanged; labels compared ignoring case; rows in one run only apart and counted; a metric not
    compared left out."""
    m, n = "llm.m1", "llm.m2"
    rows_a = [
        row(m, "x1", 1.0, "consistent"),
        row(m, "x2", 0.5, "flipped"),
        row(m, "x3", 0.8, "ok"),
        row(m, "x4", 0.9, "ok"),  # only in A
        row(m, "x5", None, None, nj=0, nf=2),  # excluded whole in A, scored in B
        row(m, "x6", 1.0, "ok"),
        row(m, "x8", 0.4, "flipped"),  # unscored in B, its label gone
        row(m, "x9", 1.0, "ok"),  # errored in B with the same (no) change of label
        row(n, "y1", 0.5, "ok"),
        row("llm.other", "x1", 0.0, "bad"),  # not compared
    ]
    rows_b = [
        row(m, "x1", 0.75, "flipped"),
        row(m, "x2", 0.5, "Flipped"),  # the same label in another case: unchanged
        row(m, "x3", 0.6, "ok"),
        row(m, "x5", 0.9, None),
        row(m, "x6", 1.0, "ok"),
        row(m, "x7", 0.1, "ok"),  # only in B
        row(m, "x8", None, None, status="error", nj=0, nf=0),
        row(m, "x9", 1.0, "ok", status="error"),
        row(n, "y1", 0.2, "ok"),
        row("llm.other", "x1", 1.0, "good"),
    ]
    out = pair_rows(rows_a, rows_b, [m, n])
    assert [(p["m"], p["id"], p["kind"]) for p in out["pairs"]] == [
        (m, "x1", "label"),
        (m, "x8", "label"),
        (m, "x5", "scored"),
        (m, "x9", "scored"),
        (n, "y1", "score"),  # |diff| 0.3 before x3's 0.2, whatever the metric
        (m, "x3", "score"),
        (m, "x2", "same"),
        (m, "x6", "same"),
    ]
    first = out["pairs"][0]
    assert first["d"] == -0.25 and first["a"]["score"] == 1.0 and first["b"]["label"] == "flipped"
    assert out["pairs"][1]["d"] is None and out["pairs"][2]["d"] is None
    assert out["pairs"][2]["a"] == {"score": None, "label": None, "status": "ok", "nj": 0, "nf": 2, "ne": 0}
    assert out["pairs"][4]["d"] == pytest.approx(-0.3)
    assert [(r["m"], r["id"], r["side"], r["score"]) for r in out["only"]] == [(m, "x4", "a", 0.9), (m, "x7", "b", 0.1)]
    assert out["counts"] == {
        m: {"both": 7, "changed": 5, "label": 2, "only_a": 1, "only_b": 1},
        n: {"both": 1, "changed": 1, "label": 0, "only_a": 0, "only_b": 0},
    }
    assert pair_rows(rows_a, rows_b, []) == {"pairs": [], "only": [], "counts": {}}


def verdict(label, score, da=None, db=None, flipped=None, status="ok", reasoning="r"):
    return {
        **{"k": "decision", "c": None, "l": label, "s": score, "da": da, "db": db, "f": flipped, "at": None},
        **{"st": status, "e": None, "r": reasoning, "jp": "the judge's prompt"},  # the prompt: left out of the page
    }


def detail(items, single=(), probes=("p1", "p2", "p3", "p4")):
    return {
        "probes": [{"id": p} for p in probes],
        "items": [
            {"title": t, "axis": ax, "a": {"p": pa, "s": "0"}, "b": {"p": pb, "s": "0"}, "v": vs}
            for t, ax, pa, pb, vs in items
        ],
        "single": list(single),
    }


def test_comparisons_match_across_runs_by_their_probes_the_changed_first():
    """The same two probes are one comparison whatever its title; a comparison one run lacks has
    None on that side; the changed ones come first, each group in run B's order, then A's; a
    verdict's judge call is not carried."""
    same = verdict("same_decision", 1.0, "YES", "YES", False)
    flip = verdict("flip", 0.0, "NO", "YES", True, reasoning="b decides YES")
    a = detail(
        [
            ("man vs woman", "gender", 0, 1, [same]),
            ("Sikh vs Hindu", "religion", 2, 3, [same]),
            ("only in A", "role", 1, 2, [same]),
        ],
        single=[verdict("correct", 1.0)],
    )
    b = detail(
        [
            ("Sikh vs Hindu", "religion", 2, 3, [same]),
            ("man vs woman (renamed)", "gender", 0, 1, [flip]),
            ("only in B", "role", 3, 0, [same]),
        ],
        single=[verdict("correct", 0.0)],
    )
    got = align(a, b)
    assert [(it["t"], it["ch"], it["a"] is not None, it["b"] is not None) for it in got] == [
        ("man vs woman (renamed)", True, True, True),
        ("only in B", True, False, True),
        ("verdict on one answer", True, True, True),
        ("only in A", True, True, False),
        ("Sikh vs Hindu", False, True, True),
    ]
    assert got[0]["a"][0]["l"] == "same_decision" and got[0]["b"][0]["f"] is True and got[0]["ax"] == "gender"
    assert got[0]["b"][0]["r"] == "b decides YES" and "jp" not in got[0]["b"][0]
    # a label in another case with the same score and decisions reads as the same verdict
    upper = detail([("Sikh vs Hindu", "religion", 2, 3, [verdict("SAME_DECISION", 1.0, "YES", "YES", False)])])
    assert [it["ch"] for it in align(detail([("Sikh vs Hindu", "religion", 2, 3, [same])]), upper)] == [False]
    # no probes recorded: matched by title; one run without the row's evidence at all
    untitled = detail([("base vs formal", None, None, None, [same])])
    assert [it["ch"] for it in align(untitled, untitled)] == [False]
    assert [(it["a"], it["ch"]) for it in align(None, untitled)] == [(None, True)]


def test_an_unknown_comparison_page_key_is_an_error_and_keys_keep_their_order():
    assert comparison_fragment(open="r1", changed=True, metric="m", q="a b") == "#v:metric=m&changed=1&q=a+b&open=r1"
    assert comparison_link("x.html#scores", changed=False) == "x.html#v:"
    with pytest.raises(ValueError, match=r"not a comparison page key: flagged \(the comparison page reads metric, "):
        comparison_fragment(flagged=True)


# ------------------------------------------------------------------ the demo twice
@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The demo's spec (four of its metrics: decision flip, group bias, semantic consistency and
    perturbation robustness) run twice into one warehouse: with the fair builtin SUT (run A), then
    with the demo's own flawed one (run B); each run's report is written by the run."""

    def build(root):
        spec = yaml.safe_load((REPO / "data" / "runs" / "demo.yaml").read_text())
        spec["dataset"] = str(REPO / "data" / "datasets" / "demo_decisions.jsonl")
        spec["metrics"] = {m: spec["metrics"][m] for m in METRICS}
        db = root / "data" / "warehouse.duckdb"
        with pytest.MonkeyPatch.context() as mp:
            mp.chdir(root)
            mp.setenv("AIP_WAREHOUSE", str(db))
            mp.delenv("DAGSTER_HOME", raising=False)
            for run_id, sut in ((A, {"provider": "builtin", "profile": {"name": "fair"}}), (B, spec["sut"])):
                path = root / f"{run_id}.yaml"
                path.write_text(yaml.safe_dump({**spec, "sut": sut}))
                mp.setenv("AIP_DATA_DIR", str(root / "data"))  # a run in this process sets its own marker
                mp.delenv("AIP_DATA_DIR_SET", raising=False)
                assert main(["run", str(path), "--run-id", run_id, "--quiet"]) in (0, 1)
        wh.release()

    return built_once(tmp_path_factory, "comparison", build) / "data" / "warehouse.duckdb"


@pytest.fixture
def warehouse(demo, tmp_path):
    """This test's own copy of the two runs' data folder (the warehouse and the runs' reports), where
    AIP_WAREHOUSE points (conftest.isolated)."""
    shutil.copytree(demo.parent, tmp_path / "data", dirs_exist_ok=True)
    return tmp_path / "data" / "warehouse.duckdb"


def compared(db: Path, capsys, *extra: str) -> tuple[dict, str]:
    """`aip-eval compare A B --json` and the stderr it wrote."""
    assert main(["compare", A, B, "--json", "--warehouse", str(db), *extra]) == 0
    out = capsys.readouterr()
    return json.loads(out.out), out.err


def sql(db: Path, query: str, params: list | None = None):
    return wh.query(query, params or [], path=db, read_only=True)


def test_cli_writes_the_page_beside_the_reports_and_keeps_its_output(warehouse, capsys):
    """--html leaves stdout as it was (the table, or JSON that parses) and says on stderr where the
    page is and where `report --serve` serves it; --json's numbers are compare_runs's exactly; a
    --html that names no .html file is bad input."""
    assert main(["compare", A, B, "--warehouse", str(warehouse)]) == 0
    table = capsys.readouterr().out
    assert main(["compare", A, B, "--warehouse", str(warehouse), "--html"]) == 0
    out = capsys.readouterr()
    page = default_out(A, B, warehouse)
    assert out.out == table and page.is_file() and page.parent == warehouse.parent / "reports"
    assert out.err.splitlines() == [
        f"comparison page: {page.resolve()}",
        f"served by `aip-eval report --serve` at http://127.0.0.1:8112/{page.name}",
    ]
    elsewhere = warehouse.parent.parent / "elsewhere" / "c.html"
    doc, err = compared(warehouse, capsys, "--html", str(elsewhere))
    assert elsewhere.is_file() and err.splitlines() == [f"comparison page: {elsewhere.resolve()}"]
    # a page outside the reports folder links to the reports by their file URLs
    text = elsewhere.read_text()
    block = text[text.index('id="aip-compare-data">') + len('id="aip-compare-data">') : text.index("</script>")]
    reports = json.loads(block)["reports"]
    assert reports == {
        s: (warehouse.parent / "reports" / f"{r}.html").resolve().as_uri() for s, r in (("a", A), ("b", B))
    }
    assert json.loads(page.read_text().split('id="aip-compare-data">')[1].split("</script>")[0])["reports"] == {
        "a": f"{A}.html",
        "b": f"{B}.html",
    }
    df, warnings = compare.compare_runs(A, B, warehouse, persist=False)
    assert doc["warnings"] == warnings == [] and len(doc["rows"]) == len(df)
    longer = 0
    for got, want in zip(doc["rows"], df.to_dict("records"), strict=True):
        for k, v in want.items():
            if isinstance(v, float) and v == v:
                assert got[k] == v, (k, got[k], v)  # every digit: --json printed 10 decimals before
                longer += len(repr(v)) > 12
            elif pd.isna(v):
                assert got[k] is None
            else:
                assert got[k] == v
    assert longer > 0
    assert main(["compare", A, B, "--warehouse", str(warehouse), "--html", "notes"]) == 2
    assert "--html PATH must name a .html file, got 'notes'" in capsys.readouterr().err


def test_the_report_servers_root_lists_the_comparison_pages(warehouse, capsys):
    """Under Comparisons: each stored comparison whose page is in the folder, the newest first; a
    comparison made without --html has no page and is not listed."""
    from aip_assets.report import serve_reports

    assert main(["compare", A, B, "--warehouse", str(warehouse), "--html"]) == 0
    assert main(["compare", B, A, "--warehouse", str(warehouse)]) == 0  # stored, no page
    capsys.readouterr()
    server = serve_reports(warehouse.parent / "reports", port=0, warehouse=warehouse)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        root = urllib.request.urlopen(f"http://127.0.0.1:{server.server_address[1]}/").read().decode()
        page = urllib.request.urlopen(f"http://127.0.0.1:{server.server_address[1]}/{default_out(A, B).name}")
        assert page.status == 200 and b"aip-compare-data" in page.read()
    finally:
        server.shutdown()
        server.server_close()
    listed = root[root.index("<h2>Comparisons</h2>") : root.index("<h2>Files</h2>")]
    n = int(
        sql(warehouse, "SELECT count(*) FILTER (WHERE significant) AS n FROM run_comparisons WHERE run_a = ?", [A]).n[0]
    )
    assert n > 0
    assert listed.count("<li") == 1 and f'data-run-a="{A}" data-run-b="{B}"' in listed
    assert f'<a href="{default_out(A, B).name}">{B} vs {A}</a> ({n} significant changes;' in listed


def fmt(field: str, v) -> str:
    """A value as `aip-eval compare`'s table prints it (written out here, not taken from it)."""
    if v is None:
        return ""
    if field in ("score_a", "score_b"):
        return f"{v:.3f}"
    if field == "diff":
        return f"{v:+.3f}"
    if field in ("p_value", "p_adjusted"):
        return f"{v:.4f}" if v >= 1e-4 else f"{v:.1e}"
    return str(v)


def expected_pairs(db: Path) -> list[dict]:
    """The rows both runs scored, straight from row_scores, each with its kind of change."""
    both = sql(
        db,
        """SELECT a.metric, a.input_id, a.score AS sa, b.score AS sb, a.label AS la, b.label AS lb,
                  a.status AS ta, b.status AS tb
           FROM row_scores a JOIN row_scores b ON b.metric = a.metric AND b.input_id = a.input_id
           WHERE a.run_id = ? AND b.run_id = ?""",
        [A, B],
    )
    out = []
    for r in both.to_dict("records"):
        sa, sb = (None if x != x else x for x in (r["sa"], r["sb"]))
        la, lb = (None if x is None or x != x else str(x).lower() for x in (r["la"], r["lb"]))
        kind = (
            "label"
            if la != lb
            else "scored"
            if (sa is None) != (sb is None) or r["ta"] != r["tb"]
            else "score"
            if sa is not None and sb is not None and sa != sb
            else "same"
        )
        d = None if sa is None or sb is None else sb - sa
        out.append({"m": r["metric"], "id": r["input_id"], "sa": sa, "sb": sb, "d": d, "kind": kind})
    return out


def test_side_by_side_in_headless_chromium_equals_compare_json(warehouse, capsys, tmp_path):
    """Every scores row's text and data-value are `compare --json`'s; every row's two scores are
    row_scores'; the changed rows come first (a changed label, then scored in one run, then by
    |diff|); a link with a fragment opens the filtered view with its row open on both runs'
    verdicts, and the URL follows the view."""
    from .test_ui import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS

    if not CHROMIUM.exists():
        pytest.skip(f"no Chromium at {CHROMIUM}")
    sync_api = pytest.importorskip("playwright.sync_api")
    doc, _ = compared(warehouse, capsys, "--html")
    page_path = default_out(A, B, warehouse)
    pairs = expected_pairs(warehouse)
    changed = [p for p in pairs if p["kind"] != "same"]
    flips = sorted(
        (p for p in changed if p["m"] == "llm.decision_flip"),
        key=lambda p: (KINDS.index(p["kind"]), -abs(p["d"] or 0.0), p["id"]),
    )
    assert len(flips) >= 2 and len(changed) < len(pairs)  # the demo's flips for women; unchanged rows too
    errors: list[str] = []
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1300, "height": 1500})
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.goto(f"file://{page_path}")
            page.wait_for_selector("#sbs[data-ready='1']")
            # the scores: compare --json's rows, in its order, as its table prints them
            shown = page.eval_on_selector_all(
                "#compare-scores tr.score",
                """trs => trs.map(tr => ({key: [tr.dataset.metric, tr.dataset.scope, tr.dataset.groupKey],
                    significant: tr.dataset.significant, mark: tr.querySelector('[data-field=mark]').textContent,
                    cells: Object.fromEntries([...tr.querySelectorAll('td[data-field]')].map(td =>
                        [td.dataset.field, {text: td.textContent, value: td.dataset.value ?? null,
                                            low: td.dataset.low ?? null, high: td.dataset.high ?? null}]))}))""",
            )
            assert len(shown) == len(doc["rows"]) > 0
            for s, r in zip(shown, doc["rows"], strict=True):
                assert s["key"] == [r["metric"], r["scope"], r["group_key"]]
                assert s["significant"] == ("true" if r["significant"] else "false")
                assert s["mark"] == (
                    ("* drop" if compare.is_drop(r) else "* gain") if r["significant"] and r["diff"] else ""
                )
                for f in ("score_a", "score_b", "diff", "p_value", "p_adjusted", "n_a", "n_b"):
                    cell = s["cells"][f]
                    assert cell["text"] == fmt(f, r[f]), (s["key"], f)
                    assert (cell["value"] == "") if r[f] is None else float(cell["value"]) == r[f], (s["key"], f)
                iv = s["cells"]["interval"]
                if r["ci_low"] is None:
                    assert iv["text"] == "" and iv["low"] == ""
                else:
                    assert iv["text"] == f"[{r['ci_low']:+.3f}, {r['ci_high']:+.3f}]"
                    assert (float(iv["low"]), float(iv["high"])) == (r["ci_low"], r["ci_high"])
                assert s["cells"]["method"]["value"] == r["method"]
            assert any(s["mark"] == "* drop" for s in shown)
            # the rows side by side: every pair, row_scores' numbers, the differences first
            rows = page.eval_on_selector_all(
                "#sbs tr.row",
                """trs => trs.map(tr => ({m: tr.dataset.metric, id: tr.dataset.inputId, kind: tr.dataset.change,
                    a: tr.querySelector('[data-field=score_a]').dataset.value,
                    b: tr.querySelector('[data-field=score_b]').dataset.value}))""",
            )
            want = {(p["m"], p["id"]): p for p in pairs}
            assert len(rows) == min(len(pairs), 100) and len(want) == len(pairs)
            assert int(page.get_attribute("#sbs-count", "data-matching")) == len(pairs)
            for r in rows:
                p = want[(r["m"], r["id"])]
                assert r["kind"] == p["kind"]
                assert (r["a"] == "") if p["sa"] is None else float(r["a"]) == p["sa"]
                assert (r["b"] == "") if p["sb"] is None else float(r["b"]) == p["sb"]
            kinds = [r["kind"] for r in rows]
            assert kinds[: len(changed)] == sorted(kinds[: len(changed)], key=KINDS.index)
            assert "same" not in kinds[: len(changed)] and set(kinds[len(changed) :]) <= {"same"}
            diffs = [abs(want[(r["m"], r["id"])]["d"]) for r in rows if r["kind"] == "score"]
            assert diffs == sorted(diffs, reverse=True)
            assert page.locator("#sbs-only tr").count() == 0 and "(0)" in page.inner_text("#sbs-only-head")
            # a link to a view: decision flip's changed rows, the second of them open
            opened = flips[1]["id"]
            page.goto(comparison_link(f"file://{page_path}", metric="llm.decision_flip", changed=True, open=opened))
            page.wait_for_function(f"document.getElementById('sbs-count').dataset.matching === '{len(flips)}'")
            ids = page.eval_on_selector_all("#sbs tr.row", "rs => rs.map(r => r.dataset.inputId)")
            assert ids == [p["id"] for p in flips]
            assert page.input_value("select[data-filter=metric]") == "llm.decision_flip"
            assert page.is_checked("input[data-filter=changed]")
            detail = page.locator(f"#sbs td.detail[data-input-id='{opened}']")
            boxes = detail.locator(".pair")
            assert boxes.count() > 1 and boxes.first.get_attribute("data-changed") == "1"
            first = boxes.first
            assert "flipped, due to the persona" in first.locator("[data-side=b]").inner_text()
            assert "flipped" not in first.locator("[data-side=a]").inner_text()  # the fair SUT's verdict
            flipped = sql(
                warehouse,
                "SELECT count(*) AS n FROM judgements WHERE run_id = ? AND metric = 'llm.decision_flip' "
                "AND input_id = ? AND flipped",
                [B, opened],
            ).n[0]
            assert detail.locator(".pair[data-changed] [data-side=b] .flag").count() == flipped > 0
            # its links open the row in each run's own report
            reports = {side: Path(warehouse.parent / "reports" / f"{run}.html") for side, run in (("A", A), ("B", B))}
            for side, report in reports.items():
                link = page.get_attribute(f"#sbs tr.row.open a[data-link={side}]", "href")
                assert report.is_file() and link == viewer_link(report.name, metric="llm.decision_flip", open=opened)
            page.screenshot(path=str(tmp_path / "comparison_row.png"))
            # every decision-flip row: the open row stays open and the URL says so
            page.uncheck("input[data-filter=changed]")
            frag = dict(parse_qsl(urlsplit(page.url).fragment[2:]))
            assert frag == {"metric": "llm.decision_flip", "open": opened}
            assert int(page.get_attribute("#sbs-count", "data-matching")) == sum(
                1 for p in pairs if p["m"] == "llm.decision_flip"
            )
            visible = page.eval_on_selector_all(
                "#compare-scores tr.score",
                "trs => trs.filter(t => t.style.display !== 'none').map(t => t.dataset.metric)",
            )
            assert set(visible) == {"llm.decision_flip"}  # the scores follow the metric filter
            # a search narrows the rows, and is in the URL
            page.fill("input[data-filter=search]", opened)
            page.wait_for_function("document.getElementById('sbs-count').dataset.matching === '1'")
            assert dict(parse_qsl(urlsplit(page.url).fragment[2:]))["q"] == opened
        finally:
            browser.close()
    assert errors == []
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(tmp_path / "comparison_row.png", ARTIFACTS / "comparison_row.png")


def test_the_comparison_script_on_hand_made_rows_pages_opens_and_keeps_text(tmp_path):
    """static/compare.js on data made by hand (paired and aligned as the page's are): no console
    error, 100 rows at a time with a button for the rest, a row past the first page opened from the
    URL, a row whose verdicts are not in the file and a comparison one run lacks each saying so, the
    rows in one run only listed, and markup from the data shown as text, never as elements."""
    from aip_assets.report.templating import static
    from aip_assets.report.viewer import data_block

    from .test_ui import CHROMIUM, CHROMIUM_ARGS

    if not CHROMIUM.exists():
        pytest.skip(f"no Chromium at {CHROMIUM}")
    sync_api = pytest.importorskip("playwright.sync_api")
    evil = '<img src=x onerror="document.title=1">'
    m = "llm.m"
    rows_a = [row(m, f"r{i:03d}", 1.0, "ok") for i in range(150)] + [row(m, "gone", 0.5, evil)]
    rows_b = [row(m, f"r{i:03d}", 1.0 - i / 1000, "ok" if i else evil) for i in range(150)]
    paired = pair_rows(rows_a, rows_b, [m])
    same = verdict("same_decision", 1.0, "YES", "YES", False, reasoning=f"a says {evil}")
    for n, p in enumerate(paired["pairs"]):
        a = detail([("man vs woman", "gender", 0, 1, [same])])
        b = detail([("man vs woman", "gender", 0, 1, [verdict("flip", 0.0, "NO", "YES", True)])] if n == 0 else [])
        p["v"] = False if p["id"] == "r010" else align(a, b)
        p["la"], p["lb"] = viewer_link("a.html", metric=m, open=p["id"]), None
    for r in paired["only"]:
        r["link"] = viewer_link("a.html", metric=m, open=r["id"])
    data = {
        "run_a": evil,
        "run_b": "b",
        "reports": {"a": "a.html", "b": None},
        "rows_per_metric": 500,
        "metrics": [{"metric": m, "name": "m", "shown": 150, **paired["counts"][m]}],
        "rows": paired["pairs"],
        "only": paired["only"],
    }
    page_path = tmp_path / "c.html"
    page_path.write_text(
        '<!DOCTYPE html><html><head><meta charset="utf-8"><title>t</title></head><body><div id="sbs"></div>'
        + data_block(data, "aip-compare-data")
        + "<script>"
        + static("dom.js")
        + static("compare.js")
        + "</script></body></html>"
    )
    errors: list[str] = []
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
            page.goto(comparison_link(f"file://{page_path}", open="r010"))  # the 141st row
            page.wait_for_selector("#sbs[data-ready='1']")
            ids = page.eval_on_selector_all("#sbs tr.row", "rs => rs.map(r => r.dataset.inputId)")
            assert ids[:3] == ["r000", "r149", "r148"] and ids[140] == "r010"  # a changed label, then by |diff|
            assert len(ids) == 150 and page.locator("#sbs tr.row.open").get_attribute("data-input-id") == "r010"
            assert page.locator("#sbs [data-verdicts-missing]").count() == 1
            page.goto(f"file://{page_path}#v:")
            page.reload()
            page.wait_for_selector("#sbs[data-ready='1']")
            assert page.locator("#sbs tr.row").count() == 100 and page.is_visible("#sbs-more")
            page.click("#sbs-more")
            assert page.locator("#sbs tr.row").count() == 150 and not page.is_visible("#sbs-more")
            page.click("#sbs tr.row[data-input-id='r000']")
            first = page.locator("#sbs td.detail[data-input-id='r000'] .pair")
            assert first.count() == 1 and first.get_attribute("data-changed") == "1"
            assert "flipped, due to the persona" in first.locator("[data-side=b]").inner_text()
            page.click("#sbs tr.row[data-input-id='r001']")
            other = page.locator("#sbs td.detail[data-input-id='r001'] .pair [data-side=b]")
            assert "no such comparison in this run" in other.inner_text()
            assert page.locator("#sbs-only tr.only").count() == 1 and "(1)" in page.inner_text("#sbs-only-head")
            assert page.get_attribute("#sbs-only tr.only a", "href") == viewer_link("a.html", metric=m, open="gone")
            # the markup of labels, reasoning and run ids is text: in the page's text, never an element
            text = page.inner_text("#sbs")
            assert text.count(evil) >= 4 and page.locator("#sbs img").count() == 0 and page.title() == "t"
            page.check("input[data-filter=changed]")
            assert int(page.get_attribute("#sbs-count", "data-matching")) == paired["counts"][m]["changed"] == 150
        finally:
            browser.close()
    assert errors == []
