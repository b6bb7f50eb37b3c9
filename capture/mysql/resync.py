"""A MySQL source's resync: the request, then a re-snapshot whose deletes converge the log to the source.

A binlog purged before capture read it stops capture (:mod:`capture.mysql.agent`): the changes
in it cannot be streamed any more. ``headwater source resync NAME`` (:func:`request_resync`)
records a :class:`~capture.resync.ResyncRequest` and forgets the saved positions; the next
capture sees the request and (whatever the source's ``snapshot`` mode: the operator asked for one)

1. re-snapshots every table at one new binlog point, from scratch
   (:class:`capture.mysql.snapshot.Snapshot` with a :class:`~capture.key_set.KeySet`): each
   current row is an ``op: r`` event at the point, indexed past anything the log already holds
   there, and each key read is recorded;
2. appends, per table, a Debezium-style delete (``before``: the last image the log holds) plus a
   tombstone for every key the log still holds live that the re-snapshot did not read
   (:func:`append_vanished_key_deletes`, over :func:`capture.resync.vanished_key_deletes`): rows
   deleted while the binlog was gone. They carry the point and indexes from
   :data:`~capture.resync.DELETE_INDEX_BASE` (past the rows'), so they sort after everything in
   the log and before every change streamed after the point. A captured table gone at the point
   (dropped or renamed away: :func:`register_gone_tables`) has no rows, so every key its topic
   holds live is deleted; one that had no key gets a truncate. A captured table that exists but
   has no key (primary or configured) is refused before anything is appended
   (:meth:`capture.mysql.snapshot.Snapshot.run`): its deleted rows could not be found;
3. clears the request (and the spilled key set) once all of that is durable, then saves the
   point as the stream's start.

A run interrupted before the request is cleared starts over (a new point, an empty key set);
what it appended stays in the log as history: a key it deleted is no longer live, so it is not
deleted again, and the new run's rows and deletes are indexed past the old run's when the point
is the same. A run interrupted after the clearing streams on from the point the snapshot recorded.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pymysql

from capture.appender import Appender
from capture.key_set import KeySet
from capture.mysql.binlog.position import BinlogPosition
from capture.mysql.events import EventBuilder
from capture.mysql.settings import MySqlSource
from capture.mysql.snapshot import SNAPSHOT_FILE, SnapshotError
from capture.mysql.state import STATE_FILE, StreamState
from capture.position import ResumePoint
from capture.records import OutRecord
from capture.resync import (
    DELETE_INDEX_BASE,
    ResyncRequest,
    append_deletes,
    keyless_event,
    topic_table,
    unread_captured_topics,
    vanished_key_deletes,
)
from log.base import Log

logger = logging.getLogger(__name__)


def request_resync(state_dir: Path, reason: str, lost_from: BinlogPosition | None) -> ResyncRequest:
    """Record a resync request, then forget the saved positions (the request first: a crash between still resyncs)."""
    request = ResyncRequest.new(state_dir, reason, lost_from)
    request.save()
    for name in (STATE_FILE, SNAPSHOT_FILE):
        (state_dir / name).unlink(missing_ok=True)
    return request


def register_gone_tables(source: MySqlSource, topics: Iterable[str], keys: KeySet) -> list[str]:
    """Register in ``keys``, with no keys, every captured table's topic the re-snapshot did not read; returns them.

    A captured table not there at the re-snapshot's point was dropped or renamed away while
    the binlog was not read (a renamed table's rows are read under its new name, as a table
    captured whole); :func:`confirm_gone` checks it.
    """
    gone = unread_captured_topics(source.name, source.tables, source.databases, topics, keys.topics())
    for topic in gone:
        keys.add(topic, ())
    return gone


#: ER_NO_SUCH_TABLE: the one answer that says a table is gone (not merely hidden from the capture user).
_NO_SUCH_TABLE = 1146


def confirm_gone(conn: Any, source: MySqlSource, log: Log, gone: Iterable[str]) -> None:
    """Refuse in one line unless the table of every topic in ``gone`` really does not exist.

    ``information_schema`` lists only the tables the capture user may see, so a table it lost
    its privileges on looks dropped there; deleting its rows would be silently wrong. A
    ``SELECT`` of no rows tells them apart: the server answers ``ER_NO_SUCH_TABLE`` only for a
    table that is not there (a missing privilege is ``ER_TABLEACCESS_DENIED`` or
    ``ER_DBACCESS_DENIED``, whether the table exists or not). The table's names are its
    events' (:func:`capture.resync.topic_table`); a topic with none holds no live key.
    """
    for topic in gone:
        names = topic_table(log, topic, "db")
        if names is None:
            continue
        database, name = names
        quoted = ".".join("`" + part.replace("`", "``") + "`" for part in names)
        try:
            with conn.cursor() as cur:
                cur.execute(f"SELECT 1 FROM {quoted} LIMIT 0")
                cur.fetchall()
        except pymysql.MySQLError as exc:
            code = exc.args[0] if exc.args else None
            if code == _NO_SUCH_TABLE:
                continue
            why = f"the server answered {code}: {exc.args[1] if len(exc.args) > 1 else exc}"
        else:
            why = "it exists but the re-snapshot did not read it"
        msg = (
            f"source {source.name}: the log holds table {database}.{name} but the resync cannot tell whether it "
            f"was dropped ({why}); grant the capture user SELECT on it, or drop it from the source's tables, "
            f"then run 'headwater capture {source.name}' again (the resync stays requested)"
        )
        raise SnapshotError(msg)


def append_vanished_key_deletes(
    appender: Appender,
    resume: ResumePoint,
    builder: EventBuilder,
    keys: KeySet,
    point: StreamState,
    *,
    ends: Mapping[str, Mapping[int, int]],
    gone: Iterable[str] = (),
    batch_records: int,
) -> int:
    """Append deletes (+ tombstones) at ``point`` for keys the log holds live but the re-snapshot did not read.

    ``keys`` holds the re-snapshot's keys per table topic (every table it read, empty ones
    too); ``ends`` the topics' end offsets before it appended anything (its own records are
    present keys' reads, so they are not read again); ``gone`` the topics of tables gone at the
    point (:func:`register_gone_tables`): one that holds a keyless table's rows also gets a
    truncate. Returns how many events were written.
    """
    appender.flush(resume, None)  # every row of the re-snapshot first
    commit = point.position.sequence()
    highest = resume.highest()
    # Past the rows, and past an interrupted resync's deletes at the same point (never skipped as held).
    first_index = DELETE_INDEX_BASE
    if highest is not None and highest.commit_lsn == commit:
        first_index = max(first_index, highest.txn_index + 1)
    ts_us = time.time_ns() // 1000
    total = 0

    def delete_value(event: dict[str, Any], index: int) -> bytes:
        file, pos = point.position.file, point.position.offset
        return builder.vanished_delete(event, commit=commit, index=index, ts_us=ts_us, file=file, pos=pos)

    for topic in keys.topics():
        deletes = vanished_key_deletes(
            appender.log, topic, keys, delete_value, commit_lsn=commit, first_index=first_index, end=ends.get(topic, {})
        )
        deleted = append_deletes(appender, resume, deletes, batch_records)
        first_index += deleted
        total += deleted
        if deleted:
            logger.warning(
                "source %s: %s: %d rows were deleted while the binlog was not read; their deletes are written",
                builder.source,
                topic,
                deleted,
            )
    for topic in gone:
        # A keyless table's rows have no key to delete them by: a truncate after its deletes empties it.
        keyless = keyless_event(appender.log, topic, ends.get(topic, {}))
        if keyless is not None:
            value = builder.vanished_truncate(
                keyless,
                commit=commit,
                index=first_index,
                ts_us=ts_us,
                file=point.position.file,
                pos=point.position.offset,
            )
            appender.records.append(OutRecord(topic, None, value, commit, first_index))
            appender.flush(resume, None)
            first_index += 1
            total += 1
            logger.warning(
                "source %s: %s: its table is gone and had no key; a truncate empties it", builder.source, topic
            )
    return total
