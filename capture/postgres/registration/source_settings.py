"""A source's capture settings checked against its database when capture starts, each refusal one line.

What ``headwater.yaml`` validation cannot know: that the tables and columns named by
``columns`` (include, exclude, mask) and ``keys`` exist, that the row filters parse and may be
row filters (:mod:`capture.postgres.registration.row_filters`, which also brings the publication to them), and that
the signal table has Debezium's columns and is in the publication. Refused before anything is
read from the slot, so nothing captured is lost: the slot keeps every change until capture runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from capture.column_policy import ColumnPolicy
from capture.errors import ColumnSettingError, PublicationError
from capture.postgres.registration.publication import as_text, publication_info
from capture.postgres.registration.row_filters import split_table, sync_publication_filters
from capture.postgres.streaming.signals import SIGNAL_COLUMNS
from core.source_config import SourceConfig

#: The row filters last seen in the publication with their configured conditions (capture state directory).
ROW_FILTERS_FILE = "row_filters.json"


def check_source_settings(
    conn: psycopg.Connection[Any], name: str, source: SourceConfig, publication: str, *, state_dir: Path
) -> None:
    """Refuse (:class:`ColumnSettingError`) what cannot be captured as configured; set the row filters.

    A missing publication is refused too (:class:`PublicationError`): without it the snapshot
    reads no table and the run would report success with nothing captured.
    """
    if publication_info(conn, publication) is None:
        names = [sql.Identifier(schema) for schema in source.schemas or ()] or [
            sql.Identifier(*split_table(table)) for table in source.tables or ()
        ]
        kind = "TABLES IN SCHEMA" if source.schemas else "TABLE"
        targets = f"{kind} {as_text(sql.SQL(', ').join(names))}"
        msg = (
            f"source {name}: publication {publication} does not exist, so nothing would be captured; register "
            f"the source with 'headwater source add' (it creates it) or create it: CREATE PUBLICATION "
            f"{as_text(sql.Identifier(publication))} FOR {targets}"
        )
        raise PublicationError(msg, source=name, publication=publication)
    named = ColumnPolicy(source.columns).named_columns()
    for table, columns in source.keys.items():
        named.setdefault(table, []).extend(("keys", column) for column in columns)
    for table, settings in named.items():
        existing = _columns(conn, table)
        field = f"keys.{table}" if settings[0][0] == "keys" else f"columns.{settings[0][0]}"
        if existing is None:
            raise ColumnSettingError(name, field, f"there is no table {table} in the database", table=table)
        for setting, column in settings:
            if column not in existing:
                field = f"keys.{table}" if setting == "keys" else f"columns.{setting}"
                raise ColumnSettingError(name, field, f"{table} has no column {column!r}", table=table)
    if source.signal_table is not None:
        _check_signal_table(conn, name, source.signal_table, publication)
    sync_publication_filters(conn, name, publication, source.filters, record=state_dir / ROW_FILTERS_FILE)


def _columns(conn: psycopg.Connection[Any], table: str) -> set[str] | None:
    """The column names of ``schema.table`` (raw names), or None when there is no such table."""
    schema, relation = split_table(table)
    rows = conn.execute(
        "SELECT a.attname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped "
        "WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')",
        (schema, relation),
    ).fetchall()
    return {row[0] for row in rows if row[0] is not None} if rows else None


def _check_signal_table(conn: psycopg.Connection[Any], name: str, table: str, publication: str) -> None:
    existing = _columns(conn, table)
    if existing is None:
        raise ColumnSettingError(
            name,
            "signal_table",
            f"there is no table {table}; create it: CREATE TABLE {table} "
            "(id varchar(42) PRIMARY KEY, type varchar(32) NOT NULL, data varchar(2048))",
            table=table,
        )
    missing = [c for c in SIGNAL_COLUMNS if c not in existing]
    if missing:
        raise ColumnSettingError(
            name, "signal_table", f"{table} has no column {missing[0]!r} (a signal table has id, type, data)"
        )
    schema, relation = split_table(table)
    published = conn.execute(
        "SELECT 1 FROM pg_publication_tables WHERE pubname = %s AND schemaname = %s AND tablename = %s",
        (publication, schema, relation),
    ).fetchone()
    if published is None:
        statement = sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(
            sql.Identifier(publication), sql.Identifier(schema, relation)
        )
        raise ColumnSettingError(
            name,
            "signal_table",
            f"{table} is not in publication {publication}, so its signals never reach capture; "
            f"add it to 'tables' and run: {as_text(statement)}",
            table=table,
        )
