"""Reads of one partition of the file backend: records, record columns, the end offset, a time lookup.

Every read sees the whole, CRC-checked batches the directory holds when it looks
(:meth:`~log.file.partition_segments.PartitionSegments.batches`), so a batch appended by
another process is seen whole or not at all, and a torn tail is never read.

A read that stops inside a compressed batch keeps that batch's decompressed records for the
next read, which usually starts there (a consumer polling fewer records than a batch holds):
they are used again only for a batch whose stored bytes are the same, byte for byte. Only a
batch of at most :data:`HELD_MAX_BYTES` decompressed is kept, so a process reading many
partitions holds at most that much per partition (a snapshot's batches, megabytes each, are
decompressed again instead).
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING

from log.base import StoredRecord
from log.file.batch_codec import ATTR_CODEC, NO_TIMESTAMP, BatchHeader, decode_records, decode_section, records_section
from log.file.partition_segments import LISTING_RETRIES, PartitionSegments, open_for_reading
from log.file.segment import ScanStop, scan

if TYPE_CHECKING:
    from log.columns import RecordColumns


#: The largest decompressed batch a reader keeps for its next read.
HELD_MAX_BYTES = 1 << 20


class PartitionReader:
    """Reads one partition's segments, each read holding the partition's ``lock``."""

    def __init__(self, segments: PartitionSegments, topic: str, partition: int, lock: threading.RLock) -> None:
        self.topic = topic
        self.partition = partition
        self._segments = segments
        self._lock = lock
        #: The compressed batch the last read stopped inside: its stored bytes and its plain records.
        self._held: tuple[bytes, bytes] | None = None

    def read(self, offset: int, max_records: int, max_bytes: int) -> list[StoredRecord]:
        """Records at or after ``offset``: at most ``max_records``, about ``max_bytes``, at least one."""
        out: list[StoredRecord] = []
        if max_records <= 0:
            return out
        budget = max_bytes
        with self._lock:
            held, self._held = self._held, None
            for header, buf, off in self._segments.batches(offset):
                plain, start, stored = self._records_section(buf, off, header, held)
                used = decode_section(
                    plain,
                    start,
                    header,
                    topic=self.topic,
                    partition=self.partition,
                    min_offset=offset,
                    out=out,
                    max_records=max_records,
                    max_bytes=budget,
                )
                if used < 0:
                    if stored is not None and len(plain) <= HELD_MAX_BYTES:
                        self._held = (stored, plain)  # type: ignore[assignment]  # compressed: bytes
                    break
                budget -= used
        return out

    @staticmethod
    def _records_section(
        buf: bytes, off: int, header: BatchHeader, held: tuple[bytes, bytes] | None
    ) -> tuple[bytes | memoryview, int, bytes | None]:
        """The batch's plain records and where they start, and its stored bytes when compressed.

        A compressed batch whose stored bytes are ``held``'s is not decompressed again.
        """
        if not header.attributes & ATTR_CODEC:
            plain, start = records_section(buf, off, header)
            return plain, start, None
        stored = buf[off : off + header.length]
        if held is not None and held[0] == stored:
            return held[1], 0, stored
        plain, start = records_section(buf, off, header)
        return plain, start, stored

    def read_columns(self, offset: int, end: int, max_records: int, max_bytes: int) -> tuple[RecordColumns, int]:
        """The records :meth:`read` gives at ``offset`` (those before ``end``) as columns, and where to go on.

        The second value is the offset the next read starts at: after the last record read,
        or past the batches read when they held nothing more before ``end`` (compacted gaps),
        or ``end``. Equal to ``offset`` when nothing was there (the end of the partition).
        """
        # Imported here: it loads pyarrow, which a process that never reads columns (capture) does without.
        from log.file.column_decoder import RecordsSection, decode_columns, record_columns

        sections: list[RecordsSection] = []
        # Batches are gathered until they may hold enough records or bytes; the decoder stops exactly.
        room, budget, resume = max_records, max_bytes, offset
        with self._lock:
            if max_records > 0 and offset < end:
                for header, buf, off in self._segments.batches(offset):
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

    def scanned_end_offset(self) -> int:
        """The offset the next appended record gets, found by scanning the active segment's new batches."""
        segments = self._segments
        with self._lock:
            for _ in range(LISTING_RETRIES):
                base, path = segments.listing()[-1]
                fd = open_for_reading(path)
                if fd is None:
                    segments.listing(force=True)
                    continue
                try:
                    segment = segments.segment(base, path, fd)
                    segments.scan_to_end(segment, fd, os.fstat(fd).st_size)
                    return segment.next_offset
                finally:
                    os.close(fd)
            return segments.listing(force=True)[-1][0]

    def offset_for_time(self, timestamp_ms: int) -> int | None:
        """The earliest offset whose timestamp is at or after ``timestamp_ms``; ``None`` if none."""
        segments = self._segments
        with self._lock:
            listing = segments.listing()
            for number, (base, path) in enumerate(listing):
                fd = open_for_reading(path)
                if fd is None:
                    continue
                try:
                    active = number == len(listing) - 1
                    segment = segments.segment(base, path, fd, active=active)
                    entry = segment.index.before_time(timestamp_ms)
                    position, running = 0, NO_TIMESTAMP
                    if entry >= 0:
                        # Every batch before this entry's is older than the timestamp; start()
                        # checks the entry against the file (or falls back to a full scan).
                        position, running = segments.start(segment, fd, segment.index.bases[entry])
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
