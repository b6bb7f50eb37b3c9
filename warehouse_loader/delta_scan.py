"""Expose a Delta table's current version to DuckDB.

DuckDB reads the table's active Parquet files itself (projection and filter pushdown
kept). Going through ``DeltaTable.to_pyarrow_dataset()`` instead breaks on files a
delta-rs MERGE rewrote: they store strings as ``string_view`` while the table schema
says ``string``, and pyarrow has no comparison kernel across the two (delta-rs #4579,
apache/arrow #49368), so any pushed-down filter on a string column fails.

Tables written by Headwater have no partition columns, deletion vectors or column
mapping, so the file list is the whole table; files written before a column was added
miss it, which ``union_by_name`` fills with NULL.
"""

from __future__ import annotations

import duckdb
import pyarrow as pa  # type: ignore[import-untyped]
from deltalake import DeltaTable

from warehouse_loader.sql_text import quote, sql_list


def register_delta(con: duckdb.DuckDBPyConnection, name: str, table: DeltaTable) -> None:
    """Make ``name`` a view (or an empty table) over ``table``'s current version."""
    files = table.file_uris()
    if files:
        con.execute(f"CREATE VIEW {quote(name)} AS SELECT * FROM read_parquet({sql_list(files)}, union_by_name = true)")
    else:
        con.register(name, pa.schema(table.schema().to_arrow()).empty_table())


def select_rows(delta: DeltaTable, sql: str, **tables: pa.Table) -> pa.Table:
    """Run ``sql`` with ``target`` bound to ``delta`` (and ``tables`` by name); the result as Arrow."""
    con = duckdb.connect(":memory:")
    try:
        con.execute("SET TimeZone = 'UTC'")
        register_delta(con, "target", delta)
        for name, table in tables.items():
            con.register(name, table)
        return con.sql(sql).to_arrow_table()
    finally:
        con.close()
