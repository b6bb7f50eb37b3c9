"""The signal table (``sources.<name>.signal_table``) of a PostgreSQL source: its inserts, read from the WAL.

As Debezium's source signaling channel (the orders and their ``data``: :mod:`capture.signals`):
the table has the columns ``id``, ``type`` and ``data`` and is in the source's publication, so a
signal is an insert read from the WAL stream, carried out once its transaction is in the log,
before that transaction is acknowledged. Each ``execute-snapshot`` table must be in the
publication; its additional condition must parse and work with the source's row filter
(:mod:`capture.postgres.registration.row_filters`). A refusal is written back to the signal table
as a ``log`` signal on the agent's SQL connection.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
import psycopg
from psycopg import sql

from capture import signals
from capture.postgres.decoding.pgoutput_messages import Insert, Relation
from capture.postgres.identifiers import TableName
from capture.postgres.registration.row_filters import condition_problem, condition_sql, split_table
from capture.postgres.snapshot.incremental import IncrementalSnapshotter
from capture.postgres.streaming.transactions import Change, Transaction
from capture.signals import SIGNAL_COLUMNS, Signal, SignalError, quoted
from core.errors import one_line
from log.sequence import Sequence as Seq

__all__ = ["SIGNAL_COLUMNS", "Signal", "SignalError", "SignalTable"]

logger = logging.getLogger(__name__)


class SignalTable:
    """Finds signals in committed transactions and carries them out (see the module docstring)."""

    def __init__(self, source: str, table: str, publication: str, filters: Mapping[str, str] | None = None) -> None:
        self.source = source
        self.table = table
        self._schema, self._name = split_table(table)
        self._publication = publication
        self._filters = dict(filters or {})
        self._oid: int | None = None
        self._positions: tuple[int, int, int] | None = None

    def signals_in(self, txn: Transaction, changes: Sequence[Change] | None = None, first: int = 0) -> list[Signal]:
        """The rows the transaction inserted into the signal table, in order.

        ``changes``: one piece of its changes (default: all it holds), the first of them the
        transaction's change number ``first``.
        """
        found: list[Signal] = []
        for index, change in enumerate(txn.changes if changes is None else changes, first):
            if isinstance(change, Relation):
                if change.namespace == self._schema and change.name == self._name:
                    self._learn(change)
            elif isinstance(change, Insert) and change.relation_oid == self._oid and self._positions is not None:
                ident, kind, data = (change.new[i] if i < len(change.new) else None for i in self._positions)
                found.append(
                    Signal(
                        str(ident),
                        str(kind),
                        data if isinstance(data, str) else None,
                        Seq(txn.commit_lsn.value, index),
                    )
                )
        return found

    def _learn(self, relation: Relation) -> None:
        names = [column.name for column in relation.columns]
        self._oid = relation.oid
        missing = [c for c in SIGNAL_COLUMNS if c not in names]
        if missing:
            logger.warning(
                "source %s: signal table %s has no column %r; its rows are not signals",
                self.source,
                self.table,
                missing[0],
            )
            self._positions = None
            return
        self._positions = (names.index("id"), names.index("type"), names.index("data"))

    def act(self, conn: psycopg.Connection[Any], found: Sequence[Signal], incremental: IncrementalSnapshotter) -> None:
        """Carry out each signal not carried out before; refuse (log, write back) those that cannot be."""
        signals.act(found, incremental, _OnConnection(self, conn))


class _OnConnection:
    """The checks and write-backs of a signal table on the agent's SQL connection (a ``SignalSource``)."""

    def __init__(self, table: SignalTable, conn: psycopg.Connection[Any]) -> None:
        self.source = table.source
        self._table = table
        self._conn = conn

    def canonical(self, name: str) -> str:
        """A ``schema.table`` name (raw parts) as incremental snapshots write table names."""
        return str(TableName(*split_table(name)))

    def check_table(self, name: str, condition: str | None) -> None:
        """In the publication, and its condition parses and works with the source's row filter."""
        conn, publication = self._conn, self._table._publication
        schema, table = split_table(name)
        if not table:
            msg = f"{quoted(name)} is not a schema.table name"
            raise SignalError(msg)
        published = conn.execute(
            "SELECT 1 FROM pg_publication_tables WHERE pubname = %s AND schemaname = %s AND tablename = %s",
            (publication, schema, table),
        ).fetchone()
        if published is None:
            msg = f"table {quoted(name)} is not captured (not in publication {publication})"
            raise SignalError(msg)
        problem = condition_problem(condition) if condition else None
        if problem:
            msg = f"the condition for {name} {quoted(str(condition))}: {problem}"
            raise SignalError(msg)
        where = condition_sql(self._table._filters.get(name), condition)
        if where is not None:
            query = sql.SQL("EXPLAIN SELECT 1 FROM {} WHERE {}").format(sql.Identifier(schema, table), where)
            try:
                with conn.transaction():
                    conn.execute(query)
            except psycopg.OperationalError:
                raise
            except psycopg.Error as exc:
                msg = f"the condition for {name} does not work: {one_line(exc)}"
                raise SignalError(msg) from None

    def refuse(self, signal: Signal, line: str) -> None:
        """Insert ``line`` into the signal table as a ``log`` signal."""
        table = self._table
        statement = sql.SQL("INSERT INTO {} (id, type, data) VALUES (%s, 'log', %s)").format(
            sql.Identifier(table._schema, table._name)
        )
        try:
            with self._conn.transaction():
                self._conn.execute(
                    statement, (f"headwater-{secrets.token_hex(8)}", orjson.dumps({"message": line}).decode())
                )
        except psycopg.OperationalError:
            raise
        except psycopg.Error as exc:
            logger.warning(
                "source %s: could not write the refusal back to %s: %s", self.source, table.table, one_line(exc)
            )
