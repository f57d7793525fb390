"""Failures met below the CLI that are not bugs of aip-eval: Dagster's Postgres storage going away,
a damaged warehouse file, a full disk (`aip-eval run` and `main` tell them apart the same way)."""

from __future__ import annotations

from ..errors import AipError, OperationalError


def outage_of(e: BaseException) -> OperationalError | None:
    """An error of Dagster's Postgres storage that is the database going away, as an
    OperationalError (``dagster_home.storage_outage``); None for anything else."""
    from ..dagster_home import storage_outage

    try:
        return storage_outage(e)
    except Exception:  # noqa: BLE001 - telling it apart must not hide the error itself
        return None


def known_failure(e: BaseException) -> AipError | None:
    """An error met below the CLI that is not a bug: the warehouse file damaged (exit 2), a disk
    full (exit 5, an OperationalError)."""
    from ..errors import disk_full
    from ..warehouse.opening import damaged

    return damaged(e) or disk_full(e, None)
