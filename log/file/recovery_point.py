"""A partition's recovery point: how far its active segment's bytes were acknowledged.

Like Kafka's ``recovery-point-offset-checkpoint``, but binding: every batch before the
recovery point was fsynced before its append returned, so damage there is lost
acknowledged data (:class:`~log.errors.CorruptLogError`), never a torn tail. Only bytes
at or after it may be cut off as the remains of an append that a crash interrupted.

On disk ``<partition>/recovery-point`` is one fixed 36-byte record rewritten in place::

    magic "HWRP" | version u16 | reserved u16 | segment_base i64 | segment_inode u64 | end i64 | crc32c u32

A rewrite in place (``pwrite`` + ``fdatasync`` on a file the writer keeps open) costs one
fsync and leaves the directory alone; a temp file + rename would cost two fsyncs and
touch the directory's modification time, which readers watch to re-list segments. A
record torn by a crash fails its CRC and reads as "no recovery point": the partition is
then recovered as before recovery points existed (torn tail truncated), never refused.

The point names its segment by base offset *and* inode: it binds only while that very
file is the active segment. A roll moves it to the new segment; a segment that became
closed is strict anyway; a file that was replaced (restored from a backup, copied) is a
different file, so an old point does not apply to it. Compaction and retention touch
closed segments only, and deleting a topic removes its directories, recovery points
included; a writer of a deleted topic keeps writing through its open descriptor into
the deleted file, never into a recreated topic's directory.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from core.durable_files import fsync_directory
from log.file.batch_codec import crc32c

logger = logging.getLogger(__name__)

RECOVERY_POINT_NAME = "recovery-point"
#: A writer updates the recovery point after an append at most this often (and at every
#: roll and clean close), so appends do not each pay a second fsync. Bytes appended since
#: the last update are treated as a possibly torn tail after a crash, as before.
RECOVERY_POINT_INTERVAL_S = 1.0

_MAGIC = b"HWRP"
_VERSION = 1
_BODY = struct.Struct("<4sHHqQq")
_CRC = struct.Struct("<I")
RECORD_SIZE = _BODY.size + _CRC.size


@dataclass(frozen=True, slots=True)
class RecoveryPoint:
    """Every batch before byte ``end`` of segment ``segment_base`` (file inode ``segment_inode``) was acknowledged."""

    segment_base: int
    segment_inode: int
    end: int

    def encode(self) -> bytes:
        """The on-disk record (see the module docstring)."""
        body = _BODY.pack(_MAGIC, _VERSION, 0, self.segment_base, self.segment_inode, self.end)
        return body + _CRC.pack(crc32c(body, 0))

    @classmethod
    def decode(cls, data: bytes) -> RecoveryPoint | None:
        """The point in ``data``, or ``None`` if it is not a whole, intact record of this version."""
        if len(data) < RECORD_SIZE:
            return None
        magic, version, _reserved, base, inode, end = _BODY.unpack_from(data)
        (crc,) = _CRC.unpack_from(data, _BODY.size)
        if magic != _MAGIC or version != _VERSION or crc != crc32c(data[: _BODY.size], 0):
            return None
        if base < 0 or end < 0:
            return None
        return cls(base, inode, end)


def recovery_point_path(directory: Path) -> Path:
    """Where a partition directory keeps its recovery point."""
    return directory / RECOVERY_POINT_NAME


def load_recovery_point(directory: Path) -> RecoveryPoint | None:
    """The partition's recovery point; ``None`` when missing or unreadable (old logs, a torn update)."""
    try:
        with open(recovery_point_path(directory), "rb") as fh:
            data = fh.read(RECORD_SIZE)
    except OSError:
        return None
    point = RecoveryPoint.decode(data)
    if point is None and data:
        logger.warning("ignoring unreadable recovery point %s", recovery_point_path(directory))
    return point


class RecoveryPointFile:
    """The writer's open recovery point file; :meth:`save` makes a new point durable.

    Saving is best effort: a failure (a full or failing disk) leaves the previous point,
    which stays true because the active segment only grows past it, and never fails the
    append that triggered it.
    """

    def __init__(self, fd: int, path: Path) -> None:
        self._fd = fd
        self.path = path

    @classmethod
    def open(cls, directory: Path) -> RecoveryPointFile | None:
        """Open (creating it durably if needed) the partition's recovery point; ``None`` if impossible."""
        path = recovery_point_path(directory)
        try:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                return cls(os.open(path, os.O_RDWR), path)
            try:
                # A point is only worth anything if its file survives a crash too.
                fsync_directory(directory)
            except BaseException:
                os.close(fd)
                raise
        except OSError as error:
            logger.warning("cannot open recovery point %s (%s); a crash recovers as without one", path, error)
            return None
        return cls(fd, path)

    def save(self, point: RecoveryPoint) -> bool:
        """Replace the point in place and fsync it; whether it worked.

        Call only once every batch before ``point.end`` is durable (fsynced).
        """
        try:
            os.pwrite(self._fd, point.encode(), 0)
            os.fdatasync(self._fd)
        except OSError as error:
            logger.debug("recovery point %s not updated: %s", self.path, error)
            return False
        return True

    def close(self) -> None:
        """Close the file (idempotent)."""
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            with contextlib.suppress(OSError):
                os.close(fd)
