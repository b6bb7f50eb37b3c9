"""Ad-hoc incremental snapshots of MySQL/MariaDB tables while the binlog streams: the agent's side.

The queue, its request files and the signals' orders are :mod:`capture.incremental_queue`'s.
Each table is read in primary-key order, one chunk of :data:`CHUNK_ROWS` rows at a time, as
DBLog does, with read-only watermarks taken from the server instead of writes:

1. ``START TRANSACTION WITH CONSISTENT SNAPSHOT`` and MariaDB's ``binlog_snapshot_file`` /
   ``binlog_snapshot_position``: the binlog point ``P`` the transaction's view holds exactly
   (every transaction whose commit ends at or before ``P``, none after; MariaDB takes the view
   and the point under its commit-order lock, which ``mysqldump --single-transaction
   --master-data`` relies on too). ``P`` is both the low and the high watermark: the window
   between them is empty, so no key has to be dropped from the chunk.
2. ``SELECT`` the next chunk (``WHERE key > last key ORDER BY key LIMIT n``) inside that view.
3. The chunk waits (:class:`ChunkWindow`) until the stream reaches ``P``: it is emitted before
   the first streamed transaction whose commit ends after ``P``, or when the stream is between
   transactions at or past ``P``.

Invariants:

* The chunk's rows are emitted as ``op: r`` (``source.snapshot = "incremental"``) at sequence
  ``(P, INCREMENTAL_INDEX_BASE + i)``: after every event of a transaction committed at or before
  ``P`` (their indexes are small), before every one committed after it. In the log each key's
  chunk row sits exactly where the view's state of it belongs: it never overwrites a newer
  change, and a key deleted before ``P`` is not in the chunk, one deleted after ``P`` is
  deleted again after its row.
* The stream never passes ``P`` with the chunk not emitted: ``P`` is at or past everything the
  stream has read when the chunk is read, and the agent asks :meth:`MySqlIncremental.before` with
  every committed transaction before adding its events.
* Chunk rows read at the same point (a quiet source) take indexes past the highest the log
  holds at that point, so a restart never mistakes a later chunk for rows already stored.
* Resume point: a table's last key is saved only after the chunk's rows are durable, so after
  a crash the chunk in flight is read again at a new point (rows may be written twice, at two
  sequences: harmless, the later one is as new).

Limits: MariaDB only (MySQL has no binlog point of a consistent snapshot without ``FLUSH TABLES
WITH READ LOCK``; its tables are refused in one line); tables need a primary key that is also the
record key (a configured ``keys`` entry is refused) and not a binary one (refused too). Chunks are
read only while the stream has nothing waiting (as PostgreSQL's), so sustained traffic delays
them. A chunk's table shape is the catalog's when it is read (a table altered after the view began is
read again: ``ER_TABLE_DEF_CHANGED``); its schema record, when the shape is new to the topic, is
written with the rows, after the stream's changes up to ``P`` in their own shapes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pymysql
import pymysql.cursors

from capture.incremental_queue import IncrementalQueue, IncrementalSnapshotError, TableProgress
from capture.mysql.binlog.client import BinlogStreamError
from capture.mysql.binlog.position import BinlogPosition
from capture.mysql.catalog import describe
from capture.mysql.events import EventBuilder, event_key
from capture.mysql.settings import MySqlSource
from capture.mysql.snapshot import ENCODERS_ONLY, consistent_point, read_statement
from capture.mysql.table_plan import TablePlan
from capture.records import OutRecord, SchemaRecord
from capture.resync import DELETE_INDEX_BASE
from log.envelope import SnapshotMarker
from log.sequence import Sequence as Seq

logger = logging.getLogger(__name__)

#: Rows per chunk: one short index range scan between two reads of the stream.
CHUNK_ROWS = 1024
#: ER_TABLE_DEF_CHANGED: a table altered after the consistent snapshot began.
_TABLE_DEFINITION_CHANGED = 1412
#: Error codes from 2000 on are the client's (CR_*): the connection, not the statement, failed.
_CLIENT_ERRORS = 2000
#: Chunk rows' first ``txn_index``: past any streamed transaction's events, before a resync's deletes.
INCREMENTAL_INDEX_BASE = DELETE_INDEX_BASE >> 1


@dataclass
class ChunkWindow:
    """A chunk read at binlog point ``point``, waiting for the stream to reach it (pure: no I/O).

    ``images`` maps each row's event key to its image, in key order.
    """

    point: BinlogPosition
    plan: TablePlan
    images: dict[bytes | None, dict[str, Any]]
    last_key: list[str] | None
    last_of_table: bool

    def due_before(self, commit: BinlogPosition) -> bool:
        """True when a transaction committed at ``commit`` is newer than the view: emit the chunk first."""
        return commit > self.point

    def due_at(self, position: BinlogPosition) -> bool:
        """True when the stream, between transactions at ``position``, has read everything the view holds."""
        return position >= self.point

    def records(self, builder: EventBuilder, *, first_index: int, ts_us: int) -> list[OutRecord]:
        """The remaining rows as ``op: r`` events at ``(point, first_index + i)``."""
        commit = self.point.sequence()
        return [
            builder.read_record(
                self.plan,
                image,
                commit=commit,
                index=first_index + i,
                marker=SnapshotMarker.INCREMENTAL.value,
                ts_us=ts_us,
                file=self.point.file,
                pos=self.point.offset,
            )
            for i, image in enumerate(self.images.values())
        ]


@dataclass(frozen=True)
class ChunkRows:
    """A chunk due: its shape's schema record when that shape is new to the topic, and its events."""

    schema: SchemaRecord | None
    rows: list[OutRecord]


def first_index(point: BinlogPosition, highest: Seq | None) -> int:
    """The first chunk row index at ``point``: past every sequence the log holds at that point."""
    if highest is not None and highest.commit_lsn == point.sequence() and highest.txn_index >= INCREMENTAL_INDEX_BASE:
        return highest.txn_index + 1
    return INCREMENTAL_INDEX_BASE


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def chunk_statement(
    plan: TablePlan, source: MySqlSource, *, after: Sequence[str] | None, condition: str | None, limit: int
) -> tuple[str, list[str], list[Any]]:
    """The SELECT of the next chunk of ``plan``'s rows past key ``after``; its parameters and converters."""
    base, converters = read_statement(plan, source.modes)
    key = [_quote(n) for n in plan.key_names]
    terms: list[str] = []
    params: list[str] = []
    if after is not None:
        # (k1, k2) > (v1, v2) spelled out, so the server ranges over the primary key's index.
        ors = []
        for depth in range(len(key)):
            ors.append(" AND ".join([*(f"{k} = %s" for k in key[:depth]), f"{key[depth]} > %s"]))
            params.extend(after[: depth + 1])
        terms.append("(" + " OR ".join(f"({o})" for o in ors) + ")")
    if condition is not None:
        terms.append(f"({condition})")
    statement = base
    if terms:
        joiner = " AND " if " WHERE " in base else " WHERE "
        statement += joiner + " AND ".join(terms)
    statement += f" ORDER BY {', '.join(key)} LIMIT {int(limit)}"
    return statement, params, converters


def snapshot_problem(source: MySqlSource, tables: Sequence[str]) -> str | None:
    """Why ``tables`` cannot be snapshotted incrementally, asked of the server (None: they can)."""
    with source.address.connect() as conn, conn.cursor() as cur:
        cur.execute("SELECT VERSION()")
        if "mariadb" not in str((cur.fetchone() or ("",))[0]).lower():
            return (
                "incremental snapshots need MariaDB (a MySQL server has no binlog point of a consistent snapshot "
                "without a global read lock); use headwater source resync"
            )
        for table in tables:
            if table in source.keys:
                return f"table {table} has a configured record key; incremental snapshots chunk by the primary key"
            database, _, name = table.partition(".")
            cur.execute(
                "SELECT COUNT(*) FROM information_schema.TABLE_CONSTRAINTS WHERE TABLE_SCHEMA = %s "
                "AND TABLE_NAME = %s AND CONSTRAINT_TYPE = 'PRIMARY KEY'",
                (database, name),
            )
            row = cur.fetchone()
            if not row or not row[0]:
                return f"table {table} has no primary key (or does not exist), which incremental snapshots need"
            cur.execute(
                "SELECT c.COLUMN_NAME FROM information_schema.KEY_COLUMN_USAGE k JOIN information_schema.COLUMNS c "
                "ON c.TABLE_SCHEMA = k.TABLE_SCHEMA AND c.TABLE_NAME = k.TABLE_NAME AND c.COLUMN_NAME = k.COLUMN_NAME "
                "WHERE k.TABLE_SCHEMA = %s AND k.TABLE_NAME = %s AND k.CONSTRAINT_NAME = 'PRIMARY' "
                "AND (c.CHARACTER_SET_NAME = 'binary' OR c.DATA_TYPE IN ('binary', 'varbinary', 'tinyblob', 'blob', "
                "'mediumblob', 'longblob', 'bit'))",
                (database, name),
            )
            binary = cur.fetchone()
            if binary:
                return (
                    f"table {table} has a binary primary key column ({binary[0]}), which incremental snapshots "
                    "do not chunk"
                )
    return None


class MySqlIncremental(IncrementalQueue):
    """The MySQL agent's side of incremental snapshots (see the module docstring).

    The agent calls :meth:`read_chunk` when the stream is idle, :meth:`before` with each
    committed transaction before adding its records, :meth:`at` between transactions, and
    :meth:`flushed` after each append; :meth:`reset` when the replication connection was lost.
    """

    def __init__(
        self,
        source: MySqlSource,
        builder: EventBuilder,
        state_dir: Path,
        schema_record: Callable[[TablePlan], SchemaRecord | None],
        *,
        chunk_rows: int | None = None,
    ) -> None:
        super().__init__(state_dir)
        self._source = source
        self._builder = builder
        self._schema_record = schema_record
        self._chunk_rows = chunk_rows or CHUNK_ROWS
        self._chunk: ChunkWindow | None = None
        self.chunks_emitted = 0
        self.rows_emitted = 0

    @property
    def in_flight(self) -> bool:
        """True while a chunk waits for the stream to reach its point."""
        return self._chunk is not None

    def wants_chunk(self) -> bool:
        """True when the next chunk can be read: none in flight, the last one saved, a table queued, not paused."""
        self._take_requests(force=not self._state.tables)  # with nothing queued, a request is taken at once
        return self._chunk is None and self._staged is None and bool(self._state.tables) and not self._state.paused

    def read_chunk(self) -> None:
        """Read the next chunk of the first queued table at a new consistent point.

        A table that cannot be snapshotted is dropped from the queue with a warning.
        """
        while self.wants_chunk():
            progress = self._state.tables[0]
            try:
                self._chunk = self._read(progress)
            except pymysql.err.MySQLError as exc:
                if exc.args and exc.args[0] == _TABLE_DEFINITION_CHANGED:
                    # A DDL after the view began: the chunk is read again at a new point.
                    logger.info("incremental snapshot of %s: %s; reading the chunk again", progress.table, exc)
                    return
                if isinstance(exc, pymysql.err.OperationalError) and exc.args and exc.args[0] >= _CLIENT_ERRORS:
                    # The server is gone: the agent reconnects from its saved position, the chunk is read again.
                    msg = f"incremental snapshot of {progress.table}: the connection failed: {exc}"
                    raise BinlogStreamError(msg) from exc
                self._skip_first(exc)
            except IncrementalSnapshotError as exc:
                self._skip_first(exc)

    def _read(self, progress: TableProgress) -> ChunkWindow:
        source = self._source
        database, _, name = progress.table.partition(".")
        if not name or not source.wants(database, name):
            msg = f"source {source.name} does not capture {progress.table}"
            raise IncrementalSnapshotError(msg, source=source.name, table=progress.table)
        with source.address.connect(cursorclass=pymysql.cursors.SSCursor, conv=ENCODERS_ONLY) as conn:
            with conn.cursor(pymysql.cursors.Cursor) as cur:
                cur.execute("SELECT VERSION()")
                if "mariadb" not in str((cur.fetchone() or ("",))[0]).lower():
                    msg = (
                        f"table {progress.table}: incremental snapshots need MariaDB (a MySQL server has no binlog "
                        f"point of a consistent snapshot without a global read lock); use headwater source resync"
                    )
                    raise IncrementalSnapshotError(msg, source=source.name, table=progress.table)
            point = consistent_point(conn, source.name)
            with conn.cursor(pymysql.cursors.Cursor) as cur:
                shape = describe(cur, database, name)
            plan = self._builder.plan_of(shape)
            if plan.key_source != "primary_key":
                msg = (
                    f"table {progress.table} has no primary key as its record key ({plan.key_source}), which "
                    "incremental snapshots need for chunking"
                )
                raise IncrementalSnapshotError(msg, source=source.name, table=progress.table)
            statement, params, converters = chunk_statement(
                plan, source, after=progress.last_key, condition=progress.condition, limit=self._chunk_rows
            )
            with conn.cursor() as cur:
                cur.execute(statement, params)
                rows = cur.fetchall()
            conn.rollback()
        key_at = [plan.kept.index(i) for i in plan.key]
        images: dict[bytes | None, dict[str, Any]] = {}
        for row in rows:
            image = plan.kept_image([None if v is None else c(v) for v, c in zip(row, converters, strict=True)])
            images[event_key(image, plan)] = image
        last_key: list[str] | None = None
        if rows:
            last = [rows[-1][i] for i in key_at]
            if not all(isinstance(v, str) for v in last):
                msg = f"table {progress.table} has a binary primary key, which incremental snapshots do not chunk"
                raise IncrementalSnapshotError(msg, source=source.name, table=progress.table)
            last_key = [str(v) for v in last]
        return ChunkWindow(point.position, plan, images, last_key, len(rows) < self._chunk_rows)

    def before(self, commit: BinlogPosition, highest: Seq | None) -> ChunkRows | None:
        """The chunk when a transaction committed at ``commit`` follows its point (append it first)."""
        chunk = self._chunk
        if chunk is None or not chunk.due_before(commit):
            return None
        return self._emit(chunk, highest)

    def at(self, position: BinlogPosition, highest: Seq | None) -> ChunkRows | None:
        """The chunk when the stream, between transactions at ``position``, reached its point."""
        chunk = self._chunk
        if chunk is None or not chunk.due_at(position):
            return None
        return self._emit(chunk, highest)

    def _emit(self, chunk: ChunkWindow, highest: Seq | None) -> ChunkRows:
        # The shape's schema record now, where the rows go: a stream still in the table's older
        # shape up to the point has written its version by then.
        schema = self._schema_record(chunk.plan)
        out = chunk.records(self._builder, first_index=first_index(chunk.point, highest), ts_us=time.time_ns() // 1000)
        self._staged = (self._state.tables[0], chunk.last_key, chunk.last_of_table)
        self._chunk = None
        self.chunks_emitted += 1
        self.rows_emitted += len(out)
        return ChunkRows(schema, out)
