"""`python -m aip_assets.cli ...`: the same as `aip-eval ...`."""

import sys

from . import main

sys.exit(main())
