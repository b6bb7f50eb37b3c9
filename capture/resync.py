"""A re-snapshot that converges the log to its source: the request, and deletes for the keys gone meanwhile.

When capture can no longer stream what changed since the log's last event (PostgreSQL:
its slot is gone; MySQL: the binlog was purged), ``headwater source resync NAME``
records a :class:`ResyncRequest` in the source's capture state directory, and the
next capture re-reads every table. Re-reading alone would leave the rows deleted
meanwhile live in the log (and in every table downstream), so the kind's re-snapshot
also records every key it read in a :class:`~capture.key_set.KeySet`, and
:func:`vanished_key_deletes` yields a delete event plus tombstone for each key the
log still holds live that it did not read. The kind builds each delete's value (its
own ``source`` block) from the key's last event in the log; the deletes carry the
re-snapshot's point and indexes above its rows', so they sort after everything in the
log and before every change streamed after the point.

The request (and the spilled key set with it) is cleared only after the snapshot and
the deletes are durable; a run interrupted before that starts the re-snapshot over
with an empty key set, so the key set is always that of one whole snapshot.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from capture.appender import Appender
from capture.key_set import Candidates, KeySet, Latest, remove_key_set
from capture.position import ResumePoint
from capture.records import OutRecord
from core.durable_files import replace_json
from log.base import Log, end_offsets
from log.columns import ColumnarReads
from log.envelope import Op
from log.position import Position
from log.reading import read_range_columns
from log.sequence import Sequence
from log.table_schemas import read_schema_records, schema_key
from log.topics import is_quarantine_topic, table_topic

REQUEST_FILE = "resync.json"
#: ``txn_index`` of the first reconciling delete: above every snapshot row's index
#: (PostgreSQL: ``table << 40 | chunk << 24 | row``), so deletes sort after the re-snapshot's rows.
DELETE_INDEX_BASE = 1 << 62

#: Builds a reconciling delete's value from the key's last live event (decoded) and the delete's ``txn_index``.
DeleteValue = Callable[[dict[str, Any], int], bytes]


@dataclass
class ResyncRequest:
    """A pending re-snapshot of one source, stored as JSON in its capture state directory."""

    path: Path
    reason: str
    requested_at_ms: int
    #: The last position capture had saved or acknowledged (what was lost after it), if known.
    lost_from: str | None = None
    #: The ordinal of the point the re-snapshot reads at, once it started.
    consistent_lsn: int | None = None

    @classmethod
    def new(cls, state_dir: Path, reason: str, lost_from: Position | None = None) -> ResyncRequest:
        """A request not started yet."""
        return cls(state_dir / REQUEST_FILE, reason, int(time.time() * 1000), str(lost_from) if lost_from else None)

    @classmethod
    def load(cls, state_dir: Path) -> ResyncRequest | None:
        """The pending request, or None."""
        path = state_dir / REQUEST_FILE
        if not path.exists():
            return None
        data = json.loads(path.read_text())
        return cls(path, data["reason"], data["requested_at_ms"], data.get("lost_from"), data.get("consistent_lsn"))

    def save(self) -> None:
        """Write atomically and durably (:func:`core.durable_files.replace_json`)."""
        body = {
            "reason": self.reason,
            "requested_at_ms": self.requested_at_ms,
            "lost_from": self.lost_from,
            "consistent_lsn": self.consistent_lsn,
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        replace_json(self.path, body)

    def clear(self) -> None:
        """The re-snapshot is durable: forget the request and its spilled key set."""
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        remove_key_set(self.path.parent)


def vanished_key_deletes(
    log: Log,
    topic: str,
    present: KeySet,
    delete_value: DeleteValue,
    *,
    commit_lsn: int,
    first_index: int,
    end: Mapping[int, int] | None = None,
) -> Generator[OutRecord, None, None]:
    """Delete events (each followed by a tombstone) for keys live in ``topic`` but not in ``present``.

    A key is live when its latest event (by ``(commit_lsn, txn_index)``) is an insert,
    update or snapshot read after the topic's last truncate. ``present`` holds the keys
    the re-snapshot read (encoded exactly as the log's keys), in memory or spilled to
    disk; only keys missing from it are decoded (their last record of each read), and of
    those only the ones whose latest event so far is live are held, as raw values
    (:class:`~capture.key_set.Candidates`, spilled to ``present``'s file beyond a
    threshold), so neither the table's size nor its delete history bounds the memory.

    The deletes carry the re-snapshot's point ``commit_lsn`` and indexes from
    ``first_index``, in key order; ``delete_value`` builds each one's value from the
    key's last event (its ``before`` is that event's ``after``). They are generated once
    the whole topic was read, so the caller may append them while iterating. With
    ``end`` (the partitions' end offsets before the re-snapshot appended anything; a
    partition not in it: 0) the re-snapshot's own records after it are not read: each is
    a present key's read event, which changes nothing here.
    """
    if topic not in log.list_topics():
        return
    candidates = Candidates(present)
    try:
        truncated_at: tuple[int, int] | None = None
        for partition in range(log.describe_topic(topic).partitions):
            stop = None if end is None else end.get(partition, 0)
            for keys, values in _keys_and_values(log, topic, partition, stop):
                found = present.present(topic, [key for key in keys if key is not None])
                # A key lives in one partition, in sequence order, so only a missing key's last
                # record in the batch counts (a tombstone: deleted) and only that one is decoded.
                last: dict[bytes, bytes | None] = {}
                for key, value in zip(keys, values, strict=True):
                    if key is None:
                        if value is not None:  # truncates are keyless
                            event = orjson.loads(value)
                            if event.get("op") == Op.TRUNCATE:
                                at = _sequence(event)
                                truncated_at = at if truncated_at is None else max(truncated_at, at)
                    elif key not in found:
                        last[key] = value
                changes: dict[bytes, Latest | None] = {}
                for key, value in last.items():
                    if value is None:
                        changes[key] = None
                        continue
                    event = orjson.loads(value)
                    # (Every kind writes truncates keyless.)
                    live = event.get("op") not in (Op.DELETE, Op.TRUNCATE)
                    changes[key] = (*_sequence(event), value) if live else None
                candidates.update(changes)
        index = first_index
        # Events before the last truncate are not live: the truncate removed their rows.
        for key, value in candidates.live(truncated_at):
            deleted = delete_value(orjson.loads(value), index)
            yield OutRecord(topic, key, deleted, commit_lsn, index)
            yield OutRecord(topic, key, None, commit_lsn, index)
            index += 1
    finally:
        candidates.close()


def unread_captured_topics(
    source: str, tables: Iterable[str], namespaces: Iterable[str], topics: Iterable[str], read: Iterable[str]
) -> list[str]:
    """The topics in ``topics`` of tables the source captures that the re-snapshot did not read (``read``).

    Captured: listed in ``tables`` (``namespace.table``) or in a namespace of ``namespaces``.
    Each is a candidate for a table gone at the re-snapshot's point, which the kind confirms
    before deleting its keys. Topics of tables no longer captured are left alone: the source
    says nothing about them.
    """
    listed = {table_topic(source, *table.split(".", 1)) for table in tables if "." in table}
    prefixes = tuple(table_topic(source, namespace, "") for namespace in namespaces)
    done = set(read)
    return [
        topic
        for topic in topics
        if topic not in done
        and not is_quarantine_topic(topic)
        and (topic in listed or (prefixes and topic.startswith(prefixes)))
    ]


def keyless_refusal(source: str, table: str, gap: str) -> str:
    """The one line refusing a resync of a keyless table that still exists; ``gap`` says what was not read.

    A keyless table's events have no key, so the rows deleted during the gap cannot be told
    apart: re-reading it would leave them live in the log (and add every row again).
    """
    return (
        f"source {source}: table {table} has no primary key and no configured key, so a resync cannot tell which "
        f"of its rows were deleted while {gap}; give it a primary key or set "
        f"sources.{source}.keys: {{{table}: [column, ...]}} in the config, then run "
        f"'headwater capture {source}' again (the resync stays requested)"
    )


def topic_table(log: Log, topic: str, namespace_field: str) -> tuple[str, str] | None:
    """The ``(namespace, table)`` a table topic's row events name, or None when it holds none.

    A topic's name is made Kafka-safe (:func:`log.topics.table_topic`), so the table's own
    names are taken from an event's ``source`` block (``namespace_field``: PostgreSQL's
    ``schema``, MySQL's ``db``). A topic with no row event holds no live key either.
    """
    for partition in range(log.describe_topic(topic).partitions):
        offset, stop = log.beginning_offset(topic, partition), log.end_offset(topic, partition)
        while offset < stop and (records := log.read(topic, partition, offset)):
            for record in records:
                if record.value is None:
                    continue
                source = orjson.loads(record.value).get("source") or {}
                if namespace_field in source and "table" in source:
                    return str(source[namespace_field]), str(source["table"])
            offset = records[-1].offset + 1
    return None


def keyless_event(log: Log, topic: str, end: Mapping[int, int]) -> dict[str, Any] | None:
    """The first keyless row event ``topic`` holds before ``end`` (a keyless table's), or None."""
    for partition, stop in end.items():
        offset = log.beginning_offset(topic, partition)
        while offset < stop and (records := log.read(topic, partition, offset)):
            for record in records:
                if record.offset >= stop:
                    return None
                if record.key is None and record.value is not None:
                    event = orjson.loads(record.value)
                    if event.get("op") != Op.TRUNCATE and event.get("source"):
                        return dict(event)
            offset = records[-1].offset + 1
    return None


#: Builds a truncate's value from an event of the table (decoded) and the truncate's sequence.
TruncateValue = Callable[[dict[str, Any], int, int], bytes]


def rekeyed_truncates(
    log: Log, topics: Iterable[str], highest: Sequence | None, truncate_value: TruncateValue
) -> list[OutRecord]:
    """Truncates for the ``topics`` (tables that have a key now) that hold a keyless row event.

    A table captured without a key (before ``keys`` gave it one, say to let a refused resync
    go on) has keyless events in its topic; deletes by key cannot remove those rows, so the
    re-snapshot's rows must follow a truncate of the table. Each truncate sorts right after
    everything in the log (``highest``, the highest sequence stored: index + 1, + 2, ...), so
    before the re-snapshot's rows (at its point, after ``highest``; a kind whose rows may share
    ``highest``'s point indexes them past these). Only topics whose schema history has a
    keyless version are read, up to their first keyless row event.
    """
    if highest is None:
        return []
    histories = read_schema_records(log, list(topics))
    existing = set(log.list_topics())
    records = []
    index = highest.txn_index + 1
    for topic, versions in histories.items():
        if topic not in existing or not any(schema_key(version) == () for version in versions):
            continue
        event = keyless_event(log, topic, end_offsets(log, topic))
        if event is not None:
            records.append(
                OutRecord(topic, None, truncate_value(event, highest.commit_lsn, index), highest.commit_lsn, index)
            )
            index += 1
    return records


def append_deletes(
    appender: Appender, resume: ResumePoint, deletes: Generator[OutRecord, None, None], batch: int
) -> int:
    """Append ``deletes`` (:func:`vanished_key_deletes`) as they are generated; how many keys they deleted.

    A mass delete is never held whole: the pending records are appended once ``batch`` are
    pending, always right after a tombstone, so each delete shares its tombstone's atomic append.
    Everything is appended when this returns.
    """
    pending = appender.records
    deleted = 0
    with contextlib.closing(deletes):
        for record in deletes:
            pending.append(record)
            if record.value is None:
                deleted += 1
                if len(pending) >= batch:
                    appender.flush(resume, None)
    appender.flush(resume, None)
    return deleted


def _keys_and_values(
    log: Log, topic: str, partition: int, stop: int | None
) -> Iterator[tuple[list[bytes | None], list[bytes | None]]]:
    """Keys and values of a partition's records from its beginning up to ``stop`` (None: its end), a read at a time."""
    offset = log.beginning_offset(topic, partition)
    if isinstance(log, ColumnarReads):  # the columnar read: no record object per record
        until = log.end_offset(topic, partition) if stop is None else stop
        for columns in read_range_columns(log, topic, partition, offset, until):
            yield columns.keys.to_pylist(), columns.values.to_pylist()
        return
    while (stop is None or offset < stop) and (records := log.read(topic, partition, offset)):
        if stop is not None and records[-1].offset >= stop:
            records = [r for r in records if r.offset < stop]
            if not records:
                return
        yield [r.key for r in records], [r.value for r in records]
        offset = records[-1].offset + 1


def _sequence(event: dict[str, Any]) -> tuple[int, int]:
    source = event.get("source") or {}
    return int(source.get("commit_lsn", 0)), int(source.get("txn_index", 0))
