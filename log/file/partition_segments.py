"""A partition directory's segments as one process sees them: the listing, a view per segment, scans.

A partition directory is created holding one empty segment at offset 0 (and its empty
indexes); the segment with the highest base offset is the active one. Readers, the writer
and the cleaner of a process share one :class:`PartitionSegments`: it re-stats the
directory and each segment it opens on every call, so batches appended (or segments
rolled, rewritten or deleted) by other processes show up without reopening, and keeps
each segment's parsed index (:class:`~log.file.segment.Segment`) while its file is the
same.
"""

from __future__ import annotations

import os
import time
from bisect import bisect_right
from collections.abc import Iterator
from pathlib import Path

from log.file.batch_codec import HEADER_SIZE, NO_TIMESTAMP, BatchHeader, parse_header
from log.file.segment import ScanStop, Segment, list_segments, scan, segment_name
from log.file.segment_index import SegmentIndex, index_path, time_index_path

#: Times a read lists the directory again after a segment it was about to open went away.
LISTING_RETRIES = 5
#: An offset past every offset: a scan from it starts at the end of what is known.
PAST_THE_END = 1 << 62
_RECENT_CHANGE_NS = 1_000_000_000


def create_partition_directory(directory: Path) -> None:
    """Create an empty partition: its directory and a first, empty segment at offset 0."""
    directory.mkdir(parents=True)
    log_path = directory / segment_name(0)
    for path in (log_path, index_path(log_path), time_index_path(log_path)):
        path.touch()


def open_for_reading(path: Path) -> int | None:
    """A read-only descriptor of ``path``; ``None`` if retention or compaction removed it meanwhile."""
    try:
        return os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None


class PartitionSegments:
    """The segments of one partition directory, with a cached view of each (not thread-safe)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._segments: dict[Path, Segment] = {}
        self._listing: list[tuple[int, Path]] = []
        self._listing_stamp: tuple[int, int] | None = None

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

    def add_new_segment(self, segment: Segment) -> None:
        """Remember the view of a segment this process just created (a roll)."""
        self._segments[segment.path] = segment

    def start(self, segment: Segment, fd: int, offset: int) -> tuple[int, int]:
        """A verified batch boundary at or before ``offset``'s batch, and the running max timestamp there."""
        if segment.known_end > 0 and offset >= segment.next_offset:
            return segment.known_end, segment.running_max_ts
        index = segment.index
        entry = index.floor(offset)
        while entry >= 0:
            position = index.positions[entry]
            header = parse_header(os.pread(fd, HEADER_SIZE, position))
            if header is not None and header.base_offset == index.bases[entry]:
                running = index.max_ts[entry - 1] if entry > 0 else NO_TIMESTAMP
                if segment.known_end < position:
                    segment.known_end = position
                    segment.next_offset = header.base_offset
                    segment.running_max_ts = running
                return position, running
            # The index does not match this file (rewritten or torn): rebuild it by scanning.
            segment.index = SegmentIndex()
            segment.known_end, segment.next_offset, segment.running_max_ts = 0, segment.base, NO_TIMESTAMP
            break
        return 0, NO_TIMESTAMP

    def scan_to_end(self, segment: Segment, fd: int, size: int) -> ScanStop:
        """Scan the active segment from the end of what is known to ``size``: where its whole batches end.

        Afterwards ``segment.next_offset`` is the offset the next appended record gets.
        """
        position, running = self.start(segment, fd, PAST_THE_END)
        stop = ScanStop(position)
        for _ in scan(fd, segment, position, size, active=True, stop=stop, running_max_ts=running):
            pass
        return stop

    def batches(self, offset: int) -> Iterator[tuple[BatchHeader, bytes, int]]:
        """Yield whole, valid batches whose records may include ``offset`` or later, in order.

        Batches entirely before ``offset`` are skipped (within a segment, from the index).
        """
        for _ in range(LISTING_RETRIES):
            listing = self.listing()
            if not listing:
                return
            bases = [base for base, _ in listing]
            first = max(bisect_right(bases, offset) - 1, 0)
            restart = False
            for number in range(first, len(listing)):
                base, path = listing[number]
                fd = open_for_reading(path)
                if fd is None:
                    # Deleted or replaced by retention or compaction: list again and go on from here.
                    restart = True
                    break
                try:
                    size = os.fstat(fd).st_size
                    active = number == len(listing) - 1
                    segment = self.segment(base, path, fd, active=active)
                    position, running = self.start(segment, fd, offset)
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
