"""Every ``AIP_*`` environment variable the project reads, in one settings object.

:func:`current` gives the :class:`Settings` of this moment: the environment as it is now (read
when needed, never at import, so a changed variable holds from the next use), with the values a
command or a Dagster resource chose in this process (:func:`override`) over it. Nothing here
writes the environment: a choice made in this process (``aip-eval run --warehouse``, the
``warehouse`` resource's ``path``) is an override, and a process started from this one gets it
explicitly (a Dagster run's config), not through the environment.

A value of the wrong type or out of bounds is an :class:`errors.SettingsError` (exit 2) naming
the variable and the value, at the first use of the settings. The lake's folder and S3 endpoint
are checked where the lake is used (``warehouse.lake``), so a bad one stops only what needs it.

The data folder (``AIP_DATA_DIR``, else the project's ``data/``, else the user's) is found here
too: :func:`data_dir`.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr, ValidationError, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from .errors import SettingsError

# Markers the project sets beside a variable it wrote for Dagster and the processes it starts
# (dagster_home.py): "this value is ours, not the user's". Bookkeeping, not settings.
MARKERS = ("AIP_DATA_DIR_SET", "AIP_DAGSTER_HOME_SET", "AIP_DAGSTER_STORAGE_URL_SET")
PROJECT_MARKERS = ("workspace.yaml", "dagster.yaml")


def _env(name: str, must: str, description: str) -> Any:
    """A field read from ``name``; ``must`` says what a value must be (the error for a bad one)."""
    return {"validation_alias": name, "description": description, "json_schema_extra": {"must": must}}


class Settings(BaseSettings):
    """The project's configuration from its ``AIP_*`` environment variables (see the module)."""

    model_config = SettingsConfigDict(case_sensitive=True, extra="ignore", populate_by_name=True, frozen=True)

    # where things are
    warehouse: Path | None = Field(
        None,
        **_env(
            "AIP_WAREHOUSE",
            "a file path",
            "The DuckDB warehouse file; empty: warehouse.duckdb in the data folder (`--warehouse` and the `warehouse` "
            "resource choose another for one command or run).",
        ),
    )
    data_dir: Path | None = Field(
        None,
        **_env(
            "AIP_DATA_DIR",
            "a folder",
            "The data folder (warehouse, journal, reports, Dagster's storage); empty: data/ in the project root "
            "(the nearest folder with workspace.yaml or dagster.yaml), else $XDG_DATA_HOME/aip-assets.",
        ),
    )
    runs_dir: Path | None = Field(
        None,
        **_env(
            "AIP_RUNS_DIR",
            "a folder",
            "The folder of run specs the new-spec sensor watches; empty: runs/ in the data folder.",
        ),
    )
    limits_dir: Path | None = Field(
        None,
        **_env(
            "AIP_LIMITS_DIR",
            "a folder",
            "The endpoints' rate-schedule files; empty: $XDG_RUNTIME_DIR/aip-limits, else <temp dir>/aip-limits-<uid>.",
        ),
    )
    # DuckDB
    duckdb_memory: str = Field(
        "1GB",
        **_env(
            "AIP_DUCKDB_MEMORY",
            "a DuckDB memory size such as 1GB",
            "DuckDB's memory cap for the warehouse (a DuckDB size: 1GB, 4GiB); empty: no cap (80% of RAM). Past it "
            "DuckDB spills to disk.",
        ),
    )
    duckdb_write_memory: str = Field(
        "256MB",
        **_env(
            "AIP_DUCKDB_WRITE_MEMORY",
            "a DuckDB memory size such as 256MB",
            "The lean memory cap a partition write and a batch read try first, before AIP_DUCKDB_MEMORY.",
        ),
    )
    duckdb_linger: float = Field(
        0.25,
        ge=0,
        allow_inf_nan=False,
        **_env(
            "AIP_DUCKDB_LINGER",
            "a number of seconds (0 or more)",
            "How long the warehouse stays open after its last use, so a burst of uses opens it once; 0: closed at once.",
        ),
    )
    warehouse_lock_timeout: float = Field(
        600.0,
        ge=0,
        **_env(
            "AIP_WAREHOUSE_LOCK_TIMEOUT",
            "a number of seconds (0 or more)",
            "How long a use of the warehouse waits for its lock (held by another process) before it stops (exit 5).",
        ),
    )
    judge_during_sampling: bool = Field(
        True,
        **_env(
            "AIP_JUDGE_DURING_SAMPLING",
            "true or false (1 or 0)",
            "Decision flip and group bias judge a pair as soon as the SUT has answered both of its prompts, "
            "while the SUT is still being sampled, and the judging stage takes those judgements as its own (the same "
            "requests, records and budgets). 0: judged in the judging stage only.",
        ),
    )
    # shared mode
    shared_state_url: SecretStr | None = Field(
        None,
        **_env(
            "AIP_SHARED_STATE_URL",
            "a postgresql:// URL",
            "Shared mode: the Postgres database of rate schedules, run budgets, the call journal, partition leases "
            "and the lake's catalog (postgresql://user:password@host:5432/db). Never logged.",
        ),
    )
    shared_retry_seconds: float = Field(
        60.0,
        ge=0,
        allow_inf_nan=False,
        **_env(
            "AIP_SHARED_RETRY_SECONDS",
            "a number of seconds (0 or more)",
            "How long a lost connection to a shared-mode database is tried again before the run stops (exit 5); "
            "empty: 60.",
        ),
    )
    lease_seconds: float = Field(
        30.0,
        ge=1,
        **_env(
            "AIP_LEASE_SECONDS",
            "a number of seconds of at least 1",
            "Shared mode: how long a worker's lease on a partition lasts without renewal (another worker takes over "
            "after it).",
        ),
    )
    dequeue_interval_seconds: int | None = Field(
        None,
        ge=1,
        **_env(
            "AIP_DEQUEUE_INTERVAL_SECONDS",
            "a whole number of seconds of at least 1",
            "How often the run queue's daemon (`aip-eval daemon`, `aip-eval ui`) looks for queued runs to launch, "
            "in the dagster.yaml the CLI writes (Dagster's dequeue_interval_seconds); empty: Dagster's default, 5 s.",
        ),
    )
    lake_data_path: str | None = Field(
        None,
        **_env(
            "AIP_LAKE_DATA_PATH",
            "a folder or s3://bucket/prefix (S3 or S3-compatible storage)",
            "Shared mode: the warehouse as a DuckLake whose Parquet files live in this folder (every worker mounts "
            "it) or s3://bucket/prefix; its catalog is in AIP_SHARED_STATE_URL. Empty: a local DuckDB file.",
        ),
    )
    s3_endpoint: str | None = Field(
        None,
        **_env(
            "AIP_S3_ENDPOINT",
            "http://host:port or https://host",
            "A lake on S3-compatible storage other than AWS: its server (http://host:port or https://host).",
        ),
    )
    s3_credential_chain: str | None = Field(
        None,
        **_env(
            "AIP_S3_CREDENTIAL_CHAIN",
            "a list of AWS credential providers",
            "A lake on S3 without keys: the AWS credential chain's providers, e.g. sts;instance for a pod's role.",
        ),
    )
    dagster_storage_url: SecretStr | None = Field(
        None,
        **_env(
            "AIP_DAGSTER_STORAGE_URL",
            "a postgresql+psycopg2:// URL",
            "Shared mode: Dagster's run, event and schedule storage (SQLAlchemy's URL); empty: AIP_SHARED_STATE_URL "
            "with the psycopg2 driver named. Never logged.",
        ),
    )
    # the CLI, Dagster and the report
    code_location: str | None = Field(
        None,
        **_env(
            "AIP_CODE_LOCATION",
            "a Dagster code location's name",
            "The Dagster code location queued runs name; empty: aip_assets.definitions (the module's name).",
        ),
    )
    report_port: int = Field(
        8112,
        ge=0,
        le=65535,
        **_env("AIP_REPORT_PORT", "a TCP port (0-65535)", "The port `aip-eval report --serve` listens on."),
    )
    debug: bool = Field(
        False,
        **_env(
            "AIP_DEBUG",
            "any value",
            "Any non-empty value: the CLI prints an internal error's traceback as well as saving it.",
        ),
    )

    @field_validator(
        "warehouse",
        "data_dir",
        "runs_dir",
        "limits_dir",
        "shared_state_url",
        "lake_data_path",
        "s3_endpoint",
        "s3_credential_chain",
        "dagster_storage_url",
        "code_location",
        "dequeue_interval_seconds",
        mode="before",
    )
    @classmethod
    def _empty_is_unset(cls, v: Any) -> Any:
        return None if v == "" else v

    @field_validator("judge_during_sampling", "shared_retry_seconds", mode="before")
    @classmethod
    def _blank_is_default(cls, v: Any, info: ValidationInfo) -> Any:
        assert info.field_name is not None
        return cls.model_fields[info.field_name].default if isinstance(v, str) and v.strip() == "" else v

    @field_validator("debug", mode="before")
    @classmethod
    def _any_value(cls, v: Any) -> Any:
        return bool(v) if isinstance(v, str) else v

    def secret(self, name: str) -> str | None:
        """A secret field's value (``shared_state_url``, ``dagster_storage_url``) as text; None when unset."""
        value = getattr(self, name)
        return value.get_secret_value() if value is not None else None


VARIABLES: dict[str, str] = {str(f.validation_alias): name for name, f in Settings.model_fields.items()}
# os.environ's own mapping, looked up without decoding or a KeyError per unset name: the snapshot
# that says whether the settings changed costs a microsecond, not one per variable (POSIX)
_RAW = getattr(os.environ, "_data", None)
_RAW_NAMES = tuple(os.environ.encodekey(n) for n in VARIABLES) if _RAW is not None else ()
_lock = threading.Lock()
_overrides: list[tuple[object, dict[str, Any]]] = []  # (token, values), in the order they were made
_cache: tuple[tuple[Any, ...], Settings] | None = None


def _errors(e: ValidationError, env: dict[str, str]) -> SettingsError:
    """One line per bad variable: its name, what it must be and the value given."""
    lines = []
    for err in e.errors():
        field = str(err["loc"][0]) if err.get("loc") else ""
        name = field if field in VARIABLES else next((k for k, v in VARIABLES.items() if v == field), field)
        extra = Settings.model_fields[VARIABLES[name]].json_schema_extra if name in VARIABLES else None
        must = extra.get("must") if isinstance(extra, dict) else "valid"
        raw = env.get(name, err.get("input"))
        lines.append(f"{name} must be {must}, got {raw!r}")
    return SettingsError("; ".join(lines))


def current() -> Settings:
    """The settings now: the environment's ``AIP_*`` variables, with this process's overrides over
    them. Cached while neither changes; raises SettingsError for a bad value."""
    global _cache
    env = tuple(map(_RAW.get, _RAW_NAMES)) if _RAW is not None else tuple(map(os.environ.get, VARIABLES))
    with _lock:
        over = [values for _, values in _overrides]
    key = (env, tuple(tuple(sorted(v.items())) for v in over))
    cached = _cache
    if cached is not None and cached[0] == key:
        return cached[1]
    merged: dict[str, Any] = {}
    for values in over:
        merged.update(values)
    try:
        out = Settings(**merged)
    except ValidationError as e:
        raise _errors(e, dict(os.environ)) from None
    _cache = (key, out)
    return out


@contextmanager
def override(**values: Any) -> Iterator[Settings]:
    """Within the block, these fields (by name: ``warehouse=path``, ``lake_data_path=None``) take
    the given values in this process, over the environment; restored after. Yields the settings."""
    unknown = set(values) - set(Settings.model_fields)
    if unknown:
        raise TypeError(f"no such setting: {', '.join(sorted(unknown))}")
    token = object()
    with _lock:
        _overrides.append((token, dict(values)))
    try:
        yield current()
    finally:
        with _lock:
            _overrides[:] = [o for o in _overrides if o[0] is not token]


def project_root(start: str | Path | None = None) -> Path | None:
    """The nearest folder from ``start`` (or the working directory) upwards with a project marker."""
    here = Path(start or Path.cwd()).resolve()
    if here.is_file():
        here = here.parent
    for d in (here, *here.parents):
        if any((d / m).is_file() for m in PROJECT_MARKERS):
            return d
    return None


def user_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "aip-assets"


def data_dir(start: str | Path | None = None) -> Path:
    """The data folder, first found: ``$AIP_DATA_DIR``; ``data/`` in the project root, the nearest
    folder from ``start`` (the spec's folder) or else the working directory upwards that holds
    ``workspace.yaml`` or ``dagster.yaml``, else the one around the working directory (a spec kept
    outside the project, run from within it: its run lands where ``aip-eval ui`` and ``aip-eval sql``,
    started from the same place, look); the user-level ``$XDG_DATA_HOME/aip-assets``
    (``~/.local/share/aip-assets``). So the CLI never creates a stray ``data/`` folder in whatever
    directory it is started from. Nothing is created here."""
    chosen = current().data_dir
    if chosen is not None:
        return chosen.resolve()
    root = project_root(start) or (project_root() if start is not None else None)
    return root / "data" if root is not None else user_data_dir()
