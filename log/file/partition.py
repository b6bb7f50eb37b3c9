"""One partition of the file backend: a directory of segments, read by many, written by one.

:class:`Partition` is what :class:`~log.file.backend.FileLog` holds per partition. It
serialises the process's reads and appends of the partition and puts together its parts:

* :mod:`log.file.partition_segments`: the directory's segments as this process sees them
  (re-listed and re-stated on every call, so other processes' appends, rolls, rewrites
  and deletions show up without reopening);
* :mod:`log.file.partition_reader`: records, record columns, the end offset, time lookups;
* :mod:`log.file.partition_writer`: the writer lock, torn-tail recovery against the
  recovery point, fsynced appends and segment rolls.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from log.base import AppendResult, Record, StoredRecord
from log.file.batch_codec import Compression
from log.file.partition_reader import PartitionReader
from log.file.partition_segments import PartitionSegments
from log.file.partition_writer import PartitionWriter

if TYPE_CHECKING:
    from log.columns import RecordColumns


class Partition:
    """Reads and appends one partition directory (thread-safe within a process)."""

    def __init__(
        self,
        directory: Path,
        topic: str,
        partition: int,
        *,
        fsync: bool,
        segment_bytes: int,
        shared_writer: bool = False,
        compression: Compression = "none",
    ) -> None:
        self.topic = topic
        self.partition = partition
        #: The segments, shared by reads, the writer and the cleaner (:mod:`log.file.compaction`).
        self.segments = PartitionSegments(directory)
        self._lock = threading.RLock()
        self._reader = PartitionReader(self.segments, topic, partition, self._lock)
        self._writer = PartitionWriter(
            self.segments,
            topic,
            partition,
            fsync=fsync,
            segment_bytes=segment_bytes,
            shared=shared_writer,
            compression=compression,
        )

    @property
    def directory(self) -> Path:
        """The partition's directory."""
        return self.segments.directory

    def read(self, offset: int, max_records: int, max_bytes: int) -> list[StoredRecord]:
        """Records at or after ``offset``: at most ``max_records``, about ``max_bytes``, at least one."""
        return self._reader.read(offset, max_records, max_bytes)

    def read_columns(self, offset: int, end: int, max_records: int, max_bytes: int) -> tuple[RecordColumns, int]:
        """The records :meth:`read` gives at ``offset`` (those before ``end``) as columns, and where to go on.

        See :meth:`log.file.partition_reader.PartitionReader.read_columns`.
        """
        return self._reader.read_columns(offset, end, max_records, max_bytes)

    def end_offset(self) -> int:
        """The offset the next appended record gets."""
        with self._lock:
            held = self._writer.next_offset
            return held if held is not None else self._reader.scanned_end_offset()

    def offset_for_time(self, timestamp_ms: int) -> int | None:
        """The earliest offset whose timestamp is at or after ``timestamp_ms``."""
        return self._reader.offset_for_time(timestamp_ms)

    def recover_if_unlocked(self) -> None:
        """Truncate a torn tail now if no writer holds the partition (a live writer already did)."""
        with self._lock:
            self._writer.recover_if_unlocked()

    def append(self, records: Sequence[Record]) -> AppendResult:
        """Append one batch atomically; durable on return when fsync is on."""
        with self._lock:
            return self._writer.append(records)

    def close(self) -> None:
        """Save the recovery point at the end, release the writer lock and open files (idempotent)."""
        with self._lock:
            self._writer.close()
