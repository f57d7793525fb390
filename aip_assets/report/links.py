"""Links into a report's viewer: a view (its filters and the open row) written in the URL's fragment.

The viewer reads its state from the fragment when the page opens and writes it back as the user
filters, searches or opens a row, so a link reproduces the view, served (`aip-eval report --serve`)
or as a file. The fragment is ``#v:`` followed by URL-encoded ``key=value`` pairs:

- ``metric``: the metric's name (``llm.decision_flip``);
- ``flagged``: ``1`` for the rows the metric flags (flipped pairs, biased pairs, contradictions);
- ``failed``, ``excluded``: ``1`` for the rows with a failed call or judge, with excluded units;
- ``axis``, ``persona``, ``label``, ``category``: a facet's value;
- ``group``: an attribute and its value, ``religion=Muslim``: the rows whose pairs or personas hold
  it, matched whole (``gender=man`` is not ``gender=woman``);
- ``q``: the search text; ``sort``: ``score-asc`` (the default), ``score-desc``, ``id`` or
  ``failed``; ``open``: the ``input_id`` of the row that is open.
"""

from __future__ import annotations

from urllib.parse import urlencode

FRAGMENT_PREFIX = "#v:"
KEYS = ("metric", "flagged", "failed", "excluded", "axis", "persona", "group", "label", "category", "q", "sort", "open")


def viewer_fragment(**view: str | int | bool | None) -> str:
    """The fragment of a view: ``viewer_fragment(metric="llm.decision_flip", flagged=True)``.

    Args:
        **view: The view's keys (``KEYS``); None leaves a key out, True is ``1``.

    Returns:
        ``#v:metric=llm.decision_flip&flagged=1``, or ``#v:`` for the whole viewer.

    Raises:
        ValueError: A key the viewer does not read.
    """
    unknown = set(view) - set(KEYS)
    if unknown:
        raise ValueError(f"not a viewer key: {', '.join(sorted(unknown))} (the viewer reads {', '.join(KEYS)})")
    pairs = [(k, "1" if v is True else str(v)) for k in KEYS if (v := view.get(k)) not in (None, False)]
    return FRAGMENT_PREFIX + urlencode(pairs)


def viewer_link(report_url: str, **view: str | int | bool | None) -> str:
    """A link to the report at ``report_url`` (``report_url()``'s) open on a view of its viewer."""
    return report_url.split("#", 1)[0] + viewer_fragment(**view)
