"""The signal table (``sources.<name>.signal_table``): rows inserted there are orders to the agent.

As Debezium's source signaling channel: the table has the columns ``id``, ``type`` and
``data`` (text; ``data`` JSON), is in the source's publication, and a signal is an insert
read from the WAL stream, so it takes effect in commit order with the changes around it,
once its transaction is in the log. Types (``data`` as Debezium's):

* ``execute-snapshot``: ``{"data-collections": ["schema.table", ...], "type": "incremental",
  "additional-conditions": [{"data-collection": "schema.table", "filter": "<SQL condition>"}]}``
  queues an incremental snapshot of those tables (:mod:`capture.postgres.snapshot.incremental`), each
  read ``WHERE`` its source filter and its additional condition hold. Table names are exact
  (Debezium also takes regular expressions); ``blocking`` snapshots are not supported.
* ``stop-snapshot``: ``{"data-collections": [...], "type": "incremental"}`` drops those tables
  (all without ``data-collections``) from the incremental snapshots queued or running.
* ``pause-snapshot`` / ``resume-snapshot``: incremental snapshots wait, or go on.
* ``log``: ``{"message": "..."}`` is written to the agent's log.

A signal that cannot be carried out (unknown type, malformed ``data``, a table that cannot be
snapshotted, a condition that does not parse) is refused in one line in the agent's log and the
same line is written back to the signal table as a ``log`` signal; capture goes on. A signal is
carried out once its transaction is in the log, before that transaction is acknowledged, and
its position is saved with the state it changes, so a transaction the slot re-sends after a
crash or a lost connection neither repeats nor loses it.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import psycopg
from psycopg import sql

from capture.errors import CaptureError
from capture.postgres.decoding.pgoutput_messages import Insert, Relation
from capture.postgres.identifiers import TableName
from capture.postgres.registration.row_filters import condition_problem, condition_sql, split_table
from capture.postgres.snapshot.incremental import IncrementalSnapshotter, SnapshotTable
from capture.postgres.streaming.transactions import Change, Transaction
from core.errors import PermanentError, one_line
from log.sequence import Sequence as Seq

logger = logging.getLogger(__name__)

#: The columns of a signal table (Debezium's).
SIGNAL_COLUMNS = ("id", "type", "data")
_MAX_QUOTED = 200


class SignalError(CaptureError, PermanentError):
    """A signal that cannot be carried out; it is refused and capture goes on."""


@dataclass(frozen=True)
class Signal:
    """One row inserted into the signal table, at its position in the source's order."""

    id: str
    type: str
    data: str | None
    sequence: Seq


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

    def act(
        self, conn: psycopg.Connection[Any], signals: Sequence[Signal], incremental: IncrementalSnapshotter
    ) -> None:
        """Carry out each signal not carried out before; refuse (log, write back) those that cannot be."""
        for signal in signals:
            if incremental.last_signal is not None and signal.sequence <= incremental.last_signal:
                continue  # carried out before a crash: the slot re-sent its transaction
            # Saved together with what the signal changes (a queued snapshot, a pause), so a crash
            # never carries out such a signal twice; a log line may be written twice.
            before = incremental.last_signal
            incremental.carrying_out(signal.sequence)
            try:
                self._carry_out(conn, signal, incremental)
            except SignalError as exc:
                self._refuse(conn, signal, str(exc))
            except BaseException:
                incremental.carrying_out(before)  # the connection was lost: carried out when sent again
                raise
            incremental.signal_done()

    def _carry_out(self, conn: psycopg.Connection[Any], signal: Signal, incremental: IncrementalSnapshotter) -> None:
        kind = signal.type
        if kind == "log":
            message = _data(signal).get("message")
            if not isinstance(message, str):
                msg = "a log signal's data needs a 'message' string"
                raise SignalError(msg)
            logger.info("source %s: signal %s: %s", self.source, signal.id, message)
        elif kind == "execute-snapshot":
            tables = self._snapshot_tables(conn, _data(signal))
            incremental.request(tables, signal.id)
            logger.info(
                "source %s: signal %s: incremental snapshot of %s queued",
                self.source,
                signal.id,
                ", ".join(t.table for t in tables),
            )
        elif kind == "stop-snapshot":
            data = _data(signal)
            _incremental_only(data)
            names = data.get("data-collections")
            stopped = incremental.stop(None if names is None else [_canonical(n) for n in _names(names)])
            logger.info("source %s: signal %s: incremental snapshot stopped (%s)", self.source, signal.id, stopped)
        elif kind in ("pause-snapshot", "resume-snapshot"):
            incremental.pause(kind == "pause-snapshot")
            logger.info("source %s: signal %s: incremental snapshots %sd", self.source, signal.id, kind[:-9])
        else:
            known = "execute-snapshot, stop-snapshot, pause-snapshot, resume-snapshot, log"
            msg = f"unknown signal type {_quoted(kind)} (known: {known})"
            raise SignalError(msg)

    def _snapshot_tables(self, conn: psycopg.Connection[Any], data: Mapping[str, Any]) -> list[SnapshotTable]:
        _incremental_only(data)
        names = _names(data.get("data-collections"))
        if not names:
            msg = "execute-snapshot needs 'data-collections', a list of schema.table names"
            raise SignalError(msg)
        conditions: dict[str, str] = {}
        extra = data.get("additional-conditions") or []
        if not isinstance(extra, list) or not all(isinstance(c, dict) for c in extra):
            msg = "'additional-conditions' must be a list of {data-collection, filter} objects"
            raise SignalError(msg)
        for entry in extra:
            table, condition = entry.get("data-collection"), entry.get("filter")
            if not isinstance(table, str) or not isinstance(condition, str) or not condition.strip():
                msg = "each additional condition needs a 'data-collection' and a non-empty 'filter'"
                raise SignalError(msg)
            if table not in names:
                msg = f"additional condition for {_quoted(table)}, which is not in 'data-collections'"
                raise SignalError(msg)
            conditions[table] = condition
        for name in names:
            self._check_table(conn, name, conditions.get(name))
        return [SnapshotTable(_canonical(name), conditions.get(name)) for name in names]

    def _check_table(self, conn: psycopg.Connection[Any], name: str, condition: str | None) -> None:
        schema, table = split_table(name)
        if not table:
            msg = f"{_quoted(name)} is not a schema.table name"
            raise SignalError(msg)
        published = conn.execute(
            "SELECT 1 FROM pg_publication_tables WHERE pubname = %s AND schemaname = %s AND tablename = %s",
            (self._publication, schema, table),
        ).fetchone()
        if published is None:
            msg = f"table {_quoted(name)} is not captured (not in publication {self._publication})"
            raise SignalError(msg)
        problem = condition_problem(condition) if condition else None
        if problem:
            msg = f"the condition for {name} {_quoted(str(condition))}: {problem}"
            raise SignalError(msg)
        where = condition_sql(self._filters.get(name), condition)
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

    def _refuse(self, conn: psycopg.Connection[Any], signal: Signal, reason: str) -> None:
        line = f"signal {_quoted(signal.id)} ({_quoted(signal.type)}) refused: {reason}"
        logger.warning("source %s: %s", self.source, line)
        statement = sql.SQL("INSERT INTO {} (id, type, data) VALUES (%s, 'log', %s)").format(
            sql.Identifier(self._schema, self._name)
        )
        try:
            with conn.transaction():
                conn.execute(statement, (f"headwater-{secrets.token_hex(8)}", orjson.dumps({"message": line}).decode()))
        except psycopg.OperationalError:
            raise
        except psycopg.Error as exc:
            logger.warning(
                "source %s: could not write the refusal back to %s: %s", self.source, self.table, one_line(exc)
            )


def _data(signal: Signal) -> dict[str, Any]:
    if signal.data is None or not signal.data.strip():
        return {}
    try:
        data = orjson.loads(signal.data)
    except orjson.JSONDecodeError:
        msg = f"its data {_quoted(signal.data)} is not JSON"
        raise SignalError(msg) from None
    if not isinstance(data, dict):
        msg = f"its data {_quoted(signal.data)} is not a JSON object"
        raise SignalError(msg)
    return data


def _names(value: object) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        msg = "'data-collections' must be a list of schema.table names"
        raise SignalError(msg)
    return list(value)


def _canonical(name: str) -> str:
    """A ``schema.table`` name (raw parts) as incremental snapshots write table names."""
    return str(TableName(*split_table(name)))


def _incremental_only(data: Mapping[str, Any]) -> None:
    kind = str(data.get("type", "incremental")).lower()
    if kind != "incremental":
        msg = f"snapshot type {_quoted(kind)} is not supported (only 'incremental')"
        raise SignalError(msg)


def _quoted(text: str) -> str:
    return repr(text if len(text) <= _MAX_QUOTED else text[:_MAX_QUOTED] + "...")
