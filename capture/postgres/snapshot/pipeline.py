"""How the snapshot overlaps its work: two reader connections, encoder threads, one append thread.

:class:`ChunkReaders` runs the next chunk's COPY on a second connection while the current
one is taken; :class:`SnapshotPipeline` (the native path, file log only) encodes pieces in
threads and appends them in order from one more thread. Both keep the snapshot's order:
rows reach the log in the order the reader submitted them, and a chunk counts as done only
after its last append.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import psycopg
from psycopg import sql

from capture.appender import Appender
from capture.position import ResumePoint
from capture.postgres.events.builder import EventBuilder
from capture.postgres.snapshot.copy_reader import read_chunk
from capture.postgres.snapshot.copy_text import CopyRows
from capture.postgres.snapshot.native_pass import ENCODE_THREADS, EncodedPiece, encode_piece
from capture.postgres.snapshot.plan import Chunk
from capture.postgres.streaming.connection import pinned_options
from capture.read_ahead import ReadAhead
from capture.records import OutRecord, PartitionBatch
from capture.source_kind import SnapshotProgress
from core.errors import one_line
from log.encoded_batches import AppendsEncodedBatches
from log.envelope import SnapshotMarker
from log.sequence import Sequence as Seq

logger = logging.getLogger(__name__)


class ChunkReaders:
    """Two connections on one snapshot taking turns at the chunks (the snapshot's reader, and one more).

    :meth:`start` begins a chunk's COPY in a thread (:class:`ReadAhead`) while the chunk before
    is still read on the other connection. The second connection is opened by the first read-ahead
    thread; when it cannot be (``max_connections``), :meth:`ready` says so and the snapshot's reader
    goes on alone.
    """

    def __init__(self, dsn: str, reader: psycopg.Connection[Any], snapshot: str) -> None:
        self._dsn = dsn
        self._snapshot = snapshot
        self._conns: list[psycopg.Connection[Any] | None] = [reader, None]
        self._opened = threading.Event()

    @classmethod
    def on_snapshot(cls, dsn: str, reader: psycopg.Connection[Any], exported: str | None) -> ChunkReaders | None:
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
        """Read the chunk at ``position`` of the reader's list on its connection, from now on."""
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


class SnapshotPipeline:
    """The native snapshot path: pieces encoded by threads, appended in order by one more thread.

    The snapshot reader's thread submits each COPY block (cut into pieces); ``ENCODE_THREADS``
    threads turn pieces into batches (the extension releases the GIL) while one writer thread
    appends finished pieces in submission order through :meth:`capture.appender.Appender.flush`
    (fsync per append, pause/retry on a full disk), so reading, encoding and disk writes overlap.
    While pieces are in flight only the writer touches the appender's pending lists; :meth:`drain`
    waits until every submitted piece is durable (before the reader appends anything itself).
    A chunk counts as done when the writer, after the chunk's last append, records it
    (:meth:`after_appends`), so the next chunk's COPY runs meanwhile; after a failed step the
    writer writes nothing more.
    """

    #: Pieces submitted but not yet appended (bounds memory: 2 MiB of COPY text each, and their
    #: batches: ~0.7 MB compressed, ~18 MB plain). Compressed, more of them ride out a slow fsync
    #: (an A/B at load 6-8: 0.66-1.01 s per 1M rows with 16, 0.79-1.23 s with 6).
    AHEAD = ENCODE_THREADS + 4
    AHEAD_COMPRESSED = 16

    def __init__(
        self,
        appender: Appender,
        builder: EventBuilder,
        resume: ResumePoint,
        progress: SnapshotProgress | None,
    ) -> None:
        self._appender = appender
        self._builder = builder
        self._resume = resume
        self._progress = progress
        self._encoders = ThreadPoolExecutor(ENCODE_THREADS, thread_name_prefix="snapshot-encode")
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="snapshot-append")
        appender.batch_appenders = ThreadPoolExecutor(PARALLEL_APPENDS, thread_name_prefix="snapshot-partition-append")
        self._appending: deque[Future[None]] = deque()
        self._failed = False  # set by the writer thread only
        self._topics: dict[str, int] = {}  # partition counts of the topics pieces were submitted for
        if not isinstance(appender.log, AppendsEncodedBatches):
            msg = "the native snapshot pass needs a log that appends encoded batches (the file log)"
            raise TypeError(msg)
        self._log: AppendsEncodedBatches = appender.log
        self._ahead = self.AHEAD if self._log.compression == "none" else self.AHEAD_COMPRESSED

    def submit(
        self,
        topic: str,
        relation_oid: int,
        data: bytes,
        pieces: list[tuple[int, int, int]],
        start: Seq,
        *,
        ts_us: int,
        marker: SnapshotMarker = SnapshotMarker.TRUE,
    ) -> int:
        """Encode and append the rows of ``data`` (COPY text, :func:`encodable`) from ``start``; the next index.

        ``pieces`` are ``data``'s :func:`copy_pieces`; every row is marked ``marker``.
        """
        partitions = self._topics.get(topic)
        if partitions is None:
            # The writer creates the topic before its first append; the encoders need only its count.
            partitions = self._topics[topic] = self._appender.topics.planned_partitions(topic)
            self.after_appends(functools.partial(self._appender.topics.ensure, topic))
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
                log=self._log,
                marker=marker,
            )
            self._appending.append(self._writer.submit(self._in_order, self._append, topic, job, piece[2]))
            index += piece[2]
            while len(self._appending) > self._ahead:
                self._appending.popleft().result()  # an append's error is raised here
        return index

    def append_schemas(self) -> None:
        """Append the pending schema records from the writer thread, before anything submitted later.

        The reader's thread adds no schema record while the pipeline runs (every table's was built
        before the first chunk), so from here on it looks at its pending records alone.
        """
        appender, resume = self._appender, self._resume
        schemas = list(appender.schemas)
        appender.schemas.clear()

        def append() -> None:
            appender.schemas[:0] = schemas
            appender.flush(resume, None)

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
        appenders, self._appender.batch_appenders = self._appender.batch_appenders, None
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
        appender, resume = self._appender, self._resume
        for part in job.result():
            if part and isinstance(part[0], PartitionBatch):
                appender.batches.extend((topic, batch) for batch in part if isinstance(batch, PartitionBatch))
            else:
                records = [record for record in part if isinstance(record, OutRecord)]
                appender.records.extend(records)
                appender.stats.events += len(records)
                rows -= 1  # a row the Python path built
            appender.flush(resume, None)
        appender.stats.events += rows
        if self._progress:
            self._progress.advance(rows)
