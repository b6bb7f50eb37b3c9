"""One replication session: frames -> pgoutput messages -> committed transactions -> pending records.

Each committed transaction's events join the appender's pending records; they are
appended and the transaction's end LSN acknowledged when a batch is full, when the
stream goes quiet, and at a stop (always at a transaction boundary). Internal logical
messages (heartbeats, the caught-up marker) are acknowledged once everything before them
is durable. Incremental snapshots (:mod:`capture.incremental_snapshotter`) read their chunks
between stream polls, and their rows join the pending records at the HIGH watermark's
transaction.
"""

from __future__ import annotations

import secrets
import threading
import time
from typing import Any

import psycopg

from capture.appender import Appender
from capture.events import INTERNAL_MESSAGE_PREFIX, EventBuilder
from capture.incremental_snapshotter import IncrementalSnapshotter
from capture.pgoutput import PgoutputDecoder
from capture.pgoutput_messages import LogicalMessage
from capture.position import ResumePoint
from capture.retry_report import RetryReport
from capture.stats import CaptureStats
from capture.stream import ReplicationLostError, ReplicationStream, StreamOptions, WalMessage, libpq_speedups
from capture.transactions import Transaction, TransactionAssembler
from log.sequence import Lsn
from native import speedups

CAUGHT_UP_PREFIX = f"{INTERNAL_MESSAGE_PREFIX}caught_up"
HEARTBEAT_PREFIX = f"{INTERNAL_MESSAGE_PREFIX}heartbeat"


def emit_marker(conn: psycopg.Connection[Any], prefix: str, *, slot: str, dsn: str) -> str:
    """Write a non-transactional logical message with a fresh token into the WAL; the token."""
    token = secrets.token_hex(8)
    try:
        conn.execute("SELECT pg_logical_emit_message(false, %s, %s)", (prefix, token))
    except psycopg.OperationalError as exc:
        raise ReplicationLostError.from_psycopg(exc, slot=slot, dsn=dsn) from None
    return token


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
                                self._add_transaction(builder, done)
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
                    emit_marker(sql_conn, HEARTBEAT_PREFIX, slot=self._options.slot, dsn=self._dsn)
                    last_heartbeat = now
                try:
                    appender.schemas.extend(incremental.poll(sql_conn, builder))
                except psycopg.OperationalError as exc:
                    raise ReplicationLostError.from_psycopg(exc, slot=self._options.slot, dsn=self._dsn) from None
            appender.flush(resume, stream)
            return False
        finally:
            stream.close()

    def _add_transaction(self, builder: EventBuilder, txn: Transaction) -> None:
        records, schemas = builder.build(txn)
        records.extend(self.incremental.on_transaction(txn, records, builder))
        appender = self._appender
        appender.records.extend(records)
        appender.schemas.extend(schemas)
        appender.end = txn.end_lsn
        stats = self._stats
        stats.transactions += 1
        stats.events += len(records) - sum(1 for r in records if r.value is None)

    def _on_loose_message(
        self,
        builder: EventBuilder,
        message: LogicalMessage,
        marker: str | None,
        resume: ResumePoint,
        stream: ReplicationStream,
    ) -> bool:
        if not message.prefix.startswith(INTERNAL_MESSAGE_PREFIX):
            # A user's non-transactional message is an event of its own at (its LSN, 0): every
            # transaction sent before it committed before it, every one after commits after it.
            appender = self._appender
            appender.records.append(builder.loose_message(message, now_us=time.time_ns() // 1000))
            if appender.end is None or message.lsn > appender.end:
                appender.end = message.lsn
            self._stats.events += 1
            return False
        # Every transaction committed before this message has been received: once the
        # pending ones are durable, the message's LSN is safe to acknowledge.
        self._appender.flush(resume, stream)
        if message.lsn > self._stats.acked_lsn and not self._appender.records:
            self._stats.acked_lsn = message.lsn
            stream.send_status(message.lsn)
        return marker is not None and message.prefix == CAUGHT_UP_PREFIX and message.content.decode() == marker
