"""A self-contained HTML report for one run: scores with intervals, breakdown charts, a viewer of
every sample (filters, search, sort, the answers side by side with the judges' reasoning), the
weakest rows with their probes and the SUT's answers, and token use per role.

Everything is read from the warehouse through short read-only connections (``queries``); the page
has no external resources (inline CSS, charts as inline SVG, the viewer's data and script inline),
so it works offline, and everything but the viewer works without scripts. Every number shown is
the warehouse value, formatted (3 decimals for scores and rates, integers for counts), and the raw
value sits in the element's ``data-value`` attribute so a test can compare it exactly.

The package: ``queries`` (the SQL), ``labels`` (how each scope is charted and named), ``values``
(formatting), ``charts`` (the SVG), ``sections`` (the HTML of each section), ``claims`` (the tables
of claims; decision flip's built on them in ``flip_tables``, group interaction bias's in
``group_tables``), ``viewer`` (the sample viewer's data), ``templates/`` (the page and the viewer,
Jinja2 with autoescaping), ``static/`` (the CSS and the scripts, inlined in the page), ``build`` (the
report written and stored), ``comparison`` (two runs side by side: `aip-eval compare A B --html`)
and ``server`` (`aip-eval report --serve`).

    aip-eval report RUN [--out FILE] [--warehouse PATH]
"""

from .build import build_report, default_out, report_line, stored_report, write_report
from .queries import WEAKEST_ROWS
from .server import report_port, report_url, serve_reports
from .values import TEXT_LIMIT
from .viewer import ROWS_PER_METRIC

__all__ = [
    "ROWS_PER_METRIC",
    "TEXT_LIMIT",
    "WEAKEST_ROWS",
    "build_report",
    "default_out",
    "report_line",
    "report_port",
    "report_url",
    "serve_reports",
    "stored_report",
    "write_report",
]
