"""The file backend's cleaner: key compaction for compacted topics, retention for the others.

Compaction, per partition, under the partition's ``cleaner.lock``:

1. The *cleanable range* is the run of closed segments from the start up to the first
   one holding a record younger than ``min_compaction_lag_ms``; the active segment is
   never touched. Its end is the partition's ``clean_offset``.
2. One scan of the whole partition finds the latest offset of every key (keys are
   sliced straight out of the read buffers; no record objects are built).
3. Each cleanable segment that loses records is rewritten beside itself as
   ``<base>.log.cleaned`` keeping every surviving record's original offset (batches
   keep their base and last offset, so they may become sparse), fsynced, and renamed
   over the original. Its stale indexes are removed first, so a crash at any point
   leaves either the old or the new segment, never a mismatched index.
4. A tombstone that is the latest for its key is dropped only ``delete_retention_ms``
   after the first pass whose cleanable range covered it; the pass ends and times
   live in ``cleaner-checkpoint.json``. Records with a null key are kept.

Retention deletes whole closed segments whose newest record is older than
``retention_ms``, then the oldest closed segments while the partition exceeds
``retention_bytes``. A compacted topic with a retention (``cleanup: compact,delete``)
gets both, compaction first.

A *hold* (an offset, from :mod:`log.cleaner`: the position of a reader that needs every
version, such as an SCD2 table's loader) ends the cleanable range and stops retention at
the last segment wholly before it. Each pass also notes in the checkpoint when another
pass could remove more without new segments (``due_ms``: a segment ageing past the lag
or a tombstone past its delete retention), where the closed segments ended, and the hold
that stopped it, so :func:`cleaning_due` can skip a partition without scanning it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from core.durable_files import fsync_directory, replace_json
from log.base import TopicSpec
from log.file.batch_codec import ATTR_CODEC, NO_TIMESTAMP, RECORD, Compression, records_section, seal_batch
from log.file.partition_segments import PartitionSegments
from log.file.segment import CLEANED_SUFFIX
from log.file.segment_index import SegmentIndex, index_path, time_index_path, write_index_files

CHECKPOINT_NAME = "cleaner-checkpoint.json"
CLEANER_LOCK_NAME = "cleaner.lock"


@dataclass(slots=True)
class CleanerCheckpoint:
    """What past passes did to one partition.

    ``passes`` holds ``(end_offset, time_ms)`` with growing ends: a record at offset
    ``o`` was first seen by a pass at the time of the first entry whose end exceeds ``o``.
    """

    clean_offset: int = 0
    passes: list[tuple[int, int]] = field(default_factory=list)
    #: Where the closed segments ended at the last pass (the active segment's base then).
    closed_end: int = 0
    #: When a pass could next remove more without new segments (``None``: not by time alone).
    due_ms: int | None = None
    #: The hold that stopped the last pass (``None``: none did).
    held_at: int | None = None

    def first_seen_ms(self, offset: int) -> int | None:
        """When compaction first saw ``offset`` (``None``: not yet)."""
        for end, at in self.passes:
            if offset < end:
                return at
        return None

    def record_pass(self, end_offset: int, now_ms: int, delete_retention_ms: int) -> None:
        """Note a pass over ``[0, end_offset)``; merge entries whose tombstones all expired."""
        if not self.passes or end_offset > self.passes[-1][0]:
            self.passes.append((end_offset, now_ms))
        self.clean_offset = max(self.clean_offset, end_offset)
        # An entry may fold into the next once the next has expired too: every offset
        # it covers is then past its delete retention either way.
        while len(self.passes) > 1 and self.passes[1][1] + delete_retention_ms <= now_ms:
            del self.passes[0]

    @classmethod
    def load(cls, directory: Path) -> CleanerCheckpoint:
        """Read the checkpoint of a partition directory (empty if none was written)."""
        try:
            raw = orjson.loads((directory / CHECKPOINT_NAME).read_bytes())
        except FileNotFoundError:
            return cls()
        return cls(
            int(raw["clean_offset"]),
            [(int(end), int(at)) for end, at in raw["passes"]],
            int(raw.get("closed_end", 0)),
            raw.get("due_ms"),
            raw.get("held_at"),
        )

    def save(self, directory: Path) -> None:
        """Replace the checkpoint atomically and durably."""
        replace_json(
            directory / CHECKPOINT_NAME,
            {
                "clean_offset": self.clean_offset,
                "passes": self.passes,
                "closed_end": self.closed_end,
                "due_ms": self.due_ms,
                "held_at": self.held_at,
            },
        )


@dataclass(slots=True)
class PartitionCleaning:
    """Counts of one partition before and after a pass."""

    records_before: int = 0
    records_after: int = 0
    bytes_before: int = 0
    bytes_after: int = 0


@contextlib.contextmanager
def cleaner_lock(directory: Path) -> Iterator[None]:
    """Serialise cleaners of one partition (across processes); writers are not blocked."""
    fd = os.open(directory / CLEANER_LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def clean_partition(
    segments: PartitionSegments, spec: TopicSpec, now_ms: int, *, hold: int | None = None
) -> PartitionCleaning:
    """Run one compaction (compacted topics) and/or retention pass over a partition's segments.

    Nothing at or after ``hold`` is removed (see the module docstring).
    """
    with cleaner_lock(segments.directory):
        _remove_leftovers(segments.directory)
        checkpoint = CleanerCheckpoint.load(segments.directory)
        checkpoint.due_ms = checkpoint.held_at = None
        retains = not spec.compacted or spec.retention_ms is not None or spec.retention_bytes is not None
        if spec.compacted:
            result = _compact(segments, spec, now_ms, hold, checkpoint)
            if retains:
                after = _retain(segments, spec, now_ms, hold, checkpoint)
                result.records_after, result.bytes_after = after.records_after, after.bytes_after
        else:
            result = _retain(segments, spec, now_ms, hold, checkpoint)
        checkpoint.closed_end = segments.listing(force=True)[-1][0]
        checkpoint.save(segments.directory)
        return result


def cleaning_due(segments: PartitionSegments, now_ms: int, *, hold: int | None = None) -> bool:
    """Whether a pass could remove anything the last one could not (cheap: the listing and the checkpoint)."""
    checkpoint = CleanerCheckpoint.load(segments.directory)
    if segments.listing(force=True)[-1][0] > checkpoint.closed_end:
        return True  # a segment closed since the last pass
    if checkpoint.due_ms is not None and now_ms >= checkpoint.due_ms:
        return True
    return checkpoint.held_at is not None and (hold is None or hold > checkpoint.held_at)


@dataclass(frozen=True, slots=True)
class PartitionUsage:
    """A partition's bytes on disk and its dirty bytes: closed segments at or after the clean offset."""

    size: int
    closed: int
    dirty: int


def partition_usage(segments: PartitionSegments) -> PartitionUsage:
    """Sizes from the listing and ``stat``; the active segment is neither clean nor dirty (never cleaned)."""
    clean_offset = CleanerCheckpoint.load(segments.directory).clean_offset
    listing = segments.listing(force=True)
    size = closed = dirty = 0
    for number, (base, path) in enumerate(listing):
        try:
            length = os.stat(path).st_size
        except FileNotFoundError:
            continue  # removed by a concurrent pass
        size += length
        if number < len(listing) - 1:
            closed += length
            if base >= clean_offset:
                dirty += length
    return PartitionUsage(size, closed, dirty)


def _remove_leftovers(directory: Path) -> None:
    # Rewrites that a crash interrupted before their rename; the originals are intact.
    for name in os.listdir(directory):
        if name.endswith(CLEANED_SUFFIX):
            (directory / name).unlink(missing_ok=True)


@dataclass(slots=True)
class _SegmentStats:
    base: int
    path: Path
    records: int = 0
    size: int = 0
    max_ts: int = NO_TIMESTAMP


def _compact(
    segments: PartitionSegments, spec: TopicSpec, now_ms: int, hold: int | None, checkpoint: CleanerCheckpoint
) -> PartitionCleaning:
    listing = segments.listing(force=True)
    horizon = now_ms - spec.min_compaction_lag_ms
    unpack = RECORD.unpack_from
    record_size = RECORD.size
    latest: dict[bytes, int] = {}
    stats: list[_SegmentStats] = []
    # Pass 1: latest offset per key over the whole partition, and per-segment summaries.
    for number, (base, path) in enumerate(listing):
        seg = _SegmentStats(base, path, size=os.stat(path).st_size)
        stats.append(seg)
        for header, buf, off in segments.scan_segment(base, path, active=number == len(listing) - 1):
            seg.records += header.record_count
            seg.max_ts = max(seg.max_ts, header.max_timestamp)
            first = header.base_offset
            records, p = records_section(buf, off, header)
            for _ in range(header.record_count):
                delta, _ts, klen, vlen, hlen = unpack(records, p)
                p += record_size
                if klen >= 0:
                    latest[bytes(records[p : p + klen])] = first + delta
                    p += klen
                p += (vlen if vlen > 0 else 0) + hlen
    result = PartitionCleaning(records_before=sum(s.records for s in stats), bytes_before=sum(s.size for s in stats))
    cleanable: list[_SegmentStats] = []
    for number, seg in enumerate(stats[:-1]):
        if seg.max_ts > horizon:
            _note_due(checkpoint, seg.max_ts + spec.min_compaction_lag_ms + 1)
            break
        if hold is not None and stats[number + 1].base > hold:
            checkpoint.held_at = hold
            break
        cleanable.append(seg)
    clean_end = stats[len(cleanable)].base
    checkpoint.record_pass(clean_end, now_ms, spec.delete_retention_ms)
    # Tombstones first seen at or before this time have outlived their delete retention.
    expired_before = now_ms - spec.delete_retention_ms
    for seg in cleanable:
        kept, size, first_seen = _rewrite_segment(segments, seg, latest, checkpoint, expired_before)
        seg.records, seg.size = kept, size
        if first_seen is not None:
            _note_due(checkpoint, first_seen + spec.delete_retention_ms + 1)
    result.records_after = sum(s.records for s in stats)
    result.bytes_after = sum(s.size for s in stats)
    return result


def _note_due(checkpoint: CleanerCheckpoint, at_ms: int) -> None:
    checkpoint.due_ms = at_ms if checkpoint.due_ms is None else min(checkpoint.due_ms, at_ms)


def _rewrite_segment(
    segments: PartitionSegments,
    seg: _SegmentStats,
    latest: dict[bytes, int],
    checkpoint: CleanerCheckpoint,
    expired_before: int,
) -> tuple[int, int, int | None]:
    """Rewrite one closed segment without superseded records.

    Return its records and bytes after, and when its earliest kept tombstone was first seen.
    """
    unpack = RECORD.unpack_from
    record_size = RECORD.size
    parts: list[bytes | bytearray] = []
    index = SegmentIndex()
    position = 0
    running = NO_TIMESTAMP
    kept_total = 0
    changed = False
    first_seen: int | None = None
    for header, buf, off in segments.scan_segment(seg.base, seg.path, active=False):
        first = header.base_offset
        records, p = records_section(buf, off, header)
        kept: list[bytes | memoryview] = []
        max_ts = NO_TIMESTAMP
        for _ in range(header.record_count):
            start = p
            delta, ts, klen, vlen, hlen = unpack(records, p)
            p += record_size
            offset = first + delta
            keep = True
            if klen >= 0:
                keep = latest.get(bytes(records[p : p + klen])) == offset
                if keep and vlen < 0:
                    seen = checkpoint.first_seen_ms(offset)
                    keep = seen is None or seen > expired_before
                    if keep and seen is not None:
                        first_seen = seen if first_seen is None else min(first_seen, seen)
            p += (klen if klen > 0 else 0) + (vlen if vlen > 0 else 0) + hlen
            if keep:
                kept.append(records[start:p])
                max_ts = max(max_ts, ts)
        batch: bytes | bytearray
        if len(kept) == header.record_count:
            batch = buf[off : off + header.length]
            max_ts = header.max_timestamp
        else:
            changed = True
            if not kept:
                continue
            # A rewritten batch keeps its codec: compressed batches stay compressed.
            compression: Compression = "zstd" if header.attributes & ATTR_CODEC else "none"
            batch = seal_batch(first, header.last_offset_delta, len(kept), max_ts, kept, compression=compression)
        running = max(running, max_ts)
        if index.wants(position):
            index.add(first, position, running)
        parts.append(batch)
        position += len(batch)
        kept_total += len(kept)
    if not changed:
        return kept_total, position, first_seen
    _swap(segments.directory, seg.path, parts, index)
    return kept_total, position, first_seen


def _swap(directory: Path, path: Path, parts: list[bytes | bytearray], index: SegmentIndex) -> None:
    """Replace segment ``path`` by ``parts`` atomically (or delete it when nothing is left)."""
    if not parts:
        _delete_segment(path)
        fsync_directory(directory)
        return
    cleaned = path.with_name(path.name + CLEANED_SUFFIX)
    with open(cleaned, "wb") as fh:
        fh.writelines(parts)
        fh.flush()
        os.fsync(fh.fileno())
    write_index_files(path, index, suffix=CLEANED_SUFFIX)
    # Old indexes go before the new log arrives, so no reader pairs an old index
    # with the new log; a reader without an index rebuilds it by scanning.
    index_path(path).unlink(missing_ok=True)
    time_index_path(path).unlink(missing_ok=True)
    os.replace(cleaned, path)
    for target in (index_path(path), time_index_path(path)):
        os.replace(target.with_name(target.name + CLEANED_SUFFIX), target)
    fsync_directory(directory)


def _delete_segment(path: Path) -> None:
    path.unlink(missing_ok=True)
    index_path(path).unlink(missing_ok=True)
    time_index_path(path).unlink(missing_ok=True)


def _retain(
    segments: PartitionSegments, spec: TopicSpec, now_ms: int, hold: int | None, checkpoint: CleanerCheckpoint
) -> PartitionCleaning:
    listing = segments.listing(force=True)
    stats: list[_SegmentStats] = []
    for number, (base, path) in enumerate(listing):
        seg = _SegmentStats(base, path, size=os.stat(path).st_size)
        for header, _buf, _off in segments.scan_segment(base, path, active=number == len(listing) - 1):
            seg.records += header.record_count
            seg.max_ts = max(seg.max_ts, header.max_timestamp)
        stats.append(seg)
    result = PartitionCleaning(records_before=sum(s.records for s in stats), bytes_before=sum(s.size for s in stats))
    remaining = result.bytes_before
    deleted = 0
    # Only closed segments, oldest first; the active segment always stays.
    for number, seg in enumerate(stats[:-1]):
        too_old = spec.retention_ms is not None and seg.max_ts < now_ms - spec.retention_ms
        too_big = spec.retention_bytes is not None and remaining > spec.retention_bytes
        if not (too_old or too_big):
            if spec.retention_ms is not None:
                _note_due(checkpoint, seg.max_ts + spec.retention_ms + 1)
            break
        if hold is not None and stats[number + 1].base > hold:
            checkpoint.held_at = hold
            break
        _delete_segment(seg.path)
        remaining -= seg.size
        deleted += 1
    if deleted:
        fsync_directory(segments.directory)
    result.records_after = sum(s.records for s in stats[deleted:])
    result.bytes_after = remaining
    return result
