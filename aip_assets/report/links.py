"""Links into a report's viewer: a view (its filters and the open row) written in the URL's fragment.

The viewer reads its state from the fragment when the page opens and writes it back as the user
filters, searches or opens a row, so a link reproduces the view, served (`aip-eval report --serve`)
or as a file. The fragment is ``#v:`` followed by URL-encoded ``key=value`` pairs:

- ``metric``: the metric's name (``llm.decision_flip``);
- ``flagged``: ``1`` for the rows the metric flags (flipped pairs, biased pairs, contradictions);
- ``failed``, ``excluded``: ``1`` for the rows with a failed call or judge, with excluded units;
- ``axis``, ``persona``, ``label``, ``category``: a facet's value (with ``flagged``, an axis keeps
  the rows flipped on that axis);
- ``group``: an attribute and its value, ``religion=Muslim``: the rows whose pairs or personas hold
  it, matched whole (``gender=man`` is not ``gender=woman``);
- ``q``: the search text; ``sort``: ``score-asc`` (the default), ``score-desc``, ``id`` or
  ``failed``; ``open``: the ``input_id`` of the row that is open.

The comparison page of two runs (``report/comparison.py``) writes its view the same way, with its
own keys (``COMPARE_KEYS``): ``metric``, ``changed`` (``1`` for the rows whose label or score
changed), ``q`` and ``open``.
"""

from __future__ import annotations

from urllib.parse import urlencode

FRAGMENT_PREFIX = "#v:"
KEYS = ("metric", "flagged", "failed", "excluded", "axis", "persona", "group", "label", "category", "q", "sort", "open")
COMPARE_KEYS = ("metric", "changed", "q", "open")


def _fragment(keys: tuple[str, ...], page: str, view: dict[str, str | int | bool | None]) -> str:
    unknown = set(view) - set(keys)
    if unknown:
        raise ValueError(f"not a {page} key: {', '.join(sorted(unknown))} (the {page} reads {', '.join(keys)})")
    pairs = [(k, "1" if v is True else str(v)) for k in keys if (v := view.get(k)) not in (None, False)]
    return FRAGMENT_PREFIX + urlencode(pairs)


def viewer_fragment(**view: str | int | bool | None) -> str:
    """The fragment of a view: ``viewer_fragment(metric="llm.decision_flip", flagged=True)``.

    Args:
        **view: The view's keys (``KEYS``); None leaves a key out, True is ``1``.

    Returns:
        ``#v:metric=llm.decision_flip&flagged=1``, or ``#v:`` for the whole viewer.

    Raises:
        ValueError: A key the viewer does not read.
    """
    return _fragment(KEYS, "viewer", view)


def viewer_link(report_url: str, **view: str | int | bool | None) -> str:
    """A link to the report at ``report_url`` (``report_url()``'s) open on a view of its viewer."""
    return report_url.split("#", 1)[0] + viewer_fragment(**view)


def comparison_fragment(**view: str | int | bool | None) -> str:
    """The fragment of a view of the comparison page: ``comparison_fragment(metric=m, changed=True)``.

    Args:
        **view: The page's keys (``COMPARE_KEYS``); None leaves a key out, True is ``1``.

    Returns:
        ``#v:metric=llm.decision_flip&changed=1``, or ``#v:`` for every row.

    Raises:
        ValueError: A key the comparison page does not read.
    """
    return _fragment(COMPARE_KEYS, "comparison page", view)


def comparison_link(page_url: str, **view: str | int | bool | None) -> str:
    """A link to the comparison page at ``page_url`` open on a view of its rows."""
    return page_url.split("#", 1)[0] + comparison_fragment(**view)
