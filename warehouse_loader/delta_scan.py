"""Expose a Delta table's current version to DuckDB, wherever the table lives.

DuckDB reads the table's active Parquet files itself (projection and filter pushdown
kept). Going through ``DeltaTable.to_pyarrow_dataset()`` instead breaks on files a
delta-rs MERGE rewrote: they store strings as ``string_view`` while the table schema
says ``string``, and pyarrow has no comparison kernel across the two (delta-rs #4579,
apache/arrow #49368), so any pushed-down filter on a string column fails.

Tables on an object store are read the same way: the connection gets the store as an
fsspec filesystem over pyarrow's (:func:`warehouse_loader.object_store.duckdb_filesystem`),
so no DuckDB extension is needed; extension auto-install and auto-load are off on every
connection, so nothing is downloaded at run time.

Tables written by Headwater have no partition columns, deletion vectors or column
mapping, so the file list is the whole table; files written before a column was added
miss it, which ``union_by_name`` fills with NULL.
"""

from __future__ import annotations

from collections.abc import Iterable

import duckdb
import pyarrow as pa  # type: ignore[import-untyped]
from deltalake import DeltaTable

from warehouse_loader.location import TableLocation, storage_error
from warehouse_loader.object_store import duckdb_filesystem
from warehouse_loader.sql_text import quote, sql_list


def duckdb_connection(locations: Iterable[TableLocation] = ()) -> duckdb.DuckDBPyConnection:
    """An in-memory connection (UTC, no extension downloads) that can read tables at ``locations``."""
    con = duckdb.connect(":memory:")
    con.execute("SET TimeZone = 'UTC'")
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET autoload_known_extensions = false")
    registered: set[str] = set()
    for location in locations:
        if location.is_remote and location.scheme not in registered:
            filesystem = duckdb_filesystem(location.scheme, location.storage_options or {})
            con.register_filesystem(filesystem)
            registered.update(filesystem.protocol)
    return con


def register_delta(con: duckdb.DuckDBPyConnection, name: str, table: DeltaTable) -> None:
    """Make ``name`` a view (or an empty table) over ``table``'s current version."""
    files = table.file_uris()
    if files:
        con.execute(f"CREATE VIEW {quote(name)} AS SELECT * FROM read_parquet({sql_list(files)}, union_by_name = true)")
    else:
        con.register(name, pa.schema(table.schema().to_arrow()).empty_table())


def select_rows(location: TableLocation, delta: DeltaTable, sql: str, **tables: pa.Table) -> pa.Table:
    """Run ``sql`` with ``target`` bound to ``delta`` (at ``location``) and ``tables`` by name; Arrow out."""
    con = duckdb_connection([location])
    try:
        register_delta(con, "target", delta)
        for name, table in tables.items():
            con.register(name, table)
        try:
            return con.sql(sql).to_arrow_table()
        except duckdb.IOException as exc:
            raise storage_error(exc, location) from None
    finally:
        con.close()
