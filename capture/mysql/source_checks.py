"""A MySQL source's settings checked against its database when capture starts, each refusal one line.

What ``headwater.yaml`` validation cannot know: that the tables and columns named by
``columns`` (include, exclude, mask), ``keys`` and ``filters`` exist, that each filter is a
condition the server accepts and capture evaluates exactly (:mod:`capture.mysql.row_filter`),
and that every captured table's plan can be built (masks on maskable columns, key columns
captured). Refused before anything is read from the binlog, so nothing is lost: capture
resumes from its saved position once the settings are fixed.
"""

from __future__ import annotations

from typing import Any

import pymysql

from capture.column_policy import ColumnPolicy
from capture.errors import ColumnSettingError
from capture.mysql.catalog import CatalogError, describe
from capture.mysql.settings import MySqlSource
from capture.mysql.table_plan import TablePlanner
from core.errors import one_line


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def check_source_settings(source: MySqlSource, planner: TablePlanner) -> None:
    """Refuse (:class:`ColumnSettingError` and the plan's errors) what cannot be captured as configured."""
    named: dict[str, list[tuple[str, str]]] = ColumnPolicy(source.columns).named_columns()
    for table, columns in source.keys.items():
        named.setdefault(table, []).extend(("keys", column) for column in columns)
    for table in source.filters:
        named.setdefault(table, [])
    if not named and not source.tables:
        return
    with source.address.connect() as conn, conn.cursor() as cur:
        shapes: dict[str, Any] = {}
        for table, settings in named.items():
            field = _field(table, settings, source)
            database, _, name = table.partition(".")
            try:
                shape = describe(cur, database, name)
            except CatalogError:
                raise ColumnSettingError(
                    source.name, field, f"there is no table {table} in the database", table=table
                ) from None
            existing = {c.name for c in shape.columns}
            for setting, column in settings:
                if column not in existing:
                    where = f"keys.{table}" if setting == "keys" else f"columns.{setting}"
                    raise ColumnSettingError(source.name, where, f"{table} has no column {column!r}", table=table)
            condition = source.filters.get(table)
            if condition is not None:
                planner.plan(shape)  # capture's own checks first: only a condition it accepts reaches the server
                _server_accepts(cur, source.name, table, condition)
            shapes[table] = shape
        for table in source.tables:
            if table not in shapes:
                database, _, name = table.partition(".")
                try:
                    shapes[table] = describe(cur, database, name)
                except CatalogError:
                    continue  # the snapshot says so in its own line
        for shape in shapes.values():
            planner.plan(shape)


def _field(table: str, settings: list[tuple[str, str]], source: MySqlSource) -> str:
    if not settings:
        return f"filters.{table}"
    return f"keys.{table}" if settings[0][0] == "keys" else f"columns.{settings[0][0]}"


def _server_accepts(cur: Any, source: str, table: str, condition: str) -> None:
    database, _, name = table.partition(".")
    try:
        cur.execute(f"SELECT 1 FROM {_quote(database)}.{_quote(name)} WHERE {condition} LIMIT 0")
    except pymysql.err.OperationalError as exc:
        if exc.args and exc.args[0] in (2003, 2006, 2013):  # the connection, not the condition
            raise
        raise ColumnSettingError(
            source, f"filters.{table}", f"the server refuses the condition: {one_line(exc)}", table=table
        ) from None
    except pymysql.err.MySQLError as exc:
        raise ColumnSettingError(
            source, f"filters.{table}", f"the server refuses the condition: {one_line(exc)}", table=table
        ) from None
