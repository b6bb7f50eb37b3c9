"""Segment files of a partition: naming, validated batch scanning, damage classification.

A partition directory holds segments ``<base_offset:020d>.log``; the one with the highest
base is active (appended to), the others are closed. A scan yields only whole batches
whose CRC matches. Damage is classified, never skipped:

* a batch that runs past the end of the file, or a bad batch with no valid batch after
  it, at the end of the *active* segment is a torn tail (a writer died mid-append):
  readers stop before it and the next writer truncates it, unless it starts before the
  partition's recovery point (:mod:`log.file.recovery_point`; checked when a writer opens the
  partition, not here, so readers pay nothing): acknowledged bytes are damaged then;
* anything else (a bad batch followed by a valid one, or any bad batch in a closed
  segment) raises :class:`~log.errors.CorruptLogError` naming the file and byte.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from log.errors import CorruptLogError
from log.file.batch_codec import HEADER_SIZE, MAGIC, MAGIC_POSITION, NO_TIMESTAMP, BatchHeader, crc_ok, parse_header
from log.file.segment_index import SegmentIndex

SEGMENT_SUFFIX = ".log"
#: Suffix of a rewritten segment before it atomically replaces the original.
CLEANED_SUFFIX = ".cleaned"
_READ_CHUNK = 1 << 20


def segment_name(base_offset: int) -> str:
    """File name of the segment whose first offset is ``base_offset``."""
    return f"{base_offset:020d}{SEGMENT_SUFFIX}"


def list_segments(directory: Path) -> list[tuple[int, Path]]:
    """``(base_offset, path)`` of every segment in ``directory``, by base offset."""
    found = []
    for name in os.listdir(directory):
        if name.endswith(SEGMENT_SUFFIX) and len(name) == 20 + len(SEGMENT_SUFFIX) and name[:20].isdigit():
            found.append((int(name[:20]), directory / name))
    found.sort()
    return found


@dataclass(slots=True)
class Segment:
    """What a process knows about one segment file (keyed by inode: a rewrite is a new segment).

    Invariant: every batch before ``known_end`` was read whole with a matching CRC;
    ``next_offset`` follows the last of them (``base`` when ``known_end`` is 0) and
    ``running_max_ts`` is the largest timestamp among them.
    """

    path: Path
    base: int
    inode: int
    index: SegmentIndex = field(default_factory=SegmentIndex)
    known_end: int = 0
    next_offset: int = -1
    running_max_ts: int = NO_TIMESTAMP
    mtime_ns: int = 0

    def __post_init__(self) -> None:
        if self.next_offset < 0:
            self.next_offset = self.base


@dataclass(slots=True)
class ScanStop:
    """Where a scan ended: ``end`` follows the last whole batch; ``torn`` if bytes remain beyond it."""

    end: int
    torn: bool = False


def _valid_batch_after(fd: int, start: int, size: int) -> int | None:
    """Position of a whole, CRC-valid batch starting after ``start``, or ``None``."""
    data = os.pread(fd, size - start, start)
    i = data.find(MAGIC, 1 + MAGIC_POSITION)
    while i >= 0:
        candidate = i - MAGIC_POSITION
        header = parse_header(data, candidate)
        if header is not None and candidate + header.length <= len(data) and crc_ok(data, candidate, header):
            return start + candidate
        i = data.find(MAGIC, i + 1)
    return None


def scan(
    fd: int,
    segment: Segment,
    start: int,
    size: int,
    *,
    active: bool,
    stop: ScanStop,
    running_max_ts: int = NO_TIMESTAMP,
) -> Iterator[tuple[int, BatchHeader, bytes, int]]:
    """Yield ``(position, header, buffer, buffer_position)`` of whole valid batches from ``start``.

    ``start`` must be a batch boundary. Extends ``segment.index`` (and ``known_end``
    when the scan passes it) as it goes. Stops at ``size``, at a torn tail of an
    ``active`` segment (``stop.torn``), or raises :class:`CorruptLogError`.
    """
    pos = start
    retried_at = -1
    index = segment.index

    def note(here: int, header: BatchHeader) -> None:
        nonlocal running_max_ts
        running_max_ts = max(running_max_ts, header.max_timestamp)
        if index.wants(here):
            index.add(header.base_offset, here, running_max_ts)
        if here == segment.known_end:
            segment.known_end = here + header.length
            segment.next_offset = header.next_offset
            segment.running_max_ts = running_max_ts

    while pos < size:
        buf = os.pread(fd, min(_READ_CHUNK, size - pos), pos)
        off = 0
        damaged = False
        while True:
            header = parse_header(buf, off)
            if header is None:
                damaged = len(buf) - off >= HEADER_SIZE
                break
            if off + header.length > len(buf):
                break
            if not crc_ok(buf, off, header):
                damaged = True
                break
            note(pos + off, header)
            yield pos + off, header, buf, off
            off += header.length
        pos += off
        if pos >= size:
            break
        if not damaged and off == 0:
            # The batch at ``pos`` is larger than a chunk, or runs past the end of the file:
            # still being written, torn by a crash, or a damaged length field.
            header = parse_header(os.pread(fd, HEADER_SIZE, pos))
            whole = b""
            if header is not None and pos + header.length <= size:
                whole = os.pread(fd, header.length, pos)
            if header is not None and whole and crc_ok(whole, 0, header):
                note(pos, header)
                yield pos, header, whole, 0
                pos += header.length
                continue
            damaged = True
        if not damaged:
            continue
        if retried_at != pos:
            # A writer may have truncated a torn tail and rewritten it while we read: look again.
            retried_at = pos
            continue
        # Only damage, never an in-flight or torn append, can have a valid batch after it.
        following = _valid_batch_after(fd, pos, size)
        if following is not None or not active:
            detail = (
                f"damaged batch followed by a valid batch at byte {following}"
                if following is not None
                else "damaged batch in a closed segment"
            )
            raise CorruptLogError(str(segment.path), pos, detail)
        stop.torn = True
        break
    stop.end = pos
