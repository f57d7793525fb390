"""The report's findings are readable: a FAIL finding's text and its grey example line meet WCAG AA
(4.5:1) against the background they are drawn on, and only the badge is red (issue 38, fault 6).

A small cascade over the report's own CSS: each rule's selectors are compounds (``tag.class``)
joined by descendant combinators, which is all ``report.css`` and ``viewer.css`` use; the colour
is inherited from the nearest element a rule gives one, the background is the nearest opaque one."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest

from aip_assets.report.sections import _findings
from aip_assets.report.templating import static

AA = 4.5


def _channel(v: int) -> float:
    c = v / 255
    return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4


def luminance(colour: str) -> float:
    h = colour.strip().lstrip("#")
    if len(h) == 3:
        h = "".join(c * 2 for c in h)
    r, g, b = (int(h[i : i + 2], 16) for i in (0, 2, 4))
    return 0.2126 * _channel(r) + 0.7152 * _channel(g) + 0.0722 * _channel(b)


def contrast(a: str, b: str) -> float:
    """WCAG 2's contrast ratio of two sRGB colours written as hex."""
    hi, lo = sorted((luminance(a), luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def test_contrast_function_matches_published_values():
    assert contrast("#000", "#fff") == pytest.approx(21.0)
    assert contrast("#777", "#fff") == pytest.approx(4.48, abs=0.01)
    assert contrast("#222", "#c62828") == pytest.approx(2.83, abs=0.01)  # the fault's own figure


Element = tuple[str, frozenset[str], str | None]  # tag, classes, id


def _rules(css: str) -> list[tuple[list[str], dict[str, str], int]]:
    css = re.sub(r"/\*.*?\*/", "", css, flags=re.S)
    out = []
    for order, (selectors, body) in enumerate(re.findall(r"([^{}]+)\{([^{}]*)\}", css)):
        decls = {}
        for d in body.split(";"):
            if ":" in d:
                k, v = d.split(":", 1)
                decls[k.strip()] = v.strip()
        out.append(([s.strip() for s in selectors.split(",") if s.strip()], decls, order))
    return out


def _compound_matches(compound: str, el: Element) -> bool:
    tag, classes, id_ = el
    m = re.fullmatch(r"([a-z0-9*]*)((?:[.#][\w-]+)*)(:[\w-]+)?", compound)
    if m is None or m.group(3):  # a pseudo-class (:hover) never holds for a static page
        return False
    if m.group(1) not in ("", "*", tag):
        return False
    for kind, name in re.findall(r"([.#])([\w-]+)", m.group(2)):
        if (kind == "." and name not in classes) or (kind == "#" and name != id_):
            return False
    return True


def _matches(selector: str, chain: list[Element]) -> bool:
    parts = selector.split()
    if not _compound_matches(parts[-1], chain[-1]):
        return False
    ancestors = chain[:-1]
    for part in reversed(parts[:-1]):
        while ancestors and not _compound_matches(part, ancestors[-1]):
            ancestors = ancestors[:-1]
        if not ancestors:
            return False
        ancestors = ancestors[:-1]
    return True


def _specificity(selector: str) -> tuple[int, int, int]:
    return (selector.count("#"), selector.count("."), len(re.findall(r"(?:^|\s)[a-z]", selector)))


def _own(prop: str, el_chain: list[Element], rules) -> str | None:
    best: tuple[tuple[int, int, int], int] | None = None
    value = None
    for selectors, decls, order in rules:
        if prop not in decls:
            continue
        for s in selectors:
            if _matches(s, el_chain):
                key = (_specificity(s), order)
                if best is None or key >= best:
                    best, value = key, decls[prop]
    return value


def _hex(value: str) -> str:
    m = re.search(r"#[0-9a-fA-F]{3,6}\b", value)
    assert m, value
    return m.group(0)


def colours(chain: list[Element], css: str) -> tuple[str, str]:
    """(text colour, background colour) of the last element of ``chain``."""
    rules = _rules(css)
    fg = bg = None
    for i in range(len(chain), 0, -1):
        sub = chain[:i]
        if fg is None and (v := _own("color", sub, rules)):
            fg = _hex(v)
        if bg is None and (v := _own("background", sub, rules) or _own("background-color", sub, rules)):
            bg = _hex(v)
    return fg or "#000", bg or "#fff"


class _Texts(HTMLParser):
    """Each run of text with the chain of elements it sits in."""

    VOID = {"br", "img", "meta", "input", "hr", "link"}

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[Element] = []
        self.texts: list[tuple[str, list[Element]]] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag not in self.VOID:
            self.stack.append((tag, frozenset((a.get("class") or "").split()), a.get("id")))

    def handle_endtag(self, tag):
        while self.stack:
            if self.stack.pop()[0] == tag:
                break

    def handle_data(self, data):
        if data.strip():
            self.texts.append((data.strip(), list(self.stack)))


FINDING = {
    "severity": "fail",
    "metric": "llm.decision_flip",
    "sentence": "Decisions flip on the gender axis: 12.5% of pairs [4.0%, 20.1%].",
    "examples": [{"input_id": "row-7", "quote": "approve → deny"}],
}


def _page() -> tuple[str, list[tuple[str, list[Element]]]]:
    css = static("report.css") + "\n" + static("viewer.css")
    html = f"<html><body><main>{_findings([FINDING, {**FINDING, 'severity': 'note'}])}</main></body></html>"
    p = _Texts()
    p.feed(html)
    return css, p.texts


def test_fail_finding_text_meets_wcag_aa():
    css, texts = _page()
    seen = {"sentence": False, "example": False, "badge": False}
    for text, chain in texts:
        if not any(tag == "li" and "finding" in cls for tag, cls, _ in chain):
            continue
        fg, bg = colours(chain, css)
        ratio = contrast(fg, bg)
        assert ratio >= AA, f"{text!r}: {fg} on {bg} is {ratio:.2f}:1, below WCAG AA's {AA}:1"
        if text.startswith("Decisions flip"):
            seen["sentence"] = True
            assert bg.lower() not in ("#c62828",), "the finding's item is drawn on the badge's red"
        if text.startswith("e.g."):
            seen["example"] = True
            assert bg.lower() != "#c62828"
        if text == "FAIL":
            seen["badge"] = True
            assert bg.lower() == "#c62828", "the FAIL badge itself stays red"
    assert all(seen.values()), seen


def test_every_grey_text_of_the_report_meets_wcag_aa_on_white():
    """Each colour the report's CSS gives text (``color``, an SVG text's ``fill``) against the page's
    white: the grey of notes, axis ticks and examples was #777 (4.48:1), a stale mark's #b26a00 (4.24:1)."""
    css = "\n".join(static(name) for name in ("report.css", "viewer.css", "compare.css"))
    for selectors, decls, _ in _rules(css):
        for prop in ("color", "fill"):
            if prop in decls and not any(".badge" in s for s in selectors):
                fg = _hex(decls[prop])
                assert contrast(fg, "#fff") >= AA, (
                    f"{', '.join(selectors)}: {fg} on white is {contrast(fg, '#fff'):.2f}:1"
                )
