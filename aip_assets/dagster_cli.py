"""Dagster's own command line as `aip-eval ui` and `aip-eval daemon` start it (``python -m
aip_assets.dagster_cli dev|daemon ARGS``): the same commands, without what Dagster says about its
own API to someone who did not write against it: its beta, preview and superseded warnings (`dagster
dev` is "superseded by dg dev"), and the notice that a `dagster.yaml` in the current folder is not
read when ``DAGSTER_HOME`` is set (the project's instance is the one `aip-eval` prepared there).
Everything else Dagster logs (the URL it serves, errors) is as it was."""

from __future__ import annotations

import logging
import sys
import warnings

NOT_READ = "Found a dagster instance configuration value"  # dagster/_cli/dev.py's words


class _NotOurs(logging.Filter):
    """Drops Dagster's notice that the current folder's dagster.yaml is not read."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(NOT_READ)


def quiet() -> None:
    """Dagster's notices about its own API ignored in this process, its dagster.yaml notice dropped."""
    from dagster import BetaWarning, PreviewWarning, SupersessionWarning

    for category in (BetaWarning, PreviewWarning, SupersessionWarning):
        warnings.filterwarnings("ignore", category=category)
    logging.getLogger("dagster").addFilter(_NotOurs())


def main(argv: list[str]) -> None:
    quiet()
    what, rest = argv[0], argv[1:]
    if what == "daemon":
        from dagster._daemon.cli import main as daemon_main

        sys.argv = ["dagster-daemon", *rest]
        daemon_main()
    else:
        from dagster._cli import main as dagster_main

        sys.argv = ["dagster", what, *rest]
        dagster_main()


if __name__ == "__main__":
    main(sys.argv[1:])
