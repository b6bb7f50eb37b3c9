"""One replication session: frames -> pgoutput messages -> committed transactions -> pending records.

Each committed transaction's events join the appender's pending records; they are
appended and the transaction's end LSN acknowledged when a batch is full, when the
stream goes quiet, and at a stop (always at a transaction boundary). Headwater's own
markers (:mod:`capture.markers`: heartbeats, the caught-up marker) are acknowledged once
everything before them is durable; every other non-transactional logical message is an
event of ``<source>.message`` at ``(its LSN, 0)``. Incremental snapshots
(:mod:`capture.incremental_snapshotter`) read their chunks between stream polls, and their
rows join the pending records at the HIGH watermark's transaction. Per source settings: the
operations not written (``skipped_operations``), BEGIN/END records of each transaction
(``transactions``, :mod:`capture.transaction_records`) and the signal table
(:mod:`capture.signals`), whose inserted rows are acted on once their transaction arrives.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import psycopg

from capture.appender import Appender
from capture.events import EventBuilder
from capture.incremental_snapshotter import IncrementalSnapshotter
from capture.markers import CAUGHT_UP, HEARTBEAT, emit_marker, is_marker, marker_of
from capture.pgoutput import PgoutputDecoder
from capture.pgoutput_messages import Delete, Insert, LogicalMessage, Truncate, Update
from capture.position import ResumePoint
from capture.retry_report import RetryReport
from capture.signals import Signal, SignalTable
from capture.stats import CaptureStats
from capture.stream import ReplicationLostError, ReplicationStream, StreamOptions, WalMessage, libpq_speedups
from capture.transaction_records import TransactionBoundaries
from capture.transactions import Transaction, TransactionAssembler
from log.sequence import Lsn
from native import speedups

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
        settings: StreamedSettings | None = None,
    ) -> None:
        self._dsn = dsn
        self._options = options
        self._appender = appender
        self._stats: CaptureStats = appender.stats
        self.incremental = incremental
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
        assembler = TransactionAssembler()
        stream.start(Lsn(0))
        self._retry.resumed()
        appender, pending, incremental = self._appender, self._appender.records, self.incremental
        last_heartbeat = time.monotonic()
        max_batch = self._max_batch
        decode, feed, open_lists = decoder.decode, assembler.feed, assembler.open_lists
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
                                signals = self._add_transaction(builder, done)
                                if signals:
                                    self._act_on(sql_conn, signals, resume)
                                if len(pending) >= max_batch:
                                    appender.flush(resume, stream)
                                if self._stop.is_set():
                                    stopping = True  # at a transaction boundary: flush and acknowledge below
                                    break
                            elif self._on_loose_message(builder, done.message, marker, resume, stream):
                                self.caught_up = True
                                if not incremental.pending:
                                    return True
                        elif frame.reply_requested:
                            stream.send_status(self._stats.acked_lsn)
                    if stopping:
                        break
                if appender.end is not None:
                    appender.flush(resume, stream)
                if self.caught_up and not incremental.pending:
                    return True  # caught up, and the incremental snapshots running then are done
                now = time.monotonic()
                if now - last_heartbeat >= self._heartbeat_interval_s:
                    # A heartbeat message flows through the slot even when only unpublished
                    # tables change, so the acknowledged LSN (and retained WAL) keeps moving.
                    write_marker(sql_conn, HEARTBEAT, slot=self._options.slot, dsn=self._dsn)
                    last_heartbeat = now
                try:
                    appender.schemas.extend(incremental.poll(sql_conn, builder))
                except psycopg.OperationalError as exc:
                    raise ReplicationLostError.from_psycopg(exc, slot=self._options.slot, dsn=self._dsn) from None
            appender.flush(resume, stream)
            return False
        finally:
            stream.close()

    def _add_transaction(self, builder: EventBuilder, txn: Transaction) -> list[Signal]:
        """Build a committed transaction's records into the pending ones; the signals it holds."""
        if self._skipped:
            kept = [i for i, change in enumerate(txn.changes) if not isinstance(change, self._skipped)]
            if len(kept) != len(txn.changes):
                lsns = txn.lsns if len(txn.lsns) == len(txn.changes) else [0] * len(txn.changes)
                txn.changes, txn.lsns = [txn.changes[i] for i in kept], [lsns[i] for i in kept]
        signals = self._signals.signals_in(txn) if self._signals is not None else []
        records, schemas = builder.build(txn)
        boundaries = self._boundaries.records(txn, records) if self._boundaries is not None else None
        records.extend(self.incremental.on_transaction(txn, records, builder))
        events = len(records) - sum(1 for r in records if r.value is None)
        appender = self._appender
        if boundaries is not None:
            appender.records.append(boundaries[0])
            records.append(boundaries[1])
        appender.records.extend(records)
        appender.schemas.extend(schemas)
        appender.end = txn.end_lsn
        stats = self._stats
        stats.transactions += 1
        stats.events += events
        return signals

    def _act_on(self, sql_conn: psycopg.Connection[Any], signals: list[Signal], resume: ResumePoint) -> None:
        """Carry out signals once the transaction that wrote them is in the log, before it is acknowledged.

        Acknowledged at the next flush: a connection lost meanwhile makes the slot send the
        transaction again, and the signal is carried out then (``capture.signals`` skips it if it was).
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
        # Every transaction committed before this message has been received: once the
        # pending ones are durable, the message's LSN is safe to acknowledge.
        appender.flush(resume, stream)
        if message.lsn > self._stats.acked_lsn and not appender.records:
            self._stats.acked_lsn = message.lsn
            stream.send_status(message.lsn)
        return marker is not None and marker_of(message) == (CAUGHT_UP, marker)
