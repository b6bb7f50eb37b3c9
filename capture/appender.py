"""Pending records and batches -> the log, then the acknowledgement to the source.

Resume points and invariants:

* Schemas are appended before the records of a flush: a reader never meets an event
  whose columns it cannot know.
* The end position of the last complete transaction (PostgreSQL: its end LSN) is acknowledged
  only after every append of the flush returned (fsynced), so a restart resumes at or before it.
* Records the log already holds (:class:`capture.position.ResumePoint`) are skipped, so
  a transaction re-sent after a crash between two appends is written once.
* When the log cannot take an append (disk full, broker down) nothing is acknowledged:
  the appender says so once, keeps the source's connection alive and retries.
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, cast

from capture.position import ResumePoint
from capture.quarantine import append_or_quarantine
from capture.records import OutRecord, PartitionBatch, SchemaRecord
from capture.source_kind import Acknowledgement
from capture.source_topics import SourceTopics
from capture.stats import CaptureStats
from core.errors import one_line
from log.base import Log, Record, TopicPartition, append_keyed
from log.encoded_batches import AppendsEncodedBatches
from log.errors import LogUnavailableError
from log.partitioner import partition_for
from log.position import Position
from log.topics import SCHEMAS_TOPIC
from native import speedups

logger = logging.getLogger(__name__)


class Appender:
    """Holds what is ready for the log and appends it (see the module docstring).

    ``records`` are in sequence order; ``batches`` (natively encoded snapshot batches, file
    log only) are appended before them and ``schemas`` before both. ``end`` is the end LSN
    to acknowledge once they are durable (None: nothing to acknowledge). ``on_flushed`` runs
    after every flush's appends (incremental snapshots save their progress then).
    """

    def __init__(
        self,
        source: str,
        log: Log,
        topics: SourceTopics,
        stats: CaptureStats,
        stop: threading.Event,
        *,
        retry_s: float,
        on_flushed: Callable[[], None],
    ) -> None:
        self.source = source
        self.log = log
        self.topics = topics
        self.stats = stats
        self._stop = stop
        self._retry_s = retry_s
        self._on_flushed = on_flushed
        self.records: list[OutRecord] = []
        self.batches: list[tuple[str, PartitionBatch]] = []
        self.schemas: list[SchemaRecord] = []
        self.end: Position | None = None
        #: While a native snapshot runs: threads appending pending batches of distinct partitions together.
        self.batch_appenders: ThreadPoolExecutor | None = None

    def clear(self) -> None:
        """Drop what is pending (the replication connection was lost: the slot re-sends it)."""
        self.records.clear()
        self.schemas.clear()
        self.end = None

    def flush(self, resume: ResumePoint, stream: Acknowledgement | None) -> None:
        """Append pending records (skipping those the log holds), then acknowledge.

        When the log cannot take them (disk full, broker down) nothing is acknowledged:
        the agent says so once, keeps the replication connection alive, retries every
        ``retry_s`` and goes on when an append works. A failed append leaves
        nothing behind, and the partitions appended before it are skipped on retry.
        """
        paused_at: float | None = None
        while True:
            try:
                if paused_at is not None:  # a failed Kafka append may have landed: skip what did
                    resume.refresh(self.log, self.topics.of_source())
                self._append_pending(resume, recheck=paused_at is not None)
                break
            except (LogUnavailableError, OSError) as exc:
                if isinstance(exc, OSError) and exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                if paused_at is None:
                    paused_at = time.monotonic()
                    logger.warning("%s", self._pause_message(exc))
                if self._stop.wait(self._retry_s):
                    msg = (
                        f"source {self.source}: stopped while the log could not be written ({one_line(exc)}); "
                        f"nothing after {self.stats.acked} was acknowledged, so the next run resumes there"
                    )
                    raise LogUnavailableError(msg) from None
                if stream is not None:
                    stream.send_status(self.stats.acked)  # keeps the session alive (PostgreSQL: wal_sender_timeout)
        if paused_at is not None:
            logger.warning(
                "source %s: log writable again; capture resumed after %.1fs",
                self.source,
                time.monotonic() - paused_at,
            )
        self._on_flushed()
        if self.end is not None and stream is not None:
            # Acknowledged only after the appends above returned (fsynced): a restart
            # resumes at or before this position.
            stream.send_status(self.end)
            self.stats.acked = self.end
            self.end = None

    def _pause_message(self, exc: BaseException) -> str:
        cause = exc if isinstance(exc, OSError) else exc.__cause__
        where = getattr(self.log, "root", None)
        every = f"retrying every {self._retry_s:g}s"
        if isinstance(cause, OSError) and cause.errno in (errno.ENOSPC, errno.EDQUOT):
            return f"log disk full at {where}: capture paused, not acknowledging; {every}"
        return f"log unavailable ({one_line(exc)}): capture paused, not acknowledging; {every}"

    def _append_pending(self, resume: ResumePoint, *, recheck: bool) -> None:
        """Append schemas, then pending batches, then pending records per (topic, partition); clears what it wrote."""
        if self.schemas:
            self.topics.ensure(SCHEMAS_TOPIC)
            # Schemas go first: a reader never meets an event whose columns it cannot know.
            append_keyed(self.log, SCHEMAS_TOPIC, [Record(s.topic.encode(), s.value) for s in self.schemas])
            self.schemas.clear()
        self._append_batches(resume)
        pending = self.records
        # Pending records are in sequence order, so when the log holds nothing at or past the
        # first one (always, except right after a restart) no record needs the skip check.
        check = bool(pending) and (recheck or resume.may_hold(pending[0].commit_lsn, pending[0].txn_index))
        partitions = self.topics.counts
        grouped = None
        if not check and speedups is not None:
            # The loop below in one native call (same groups, same order); a topic not yet
            # created comes back by name.
            while isinstance(grouped := speedups.group_records(pending, partitions), str):
                self.topics.ensure(grouped)
        groups: dict[str, list[list[OutRecord]]] = grouped if grouped is not None else {}
        for record in pending if grouped is None else ():
            topic = record.topic
            buckets = groups.get(topic)
            if buckets is None:
                count = partitions.get(topic) or self.topics.ensure(topic)
                buckets = groups[topic] = [[] for _ in range(count)]
            partition = 0 if record.key is None or len(buckets) == 1 else partition_for(record.key, len(buckets))
            if check and resume.already_stored(TopicPartition(topic, partition), record.sequence, record.key):
                self.stats.records_skipped += 1
                continue
            buckets[partition].append(record)
        for topic, buckets in groups.items():
            for partition, records in enumerate(buckets):
                if not records:
                    continue
                # An OutRecord has every field of a Record: appended as it is, no copy per record.
                append_or_quarantine(self.log, topic, partition, records, self.topics.ensure)
                last = records[-1]
                resume.advance_to(TopicPartition(topic, partition), last.commit_lsn, last.txn_index)
                self.stats.records_written += len(records)
        pending.clear()

    def _append_batches(self, resume: ResumePoint) -> None:
        """Append the pending batches, each dropped once durable (a failed one stays for the retry).

        A failed file-log append leaves nothing behind, so a retry goes on from the batches still
        pending. The batches of distinct partitions at the head of the list are appended together
        by ``batch_appenders`` when set: their fsyncs overlap (3 partitions: ~5x less wall time
        than one after another on this disk); a partition's own batches stay in order.
        """
        batches = self.batches
        while batches:
            run: dict[tuple[str, int], int] = {}
            for at, (topic, encoded) in enumerate(batches):
                if (topic, encoded.partition) in run:
                    break
                run[topic, encoded.partition] = at
            head = batches[: len(run)]
            pool = self.batch_appenders
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
