"""Sparse offset and time indexes of one segment.

On disk a segment ``<base>.log`` has ``<base>.index`` (``base_offset i64 | position i64``
per entry) and ``<base>.timeindex`` (``max_timestamp_so_far i64 | base_offset i64``),
one entry in each per indexed batch, written together. Indexes are a cache: every
entry is checked against the batch header it points at before use, and a missing,
torn or stale index is rebuilt by scanning, so a crash between writing a segment
and its indexes never loses or misplaces records.
"""

from __future__ import annotations

import os
import struct
from bisect import bisect_right
from dataclasses import dataclass, field
from pathlib import Path

OFFSET_ENTRY = struct.Struct("<qq")
TIME_ENTRY = struct.Struct("<qq")
#: An index entry is added when a batch starts this many bytes after the last indexed one.
INDEX_INTERVAL_BYTES = 4096


@dataclass(slots=True)
class SegmentIndex:
    """Indexed batches of a segment, in position order.

    Invariant: ``bases``, ``positions`` and ``max_ts`` have equal length and grow
    together; ``max_ts[i]`` is the largest record timestamp of every batch up to and
    including the one at ``positions[i]``.
    """

    bases: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    max_ts: list[int] = field(default_factory=list)

    def wants(self, position: int) -> bool:
        """Whether a batch at ``position`` should get an entry (sparse cadence)."""
        return not self.positions or position - self.positions[-1] >= INDEX_INTERVAL_BYTES

    def add(self, base_offset: int, position: int, running_max_ts: int) -> bool:
        """Add an entry for a batch beyond the last one; return whether it was added."""
        if self.positions and position <= self.positions[-1]:
            return False
        self.bases.append(base_offset)
        self.positions.append(position)
        self.max_ts.append(running_max_ts)
        return True

    def truncate(self, end_position: int) -> None:
        """Forget entries at or beyond ``end_position``."""
        keep = bisect_right(self.positions, end_position - 1)
        del self.bases[keep:], self.positions[keep:], self.max_ts[keep:]

    def floor(self, offset: int) -> int:
        """Entry number of the last batch starting at or before ``offset``, or -1."""
        return bisect_right(self.bases, offset) - 1

    def before_time(self, timestamp_ms: int) -> int:
        """Entry number of the last batch whose running max timestamp is below ``timestamp_ms``, or -1.

        Every batch before that entry's batch is older than ``timestamp_ms``.
        """
        return bisect_right(self.max_ts, timestamp_ms - 1) - 1

    def encode(self) -> tuple[bytes, bytes]:
        """The ``.index`` and ``.timeindex`` file contents."""
        offsets = b"".join(OFFSET_ENTRY.pack(b, p) for b, p in zip(self.bases, self.positions, strict=True))
        times = b"".join(TIME_ENTRY.pack(t, b) for t, b in zip(self.max_ts, self.bases, strict=True))
        return offsets, times

    @classmethod
    def load(cls, log_path: Path) -> SegmentIndex:
        """Read the index files beside ``log_path``; missing or torn entries are dropped."""
        try:
            offsets = index_path(log_path).read_bytes()
            times = time_index_path(log_path).read_bytes()
        except FileNotFoundError:
            return cls()
        index = cls()
        count = min(len(offsets) // OFFSET_ENTRY.size, len(times) // TIME_ENTRY.size)
        for (base, pos), (ts, tbase) in zip(
            OFFSET_ENTRY.iter_unpack(offsets[: count * OFFSET_ENTRY.size]),
            TIME_ENTRY.iter_unpack(times[: count * TIME_ENTRY.size]),
            strict=True,
        ):
            # Entries must agree and grow; anything else is a torn or foreign write.
            if tbase != base or (index.bases and (base <= index.bases[-1] or pos <= index.positions[-1])):
                break
            index.add(base, pos, ts)
        return index


def index_path(log_path: Path) -> Path:
    """The offset index beside a segment."""
    return log_path.with_suffix(".index")


def time_index_path(log_path: Path) -> Path:
    """The time index beside a segment."""
    return log_path.with_suffix(".timeindex")


def write_index_files(log_path: Path, index: SegmentIndex, *, suffix: str = "") -> None:
    """Write both index files of a segment (not fsynced: indexes are rebuilt when damaged)."""
    offsets, times = index.encode()
    for path, data in ((index_path(log_path), offsets), (time_index_path(log_path), times)):
        target = path.with_name(path.name + suffix)
        with open(target, "wb") as fh:
            fh.write(data)


def append_index_entry(index_fd: int, time_fd: int, base_offset: int, position: int, running_max_ts: int) -> None:
    """Append one entry to open ``.index`` and ``.timeindex`` files."""
    os.write(index_fd, OFFSET_ENTRY.pack(base_offset, position))
    os.write(time_fd, TIME_ENTRY.pack(running_max_ts, base_offset))
