"""What every reader shares: whether an answer says anything at all (:func:`is_whitespace`,
:func:`is_blank`) and the ``<think>`` block each of them reads past (``_THINK``)."""

from __future__ import annotations

import re
import unicodedata

_THINK = re.compile(r"<think>.*?(?:</think>|$)", re.S | re.I)


# Characters that draw nothing. By category: format characters (Cf: zero-width space, joiners, word
# joiner, the byte order mark, the directional marks U+200E/U+200F, the soft hyphen U+00AD, invisible
# operators, tags), spaces and separators (Zs, Zl, Zp: NBSP, U+3000...) and controls (Cc: tab, newline,
# NUL...). And letters or symbols whose glyph is empty: the Hangul fillers U+115F, U+1160, U+3164 and
# U+FFA0, and the blank Braille pattern U+2800.
_INVISIBLE_CATEGORIES = frozenset({"Cf", "Zs", "Zl", "Zp", "Cc"})
_BLANK_GLYPHS = frozenset("\u115f\u1160\u3164\uffa0\u2800")


def _visible(ch: str) -> bool:
    return ch not in _BLANK_GLYPHS and unicodedata.category(ch) not in _INVISIBLE_CATEGORIES


def is_whitespace(text: str | None) -> bool:
    """Nothing visible, in every script: empty, or only characters that draw nothing (whitespace by
    Unicode, format and control characters, the Hangul fillers and the blank Braille pattern)."""
    return not any(_visible(ch) for ch in text or "")


def is_blank(text: str | None) -> bool:
    """An empty answer: nothing visible (``is_whitespace``), or nothing visible outside a
    ``<think>`` block (a reasoning model cut off before its answer)."""
    return is_whitespace(_THINK.sub(" ", text or ""))
