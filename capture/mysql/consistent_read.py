"""One captured table read at a consistent binlog point, as the events capture writes (:mod:`capture.consistent_read`).

The view is the initial snapshot's (:func:`capture.mysql.snapshot.consistent_point`: on MariaDB
``START TRANSACTION WITH CONSISTENT SNAPSHOT`` and ``binlog_snapshot_file``/``_position``, no
lock). A transaction's sequence is the end of its commit event
(:class:`capture.mysql.streaming.transactions.Transaction`), so the view holds exactly the changes
whose ``commit_lsn`` is at or below the point's :meth:`BinlogPosition.sequence`.

Rows are read as the snapshot reads them (:func:`capture.mysql.snapshot.read_statement`: kept
columns, the row filter, the same text converters) through the source's table plan (masks, key),
and become the values of ``op: "r"`` events built by the capture's own :class:`EventBuilder`,
ordered by the record key and streamed from an unbuffered cursor.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pymysql.cursors

from capture.errors import CaptureError
from capture.mysql.catalog import describe
from capture.mysql.events import EventBuilder
from capture.mysql.settings import MySqlSource
from capture.mysql.snapshot import ENCODERS_ONLY, consistent_point, read_statement
from capture.mysql.state import StreamState
from capture.mysql.table_plan import TablePlan, planner_of
from capture.mysql.types.charsets import server_charsets
from core.errors import PermanentError


class TableNotFoundError(CaptureError, PermanentError):
    """The topic's source table is not in the server (dropped or renamed since it was captured)."""


class MySqlConsistentRead:
    """A table of ``source`` inside one consistent snapshot transaction (a context manager)."""

    def __init__(self, source: MySqlSource, topic: str) -> None:
        self._source = source
        self._topic = topic
        self._conn: Any = None
        self._plan: TablePlan | None = None
        self._point: StreamState | None = None
        self.point = 0
        self.label = ""
        self.table = ""

    def __enter__(self) -> MySqlConsistentRead:
        self._conn = self._source.address.connect(cursorclass=pymysql.cursors.SSCursor, conv=ENCODERS_ONLY)
        try:
            charsets = server_charsets(self._conn)
            self._point = consistent_point(self._conn, self._source.name)
            database, name = self._table()
            with self._conn.cursor(pymysql.cursors.Cursor) as cur:
                shape = describe(cur, database, name)
            self._plan = planner_of(self._source, lambda: charsets).plan(shape)
        except BaseException:
            self._conn.close()
            raise
        self.point = self._point.position.sequence()
        self.label = str(self._point.position)
        self.table = f"{database}.{name}"
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._conn.rollback()
        finally:
            self._conn.close()

    def _table(self) -> tuple[str, str]:
        """The captured table whose topic is ``self._topic`` (its name read inside the view)."""
        prefix = f"{self._source.name}."
        wanted = self._topic.removeprefix(prefix)
        with self._conn.cursor(pymysql.cursors.Cursor) as cur:
            cur.execute(
                "SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES "
                "WHERE TABLE_TYPE = 'BASE TABLE' AND CONCAT(TABLE_SCHEMA, '.', TABLE_NAME) = %s",
                (wanted,),
            )
            found = [(str(db), str(name)) for db, name in cur.fetchall() if self._source.wants(str(db), str(name))]
        if not self._topic.startswith(prefix) or not found:
            msg = f"source {self._source.name} has no captured table {wanted!r} (topic {self._topic}) now"
            raise TableNotFoundError(msg, source=self._source.name)
        return found[0]

    def values(self, chunk_rows: int) -> Iterator[list[bytes]]:
        """The rows' ``op: "r"`` event values in record-key order, ``chunk_rows`` at a time."""
        plan, point = self._plan, self._point
        assert plan is not None and point is not None, "read inside the context"
        builder = EventBuilder(self._source.name, lambda _shape: plan, self._source.wants)
        statement, converters = read_statement(plan, self._source.modes, ordered=True)
        ts_us = time.time_ns() // 1000
        index = 0
        with self._conn.cursor() as cur:
            cur.execute(statement)
            while chunk := cur.fetchmany(chunk_rows):
                values: list[bytes] = []
                for row in chunk:
                    image = plan.kept_image(
                        [None if v is None else convert(v) for v, convert in zip(row, converters, strict=True)]
                    )
                    record = builder.snapshot_record(plan, image, point=point, index=index, marker="false", ts_us=ts_us)
                    assert record.value is not None
                    values.append(record.value)
                    index += 1
                yield values
