"""The Jinja2 environment of the report's templates, and its static files (CSS, the viewer's script).

Autoescaping is on: every value a template prints is escaped unless it is ``Markup`` (HTML this
package built and escaped itself: charts, sections, the viewer's data block). Values are escaped
as :func:`html.escape` does (``&#x27;``, ``&quot;``), the same escaping as the fragments built in
Python, so the page reads one way throughout.
"""

from __future__ import annotations

from functools import cache
from html import escape
from importlib.resources import files
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup

from .values import _clip, _num, _slug


def _finalize(value: Any) -> Markup:
    """A printed value as safe HTML: Markup as it is, None as nothing, anything else escaped."""
    if isinstance(value, Markup):
        return value
    return Markup(escape("" if value is None else str(value), quote=True))


@cache
def environment() -> Environment:
    """The environment over ``report/templates`` (built once)."""
    env = Environment(
        loader=PackageLoader("aip_assets.report", "templates"),
        autoescape=True,
        finalize=_finalize,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(slug=_slug, clip=_clip)
    env.globals.update(num=lambda *a, **kw: Markup(_num(*a, **kw)))
    return env


@cache
def static(name: str) -> str:
    """A file of ``report/static`` as text (read once): inlined in the page, so a report opened from
    disk needs nothing beside it."""
    return files("aip_assets.report").joinpath("static", name).read_text(encoding="utf-8")


def render(template: str, **context: Any) -> str:
    """``template`` rendered with ``context``."""
    return environment().get_template(template).render(**context)
