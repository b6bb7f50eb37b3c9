"""The writer of one partition of the file backend: writer lock, torn-tail recovery, appends, rolls.

The writer takes the partition's :class:`~log.file.writer_lock.WriterLock` at its first
append, truncates a torn tail left by a crashed writer, and then appends each batch with
one positioned write followed by ``fdatasync`` (``fsync="always"``) before the append is
acknowledged. A batch that would take the active segment past ``segment_bytes`` starts a
new segment (a roll).

With fsync on, the writer also keeps the partition's :mod:`~log.file.recovery_point`: at
most every ``RECOVERY_POINT_INTERVAL_S`` after an append, at every roll and at a clean
close (then it is the end: a cleanly closed partition has no tail to forgive). Opening
the writer, damage or a missing byte before it raises :class:`CorruptLogError` and
nothing is truncated; only bytes at or after it can be a torn tail.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from core.durable_files import fsync_directory
from log.base import AppendResult, Record
from log.errors import CorruptLogError, LogUnavailableError
from log.file.batch_codec import Compression, encode_batch
from log.file.partition_segments import PartitionSegments
from log.file.recovery_point import (
    RECOVERY_POINT_INTERVAL_S,
    RecoveryPoint,
    RecoveryPointFile,
    load_recovery_point,
    recovery_point_path,
)
from log.file.segment import Segment, segment_name
from log.file.segment_index import append_index_entry, index_path, time_index_path, write_index_files
from log.file.writer_lock import WriterLock

logger = logging.getLogger(__name__)

#: Test hook, off unless set: while the file this variable names exists, every append
#: writes half its batch and then fails with ENOSPC, as a full disk does
#: (``tests/integration/capture/test_disk_full.py`` sets it for a capture subprocess).
_ENOSPC_FLAG_FILE = os.environ.get("HEADWATER_TEST_ENOSPC_FLAG")


def _write_all(fd: int, data: bytes | bytearray, position: int) -> None:
    """Write ``data`` at ``position`` (``pwrite`` may write less than asked)."""
    view = memoryview(data)
    if _ENOSPC_FLAG_FILE is not None and os.path.exists(_ENOSPC_FLAG_FILE):
        os.pwrite(fd, view[: len(data) // 2], position)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    written = 0
    while written < len(data):
        written += os.pwrite(fd, view[written:], position + written)


def _open_index_files(log_path: Path) -> tuple[int, int]:
    """The ``.index`` and ``.timeindex`` files of a segment, opened for appending entries."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
    return os.open(index_path(log_path), flags, 0o644), os.open(time_index_path(log_path), flags, 0o644)


@dataclass(slots=True)
class _ActiveSegment:
    """The open active segment of a partition whose writer lock this process holds.

    Invariant: ``position`` is the end of the last whole batch in the file, and
    ``next_offset`` the offset the next appended record gets.
    """

    segment: Segment
    fd: int
    index_fd: int
    time_fd: int
    position: int
    next_offset: int
    #: Open when fsync is on and this writer appends (not for a recovery-only open).
    recovery: RecoveryPointFile | None = None

    def save_recovery_point(self) -> bool:
        """Record that every batch before ``position`` is acknowledged (they are fsynced)."""
        if self.recovery is None:
            return False
        return self.recovery.save(RecoveryPoint(self.segment.base, self.segment.inode, self.position))

    def close(self) -> None:
        for fd in (self.fd, self.index_fd, self.time_fd):
            os.close(fd)
        if self.recovery is not None:
            self.recovery.close()


class PartitionWriter:
    """Appends batches to one partition; the caller serialises calls (:class:`~log.file.partition.Partition`)."""

    def __init__(
        self,
        segments: PartitionSegments,
        topic: str,
        partition: int,
        *,
        fsync: bool,
        segment_bytes: int,
        shared: bool,
        compression: Compression,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self._segments = segments
        self._directory = segments.directory
        self._fsync = fsync
        self._segment_bytes = segment_bytes
        self._compression: Compression = compression
        # Shared partitions (internal topics many processes write, such as consumer
        # offsets) take the writer lock around each append instead of holding it.
        self._shared = shared
        self._lock = WriterLock(segments.directory, topic, partition)
        self._active: _ActiveSegment | None = None
        # Monotonic time after which the next append updates the recovery point (kept
        # here, not in the active segment: a shared partition reopens it every append).
        self._recovery_point_due = 0.0

    @property
    def next_offset(self) -> int | None:
        """The offset the next appended record gets, while this process holds the writer; else ``None``."""
        if self._active is None or self._shared:
            return None
        return self._active.next_offset

    def recover_if_unlocked(self) -> None:
        """Truncate a torn tail now if no writer holds the partition (a live writer already did)."""
        if self._active is not None or not self._lock.try_acquire():
            return
        try:
            self._open_active(appending=False).close()
        finally:
            self._lock.release()

    def append(self, records: Sequence[Record]) -> AppendResult:
        """Append one batch atomically; durable on return when fsync is on."""
        active = self._acquire()
        try:
            return self._append(active, records)
        finally:
            if self._shared:
                self._release()

    def close(self) -> None:
        """Save the recovery point at the end, release the writer lock and open files (idempotent)."""
        self._release(clean=True)

    # -- opening: the torn tail and the recovery point ---------------------------------

    def _open_active(self, *, appending: bool = True) -> _ActiveSegment:
        """Open the active segment for appending, truncating a torn tail (writer lock held).

        Raises :class:`CorruptLogError`, truncating nothing, when the segment's valid
        batches end before its recovery point (acknowledged bytes damaged or cut off).
        """
        base, path = self._segments.listing(force=True)[-1]
        fd = os.open(path, os.O_RDWR)
        recovery: RecoveryPointFile | None = None
        try:
            segment = self._segments.segment(base, path, fd)
            acknowledged = self._acknowledged_end(base, segment.inode)
            size = os.fstat(fd).st_size
            stop = self._segments.scan_to_end(segment, fd, size)
            if stop.end < acknowledged:
                raise CorruptLogError(str(path), stop.end, self._lost_detail(size, acknowledged))
            if stop.torn or stop.end < size:
                logger.warning(
                    "truncating torn tail of log segment %s at byte %d (%d bytes of an unacknowledged batch)",
                    path,
                    stop.end,
                    size - stop.end,
                )
                os.ftruncate(fd, stop.end)
                os.fsync(fd)
                segment.index.truncate(stop.end)
                write_index_files(path, segment.index)
            index_fd, time_fd = _open_index_files(path)
            if appending and self._fsync:
                recovery = RecoveryPointFile.open(self._directory)
        except BaseException:
            os.close(fd)
            raise
        return _ActiveSegment(segment, fd, index_fd, time_fd, stop.end, segment.next_offset, recovery)

    def _acknowledged_end(self, base: int, inode: int) -> int:
        """How far the active segment (``base``, ``inode``) must hold whole batches: its recovery point, or 0."""
        point = load_recovery_point(self._directory)
        if point is None or point.segment_base < base:
            return 0  # no point, or it names a segment that is closed now (strict anyway)
        if point.segment_base > base:
            missing = self._directory / segment_name(point.segment_base)
            detail = (
                f"this segment was the active one and acknowledged up to byte {point.end} "
                f"({recovery_point_path(self._directory)}), but it is missing"
            )
            raise CorruptLogError(str(missing), 0, detail)
        if point.segment_inode != inode:
            # Another file under the same name (restored from a backup, a copied log):
            # the point says nothing about it.
            return 0
        return point.end

    def _lost_detail(self, size: int, acknowledged: int) -> str:
        what = f"the file was cut to {size} bytes" if size < acknowledged else "the batch here is damaged"
        return (
            f"{what}, but every byte before {acknowledged} was acknowledged "
            f"(deleting {recovery_point_path(self._directory)} accepts the loss: the tail is then truncated)"
        )

    def _acquire(self) -> _ActiveSegment:
        if self._active is None:
            self._lock.acquire(announce=not self._shared, wait=self._shared)
            try:
                self._active = self._open_active()
                if not self._shared:
                    self._recovery_point_due = time.monotonic() + RECOVERY_POINT_INTERVAL_S
            except BaseException:
                self._lock.release()
                raise
        return self._active

    def _release(self, *, clean: bool = False) -> None:
        if self._active is not None:
            if clean:
                # Every batch before the active segment's position was fsynced when appended.
                self._active.save_recovery_point()
            self._active.close()
            self._active = None
        self._lock.release()

    # -- appending ----------------------------------------------------------------------

    def _roll(self, active: _ActiveSegment) -> _ActiveSegment:
        """Close the active segment and start a new one at the next offset."""
        path = self._directory / segment_name(active.next_offset)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        index_fd, time_fd = _open_index_files(path)
        if self._fsync:
            fsync_directory(self._directory)
        recovery, active.recovery = active.recovery, None
        active.close()
        segment = Segment(path, active.next_offset, os.fstat(fd).st_ino)
        self._segments.add_new_segment(segment)
        rolled = _ActiveSegment(segment, fd, index_fd, time_fd, 0, active.next_offset, recovery)
        self._active = rolled
        # The point moves to the new segment (whose file the directory fsync made durable),
        # so it never names a closed segment that compaction may rewrite.
        if rolled.save_recovery_point():
            self._recovery_point_due = time.monotonic() + RECOVERY_POINT_INTERVAL_S
        return rolled

    def _append(self, active: _ActiveSegment, records: Sequence[Record]) -> AppendResult:
        base = active.next_offset
        if not records:
            return AppendResult(self.topic, self.partition, base, base - 1)
        data, max_ts = encode_batch(base, records, int(time.time() * 1000), self._compression)
        if active.position > 0 and active.position + len(data) > self._segment_bytes:
            active = self._roll(active)
        position = active.position
        segment = active.segment
        running = max(segment.running_max_ts, max_ts)
        indexed = segment.index.wants(position)
        index_sizes = (os.fstat(active.index_fd).st_size, os.fstat(active.time_fd).st_size) if indexed else None
        try:
            _write_all(active.fd, data, position)
            if self._fsync:
                os.fdatasync(active.fd)
            if indexed:
                append_index_entry(active.index_fd, active.time_fd, base, position, running)
        except BaseException as error:
            # Invariant: a failed append leaves nothing of its batch behind. Truncating
            # frees space, so it works on a full disk too; should it fail, the next
            # writer truncates the torn tail before writing after it (and readers never
            # see a batch whose CRC does not check).
            self._abandon(active, position, index_sizes)
            if isinstance(error, OSError):
                msg = f"cannot append to {active.segment.path}: {error}; retry when the disk is writable"
                raise LogUnavailableError(msg) from error
            raise
        if indexed:
            segment.index.add(base, position, running)
        active.position = segment.known_end = position + len(data)
        active.next_offset = segment.next_offset = base + len(records)
        segment.running_max_ts = running
        if active.recovery is not None and time.monotonic() >= self._recovery_point_due:
            active.save_recovery_point()
            self._recovery_point_due = time.monotonic() + RECOVERY_POINT_INTERVAL_S
        return AppendResult(self.topic, self.partition, base, base + len(records) - 1)

    def _abandon(self, active: _ActiveSegment, position: int, index_sizes: tuple[int, int] | None) -> None:
        """Cut a failed batch (and its index entries) off the files and drop the writer."""
        with contextlib.suppress(OSError):
            os.ftruncate(active.fd, position)
            if index_sizes is not None:
                os.ftruncate(active.index_fd, index_sizes[0])
                os.ftruncate(active.time_fd, index_sizes[1])
        self._release()
