"""The MySQL capture agent: binlog -> whole transactions -> change records in the log.

Resume points and invariants:

* A transaction's records are appended only when it is complete (its XID or COMMIT read), in
  binlog order, with the schema records of changed shapes before them.
* The resume position (:mod:`capture.mysql.state`) is saved only after the appends of every
  transaction before it returned, so it is at or before what the log holds; records the log
  already holds are skipped after a restart (:class:`capture.position.ResumePoint`).
* MySQL has nothing to acknowledge: the server keeps binlogs by time. A binlog purged before
  capture read it stops capture in one line naming ``headwater source resync``.
* A lost replication connection is reopened from the last saved position; what was pending is
  dropped and read again.

Large transactions: past ``spill_threshold_bytes`` the assembler spills a transaction's row
events to ``capture/<source>/spill/`` (:mod:`capture.spill`), and a committed transaction's
events are built and appended ``PIECE_RECORDS`` at a time, pending records flushed between
pieces once ``FLUSH_RECORDS`` wait. A flush in the middle of a transaction saves no position
(the resume position moves past a transaction only once its last piece is durable), so a
crash between pieces reads the whole transaction again and :class:`capture.position.ResumePoint`
skips the records the log holds; a stop between pieces ends the session there the same way.
Every spill file is removed once its transaction is built, when a session ends, and at every
session start (what a killed run left is read again from the binlog).

Incremental snapshots (:mod:`capture.mysql.incremental`): a chunk is read when the stream is
between transactions with nothing more waiting, and its rows are appended before the first
transaction committed past the chunk's binlog point (or as soon as the stream is at or past it).
Signals (:mod:`capture.mysql.signals`) are carried out after the append that made their
transaction durable and before the binlog position past it is saved, and the chunk progress is
saved after the append of its rows.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

import orjson

from capture.appender import Appender
from capture.collector import restore_collections, space_young_collections
from capture.key_set import KeySet, key_set_path
from capture.mysql.binlog.client import BinlogPurgedError, BinlogStream, BinlogStreamError
from capture.mysql.binlog.event_types import EventType
from capture.mysql.binlog.position import BinlogPosition, GtidPosition
from capture.mysql.binlog.rows import RowDecoder
from capture.mysql.binlog.table_map import TableShape
from capture.mysql.events import EventBuilder
from capture.mysql.incremental import ChunkRows, MySqlIncremental
from capture.mysql.resync import append_vanished_key_deletes, confirm_gone, register_gone_tables
from capture.mysql.schema_records import schema_record
from capture.mysql.settings import MySqlSource
from capture.mysql.signals import MySqlSignalTable
from capture.mysql.snapshot import Snapshot
from capture.mysql.source_checks import check_source_settings
from capture.mysql.state import StreamState, load_state, save_state
from capture.mysql.streaming.transactions import Transaction, TransactionAssembler
from capture.mysql.table_plan import TablePlan, planner_of
from capture.mysql.types.charsets import Charsets, server_charsets
from capture.position import ResumePoint
from capture.records import SchemaRecord
from capture.resync import ResyncRequest
from capture.source_topics import SourceTopics
from capture.spill import SPILL_DIRECTORY, PausingFullDisk, SpillBudget, SpillDirectory
from capture.stats import CaptureStats
from capture.transaction_records import TransactionBoundaries
from core.log_config import LogConfig
from core.stop_request import SignalSafeEvent
from log.base import Log
from log.table_schemas import latest_schemas

logger = logging.getLogger(__name__)

#: Append when the server has sent nothing more, when this many records are pending ...
#: (20,000, as PostgreSQL's pieces: with 50,000 a spilled transaction's pieces, ~35 MB of
#: events each, left the allocator's heap 30-75 MiB larger after six pieces than after two.)
FLUSH_RECORDS = 20_000
#: ... or when the oldest pending record has waited this long (a long busy stream).
FLUSH_AFTER_S = 1.0
#: A transaction's records are built this many at a time (a large one is appended in pieces).
PIECE_RECORDS = 20_000
_RECONNECTS = 5
#: How often a spill write is retried while its disk is full.
SPILL_RETRY_S = 1.0


class _StoppedWhileFull(Exception):
    """Capture was asked to stop while a spill write waited for room (the session ends, nothing is lost)."""


@dataclass
class _Boundary:
    """A transaction as :class:`capture.transaction_records.TransactionBoundaries` reads it."""

    #: The id every event's ``transaction`` block has: the MariaDB GTID (``file:offset`` without one).
    transaction_id: str
    commit_ordinal: int
    commit_ts_us: int

    @classmethod
    def of(cls, transaction: Transaction) -> _Boundary:
        assert transaction.commit is not None
        ident = str(transaction.gtid) if transaction.gtid is not None else str(transaction.commit)
        return cls(ident, transaction.commit.ordinal(), transaction.timestamp * 1_000_000)


class MySqlAgent:
    """Captures one MySQL/MariaDB source (see the module docstring)."""

    def __init__(self, source: MySqlSource, log: Log, log_config: LogConfig, state_dir: Path) -> None:
        self.name = source.name
        self.source = source
        self.log = log
        self.state_dir = state_dir
        #: ``acked``: the binlog position saved after the last durable append (nothing is acknowledged to MySQL).
        self.stats = CaptureStats(acked=BinlogPosition("none.000000", 0))
        self._stop = SignalSafeEvent()
        self.topics = SourceTopics(log, log_config, source.name)
        self._charsets: Charsets | None = None
        self.planner = planner_of(source, self._known_charsets)
        self.builder = EventBuilder(
            source.name,
            self.planner.plan,
            source.wants,
            skipped_operations=frozenset(source.skipped_operations),
        )
        self._schemas: dict[str, tuple[bytes, int]] = {}
        #: Shapes whose schema record is known to be written (by identity, kept alive here).
        self._checked: dict[int, TableShape] = {}
        self._state: StreamState | None = None
        #: The binlog timestamp of the last transaction read (saved with the next position).
        self._commit_ts: int | None = None
        #: ``transactions: true``: BEGIN/END records in ``<source>.transaction``.
        self._boundaries = TransactionBoundaries(source.name) if source.transactions else None
        self.incremental = MySqlIncremental(source, self.builder, state_dir, self._schema_record)
        self._signals = MySqlSignalTable(source, source.signal_table) if source.signal_table else None

    def stop(self) -> None:
        """Finish the transaction in hand, append it, then let :meth:`run` return."""
        self._stop.set()

    # -- start --------------------------------------------------------------------------------

    def _server_charsets(self) -> Charsets:
        with self.source.address.connect() as conn:
            return server_charsets(conn)

    def _known_charsets(self) -> Charsets:
        assert self._charsets is not None, "charsets are read when run() starts"
        return self._charsets

    def current_position(self) -> StreamState:
        """The server's binlog end now (and its GTID position on MariaDB)."""
        with self.source.address.connect() as conn, conn.cursor() as cur:
            cur.execute("SHOW MASTER STATUS")
            row = cur.fetchone()
            if row is None:
                msg = f"source {self.name}: the server's binary log is off: capture needs log_bin"
                raise BinlogStreamError(msg)
            position = BinlogPosition(str(row[0]), int(row[1]))
            gtids = GtidPosition()
            try:
                cur.execute("SELECT @@global.gtid_binlog_pos")
                gtid_row = cur.fetchone()
                gtids = GtidPosition.parse(str(gtid_row[0] or "")) if gtid_row else GtidPosition()
            except Exception:  # MySQL has no gtid_binlog_pos: file positions only
                gtids = GtidPosition()
        return StreamState(position, gtids)

    def _load_schemas(self) -> None:
        for topic, record in latest_schemas(self.log, f"{self.name}.").items():
            if "columns" in record and "version" in record:
                self._schemas[topic] = (_fingerprint(record), int(record["version"]))

    def _decoder(self, shape: TableShape) -> RowDecoder:
        return RowDecoder(shape, self.source.modes, self._known_charsets(), skip=self.planner.plan(shape).skip)

    # -- streaming ----------------------------------------------------------------------------

    def run(self, *, until_caught_up: bool) -> CaptureStats:
        """Snapshot on the first run (``snapshot: initial``), then stream; see the module docstring."""
        collector = space_young_collections()
        try:
            return self._run(until_caught_up=until_caught_up)
        finally:
            restore_collections(collector)

    def _run(self, *, until_caught_up: bool) -> CaptureStats:
        self._charsets = self._server_charsets()
        # Settings naming what the database lacks, or a filter capture cannot evaluate: refused before reading.
        check_source_settings(self.source, self.planner)
        if self._signals is not None:
            self._signals.check()
        self._load_schemas()
        resume = ResumePoint.load(self.log, self.topics.of_source())
        appender = Appender(
            self.name, self.log, self.topics, self.stats, self._stop, retry_s=1.0, on_flushed=lambda: None
        )
        state = load_state(self.state_dir)
        request = ResyncRequest.load(self.state_dir)
        if request is not None:
            state = self._resync(appender, resume, request)
        elif state is None:
            if self.source.snapshot == "initial":
                snapshot = Snapshot(self.source, self.builder, self.state_dir, self._schema_record)
                state = snapshot.run(appender, resume)
                self.stats.events += snapshot.rows
            else:
                state = self.current_position()
            # Saved once the snapshot is durable: from here on a restart streams.
            save_state(self.state_dir, state)
        self._state = state
        self.stats.acked = state.position
        failures = 0
        while not self._stop.is_set():
            try:
                caught_up = self._stream(appender, resume, blocking=not until_caught_up)
                failures = 0
                # --until-caught-up returns once the incremental snapshots queued are done too.
                if caught_up and (self._stop.is_set() or not self.incremental.pending):
                    break
            except BinlogPurgedError as exc:
                msg = (
                    f"source {self.name}: {exc}; run `headwater source resync {self.name}`: the next capture "
                    "re-snapshots every table and deletes the rows removed meanwhile"
                )
                raise BinlogPurgedError(msg) from None
            except BinlogStreamError as exc:
                failures += 1
                appender.clear()
                self.incremental.reset()  # the chunk in flight and its unsaved progress: read again
                if self._signals is not None:
                    self._signals.reset()
                resume = ResumePoint.load(self.log, self.topics.of_source())
                if failures > _RECONNECTS:
                    raise
                logger.warning("source %s: %s; reconnecting from %s", self.name, exc, self._state.position)
                self.stats.reconnects += 1
                self._stop.wait(min(2.0**failures, 30.0))
        return self.stats

    def _resync(self, appender: Appender, resume: ResumePoint, request: ResyncRequest) -> StreamState:
        """Carry out a requested resync (:mod:`capture.mysql.resync`) from its start; returns where streaming starts."""
        logger.warning("source %s: re-snapshotting every table (%s)", self.name, request.reason)
        snapshot = Snapshot(self.source, self.builder, self.state_dir, self._schema_record)
        snapshot.forget()  # an interrupted resync never resumes a half snapshot: the key set must be whole
        # Before the re-snapshot appends anything: the deletes read each topic up to here only.
        ends = {topic: self.topics.end_offsets(topic) for topic in self.topics.of_source()}
        with KeySet(key_set_path(self.state_dir)) as keys:
            state = snapshot.run(appender, resume, keys=keys)
            self.stats.events += snapshot.rows
            gone = register_gone_tables(self.source, ends, keys)
            if gone:  # before any delete: a table hidden from the capture user is not a dropped one
                with self.source.address.connect() as conn:
                    confirm_gone(conn, self.source, appender.log, gone)
            for topic in gone:
                logger.warning(
                    "source %s: %s: its table does not exist at the resync's binlog point (dropped or renamed "
                    "while the binlog was not read), so every row the log holds for it is deleted",
                    self.name,
                    topic,
                )
            if "d" in self.source.skipped_operations:
                logger.warning(
                    "source %s: deletes are skipped (skipped_operations), so rows deleted while the binlog was "
                    "not read stay in the log",
                    self.name,
                )
            else:
                self.stats.events += append_vanished_key_deletes(
                    appender, resume, self.builder, keys, state, ends=ends, gone=gone, batch_records=FLUSH_RECORDS
                )
        # Only now that the re-snapshot and its deletes are durable; a crash between these two lines
        # streams from the point the completed snapshot recorded (Snapshot.run returns it at once).
        request.clear()
        save_state(self.state_dir, state)
        return state

    def _stream(self, appender: Appender, resume: ResumePoint, *, blocking: bool) -> bool:
        """Read from the saved state; True when a non-blocking read reached the binlog's end."""
        assert self._state is not None
        state = self._state
        assembler = TransactionAssembler(self.source.wants, self._decoder, spill=self._spill_directory())
        assembler.file = state.position.file
        gtids = state.gtids
        pending_since: float | None = None
        stream = BinlogStream(
            self.source.address,
            server_id=self.source.server_id,
            start=state.position,
            blocking=blocking,
            heartbeat_s=self.source.heartbeat_s,
        )
        with stream:
            try:
                for raw in stream.events():
                    transaction = assembler.feed(raw)
                    if transaction is not None:
                        if transaction.gtid is not None:
                            gtids = gtids.advanced(transaction.gtid)
                        self._commit_ts = transaction.timestamp
                        assert transaction.commit is not None
                        self._append_chunk(
                            appender, resume, self.incremental.before(transaction.commit, resume.highest())
                        )
                        try:
                            complete = self._add(appender, resume, transaction)
                        except _StoppedWhileFull:  # its last spill batch waited for room
                            complete = False
                        finally:
                            transaction.release()
                        if not complete:
                            # Stopped inside it: what is pending is appended but no position saved (the
                            # assembler's is past it), so a restart reads it again and skips what the log holds.
                            appender.flush(resume, None)
                            return True
                        pending_since = pending_since or time.monotonic()
                    if not assembler.idle:
                        continue
                    if self._stop.is_set():
                        self._flush(appender, resume, assembler.position, gtids)
                        return True
                    if stream.idle() and self.incremental.pending:
                        self._snapshot_chunks(appender, resume, assembler.position, gtids, stream.idle)
                        pending_since = None
                    if pending_since is not None:
                        # Between transactions: append when the server has nothing more for now (lowest
                        # latency), else in big batches (fewer fsyncs while reading a backlog).
                        waited = time.monotonic() - pending_since > FLUSH_AFTER_S
                        if len(appender.records) >= FLUSH_RECORDS or waited or stream.idle():
                            self._flush(appender, resume, assembler.position, gtids)
                            pending_since = None
                    elif raw.header.type == EventType.HEARTBEAT:
                        # Idle: save how far the binlog was read (events of other tables need no rereading).
                        self._flush(appender, resume, assembler.position, gtids)
            except _StoppedWhileFull:
                # Stopped while a spill write of an open transaction waited for room: it is dropped (read
                # again next time); the complete ones pending are appended and their position saved.
                self._flush(appender, resume, assembler.position, gtids)
                return True
            finally:
                assembler.discard()
        self._flush(appender, resume, assembler.position, gtids)
        if self.incremental.pending and not self._stop.is_set():
            # The binlog's end: chunks read now are at it (emitted at once) or past it (read on, next session).
            self._snapshot_chunks(appender, resume, assembler.position, gtids, lambda: True)
        return True

    def _snapshot_chunks(
        self,
        appender: Appender,
        resume: ResumePoint,
        position: BinlogPosition | None,
        gtids: GtidPosition,
        idle: Callable[[], bool],
    ) -> None:
        """Between transactions at ``position``: emit the chunk in flight once due, read the next ones while ``idle``.

        Everything pending is appended first (the chunk's rows follow every streamed change before
        them); on a quiet source each chunk's point is ``position`` itself, so chunk after chunk is
        read and emitted until the server sends something.
        """
        self._flush(appender, resume, position, gtids)
        if position is None:
            return
        while not self._stop.is_set():
            chunk = self.incremental.at(position, resume.highest())
            if chunk is not None:
                self._append_chunk(appender, resume, chunk)
                self._flush(appender, resume, position, gtids)
            if self.incremental.in_flight or not self.incremental.wants_chunk() or not idle():
                return
            self.incremental.read_chunk()

    def _append_chunk(self, appender: Appender, resume: ResumePoint, chunk: ChunkRows | None) -> None:
        """Add a chunk due to the pending records, after appending the stream's changes before it (saves no position).

        Its schema record (a shape new to the topic) must follow those changes, which may be in an older shape.
        """
        if chunk is None:
            return
        appender.flush(resume, None)
        if chunk.schema is not None:
            appender.schemas.append(chunk.schema)
        appender.records.extend(chunk.rows)
        self.stats.events += len(chunk.rows)

    def _spill_directory(self) -> SpillDirectory:
        """This session's spill directory, emptied (what a killed run left is read again from the binlog)."""
        full_disk = PausingFullDisk(
            say=lambda line: logger.warning("source %s: %s", self.name, line),
            keep_alive=lambda: None,  # the binlog dump needs no status; a connection lost meanwhile is reopened
            stopped=self._stop.wait,
            stop_error=_StoppedWhileFull,
            retry_s=SPILL_RETRY_S,
        )
        budget = SpillBudget(self.source.spill_threshold_bytes)
        spill = SpillDirectory(self.state_dir / SPILL_DIRECTORY, full_disk, budget)
        spill.clear()
        return spill

    def _schema_record(self, plan: TablePlan) -> SchemaRecord | None:
        """The schema record of ``plan`` when its topic has not had this shape (columns and key) yet."""
        version = self._schemas.get(plan.topic, (b"", 0))[1] + 1
        record = schema_record(plan, version, self.source.modes)
        fingerprint = _fingerprint(orjson.loads(record.value))
        known = self._schemas.get(plan.topic)
        if known is not None and known[0] == fingerprint:
            return None
        self._schemas[plan.topic] = (fingerprint, version)
        return record

    def _add(self, appender: Appender, resume: ResumePoint, transaction: Transaction) -> bool:
        """Build ``transaction``'s records into the pending ones, ``PIECE_RECORDS`` at a time.

        Returns whether it was added whole (False: stopped between pieces). Pending records are
        appended between pieces once ``FLUSH_RECORDS`` wait, with no position saved (see the
        module docstring).
        """
        self.stats.transactions += 1
        # Changes of one table shape share its shape object: each distinct one is checked once per run.
        for shape in transaction.shapes():
            if self._checked.get(id(shape)) is shape:
                continue
            record = self._schema_record(self.planner.plan(shape))
            if record is not None:
                appender.schemas.append(record)
            self._checked[id(shape)] = shape
        built = self.builder.records(transaction)
        counting = self._boundaries.start(_Boundary.of(transaction)) if self._boundaries is not None else None
        pending = appender.records
        piece = list(islice(built, PIECE_RECORDS))
        while piece:
            self.stats.events += len(piece)
            begin = counting.add(piece) if counting is not None else None
            if begin is not None:
                pending.append(begin)
            pending.extend(piece)
            if self._signals is not None:
                self._signals.collect(piece)
            piece = list(islice(built, PIECE_RECORDS))
            if piece and len(pending) >= FLUSH_RECORDS:
                appender.flush(resume, None)  # saves no position: this transaction is not whole in the log yet
                if self._stop.is_set():
                    return False
        if counting is not None and (end := counting.end()) is not None:
            pending.append(end)
        return True

    def _flush(
        self, appender: Appender, resume: ResumePoint, position: BinlogPosition | None, gtids: GtidPosition
    ) -> None:
        appender.flush(resume, None)
        # Both only now that what they follow is durable, before the position past it is saved.
        if self._signals is not None:
            self._signals.act(self.incremental)
        self.incremental.flushed()
        if position is not None and self._state is not None and position != self._state.position:
            # Saved only now: every transaction before ``position`` is durable in the log.
            self._state = StreamState(position, gtids, self._commit_ts or self._state.commit_ts)
            save_state(self.state_dir, self._state)
            self.stats.acked = position


def _fingerprint(record: Mapping[str, Any]) -> bytes:
    """What makes a schema record's shape: its columns and key (its version aside)."""
    return orjson.dumps([record.get("columns"), record.get("key"), record.get("key_source")])
