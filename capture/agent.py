"""The capture agent: one source's replication stream into the log, nothing lost or doubled.

Loop: frames → pgoutput messages → committed transactions → events → one atomic
append per (topic, partition) → acknowledge the transaction's end LSN to Postgres.

Resume points and invariants:

* The flush LSN reported to Postgres is the end LSN of the last transaction whose
  events were all appended (fsynced), so a restart resumes at or before it.
* On restart, :class:`capture.position.ResumePoint` skips events the log already
  holds, so a transaction re-sent after a crash between two appends is written once.
* ``--until-caught-up`` emits a non-transactional marker message at start; receiving
  it means every transaction committed before start has been received (and the run
  goes on until the incremental snapshots queued by then are done).
* Incremental snapshots (:mod:`capture.incremental_snapshot`) read chunks between
  watermark messages; their rows join the pending records at the HIGH watermark's
  transaction, and their progress is saved only after an append.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import gc
import logging
import secrets
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Protocol, cast

import orjson
import psycopg
from psycopg import sql

from capture.catalog import primary_key_lookup, relation_from_catalog, typemap_decoders
from capture.errors import SlotError
from capture.events import INTERNAL_MESSAGE_PREFIX, EventBuilder, OutRecord, RowDecoderFactory, SchemaRecord
from capture.incremental_snapshot import IncrementalSnapshotter
from capture.key_set import KeySet, key_set_path
from capture.pgoutput import PgoutputDecoder
from capture.pgoutput_messages import LogicalMessage, Relation
from capture.position import ResumePoint, read_between
from capture.quarantine import append_or_quarantine
from capture.resync import DELETE_INDEX_BASE, ResyncRequest, snapshot_keys, vanished_key_deletes
from capture.slot import SlotStatus, create_slot, drop_slot, is_gone, slot_gone_error, slot_status
from capture.snapshot import (
    ENCODE_THREADS,
    Chunk,
    CopyRows,
    EncodedPiece,
    PartitionBatch,
    ReadAhead,
    SnapshotState,
    encode_piece,
    plan_chunks,
    read_chunk,
)
from capture.stream import (
    ReplicationLostError,
    ReplicationStream,
    StreamOptions,
    WalMessage,
    libpq_speedups,
    pinned_options,
)
from capture.transactions import Transaction, TransactionAssembler
from core.config import LogConfig, SourceConfig
from core.errors import one_line
from log.base import AppendsEncodedBatches, Log, Record, TopicPartition, TopicSpec, append_keyed, end_offsets
from log.errors import LogUnavailableError, UnknownTopicError
from log.file.batch_codec import Compression
from log.partitioner import partition_for
from log.sequence import Lsn
from log.sequence import Sequence as Seq
from log.table_schemas import latest_schemas, schema_key
from log.topics import SCHEMAS_TOPIC, is_quarantine_topic, quarantine_topic
from native import speedups

logger = logging.getLogger(__name__)

# typemap_decoders: the agent's row decoders, built where the agent is (runner, tests).
__all__ = ["AgentSettings", "CaptureAgent", "CaptureStats", "SnapshotProgress", "typemap_decoders"]


class SnapshotProgress(Protocol):
    """Receives snapshot progress (the CLI shows a rich progress bar)."""

    def start(self, total_rows: int) -> None:
        """Reading starts; ``total_rows`` is the catalog's estimate."""

    def advance(self, rows: int) -> None:
        """``rows`` more rows were read."""

    def finish(self) -> None:
        """Reading ended."""


CAUGHT_UP_PREFIX = f"{INTERNAL_MESSAGE_PREFIX}caught_up"
HEARTBEAT_PREFIX = f"{INTERNAL_MESSAGE_PREFIX}heartbeat"
#: In the state directory once the source has streamed from its slot: a slot missing
#: after that was dropped, and its changes cannot be streamed any more.
STREAMED_MARKER = "streamed.json"


def resume_lsn(resume: ResumePoint) -> Lsn | None:
    """The commit LSN of the last change the log holds for the source (None: none yet)."""
    highest = resume.highest()
    return Lsn(highest.commit_lsn) if highest is not None else None


class RetryReport:
    """Logs a retry loop's state changes: one line when a new error shows, one when it recovers.

    Each line names the source; the same error repeating (the server is still down)
    stays quiet. Messages come from :class:`ReplicationLostError`, whose text is
    scrubbed of DSN passwords.
    """

    def __init__(self, source: str) -> None:
        self.source = source
        self._last: str | None = None
        self._since = 0.0
        self._attempts = 0

    def failed(self, detail: str, max_delay_s: float) -> None:
        """One attempt failed with ``detail``."""
        if self._attempts == 0:
            self._since = time.monotonic()
        self._attempts += 1
        detail = detail.removesuffix("; reconnecting")
        if detail != self._last:
            self._last = detail
            logger.warning("source %s: %s; retrying with backoff (at most %gs apart)", self.source, detail, max_delay_s)

    def resumed(self) -> None:
        """An attempt worked."""
        if self._attempts:
            logger.warning(
                "source %s: replication resumed after %d failed attempts in %.1fs",
                self.source,
                self._attempts,
                time.monotonic() - self._since,
            )
        self._attempts = 0
        self._last = None


@dataclass
class CaptureStats:
    """Counters for progress display and tests."""

    transactions: int = 0
    events: int = 0
    records_written: int = 0
    records_skipped: int = 0
    acked_lsn: Lsn = field(default_factory=lambda: Lsn(0))
    reconnects: int = 0


@dataclass(frozen=True)
class AgentSettings:
    """Batching and timing of the agent loop."""

    max_batch_records: int = 20_000
    poll_timeout_s: float = 0.2
    reconnect_backoff_s: tuple[float, ...] = (0.2, 0.5, 1.0, 2.0, 5.0)
    #: How often appends are retried while the log cannot be written (disk full).
    log_retry_s: float = 1.0


class CaptureAgent:
    """Streams one registered source into the log (see the module docstring)."""

    def __init__(
        self,
        name: str,
        source: SourceConfig,
        log: Log,
        log_config: LogConfig,
        decoder_for: Callable[[psycopg.Connection[Any]], RowDecoderFactory],
        *,
        state_dir: Path,
        settings: AgentSettings | None = None,
        progress: SnapshotProgress | None = None,
    ) -> None:
        self.name = name
        self.state_dir = state_dir
        self.progress = progress
        self.source = source
        self.log = log
        self.log_config = log_config
        self.settings = settings or AgentSettings()
        self.stats = CaptureStats()
        self._make_decoder_factory = decoder_for
        self._stop = threading.Event()
        self._partition_counts: dict[str, int] = {}
        self._pending: list[OutRecord] = []
        # Snapshot batches encoded natively (file log only): appended before ``_pending``.
        self._pending_batches: list[tuple[str, PartitionBatch]] = []
        # While a native snapshot runs: threads appending pending batches of distinct partitions together.
        self._batch_appenders: ThreadPoolExecutor | None = None
        self._pending_schemas: list[SchemaRecord] = []
        self._pending_end: Lsn | None = None
        self._pending_since = 0.0
        self._dsn = source.dsn.get_secret_value()
        self.slot = source.slot or f"headwater_{name}"
        self.publication = source.publication or f"headwater_{name}"
        self.incremental = IncrementalSnapshotter(
            state_dir,
            self.publication,
            relation_from_catalog=relation_from_catalog,
            primary_key_of=lambda conn, relation: primary_key_lookup(conn)(relation),
        )
        self._caught_up = False  # the caught-up marker was seen; waiting for incremental snapshots
        self._retry = RetryReport(name)

    # -- control -----------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the loop to finish the current batch, acknowledge it and return."""
        self._stop.set()

    def install_signal_handlers(self) -> None:
        """SIGINT/SIGTERM stop the agent cleanly (current batch appended and acknowledged)."""

        def handle(_signum: int, _frame: FrameType | None) -> None:
            self.stop()

        signal.signal(signal.SIGINT, handle)
        signal.signal(signal.SIGTERM, handle)

    # -- main loop ---------------------------------------------------------------------

    def run(self, *, until_caught_up: bool) -> CaptureStats:
        """Stream until stopped, or until everything committed before the call is in the log.

        A lost connection (walsender ended, server restarting) is retried with backoff;
        a slot that is gone ends the run with :class:`SlotGoneError`.
        """
        try:
            sql_conn = self._connect_sql()
        except (ReplicationLostError, psycopg.ProgrammingError):
            # Never connected: a bad DSN, password or host is an operator's error, not a lost
            # connection. Say which in the words `source add` uses (one line, password masked).
            from capture.registration import connect

            connect(self._dsn, source=self.name).close()
            raise
        collector = gc.get_threshold()
        # Each change allocates a few short-lived objects while a batch of records lives until its
        # append; collecting the young generation less often takes ~25% off the CPU per change.
        gc.set_threshold(max(collector[0], 10_000), *collector[1:])
        try:
            builder = self._new_builder(sql_conn)
            resume = ResumePoint.load(self.log, self._source_topics())
            if not self._prepare_slot_and_snapshot(sql_conn, builder, resume):
                return self.stats
            marker = self._emit_marker(sql_conn, CAUGHT_UP_PREFIX) if until_caught_up else None
            failures = 0
            reconnect = False
            while not self._stop.is_set():
                acked_before = self.stats.acked_lsn
                try:
                    if reconnect:
                        sql_conn = self._reconnect_sql(sql_conn)
                        self._check_slot(sql_conn, resume)
                        builder = self._new_builder(sql_conn)
                        resume = ResumePoint.load(self.log, self._source_topics())
                        reconnect = False
                    if self._stream(sql_conn, builder, resume, marker):
                        break
                except ReplicationLostError as exc:
                    # Resume point: everything acknowledged is in the log, and the slot re-sends
                    # from the acknowledged LSN. What was pending is dropped and rebuilt from the
                    # re-sent WAL by a fresh builder (its schema and TOAST caches may be ahead of
                    # the log), and ResumePoint skips whatever did reach the log.
                    failures = 0 if self.stats.acked_lsn > acked_before else failures + 1
                    backoff = self.settings.reconnect_backoff_s
                    delay = backoff[min(max(failures - 1, 0), len(backoff) - 1)]
                    self.stats.reconnects += 1
                    self._retry.failed(str(exc), backoff[-1])
                    self._pending.clear()
                    self._pending_schemas.clear()
                    self._pending_end = None
                    self.incremental.reset()
                    reconnect = True
                    if self._stop.wait(delay):
                        break
            return self.stats
        finally:
            gc.set_threshold(*collector)
            sql_conn.close()

    def _check_slot(self, sql_conn: psycopg.Connection[Any], resume: ResumePoint) -> None:
        """Raise :class:`SlotGoneError` when the slot was dropped or invalidated (while we were away)."""
        try:
            status = slot_status(sql_conn, self.slot)
        except psycopg.OperationalError as exc:
            raise ReplicationLostError.from_psycopg(exc, slot=self.slot, dsn=self._dsn) from None
        if is_gone(status):
            since = status.confirmed_flush_lsn if status is not None else None
            if since is None and self.stats.acked_lsn.value:
                since = self.stats.acked_lsn
            raise slot_gone_error(self.name, self.slot, status, since or resume_lsn(resume))

    def _new_builder(self, sql_conn: psycopg.Connection[Any]) -> EventBuilder:
        """An event builder with the schemas already published to the log."""
        try:
            builder = EventBuilder(
                self.name,
                str(sql_conn.info.dbname),
                self._make_decoder_factory(sql_conn),
                excluded_columns=self.source.columns.exclude,
                primary_key=primary_key_lookup(sql_conn),
                configured_keys=self.source.keys,
                previous_image=self._previous_image,
            )
            self._seed_schemas(builder, sql_conn)
        except psycopg.OperationalError as exc:
            raise ReplicationLostError.from_psycopg(exc, slot=self.slot, dsn=self._dsn) from None
        return builder

    def _stream(
        self,
        sql_conn: psycopg.Connection[Any],
        builder: EventBuilder,
        resume: ResumePoint,
        marker: str | None,
    ) -> bool:
        """One replication session; True when caught up (``marker`` seen)."""
        stream = ReplicationStream(self._dsn, StreamOptions(self.slot, self.publication))
        decoder = PgoutputDecoder(protocol_version=2)
        assembler = TransactionAssembler()
        stream.start(Lsn(0))
        self._retry.resumed()
        last_heartbeat = time.monotonic()
        max_batch = self.settings.max_batch_records
        decode, feed, open_lists = decoder.decode, assembler.feed, assembler.open_lists
        # With the extension, the row changes of an open transaction go from a batch of frames
        # into it in one call (decoded as decode would, appended as feed would); every other
        # frame takes the loop below.
        take = speedups.take_changes if speedups is not None and libpq_speedups() is not None else None
        try:
            while not self._stop.is_set():
                stopping = False
                for batch in stream.batches(self.settings.poll_timeout_s):
                    at, count = 0, len(batch)
                    while at < count:
                        if take is not None and (lists := open_lists()) is not None and not decoder.in_stream:
                            at = take(batch, at, lists[0], lists[1])
                            if at >= count:
                                break
                        frame = batch[at]
                        at += 1
                        if isinstance(frame, WalMessage):
                            done = feed(decode(frame.payload), frame.wal_start)
                            if done is None:
                                continue
                            if isinstance(done, Transaction):
                                self._add_transaction(builder, done)
                                if len(self._pending) >= max_batch:
                                    self._flush(resume, stream)
                                if self._stop.is_set():
                                    stopping = True  # at a transaction boundary: flush and acknowledge below
                                    break
                            elif self._on_loose_message(done.message, marker, resume, stream):
                                self._caught_up = True
                                if not self.incremental.pending:
                                    return True
                        elif frame.reply_requested:
                            stream.send_status(self.stats.acked_lsn)
                    if stopping:
                        break
                if self._pending_end is not None:
                    self._flush(resume, stream)
                if self._caught_up and not self.incremental.pending:
                    return True  # caught up, and the incremental snapshots running then are done
                now = time.monotonic()
                if now - last_heartbeat >= self.source.heartbeat_interval_s:
                    # A heartbeat message flows through the slot even when only unpublished
                    # tables change, so the acknowledged LSN (and retained WAL) keeps moving.
                    self._emit_marker(sql_conn, HEARTBEAT_PREFIX)
                    last_heartbeat = now
                try:
                    self._pending_schemas.extend(self.incremental.poll(sql_conn, builder))
                except psycopg.OperationalError as exc:
                    raise ReplicationLostError.from_psycopg(exc, slot=self.slot, dsn=self._dsn) from None
            self._flush(resume, stream)
            return False
        finally:
            stream.close()

    # -- snapshot ----------------------------------------------------------------------

    def _prepare_slot_and_snapshot(
        self, sql_conn: psycopg.Connection[Any], builder: EventBuilder, resume: ResumePoint
    ) -> bool:
        """Make sure the slot exists and the snapshot the mode asks for is done; False: stop after.

        A slot that is gone (dropped, or invalidated) after this source has streamed from
        it is never silently replaced: the changes it held would be skipped. Capture stops
        with :class:`SlotGoneError` unless a resync was requested (or the mode is
        ``when_needed``, which requests one itself).
        """
        mode = self.source.snapshot
        state = SnapshotState.load(self.state_dir / "snapshot.json")
        slot = slot_status(sql_conn, self.slot)
        request = ResyncRequest.load(self.state_dir)
        if request is None and is_gone(slot) and self._streamed_before(state, resume):
            since = slot.confirmed_flush_lsn if slot is not None else resume_lsn(resume)
            error = slot_gone_error(self.name, self.slot, slot, since)
            if mode != "when_needed":
                raise error
            logger.warning("%s; snapshot mode when_needed: re-snapshotting instead", error)
            request = ResyncRequest.new(self.state_dir, "slot gone, snapshot: when_needed", since)
            request.save()
        if request is not None:
            self._resync(sql_conn, builder, resume, state, request=request, slot=slot)
            self._mark_streamed()
            return mode != "initial_only"
        if slot is not None and slot.wal_status == "lost":
            # Invalidated before anything was streamed from it: recreating it loses nothing.
            drop_slot(sql_conn, self.slot, source=self.name)
            slot = None
        wants = mode in ("initial", "initial_only", "when_needed") and not state.completed
        if not wants:
            if slot is None:
                create_slot(sql_conn, self.slot, source=self.name)
            self._mark_streamed()
            return mode != "initial_only"
        if state.consistent_lsn is None or slot is None:
            # Nothing was streamed from this slot yet (no snapshot finished), so recreating it
            # with an exported snapshot loses nothing.
            state = self._snapshot_with_new_slot(
                sql_conn, builder, resume, SnapshotState(state.path), slot, reconcile=False
            )
        else:
            self._read_snapshot(builder, resume, state, exported=None)
        state.completed = True
        state.save()
        self._mark_streamed()
        return mode != "initial_only"

    def _resync(
        self,
        sql_conn: psycopg.Connection[Any],
        builder: EventBuilder,
        resume: ResumePoint,
        state: SnapshotState,
        *,
        request: ResyncRequest,
        slot: SlotStatus | None,
    ) -> None:
        """Carry out a requested re-snapshot (see :mod:`capture.resync`), from its start unless it is done."""
        if request.consistent_lsn is not None and state.completed and state.consistent_lsn == request.consistent_lsn:
            request.clear()  # done; only the clearing was interrupted
            return
        logger.warning("source %s: re-snapshotting every table (%s)", self.name, request.reason)
        state = SnapshotState(state.path)
        state.save()  # an interrupted resync never resumes a half snapshot: the key set must be whole
        state = self._snapshot_with_new_slot(sql_conn, builder, resume, state, slot, reconcile=True, request=request)
        state.completed = True
        state.save()
        request.clear()

    def _snapshot_with_new_slot(
        self,
        sql_conn: psycopg.Connection[Any],
        builder: EventBuilder,
        resume: ResumePoint,
        state: SnapshotState,
        slot: SlotStatus | None,
        *,
        reconcile: bool,
        request: ResyncRequest | None = None,
    ) -> SnapshotState:
        """(Re)create the slot with an exported snapshot and read every table at its consistent point."""
        if slot is not None:
            drop_slot(sql_conn, self.slot, source=self.name)
        repl = psycopg.connect(self._dsn, autocommit=True, replication="database", options=pinned_options())
        try:
            row = repl.execute(
                sql.SQL("CREATE_REPLICATION_SLOT {} LOGICAL pgoutput EXPORT_SNAPSHOT").format(sql.Identifier(self.slot))
            ).fetchone()
            assert row is not None
            consistent = Lsn.parse(row[1])
            highest = resume.highest()
            if highest is not None and consistent.value <= highest.commit_lsn:
                # Snapshot rows would sort before events already in the log (and be skipped).
                msg = (
                    f"source {self.name}: the new slot starts at {consistent}, not after the log's last change "
                    f"at {Lsn(highest.commit_lsn)}: the database is not the one this log was captured from "
                    "(restored from a backup or failed over?); capture it into a new log (another home or source name)"
                )
                raise SlotError(msg, source=self.name, slot=self.slot)
            state = SnapshotState(state.path, consistent_lsn=consistent.value)
            state.save()
            if request is not None:
                request.consistent_lsn = consistent.value
                request.save()
            self._read_snapshot(builder, resume, state, exported=str(row[2]), reconcile=reconcile)
        finally:
            repl.close()
        return state

    def _streamed_before(self, state: SnapshotState, resume: ResumePoint) -> bool:
        """Whether this source has taken changes from its slot (so a lost slot lost some).

        Rows of an unfinished initial snapshot do not count: nothing was streamed yet, so
        a new slot with a new exported snapshot loses nothing. Without a snapshot (mode
        ``never``), anything in the log came from the slot.
        """
        if state.completed or (self.state_dir / STREAMED_MARKER).exists():
            return True
        return self.source.snapshot == "never" and resume.highest() is not None

    def _mark_streamed(self) -> None:
        marker = self.state_dir / STREAMED_MARKER
        if not marker.exists():
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text(orjson.dumps({"slot": self.slot}).decode())

    def _read_snapshot(
        self,
        builder: EventBuilder,
        resume: ResumePoint,
        state: SnapshotState,
        *,
        exported: str | None,
        reconcile: bool = False,
    ) -> None:
        reader = psycopg.connect(self._dsn, options=pinned_options())
        # The keys the re-snapshot reads (resync only): spilled to disk beyond a threshold.
        present = KeySet(key_set_path(self.state_dir)) if reconcile else None
        # Per topic, where the re-snapshot's records start: the reconcile reads only what is before.
        starts: dict[str, dict[int, int]] = {}
        quarantined: set[str] = set()
        pipeline: _SnapshotPipeline | None = None
        readers: _ChunkReaders | None = None
        ahead: ReadAhead[CopyRows] | None = None  # the next chunk, read meanwhile
        chunk_rows: Iterator[CopyRows] | None = None
        try:
            reader.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            if exported is not None:
                reader.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(exported)))
            tables = reader.execute(
                "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s ORDER BY 1, 2",
                (self.publication,),
            ).fetchall()
            plan: list[tuple[int, Relation, list[Chunk]]] = []
            total_rows = 0
            for schema, table in tables:
                relation = relation_from_catalog(
                    reader, f"{sql.Identifier(schema).as_string(reader)}.{sql.Identifier(table).as_string(reader)}"
                )
                schema_record = builder.relation(relation)
                if schema_record is not None:
                    self._pending_schemas.append(schema_record)
                chunks = plan_chunks(reader, schema, table, relation.oid)
                plan.append((relation.oid, relation, chunks))
                estimate = reader.execute("SELECT reltuples FROM pg_class WHERE oid = %s", (relation.oid,)).fetchone()
                total_rows += max(int(estimate[0]) if estimate else 0, 0)
            if self.progress:
                self.progress.start(total_rows)
            consistent = state.consistent_lsn or 0
            if present is not None:
                # Before anything is appended: a resync's reconcile reads each topic before these offsets
                # and takes the re-snapshot's keys from after them (the agent is the topics' only writer).
                for oid, _relation, _chunks in plan:
                    topic = builder.topic_of(oid)
                    starts[topic] = self._end_offsets(topic)
                    starts[quarantine_topic(topic)] = self._end_offsets(quarantine_topic(topic))
            # Natively encoded batches need the file log.
            native = speedups is not None and isinstance(self.log, AppendsEncodedBatches)
            pipeline = _SnapshotPipeline(self, builder, resume) if native else None
            todo = [
                (table_no, oid, relation, chunk)
                for table_no, (oid, relation, chunks) in enumerate(plan)
                for chunk in chunks
                if chunk.id not in state.done_chunks
            ]
            if pipeline is not None and len(todo) > 1:
                readers = _ChunkReaders.on_snapshot(self._dsn, reader, exported)
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
                for rows in chunk_rows:
                    # Stamped with the read time (as Debezium does): the rows belong to the snapshot's day.
                    read_us = time.time_ns() // 1000
                    pieces = rows.native_pieces() if pipeline is not None and encoder is not None else None
                    # Right after a restart the log may hold some of these rows: the per-record check.
                    if pipeline is not None and pieces is not None and not resume.may_hold(consistent, next_index):
                        if self._pending:  # (the schemas went to the writer first: append_schemas)
                            pipeline.drain()
                            self._flush(resume, None)  # records built before go first
                        start = Seq(consistent, next_index)
                        next_index = pipeline.submit(topic, oid, rows.data, pieces, start, ts_us=read_us)
                        continue
                    if pipeline is not None:
                        pipeline.drain()
                    records = builder.snapshot_records(oid, rows, Seq(consistent, next_index), ts_us=read_us)
                    next_index += len(rows)
                    self._pending.extend(records)
                    self.stats.events += len(records)
                    if len(self._pending) >= self.settings.max_batch_records:
                        self._flush(resume, None)
                    if self.progress:
                        self.progress.advance(len(rows))
                # Every event of the chunk is durable (each append fsynced) before the chunk counts as done.
                if pipeline is not None and not self._pending:
                    # The writer records it after the chunk's last append, while the next chunk is read.
                    pipeline.after_appends(functools.partial(self._chunk_done, state, chunk.id))
                    continue
                if pipeline is not None:
                    pipeline.drain()
                self._flush(resume, None)
                self._chunk_done(state, chunk.id)
            if pipeline is not None:
                pipeline.drain()
            if present is not None:
                self._flush(resume, None)
                for oid, _relation, _chunks in plan:
                    topic = builder.topic_of(oid)
                    # Every row the re-snapshot read is in the log now: its keys, from the log itself.
                    snapshot_keys(self.log, topic, starts[topic], present)
                    if self._end_offsets(quarantine_topic(topic)) != starts[quarantine_topic(topic)]:
                        quarantined.add(topic)
                self._reconcile_deletes(resume, present, starts, quarantined, consistent)
            self._flush(resume, None)
            reader.rollback()
        finally:
            for unfinished in (chunk_rows, ahead):  # after an error: their threads stop, their COPYs drain
                close = getattr(unfinished, "close", None)
                if close is not None:
                    close()
            if pipeline is not None:
                pipeline.close()
            if readers is not None:
                readers.close()
            reader.close()
            if present is not None:
                present.close()  # the file stays until the request is cleared
            if self.progress:
                self.progress.finish()

    @staticmethod
    def _chunk_done(state: SnapshotState, chunk_id: str) -> None:
        state.done_chunks.add(chunk_id)
        state.save()

    def _reconcile_deletes(
        self,
        resume: ResumePoint,
        present: KeySet,
        starts: dict[str, dict[int, int]],
        quarantined: set[str],
        consistent: int,
    ) -> None:
        """Deletes (+ tombstones) for keys the log holds live but the re-snapshot did not find."""
        ts_us = time.time_ns() // 1000
        first_index = DELETE_INDEX_BASE
        for topic in present.topics():
            if topic in quarantined:
                # A quarantined row's key is not comparable with the log's keys: a delete
                # written for it could remove a row the source still has.
                logger.warning(
                    "source %s: %s: rows went to quarantine during the re-snapshot, so keys deleted while the "
                    "slot was gone are not reconciled for this table; fix the rows and resync again",
                    self.name,
                    topic,
                )
                continue
            deleted = 0
            deletes = vanished_key_deletes(
                self.log,
                topic,
                present,
                commit_lsn=consistent,
                first_index=first_index,
                ts_us=ts_us,
                end=starts[topic],
            )
            # Appended as generated (a mass delete is never held whole); a batch ends after a
            # tombstone, so each delete shares its tombstone's atomic append.
            with contextlib.closing(deletes):
                for record in deletes:
                    self._pending.append(record)
                    if record.value is None:
                        deleted += 1
                        if len(self._pending) >= self.settings.max_batch_records:
                            self._flush(resume, None)
            self._flush(resume, None)
            first_index += deleted
            self.stats.events += deleted
            if deleted:
                logger.warning(
                    "source %s: %s: %d rows deleted while the slot was gone; their deletes are written",
                    self.name,
                    topic,
                    deleted,
                )

    def _end_offsets(self, topic: str) -> dict[int, int]:
        try:
            return end_offsets(self.log, topic)
        except UnknownTopicError:
            return {}  # created by this snapshot: it holds nothing else

    def _add_transaction(self, builder: EventBuilder, txn: Transaction) -> None:
        records, schemas = builder.build(txn)
        records.extend(self.incremental.on_transaction(txn, records, builder))
        self._pending.extend(records)
        self._pending_schemas.extend(schemas)
        self._pending_end = txn.end_lsn
        self.stats.transactions += 1
        self.stats.events += len(records) - sum(1 for r in records if r.value is None)

    def _on_loose_message(
        self, message: LogicalMessage, marker: str | None, resume: ResumePoint, stream: ReplicationStream
    ) -> bool:
        if not message.prefix.startswith(INTERNAL_MESSAGE_PREFIX):
            return False
        # Every transaction committed before this message has been received: once the
        # pending ones are durable, the message's LSN is safe to acknowledge.
        self._flush(resume, stream)
        if message.lsn > self.stats.acked_lsn and not self._pending:
            self.stats.acked_lsn = message.lsn
            stream.send_status(message.lsn)
        return marker is not None and message.prefix == CAUGHT_UP_PREFIX and message.content.decode() == marker

    def _flush(self, resume: ResumePoint, stream: ReplicationStream | None) -> None:
        """Append pending records (skipping those the log holds), then acknowledge.

        When the log cannot take them (disk full, broker down) nothing is acknowledged:
        the agent says so once, keeps the replication connection alive, retries every
        ``log_retry_s`` and goes on when an append works. A failed append leaves
        nothing behind, and the partitions appended before it are skipped on retry.
        """
        paused_at: float | None = None
        while True:
            try:
                if paused_at is not None:  # a failed Kafka append may have landed: skip what did
                    resume.refresh(self.log, self._source_topics())
                self._append_pending(resume, recheck=paused_at is not None)
                break
            except (LogUnavailableError, OSError) as exc:
                if isinstance(exc, OSError) and exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                if paused_at is None:
                    paused_at = time.monotonic()
                    logger.warning("%s", self._pause_message(exc))
                if self._stop.wait(self.settings.log_retry_s):
                    msg = (
                        f"source {self.name}: stopped while the log could not be written ({one_line(exc)}); "
                        f"nothing after LSN {self.stats.acked_lsn} was acknowledged, so the next run resumes there"
                    )
                    raise LogUnavailableError(msg) from None
                if stream is not None:
                    stream.send_status(self.stats.acked_lsn)  # keeps wal_sender_timeout from ending the session
        if paused_at is not None:
            logger.warning(
                "source %s: log writable again; capture resumed after %.1fs",
                self.name,
                time.monotonic() - paused_at,
            )
        self.incremental.flushed()
        if self._pending_end is not None and stream is not None:
            # Acknowledged only after the appends above returned (fsynced): a restart
            # resumes at or before this LSN.
            stream.send_status(self._pending_end)
            self.stats.acked_lsn = self._pending_end
            self._pending_end = None

    def _pause_message(self, exc: BaseException) -> str:
        cause = exc if isinstance(exc, OSError) else exc.__cause__
        where = getattr(self.log, "root", None)
        every = f"retrying every {self.settings.log_retry_s:g}s"
        if isinstance(cause, OSError) and cause.errno in (errno.ENOSPC, errno.EDQUOT):
            return f"log disk full at {where}: capture paused, not acknowledging; {every}"
        return f"log unavailable ({one_line(exc)}): capture paused, not acknowledging; {every}"

    def _append_pending(self, resume: ResumePoint, *, recheck: bool) -> None:
        """Append schemas, then pending batches, then pending records per (topic, partition); clears what it wrote."""
        if self._pending_schemas:
            self._ensure_topic(SCHEMAS_TOPIC)
            # Schemas go first: a reader never meets an event whose columns it cannot know.
            append_keyed(self.log, SCHEMAS_TOPIC, [Record(s.topic.encode(), s.value) for s in self._pending_schemas])
            self._pending_schemas.clear()
        self._append_batches(resume)
        pending = self._pending
        # Pending records are in sequence order, so when the log holds nothing at or past the
        # first one (always, except right after a restart) no record needs the skip check.
        check = bool(pending) and (recheck or resume.may_hold(pending[0].commit_lsn, pending[0].txn_index))
        partitions = self._partition_counts
        grouped = None
        if not check and speedups is not None:
            # The loop below in one native call (same groups, same order); a topic not yet
            # created comes back by name.
            while isinstance(grouped := speedups.group_records(pending, partitions), str):
                self._ensure_topic(grouped)
        groups: dict[str, list[list[OutRecord]]] = grouped if grouped is not None else {}
        for record in pending if grouped is None else ():
            topic = record.topic
            buckets = groups.get(topic)
            if buckets is None:
                count = partitions.get(topic) or self._ensure_topic(topic)
                buckets = groups[topic] = [[] for _ in range(count)]
            partition = 0 if record.key is None or len(buckets) == 1 else partition_for(record.key, len(buckets))
            if check and resume.already_stored(TopicPartition(topic, partition), record.sequence):
                self.stats.records_skipped += 1
                continue
            buckets[partition].append(record)
        for topic, buckets in groups.items():
            for partition, records in enumerate(buckets):
                if not records:
                    continue
                # An OutRecord has every field of a Record: appended as it is, no copy per record.
                append_or_quarantine(self.log, topic, partition, records, self._ensure_topic)
                last = records[-1]
                resume.advance_to(TopicPartition(topic, partition), last.commit_lsn, last.txn_index)
                self.stats.records_written += len(records)
        pending.clear()

    def _append_batches(self, resume: ResumePoint) -> None:
        """Append the pending batches, each dropped once durable (a failed one stays for the retry).

        A failed file-log append leaves nothing behind, so a retry goes on from the batches still
        pending. The batches of distinct partitions at the head of the list are appended together
        by ``_batch_appenders`` when set: their fsyncs overlap (3 partitions: ~5x less wall time
        than one after another on this disk); a partition's own batches stay in order.
        """
        batches = self._pending_batches
        while batches:
            run: dict[tuple[str, int], int] = {}
            for at, (topic, encoded) in enumerate(batches):
                if (topic, encoded.partition) in run:
                    break
                run[topic, encoded.partition] = at
            head = batches[: len(run)]
            pool = self._batch_appenders
            futures: list[Future[Any] | None] = [None] * len(head)
            append = cast(AppendsEncodedBatches, self.log).append_encoded  # only such a log gets encoded batches
            if pool is not None and len(head) > 1:
                futures = [pool.submit(append, t, e.partition, e.batch) for t, e in head]
            failed: BaseException | None = None
            kept = []
            for (topic, encoded), future in zip(head, futures, strict=True):
                if failed is not None and future is None:  # one after another: stop at the first failure
                    kept.append((topic, encoded))
                    continue
                try:
                    if future is None:
                        append(topic, encoded.partition, encoded.batch)
                    else:
                        future.result()
                except BaseException as exc:
                    failed = failed or exc
                    kept.append((topic, encoded))
                    continue
                resume.advance_to(TopicPartition(topic, encoded.partition), encoded.commit_lsn, encoded.last_index)
                self.stats.records_written += len(encoded.batch)
            batches[: len(head)] = kept
            if failed is not None:
                raise failed

    # -- helpers -----------------------------------------------------------------------

    def _previous_image(self, topic: str, key: bytes, before: tuple[int, int]) -> dict[str, Any] | None:
        """The key's latest after-image stored before sequence ``before``, scanning its partition backwards.

        Rare (a cache miss, e.g. right after a restart). Records at or after ``before`` are
        skipped: a crash between the per-partition appends of one flush can leave this very
        change (say a key change's delete of the old key) or later ones in the log already,
        and taking those for the previous image loses the unchanged TOAST value.
        """
        if topic not in self.log.list_topics():
            return None
        partition = partition_for(key, self._partitions(topic))
        end = self.log.end_offset(topic, partition)
        start = self.log.beginning_offset(topic, partition)
        step = 1024
        while end > start:
            first = max(start, end - step)
            for record in reversed(read_between(self.log, topic, partition, first, end)):
                if record.key != key or record.value is None:
                    continue  # another key, or a tombstone (its delete event comes right before it)
                value = orjson.loads(record.value)
                source = value.get("source") or {}
                if "commit_lsn" in source and (int(source["commit_lsn"]), int(source["txn_index"])) >= before:
                    continue
                after = value.get("after")
                return after if isinstance(after, dict) else None
            end = first
        return None

    def _partitions(self, topic: str) -> int:
        count = self._partition_counts.get(topic)
        if count is None:
            count = self._partition_counts[topic] = self.log.describe_topic(topic).partitions
        return count

    def _planned_partitions(self, topic: str) -> int:
        """The partition count ``topic`` has, or will have once :meth:`_ensure_topic` creates it."""
        count = self._partition_counts.get(topic)
        if count is not None:
            return count
        try:
            return self._partitions(topic)
        except UnknownTopicError:
            return self._new_topic_partitions(topic)

    def _new_topic_partitions(self, topic: str) -> int:
        """How many partitions :meth:`_ensure_topic` gives ``topic`` when it creates it."""
        return 1 if topic == SCHEMAS_TOPIC else self.log_config.partitions

    def _ensure_topic(self, topic: str) -> int:
        """Create ``topic`` unless it exists; return its partition count (cached: topics never shrink)."""
        count = self._partition_counts.get(topic)
        if count is not None:
            return count
        cfg = self.log_config
        spec = TopicSpec(
            name=topic,
            partitions=self._new_topic_partitions(topic),
            # Quarantine keeps every bad record; table topics keep the latest image per key.
            compacted=not is_quarantine_topic(topic),
            min_compaction_lag_ms=cfg.min_compaction_lag_s * 1000,
            delete_retention_ms=cfg.delete_retention_s * 1000,
        )
        self.log.create_topic(spec, exist_ok=True)
        return self._partitions(topic)

    def _source_topics(self) -> Iterable[str]:
        prefix = f"{self.name}."
        return [t for t in self.log.list_topics() if t.startswith(prefix)]

    def _seed_schemas(self, builder: EventBuilder, sql_conn: psycopg.Connection[Any]) -> None:
        """Seed the builder with the schemas already published; re-record those without a key.

        Schema records written before keys were recorded do not say the key of a REPLICA
        IDENTITY FULL table (:func:`log.table_schemas.schema_key`): each such table's schema
        is recorded again now, from the catalog, so loads find its key without waiting for
        its next change.
        """
        for topic, value in latest_schemas(self.log, prefix=f"{self.name}.").items():
            builder.known_schema(topic, value)
            if schema_key(value) is not None:
                continue
            qualified = ".".join(sql.Identifier(part).as_string(sql_conn) for part in (value["schema"], value["table"]))
            try:
                relation = relation_from_catalog(sql_conn, qualified)
            except (ValueError, psycopg.errors.UndefinedTable):
                continue  # the table is gone: its topic keeps the old record
            record = builder.relation(relation)
            if record is not None:
                self._pending_schemas.append(record)

    def _connect_sql(self) -> psycopg.Connection[Any]:
        try:
            return psycopg.connect(self._dsn, autocommit=True, options=pinned_options(), connect_timeout=10)
        except psycopg.OperationalError as exc:
            raise ReplicationLostError.from_psycopg(exc, slot=self.slot, dsn=self._dsn) from None

    def _reconnect_sql(self, conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
        if not conn.closed and not conn.broken:
            return conn
        conn.close()
        return self._connect_sql()

    def _emit_marker(self, conn: psycopg.Connection[Any], prefix: str) -> str:
        token = secrets.token_hex(8)
        try:
            conn.execute("SELECT pg_logical_emit_message(false, %s, %s)", (prefix, token))
        except psycopg.OperationalError as exc:
            raise ReplicationLostError.from_psycopg(exc, slot=self.slot, dsn=self._dsn) from None
        return token


class _ChunkReaders:
    """Two connections on one snapshot taking turns at the chunks (the agent's reader, and one more).

    :meth:`start` begins a chunk's COPY in a thread (:class:`ReadAhead`) while the chunk before
    is still read on the other connection. The second connection is opened by the first read-ahead
    thread; when it cannot be (``max_connections``), :meth:`ready` says so and the agent's reader
    goes on alone.
    """

    def __init__(self, dsn: str, reader: psycopg.Connection[Any], snapshot: str) -> None:
        self._dsn = dsn
        self._snapshot = snapshot
        self._conns: list[psycopg.Connection[Any] | None] = [reader, None]
        self._opened = threading.Event()

    @classmethod
    def on_snapshot(cls, dsn: str, reader: psycopg.Connection[Any], exported: str | None) -> _ChunkReaders | None:
        """Readers on ``exported``, or on the snapshot ``reader``'s transaction exports; None if it cannot."""
        if exported is not None:
            return cls(dsn, reader, exported)
        try:
            with reader.transaction():  # a savepoint: a failure leaves the reader's snapshot as it was
                row = reader.execute("SELECT pg_export_snapshot()").fetchone()
        except psycopg.Error as exc:
            logger.debug("snapshot: one reader connection (%s)", one_line(exc))
            return None
        return cls(dsn, reader, str(row[0])) if row else None

    def start(self, position: int, chunk: Chunk, columns: list[str]) -> ReadAhead[CopyRows]:
        """Read the chunk at ``position`` of the agent's list on its connection, from now on."""
        return ReadAhead(self._rows(position % 2, chunk, columns), name="snapshot-next-chunk")

    def ready(self, position: int) -> bool:
        """Whether the chunk at ``position`` has its connection (the second one may have failed to open)."""
        if position % 2 == 0:
            return True
        self._opened.wait()
        return self._conns[1] is not None

    def _rows(self, which: int, chunk: Chunk, columns: list[str]) -> Iterator[CopyRows]:
        conn = self._conns[which]
        if conn is None and not self._opened.is_set():
            try:
                conn = psycopg.connect(self._dsn, options=pinned_options())
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(self._snapshot)))
                self._conns[which] = conn
            except psycopg.Error as exc:
                logger.debug("snapshot: no second reader connection (%s)", one_line(exc))
                if conn is not None:
                    conn.close()
                return
            finally:
                self._opened.set()
        if conn is not None:
            yield from read_chunk(conn, chunk, columns)

    def close(self) -> None:
        """Close the second connection (its transaction read only: nothing to commit)."""
        second, self._conns[1] = self._conns[1], None
        if second is not None:
            second.close()


#: Partitions a snapshot appends to at the same time (their fsyncs overlap).
PARALLEL_APPENDS = 4


class _SnapshotPipeline:
    """The native snapshot path: pieces encoded by threads, appended in order by one more thread.

    The agent's reader thread submits each COPY block (cut into pieces); ``ENCODE_THREADS``
    threads turn pieces into batches (the extension releases the GIL) while one writer thread
    appends finished pieces in submission order through the agent's ``_flush`` (fsync per
    append, pause/retry on a full disk), so reading, encoding and disk writes overlap. While
    pieces are in flight only the writer touches the agent's pending lists; :meth:`drain`
    waits until every submitted piece is durable (before the agent appends anything itself).
    A chunk counts as done when the writer, after the chunk's last append, records it
    (:meth:`after_appends`), so the next chunk's COPY runs meanwhile; after a failed step the
    writer writes nothing more.
    """

    #: Pieces submitted but not yet appended (bounds memory: 2 MiB of COPY text each, and their
    #: batches: ~0.7 MB compressed, ~18 MB plain). Compressed, more of them ride out a slow fsync
    #: (an A/B at load 6-8: 0.66-1.01 s per 1M rows with 16, 0.79-1.23 s with 6).
    AHEAD = ENCODE_THREADS + 4
    AHEAD_COMPRESSED = 16

    def __init__(self, agent: CaptureAgent, builder: EventBuilder, resume: ResumePoint) -> None:
        self._agent = agent
        self._builder = builder
        self._resume = resume
        self._encoders = ThreadPoolExecutor(ENCODE_THREADS, thread_name_prefix="snapshot-encode")
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="snapshot-append")
        agent._batch_appenders = ThreadPoolExecutor(PARALLEL_APPENDS, thread_name_prefix="snapshot-partition-append")
        self._appending: deque[Future[None]] = deque()
        self._failed = False  # set by the writer thread only
        self._topics: dict[str, int] = {}  # partition counts of the topics pieces were submitted for
        self._compression: Compression = getattr(agent.log, "compression", "none")  # the file log's setting
        self._ahead = self.AHEAD if self._compression == "none" else self.AHEAD_COMPRESSED

    def submit(
        self, topic: str, relation_oid: int, data: bytes, pieces: list[tuple[int, int, int]], start: Seq, *, ts_us: int
    ) -> int:
        """Encode and append the rows of ``data`` (COPY text, :func:`encodable`) from ``start``; the next index.

        ``pieces`` are ``data``'s :func:`copy_pieces`.
        """
        partitions = self._topics.get(topic)
        if partitions is None:
            # The writer creates the topic before its first append; the encoders need only its count.
            partitions = self._topics[topic] = self._agent._planned_partitions(topic)
            self.after_appends(functools.partial(self._agent._ensure_topic, topic))
        index = start.txn_index
        for piece in pieces:
            job = self._encoders.submit(
                encode_piece,
                self._builder,
                relation_oid,
                data,
                piece,
                Seq(start.commit_lsn, index),
                partitions=partitions,
                ts_us=ts_us,
                compression=self._compression,
            )
            self._appending.append(self._writer.submit(self._in_order, self._append, topic, job, piece[2]))
            index += piece[2]
            while len(self._appending) > self._ahead:
                self._appending.popleft().result()  # an append's error is raised here
        return index

    def append_schemas(self) -> None:
        """Append the agent's pending schema records from the writer thread, before anything submitted later.

        The agent's thread adds no schema record while the pipeline runs (every table's was built
        before the first chunk), so from here on it looks at its pending records alone.
        """
        agent, resume = self._agent, self._resume
        schemas = list(agent._pending_schemas)
        agent._pending_schemas.clear()

        def append() -> None:
            agent._pending_schemas[:0] = schemas
            agent._flush(resume, None)

        self.after_appends(append)

    def after_appends(self, step: Callable[[], object]) -> None:
        """Run ``step`` in the writer thread once every piece submitted before is appended (durable).

        Its error is raised as an append's (:meth:`submit`, :meth:`drain`); after an error it does not run.
        """
        self._appending.append(self._writer.submit(self._in_order, step))

    def drain(self) -> None:
        """Wait until every submitted piece is appended (durable)."""
        while self._appending:
            self._appending.popleft().result()

    def close(self) -> None:
        """Stop: pieces not yet started are dropped (nothing of them was appended)."""
        self._encoders.shutdown(wait=True, cancel_futures=True)
        self._writer.shutdown(wait=True, cancel_futures=True)
        appenders, self._agent._batch_appenders = self._agent._batch_appenders, None
        if appenders is not None:
            appenders.shutdown(wait=True)

    def _in_order(self, step: Callable[..., object], *args: Any) -> None:
        # After a failed step nothing more is written: a later piece appended after a missing one
        # would make the resume check take the missing rows for stored (lost), and a chunk marked
        # done after it would never be read again.
        if self._failed:
            msg = "snapshot append skipped: an earlier append failed"
            raise RuntimeError(msg)
        try:
            step(*args)
        except BaseException:
            self._failed = True
            raise

    def _append(self, topic: str, job: Future[EncodedPiece], rows: int) -> None:
        agent, resume = self._agent, self._resume
        for part in job.result():
            if part and isinstance(part[0], PartitionBatch):
                agent._pending_batches.extend((topic, batch) for batch in part if isinstance(batch, PartitionBatch))
            else:
                records = [record for record in part if isinstance(record, OutRecord)]
                agent._pending.extend(records)
                agent.stats.events += len(records)
                rows -= 1  # a row the Python path built
            agent._flush(resume, None)
        agent.stats.events += rows
        if agent.progress:
            agent.progress.advance(rows)
