"""A Delta table at a location: opening it (delta-rs), and one version of it as a stored table.

:class:`DeltaVersion` is the Delta format's :class:`~warehouse_loader.table_format.StoredTable`.

Concurrent commits on S3 are safe without a lock service: delta-rs 1.x writes each commit
as one ``PUT _delta_log/<version>.json`` with ``If-None-Match: *`` (S3 conditional writes),
so of two writers racing for a version exactly one succeeds and the other gets a conflict
(:mod:`warehouse_loader.delta.writer` re-plans and retries it). A store without
conditional writes fails every commit instead of risking a lost one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import duckdb
import pyarrow as pa  # type: ignore[import-untyped]
from deltalake import DeltaTable

from warehouse_loader.delta.scan import register_delta, select_rows
from warehouse_loader.location import TableLocation, storage_error


def delta_exists(location: TableLocation) -> bool:
    """True when a Delta table is at ``location``."""
    try:
        return bool(DeltaTable.is_deltatable(location.uri, storage_options=location.storage_options))
    except OSError as exc:
        raise storage_error(exc, location) from None


def open_delta(location: TableLocation) -> DeltaTable | None:
    """The Delta table at ``location`` at its latest version, or None when there is none (yet)."""
    if not delta_exists(location):
        return None
    try:
        return DeltaTable(location.uri, storage_options=location.storage_options)
    except OSError as exc:
        raise storage_error(exc, location) from None


def table_schema(target: DeltaTable) -> pa.Schema:
    """The Arrow schema of the table's current version (from the log: a table with deletion vectors has no dataset)."""
    return pa.schema(target.schema().to_arrow())


class DeltaVersion:
    """One version of a Delta table (the :class:`~warehouse_loader.table_format.StoredTable` of the Delta format)."""

    def __init__(self, location: TableLocation, delta: DeltaTable) -> None:
        self.location = location
        #: The delta-rs table (Delta code only: the writer commits through it).
        self.delta = delta

    def version(self) -> int:
        """The Delta version."""
        return int(self.delta.version())

    def schema(self) -> pa.Schema:
        """The Arrow schema of this version."""
        return table_schema(self.delta)

    def register(self, con: duckdb.DuckDBPyConnection, name: str) -> None:
        """``name``: a view over this version's Parquet files (or an empty table)."""
        register_delta(con, name, self.delta)

    def select(self, sql: str, **tables: pa.Table) -> pa.Table:
        """``sql`` over ``target`` (this version) and ``tables``, by DuckDB."""
        return select_rows(self.location, self.delta, sql, **tables)

    def history(self, limit: int) -> list[Mapping[str, Any]]:
        """The last ``limit`` commits, newest first (Delta's commit infos: ``version``, ``timestamp``, metadata)."""
        return list(self.delta.history(limit))

    def size_bytes(self) -> int:
        """Bytes of the files this version's add actions name."""
        actions = self.delta.get_add_actions(flatten=True)
        return int(sum(actions.column("size_bytes").to_pylist()))


def open_version(location: TableLocation) -> DeltaVersion | None:
    """The latest version of the Delta table at ``location``, or None."""
    delta = open_delta(location)
    return None if delta is None else DeltaVersion(location, delta)
