"""The initial snapshot: every captured table read at one binlog point, without a lock, table by table.

MariaDB: ``START TRANSACTION WITH CONSISTENT SNAPSHOT`` then the status variables
``binlog_snapshot_file``/``binlog_snapshot_position``, the binlog point that transaction's view
holds exactly (every transaction committed before it, none after): no lock at all. MySQL has no
such status: there ``FLUSH TABLES WITH READ LOCK`` is held only while the transaction starts and
``SHOW MASTER STATUS`` is read (needs RELOAD; not tested here, no MySQL server can run here).

Rows are read with an unbuffered cursor and appended in chunks of :data:`CHUNK_ROWS`; each row's
sequence is the snapshot point's, so every change streamed after the point sorts after it.

Resume (``<state>/snapshot.json``): a table is done once all its rows are durable. After a crash the
tables not done are read again, whole, at a new consistent point; streaming starts at the first
point. A table read again at a later point holds that point in its partitions, so the changes
between the two points, which its new rows already show, are skipped there
(:class:`capture.position.ResumePoint`), while tables done at the first point get them.

A resync's re-snapshot (:mod:`capture.mysql.resync`) never resumes: it starts over with every
table at one point (:meth:`Snapshot.forget`), adds every key it reads to a
:class:`~capture.key_set.KeySet`, and indexes its rows past anything the log holds at that point
(the last transaction streamed before it ends exactly there, as may an interrupted resync), so
none of them is skipped as already held and the key set is that of the whole snapshot.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pymysql.converters
import pymysql.cursors

from capture.appender import Appender
from capture.key_set import KeySet
from capture.mysql.binlog.position import BinlogPosition, GtidPosition
from capture.mysql.catalog import describe
from capture.mysql.events import EventBuilder
from capture.mysql.settings import MySqlSource
from capture.mysql.state import StreamState
from capture.mysql.table_plan import TablePlan
from capture.mysql.types.text_values import Converter, text_converter
from capture.mysql.types.values import TypeModes
from capture.position import ResumePoint
from capture.records import SchemaRecord
from capture.resync import keyless_refusal, rekeyed_truncates
from core.durable_files import replace_json
from core.errors import PermanentError
from log.envelope import SnapshotMarker
from log.topics import table_topic

logger = logging.getLogger(__name__)

SNAPSHOT_FILE = "snapshot.json"
#: PyMySQL's parameter encoders without its result decoders: values arrive as the server's text.
ENCODERS_ONLY = {k: v for k, v in pymysql.converters.conversions.items() if not isinstance(k, int)}
CHUNK_ROWS = 10_000


class SnapshotError(PermanentError):
    """The snapshot cannot be taken (no binlog point, a table that cannot be read)."""


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


class Snapshot:
    """Reads the tables of ``source`` not yet done into the log (see the module docstring)."""

    def __init__(
        self,
        source: MySqlSource,
        builder: EventBuilder,
        state_dir: Path,
        schema_record: Callable[[Any], SchemaRecord | None],
    ) -> None:
        self.source = source
        self.builder = builder
        self.path = state_dir / SNAPSHOT_FILE
        self._schema_record = schema_record
        self.rows = 0

    def _load(self) -> dict[str, Any]:
        if self.path.exists():
            state: dict[str, Any] = json.loads(self.path.read_text())
            return state
        return {"stream_from": None, "done": []}

    def _save(self, state: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        replace_json(self.path, state)

    def started(self) -> bool:
        """True once a snapshot point was chosen (the snapshot may not be done yet)."""
        return self._load()["stream_from"] is not None

    def forget(self) -> None:
        """Forget the progress of an earlier snapshot: the next :meth:`run` reads every table."""
        self.path.unlink(missing_ok=True)

    def run(self, appender: Appender, resume: ResumePoint, *, keys: KeySet | None = None) -> StreamState:
        """Read every table not done; returns where streaming starts.

        With ``keys`` (a resync, after :meth:`forget`) every row's key is added to it, and rows
        are indexed after anything the log holds at the snapshot's point.
        """
        state = self._load()
        if state.get("complete") and state["stream_from"] is not None:
            return _point(state["stream_from"])
        with self.source.address.connect(cursorclass=pymysql.cursors.SSCursor, conv=ENCODERS_ONLY) as conn:
            point = consistent_point(conn, self.source.name)
            first_index = 0 if keys is None else self._past_the_log(point, resume)
            # Listed inside the snapshot's transaction: a table created before its point is listed
            # (its rows are read), one created after it is streamed from its CREATE on.
            pending = [t for t in self._tables(conn) if t not in state["done"]]
            if keys is not None:
                pending = self._resync_tables(conn, pending)
                if self._truncate_rekeyed(appender, resume, pending, point):
                    first_index = self._past_the_log(point, resume)  # the rows after the truncates
            if state["stream_from"] is None:
                state["stream_from"] = _json(point)
                self._save(state)
            for position, table in enumerate(pending):
                self._table(
                    conn,
                    table,
                    point,
                    appender,
                    resume,
                    keys=keys,
                    first_index=first_index,
                    first=position == 0,
                    last=position == len(pending) - 1,
                )
                state["done"].append(table)
                self._save(state)
            conn.commit()
        state["complete"] = True
        self._save(state)
        return _point(state["stream_from"])

    def _past_the_log(self, point: StreamState, resume: ResumePoint) -> int:
        """The first row index at ``point`` that no partition holds (a resync's rows must all be appended)."""
        highest = resume.highest()
        at = point.position.sequence()
        if highest is None or highest.commit_lsn < at:
            return 0
        if highest.commit_lsn > at:
            msg = (
                f"source {self.source.name}: the snapshot's binlog point {point.position} is before the log's last "
                "change: the server is not the one this log was captured from (restored from a backup, or its "
                "binlog reset?); capture it into a new log (another home or source name)"
            )
            raise SnapshotError(msg)
        return highest.txn_index + 1

    def _resync_tables(self, conn: Any, tables: list[str]) -> list[str]:
        """The tables a resync reads: those that exist (a listed one gone has no rows); refuses a keyless one.

        Checked before anything is appended (:func:`capture.resync.keyless_refusal` says why).
        """
        present = []
        with conn.cursor(pymysql.cursors.Cursor) as cur:
            for table in tables:
                database, _, name = table.partition(".")
                cur.execute(
                    "SELECT 1 FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s",
                    (database, name),
                )
                if not cur.fetchall():
                    continue  # dropped or renamed away: register_gone_tables deletes what its topic holds
                if not self.builder.plan_of(describe(cur, database, name)).key:
                    msg = keyless_refusal(self.source.name, table, "the binlog was not read")
                    raise SnapshotError(msg)
                present.append(table)
        return present

    def _truncate_rekeyed(self, appender: Appender, resume: ResumePoint, tables: list[str], point: StreamState) -> bool:
        """Append a truncate for each of ``tables`` whose topic holds keyless events; whether any was.

        Such a table had no key when those events were captured (:func:`capture.resync.rekeyed_truncates`).
        """
        ts_us = time.time_ns() // 1000
        file, pos = point.position.file, point.position.offset

        def value(event: dict[str, Any], commit: int, index: int) -> bytes:
            return self.builder.vanished_truncate(event, commit=commit, index=index, ts_us=ts_us, file=file, pos=pos)

        topics = [table_topic(self.source.name, *table.split(".", 1)) for table in tables]
        truncates = rekeyed_truncates(appender.log, topics, resume.highest(), value)
        for record in truncates:
            logger.warning(
                "source %s: %s: the log holds events of it from when it had no key, which deletes by key cannot "
                "remove; a truncate before its re-snapshot empties it",
                self.source.name,
                record.topic,
            )
        if truncates:
            appender.records.extend(truncates)
            appender.flush(resume, None)
        return bool(truncates)

    def _tables(self, conn: Any) -> list[str]:
        """The configured tables, then every table of the databases captured whole (by name)."""
        tables = list(self.source.tables)
        if self.source.databases:
            with conn.cursor(pymysql.cursors.Cursor) as cur:
                cur.execute(
                    "SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES WHERE TABLE_TYPE = 'BASE TABLE' "
                    f"AND TABLE_SCHEMA IN ({', '.join(['%s'] * len(self.source.databases))}) "
                    "ORDER BY TABLE_SCHEMA, TABLE_NAME",
                    self.source.databases,
                )
                found = [f"{db}.{name}" for db, name in cur.fetchall()]
            tables += [t for t in found if t not in tables]
        return tables

    def _table(
        self,
        conn: Any,
        table: str,
        point: StreamState,
        appender: Appender,
        resume: ResumePoint,
        *,
        keys: KeySet | None,
        first_index: int,
        first: bool,
        last: bool,
    ) -> None:
        database, _, name = table.partition(".")
        with conn.cursor(pymysql.cursors.Cursor) as cur:
            shape = describe(cur, database, name)
        plan = self.builder.plan_of(shape)
        record = self._schema_record(plan)
        if record is not None:
            appender.schemas.append(record)
        statement, converters = read_statement(plan, self.source.modes)
        ts_us = time.time_ns() // 1000
        index = first_index
        read: list[bytes] = []
        if keys is not None:
            keys.add(plan.topic, ())  # an empty table too: every key the log holds live for it is gone
        with conn.cursor() as cur:
            cur.execute(statement)
            chunk = cur.fetchmany(CHUNK_ROWS)
            while chunk:
                following = cur.fetchmany(CHUNK_ROWS)
                for at, row in enumerate(chunk):
                    image = plan.kept_image(
                        [None if v is None else convert(v) for v, convert in zip(row, converters, strict=True)]
                    )
                    marker = SnapshotMarker.of_row(
                        first_in_table=index == first_index,
                        last_in_table=not following and at == len(chunk) - 1,
                        first_table=first,
                        last_table=last,
                    )
                    event = self.builder.snapshot_record(
                        plan, image, point=point, index=index, marker=marker.value, ts_us=ts_us
                    )
                    appender.records.append(event)
                    if keys is not None and event.key is not None:
                        read.append(event.key)
                    index += 1
                if keys is not None:
                    # The records' own keys: encoded exactly as the log holds them (and a row the appender
                    # quarantines is still in the source, so its key is present too).
                    keys.add(plan.topic, read)
                    read.clear()
                self.rows += len(chunk)
                appender.flush(resume, None)
                chunk = following


def read_statement(plan: TablePlan, modes: TypeModes, *, ordered: bool = False) -> tuple[str, list[Converter]]:
    """The SELECT of a table's captured rows (its kept columns, its row filter) and each column's converter.

    A row's values, each through its converter, make the image :meth:`TablePlan.kept_image` writes;
    ``ordered`` sorts the rows by the record key (the server's order of it).
    """
    shape = plan.shape
    table = f"{shape.schema}.{shape.table}"
    kept = [shape.columns[i] for i in plan.kept]
    converters = [text_converter(c, modes, f"{table}.{c.name}") for c in kept]
    columns = ", ".join(_quote(c.name) for c in kept) or "1"
    # The row filter as the server evaluates it (capture evaluates streamed rows alike: row_filter).
    where = f" WHERE {plan.row_filter.condition}" if plan.row_filter is not None else ""
    order = f" ORDER BY {', '.join(_quote(n) for n in plan.key_names)}" if ordered and plan.key else ""
    return f"SELECT {columns} FROM {_quote(shape.schema)}.{_quote(shape.table)}{where}{order}", converters


def consistent_point(conn: Any, source: str) -> StreamState:
    """Start ``conn``'s consistent-snapshot transaction; returns the binlog point its view holds exactly.

    MariaDB: no lock (``binlog_snapshot_file``/``_position``); MySQL: ``FLUSH TABLES WITH READ LOCK``
    only while the transaction starts (see the module docstring). The caller reads inside it.
    """
    with conn.cursor(pymysql.cursors.Cursor) as cur:
        cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        cur.execute("SELECT VERSION()")
        mariadb = "mariadb" in str(cur.fetchone()[0]).lower()
        if mariadb:
            cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
            cur.execute("SHOW STATUS LIKE 'binlog_snapshot_%'")
            status = {str(k).lower(): str(v) for k, v in cur.fetchall()}
            position = BinlogPosition(status["binlog_snapshot_file"], int(status["binlog_snapshot_position"]))
            cur.execute("SELECT BINLOG_GTID_POS(%s, %s)", (position.file, position.offset))
            gtid = cur.fetchone()[0]
            return StreamState(position, GtidPosition.parse(str(gtid or "")))
        cur.execute("FLUSH TABLES WITH READ LOCK")
        try:
            cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
            cur.execute("SHOW MASTER STATUS")
            row = cur.fetchone()
        finally:
            cur.execute("UNLOCK TABLES")
        if row is None:
            msg = f"source {source}: the server's binary log is off: capture needs log_bin"
            raise SnapshotError(msg)
        return StreamState(BinlogPosition(str(row[0]), int(row[1])))


def _json(point: StreamState) -> dict[str, Any]:
    return point.to_json()


def _point(data: dict[str, Any]) -> StreamState:
    return StreamState.from_json(data)
