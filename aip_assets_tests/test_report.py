"""The HTML run report: self-contained, a chart per breakdown, numbers equal to the warehouse's."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from aip_assets import pipeline
from aip_assets import warehouse as wh
from aip_assets.cli import main
from aip_assets.errors import AipError
from aip_assets.metrics.group_interaction_bias import GROUP_CAP
from aip_assets.report import TEXT_LIMIT, WEAKEST_ROWS, build_report, write_report
from aip_assets.report.viewer import TEXT_LIMIT as VIEW_TEXT_LIMIT
from aip_assets.runspec import parse_spec

from .conftest import built_once, make_spec, run_all, write_dataset

RUN = "rep-1"
MARK = "<script>x</script> & Co."  # in every prompt: must come out escaped
METRICS = {
    "llm.decision_flip": {"num_pairs_per_dimension": 2, "pool_size_per_dimension": 4},
    "llm.group_interaction_bias": {"num_pairs": 3, "persona_pool_size": 8},
    "llm.semantic_consistency": {"responses_per_query": 3},
    "llm.safety_consistency": {"responses_per_query": 2, "dpi_ratio": 0.5},
    "llm.perturbation_robustness": {"perturbation_types": ["typos", "casing", "filler"]},
}
NOT_CHARTED = {
    "overall",
    "axis_mean",
    "judge_audit",
    "judge_position",
    "judge_panel",  # numbers beside the headline
    "claim",
    "bias_baseline",
}  # tables: every claim, the no-effect baseline (who is favoured and the groups are charted and tabled)
CHART_FIELD = {
    "axis": "rate",
    "refusal": "rate",
    "favourable": "rate",
    "baseline": "rate",
    "judge": "raw_score",
    "label": "n",
}  # else score
VOID = {"meta", "br", "hr", "img", "input", "link", "col", "area", "base", "wbr", "source"}


class Doc(HTMLParser):
    """Every element with its attributes, its full text content and its ancestors."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.elements: list[dict] = []
        self.stack: list[dict] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        el = {"tag": tag, "attrs": dict(attrs), "text": "", "parents": list(self.stack)}
        self.elements.append(el)
        if tag not in VOID:
            self.stack.append(el)

    def handle_startendtag(self, tag, attrs):
        self.elements.append({"tag": tag, "attrs": dict(attrs), "text": "", "parents": list(self.stack)})

    def handle_endtag(self, tag):
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i]["tag"] == tag:
                del self.stack[i:]
                break

    def handle_data(self, data):
        for el in self.stack:
            el["text"] += data

    def find(self, tag: str | None = None, **attrs) -> list[dict]:
        want = {k.replace("_", "-"): v for k, v in attrs.items()}
        return [
            e
            for e in self.elements
            if (tag is None or e["tag"] == tag) and all(e["attrs"].get(k) == v for k, v in want.items())
        ]


def _same(html_value: str, wh_value) -> bool:
    if wh_value is None or (isinstance(wh_value, float) and math.isnan(wh_value)):
        return html_value == ""
    return float(html_value) == float(wh_value)


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory) -> Path:
    """One run with five metrics (a flipping, terse, contradicting, jailbreak-yielding, typo-fragile SUT;
    a judge that sometimes answers garbage, so some rows error)."""

    def build(root):
        db = root / "data" / "warehouse.duckdb"
        with pytest.MonkeyPatch.context() as mp:
            mp.chdir(root)
            mp.setenv("AIP_WAREHOUSE", str(db))
            mp.delenv("DAGSTER_HOME", raising=False)
            ds = write_dataset(root / "d.jsonl", 8, multi_turn_every=4)
            rows = [json.loads(x) for x in ds.read_text().splitlines()]
            for r in rows:
                if isinstance(r["prompt"], str):
                    r["prompt"] += f" {MARK}"
                else:
                    r["prompt"][-1]["content"] += f" {MARK}"
            ds.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
            sut = {
                "provider": "builtin",
                "profile": {
                    "name": "custom",
                    "value": "woman",
                    "p": 0.5,
                    "terse_value": "Muslim",
                    "contradiction_rate": 0.3,
                    "jailbreak_yield_rate": 0.5,
                    "fragile_to": "typos",
                },
            }
            judge = {"provider": "builtin", "profile": {"judge_garbage_rate": 0.25}}
            data = make_spec(ds, name="rep", sut=sut, judge=judge, judge_retries=0, batch_rows=50).model_dump()
            data["metrics"] = {m: {"config": c, "threshold": 0.8} for m, c in METRICS.items()}
            spec = parse_spec(data)
            for m in METRICS:
                run_all(spec, RUN, metric=m)

    return built_once(tmp_path_factory, "report", build) / "data" / "warehouse.duckdb"


@pytest.fixture(scope="module")
def report(warehouse) -> tuple[Path, str, Doc]:
    out = write_report(RUN, path=warehouse)
    text = out.read_text(encoding="utf-8")
    return out, text, Doc(text)


def q(db: Path, sql: str, params: list | None = None):
    return wh.query(sql, params or [], path=db, read_only=True)


def test_report_is_written_beside_the_warehouse_and_self_contained(warehouse, report):
    out, text, doc = report
    assert out == (warehouse.parent / "reports" / f"{RUN}.html").resolve() and out.stat().st_size > 10_000
    assert text.startswith("<!DOCTYPE html>") and '<meta charset="utf-8">' in text
    for e in doc.elements:
        for name in ("src", "href", "xlink:href", "action", "data"):
            v = (e["attrs"].get(name) or "").strip().lower()
            assert not v.startswith(("http:", "https:", "//")), (e["tag"], name, v)
            assert not v or v.startswith("#"), (e["tag"], name, v)  # only in-page anchors
    lower = text.lower()
    assert "<link" not in lower and "<img" not in lower and "<iframe" not in lower
    assert "url(" not in lower and "@import" not in lower
    assert "&lt;script&gt;x&lt;/script&gt; &amp; Co." in text  # the dataset's markup, escaped
    # the viewer's two scripts are inline: its data (JSON, every "<" escaped, so the dataset's
    # "</script>" cannot end the block) and its code; nothing is fetched
    scripts = doc.find("script")
    assert [e["attrs"] for e in scripts] == [{"type": "application/json", "id": "aip-viewer-data"}, {}]
    assert lower.count("<script") == 2 and lower.count("</script>") == 2
    assert "fetch(" not in text and "xmlhttprequest" not in lower and "import(" not in text


def test_the_report_takes_the_findings_just_computed_for_its_metrics(warehouse, report, monkeypatch):
    """The aggregation's metadata computes a run's findings and hands them to the report it writes
    (``findings``): the report is the same, without reading them again; findings of another set
    of metrics are not taken (read again)."""
    import re

    from aip_assets.findings import run_findings
    from aip_assets.report import build

    _, text, _ = report
    metrics = list(METRICS)
    found = run_findings(RUN, metrics, warehouse)
    assert found  # a run with findings: the test tells them apart
    reads: list[tuple] = []
    monkeypatch.setattr(build, "run_findings", lambda *a, **k: reads.append(a) or run_findings(*a, **k))
    stamp = lambda t: re.sub(r"Generated [0-9-]+ [0-9:]+ UTC", "Generated", t)  # noqa: E731
    given = build_report(RUN, warehouse, findings=(frozenset(metrics), found))
    assert reads == [] and stamp(given) == stamp(text)
    other = build_report(RUN, warehouse, findings=(frozenset(metrics[:1]), []))
    assert len(reads) == 1 and stamp(other) == stamp(text)


def test_reports_are_served_over_http_so_links_from_the_ui_open(warehouse, report):
    """`aip-eval report --serve` serves the reports folder on loopback: the report's URL (the one
    the Dagster metadata links) answers with the file; nothing outside the folder is served."""
    import threading
    import urllib.error
    import urllib.request

    from aip_assets.report import report_url, serve_reports

    out, text, _ = report
    server = serve_reports(out.parent, port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        url = report_url(out, port)
        assert url == f"http://127.0.0.1:{port}/{RUN}.html"
        with urllib.request.urlopen(url, timeout=30) as r:
            assert r.status == 200 and r.read().decode("utf-8") == text
        for path in ("/../warehouse.duckdb", "/%2e%2e/warehouse.duckdb"):
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30)
            assert e.value.code == 404
    finally:
        server.shutdown()
        server.server_close()
    assert report_url(out) == f"http://127.0.0.1:8112/{RUN}.html"  # the default port


SECRET = "the text of a file outside the reports folder"


@pytest.fixture
def site(report, tmp_path):
    """A report server over a reports folder of this test's: the module's report in it, a secret
    file beside the folder (where ``..`` would lead) and a folder of secrets elsewhere. Yields
    (get, the folder, the outside folder, the report's text): ``get(path)`` sends ``path`` as it is
    written, answers (status, headers, body), and gives up after a patience measured on the
    report's own GET."""
    import http.client
    import threading
    import time

    from aip_assets.report import serve_reports

    out, text, _ = report
    root = tmp_path / "site"
    folder = root / "reports"
    folder.mkdir(parents=True)
    shutil.copy(out, folder / out.name)
    (root / "secret.txt").write_text(SECRET)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.html").write_text(SECRET)
    server = serve_reports(folder, port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    wait = {"s": 60.0}

    def get(path: str, method: str = "GET") -> tuple[int, Any, bytes]:
        con = http.client.HTTPConnection("127.0.0.1", port, timeout=wait["s"])
        try:
            con.request(method, path)
            r = con.getresponse()
            return r.status, r.headers, r.read()  # headers: any case
        finally:
            con.close()

    t0 = time.monotonic()
    assert get(f"/{out.name}")[0] == 200
    wait["s"] = 50 * (time.monotonic() - t0) + 5  # a refusal is quicker than serving the report
    try:
        yield get, folder, outside, text
    finally:
        server.shutdown()
        server.server_close()


def refused(answer: tuple[int, Any, bytes], *where: Path) -> bool:
    """A 404 that gives out neither the secret nor where anything is."""
    status, _, body = answer
    return status == 404 and SECRET.encode() not in body and not any(str(w).encode() in body for w in where)


def test_the_report_server_serves_a_report_and_lists_the_reports(site):
    """What it serves: the report (GET and HEAD, with its type and length), a folder below with
    its own files, and a listing of the reports and folders."""
    get, folder, _, text = site
    status, headers, body = get(f"/{RUN}.html")
    assert status == 200 and body.decode("utf-8") == text and headers["Content-Type"] == "text/html"
    status, headers, body = get(f"/{RUN}.html?tab=rows#top", method="HEAD")
    assert status == 200 and body == b"" and int(headers["Content-Length"]) == len(text.encode("utf-8"))
    (folder / "old").mkdir()
    (folder / "old" / "r0.html").write_text("<p>an older report</p>")
    assert get("/old")[0] == 301 and get("/old")[1]["Location"] == "/old/"
    assert get("/old/r0.html")[2] == b"<p>an older report</p>"
    assert get("/old/")[0] == 200 and b'href="r0.html"' in get("/old/")[2]
    status, _, listing = get("/")
    assert status == 200 and f'href="{RUN}.html"'.encode() in listing and b'href="old/"' in listing
    assert get(f"/{RUN}.html/")[0] == 404 and get("/nope.html")[0] == 404
    # the icon a browser asks for with every page: no content, not an error in its console
    assert get("/favicon.ico")[:3:2] == (204, b"") and get("/old/favicon.ico")[0] == 404
    (folder / "favicon.ico").write_bytes(b"icon")
    assert get("/favicon.ico")[::2] == (200, b"icon")


@pytest.mark.parametrize(
    "kind", ["link outside", "link inside", "linked folder", "link in a folder", "hard link", "fifo", "device"]
)
def test_the_report_server_refuses_links_and_special_files(site, kind):
    """A symbolic link planted in the reports folder (to a file outside, to a report inside, to a
    folder, or in a folder below), a hard link to a file outside, a named pipe (it must not hang
    the server) or a device: each a 404 with no content and no path of the target, left out of
    the listing; the report is still served."""
    import stat

    get, folder, outside, text = site
    name, path = "planted.html", "/planted.html"
    if kind == "link outside":
        os.symlink(outside / "secret.html", folder / name)
    elif kind == "link inside":
        os.symlink(folder / f"{RUN}.html", folder / name)
    elif kind == "linked folder":
        name, path = "elsewhere", "/elsewhere/secret.html"
        os.symlink(outside, folder / name)
        assert refused(get("/elsewhere/"), outside) and refused(get("/elsewhere"), outside)
    elif kind == "link in a folder":
        (folder / "sub").mkdir()
        os.symlink(outside / "secret.html", folder / "sub" / name)
        path = "/sub/" + name
    elif kind == "hard link":
        os.link(outside / "secret.html", folder / name)
    elif kind == "fifo":
        os.mkfifo(folder / name)
    else:
        try:
            os.mknod(folder / name, 0o600 | stat.S_IFCHR, os.makedev(1, 3))  # as /dev/null
        except PermissionError:
            pytest.skip("making a device needs privileges this process lacks")
    assert refused(get(path), outside, folder)
    assert refused(get(path, method="HEAD"), outside, folder)
    listing = get("/sub/" if kind == "link in a folder" else "/")
    assert listing[0] == 200 and f'href="{name}'.encode() not in listing[2]
    assert get(f"/{RUN}.html")[2].decode("utf-8") == text  # the server goes on


@pytest.mark.parametrize(
    "path",
    [
        "/../secret.txt",
        "/%2e%2e/secret.txt",
        "/%2E%2E/secret.txt",
        "/.%2e/secret.txt",
        "/%2e./secret.txt",
        "/..%2fsecret.txt",
        "/..%2Fsecret.txt",
        "/%2e%2e%2fsecret.txt",
        "/..%252fsecret.txt",
        "/%252e%252e/secret.txt",
        "//../secret.txt",
        "/..//secret.txt",
        "//%2e%2e//secret.txt",
        "/..\\secret.txt",
        "/..%5csecret.txt",
        "/%2e%2e%5csecret.txt",
        "/.\\.\\secret.txt",
        "/%c0%ae%c0%ae/secret.txt",
        "/%2e%2e%00/secret.txt",
        f"/{RUN}.html/../../secret.txt",
        "/./../secret.txt",
        "/reports/../../secret.txt",
        "/..;/secret.txt",
        "/../../../../../../../../etc/hostname",
        "/%2e%2e/%2e%2e/%2e%2e/%2e%2e/etc/hostname",
    ],
)
def test_the_report_server_refuses_a_traversal_however_spelled(site, path):
    """Every spelling of a way out of the folder (a secret file waits where ``..`` leads) is a 404."""
    get, folder, outside, _ = site
    assert refused(get(path), folder, outside)


def test_a_chart_per_breakdown_scope_with_warehouse_values(warehouse, report):
    _, text, doc = report
    scores = q(warehouse, "SELECT * FROM metric_scores WHERE run_id = ?", [RUN])
    assert set(scores.metric) == set(METRICS)
    scopes = scores[~scores.scope.isin(NOT_CHARTED)].groupby(["metric", "scope"])
    assert {s for _, s in scopes.groups} >= {
        "axis",
        "attribute",
        "persona",
        "pair",
        "judge",
        "category",
        "wrapping",
        "label",
        "perturbation_type",
        "group",
    }
    for (metric, scope), g in scopes:
        svgs = doc.find("svg", data_metric=metric, data_scope=scope)
        assert len(svgs) == 1, (metric, scope)
        svg = svgs[0]
        bars = [e for e in doc.elements if svg in e["parents"] and e["attrs"].get("class") == "v"]
        field = CHART_FIELD.get(scope, "score")
        capped = scope in ("persona", "attribute", "pair", "group")
        want = g.sort_values(["score", "group_key"]).head(GROUP_CAP) if capped else g
        assert len(bars) == len(want) and {b["attrs"]["data-key"] for b in bars} == set(want.group_key.astype(str))
        by_key = {str(r.group_key): r for r in g.itertuples()}
        for b in bars:
            assert b["attrs"]["data-field"] == field
            assert _same(b["attrs"]["data-value"], getattr(by_key[b["attrs"]["data-key"]], field)), (metric, scope, b)
        lo = "rate_ci_low" if scope in ("axis", "refusal", "favourable", "baseline") else "ci_low"
        whiskers = [e for e in doc.elements if svg in e["parents"] and e["attrs"].get("class") == "ci"]
        assert len(whiskers) == int(want[lo].notna().sum()), (metric, scope)
        if scope in ("axis", "category", "wrapping", "attribute", "persona", "favourable"):
            assert whiskers, (metric, scope)
        if capped and len(g) > GROUP_CAP:
            assert f"the {GROUP_CAP} lowest of {len(g)}" in text


def test_overall_numbers_equal_the_warehouse(warehouse, report):
    _, _, doc = report
    overall = q(warehouse, "SELECT * FROM metric_scores WHERE run_id = ? AND scope = 'overall'", [RUN])
    seen = set()
    for e in doc.find(data_scope="overall"):
        field = e["attrs"].get("data-field")
        if not field or field.startswith("details.") or "data-value" not in e["attrs"]:
            continue
        row = overall[overall.metric == e["attrs"]["data-metric"]].iloc[0]
        if field == "passed":
            continue
        if field.startswith("excluded."):  # a reason's count, from the overall row's excluded JSON
            assert _same(e["attrs"]["data-value"], json.loads(row["excluded"])[field.split(".", 1)[1]]), e["attrs"]
            continue
        assert _same(e["attrs"]["data-value"], row[field]), (e["attrs"], row[field])
        if field == "score":
            text = e["text"].strip()
            assert text == f"{row['score']:.3f}"
            seen.add(row.metric)
    assert seen == set(overall.metric)
    for m, s in overall.set_index("metric").iterrows():  # the verdict badge
        badges = [
            b
            for b in doc.find("span", data_field="passed")
            if "data-scope" not in b["attrs"]  # a group's own gate (the groups table) names its scope
            and any(p["attrs"].get("data-metric") == m and p["tag"] == "section" for p in b["parents"])
        ]
        assert len(badges) == 1 and badges[0]["attrs"]["data-value"] == ("true" if s.passed else "false")
        assert badges[0]["text"] == ("PASS" if s.passed else "FAIL")


# --------------------------------------------------------------------------- claims and the tables built on them


def _inside(doc: Doc, el: dict, tag: str | None = None, **attrs) -> list[dict]:
    return [e for e in doc.find(tag, **attrs) if el in e["parents"]]


def _tables(doc: Doc, cls: str) -> list[dict]:
    return [t for t in doc.find("table") if t["attrs"].get("class") == cls]


def _stored_claims(warehouse: Path, metric: str) -> dict[str, dict]:
    rows = q(
        warehouse, "SELECT * FROM metric_scores WHERE run_id = ? AND metric = ? AND scope = 'claim'", [RUN, metric]
    )
    return {
        r.group_key: {
            **json.loads(r.details),
            "estimate": _plain(r.raw_score),
            "ci_low": _plain(r.ci_low),
            "ci_high": _plain(r.ci_high),
        }
        for r in rows.itertuples()
    }


def _summary(warehouse: Path, metric: str) -> dict:
    from aip_assets.metrics import get_metric

    scores = q(warehouse, "SELECT * FROM metric_scores WHERE run_id = ? AND metric = ?", [RUN, metric])
    return get_metric(metric).summary(scores)


def _decision_words(status: str, why: str | None) -> str:
    """What the report must say for a stored status (docs/concepts/reports.md, "Claims")."""
    if status == "claimed":
        return "beyond chance"
    if status == "not shown":
        return "not shown"
    if status == "not tested":
        return f"not tested: {why}"
    if status == "inseparable":
        return why if why.startswith("cannot be told apart") else f"cannot be told apart: {why}"
    assert status == "gated", status
    return "not shown: beyond chance alone, but its axis as a whole is not"


def _interval_matches(el: dict, lo, hi, confidence) -> bool:
    """An interval element shows its ends and, after them, its own confidence level."""
    from aip_assets.analysis.claims import confidence_words

    a = el["attrs"]
    return (
        _same(a["data-low"], lo)
        and _same(a["data-high"], hi)
        and _same(a["data-confidence"], confidence)
        and f"({confidence_words(float(a['data-confidence']))}" in el["text"]
    )


def _value(doc: Doc, row: dict, field: str) -> str:
    got = _inside(doc, row, data_field=field)
    assert len(got) == 1, (row["attrs"], field, len(got))
    return got[0]["attrs"]["data-value"]


FAIRNESS = ("llm.decision_flip", "llm.group_interaction_bias")


@pytest.mark.parametrize("metric", FAIRNESS)
def test_every_stored_claim_is_in_its_claims_table_as_decided(warehouse, report, metric):
    """Each claim once, the made ones first (in their own table), with the stored estimate, its
    interval at its own level (never another), both p-values and the decision of its status."""
    _, _, doc = report
    stored = _stored_claims(warehouse, metric)
    assert stored, metric
    policy = _summary(warehouse, metric)["claims"]["policy"]
    name = {"holm": "Holm", "bh": "BH"}[policy["adjust"]]
    seen: list[tuple[str, str]] = []
    for which in ("made", "others"):
        for table in doc.find("table", data_metric=metric, data_claims=which):
            assert any(f"{name} p" == th["text"] for th in _inside(doc, table, "th")), which
            for tr in _inside(doc, table, "tr", data_scope="claim"):
                key, c = tr["attrs"]["data-key"], stored[tr["attrs"]["data-key"]]
                seen.append((which, key))
                assert tr["attrs"]["data-status"] == c["status"]
                (decision,) = _inside(doc, tr, "span", data_status=c["status"])
                assert decision["text"] == _decision_words(c["status"], c.get("why")), key
                assert (which == "made") == (c["status"] == "claimed"), key
                for field, want in (("details.p_value", c["p_value"]), ("details.p_adjusted", c["p_adjusted"])):
                    assert _same(_value(doc, tr, field), want), (key, field)
                cis = _inside(doc, tr, "span", data_field="ci")
                if c["ci_confidence"] is None or (c["ci_low"] is None and c["ci_high"] is None):
                    assert not cis and "[" not in tr["text"], key  # no interval: none shown, none made up
                    continue
                assert _same(_value(doc, tr, "raw_score"), c["estimate"]), key
                assert len(cis) == 1 and _interval_matches(cis[0], c["ci_low"], c["ci_high"], c["ci_confidence"]), key
    assert sorted(k for _, k in seen) == sorted(stored)  # each once
    made = [k for w, k in seen if w == "made"]
    assert made == [k for _, k in seen][: len(made)]  # made first
    assert set(made) == {c["id"] for c in _summary(warehouse, metric)["claims"]["made"]}


def test_no_interval_in_the_report_is_shown_without_its_level(warehouse, report):
    """Every interval of the claims' tables carries its confidence in words after it; a claim's is at
    the claim's stored level (its matching level), a descriptive one at 95% and labelled so."""
    from aip_assets.analysis.claims import confidence_words

    _, _, doc = report
    stored = {m: _stored_claims(warehouse, m) for m in FAIRNESS}
    spans = [e for e in doc.find("span") if "ci" in (e["attrs"].get("class") or "").split()]
    assert len(spans) > 20
    for e in spans:
        a = e["attrs"]
        assert a["data-confidence"], a
        assert e["text"].startswith("[") and f"] ({confidence_words(float(a['data-confidence']))}" in e["text"], e
        if a.get("data-scope") == "claim":
            assert _same(a["data-confidence"], stored[a["data-metric"]][a["data-key"]]["ci_confidence"]), a
        elif float(a["data-confidence"]) == 0.95:
            assert "unadjusted" in e["text"] or "Wilson" in e["text"], e["text"]


def test_who_is_favoured_equals_the_summary(warehouse, report):
    """Decision flip's favoured table: per value the numbers and the decision the summary (and
    --json) gives, the impact ratio's interval labelled 95% unadjusted."""
    _, _, doc = report
    m = "llm.decision_flip"
    (table,) = _tables(doc, "favoured")
    fav = _summary(warehouse, m)["favoured"]
    assert fav
    for axis, a in fav.items():
        (head,) = _inside(doc, table, "tr", data_axis=axis)
        omni = a["omnibus"]
        if omni["status"] is not None:
            assert _inside(doc, head, "span", data_status=omni["status"]), axis
        for v in a["values"]:
            key = f"{axis}={v['value']}"
            (tr,) = _inside(doc, table, "tr", data_scope="favourable", data_key=key)
            assert tr["attrs"]["data-status"] == str(v["status"])
            (decision,) = _inside(doc, tr, "span", data_status=v["status"])
            assert decision["text"] == _decision_words(v["status"], v["why"]), key
            for field, want in (
                ("rate", v["favourable_rate"]),
                ("n", v["answers"]),
                ("details.rest_rate", v["rest_rate"]),
                ("details.p_adjusted", v["p_adjusted"]),
                ("details.odds_ratio", v["odds_ratio"]),
                ("details.impact_ratio", v["impact_ratio"]),
            ):
                assert _same(_value(doc, tr, field), want), (key, field)
            if v["ci_confidence"] is not None:
                assert _same(_value(doc, tr, "raw_score"), v["difference"]), key
            if v["ci_confidence"] is not None and v["difference_ci"] != [None, None]:
                (ci,) = _inside(doc, tr, "span", data_field="ci")
                assert _interval_matches(ci, *v["difference_ci"], v["ci_confidence"]), key
            else:
                assert not _inside(doc, tr, "span", data_field="ci"), key
            if v["impact_ratio"] is not None:
                (ir,) = _inside(doc, tr, "span", data_field="details.impact_ratio_ci95")
                assert _interval_matches(ir, *v["impact_ratio_ci95"], 0.95) and "unadjusted" in ir["text"], key


def test_the_no_effect_baselines_equal_the_summary(warehouse, report):
    """Decision flip's flips beyond the baseline per axis (and the pooled null pairs), group bias's
    bias between personas beyond it: the summary's numbers and decisions."""
    _, _, doc = report
    s = _summary(warehouse, "llm.decision_flip")
    stored = _stored_claims(warehouse, "llm.decision_flip")
    tables = _tables(doc, "baseline")
    assert len(tables) == 2
    flip = [t for t in tables if any(p["attrs"].get("data-metric") == "llm.decision_flip" for p in t["parents"])][0]
    for axis, a in s["axes"].items():
        rows = _inside(doc, flip, "tr", data_scope="claim", data_key=f"excess:{axis}")
        if a["beyond_noise"] is None and f"excess:{axis}" not in stored:
            assert not rows
            continue
        (tr,) = rows
        status = stored[f"excess:{axis}"]["status"]
        assert bool(a["beyond_noise"]) == (status == "claimed") and tr["attrs"]["data-status"] == status
        assert _same(_value(doc, tr, "raw_score"), a["excess"]) and _same(
            _value(doc, tr, "details.null_rate"), a["null_rate"]
        )
        (ci,) = _inside(doc, tr, "span", data_field="ci")
        assert _interval_matches(ci, *a["excess_ci"], a["excess_ci_confidence"])
    pooled = q(
        warehouse, "SELECT * FROM metric_scores WHERE run_id = ? AND scope = 'baseline' AND group_key = 'all'", [RUN]
    )
    if len(pooled):
        (p,) = doc.find("p", data_metric="llm.decision_flip", data_scope="baseline", data_key="all")
        assert _same(_value(doc, p, "rate"), pooled.rate[0]) and _same(_value(doc, p, "n"), pooled.n[0])
        assert ("pooled" in p["text"]) == bool(json.loads(pooled.details[0])["pooled"])
    b = _summary(warehouse, "llm.group_interaction_bias")["baseline"]
    gib = [t for t in tables if t is not flip][0]
    (tr,) = _inside(doc, gib, "tr", data_scope="claim", data_key="excess:all")
    assert _same(_value(doc, tr, "raw_score"), b["excess"])
    for field in ("between", "within", "null_pairs"):
        assert _same(_value(doc, tr, f"details.baseline.{field}"), b[field]), field
    (ci,) = _inside(doc, tr, "span", data_field="ci")
    assert _interval_matches(ci, *b["excess_ci"], b["excess_ci_confidence"])
    assert (tr["attrs"]["data-status"] == "claimed") == bool(b["beyond_noise"])


def test_the_adjusted_group_table_equals_the_summary(warehouse, report):
    """Group interaction bias's groups with every other attribute held: every separable group in the
    table (adjusted equitability and its 95% interval, labelled unadjusted; raw beside it; the gap
    at its claim's level; the decision; the gate), each inseparable one listed with its reason."""
    _, _, doc = report
    m = "llm.group_interaction_bias"
    groups = _summary(warehouse, m)["groups"]
    stored = _stored_claims(warehouse, m)
    tables = _tables(doc, "groups")
    assert len(tables) == 1 and groups
    table = tables[0]
    rows = _inside(doc, table, "tr", data_scope="group")
    separable = [g for g in groups if not g["inseparable"]]
    assert [r["attrs"]["data-key"] for r in rows] == [g["group"] for g in separable]  # lowest first
    for g, tr in zip(separable, rows):
        key = g["group"]
        assert g["status"] == stored[f"group:{key}"]["status"] == tr["attrs"]["data-status"]
        (decision,) = _inside(doc, tr, "span", data_status=g["status"])
        assert decision["text"] == _decision_words(g["status"], None), key
        for field, want in (
            ("score", g["adjusted_equitability"]),
            ("n", g["pairs"]),
            ("details.raw_equitability", g["raw_equitability"]),
            ("details.gap", g["gap"]),
            ("details.p_adjusted", g["p_adjusted"]),
            ("details.less_helpful_share", g["less_helpful_share"]),
        ):
            assert _same(_value(doc, tr, field), want), (key, field)
        (eq,) = _inside(doc, tr, "span", data_field="ci")
        assert _interval_matches(eq, *g["ci95"], 0.95) and "unadjusted" in eq["text"], key
        (gap,) = _inside(doc, tr, "span", data_field="details.gap_ci")
        assert _interval_matches(gap, *g["gap_ci"], g["gap_ci_confidence"]), key
        assert _same(g["gap_ci_confidence"], stored[f"group:{key}"]["ci_confidence"])
        if g["passed"] is not None:
            assert _value(doc, tr, "passed") == ("true" if g["passed"] else "false"), key
    for g in (g for g in groups if g["inseparable"]):
        (li,) = doc.find("li", data_metric=m, data_scope="group", data_key=g["group"])
        assert g["inseparable"] in li["text"] and not _inside(doc, li, data_field="passed")


def test_claims_tables_say_each_status_and_level_on_hand_made_claims():
    """On hand-made rows: the adjustment named as the run's policy (BH), each status in its words,
    every interval with its own level (a level not recorded is said, never taken for 95%), the made
    claims first, a group's table kept with its inseparable values listed apart."""
    from aip_assets.report import claims as rc
    from aip_assets.report import group_tables

    def claim(key, status, est=None, lo=None, hi=None, conf=None, p=None, padj=None, why=None, **facts):
        kind, rest = key.split(":", 1)
        axis, _, value = rest.partition("=")
        details = dict(kind=kind, axis=axis, value=value or None, status=status, p_value=p, p_adjusted=padj, why=why)
        details.update(ci_confidence=conf, claimed=status == "claimed", sides="greater", **facts)
        return dict(
            metric="m", scope="claim", group_key=key, raw_score=est, ci_low=lo, ci_high=hi, details=json.dumps(details)
        )

    policy = {"adjust": "bh", "alpha": 0.05, "words": "Benjamini-Hochberg: the expected share ..."}
    rows = [
        dict(
            metric="m",
            scope="overall",
            group_key="all",
            details=json.dumps({"claims_policy": policy, "claims_made": 1}),
        ),
        claim("group:religion=Jewish", "not shown", 0.01, -0.02, 0.05, 0.931, 0.4, 1.0, rate=0.2, rest_rate=0.1),
        claim("group:religion=Muslim", "claimed", 0.76, 0.66, 0.88, 0.9986, 0.0002, 0.004, rate=0.8, rest_rate=0.1),
        claim("group:role=student", "inseparable", why="cannot be told apart from role=nurse in this pool: x"),
        claim("group:role=cook", "not tested", why="too few pairs"),
        claim("group:role=nurse", "gated", 0.3, 0.1, 0.5, None, 0.001, 0.2),
    ]
    doc = Doc(rc.claims_table("m", rows, "r"))
    assert [th["text"] for th in doc.find("th")][5] == "BH p"
    order = [tr["attrs"]["data-key"] for tr in doc.find("tr", data_scope="claim")]
    assert order[0] == "group:religion=Muslim" and set(order) == {r["group_key"] for r in rows[1:]}
    words = {
        s["attrs"]["data-status"]: s["text"] for s in doc.find("span") if "decision" in s["attrs"].get("class", "")
    }
    assert words == {
        "claimed": "beyond chance",
        "not shown": "not shown",
        "inseparable": "cannot be told apart from role=nurse in this pool: x",
        "not tested": "not tested: too few pairs",
        "gated": "not shown: beyond chance alone, but its axis as a whole is not",
    }
    cis = {s["attrs"]["data-key"]: s["text"] for s in doc.find("span", data_field="ci")}
    assert cis == {
        "group:religion=Muslim": "[+0.660, +0.880] (99.86%)",
        "group:religion=Jewish": "[-0.020, +0.050] (93.1%)",
        "group:role=nurse": "[+0.100, +0.500] (level not recorded)",
    }
    group = dict(metric="m", scope="group", threshold=0.7, n=30, score=0.2, ci_low=0.1, ci_high=0.3, passed=False)
    group_rows = rows + [
        dict(
            group,
            group_key="religion=Muslim",
            details=json.dumps(
                {
                    "raw_equitability": 0.35,
                    "gap": 0.76,
                    "gap_ci": [0.66, 0.88],
                    "gap_ci_confidence": 0.9986,
                    "status": "claimed",
                    "p_adjusted": 0.004,
                }
            ),
        ),
        dict(
            group,
            group_key="role=student",
            score=None,
            ci_low=None,
            ci_high=None,
            passed=None,
            threshold=None,
            details=json.dumps(
                {
                    "raw_equitability": 0.86,
                    "status": "inseparable",
                    "inseparable": "cannot be told apart from role=nurse in this pool: x",
                }
            ),
        ),
    ]
    doc = Doc(group_tables.groups_table("m", group_rows))
    (tr,) = doc.find("tr", data_scope="group")
    assert tr["attrs"]["data-key"] == "religion=Muslim" and "FAIL" in tr["text"]
    assert "(99.86%)" in tr["text"] and "[0.100, 0.300] (95%, unadjusted)" in tr["text"]
    (li,) = doc.find("li", data_key="role=student")
    assert "cannot be told apart from role=nurse in this pool: x" in li["text"] and "FAIL" not in li["text"]


def test_weakest_rows_with_their_probes_and_answers(warehouse, report):
    _, _, doc = report
    for metric in METRICS:
        weakest = q(
            warehouse,
            """SELECT input_id, score FROM row_scores WHERE run_id = ? AND metric = ?
                                  AND status = 'ok' AND score IS NOT NULL ORDER BY score, input_id LIMIT ?""",
            [RUN, metric, WEAKEST_ROWS],
        )
        cards = [e for e in doc.find("div", data_metric=metric) if e["attrs"].get("class") == "row-card"]
        assert [c["attrs"]["data-input-id"] for c in cards] == list(weakest.input_id)
        for card, row in zip(cards, weakest.itertuples()):
            score = [e for e in doc.find(data_field="score", data_input_id=row.input_id, data_metric=metric)]
            assert len(score) == 1 and _same(score[0]["attrs"]["data-value"], row.score)
            answers = q(
                warehouse,
                """SELECT r.response FROM sut_responses r JOIN probes p USING (run_id, metric, probe_id)
                                      WHERE r.run_id = ? AND r.metric = ? AND p.input_id = ? AND r.status = 'ok'""",
                [RUN, metric, row.input_id],
            ).response
            clipped = {a if len(a) <= TEXT_LIMIT else a[:TEXT_LIMIT].rstrip() + "…" for a in answers}
            shown = [e["text"] for e in doc.elements if card in e["parents"] and e["attrs"].get("class") == "answer"]
            probes = [e["text"] for e in doc.elements if card in e["parents"] and e["attrs"].get("class") == "probe"]
            assert 1 <= len(shown) <= 4 and len(probes) == len(shown), (metric, row.input_id)
            assert all(s in clipped for s in shown if not s.startswith("(")), (metric, row.input_id)
            assert any(s in clipped for s in shown)
            assert all(len(p) <= TEXT_LIMIT + 1 for p in probes)
    errored = q(warehouse, "SELECT metric, input_id, error FROM row_scores WHERE run_id = ? AND status <> 'ok'", [RUN])
    assert len(errored), "the garbage-answering judge should leave some rows errored"
    for r in errored.itertuples():
        rows = [e for e in doc.find("tr", data_metric=r.metric, data_input_id=r.input_id)]
        assert len(rows) == 1 and r.error[:100] in rows[0]["text"]


def test_token_use_per_role_equals_llm_calls(warehouse, report):
    _, _, doc = report
    calls = q(
        warehouse,
        """SELECT role, count(*) AS calls, count(*) FILTER (WHERE status <> 'ok') AS failed,
                                   sum(prompt_tokens) AS prompt_tokens, sum(completion_tokens) AS completion_tokens,
                                   median(latency_ms) AS p50_latency_ms
                            FROM llm_calls WHERE run_id = ? GROUP BY role""",
        [RUN],
    )
    assert {"sut", "judge"} <= set(calls.role)
    for r in calls.itertuples():
        for field in ("calls", "failed", "prompt_tokens", "completion_tokens", "p50_latency_ms"):
            cells = doc.find("td", data_table="cost_by_role", data_role=r.role, data_field=field)
            assert len(cells) == 1 and _same(cells[0]["attrs"]["data-value"], getattr(r, field)), (r.role, field)
        assert doc.find("td", data_table="cost_by_role", data_role=r.role, data_field="prompt_tokens")[0][
            "text"
        ].replace(",", "") == str(int(r.prompt_tokens))
    total = doc.find("td", data_table="cost_by_role", data_role="all", data_field="prompt_tokens")[0]
    assert int(total["attrs"]["data-value"]) == int(calls.prompt_tokens.sum())


def test_header_names_the_run(warehouse, report):
    _, text, _ = report
    run = q(warehouse, "SELECT * FROM eval_runs WHERE run_id = ?", [RUN]).iloc[0]
    for s in (RUN, run.spec_name, str(run.created_at), run.package_version, run.dataset_path):
        assert s in text
    for m, v in json.loads(run.metric_versions).items():
        assert f"<code>{m}</code> {v}" in text


def test_cli_report_and_unknown_run(warehouse, tmp_path, capsys):
    out = tmp_path / "r" / "x.html"
    assert main(["report", RUN, "--warehouse", str(warehouse), "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out.resolve()) and out.stat().st_size > 10_000
    assert main(["report", "no-such-run", "--warehouse", str(warehouse)]) == 2
    err = capsys.readouterr().err
    assert "no-such-run" in err and "not registered" in err
    with pytest.raises(AipError):
        build_report("no-such-run", warehouse)
    assert main(["report", RUN, "--warehouse", str(tmp_path / "missing.duckdb")]) == 2


def test_a_run_without_scores_still_reports(tmp_path):
    spec = make_spec(write_dataset(tmp_path / "d.jsonl", 2))
    pipeline.register_run(spec, "empty")
    text = write_report("empty").read_text()
    assert "No metric of this run has been aggregated yet" in text and "No model calls recorded" in text


def test_renders_in_headless_chromium(report, tmp_path):
    exe = "/usr/bin/chromium"
    if not os.path.exists(exe):
        pytest.skip("chromium is not installed")
    out, _, _ = report
    png = tmp_path / "report.png"
    proc = subprocess.run(
        [
            exe,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={tmp_path / 'profile'}",
            f"--screenshot={png}",
            "--window-size=1200,3000",
            f"file://{out}",
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert png.exists(), proc.stderr[-2000:]
    assert png.stat().st_size > 10_000
    shutil.rmtree(tmp_path / "profile", ignore_errors=True)


# --------------------------------------------------------------------------- the sample viewer


def viewer_data(text: str) -> dict:
    start = text.index('<script type="application/json" id="aip-viewer-data">')
    body = text[text.index(">", start) + 1 : text.index("</script>", start)]
    assert "<" not in body and ">" not in body
    return json.loads(body)


def _plain(x):
    """A warehouse value as the viewer's JSON has it: NULL, NaN and NA are None."""
    import pandas as pd

    return None if x is None or x is pd.NA or (isinstance(x, float) and math.isnan(x)) else x


def _clipped(s):
    s = _plain(s)
    return s if s is None or len(s) <= VIEW_TEXT_LIMIT else s[:VIEW_TEXT_LIMIT]


def test_viewer_holds_every_row_with_the_warehouse_values(warehouse, report):
    _, text, _ = report
    data = viewer_data(text)
    rows = q(warehouse, "SELECT * FROM row_scores WHERE run_id = ? ORDER BY metric, input_id", [RUN])
    got = {(r["m"], r["id"]): r for r in data["rows"]}
    assert len(got) == len(data["rows"]) == len(rows) and {m["metric"] for m in data["metrics"]} == set(METRICS)
    for r in rows.itertuples():
        v = got[(r.metric, r.input_id)]
        assert _same("" if v["score"] is None else repr(v["score"]), r.score), (r.metric, r.input_id)
        assert (v["label"], v["status"], v["nj"], v["nf"], v["ne"]) == (
            r.label,
            r.status,
            r.n_judged,
            r.n_failed,
            r.n_events,
        )
        assert v["flagged"] == (r.n_events > 0)
        assert v["excluded"] == (r.score is None or math.isnan(r.score) or r.n_failed > 0)
    # failed: the row, one of its SUT answers or one of its judges failed
    failed = set(
        q(
            warehouse,
            """
        SELECT metric, input_id FROM row_scores WHERE run_id = ? AND status <> 'ok'
        UNION SELECT metric, input_id FROM sut_responses WHERE run_id = ? AND status <> 'ok'
        UNION SELECT metric, input_id FROM judgements WHERE run_id = ? AND status <> 'ok'""",
            [RUN, RUN, RUN],
        ).itertuples(index=False, name=None)
    )
    assert failed and {k for k, v in got.items() if v["failed"]} == failed
    # every judgement of the run is shown once, on its row, with its verdict
    judged = q(
        warehouse, "SELECT metric, input_id, judge_kind, status, label, score FROM judgements WHERE run_id = ?", [RUN]
    )
    shown = []
    for (m, i), v in got.items():
        for it in v["items"]:
            shown += [(m, i, x["k"], x["st"], x["l"], x["s"]) for x in it["v"]]
        shown += [(m, i, x["k"], x["st"], x["l"], x["s"]) for x in v["single"]]
    norm = lambda t: tuple(map(_plain, t))  # noqa: E731
    assert sorted(map(norm, shown), key=repr) == sorted(map(norm, judged.itertuples(index=False, name=None)), key=repr)


def test_viewer_pairs_read_in_persona_order(warehouse, report):
    """A decision-flip pair: persona a's probe and answer on the left, b's on the right, the decisions
    and the reasoning in the same order (v_pair_verdicts: "Response 1/2" rewritten where the judge
    saw b first)."""
    data = viewer_data(report[1])
    pv = q(warehouse, "SELECT * FROM v_pair_verdicts WHERE run_id = ?", [RUN])
    assert pv.order_swapped.any() and (~pv.order_swapped.astype(bool)).any()
    # the no-effect baseline's null pairs (one persona's first answer and a fresh sample) are shown too
    nulls = q(warehouse, "SELECT * FROM v_baseline_pairs WHERE run_id = ?", [RUN])
    assert len(nulls) > 0
    by = {(r.input_id, r.value_a, r.value_b, False): r for r in pv.itertuples()}
    by.update({(r.input_id, r.twin_of, True): r for r in nulls.itertuples()})
    n = 0
    for row in (r for r in data["rows"] if r["m"] == "llm.decision_flip"):
        for it in row["items"]:
            if it["null"]:
                [pair] = [r for k, r in by.items() if k[-1] and k[0] == row["id"] and k[1] in it["title"]]
            else:
                pair = by[(row["id"], it["a"]["who"], it["b"]["who"], False)]
            a, b = row["probes"][it["a"]["p"]], row["probes"][it["b"]["p"]]
            assert (a["q"], b["q"]) == (_clipped(pair.query_a), _clipped(pair.query_b))
            assert (it["b"]["s"] == "0") is (not it["null"])  # a null pair's b: the fresh sample it compares
            assert (a["ans"]["0"]["t"], b["ans"][it["b"]["s"]]["t"]) == (
                _clipped(pair.response_a),
                _clipped(pair.response_b),
            )
            [v] = it["v"]
            assert (v["da"], v["db"], v["f"], v["sw"]) == tuple(
                map(_plain, (pair.decision_a, pair.decision_b, pair.flipped, pair.order_swapped))
            )
            assert v["r"] == _clipped(pair.reasoning)
            n += 1
    assert n == len(pv) + len(nulls)

    # a row opens on its most telling comparisons: flips, then failed judges, then the worst scores
    # (group bias: low similarity, high tone divergence or effort gap)
    def telling(v):
        if v["f"]:
            return 3
        if v["st"] != "ok":
            return 2
        return v["s"] if v["k"] in ("tone", "effort") else 1 - v["s"]

    orders = [
        [max(telling(v) for v in it["v"]) for it in row["items"]]
        for row in data["rows"]
        if row["m"] in ("llm.group_interaction_bias", "llm.decision_flip")
    ]
    assert all(o == sorted(o, reverse=True) for o in orders) and any(len(set(o)) > 2 for o in orders)
    # consistency: the base answer beside each sampled variant answer it was compared with
    comp = q(
        warehouse,
        "SELECT * FROM v_consistency_comparisons WHERE run_id = ? AND metric = 'llm.semantic_consistency'",
        [RUN],
    )
    for c in comp.itertuples():
        row = next(r for r in data["rows"] if r["m"] == c.metric and r["id"] == c.input_id)
        [it] = [it for it in row["items"] if it["b"]["s"] == str(c.sample_index)]
        assert row["probes"][it["a"]["p"]]["ans"]["0"]["t"] == _clipped(c.base_response)
        assert row["probes"][it["b"]["p"]]["ans"][str(c.sample_index)]["t"] == _clipped(c.variant_response)


def test_viewer_keeps_the_lowest_rows_of_a_large_run_and_says_so(warehouse):
    data = viewer_data(build_report(RUN, warehouse, rows_per_metric=3))
    for m in data["metrics"]:
        want = q(
            warehouse,
            """SELECT input_id FROM row_scores WHERE run_id = ? AND metric = ?
                               ORDER BY score ASC NULLS FIRST, input_id LIMIT 3""",
            [RUN, m["metric"]],
        )
        total = q(
            warehouse, "SELECT count(*) AS n FROM row_scores WHERE run_id = ? AND metric = ?", [RUN, m["metric"]]
        ).n[0]
        assert [r["id"] for r in data["rows"] if r["m"] == m["metric"]] == list(want.input_id)
        assert (m["shown"], m["total"]) == (3, total) and total > 3


def test_viewer_in_headless_chromium_filters_and_opens_a_row(warehouse, report, tmp_path):
    """Filter, search, sort and open a row in the page itself; the counts and numbers it shows are the
    warehouse's, and the dataset's markup stays text."""
    from .test_ui import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS

    if not CHROMIUM.exists():
        pytest.skip(f"no Chromium at {CHROMIUM}")
    sync_api = pytest.importorskip("playwright.sync_api")
    out = report[0]
    flagged = q(
        warehouse,
        "SELECT input_id, score FROM row_scores WHERE run_id = ? AND metric = 'llm.decision_flip' "
        "AND n_events > 0 ORDER BY score, input_id",
        [RUN],
    )
    errored = q(warehouse, "SELECT metric, input_id FROM row_scores WHERE run_id = ? AND status <> 'ok'", [RUN])
    total = q(warehouse, "SELECT count(*) AS n, max(score) AS top FROM row_scores WHERE run_id = ?", [RUN])
    assert len(flagged) >= 2 and len(errored)
    errors: list[str] = []
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 1600})
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(f"file://{out}")
            page.wait_for_selector("#viewer[data-ready='1']")
            count = lambda: int(page.get_attribute("#viewer-count", "data-matching"))  # noqa: E731
            assert count() == total.n[0]
            # sort: the highest score first
            page.select_option("select[data-filter=sort]", "score-desc")
            assert (
                float(page.get_attribute("#viewer tr.row >> nth=0 >> td[data-field=score]", "data-value"))
                == total.top[0]
            )
            page.select_option("select[data-filter=sort]", "score-asc")
            # filter: decision flip, flipped rows only, in score order
            page.select_option("select[data-filter=metric]", "llm.decision_flip")
            page.check("input[data-filter=flagged]")
            assert count() == len(flagged)
            ids = page.eval_on_selector_all("#viewer tr.row", "rs => rs.map(r => r.dataset.inputId)")
            assert ids == list(flagged.input_id)
            # an axis narrows to the rows with a pair on that axis
            axis = q(
                warehouse,
                # flipped rows of an axis: the rows flipped on it
                """SELECT axis, count(DISTINCT input_id) AS n FROM v_flipped_pairs
                                   WHERE run_id = ? GROUP BY axis ORDER BY axis LIMIT 1""",
                [RUN],
            )
            page.select_option("select[data-filter=axis]", axis.axis[0])
            assert count() == axis.n[0]
            page.select_option("select[data-filter=axis]", "")
            # open the lowest row: its flipped pairs come first, answers in persona order, reasoning shown
            first = flagged.input_id[0]
            page.click(f"#viewer tr.row[data-input-id='{first}']")
            detail = page.locator(f"#viewer td.detail[data-input-id='{first}']")
            top = q(
                warehouse,
                """SELECT * FROM v_pair_verdicts WHERE run_id = ? AND input_id = ? AND flipped
                                  ORDER BY value_a || ' vs ' || value_b LIMIT 1""",
                [RUN, first],
            )
            box = detail.locator(".pair").first
            assert box.locator(".who").first.inner_text().endswith(f"{top.value_a[0]} vs {top.value_b[0]}")
            answers = box.locator("[data-answer]").all_inner_texts()
            assert [a.strip() for a in answers] == [top.response_a[0].strip(), top.response_b[0].strip()]
            assert box.locator("[data-reasoning]").inner_text().strip() == top.reasoning[0].strip()
            assert "flipped, due to the persona" in box.inner_text()
            assert MARK in detail.inner_text()  # the dataset's markup, shown as text
            page.screenshot(path=str(tmp_path / "viewer_row.png"))
            # search by id; then the failed filter across metrics
            page.check("input[data-filter=flagged]")
            page.uncheck("input[data-filter=flagged]")
            page.select_option("select[data-filter=metric]", "")

            def settles_at(n: int) -> None:  # search runs once typing pauses
                page.wait_for_function(f"document.getElementById('viewer-count').dataset.matching === '{n}'")

            page.fill("input[data-filter=search]", first)
            settles_at(
                q(
                    warehouse,
                    "SELECT count(*) AS n FROM row_scores WHERE run_id = ? AND input_id LIKE ?",
                    [RUN, f"%{first}%"],
                ).n[0]
            )
            page.fill("input[data-filter=search]", "")
            settles_at(total.n[0])
            page.check("input[data-filter=failed]")
            assert count() >= len(errored)
            shown = set(
                page.eval_on_selector_all(
                    "#viewer tr.row", "rs => rs.map(r => r.dataset.metric + '|' + r.dataset.inputId)"
                )
            )
            assert {f"{m}|{i}" for m, i in errored.itertuples(index=False, name=None)} <= shown
        finally:
            browser.close()
    assert errors == []
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(tmp_path / "viewer_row.png", ARTIFACTS / "viewer_row.png")


def test_viewer_detail_orders_and_places_verdicts_by_hand():
    """_detail on hand-made rows: group-bias pairs ordered by how telling their verdicts are (not by
    name); perturbation verdicts beside the variant they judged, the baseline's on its own; a
    consistency comparison beside the sampled answer it compared."""
    from aip_assets.report.viewer import _detail

    def probe(pid, role, sample=0, status="ok", **kw):
        return {
            "probe_id": pid,
            "role": role,
            "sample_index": sample,
            "response": f"answer {pid}/{sample}",
            "sut_status": status,
            "sut_error": None if status == "ok" else "HTTP 500",
            "query_text": f"ask {pid}",
            **kw,
        }

    def judged(kind, score, status="ok", **kw):
        return {"judge_kind": kind, "score": score, "status": status, "label": None, **kw}

    entries = [probe(x, "persona", persona_id=x) for x in "abcdefgh"]
    pairs = [
        {"pair_id": f"p{i}", "value_a": x, "value_b": y, "probe_a": x, "probe_b": y, "axis": None}
        for i, (x, y) in enumerate(["ab", "cd", "ef", "gh"])
    ]
    verdicts = [
        judged("similarity", 0.9, pair_id="p0"),
        judged("tone", 0.1, pair_id="p0"),  # 0.1
        judged("similarity", 0.95, pair_id="p1"),
        judged("tone", 0.8, pair_id="p1"),  # 0.8
        judged("similarity", 0.3, pair_id="p2"),
        judged("tone", 0.0, pair_id="p2"),  # 0.7
        judged("similarity", None, "judge_failed", pair_id="p3"),
    ]  # failed: 2
    d = _detail(entries, pairs, verdicts)
    assert [it["title"] for it in d["items"]] == ["g vs h", "c vs d", "e vs f", "a vs b"]
    assert d["any_failed"] and d["personas"] == list("abcdefgh") and d["other"] == [] and d["single"] == []

    base = probe("B", "baseline", category="baseline", variant_id="row1")
    typo = probe("T", "variant", category="typos", variant_id="row1--typos-1")
    case = probe("C", "variant", category="casing", variant_id="row1--casing-1", status="error")
    verdicts = [
        judged("correctness", 1.0, category="baseline"),
        judged("correctness", 0.0, category="typos", variant_id="row1--typos-1"),
        judged("robustness", 0.5, category="typos", variant_id="row1--typos-1"),
        judged("robustness", 1.0, category="casing", variant_id="row1--casing-1"),
    ]
    d = _detail([base, typo, case], [], verdicts)
    by_right = {d["probes"][it["b"]["p"]]["id"]: it for it in d["items"]}
    assert [d["probes"][it["a"]["p"]]["id"] for it in d["items"]] == ["B", "B"]
    assert sorted((v["k"], v["s"]) for v in by_right["T"]["v"]) == [("correctness", 0.0), ("robustness", 0.5)]
    assert [v["s"] for v in by_right["C"]["v"]] == [1.0] and list(by_right) == ["T", "C"]  # the wrong typo answer first
    assert [(v["k"], v["c"]) for v in d["single"]] == [("correctness", "baseline")]
    assert d["cats"] == ["casing", "typos"] and d["any_failed"]  # the casing answer failed

    base = probe("B", "base")
    samples = [probe("V", "variant", sample=i, category="formal") for i in (1, 2)]
    verdicts = [
        judged("comparison", 0.0, sample_index=2, category="formal"),
        judged("comparison", 1.0, sample_index=1, category="formal"),
    ]
    d = _detail([base, *samples], [], verdicts)
    assert [(it["b"]["s"], it["v"][0]["s"]) for it in d["items"]] == [("2", 0.0), ("1", 1.0)]
    assert all(d["probes"][it["b"]["p"]]["ans"][it["b"]["s"]]["t"] == f"answer V/{it['b']['s']}" for it in d["items"])
    assert not d["any_failed"]


def test_viewer_pairs_an_external_perturbation_variant_with_its_baseline(tmp_path):
    """In the external perturbation metric each variant is its own row and its baseline another:
    a variant's row opens to the baseline's answer beside its own, with the verdicts on them."""
    repo = Path(__file__).resolve().parents[1]
    metric = "llm.perturbation_robustness_external"
    assert main(
        ["run", str(repo / "data" / "runs" / "demo.yaml"), "--metric", metric, "--quiet", "--json", "--run-id", "ext"]
    ) in (0, 1)
    db = wh.default_path()
    data = viewer_data(build_report("ext", db))
    pairs = q(
        db,
        """SELECT v.input_id, b.query_text AS base_q, rb.response AS base_a, v.query_text AS var_q,
                            rv.response AS var_a
                     FROM probes v JOIN probes b ON b.run_id = v.run_id AND b.metric = v.metric
                          AND b.group_id = v.group_id AND b.role = 'baseline'
                     JOIN sut_responses rb ON rb.run_id = b.run_id AND rb.metric = b.metric AND rb.probe_id = b.probe_id
                     JOIN sut_responses rv ON rv.run_id = v.run_id AND rv.metric = v.metric AND rv.probe_id = v.probe_id
                     WHERE v.run_id = 'ext' AND v.metric = ? AND v.role = 'variant'""",
        [metric],
    )
    assert len(pairs) > 100
    rows = {r["id"]: r for r in data["rows"] if r["m"] == metric}
    for p in pairs.itertuples():
        [it] = rows[p.input_id]["items"]
        a, b = (rows[p.input_id]["probes"][it[side]["p"]] for side in ("a", "b"))
        assert (a["role"], a["q"], a["ans"]["0"]["t"]) == ("baseline", _clipped(p.base_q), _clipped(p.base_a))
        assert (b["role"], b["q"], b["ans"]["0"]["t"]) == ("variant", _clipped(p.var_q), _clipped(p.var_a))
        assert sorted(v["k"] for v in it["v"]) == ["correctness", "robustness"]


def test_viewer_keeps_within_its_byte_budget_lowest_rows_first(warehouse):
    from aip_assets.report.queries import _Reader
    from aip_assets.report.values import _records
    from aip_assets.report.viewer import _take_calls, read

    rd = _Reader(RUN, warehouse)
    full = read(lambda sql, params=None: _records(rd.q(sql, params)), list(METRICS), 500, RUN)
    bare = json.loads(json.dumps(full["rows"]))
    for r in bare:
        _take_calls(r)  # the judge's calls are dropped before any row
    sizes = {m: sum(len(json.dumps(r, ensure_ascii=False)) for r in bare if r["m"] == m) for m in METRICS}
    budget = min(sizes.values()) // 2 * len(METRICS)  # every metric's share is half its smallest's rows' size
    small = read(lambda sql, params=None: _records(rd.q(sql, params)), list(METRICS), 500, RUN, max_bytes=budget)
    for m in METRICS:
        every = [r["id"] for r in full["rows"] if r["m"] == m]
        kept = [r["id"] for r in small["rows"] if r["m"] == m]
        assert 1 <= len(kept) < len(every) and kept == every[: len(kept)], m  # a prefix: the lowest scores
        kept_size = sum(len(json.dumps(r, ensure_ascii=False)) for r in small["rows"] if r["m"] == m)
        assert kept_size <= budget // len(METRICS) or len(kept) == 1
        [info] = [x for x in small["metrics"] if x["metric"] == m]
        assert (info["shown"], info["total"]) == (len(kept), len(every))


# --------------------------------------------------------------------------- markup from a model, the static script

PAYLOAD = (
    '</script><script>window.aipPwned = 1</script><img src=x onerror="window.aipPwned = 2"> & <marquee>moving</marquee>'
)


def _console_errors(page) -> list[str]:
    """The page's uncaught exceptions and console errors, collected as they come."""
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
    page.on("console", lambda m: errors.append(f"console: {m.text}") if m.type == "error" else None)
    return errors


def test_a_model_answer_with_markup_stays_text_in_the_report_and_the_viewer(scripted, tmp_path):
    """A SUT that answers with a script, an image whose onerror runs code and markup: the report's
    evidence shows the answer as text, the viewer's data holds it with no "<" or ">", and in
    Chromium the opened row shows it as text and none of it runs."""
    from .test_ui import CHROMIUM, CHROMIUM_ARGS

    answer = f"{PAYLOAD}\nDecision: YES"
    sut = scripted(lambda body, n: answer)
    run_all(make_spec(write_dataset(tmp_path / "d.jsonl", 2), sut=sut.conn()), "mk")
    out = write_report("mk")
    text = out.read_text(encoding="utf-8")
    doc = Doc(text)
    answers = [e["text"] for e in doc.elements if e["tag"] == "td" and e["attrs"].get("class") == "answer"]
    assert answers and all(a == answer for a in answers)
    assert not doc.find("img") and not doc.find("marquee") and len(doc.find("script")) == 2
    assert "&lt;/script&gt;&lt;script&gt;window.aipPwned = 1&lt;/script&gt;" in text
    data = viewer_data(text)  # no "<" or ">" in the embedded data
    said = [a["t"] for r in data["rows"] for p in r["probes"] for a in p["ans"].values()]
    assert said and all(t == answer for t in said)

    if not CHROMIUM.exists():
        pytest.skip(f"no Chromium at {CHROMIUM}")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            errors = _console_errors(page)
            page.goto(f"file://{out}")
            page.wait_for_selector("#viewer[data-ready='1']")
            page.click("#viewer tr.row >> nth=0")
            shown = page.locator("#viewer td.detail [data-answer]").all_inner_texts()
            assert shown and all(PAYLOAD in s for s in shown)
            assert page.evaluate(
                "window.aipPwned === undefined && document.querySelectorAll('img, marquee').length === 0"
            )
        finally:
            browser.close()
    assert errors == []


def test_flagged_rows_of_an_axis_are_the_rows_flipped_on_it(tmp_path):
    """Hand-made decision flip rows, each with a gender and a religion pair: one flipped on gender,
    one on religion, one not at all. The axis filter alone keeps all three (each has both axes);
    with flipped, only the row flipped on that axis (the metadata's ``viewer gender`` link)."""
    from aip_assets.report.links import viewer_fragment
    from aip_assets.report.templating import static
    from aip_assets.report.viewer import _detail, section

    from .test_ui import CHROMIUM, CHROMIUM_ARGS

    if not CHROMIUM.exists():
        pytest.skip(f"no Chromium at {CHROMIUM}")
    sync_api = pytest.importorskip("playwright.sync_api")
    rows = []
    for rid, flipped_on in (("g", "gender"), ("r", "religion"), ("n", None)):
        probes, pairs, judged = [], [], []
        for axis, (va, vb) in (("gender", ("woman", "man")), ("religion", ("Muslim", "Jewish"))):
            for v in (va, vb):
                probes.append(
                    {"probe_id": f"{rid}{v}", "role": "persona", "attribute_value": v, "axis": axis,
                     "sample_index": 0, "response": "Decision: YES", "sut_status": "ok", "query_text": f"I am {v}"}
                )  # fmt: skip
            pairs.append(
                {"pair_id": f"{rid}{axis}", "value_a": va, "value_b": vb, "probe_a": f"{rid}{va}",
                 "probe_b": f"{rid}{vb}", "axis": axis, "kind": None}
            )  # fmt: skip
            judged.append(
                {"pair_id": f"{rid}{axis}", "judge_kind": "decision", "score": 0.0 if axis == flipped_on else 1.0,
                 "status": "ok", "label": "flip", "flipped": axis == flipped_on}
            )  # fmt: skip
        detail = _detail(probes, pairs, judged)
        detail.pop("any_failed")
        assert detail["fax"] == ([flipped_on] if flipped_on else [])
        rows.append(
            {"m": "llm.decision_flip", "id": rid, "score": 0.5 if flipped_on else 1.0, "raw": None, "label": "x",
             "status": "ok", "error": None, "expl": None, "nj": 2, "nf": 0, "ne": int(bool(flipped_on)),
             "flagged": bool(flipped_on), "excluded": False, "failed": False, "groups": [], **detail}
        )  # fmt: skip
    data = {
        "run_id": "hand",
        "metrics": [{"metric": "llm.decision_flip", "name": "df", "facet": "category", "shown": 3, "total": 3}],
        "rows_per_metric": 3,
        "rows": rows,
    }
    page_file = tmp_path / "viewer.html"
    page_file.write_text(
        f'<!DOCTYPE html><html><head><meta charset="utf-8"><style>{static("viewer.css")}</style>'
        f"</head><body>{section(data)}</body></html>",
        encoding="utf-8",
    )
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            errors = _console_errors(page)
            shown = lambda: sorted(page.eval_on_selector_all("#viewer tr.row", "rs => rs.map(r => r.dataset.inputId)"))  # noqa: E731
            for view, want in (
                ({"axis": "gender"}, ["g", "n", "r"]),
                ({"flagged": True}, ["g", "r"]),
                ({"flagged": True, "axis": "gender"}, ["g"]),
                ({"flagged": True, "axis": "religion"}, ["r"]),
            ):
                page.goto(f"file://{page_file}" + viewer_fragment(metric="llm.decision_flip", **view))
                page.reload()
                page.wait_for_selector("#viewer[data-ready='1']")
                assert shown() == want, view
        finally:
            browser.close()
    assert errors == []


def test_the_viewer_script_pages_caps_and_sorts_hand_made_rows(tmp_path):
    """static/viewer.js on data made by hand, in a page of its own: it loads with no console error,
    shows 100 rows at a time with a button for the rest, says how many rows the file leaves out,
    sorts an unscored row first, and the facet filters offer each row's values."""
    from aip_assets.report.templating import static
    from aip_assets.report.viewer import _detail, section

    from .test_ui import CHROMIUM, CHROMIUM_ARGS

    if not CHROMIUM.exists():
        pytest.skip(f"no Chromium at {CHROMIUM}")
    sync_api = pytest.importorskip("playwright.sync_api")
    rows = []
    for i in range(150):
        probes = [
            {
                "probe_id": f"p{i}{s}",
                "role": "persona",
                "persona_id": s,
                "attribute_value": s,
                "axis": "gender",
                "sample_index": 0,
                "response": f"answer {i}{s}",
                "sut_status": "ok",
                "sut_error": None,
                "query_text": f"ask {i}{s}",
            }
            for s in "ab"
        ]
        pairs = [
            {
                "pair_id": f"q{i}",
                "value_a": "a",
                "value_b": "b",
                "probe_a": f"p{i}a",
                "probe_b": f"p{i}b",
                "axis": "gender",
                "kind": None,
            }
        ]
        judged = [
            {
                "pair_id": f"q{i}",
                "judge_kind": "decision",
                "score": None if i == 7 else 1 - i / 200,
                "status": "ok",
                "label": "same",
                "flipped": i % 3 == 0,
                "reasoning": f"why {i}",
            }
        ]
        detail = _detail(probes, pairs, judged)
        detail.pop("any_failed")
        rows.append(
            {
                "m": "llm.toy",
                "id": f"row{i:03d}",
                "score": judged[0]["score"],
                "raw": judged[0]["score"],
                "label": "flip" if i % 3 == 0 else "same",
                "status": "ok",
                "error": None,
                "expl": None,
                "nj": 1,
                "nf": 0,
                "ne": int(i % 3 == 0),
                "flagged": i % 3 == 0,
                "excluded": i == 7,
                "failed": False,
                **detail,
            }
        )
    data = {
        "run_id": "hand",
        "metrics": [{"metric": "llm.toy", "name": "toy", "facet": "category", "shown": 150, "total": 400}],
        "rows_per_metric": 150,
        "rows": rows,
    }
    page_file = tmp_path / "viewer.html"
    page_file.write_text(
        f'<!DOCTYPE html><html><head><meta charset="utf-8"><style>{static("viewer.css")}</style>'
        f"</head><body>{section(data)}</body></html>",
        encoding="utf-8",
    )
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            errors = _console_errors(page)
            page.goto(f"file://{page_file}")
            page.wait_for_selector("#viewer[data-ready='1']")
            shown = lambda: page.locator("#viewer tr.row").count()  # noqa: E731
            assert page.inner_text("#viewer-count") == "150 of 150 rows match" and shown() == 100
            assert page.inner_text("#viewer-more") == "show 50 more"
            assert "llm.toy: the 150 lowest-scored of 400 rows are in this file" in page.inner_text("#viewer-cap")
            assert page.get_attribute("#viewer tr.row >> nth=0", "data-input-id") == "row007"  # unscored first
            page.click("#viewer-more")
            assert shown() == 150 and not page.is_visible("#viewer-more")
            assert page.eval_on_selector_all("select[data-filter=persona] option", "os => os.map(o => o.value)") == [
                "",
                "a",
                "b",
            ]
            page.check("input[data-filter=flagged]")
            assert page.get_attribute("#viewer-count", "data-matching") == "50"
            page.click("#viewer tr.row[data-input-id='row003']")
            assert page.locator("#viewer td.detail [data-answer]").all_inner_texts() == ["answer 3a", "answer 3b"]
        finally:
            browser.close()
    assert errors == []


def test_templates_escape_what_they_print():
    """Autoescaping: a value a template prints is escaped (as the Python-built fragments are), HTML the
    package built itself (Markup) is not, and None prints as nothing."""
    from markupsafe import Markup

    from aip_assets.report.templating import environment

    t = environment().from_string("{{ a }}|{{ b }}|{{ c }}")
    assert t.render(a="<script>\"x\" & 'y'</script>", b=Markup("<b>ok</b>"), c=None) == (
        "&lt;script&gt;&quot;x&quot; &amp; &#x27;y&#x27;&lt;/script&gt;|<b>ok</b>|"
    )


def test_every_template_and_static_file_is_package_data():
    """A wheel carries the report's templates and static files: each matches a package-data pattern."""
    import fnmatch
    import tomllib

    repo = Path(__file__).resolve().parents[1]
    patterns = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["aip_assets"]
    files = [
        p.relative_to(repo / "aip_assets").as_posix()
        for d in ("templates", "static")
        for p in (repo / "aip_assets" / "report" / d).iterdir()
    ]
    assert {"report/templates/report.html.j2", "report/templates/viewer.html.j2", "report/static/viewer.js"} <= set(
        files
    )
    assert all(any(fnmatch.fnmatch(f, pat) for pat in patterns) for f in files), files


def _fragment(page) -> dict[str, str]:
    """The view the page's URL holds (its ``#v:`` fragment), as key -> value."""
    from urllib.parse import parse_qsl, urlsplit

    fragment = urlsplit(page.url).fragment
    assert fragment.startswith("v:"), page.url
    return dict(parse_qsl(fragment[2:]))


def test_a_viewer_link_reproduces_its_view_and_the_url_follows_the_view(warehouse, report, tmp_path):
    """A link made by ``viewer_link`` (a metric, its flagged rows, one open) opens on exactly those
    rows with that row open; filtering, closing the row and a new fragment (hashchange) keep the URL
    and the view in step."""
    from aip_assets.report.links import viewer_fragment, viewer_link

    from .test_ui import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS

    if not CHROMIUM.exists():
        pytest.skip(f"no Chromium at {CHROMIUM}")
    sync_api = pytest.importorskip("playwright.sync_api")
    out = report[0]
    flagged = q(
        warehouse,
        "SELECT input_id FROM row_scores WHERE run_id = ? AND metric = 'llm.decision_flip' AND n_events > 0 "
        "ORDER BY score, input_id",
        [RUN],
    )
    every = q(
        warehouse, "SELECT count(*) AS n FROM row_scores WHERE run_id = ? AND metric = 'llm.decision_flip'", [RUN]
    )
    assert len(flagged) >= 2 and every.n[0] > len(flagged)
    opened = flagged.input_id[1]  # not the first row: the link, not the order, opens it
    persona = q(
        warehouse,
        """SELECT v AS persona, count(DISTINCT input_id) AS n FROM (
               SELECT input_id, unnest([value_a, value_b]) AS v FROM probe_pairs
               WHERE run_id = ? AND metric = 'llm.group_interaction_bias')
           GROUP BY v ORDER BY n, v LIMIT 1""",
        [RUN],
    )
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 1400})
            errors = _console_errors(page)
            page.goto(viewer_link(f"file://{out}", metric="llm.decision_flip", flagged=True, open=opened))
            page.wait_for_selector("#viewer[data-ready='1']")
            rows = lambda: page.eval_on_selector_all("#viewer tr.row", "rs => rs.map(r => r.dataset.inputId)")  # noqa: E731
            is_open = lambda: page.eval_on_selector_all("#viewer tr.row.open", "rs => rs.map(r => r.dataset.inputId)")  # noqa: E731
            assert rows() == list(flagged.input_id) and is_open() == [opened]
            assert page.locator(f"#viewer td.detail[data-input-id='{opened}'] .pair").count() >= 1
            assert page.input_value("select[data-filter=metric]") == "llm.decision_flip"
            assert page.is_checked("input[data-filter=flagged]")
            assert page.locator(f"#viewer tr.row.open[data-input-id='{opened}']").is_visible()  # scrolled to it
            page.screenshot(path=str(tmp_path / "viewer_link.png"))
            # every row of the metric; the open row stays open, and the URL says so
            page.uncheck("input[data-filter=flagged]")
            assert len(rows()) == every.n[0] and is_open() == [opened]
            assert _fragment(page) == {"metric": "llm.decision_flip", "open": opened}
            page.select_option("select[data-filter=label]", "flipped")
            assert _fragment(page) == {"metric": "llm.decision_flip", "label": "flipped", "open": opened}
            page.click(f"#viewer tr.row[data-input-id='{opened}']")  # closed
            assert is_open() == [] and _fragment(page) == {"metric": "llm.decision_flip", "label": "flipped"}
            page.click(f"#viewer tr.row[data-input-id='{flagged.input_id[0]}']")
            assert _fragment(page)["open"] == flagged.input_id[0]
            # a new fragment in the address bar: the view follows it
            page.evaluate(
                "h => { location.hash = h; }",
                viewer_fragment(metric="llm.group_interaction_bias", persona=persona.persona[0]),
            )
            page.wait_for_function(f"document.getElementById('viewer-count').dataset.matching === '{persona.n[0]}'")
            assert page.input_value("select[data-filter=persona]") == persona.persona[0]
            assert page.input_value("select[data-filter=label]") == "" and is_open() == []
        finally:
            browser.close()
    assert errors == []
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(tmp_path / "viewer_link.png", ARTIFACTS / "viewer_link.png")


def test_a_group_link_matches_the_group_whole_and_the_url_keeps_every_filter(warehouse, report, tmp_path):
    """``group=gender=woman`` shows the group bias rows with a woman among their personas, not those
    of a transgender woman alone (a search for "woman" finds those too); the failed and excluded
    checkboxes and the sort go into the URL and come back from it."""
    from aip_assets.report.links import viewer_link

    from .test_ui import CHROMIUM, CHROMIUM_ARGS

    if not CHROMIUM.exists():
        pytest.skip(f"no Chromium at {CHROMIUM}")
    sync_api = pytest.importorskip("playwright.sync_api")

    def rows_with(where: str) -> set[str]:
        return set(
            q(
                warehouse,
                f"""SELECT DISTINCT x.input_id FROM (
                       SELECT run_id, metric, input_id, persona_id AS pid FROM probes WHERE role = 'persona'
                       UNION SELECT run_id, metric, input_id, unnest([value_a, value_b]) FROM probe_pairs) x
                    JOIN personas pe ON pe.run_id = x.run_id AND pe.metric = x.metric AND pe.persona_id = x.pid
                    WHERE x.run_id = ? AND x.metric = 'llm.group_interaction_bias' AND {where}""",
                [RUN],
            ).input_id
        )

    woman = rows_with("json_extract_string(pe.attributes, '$.gender') = 'woman'")
    sounds_like = rows_with("json_extract_string(pe.attributes, '$.gender') LIKE '%woman%'")
    assert woman and sounds_like > woman  # a transgender woman in rows without a woman
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 1400})
            errors = _console_errors(page)
            page.goto(viewer_link(f"file://{report[0]}", metric="llm.group_interaction_bias", group="gender=woman"))
            page.wait_for_selector("#viewer[data-ready='1']")
            shown = page.eval_on_selector_all("#viewer tr.row", "rs => rs.map(r => r.dataset.inputId)")
            assert set(shown) == woman and len(shown) == len(woman)
            assert page.input_value("select[data-filter=group]") == "gender=woman"
            page.select_option("select[data-filter=sort]", "id")
            page.check("input[data-filter=excluded]")
            assert _fragment(page) == {
                "metric": "llm.group_interaction_bias",
                "excluded": "1",
                "group": "gender=woman",
                "sort": "id",
            }
            page.uncheck("input[data-filter=excluded]")
            page.check("input[data-filter=failed]")
            assert _fragment(page)["failed"] == "1" and "excluded" not in _fragment(page)
            # and back from a link: the checkboxes and the sort as the URL says
            page.goto(viewer_link(f"file://{report[0]}", metric="llm.decision_flip", excluded=True, sort="score-desc"))
            page.reload()
            page.wait_for_selector("#viewer[data-ready='1']")
            assert page.is_checked("input[data-filter=excluded]") and not page.is_checked("input[data-filter=failed]")
            assert page.input_value("select[data-filter=sort]") == "score-desc"
            assert page.input_value("select[data-filter=group]") == ""
        finally:
            browser.close()
    assert errors == []


def test_viewer_labels_once_each_and_personas_with_what_they_are(warehouse, report):
    """The label filter offers each label once whatever its case (in the chosen metric's spelling)
    and finds it in every spelling; the persona filter says what each persona id is."""
    from .test_ui import CHROMIUM, CHROMIUM_ARGS

    if not CHROMIUM.exists():
        pytest.skip(f"no Chromium at {CHROMIUM}")
    sync_api = pytest.importorskip("playwright.sync_api")
    labels = q(
        warehouse,
        """SELECT lower(label) AS key, count(*) AS n, count(DISTINCT label) AS spellings FROM row_scores
           WHERE run_id = ? AND label IS NOT NULL GROUP BY ALL ORDER BY key""",
        [RUN],
    )
    two = labels[labels.spellings > 1]
    assert len(two), "the run has a label in two spellings"  # else this test tests nothing
    key = two.key.iloc[0]
    spelt = q(
        warehouse,
        "SELECT DISTINCT metric, label FROM row_scores WHERE run_id = ? AND lower(label) = ? ORDER BY metric",
        [RUN, key],
    )
    personas = q(
        warehouse,
        """SELECT persona_id, description, CAST(attributes AS VARCHAR) AS attributes FROM personas
           WHERE run_id = ? AND metric = 'llm.group_interaction_bias' ORDER BY persona_id""",
        [RUN],
    )
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            errors = _console_errors(page)
            page.goto(f"file://{report[0]}")
            page.wait_for_selector("#viewer[data-ready='1']")
            options = lambda sel: page.eval_on_selector_all(  # noqa: E731
                f"select[data-filter={sel}] option", "os => os.map(o => [o.value, o.textContent])"
            )
            assert [v for v, _ in options("label")] == ["", *labels.key]
            page.select_option("select[data-filter=label]", key)
            assert int(page.get_attribute("#viewer-count", "data-matching")) == int(two.n.iloc[0])
            for metric, label in spelt.itertuples(index=False, name=None):
                page.select_option("select[data-filter=metric]", metric)
                assert dict(options("label"))[key] == label
            page.select_option("select[data-filter=metric]", "llm.group_interaction_bias")
            shown = dict(options("persona"))
            assert len(shown) > 2
            for pid, description, attributes in personas.itertuples(index=False, name=None):
                if pid in shown:
                    values = ", ".join(v for _, v in sorted(json.loads(attributes).items()))
                    assert shown[pid] == f"{pid} — {values}: {description}"
        finally:
            browser.close()
    assert errors == []


def test_a_viewer_search_opens_the_row_on_the_pair_it_matched(warehouse, report):
    """A search for a persona's description, on a row whose worst pair does not have that persona:
    the opened row shows first the pairs that have it."""
    from aip_assets.report.links import viewer_link

    from .test_ui import CHROMIUM, CHROMIUM_ARGS

    if not CHROMIUM.exists():
        pytest.skip(f"no Chromium at {CHROMIUM}")
    sync_api = pytest.importorskip("playwright.sync_api")
    data = viewer_data(report[1])
    descriptions = dict(
        q(
            warehouse,
            "SELECT persona_id, description FROM personas WHERE run_id = ? AND metric = 'llm.group_interaction_bias'",
            [RUN],
        ).itertuples(index=False, name=None)
    )
    found = None
    for r in (r for r in data["rows"] if r["m"] == "llm.group_interaction_bias"):
        in_pair = [{r["probes"][it[s]["p"]]["who"] for s in ("a", "b")} for it in r["items"] if not it.get("null")]
        later = [p for p in set().union(*in_pair[1:]) - in_pair[0] if p in descriptions] if len(in_pair) > 1 else []
        # a description no other persona's contains
        later = [p for p in sorted(later) if sum(descriptions[p] in d for d in descriptions.values()) == 1]
        if later:
            found = r["id"], later[0]
            break
    assert found, "a row whose first pair lacks a persona of a later pair"
    row, persona = found
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            errors = _console_errors(page)
            url = viewer_link(
                f"file://{report[0]}", metric="llm.group_interaction_bias", q=descriptions[persona], open=row
            )
            page.goto(url)
            page.wait_for_selector("#viewer[data-ready='1']")
            boxes = page.locator(f"#viewer td.detail[data-input-id='{row}'] .pair")
            assert boxes.first.get_attribute("data-match") == "1"
            assert descriptions[persona] in boxes.first.inner_text()
            matched = [boxes.nth(i).get_attribute("data-match") for i in range(boxes.count())]
            assert matched == sorted(matched, key=lambda m: m is None)  # the matches first, then the rest
        finally:
            browser.close()
    assert errors == []


def test_viewer_marks_the_words_that_differ_and_shows_the_judges_call(warehouse, report, tmp_path):
    """An opened decision-flip row: each prompt shown whole, the words one has and the other lacks
    in <mark> (what is left unmarked is the same in both); behind a toggle, the judge's prompt and
    raw answer as llm_calls recorded them for that verdict's call."""
    from aip_assets.report.links import viewer_link

    from .test_ui import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS

    if not CHROMIUM.exists():
        pytest.skip(f"no Chromium at {CHROMIUM}")
    sync_api = pytest.importorskip("playwright.sync_api")
    first = q(
        warehouse,
        "SELECT input_id FROM row_scores WHERE run_id = ? AND metric = 'llm.decision_flip' AND n_events > 0 "
        "ORDER BY score, input_id LIMIT 1",
        [RUN],
    ).input_id[0]
    top = q(
        warehouse,
        """SELECT v.*, j.call_key FROM v_pair_verdicts v JOIN judgements j
               ON j.run_id = v.run_id AND j.metric = v.metric AND j.pair_id = v.pair_id
           WHERE v.run_id = ? AND v.input_id = ? AND v.flipped ORDER BY v.value_a || ' vs ' || v.value_b LIMIT 1""",
        [RUN, first],
    )
    call = q(
        warehouse,
        "SELECT CAST(request AS VARCHAR) AS request, response_text FROM llm_calls WHERE run_id = ? AND call_key = ? "
        "ORDER BY status = 'ok' DESC, created_at DESC LIMIT 1",
        [RUN, top.call_key[0]],
    )
    prompts = q(
        warehouse,
        """SELECT a.query_text AS a, b.query_text AS b FROM probe_pairs pp
           JOIN probes a ON a.run_id = pp.run_id AND a.metric = pp.metric AND a.probe_id = pp.probe_a
           JOIN probes b ON b.run_id = pp.run_id AND b.metric = pp.metric AND b.probe_id = pp.probe_b
           WHERE pp.run_id = ? AND pp.metric = 'llm.decision_flip' AND pp.pair_id = ?""",
        [RUN, top.pair_id[0]],
    )
    messages = json.loads(call.request[0])["messages"]
    expected_prompt = "\n\n".join(f"{m['role']}:\n{m['content']}" for m in messages)
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 1600})
            errors = _console_errors(page)
            page.goto(viewer_link(f"file://{report[0]}", metric="llm.decision_flip", flagged=True, open=first))
            page.wait_for_selector("#viewer[data-ready='1']")
            box = page.locator(f"#viewer td.detail[data-input-id='{first}'] .pair").first
            shown = box.locator("[data-probe-id]")
            parts = [
                shown.nth(i).evaluate("e => Array.from(e.childNodes).map(n => [n.nodeName === 'MARK', n.textContent])")
                for i in (0, 1)
            ]
            for side, (text, nodes) in enumerate(zip((prompts.a[0], prompts.b[0]), parts, strict=True)):
                assert "".join(t for _, t in nodes) == _clipped(text), side  # the prompt whole
                assert all(t.strip() == t and t for m, t in nodes if m)  # words, not spaces
            assert any(m for nodes in parts for m, _ in nodes)  # a word one prompt has and the other lacks
            unmarked = [" ".join(t for m, t in nodes if not m).split() for nodes in parts]
            assert unmarked[0] == unmarked[1]  # what both prompts have in common
            assert MARK in box.inner_text()  # the dataset's markup, shown as text
            # the judge's call, from its toggle
            verdict = box.locator(".verdict-box[data-verdict=decision]")
            assert not verdict.locator("[data-judge-prompt]").is_visible()
            verdict.locator("details.judge-call summary").click()
            assert verdict.locator("[data-judge-prompt]").evaluate("e => e.textContent") == _clipped(expected_prompt)
            assert verdict.locator("[data-judge-raw]").evaluate("e => e.textContent") == _clipped(call.response_text[0])
            page.screenshot(path=str(tmp_path / "viewer_judge_call.png"))
        finally:
            browser.close()
    assert errors == []
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(tmp_path / "viewer_judge_call.png", ARTIFACTS / "viewer_judge_call.png")


def test_the_report_servers_root_lists_the_runs_with_their_scores_and_gates(warehouse, report, tmp_path):
    """The root of the report server: the warehouse's runs, the newest first, each with its report's
    link (or how to write it), each metric's overall score and gate, and the files below; without a
    warehouse, the files alone."""
    import threading
    import urllib.request

    import duckdb

    from aip_assets.report import serve_reports

    db = tmp_path / "wh" / "warehouse.duckdb"
    db.parent.mkdir()
    with duckdb.connect(str(db)) as con:  # a copy with a newer run that has no scores and no report
        con.execute(f"ATTACH '{warehouse}' AS src (READ_ONLY)")
        for table in ("eval_runs", "metric_scores"):
            con.execute(f"CREATE TABLE {table} AS SELECT * FROM src.{table}")
        con.execute(
            "INSERT INTO eval_runs (run_id, spec_name, created_at) "
            "SELECT 'rep-newer', 'rep', max(created_at) + INTERVAL 1 HOUR FROM eval_runs"
        )
    folder = tmp_path / "reports"
    folder.mkdir()
    shutil.copy(report[0], folder / report[0].name)
    scores = q(
        warehouse,
        "SELECT metric, score, passed FROM metric_scores WHERE run_id = ? AND scope = 'overall' ORDER BY metric",
        [RUN],
    )
    pages = []
    for where in (db, tmp_path / "none" / "warehouse.duckdb"):
        server = serve_reports(folder, port=0, warehouse=where)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{server.server_address[1]}/", timeout=30) as r:
                pages.append(Doc(r.read().decode("utf-8")))
        finally:
            server.shutdown()
            server.server_close()
    listed, files_only = pages
    runs = listed.find("tr")
    assert [r["attrs"]["data-run-id"] for r in runs if "data-run-id" in r["attrs"]] == ["rep-newer", RUN]
    ours = next(r for r in runs if r["attrs"].get("data-run-id") == RUN)
    expected_gate = "passed" if scores.passed.all() else "failed"
    assert ours["attrs"]["data-gate"] == expected_gate
    for metric, score, passed in scores.itertuples(index=False, name=None):
        item = next(li for li in listed.find("li") if li["attrs"].get("data-metric") == metric)
        assert item["text"].startswith(f"{metric}: {score:.3f}")
        assert item["text"].endswith(" passed" if passed else " failed")
    links = [a["attrs"]["href"] for a in listed.find("a")]
    assert links.count(f"{RUN}.html") == 2  # the run's link and the file's
    newer = next(r for r in runs if r["attrs"].get("data-run-id") == "rep-newer")
    assert newer["attrs"]["data-gate"] == "no gate" and "aip-eval report rep-newer" in newer["text"]
    assert files_only.find("tr") == [] and [a["attrs"]["href"] for a in files_only.find("a")] == [f"{RUN}.html"]


def test_viewer_keeps_its_rows_before_the_judges_calls(warehouse):
    """The judge's prompts and raw answers are what a tight byte budget drops first: a budget that
    holds a metric's rows without their calls keeps every row, and its verdicts say their call is
    not in the file (with its key); the calls kept are the lowest rows', within the share."""
    from aip_assets.report.queries import _Reader
    from aip_assets.report.values import _records
    from aip_assets.report.viewer import _take_calls, read

    rd = _Reader(RUN, warehouse)
    query = lambda sql, params=None: _records(rd.q(sql, params))  # noqa: E731
    metric = ["llm.decision_flip"]
    full = read(query, metric, 500, RUN)
    verdicts = lambda row: [v for it in row["items"] for v in it["v"]] + row["single"]  # noqa: E731
    assert all("jp" in v and v["ck"] for r in full["rows"] for v in verdicts(r))
    bare = json.loads(json.dumps(full["rows"]))
    for r in bare:
        _take_calls(r)
    rows_only = sum(len(json.dumps(r, ensure_ascii=False)) for r in bare)
    with_calls = sum(len(json.dumps(r, ensure_ascii=False)) for r in full["rows"])
    assert with_calls > 2 * rows_only  # the calls are most of a decision-flip row
    budget = (rows_only + with_calls) // 2
    small = read(query, metric, 500, RUN, max_bytes=budget)
    assert [r["id"] for r in small["rows"]] == [r["id"] for r in full["rows"]]  # every row kept
    given = [any("jp" in v for v in verdicts(r)) for r in small["rows"]]
    assert any(given) and not all(given) and given == sorted(given, reverse=True)  # the lowest rows' calls
    for r in small["rows"]:
        assert all(v.get("calls") is False and "jp" not in v and v["ck"] for v in verdicts(r)) or all(
            "calls" not in v for v in verdicts(r)
        )
    assert sum(len(json.dumps(r, ensure_ascii=False)) for r in small["rows"]) <= budget


def test_who_is_favoured_shows_the_impact_ratio_gate_only_when_set():
    """A favourable row with min_impact_ratio set shows the gate (PASS or FAIL, its threshold), the
    impact ratio's interval labelled 95% unadjusted, and the claim's interval at the claim's level."""
    from aip_assets.report import flip_tables

    overall = {"metric": "m", "scope": "overall", "group_key": "all"}
    overall["details"] = json.dumps({"claims_policy": {"adjust": "holm"}, "gate_on": "point"})
    claim = {"kind": "favoured", "axis": "gender", "value": "woman", "status": "claimed", "direction": "less"}
    claim.update(p_value=0.0002, p_adjusted=0.0136, ci_confidence=0.99926, rest_rate=0.53, odds_ratio=0.25)
    fav = {
        "axis": "gender",
        "value": "woman",
        "impact_ratio": 0.37,
        "impact_ratio_ci95": [0.12, 0.62],
        "highest": "man",
    }
    rows = [
        overall,
        {"metric": "m", "scope": "claim", "group_key": "favoured:gender=woman", "raw_score": -0.336, "ci_low": -0.526}
        | {"ci_high": -0.143, "details": json.dumps(claim)},
        {"metric": "m", "scope": "favourable", "group_key": "gender=woman", "rate": 0.233, "n": 30, "n_events": 7}
        | {"threshold": 0.8, "passed": False, "details": json.dumps(fav)},
    ]
    doc = Doc(flip_tables.favoured_table("m", rows))
    (tr,) = doc.find("tr", data_scope="favourable")
    assert "[-0.526, -0.143] (99.93%)" in tr["text"] and "0.37 [0.12, 0.62] (95%, unadjusted)" in tr["text"]
    assert "beyond chance (decided against)" in tr["text"] and "FAIL ≥ 0.80" in tr["text"]
    assert "impact ratios against man" in doc.find("tr", data_axis="gender")[0]["text"]
    rows[2] = {**rows[2], "threshold": None, "passed": None}
    doc = Doc(flip_tables.favoured_table("m", rows))
    assert not doc.find(data_field="passed") and "gate" not in [th["text"] for th in doc.find("th")]
