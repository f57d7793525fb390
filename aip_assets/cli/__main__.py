"""`python -m aip_assets.cli ...`: the same as `aip-eval ...`."""

from . import entry

entry()
