"""The DuckDB warehouse: explicit table schemas, replace-a-partition writes, views.

Every access goes through :func:`connect` (``connection``: a file lock beside the database, the
database kept open a moment between uses) or, in shared mode, the DuckLake every worker writes
(``lake``). The parts:

- ``tables``: the tables, their columns and types; a frame of a table's columns (``frame``).
- ``core_views``: the views that are no one metric's; every view, in the order they are made.
- ``schema``: making the tables and views (``ensure_schema``), and the schema's level.
- ``connection``: ``connect``, ``session``: every use of the warehouse.
- ``opening``: where the file is, the inter-process lock beside it, opening it; a damaged file named.
- ``linger``: the database kept open a moment between uses, this process's open lake; ``release``.
- ``transactions``: one transaction, run again where a lake's commit lost to another worker's.
- ``sandbox``: a user's query (``aip-eval sql``), read-only, checked and bounded in time.
- ``writes``: a partition's rows replaced in one transaction, partition reads, memory caps.
- ``migrations``: a local warehouse's runs copied into the lake.
- ``lake``: the warehouse as a DuckLake (catalog in Postgres, Parquet files in a folder or on S3).

What callers use is named here (``warehouse.connect``, ``warehouse.TABLES``...); where the
warehouse is, and how it is tuned, comes from :mod:`aip_assets.settings`.
"""

from __future__ import annotations

from . import lake
from .connection import connect, exists, session
from .core_views import CORE_VIEWS, views
from .linger import release
from .migrations import migrate_into_lake
from .opening import default_path
from .sandbox import QueryStopped, check_query, run_bounded, sandboxed
from .schema import SCHEMA_LEVEL, ensure_schema
from .tables import LAKE_TABLES, STAGE_SCOPED, TABLES, arrow_schema, frame
from .transactions import LAKE_STATS, transaction
from .writes import (
    insert_frame,
    lean_first,
    query,
    read_partition,
    release_memory,
    status_counts,
    write_caps,
    write_partition_files,
)

__all__ = [
    "LAKE_STATS",
    "LAKE_TABLES",
    "SCHEMA_LEVEL",
    "STAGE_SCOPED",
    "TABLES",
    "CORE_VIEWS",
    "QueryStopped",
    "arrow_schema",
    "check_query",
    "connect",
    "default_path",
    "ensure_schema",
    "exists",
    "frame",
    "lake",
    "lean_first",
    "migrate_into_lake",
    "query",
    "read_partition",
    "release",
    "release_memory",
    "run_bounded",
    "sandboxed",
    "session",
    "status_counts",
    "insert_frame",
    "transaction",
    "views",
    "write_caps",
    "write_partition_files",
]
