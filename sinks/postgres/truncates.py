"""Truncates in a replica, by the source's order rather than the log's.

A truncate event has no key, so it lands in one partition while the table's rows spread over
all of them: the sink may meet rows written before the truncate (in another partition) after
it, and rows written after it before it. Every replica row therefore carries its change's
position, ``(__hw_commit_lsn, __hw_txn_index)``; a truncate deletes the rows older than its
own position and is remembered in ``<schema>.headwater_sink_truncates``, and an upsert older
than the table's last truncate is not applied (the source had already removed that row).
"""

from __future__ import annotations

from typing import Any

from psycopg import sql

#: The replica columns holding each row's source position.
LSN_COLUMN = "__hw_commit_lsn"
INDEX_COLUMN = "__hw_txn_index"
TABLE = "headwater_sink_truncates"


class Truncates:
    """The last truncate of each replica table (``<schema>.headwater_sink_truncates``)."""

    def __init__(self, schema: str) -> None:
        self._table = sql.Identifier(schema, TABLE)

    def create(self, conn: Any) -> None:
        """Create the table if it is missing."""
        conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (replica text PRIMARY KEY, commit_lsn bigint NOT NULL, "
                "txn_index integer NOT NULL)"
            ).format(self._table)
        )

    def apply(self, execute: Any, replica: sql.Identifier, name: str, position: tuple[int, int]) -> None:
        """Delete the rows older than ``position`` and remember it as the table's last truncate (via ``execute``)."""
        execute(
            sql.SQL("DELETE FROM {} WHERE ({}, {}) < (%s, %s)").format(
                replica, sql.Identifier(LSN_COLUMN), sql.Identifier(INDEX_COLUMN)
            ),
            position,
        )
        execute(
            sql.SQL(
                "INSERT INTO {} VALUES (%s, %s, %s) ON CONFLICT (replica) DO UPDATE SET "
                "commit_lsn = excluded.commit_lsn, txn_index = excluded.txn_index "
                "WHERE ({}.commit_lsn, {}.txn_index) < (excluded.commit_lsn, excluded.txn_index)"
            ).format(self._table, self._table, self._table),
            (name, *position),
        )

    def newer_than_last(self, name: str) -> sql.Composable:
        """A condition on a row of the batch (``s``, see :mod:`sinks.postgres.arrays`): after the last truncate."""
        return sql.SQL(
            "NOT EXISTS (SELECT 1 FROM {} x WHERE x.replica = {} AND (s.{}, s.{}) < (x.commit_lsn, x.txn_index))"
        ).format(self._table, sql.Literal(name), sql.Identifier(LSN_COLUMN), sql.Identifier(INDEX_COLUMN))
