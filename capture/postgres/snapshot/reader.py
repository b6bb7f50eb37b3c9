"""The initial snapshot: every row of the published tables as ``op: r`` events.

Consistency: the slot is created with ``EXPORT_SNAPSHOT`` and readers run in
``REPEATABLE READ`` with ``SET TRANSACTION SNAPSHOT``, so they see exactly the data
before the slot's consistent point; the stream then starts at that point. The
exported snapshot lives only while the slot-creating connection stays idle, so that
connection is held, untouched, until reading ends (:mod:`capture.postgres.streaming.slot_policy`).

Speed: ``COPY (SELECT ...) TO STDOUT`` in text format (:mod:`capture.postgres.snapshot.copy_reader`; the
same text the stream sends, so one type map decodes both), split into chunks of heap
pages (:mod:`capture.postgres.snapshot.plan`). With the extension and the file log, pieces of
each COPY block are encoded into finished batches by threads and appended in order by
one more (:mod:`capture.postgres.snapshot.native_pass`, :mod:`capture.postgres.snapshot.pipeline`).

Order and markers: tables are read in the order the source lists them (``tables:``; others,
and ``schemas:`` sources, by name after them), each in heap order, and ``source.snapshot`` marks
rows as Debezium does (:meth:`log.envelope.SnapshotMarker.of_row`): the first row of the first
table, the last row of the last table, each table's first and last rows. The last row is the
last one of the table's last chunk (its open-ended tail of pages): a table whose rows all sit
before that chunk's pages gets no last-row marker; after a resume, markers already written stay.

Resume: a chunk is recorded in the state file only after its events are appended.
After a crash the slot (and its consistent point) stay; the chunks not yet done are
read with a fresh snapshot taken later. Their rows may be newer than the consistent
point, but every change after that point is streamed afterwards and sorts later, so
the latest image per key still converges to the source.

A resync (:mod:`capture.postgres.snapshot.resync`) reads every table again and then writes deletes for
the keys the log holds but the re-snapshot did not find.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from capture.appender import Appender
from capture.key_set import KeySet, key_set_path
from capture.position import ResumePoint
from capture.postgres.catalog import relation_from_catalog
from capture.postgres.decoding.pgoutput_messages import Relation
from capture.postgres.events.builder import EventBuilder
from capture.postgres.identifiers import TableName
from capture.postgres.snapshot.copy_reader import read_chunk
from capture.postgres.snapshot.copy_text import CopyRows
from capture.postgres.snapshot.pipeline import ChunkReaders, SnapshotPipeline
from capture.postgres.snapshot.plan import Chunk, SnapshotState, plan_chunks
from capture.postgres.snapshot.resync import (
    gone_tables,
    refuse_keyless,
    snapshot_keys,
    vanished_key_deletes,
    vanished_truncate,
)
from capture.postgres.streaming.connection import pinned_options
from capture.read_ahead import ReadAhead
from capture.records import OutRecord
from capture.resync import (
    DELETE_INDEX_BASE,
    append_deletes,
    keyless_event,
    rekeyed_truncates,
    unread_captured_topics,
)
from capture.source_kind import SnapshotProgress
from capture.tuples import TupleData
from log.encoded_batches import AppendsEncodedBatches
from log.envelope import SnapshotMarker
from log.sequence import Sequence as Seq
from log.topics import quarantine_topic
from native import speedups

logger = logging.getLogger(__name__)

#: Each published table: its oid, its relation and its chunks, in table order.
_Plan = list[tuple[int, Relation, list[Chunk]]]


class SnapshotReader:
    """Reads every table of the source's publication at one snapshot into the log, chunk by chunk."""

    def __init__(
        self,
        source: str,
        dsn: str,
        publication: str,
        state_dir: Path,
        appender: Appender,
        *,
        max_batch_records: int,
        progress: SnapshotProgress | None,
        table_order: tuple[TableName, ...] = (),
        filters: Mapping[str, str] | None = None,
        captured: tuple[tuple[str, ...], tuple[str, ...]] = ((), ()),
    ) -> None:
        self._source = source
        # The configured tables (schema.table) and schemas: a resync deletes the rows of those gone.
        self._captured = captured
        self._table_order = {table: position for position, table in enumerate(table_order)}
        self._filters = dict(filters or {})  # row filters by schema.table (capture.postgres.registration.row_filters)
        self._dsn = dsn
        self._publication = publication
        self._state_dir = state_dir
        self._appender = appender
        self._log = appender.log
        self._stats = appender.stats
        self._max_batch = max_batch_records
        self._progress = progress

    def read(
        self,
        builder: EventBuilder,
        resume: ResumePoint,
        state: SnapshotState,
        *,
        exported: str | None,
        reconcile: bool = False,
    ) -> None:
        """Read the chunks ``state`` does not hold as done, at snapshot ``exported`` (None: a new one).

        With ``reconcile`` (a resync) it then writes deletes for the keys the log holds live but
        the snapshot did not find.
        """
        reader = psycopg.connect(self._dsn, options=pinned_options())
        # The keys the re-snapshot reads (resync only): spilled to disk beyond a threshold.
        present = KeySet(key_set_path(self._state_dir)) if reconcile else None
        pipeline: SnapshotPipeline | None = None
        try:
            reader.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            if exported is not None:
                reader.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(exported)))
            plan, total_rows = self._plan(reader, builder)
            # Checked before anything is appended: a refusal leaves the log and the request as they are.
            gone = self._resync_tables(reader, builder, plan, present) if present is not None else []
            if present is not None:
                self._truncate_rekeyed(builder, resume, plan)
            if self._progress:
                self._progress.start(total_rows)
            consistent = state.consistent_lsn or 0
            # Per topic, where the re-snapshot's records start: the reconcile reads only what is before.
            starts = self._starts(plan, builder) if present is not None else {}
            for topic in gone:
                starts[topic] = self._appender.topics.end_offsets(topic)
            # Natively encoded batches need the file log.
            if speedups is not None and isinstance(self._log, AppendsEncodedBatches):
                pipeline = SnapshotPipeline(self._appender, builder, resume, self._progress)
            self._read_chunks(reader, builder, resume, state, plan=plan, pipeline=pipeline, exported=exported)
            if pipeline is not None:
                pipeline.drain()
            if present is not None:
                self._reconcile(builder, resume, plan, present=present, starts=starts, consistent=consistent, gone=gone)
            self._appender.flush(resume, None)
            reader.rollback()
        finally:
            if pipeline is not None:
                pipeline.close()
            reader.close()
            if present is not None:
                present.close()  # the file stays until the request is cleared
            if self._progress:
                self._progress.finish()

    def _plan(self, reader: psycopg.Connection[Any], builder: EventBuilder) -> tuple[_Plan, int]:
        """The published tables in chunks (their schema records pending) and the catalog's row estimate."""
        published = reader.execute(
            "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s ORDER BY 1, 2",
            (self._publication,),
        ).fetchall()
        listed = self._table_order
        tables = sorted(published, key=lambda row: listed.get(TableName(row[0], row[1]), len(listed)))
        plan: _Plan = []
        total_rows = 0
        for schema, table in tables:
            relation = relation_from_catalog(
                reader, f"{sql.Identifier(schema).as_string(reader)}.{sql.Identifier(table).as_string(reader)}"
            )
            schema_record = builder.relation(relation)
            if schema_record is not None:
                self._appender.schemas.append(schema_record)
            chunks = plan_chunks(reader, schema, table, relation.oid, self._filters.get(f"{schema}.{table}"))
            plan.append((relation.oid, relation, chunks))
            estimate = reader.execute("SELECT reltuples FROM pg_class WHERE oid = %s", (relation.oid,)).fetchone()
            total_rows += max(int(estimate[0]) if estimate else 0, 0)
        return plan, total_rows

    def _resync_tables(
        self, reader: psycopg.Connection[Any], builder: EventBuilder, plan: _Plan, present: KeySet
    ) -> list[str]:
        """The topics of captured tables gone at the snapshot (registered in ``present``); refuses keyless tables.

        A keyless table's events have no key, so the rows deleted while the slot was gone
        cannot be told apart: re-reading it would leave them live in the log. A captured
        table the log holds but the publication no longer lists is gone only if the
        snapshot's catalog does not have it (:func:`gone_tables`); one it has is refused.
        """
        for oid, relation, _chunks in plan:
            if not builder.relations.tables[oid].key_names:
                refuse_keyless(self._source, f"{relation.namespace}.{relation.name}")
            present.add(builder.topic_of(oid), ())
        tables, schemas = self._captured
        unread = unread_captured_topics(self._source, tables, schemas, self._log.list_topics(), present.topics())
        gone = gone_tables(reader, self._log, self._source, self._publication, unread)
        for topic in gone:
            present.add(topic, ())
        return gone

    def _truncate_rekeyed(self, builder: EventBuilder, resume: ResumePoint, plan: _Plan) -> None:
        """Before the re-snapshot's rows: a truncate for each table whose topic holds keyless events.

        Such a table had no key when those events were captured (:func:`capture.resync.rekeyed_truncates`).
        """
        ts_us = time.time_ns() // 1000

        def value(event: dict[str, Any], commit: int, index: int) -> bytes:
            return vanished_truncate(event, commit_lsn=commit, index=index, ts_us=ts_us)

        topics = [builder.topic_of(oid) for oid, _relation, _chunks in plan]
        truncates = rekeyed_truncates(self._log, topics, resume.highest(), value)
        for record in truncates:
            logger.warning(
                "source %s: %s: the log holds events of it from when it had no key, which deletes by key cannot "
                "remove; a truncate before its re-snapshot empties it",
                self._source,
                record.topic,
            )
        if truncates:
            self._appender.records.extend(truncates)
            self._appender.flush(resume, None)

    def _starts(self, plan: _Plan, builder: EventBuilder) -> dict[str, dict[int, int]]:
        # Before anything is appended: a resync's reconcile reads each topic before these offsets
        # and takes the re-snapshot's keys from after them (the agent is the topics' only writer).
        topics = self._appender.topics
        starts: dict[str, dict[int, int]] = {}
        for oid, _relation, _chunks in plan:
            topic = builder.topic_of(oid)
            starts[topic] = topics.end_offsets(topic)
            starts[quarantine_topic(topic)] = topics.end_offsets(quarantine_topic(topic))
        return starts

    def _read_chunks(
        self,
        reader: psycopg.Connection[Any],
        builder: EventBuilder,
        resume: ResumePoint,
        state: SnapshotState,
        *,
        plan: _Plan,
        pipeline: SnapshotPipeline | None,
        exported: str | None,
    ) -> None:
        appender = self._appender
        pending = appender.records
        consistent = state.consistent_lsn or 0
        readers: ChunkReaders | None = None
        ahead: ReadAhead[CopyRows] | None = None  # the next chunk, read meanwhile
        chunk_rows: Iterator[CopyRows] | None = None
        todo = [
            (table_no, oid, relation, chunk)
            for table_no, (oid, relation, chunks) in enumerate(plan)
            for chunk in chunks
            if chunk.id not in state.done_chunks
        ]
        # Tables whose first row is still to be read (their first chunk is not done).
        done = state.done_chunks
        unstarted = {table_no for table_no, (_oid, _rel, chunks) in enumerate(plan) if chunks[0].id not in done}
        try:
            if pipeline is not None and len(todo) > 1:
                readers = ChunkReaders.on_snapshot(self._dsn, reader, exported)
            for position, (table_no, oid, relation, chunk) in enumerate(todo):
                columns = [c.name for c in relation.columns]
                topic = builder.topic_of(oid)
                encoder = builder.snapshot_pieces(oid, consistent)[0] if pipeline is not None else None
                if ahead is not None and readers is not None and readers.ready(position):
                    chunk_rows, ahead = ahead, None
                else:
                    if ahead is not None:  # no second connection: the reader takes every chunk from now on
                        ahead.close()
                        ahead, readers = None, None
                    chunk_rows = read_chunk(reader, chunk, columns)
                if readers is not None and position + 1 < len(todo):
                    # The next chunk's COPY starts now on the other connection (the two take turns), so the
                    # server runs it while this one is taken; its rows are still appended after this chunk's.
                    _table, _oid, following, upcoming = todo[position + 1]
                    ahead = readers.start(position + 1, upcoming, [c.name for c in following.columns])
                if pipeline is not None and position == 0:
                    # The schemas go to the log first, from the writer thread (creating a topic costs
                    # directory fsyncs: tens of ms on a busy disk), while the first COPY runs.
                    chunk_rows = ReadAhead(chunk_rows, name="snapshot-first-chunk")
                    pipeline.append_schemas()
                # txn_index is unique per (table, chunk, row): chunks resume independently.
                next_index = (table_no << 40) | (chunk.number << 24)
                marked = MarkedRows(
                    chunk_rows,
                    first_in_table=table_no in unstarted,
                    last_chunk=chunk.number == plan[table_no][2][-1].number,
                    first_table=table_no == 0,
                    last_table=table_no == len(plan) - 1,
                )
                for rows, marker in marked:
                    # Stamped with the read time (as Debezium does): the rows belong to the snapshot's day.
                    read_us = time.time_ns() // 1000
                    text = rows if isinstance(rows, CopyRows) else None  # split-off rows may be parsed ones
                    native = pipeline is not None and encoder is not None and text is not None
                    pieces = text.native_pieces() if native and text is not None else None
                    # Right after a restart the log may hold some of these rows: the per-record check.
                    if (
                        pipeline is not None
                        and text is not None
                        and pieces is not None
                        and not resume.may_hold(consistent, next_index)
                    ):
                        if pending:  # (the schemas went to the writer first: append_schemas)
                            pipeline.drain()
                            appender.flush(resume, None)  # records built before go first
                        start = Seq(consistent, next_index)
                        next_index = pipeline.submit(topic, oid, text.data, pieces, start, ts_us=read_us, marker=marker)
                        continue
                    if pipeline is not None:
                        pipeline.drain()
                    records = builder.snapshot_records(
                        oid, rows, Seq(consistent, next_index), marker=marker, ts_us=read_us
                    )
                    next_index += len(rows)
                    pending.extend(records)
                    self._stats.events += len(records)
                    if len(pending) >= self._max_batch:
                        appender.flush(resume, None)
                    if self._progress:
                        self._progress.advance(len(rows))
                if marked.emitted:
                    unstarted.discard(table_no)
                # Every event of the chunk is durable (each append fsynced) before the chunk counts as done.
                if pipeline is not None and not pending:
                    # The writer records it after the chunk's last append, while the next chunk is read.
                    pipeline.after_appends(functools.partial(_chunk_done, state, chunk.id))
                    continue
                if pipeline is not None:
                    pipeline.drain()
                appender.flush(resume, None)
                _chunk_done(state, chunk.id)
        finally:
            for unfinished in (chunk_rows, ahead):  # after an error: their threads stop, their COPYs drain
                close = getattr(unfinished, "close", None)
                if close is not None:
                    close()
            if readers is not None:
                readers.close()

    def _reconcile(
        self,
        builder: EventBuilder,
        resume: ResumePoint,
        plan: _Plan,
        *,
        present: KeySet,
        starts: dict[str, dict[int, int]],
        consistent: int,
        gone: list[str],
    ) -> None:
        """Deletes (+ tombstones) for keys the log holds live but the re-snapshot did not find.

        A table in ``gone`` has no rows: every key its topic holds live is deleted, and one
        that holds keyless rows gets a truncate after them.
        """
        self._appender.flush(resume, None)
        quarantined: set[str] = set()
        for oid, _relation, _chunks in plan:
            topic = builder.topic_of(oid)
            # Every row the re-snapshot read is in the log now: its keys, from the log itself.
            snapshot_keys(self._log, topic, starts[topic], present)
            if self._appender.topics.end_offsets(quarantine_topic(topic)) != starts[quarantine_topic(topic)]:
                quarantined.add(topic)
        ts_us = time.time_ns() // 1000
        first_index = DELETE_INDEX_BASE
        for topic in present.topics():
            if topic in quarantined:
                # A quarantined row's key is not comparable with the log's keys: a delete
                # written for it could remove a row the source still has.
                logger.warning(
                    "source %s: %s: rows went to quarantine during the re-snapshot, so keys deleted while the "
                    "slot was gone are not reconciled for this table; fix the rows and resync again",
                    self._source,
                    topic,
                )
                continue
            deletes = vanished_key_deletes(
                self._log,
                topic,
                present,
                commit_lsn=consistent,
                first_index=first_index,
                ts_us=ts_us,
                end=starts[topic],
            )
            deleted = append_deletes(self._appender, resume, deletes, self._max_batch)
            first_index += deleted
            self._stats.events += deleted
            if deleted:
                logger.warning(
                    "source %s: %s: %d rows deleted while the slot was gone; their deletes are written",
                    self._source,
                    topic,
                    deleted,
                )
        for topic in gone:
            keyless = keyless_event(self._log, topic, starts[topic])
            if keyless is None:
                continue
            value = vanished_truncate(keyless, commit_lsn=consistent, index=first_index, ts_us=ts_us)
            self._appender.records.append(OutRecord(topic, None, value, consistent, first_index))
            self._appender.flush(resume, None)
            first_index += 1
            self._stats.events += 1
            logger.warning(
                "source %s: %s: its table is gone and had no key; a truncate empties it", self._source, topic
            )


class MarkedRows:
    """A chunk's COPY blocks as ``(rows, marker)``: the table's first and last rows split off under their markers.

    Every other row is ``true``. The first row is split off when ``first_in_table``; in the
    table's last chunk one block is held back, so its last row is known to be the table's last.
    ``emitted`` says whether a row came out (the table's first row has been read then).
    """

    def __init__(
        self, blocks: Iterable[Sequence[TupleData]], *, first_in_table: bool, last_chunk: bool, first_table: bool,
        last_table: bool,
    ) -> None:  # fmt: skip
        self._blocks = blocks
        self._first = first_in_table
        self._last_chunk = last_chunk
        self._first_table = first_table
        self._last_table = last_table
        self.emitted = False

    def __iter__(self) -> Iterator[tuple[Sequence[TupleData], SnapshotMarker]]:
        held: Sequence[TupleData] | None = None
        for rows in self._blocks:
            if not len(rows):
                continue
            if held is not None:
                yield from self._marked(held, table_ends=False)
            if self._last_chunk:
                held = rows
            else:
                yield from self._marked(rows, table_ends=False)
        if held is not None:
            yield from self._marked(held, table_ends=True)

    def _marked(
        self, rows: Sequence[TupleData], *, table_ends: bool
    ) -> Iterator[tuple[Sequence[TupleData], SnapshotMarker]]:
        self.emitted = True
        first: Sequence[TupleData] | None = None
        if self._first:
            self._first = False
            first, rows = _split_first(rows)
        last: Sequence[TupleData] | None = None
        if table_ends and len(rows):
            rows, last = _split_last(rows)
        if first is not None:
            yield first, self._marker(first_in_table=True, last_in_table=table_ends and last is None)
        if len(rows):
            yield rows, SnapshotMarker.TRUE
        if last is not None:
            yield last, self._marker(first_in_table=False, last_in_table=True)

    def _marker(self, *, first_in_table: bool, last_in_table: bool) -> SnapshotMarker:
        return SnapshotMarker.of_row(
            first_in_table=first_in_table,
            last_in_table=last_in_table,
            first_table=self._first_table,
            last_table=self._last_table,
        )


def _split_first(rows: Sequence[TupleData]) -> tuple[Sequence[TupleData], Sequence[TupleData]]:
    """(the first row, the others); COPY text stays COPY text (the native pass takes both)."""
    if isinstance(rows, CopyRows) and _plain_lines(rows.data):
        cut = rows.data.index(b"\n") + 1 if b"\n" in rows.data else len(rows.data)
        return CopyRows(rows.data[:cut]), CopyRows(rows.data[cut:])
    return list(rows[:1]), list(rows[1:])


def _split_last(rows: Sequence[TupleData]) -> tuple[Sequence[TupleData], Sequence[TupleData]]:
    """(every row but the last, the last row)."""
    if isinstance(rows, CopyRows) and _plain_lines(rows.data):
        data = rows.data
        cut = data.rfind(b"\n", 0, len(data) - 1) + 1
        return CopyRows(data[:cut]), CopyRows(data[cut:])
    return list(rows[:-1]), list(rows[-1:])


def _plain_lines(data: bytes) -> bool:
    # An empty line is no row (CopyRows counts rows so): such text is split as parsed rows.
    return not data.startswith(b"\n") and b"\n\n" not in data


def _chunk_done(state: SnapshotState, chunk_id: str) -> None:
    state.done_chunks.add(chunk_id)
    state.save()
