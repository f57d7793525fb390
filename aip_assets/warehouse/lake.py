"""The warehouse as a DuckLake, for workers on several machines (shared mode).

``AIP_LAKE_DATA_PATH=/shared/aip-lake`` (a folder every worker mounts; from the environment only),
or ``s3://bucket/prefix`` (S3 or S3-compatible storage: the ``httpfs`` extension, credentials from
the AWS variables or the AWS credential chain, ``AIP_S3_ENDPOINT`` for a server other than AWS), turns the warehouse into a
DuckLake: its catalog in the shared-state Postgres database (``AIP_SHARED_STATE_URL``, schema
``aip_lake``), its rows as Parquet files under that path. The
same tables and views, so ``aip-eval sql``, the report and any DuckDB with the ``ducklake`` and
``postgres`` extensions read it. No file lock: DuckLake commits optimistically, and a write that
meets another worker's (a conflict is per table: two partitions replaced at once in one table
conflict) is rolled back and run again (``warehouse.transaction``).

The extensions come from PyPI (``duckdb-extension-ducklake``, ``duckdb-extension-postgres-scanner``,
for duckdb 1.5.5, which is pinned for them) and are loaded from their files, never downloaded:
DuckDB's automatic install and load stay off. Opening a lake costs about 0.2 s (the extensions'
signatures are checked), so a process keeps its one open and gives each use a cursor.

The folder is stored in the catalog when the lake is made; a worker that gives another one is
refused (DuckLake's error, said plainly) rather than writing elsewhere.

A restart of the catalog's database: DuckDB's postgres extension connects again by itself at the
next statement; a write (``warehouse.transaction``) or an opening that meets the database away is
tried again for as long as ``shared_state.patiently`` waits (``AIP_SHARED_RETRY_SECONDS``), and a
read that meets it is an ``errors.OperationalError`` naming the lake (``catalog_lost``, exit 5).
"""

from __future__ import annotations

import importlib
import logging
import os
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import duckdb

from .. import settings as aip_settings
from ..errors import AipError

logger = logging.getLogger("aip_assets")
LAKE_ENV = "AIP_LAKE_DATA_PATH"
ALIAS = "lake"
METADATA_SCHEMA = "aip_lake"
EXTENSIONS = ("ducklake", "postgres_scanner")  # and httpfs for a lake on S3
S3_SCHEME = "s3://"
S3_ENDPOINT_ENV = "AIP_S3_ENDPOINT"
S3_CHAIN_ENV = "AIP_S3_CREDENTIAL_CHAIN"
NO_AUTO = {"autoinstall_known_extensions": False, "autoload_known_extensions": False}
T = TypeVar("T")


def data_path() -> str | None:
    """The lake's data folder from ``AIP_LAKE_DATA_PATH`` (None: the warehouse is a local file):
    an absolute path ending in ``/``, or an ``s3://bucket/prefix/`` URL."""
    p = aip_settings.current().lake_data_path
    if not p:
        return None
    scheme, sep, rest = p.partition("://")
    if sep:  # a URL: only s3://bucket/..., never taken for a local folder
        if scheme != "s3" or not rest.split("/")[0]:
            raise AipError(
                f"{LAKE_ENV} must be a folder or s3://bucket/prefix (S3 or S3-compatible storage), "
                f"got a {scheme}:// URL" + ("" if scheme != "s3" else " without a bucket")
            )
        return p.rstrip("/") + "/"
    return str(Path(p).resolve()) + "/"


def on_s3() -> bool:
    return (aip_settings.current().lake_data_path or "").startswith(S3_SCHEME)


def _keys_given() -> bool:
    return bool(os.environ.get("AWS_ACCESS_KEY_ID") and os.environ.get("AWS_SECRET_ACCESS_KEY"))


def extensions() -> tuple[str, ...]:
    """The extensions this lake needs: httpfs on S3, and aws for the credential chain (no keys given)."""
    if not on_s3():
        return EXTENSIONS
    return EXTENSIONS + ("httpfs",) + (() if _keys_given() else ("aws",))


def _s3_settings() -> dict[str, str]:
    """The S3 secret's parameters, from the environment: the keys (``AWS_ACCESS_KEY_ID``,
    ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``), else the AWS credential chain (the aws
    extension: a profile, ``AWS_SHARED_CREDENTIALS_FILE``...; ``AIP_S3_CREDENTIAL_CHAIN`` names its
    providers, e.g. ``sts;instance`` for a pod's role); ``AWS_REGION``; ``AIP_S3_ENDPOINT`` for
    S3-compatible storage other than AWS (``http://host:port`` or ``https://host``, path-style URLs)."""
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    if _keys_given():
        out = {
            "KEY_ID": os.environ["AWS_ACCESS_KEY_ID"],
            "SECRET": os.environ["AWS_SECRET_ACCESS_KEY"],
            "REGION": region,
        }
        if os.environ.get("AWS_SESSION_TOKEN"):
            out["SESSION_TOKEN"] = os.environ["AWS_SESSION_TOKEN"]
    else:
        out = {"PROVIDER": "credential_chain", "REGION": region}
        settings = aip_settings.current()
        if settings.s3_credential_chain:
            out["CHAIN"] = settings.s3_credential_chain
    endpoint = aip_settings.current().s3_endpoint
    if endpoint:
        scheme, sep, rest = endpoint.partition("://")
        if not sep or scheme not in ("http", "https") or not rest.strip("/") or "/" in rest.strip("/"):
            raise AipError(f"{S3_ENDPOINT_ENV} must be http://host:port or https://host, got {endpoint!r}")
        out.update(ENDPOINT=rest.strip("/"), URL_STYLE="path", USE_SSL="true" if scheme == "https" else "false")
    return out


def _s3_secret(con: duckdb.DuckDBPyConnection) -> None:
    """This connection's S3 credentials: a temporary secret (memory only, never persisted). Loading
    httpfs copies the AWS variables into its ``s3_*`` settings, which any query could read: they
    are emptied (the secret serves every request)."""
    for name in ("s3_access_key_id", "s3_secret_access_key", "s3_session_token"):
        con.execute(f"SET {name} = ''")
    settings = _s3_settings()
    params = ", ".join(f"{k} {v if k in ('USE_SSL', 'PROVIDER') else _quote(v)}" for k, v in settings.items())
    try:
        con.execute(f"CREATE OR REPLACE TEMPORARY SECRET aip_lake_s3 (TYPE s3, {params})")
    except duckdb.Error as e:
        how = (
            ""
            if _keys_given()
            else " (no AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY set, and the AWS credential "
            f"chain found none: give it a profile or role, or name its providers in {S3_CHAIN_ENV})"
        )
        raise AipError(
            f"{LAKE_ENV}: the S3 credentials are not usable{how}: {_hide(' '.join(str(e).split()), settings)}"
        ) from None


def _hide(text: str, settings: dict[str, str]) -> str:
    for k in ("SECRET", "SESSION_TOKEN"):
        if settings.get(k):
            text = text.replace(settings[k], "***")
    return text


def enabled() -> bool:
    from ..shared_state import lake_enabled

    return lake_enabled()


@contextmanager
def set_aside() -> Iterator[None]:
    """The lake not used within (this process): a dry run's throwaway warehouse is a local file in
    a temporary folder, never rows in the shared lake."""
    with aip_settings.override(lake_data_path=None):
        yield


def _catalog_url() -> str:
    from ..shared_state import lake_catalog_url

    return lake_catalog_url()


def extension_file(name: str) -> Path:
    """The extension's file as its PyPI wheel installed it (for this duckdb's version)."""
    wheel = f"duckdb-extension-{name.replace('_', '-')}=={duckdb.__version__}"
    try:
        mod = importlib.import_module(f"duckdb_extension_{name}")
    except ImportError:
        raise AipError(
            f"{LAKE_ENV} is set, but DuckDB's {name} extension is not installed: "
            f"pip install 'aip-assets[shared]' (it brings {wheel})"
        ) from None
    f = Path(mod.__file__ or "").parent / "extensions" / f"v{duckdb.__version__}" / f"{name}.duckdb_extension"
    if not f.exists():
        raise AipError(
            f"{LAKE_ENV}: DuckDB's {name} extension is installed for another duckdb than "
            f"{duckdb.__version__} (no {f}); pip install '{wheel}'"
        )
    return f


def _quote(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def where() -> str:
    """The lake for a message: its catalog (no password) and its folder."""
    from ..shared_state import describe

    return f"DuckLake at {data_path()} (catalog {describe(_catalog_url())}, schema {METADATA_SCHEMA})"


_PASSFILE: dict[str, str] = {}  # password -> this process's libpq password file holding it
PASSFILE_PREFIX = "aip-pgpass-"


def _passfile_dir() -> Path:
    """Memory, not disk, where there is one: ``$XDG_RUNTIME_DIR``, else /dev/shm, else the temp folder."""
    import tempfile

    for d in (os.environ.get("XDG_RUNTIME_DIR"), "/dev/shm"):
        if d and os.path.isdir(d) and os.access(d, os.W_OK):
            return Path(d)
    return Path(tempfile.gettempdir())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _passfile(password: str) -> str:
    """A libpq password file (mode 0600) holding ``password`` for any server: the lake's ATTACH
    names this file, never the password, so no DuckDB message, setting or ``duckdb_databases()``
    row can show it. Named by this process's id and removed when it exits normally; a file whose
    process is gone (killed: no exit handler ran) is removed by the next process that makes one."""
    if password not in _PASSFILE:
        import atexit
        import tempfile

        folder = _passfile_dir()
        for old in folder.glob(PASSFILE_PREFIX + "*"):  # left by killed processes of this user
            try:
                pid = int(old.name[len(PASSFILE_PREFIX) :].split("-")[0])
                if old.stat().st_uid == os.getuid() and not _alive(pid):
                    old.unlink()
            except (ValueError, OSError):
                pass
        me = os.getpid()
        fd, path = tempfile.mkstemp(prefix=f"{PASSFILE_PREFIX}{me}-", dir=folder)
        escaped = password.replace("\\", "\\\\").replace(":", "\\:")
        os.write(fd, f"*:*:*:*:{escaped}\n".encode())
        os.close(fd)

        def remove() -> None:
            if os.getpid() == me:  # not in a forked child, which runs its parent's exit handlers too
                Path(path).unlink(missing_ok=True)

        atexit.register(remove)
        _PASSFILE[password] = path
    return _PASSFILE[password]


if hasattr(os, "register_at_fork"):  # a forked child writes its own (the parent's goes when the parent exits)
    os.register_at_fork(after_in_child=_PASSFILE.clear)


def _conninfo(url: str) -> str:
    """The catalog's libpq connection string for DuckDB: the URL's parameters in keyword form,
    its password replaced by a password file (``_passfile``)."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params = {k: str(v) for k, v in conninfo_to_dict(url).items()}
    password = params.pop("password", None)
    if password:
        params["passfile"] = _passfile(password)
    return make_conninfo("", **params)


def open_lake(read_only: bool = False, config: dict[str, Any] | None = None) -> duckdb.DuckDBPyConnection:
    """A new in-memory DuckDB with the extensions loaded from their files and the lake attached
    as ``lake`` (made on first use), its default database. Errors name the variable and never
    show the password."""
    url, data = _catalog_url(), data_path()
    assert data is not None
    files = [extension_file(n) for n in extensions()]
    con = duckdb.connect(config={**NO_AUTO, **(config or {})})
    try:
        for f in files:
            con.execute(f"LOAD {_quote(str(f))}")
        if on_s3():
            _s3_secret(con)
        elif not read_only:
            Path(data).mkdir(parents=True, exist_ok=True)
        options = f"DATA_PATH {_quote(data)}, METADATA_SCHEMA {_quote(METADATA_SCHEMA)}" + (
            ", READ_ONLY" if read_only else ""
        )
        sql = f"ATTACH {_quote('ducklake:postgres:' + _conninfo(url))} AS {ALIAS} ({options})"
        for attempt in range(6):
            try:
                con.execute(sql)
                break
            except duckdb.Error as e:
                # two workers making a new lake at once: one loses a race in Postgres (a duplicate
                # pg_type key, or "relation ducklake_metadata already exists": 2 of 90 opens by three
                # processes at once, measured); the lake exists then
                if not _lost_the_race(str(e)) or attempt == 5:
                    raise
                time.sleep(0.05 + random.random() * 0.1)
        con.execute(f"USE {ALIAS}")
        return con
    except duckdb.Error as e:
        con.close()
        from ..shared_state import Unreachable, _first_line

        message = f"{LAKE_ENV}: cannot open the {where()}: {_first_line(e, url)}"
        if catalog_lost(e):  # the database away: waited for by a caller that reached it before (patiently)
            raise Unreachable(message, _catalog_reason(e, url)) from None
        raise AipError(message) from None
    except AipError:
        con.close()
        raise


def _lost_the_race(message: str) -> bool:
    """An ATTACH that failed because another worker made the same new lake at that moment."""
    return "duplicate key value" in message or "already exists" in message


# how DuckDB's postgres extension (libpq) says that the catalog's database went away or does not answer
_LOST = (
    "unable to connect to postgres",
    "server closed the connection",
    "terminating connection",
    "connection refused",
    "no connection to the server",
    "could not receive data from server",
    "could not send data to server",
    "the database system is",
    'failed to execute query "rollback"',
    "connection to server at",
)


def catalog_lost(e: BaseException) -> bool:
    """A DuckDB error that is the catalog's database going away (a restart, a dropped or refused
    connection), not a refusal (authentication, a missing database) or a failure of the statement."""
    from ..shared_state import lost

    return isinstance(e, duckdb.Error) and any(m in str(e).lower() for m in _LOST) and lost(e)


def patiently(what: str, fn: Callable[[], T]) -> T:
    """``fn()``, tried again while the catalog's database is away (``catalog_lost``), as
    ``shared_state.patiently`` waits; then an ``OperationalError`` naming the lake's catalog."""
    from ..shared_state import Unreachable
    from ..shared_state import patiently as wait

    url = _catalog_url()

    def once() -> T:
        try:
            return fn()
        except duckdb.Error as e:
            if not catalog_lost(e):
                raise
            raise Unreachable(
                f"{LAKE_ENV}: {what}: the catalog's database went away", _catalog_reason(e, url)
            ) from None

    return wait(url, what, once, label="the lake's catalog")


def _catalog_reason(e: BaseException, url: str) -> str:
    """The libpq line of a DuckDB error from the catalog (the last 'connection to server' line, or
    its first line), scrubbed of the URL and password."""
    from ..shared_state import _scrub

    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    libpq = [ln[ln.lower().index("connection to server") :] for ln in lines if "connection to server" in ln.lower()]
    text = libpq[-1] if libpq else (lines[0] if lines else type(e).__name__)
    return _scrub(text, url)[:300]


def outage(e: BaseException, what: str) -> AipError:
    """The OperationalError for a read that met the catalog's database away (no retry: the caller's
    statements ran half-way)."""
    from ..errors import OperationalError

    return OperationalError(
        f"{where()}: {what} failed, the catalog's database went away: {_catalog_reason(e, _catalog_url())}"
    )


def is_conflict(e: BaseException) -> bool:
    """A DuckLake commit that lost to another worker's (rolled back whole; run it again)."""
    s = str(e)
    return isinstance(e, duckdb.TransactionException) and ("conflict" in s.lower() or "another transaction" in s)


def exists() -> bool:
    """Whether the lake has been made (its catalog's tables are in the shared-state database)."""
    from ..shared_state import SharedDb

    row = SharedDb.get(_catalog_url()).run(
        "the check for the lake's catalog",
        lambda c: c.execute(
            "SELECT 1 FROM information_schema.tables WHERE table_schema = %s AND table_name = 'ducklake_metadata'",
            [METADATA_SCHEMA],
        ).fetchone(),
    )
    return row is not None


def check() -> str | None:
    """Before a run, after ``shared_state.check_shared_state`` (which finds its catalog's
    database answering): the lake can be used (the catalog variable set, the extensions
    installed, the data folder can be made and written); raises AipError saying why not. What to
    log; None when the warehouse is a local file. Makes nothing but the data folder."""
    if not enabled():
        return None
    _catalog_url()
    data = data_path()
    assert data is not None
    for n in extensions():
        extension_file(n)
    if on_s3():  # the bucket answers and lists the prefix (nothing is written)
        con = duckdb.connect(config=dict(NO_AUTO))
        try:
            for n in extensions()[len(EXTENSIONS) :]:
                con.execute(f"LOAD {_quote(str(extension_file(n)))}")
            _s3_secret(con)
            con.execute(f"SELECT count(*) FROM glob({_quote(data + '*')})").fetchall()
        except duckdb.Error as e:
            raise AipError(
                f"{LAKE_ENV}: the lake's data path {data} cannot be read "
                f"({aip_settings.current().s3_endpoint or 'AWS S3'}): "
                f"{_hide(' '.join(str(e).split())[:300], _s3_settings())}"
            ) from None
        finally:
            con.close()
        return f"warehouse: {where()} ({LAKE_ENV})"
    try:
        Path(data).mkdir(parents=True, exist_ok=True)
        probe = Path(data) / f".aip-check-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise AipError(f"{LAKE_ENV}: the lake's data folder {data} cannot be written: {e}") from None
    return f"warehouse: {where()} ({LAKE_ENV})"


REGISTRATION_LOCK = 0x41495052  # the advisory lock key that serialises registering runs in a lake ("AIPR")


@contextmanager
def registration_lock() -> Iterator[None]:
    """Registering a run (and migrating runs) one worker at a time, through a Postgres advisory
    lock: a lake has no primary key, and DuckLake lets two inserts of one run id both commit (each
    transaction's check sees its own snapshot). No-op for a local warehouse (its primary key and
    file lock do this)."""
    if not enabled():
        yield
        return
    from ..shared_state import SharedDb

    db = SharedDb.get(_catalog_url())
    t0 = notice = time.monotonic()
    # tried, not waited for in the database: a wait there would hold the process's one shared-state
    # connection (rate limits, budgets) and end at its lock timeout
    while not db.run(
        "the lock on registering runs",
        lambda c: c.execute("SELECT pg_try_advisory_lock(%s)", [REGISTRATION_LOCK]).fetchone()[0],
    ):
        if time.monotonic() - notice > 30:
            notice = time.monotonic()
            logger.warning(
                f"waiting {notice - t0:.0f}s for another worker registering or migrating runs "
                f"(Postgres advisory lock {REGISTRATION_LOCK})"
            )
        time.sleep(0.05 + random.random() * 0.1)
    try:
        yield
    finally:
        held = db.run(
            "the lock on registering runs",
            lambda c: c.execute("SELECT pg_advisory_unlock(%s)", [REGISTRATION_LOCK]).fetchone()[0],
        )
        if not held:  # the connection was lost meanwhile, and the lock with it
            logger.warning(
                "the lock on registering runs was lost with its connection before the run was "
                "registered; another worker may have registered at the same time"
            )
