"""The signal table (``sources.<name>.signal_table``) of a MySQL/MariaDB source: its inserts, read from the binlog.

As Debezium's source signaling channel (the orders and their ``data``: :mod:`capture.signals`):
the table (``database.table``) has the columns ``id``, ``type`` and ``data`` and is one of the
tables the source captures, so its inserts reach the log as change events like any other
table's; a signal is such an insert (``op: c``), found in the records of a committed
transaction and carried out once they are durable in the log, before the binlog position past
them is saved. ``execute-snapshot`` tables must be captured by the source; an additional
condition is checked with ``EXPLAIN`` on the server. A refusal is written back as a ``log`` row.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterable

import orjson
import pymysql

from capture import signals, sql_condition
from capture.incremental_queue import IncrementalQueue
from capture.mysql.binlog.client import BinlogStreamError
from capture.mysql.incremental import snapshot_problem
from capture.mysql.settings import MySqlSource
from capture.records import OutRecord
from capture.signals import SIGNAL_COLUMNS, Signal, SignalError, quoted
from core.errors import one_line
from log.sequence import Sequence as Seq
from log.topics import table_topic

logger = logging.getLogger(__name__)


class SignalTableError(SignalError):
    """The configured signal table cannot be used (not captured, no such table); capture does not start."""


def _quoted_span(text: str, i: int) -> int | str | None:
    """MySQL's quoting: ``'...'`` and ``"..."`` with backslash escapes, `` `...` `` identifiers."""
    char = text[i]
    if char not in "'\"`":
        return None
    i += 1
    while i < len(text) and text[i] != char:
        i += 2 if text[i] == "\\" and char != "`" else 1
    return i if i < len(text) else f"a {char} quote is not closed"


def condition_problem(text: str) -> str | None:
    """Why ``text`` is not one SQL condition that can be put in parentheses in a ``WHERE`` (None: it is)."""
    return sql_condition.condition_problem(text, _quoted_span, comments=("--", "/*", "#"))


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


class MySqlSignalTable:
    """Finds signals in a transaction's records and carries them out (a :class:`capture.signals.SignalSource`)."""

    def __init__(self, source: MySqlSource, table: str) -> None:
        self.source = source.name
        self.table = table.replace("`", "")
        self._settings = source
        self._database, _, self._name = self.table.partition(".")
        self.topic = table_topic(source.name, self._database, self._name)
        self._found: list[Signal] = []

    def check(self) -> None:
        """Refuse a signal table that is not ``database.table``, not captured, or lacks Debezium's columns."""
        where = f"sources.{self.source}.signal_table"
        if not self._name:
            msg = f"{where}: {self.table!r} is not a database.table name"
            raise SignalTableError(msg, source=self.source)
        if not self._settings.wants(self._database, self._name):
            msg = (
                f"{where}: {self.table} is not captured by the source, so its inserts are not read from the binlog; "
                "add it to the source's tables"
            )
            raise SignalTableError(msg, source=self.source)
        with self._settings.address.connect() as conn, conn.cursor() as cur:
            cur.execute(
                "SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s",
                (self._database, self._name),
            )
            columns = {str(name).lower() for (name,) in cur.fetchall()}
        missing = [c for c in SIGNAL_COLUMNS if c not in columns]
        if missing:
            what = "does not exist" if not columns else f"has no column {missing[0]!r}"
            msg = f"{where}: {self.table} {what}; a signal table has the columns id, type and data"
            raise SignalTableError(msg, source=self.source)

    def collect(self, records: Iterable[OutRecord]) -> None:
        """Keep the signals among a transaction's records (carried out by :meth:`act` once they are durable)."""
        for record in records:
            if record.topic != self.topic or record.value is None:
                continue
            event = orjson.loads(record.value)
            after = event.get("after")
            if event.get("op") != "c" or not isinstance(after, dict):
                continue
            data = after.get("data")
            self._found.append(
                Signal(
                    str(after.get("id")),
                    str(after.get("type")),
                    data if isinstance(data, str) else None,
                    Seq(record.commit_lsn, record.txn_index),
                )
            )

    def act(self, incremental: IncrementalQueue) -> None:
        """Carry out the signals collected so far (their records are durable now)."""
        found, self._found = self._found, []
        if not found:
            return
        try:
            signals.act(found, incremental, self)
        except pymysql.err.OperationalError as exc:
            # Not carried out (capture.signals restored the position): read again after the reconnect.
            msg = f"signal table {self.table}: the connection failed: {exc}"
            raise BinlogStreamError(msg) from exc

    def reset(self) -> None:
        """Forget collected signals (their transactions are read again)."""
        self._found = []

    # -- SignalSource -------------------------------------------------------------------------

    def canonical(self, name: str) -> str:
        """``database.table`` without quotes."""
        return name.replace("`", "").strip()

    def check_table(self, name: str, condition: str | None) -> None:
        """Captured by the source, and the condition works in a ``WHERE`` on the server."""
        database, _, table = self.canonical(name).partition(".")
        if not table:
            msg = f"{quoted(name)} is not a database.table name"
            raise SignalError(msg)
        if not self._settings.wants(database, table):
            msg = f"table {quoted(name)} is not captured by source {self.source}"
            raise SignalError(msg)
        problem = snapshot_problem(self._settings, [f"{database}.{table}"])
        if problem is not None:
            raise SignalError(problem)
        if condition is None:
            return
        problem = condition_problem(condition)
        if problem:
            msg = f"the condition for {name} {quoted(condition)}: {problem}"
            raise SignalError(msg)
        try:
            with self._settings.address.connect() as conn, conn.cursor() as cur:
                # Parsed and planned, never run; a condition that is not one expression fails to parse.
                cur.execute(f"EXPLAIN SELECT 1 FROM {_quote(database)}.{_quote(table)} WHERE ({condition})")
        except pymysql.err.OperationalError as exc:
            if exc.args and exc.args[0] >= 2000:  # a client error: the server is gone
                raise
            msg = f"the condition for {name} does not work: {one_line(exc)}"
            raise SignalError(msg) from None
        except pymysql.err.MySQLError as exc:
            msg = f"the condition for {name} does not work: {one_line(exc)}"
            raise SignalError(msg) from None

    def refuse(self, signal: Signal, line: str) -> None:
        """Insert ``line`` into the signal table as a ``log`` signal."""
        statement = f"INSERT INTO {_quote(self._database)}.{_quote(self._name)} (id, type, data) VALUES (%s, 'log', %s)"
        try:
            with self._settings.address.connect() as conn, conn.cursor() as cur:
                cur.execute(statement, (f"headwater-{secrets.token_hex(8)}", orjson.dumps({"message": line}).decode()))
                conn.commit()
        except pymysql.err.MySQLError as exc:
            logger.warning(
                "source %s: could not write the refusal back to %s: %s", self.source, self.table, one_line(exc)
            )
