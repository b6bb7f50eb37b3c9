"""Read-only SQL over warehouse tables: DuckDB over each table's current version, in any format.

Each table is registered under its warehouse name by its format
(:meth:`warehouse_loader.table_format.StoredTable.register`; Delta: a view over the Parquet
files of its current version, nothing copied up front, projections and filters pushed into
the scan), local or on an object store.
After registration the connection may read only the tables' folders (or prefixes), drops
external access and locks its configuration, so a query cannot write files, attach
databases or load extensions.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Mapping
from datetime import date, datetime, time
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal

import duckdb
import orjson
import pyarrow as pa  # type: ignore[import-untyped]

from core.config import ProjectConfig
from warehouse_loader.duckdb_connection import duckdb_connection, store_failed
from warehouse_loader.errors import QueryError, UnknownTableError
from warehouse_loader.formats import DEFAULT_FORMAT, format_of, table_format
from warehouse_loader.location import TableLocation, as_location, storage_error
from warehouse_loader.sql_text import sql_list
from warehouse_loader.table_format import TableFormat

OutputFormat = Literal["table", "json", "csv"]

_MISSING_TABLE = re.compile(r"Table with name (\S+) does not exist", re.IGNORECASE)


def run_query(
    sql: str, tables: Mapping[str, TableLocation | Path], *, formats: Mapping[str, TableFormat] | None = None
) -> pa.Table:
    """Run ``sql`` over the tables in ``tables`` (name → location) and return the result.

    ``formats`` gives a table's format by name (default: Delta). A name whose location holds
    no table yet (never loaded) is not registered; a query naming it, or any unknown name,
    raises :class:`UnknownTableError` listing the tables that can be queried.
    """
    default = table_format(DEFAULT_FORMAT)
    locations = {name: as_location(where) for name, where in tables.items()}
    con = duckdb_connection(locations.values(), private=True)  # it locks external access
    try:
        loaded: list[str] = []
        allowed: list[str] = []
        for name, location in locations.items():
            table = (formats or {}).get(name, default).open(location)
            if table is not None:
                table.register(con, name)
                loaded.append(name)
                allowed.append(f"{location.uri}/" if location.is_remote else str(location.path.resolve()))
        # Only the tables' own folders stay readable once external access is off.
        con.execute(f"SET allowed_directories = {sql_list(allowed)}")
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
        try:
            return con.sql(sql).to_arrow_table()
        except duckdb.CatalogException as exc:
            match = _MISSING_TABLE.search(str(exc))
            if match:
                raise UnknownTableError(match.group(1).strip("\"'"), loaded) from None
            raise QueryError(_query_failed(exc)) from None
        except duckdb.Error as exc:
            remote = next((loc for loc in locations.values() if loc.is_remote), None)
            if remote is None or not store_failed(exc):
                raise QueryError(_query_failed(exc)) from None
            raise storage_error(exc, remote) from None
    finally:
        con.close()


def _query_failed(exc: Exception) -> str:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"query failed: {first}"


def _json_default(value: Any) -> Any:
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes):
        return value.hex()
    msg = f"cannot encode {type(value).__name__} as JSON"
    raise TypeError(msg)


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


def query_warehouse(config: ProjectConfig, sql: str) -> pa.Table:
    """Run ``sql`` over every configured table's current version (follows ``headwater reprocess``)."""
    from warehouse_loader.load_job import table_path

    names = list(config.warehouse.tables)
    return run_query(
        sql,
        {name: table_path(config, name) for name in names},
        formats={name: format_of(config, name) for name in names},
    )


def to_json(result: pa.Table) -> str:
    """One JSON array of row objects (column name → value), as ``headwater query --format json``."""
    option = orjson.OPT_NAIVE_UTC | orjson.OPT_UTC_Z | orjson.OPT_NON_STR_KEYS
    return orjson.dumps(result.to_pylist(), default=_json_default, option=option).decode()


def to_csv(result: pa.Table) -> str:
    """CSV with a header row; nulls are empty fields, timestamps ISO 8601."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(result.column_names)
    for row in result.to_pylist():
        writer.writerow([_text(row[name]) for name in result.column_names])
    return buffer.getvalue()


def to_text_table(result: pa.Table) -> str:
    """An aligned plain-text table with the row count (for a terminal)."""
    from rich.console import Console
    from rich.table import Table

    grid = Table(show_lines=False)
    for name in result.column_names:
        grid.add_column(name, overflow="fold")
    for row in result.to_pylist():
        grid.add_row(*(_text(row[name]) if row[name] is not None else "NULL" for name in result.column_names))
    console = Console(file=io.StringIO(), width=200, color_system=None, record=True)
    console.print(grid)
    plural = "" if result.num_rows == 1 else "s"
    return console.export_text().rstrip("\n") + f"\n({result.num_rows} row{plural})"


def format_result(result: pa.Table, fmt: OutputFormat) -> str:
    """Render a query result as ``table``, ``json`` or ``csv`` text."""
    if fmt == "json":
        return to_json(result)
    if fmt == "csv":
        return to_csv(result)
    return to_text_table(result)
