"""One partition of the file backend: a directory of segments, read by many, written by one.

Readers re-stat the directory and the segment they read on every call, so batches
appended (or segments rolled, rewritten or deleted) by other processes show up
without reopening; parsed indexes are cached per segment inode. The writer takes the
partition's :class:`~log.file.writer_lock.WriterLock` at its first append, truncates a torn
tail left by a crashed writer, and then appends each batch with one positioned write
followed by ``fdatasync`` (``fsync="always"``) before the append is acknowledged.

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
import threading
import time
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from core.durable_files import fsync_directory
from log.base import AppendResult, Record, StoredRecord
from log.errors import CorruptLogError, LogUnavailableError
from log.file.batch_codec import (
    HEADER_SIZE,
    BatchHeader,
    Compression,
    decode_records,
    encode_batch,
    parse_header,
    records_section,
)
from log.file.recovery_point import (
    RECOVERY_POINT_INTERVAL_S,
    RecoveryPoint,
    RecoveryPointFile,
    load_recovery_point,
    recovery_point_path,
)
from log.file.segment import ScanStop, Segment, list_segments, scan, segment_name
from log.file.segment_index import (
    SegmentIndex,
    append_index_entry,
    index_path,
    time_index_path,
    write_index_files,
)
from log.file.writer_lock import WriterLock

if TYPE_CHECKING:
    from log.columns import RecordColumns

logger = logging.getLogger(__name__)

_NO_TIMESTAMP = -(1 << 63)
_LISTING_RETRIES = 5
_RECENT_CHANGE_NS = 1_000_000_000


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


def create_partition_directory(directory: Path) -> None:
    """Create an empty partition: its directory and a first, empty segment at offset 0."""
    directory.mkdir(parents=True)
    log_path = directory / segment_name(0)
    for path in (log_path, index_path(log_path), time_index_path(log_path)):
        path.touch()


@dataclass(slots=True)
class _Writer:
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
        self.directory = directory
        self._compression: Compression = compression
        self.topic = topic
        self.partition = partition
        self._fsync = fsync
        self._segment_bytes = segment_bytes
        # Shared partitions (internal topics many processes write, such as consumer
        # offsets) take the writer lock around each append instead of holding it.
        self._shared = shared_writer
        self._lock = threading.RLock()
        self._writer_lock = WriterLock(directory, topic, partition)
        self._writer: _Writer | None = None
        # Monotonic time after which the next append updates the recovery point (kept
        # here, not in the writer: a shared partition reopens its writer every append).
        self._recovery_point_due = 0.0
        self._segments: dict[Path, Segment] = {}
        self._listing: list[tuple[int, Path]] = []
        self._listing_stamp: tuple[int, int] | None = None

    # -- segments ---------------------------------------------------------------------

    def listing(self, *, force: bool = False) -> list[tuple[int, Path]]:
        """``(base_offset, path)`` of the partition's segments, re-listed when the directory changed."""
        st = os.stat(self.directory)
        stamp = (st.st_ino, st.st_mtime_ns)
        # Directory times tick coarsely (a few ms): a change in the same tick as our last
        # listing leaves the stamp unchanged, so a recently changed directory is re-listed.
        recent = time.time_ns() - st.st_mtime_ns < _RECENT_CHANGE_NS
        if force or recent or stamp != self._listing_stamp:
            self._listing = list_segments(self.directory)
            self._listing_stamp = stamp
            live = {path for _, path in self._listing}
            for path in [p for p in self._segments if p not in live]:
                del self._segments[path]
        return self._listing

    def segment(self, base: int, path: Path, fd: int, *, active: bool = True) -> Segment:
        """The cached view of the segment open as ``fd``; a new view when the file was replaced."""
        st = os.fstat(fd)
        cached = self._segments.get(path)
        # A rewrite of a closed segment may reuse the old inode number, so a closed
        # segment's view also needs an unchanged modification time (closed segments
        # change only by replacement), and any view a file at least as long as it knows.
        if (
            cached is None
            or cached.inode != st.st_ino
            or st.st_size < cached.known_end
            or (not active and cached.mtime_ns != st.st_mtime_ns)
        ):
            cached = Segment(path, base, st.st_ino, SegmentIndex.load(path))
            self._segments[path] = cached
        cached.mtime_ns = st.st_mtime_ns
        return cached

    def _start(self, segment: Segment, fd: int, offset: int) -> tuple[int, int]:
        """A verified batch boundary at or before ``offset``'s batch, and the running max timestamp there."""
        if segment.known_end > 0 and offset >= segment.next_offset:
            return segment.known_end, segment.running_max_ts
        index = segment.index
        entry = index.floor(offset)
        while entry >= 0:
            position = index.positions[entry]
            header = parse_header(os.pread(fd, HEADER_SIZE, position))
            if header is not None and header.base_offset == index.bases[entry]:
                running = index.max_ts[entry - 1] if entry > 0 else _NO_TIMESTAMP
                if segment.known_end < position:
                    segment.known_end = position
                    segment.next_offset = header.base_offset
                    segment.running_max_ts = running
                return position, running
            # The index does not match this file (rewritten or torn): rebuild it by scanning.
            segment.index = SegmentIndex()
            segment.known_end, segment.next_offset, segment.running_max_ts = 0, segment.base, _NO_TIMESTAMP
            break
        return 0, _NO_TIMESTAMP

    def _open(self, path: Path) -> int | None:
        try:
            return os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None

    def batches(self, offset: int) -> Iterator[tuple[BatchHeader, bytes, int]]:
        """Yield whole, valid batches whose records may include ``offset`` or later, in order.

        Batches entirely before ``offset`` are skipped (within a segment, from the index).
        """
        for _ in range(_LISTING_RETRIES):
            listing = self.listing()
            if not listing:
                return
            bases = [base for base, _ in listing]
            first = max(bisect_right(bases, offset) - 1, 0)
            restart = False
            for number in range(first, len(listing)):
                base, path = listing[number]
                fd = self._open(path)
                if fd is None:
                    # Deleted or replaced by retention or compaction: list again and go on from here.
                    restart = True
                    break
                try:
                    size = os.fstat(fd).st_size
                    active = number == len(listing) - 1
                    segment = self.segment(base, path, fd, active=active)
                    position, running = self._start(segment, fd, offset)
                    stop = ScanStop(position)
                    for _pos, header, buf, off in scan(
                        fd, segment, position, size, active=active, stop=stop, running_max_ts=running
                    ):
                        if header.next_offset <= offset:
                            continue
                        yield header, buf, off
                        offset = header.next_offset
                finally:
                    os.close(fd)
            if not restart:
                return
            self.listing(force=True)

    def scan_segment(self, base: int, path: Path, *, active: bool) -> Iterator[tuple[BatchHeader, bytes, int]]:
        """Yield every whole, valid batch of one segment from its start (for the cleaner)."""
        fd = os.open(path, os.O_RDONLY)
        try:
            segment = self.segment(base, path, fd, active=active)
            stop = ScanStop(0)
            for _pos, header, buf, off in scan(fd, segment, 0, os.fstat(fd).st_size, active=active, stop=stop):
                yield header, buf, off
        finally:
            os.close(fd)

    # -- reading ----------------------------------------------------------------------

    def read(self, offset: int, max_records: int, max_bytes: int) -> list[StoredRecord]:
        """Records at or after ``offset``: at most ``max_records``, about ``max_bytes``, at least one."""
        out: list[StoredRecord] = []
        if max_records <= 0:
            return out
        budget = max_bytes
        with self._lock:
            for header, buf, off in self.batches(offset):
                used = decode_records(
                    buf,
                    off,
                    header,
                    topic=self.topic,
                    partition=self.partition,
                    min_offset=offset,
                    out=out,
                    max_records=max_records,
                    max_bytes=budget,
                )
                if used < 0:
                    break
                budget -= used
        return out

    def read_columns(self, offset: int, end: int, max_records: int, max_bytes: int) -> tuple[RecordColumns, int]:
        """The records :meth:`read` gives at ``offset`` (those before ``end``) as columns, and where to go on.

        The second value is the offset the next read starts at: after the last record read,
        or past the batches read when they held nothing more before ``end`` (compacted gaps),
        or ``end``. Equal to ``offset`` when nothing was there (the end of the partition).
        """
        from log.file.column_reader import RecordsSection, decode_columns, record_columns

        sections: list[RecordsSection] = []
        # Batches are gathered until they may hold enough records or bytes; the decoder stops exactly.
        room, budget, resume = max_records, max_bytes, offset
        with self._lock:
            if max_records > 0 and offset < end:
                for header, buf, off in self.batches(offset):
                    if header.base_offset >= end:
                        break
                    data, start = records_section(buf, off, header)
                    stop = off + header.length if data is buf else len(data)  # plain: in place
                    sections.append(RecordsSection(data, start, stop, header.record_count, header.base_offset))
                    resume = min(header.next_offset, end)
                    room -= min(header.record_count, resume - max(header.base_offset, offset))
                    budget -= stop - start
                    if room <= 0 or budget < 0 or resume >= end:
                        break
        decoded = decode_columns(
            sections, min_offset=offset, end_offset=end, max_records=max_records, max_bytes=max_bytes
        )
        if decoded.next_offset >= 0:
            resume = decoded.next_offset
        return record_columns(self.topic, self.partition, decoded), resume

    def end_offset(self) -> int:
        """The offset the next appended record gets."""
        with self._lock:
            if self._writer is not None and not self._shared:
                return self._writer.next_offset
            for _ in range(_LISTING_RETRIES):
                listing = self.listing()
                base, path = listing[-1]
                fd = self._open(path)
                if fd is None:
                    self.listing(force=True)
                    continue
                try:
                    segment = self.segment(base, path, fd)
                    position, running = self._start(segment, fd, 1 << 62)
                    stop = ScanStop(position)
                    for _ in scan(
                        fd, segment, position, os.fstat(fd).st_size, active=True, stop=stop, running_max_ts=running
                    ):
                        pass
                    return segment.next_offset
                finally:
                    os.close(fd)
            return self.listing(force=True)[-1][0]

    def offset_for_time(self, timestamp_ms: int) -> int | None:
        """The earliest offset whose timestamp is at or after ``timestamp_ms``."""
        with self._lock:
            listing = self.listing()
            for number, (base, path) in enumerate(listing):
                fd = self._open(path)
                if fd is None:
                    continue
                try:
                    active = number == len(listing) - 1
                    segment = self.segment(base, path, fd, active=active)
                    entry = segment.index.before_time(timestamp_ms)
                    position, running = 0, _NO_TIMESTAMP
                    if entry >= 0:
                        # Every batch before this entry's is older than the timestamp; _start
                        # checks the entry against the file (or falls back to a full scan).
                        position, running = self._start(segment, fd, segment.index.bases[entry])
                    stop = ScanStop(position)
                    for _pos, header, buf, off in scan(
                        fd, segment, position, os.fstat(fd).st_size, active=active, stop=stop, running_max_ts=running
                    ):
                        if header.max_timestamp < timestamp_ms:
                            continue
                        decoded: list[StoredRecord] = []
                        decode_records(
                            buf,
                            off,
                            header,
                            topic=self.topic,
                            partition=self.partition,
                            min_offset=0,
                            out=decoded,
                            max_records=header.record_count,
                            max_bytes=1 << 62,
                        )
                        for record in decoded:
                            if record.timestamp_ms >= timestamp_ms:
                                return record.offset
                finally:
                    os.close(fd)
            return None

    # -- writing ----------------------------------------------------------------------

    def recover_if_unlocked(self) -> None:
        """Truncate a torn tail now if no writer holds the partition (a live writer already did)."""
        with self._lock:
            if self._writer is not None or not self._writer_lock.try_acquire():
                return
            try:
                self._open_writer(appending=False).close()
            finally:
                self._writer_lock.release()

    def _open_writer(self, *, appending: bool = True) -> _Writer:
        """Open the active segment for appending, truncating a torn tail (writer lock held).

        Raises :class:`CorruptLogError`, truncating nothing, when the segment's valid
        batches end before its recovery point (acknowledged bytes damaged or cut off).
        """
        listing = self.listing(force=True)
        base, path = listing[-1]
        fd = os.open(path, os.O_RDWR)
        recovery: RecoveryPointFile | None = None
        try:
            segment = self.segment(base, path, fd)
            acknowledged = self._acknowledged_end(base, segment.inode)
            position, running = self._start(segment, fd, 1 << 62)
            stop = ScanStop(position)
            size = os.fstat(fd).st_size
            for _ in scan(fd, segment, position, size, active=True, stop=stop, running_max_ts=running):
                pass
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
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
            index_fd = os.open(index_path(path), flags, 0o644)
            time_fd = os.open(time_index_path(path), flags, 0o644)
            if appending and self._fsync:
                recovery = RecoveryPointFile.open(self.directory)
        except BaseException:
            os.close(fd)
            raise
        return _Writer(segment, fd, index_fd, time_fd, stop.end, segment.next_offset, recovery)

    def _acknowledged_end(self, base: int, inode: int) -> int:
        """How far the active segment (``base``, ``inode``) must hold whole batches: its recovery point, or 0."""
        point = load_recovery_point(self.directory)
        if point is None or point.segment_base < base:
            return 0  # no point, or it names a segment that is closed now (strict anyway)
        if point.segment_base > base:
            missing = self.directory / segment_name(point.segment_base)
            detail = (
                f"this segment was the active one and acknowledged up to byte {point.end} "
                f"({recovery_point_path(self.directory)}), but it is missing"
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
            f"(deleting {recovery_point_path(self.directory)} accepts the loss: the tail is then truncated)"
        )

    def _acquire_writer(self) -> _Writer:
        if self._writer is None:
            self._writer_lock.acquire(announce=not self._shared, wait=self._shared)
            try:
                self._writer = self._open_writer()
                if not self._shared:
                    self._recovery_point_due = time.monotonic() + RECOVERY_POINT_INTERVAL_S
            except BaseException:
                self._writer_lock.release()
                raise
        return self._writer

    def _release_writer(self, *, clean: bool = False) -> None:
        if self._writer is not None:
            if clean:
                # Every batch before the writer's position was fsynced when appended.
                self._writer.save_recovery_point()
            self._writer.close()
            self._writer = None
        self._writer_lock.release()

    def _roll(self, writer: _Writer) -> _Writer:
        """Close the active segment and start a new one at the next offset."""
        path = self.directory / segment_name(writer.next_offset)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
        index_fd = os.open(index_path(path), flags, 0o644)
        time_fd = os.open(time_index_path(path), flags, 0o644)
        if self._fsync:
            fsync_directory(self.directory)
        recovery, writer.recovery = writer.recovery, None
        writer.close()
        segment = Segment(path, writer.next_offset, os.fstat(fd).st_ino)
        self._segments[path] = segment
        rolled = _Writer(segment, fd, index_fd, time_fd, 0, writer.next_offset, recovery)
        self._writer = rolled
        # The point moves to the new segment (whose file the directory fsync made durable),
        # so it never names a closed segment that compaction may rewrite.
        if rolled.save_recovery_point():
            self._recovery_point_due = time.monotonic() + RECOVERY_POINT_INTERVAL_S
        return rolled

    def append(self, records: Sequence[Record]) -> AppendResult:
        """Append one batch atomically; durable on return when fsync is on."""
        with self._lock:
            writer = self._acquire_writer()
            try:
                return self._append(writer, records)
            finally:
                if self._shared:
                    self._release_writer()

    def _append(self, writer: _Writer, records: Sequence[Record]) -> AppendResult:
        base = writer.next_offset
        if not records:
            return AppendResult(self.topic, self.partition, base, base - 1)
        data, max_ts = encode_batch(base, records, int(time.time() * 1000), self._compression)
        if writer.position > 0 and writer.position + len(data) > self._segment_bytes:
            writer = self._roll(writer)
        position = writer.position
        segment = writer.segment
        running = max(segment.running_max_ts, max_ts)
        indexed = segment.index.wants(position)
        index_sizes = (os.fstat(writer.index_fd).st_size, os.fstat(writer.time_fd).st_size) if indexed else None
        try:
            _write_all(writer.fd, data, position)
            if self._fsync:
                os.fdatasync(writer.fd)
            if indexed:
                append_index_entry(writer.index_fd, writer.time_fd, base, position, running)
        except BaseException as error:
            # Invariant: a failed append leaves nothing of its batch behind. Truncating
            # frees space, so it works on a full disk too; should it fail, the next
            # writer truncates the torn tail before writing after it (and readers never
            # see a batch whose CRC does not check).
            self._abandon(writer, position, index_sizes)
            if isinstance(error, OSError):
                msg = f"cannot append to {writer.segment.path}: {error}; retry when the disk is writable"
                raise LogUnavailableError(msg) from error
            raise
        if indexed:
            segment.index.add(base, position, running)
        writer.position = segment.known_end = position + len(data)
        writer.next_offset = segment.next_offset = base + len(records)
        segment.running_max_ts = running
        if writer.recovery is not None and time.monotonic() >= self._recovery_point_due:
            writer.save_recovery_point()
            self._recovery_point_due = time.monotonic() + RECOVERY_POINT_INTERVAL_S
        return AppendResult(self.topic, self.partition, base, base + len(records) - 1)

    def _abandon(self, writer: _Writer, position: int, index_sizes: tuple[int, int] | None) -> None:
        """Cut a failed batch (and its index entries) off the files and drop the writer."""
        with contextlib.suppress(OSError):
            os.ftruncate(writer.fd, position)
            if index_sizes is not None:
                os.ftruncate(writer.index_fd, index_sizes[0])
                os.ftruncate(writer.time_fd, index_sizes[1])
        self._release_writer()

    def close(self) -> None:
        """Save the recovery point at the end, release the writer lock and open files (idempotent)."""
        with self._lock:
            self._release_writer(clean=True)
