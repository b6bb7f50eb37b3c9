"""Expose a Delta table's current version to DuckDB, wherever the table lives.

DuckDB reads the table's active Parquet files itself (projection and filter pushdown
kept). Going through ``DeltaTable.to_pyarrow_dataset()`` instead breaks on files a
delta-rs MERGE rewrote: they store strings as ``string_view`` while the table schema
says ``string``, and pyarrow has no comparison kernel across the two (delta-rs #4579,
apache/arrow #49368), so any pushed-down filter on a string column fails.

Tables on an object store are read the same way, through a connection of
:func:`warehouse_loader.duckdb_connection.duckdb_connection`.

Tables written by Headwater have no partition columns or column mapping, so the file
list is the whole table; files written before a column was added miss it, which
``union_by_name`` fills with NULL (so is a column no file holds yet). Rows that
deletion vectors remove (merge-on-read tables, :mod:`warehouse_loader.delta.merge_on_read`)
are left out: delta-rs reads the vectors (``deletion_vectors()``) and the view anti-joins
each file's row positions.
"""

from __future__ import annotations

import duckdb
import pyarrow as pa  # type: ignore[import-untyped]
from deltalake import DeltaTable

from warehouse_loader.duckdb_connection import duckdb_connection, store_failed
from warehouse_loader.location import TableLocation, storage_error
from warehouse_loader.sql_text import quote, sql_list

#: Columns a scan of a table with deletion vectors adds (and drops again).
_FILE, _ROW = "__hw_file", "file_row_number"


def deleted_rows(table: DeltaTable, con: duckdb.DuckDBPyConnection | None = None) -> pa.Table | None:
    """``(__hw_file, pos)`` of each row deletion vectors remove (files named as by ``file_uris``), or None.

    delta-rs reads the vectors (``deletion_vectors()``: a keep-mask per file) and DuckDB turns
    them into rows: any Python-to-Arrow conversion here makes pyarrow import pandas, seconds
    at the first call of a process (every ``headwater query``). On a new connection to ``con``'s
    database when given, else to the process's: opening a database costs more than this work.
    """
    if "deletionVectors" not in (table.protocol().reader_features or []):
        return None
    con = duckdb_connection() if con is None else con.cursor()
    try:
        con.register("vectors", pa.RecordBatchReader.from_stream(table.deletion_vectors()))
        gone = con.sql(
            f"SELECT url_decode(regexp_replace(filepath, '^file://', '')) AS {_FILE}, CAST(pos AS BIGINT) AS pos "
            "FROM (SELECT filepath, unnest(generate_series(0, len(selection_vector) - 1)) AS pos, "
            "unnest(selection_vector) AS keep FROM vectors) WHERE NOT keep"
        ).to_arrow_table()
    finally:
        con.close()
    return gone if gone.num_rows else None


def register_delta(con: duckdb.DuckDBPyConnection, name: str, table: DeltaTable) -> None:
    """Make ``name`` a view (or an empty table) over ``table``'s current version, deletion vectors applied.

    A column the table has and no file holds (added in metadata, no row written since) is NULL.
    """
    files = table.file_uris()
    schema = pa.schema(table.schema().to_arrow())
    if not files:
        con.register(name, schema.empty_table())
        return
    stored = f"__hw_files_{name}"
    gone = deleted_rows(table, con)
    if gone is None:
        con.execute(
            f"CREATE TEMP VIEW {quote(stored)} AS SELECT * FROM read_parquet({sql_list(files)}, union_by_name = true)"
        )
    else:
        con.register(f"__hw_gone_{name}", gone)
        scan = f"read_parquet({sql_list(files)}, filename = '{_FILE}', file_row_number = true, union_by_name = true)"
        con.execute(
            f"CREATE TEMP VIEW {quote(stored)} AS SELECT t.* EXCLUDE ({_FILE}, {_ROW}) FROM {scan} t "
            f"ANTI JOIN {quote(f'__hw_gone_{name}')} g ON g.{_FILE} = t.{_FILE} AND g.pos = t.{_ROW}"
        )
    present = {row[0] for row in con.execute(f"DESCRIBE {quote(stored)}").fetchall()}
    missing = [field for field in schema if field.name not in present]
    if not missing:
        con.execute(f"CREATE TEMP VIEW {quote(name)} AS SELECT * FROM {quote(stored)}")
        return
    added = f"__hw_added_{name}"
    con.register(added, pa.table({field.name: pa.nulls(1, field.type) for field in missing}))
    con.execute(f"CREATE TEMP VIEW {quote(name)} AS SELECT s.*, a.* FROM {quote(stored)} s CROSS JOIN {quote(added)} a")


def select_rows(location: TableLocation, delta: DeltaTable, sql: str, **tables: pa.Table) -> pa.Table:
    """Run ``sql`` with ``target`` bound to ``delta`` (at ``location``) and ``tables`` by name; Arrow out."""
    con = duckdb_connection([location])
    try:
        register_delta(con, "target", delta)
        for name, table in tables.items():
            con.register(name, table)
        try:
            return con.sql(sql).to_arrow_table()
        except duckdb.Error as exc:
            if not store_failed(exc):
                raise
            raise storage_error(exc, location) from None
    finally:
        con.close()
