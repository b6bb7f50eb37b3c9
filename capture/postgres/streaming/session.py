"""One replication session: frames -> pgoutput messages -> committed transactions -> pending records.

Each committed transaction's events join the appender's pending records; they are
appended and the transaction's end LSN acknowledged when a batch is full, when the
stream goes quiet, and at a stop (always at a transaction boundary). Headwater's own
markers (:mod:`capture.postgres.streaming.markers`: heartbeats, the caught-up marker) are acknowledged once
everything before them is durable; every other non-transactional logical message is an
event of ``<source>.message`` at ``(its LSN, 0)``. Incremental snapshots
(:mod:`capture.postgres.snapshot.incremental`) read their chunks between stream polls, and their
rows join the pending records at the HIGH watermark's transaction. Per source settings: the
operations not written (``skipped_operations``), BEGIN/END records of each transaction
(``transactions``, :mod:`capture.transaction_records`) and the signal table
(:mod:`capture.postgres.streaming.signals`), whose inserted rows are acted on once their transaction arrives.

Large transactions: the assembler spills changes past ``spill_threshold_bytes`` to
``capture/<source>/spill/`` (:mod:`capture.spill`), and a committed transaction's events are
built and appended a piece of ``max_batch_records`` changes at a time. A flush in the middle of
a transaction acknowledges nothing of it (its end LSN is set after its last piece), so a crash
between pieces re-sends the whole transaction and :class:`capture.position.ResumePoint` skips
the pieces the log holds, partition by partition. A stop between pieces ends the session there
the same way, rather than after minutes of appending. Each piece sends a standby status, so the
walsender does not time the session out while a large transaction is appended.
"""

from __future__ import annotations

import logging
import resource
import sys
import threading
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import psycopg

from capture.appender import Appender
from capture.position import ResumePoint
from capture.postgres.decoding.pgoutput import PgoutputDecoder
from capture.postgres.decoding.pgoutput_messages import Delete, Insert, LogicalMessage, Truncate, Update
from capture.postgres.events.builder import EventBuilder
from capture.postgres.snapshot.incremental import IncrementalSnapshotter
from capture.postgres.streaming.connection import (
    ReplicationLostError,
    ReplicationStream,
    StreamOptions,
    WalMessage,
    acked_lsn,
    libpq_speedups,
)
from capture.postgres.streaming.markers import CAUGHT_UP, HEARTBEAT, emit_marker, is_marker, marker_of
from capture.postgres.streaming.schema_watch import SCHEMA_CHECK, SchemaWatch
from capture.postgres.streaming.signals import Signal, SignalTable
from capture.postgres.streaming.transactions import Transaction, TransactionAssembler
from capture.retry_report import RetryReport
from capture.spill import PausingFullDisk, SpillBudget, SpillDirectory
from capture.stats import CaptureStats
from capture.transaction_records import TransactionBoundaries
from log.sequence import Lsn
from log.sequence import Sequence as Seq
from native import speedups

logger = logging.getLogger(__name__)

#: The change types of Debezium's ``skipped.operations`` letters.
_SKIPPABLE = {"c": Insert, "u": Update, "d": Delete, "t": Truncate}


def write_marker(
    conn: psycopg.Connection[Any], kind: str, *, slot: str, dsn: str, token: str | None = None
) -> str | None:
    """A non-transactional marker into the WAL (``token=""``: a fresh one, returned); a lost connection raises."""
    try:
        return emit_marker(conn, kind, token=token)
    except psycopg.OperationalError as exc:
        raise ReplicationLostError.from_psycopg(exc, slot=slot, dsn=dsn) from None


@dataclass(frozen=True)
class StreamedSettings:
    """What a source's settings change in the stream (see the module docstring)."""

    skipped_operations: Collection[str] = ()
    transactions: bool = False
    signals: SignalTable | None = None
    #: Where large transactions spill (``capture/<source>/spill``; None: they stay in memory).
    spill_dir: Path | None = None
    spill_threshold_bytes: int = 64 << 20
    #: How often a spill write is retried while its disk is full.
    spill_retry_s: float = 1.0


class _StoppedWhileFull(Exception):
    """Capture was asked to stop while a spill write waited for room (the session ends, nothing is lost)."""


class Streaming:
    """Streams the slot into the appender, one replication session per :meth:`session` call.

    ``caught_up`` outlives a session: once the caught-up marker was seen, a later session
    only waits for the incremental snapshots queued by then.
    """

    def __init__(
        self,
        dsn: str,
        options: StreamOptions,
        appender: Appender,
        incremental: IncrementalSnapshotter,
        *,
        retry: RetryReport,
        stop: threading.Event,
        max_batch_records: int,
        poll_timeout_s: float,
        heartbeat_interval_s: float,
        schema_watch: SchemaWatch,
        settings: StreamedSettings | None = None,
    ) -> None:
        self._dsn = dsn
        self._options = options
        self._appender = appender
        self._stats: CaptureStats = appender.stats
        self.incremental = incremental
        self.schema_watch = schema_watch
        self._retry = retry
        self._stop = stop
        self._max_batch = max_batch_records
        self._poll_timeout_s = poll_timeout_s
        self._heartbeat_interval_s = heartbeat_interval_s
        self.caught_up = False  # the caught-up marker was seen; waiting for incremental snapshots
        settings = settings or StreamedSettings()
        self._skipped = tuple(_SKIPPABLE[op] for op in settings.skipped_operations)
        self._boundaries = TransactionBoundaries(appender.source) if settings.transactions else None
        self._signals = settings.signals
        self._settings = settings

    def _spill_directory(self, stream: ReplicationStream) -> SpillDirectory | None:
        """This session's spill directory, emptied (what a killed run left is re-sent by the slot)."""
        settings = self._settings
        if settings.spill_dir is None:
            return None
        source = self._appender.source
        full_disk = PausingFullDisk(
            say=lambda line: logger.warning("source %s: %s", source, line),
            keep_alive=lambda: stream.send_status(acked_lsn(self._stats)),
            stopped=self._stop.wait,
            stop_error=_StoppedWhileFull,
            retry_s=settings.spill_retry_s,
        )
        spill = SpillDirectory(settings.spill_dir, full_disk, SpillBudget(settings.spill_threshold_bytes))
        spill.clear()
        return spill

    def session(
        self,
        sql_conn: psycopg.Connection[Any],
        builder: EventBuilder,
        resume: ResumePoint,
        marker: str | None,
    ) -> bool:
        """One replication session until stopped; True when caught up (``marker`` seen)."""
        stream = ReplicationStream(self._dsn, self._options)
        decoder = PgoutputDecoder(protocol_version=2)
        spill = self._spill_directory(stream)
        assembler = TransactionAssembler(spill)
        stream.start(Lsn(0))
        self._retry.resumed()
        appender, pending, incremental = self._appender, self._appender.records, self.incremental
        last_heartbeat = time.monotonic()
        max_batch = self._max_batch
        decode, feed, open_lists, spill_raw = decoder.decode, assembler.feed, assembler.open_lists, assembler.spill_raw
        # With the extension, the row changes of an open transaction go from a batch of frames
        # into it in one call (decoded as decode would, appended as feed would); every other
        # frame takes the loop below.
        take = speedups.take_changes if speedups is not None and libpq_speedups() is not None else None
        try:
            while not self._stop.is_set():
                stopping = False
                for batch in stream.batches(self._poll_timeout_s):
                    at, count = 0, len(batch)
                    while at < count:
                        if take is not None and (lists := open_lists()) is not None and not decoder.in_stream:
                            taken = at
                            at = take(batch, at, lists[0], lists[1])
                            if at > taken and spill is not None:
                                # take_changes takes WalMessages only
                                taken_frames = cast("list[WalMessage]", batch[taken:at])
                                assembler.took(at - taken, sum([len(frame.payload) for frame in taken_frames]))
                            if at >= count:
                                break
                        frame = batch[at]
                        at += 1
                        if isinstance(frame, WalMessage):
                            payload = frame.payload
                            if assembler.spilling and spill_raw(payload, frame.wal_start):
                                continue
                            done = feed(decode(payload), frame.wal_start, payload)
                            if done is None:
                                continue
                            if isinstance(done, Transaction):
                                try:
                                    complete, signals = self._add_transaction(builder, done, resume, stream)
                                finally:
                                    done.release()
                                if signals:
                                    self._act_on(sql_conn, signals, resume)
                                if len(pending) >= max_batch:
                                    appender.flush(resume, stream)
                                if self._stop.is_set() or not complete:
                                    stopping = True  # at a transaction boundary (or between pieces): flush below
                                    break
                            elif self._on_loose_message(builder, done.message, marker, resume, stream):
                                self.caught_up = True
                                if not incremental.pending:
                                    return True
                        elif frame.reply_requested:
                            stream.send_status(acked_lsn(self._stats))
                    if stopping:
                        break
                if appender.end is not None:
                    appender.flush(resume, stream)
                if self.caught_up and not incremental.pending and self.schemas_settled(sql_conn, builder):
                    return True  # caught up, and the incremental snapshots running then are done
                now = time.monotonic()
                if now - last_heartbeat >= self._heartbeat_interval_s:
                    # A heartbeat message flows through the slot even when only unpublished
                    # tables change, so the acknowledged LSN (and retained WAL) keeps moving.
                    write_marker(sql_conn, HEARTBEAT, slot=self._options.slot, dsn=self._dsn)
                    # DDL that no change follows is found in the catalog (capture.postgres.streaming.schema_watch).
                    self.check_schemas(sql_conn, builder)
                    last_heartbeat = now
                try:
                    appender.schemas.extend(incremental.poll(sql_conn, builder))
                except psycopg.OperationalError as exc:
                    raise ReplicationLostError.from_psycopg(exc, slot=self._options.slot, dsn=self._dsn) from None
                self.schema_watch.follow(builder, incremental)
            appender.flush(resume, stream)
            return False
        except _StoppedWhileFull:
            # Stopped while a spill write waited for room: the transaction spilling is dropped
            # (not acknowledged, so re-sent); what is complete is appended and acknowledged.
            appender.flush(resume, stream)
            return False
        finally:
            self._say_held(assembler, ended_by=sys.exc_info()[1])
            assembler.discard()
            stream.close()

    def _say_held(self, assembler: TransactionAssembler, *, ended_by: BaseException | None) -> None:
        """One line when a session ends with transactions open: what they held, in memory and on disk.

        A lost connection drops them (the slot re-sends them), so a memory that grows across
        reconnects without a spill shows here: the changes held, against the process's peak RSS.
        """
        held = assembler.holding()
        if not held.transactions:
            return
        peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        why = f"ended by {type(ended_by).__name__}" if ended_by is not None else "stopped"
        # A warning only where capture goes on (a lost connection, retried): a stop keeps its one error line.
        log = logger.warning if isinstance(ended_by, (ReplicationLostError, psycopg.OperationalError)) else logger.debug
        log(
            "source %s: replication session %s holding %s; peak RSS %.0f MiB; discarded (the slot re-sends them)",
            self._appender.source,
            why,
            held,
            peak_mib,
        )

    def check_schemas(self, sql_conn: psycopg.Connection[Any], builder: EventBuilder) -> None:
        """Compare the catalog with the schema records; a table that differs gets a marker in the stream."""
        try:
            self.schema_watch.check(sql_conn, builder, self.incremental)
        except psycopg.OperationalError as exc:
            raise ReplicationLostError.from_psycopg(exc, slot=self._options.slot, dsn=self._dsn) from None

    def schemas_settled(self, sql_conn: psycopg.Connection[Any], builder: EventBuilder) -> bool:
        """True when a last catalog check finds every table as its schema record says (none in flight)."""
        try:
            return self.schema_watch.settled(sql_conn, builder, self.incremental)
        except psycopg.OperationalError as exc:
            raise ReplicationLostError.from_psycopg(exc, slot=self._options.slot, dsn=self._dsn) from None

    def _add_transaction(
        self, builder: EventBuilder, txn: Transaction, resume: ResumePoint, stream: ReplicationStream
    ) -> tuple[bool, list[Signal]]:
        """Build a committed transaction's records into the pending ones, a piece at a time.

        Returns whether it was added whole (False: stopped between pieces, its end LSN not set,
        so nothing of it is acknowledged) and the signals it holds. Pending records are flushed
        between pieces once ``max_batch_records`` are pending; a large transaction is appended
        in several flushes (see the module docstring).
        """
        appender = self._appender
        pending, stats, max_batch = appender.records, self._stats, self._max_batch
        building = builder.start(txn)
        counting = self._boundaries.start(txn) if self._boundaries is not None else None
        signals: list[Signal] = []
        kept_before = 0  # changes kept (not skipped) in the pieces before this one: signals number them
        pieces = txn.pieces(max_batch)
        piece = next(pieces, None)
        while piece is not None:
            changes, lsns = piece
            if self._skipped:
                kept = [i for i, change in enumerate(changes) if not isinstance(change, self._skipped)]
                if len(kept) != len(changes):
                    changes, lsns = [changes[i] for i in kept], [lsns[i] for i in kept]
            if self._signals is not None:
                signals.extend(self._signals.signals_in(txn, changes, kept_before))
            kept_before += len(changes)
            records, schemas = building.add(changes, lsns)
            # Before the piece's records join the pending ones: a table that cannot be read again
            # stops capture here, with nothing more of the transaction appended and none of it
            # acknowledged (its end LSN is not set).
            self.schema_watch.follow(builder, self.incremental)
            begin = counting.add(records) if counting is not None else None
            records.extend(self.incremental.on_transaction(txn, records, builder, changes))
            stats.events += len(records) - sum(1 for r in records if r.value is None)
            if begin is not None:
                pending.append(begin)
            pending.extend(records)
            appender.schemas.extend(schemas)
            piece = next(pieces, None)
            if piece is not None and len(pending) >= max_batch:
                # Acknowledges only transactions complete before this one (appender.end).
                appender.flush(resume, stream)
                stream.send_status(acked_lsn(stats))  # the walsender waits on us: keep the session alive
                if self._stop.is_set():
                    return False, signals
        building.finish()
        if counting is not None and (end := counting.end()) is not None:
            pending.append(end)
        appender.end = txn.end_lsn
        stats.transactions += 1
        return True, signals

    def _act_on(self, sql_conn: psycopg.Connection[Any], signals: list[Signal], resume: ResumePoint) -> None:
        """Carry out signals once the transaction that wrote them is in the log, before it is acknowledged.

        Acknowledged at the next flush: a connection lost meanwhile makes the slot send the
        transaction again, and the signal is carried out then (``capture.postgres.streaming.signals`` skips it
        if it was).
        """
        assert self._signals is not None
        self._appender.flush(resume, None)
        try:
            self._signals.act(sql_conn, signals, self.incremental)
        except psycopg.OperationalError as exc:
            raise ReplicationLostError.from_psycopg(exc, slot=self._options.slot, dsn=self._dsn) from None

    def _on_loose_message(
        self,
        builder: EventBuilder,
        message: LogicalMessage,
        marker: str | None,
        resume: ResumePoint,
        stream: ReplicationStream,
    ) -> bool:
        """A non-transactional message: an event, or a marker acknowledged; True when it is ``marker``."""
        appender = self._appender
        if not is_marker(message.prefix):
            # A user's non-transactional message is an event of its own at (its LSN, 0): every
            # transaction sent before it committed before it, every one after commits after it.
            appender.records.append(builder.loose_message(message, now_us=time.time_ns() // 1000))
            if appender.end is None or message.lsn > appender.end:
                appender.end = message.lsn
            self._stats.events += 1
            return False
        kind = marker_of(message)
        if kind is not None and kind[0] == SCHEMA_CHECK:
            # Every transaction committed before the catalog was read is behind this message.
            at = Seq(message.lsn.value, 0)
            appender.schemas.extend(self.schema_watch.on_marker(kind[1], at, builder, self.incremental))
        # Every transaction committed before this message has been received: once the
        # pending ones are durable, the message's LSN is safe to acknowledge.
        appender.flush(resume, stream)
        if message.lsn > self._stats.acked and not appender.records:
            self._stats.acked = message.lsn
            stream.send_status(message.lsn)
        return marker is not None and marker_of(message) == (CAUGHT_UP, marker)
