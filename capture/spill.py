"""Spill files: the changes of a large open transaction on disk, read back in order in bounded pieces.

A source keeps an open transaction's changes in memory until the open transactions of its
session together hold :class:`SpillBudget` ``threshold_bytes``; every later change of a
transaction that is then growing goes to that transaction's spill file, as the raw bytes the
source sent (pgoutput messages, binlog events) with its position and a tag. The source
decodes them again at commit, a piece at a time (:meth:`SpillFile.read`), so capture's
memory is bounded by configuration, not by the size of a transaction.

Format: batches, each written once ``batch_bytes`` of changes are buffered, as the log's batches
are built (a header with a CRC over a zstd-compressed body) but independent of the log's backend
(a source spills alike whether the log is the file log or Kafka): header ``magic "HWS1" | body
length u32 | plain length u32 | changes u32 | CRC-32 u32`` (little-endian), body zstd of the
changes, each ``position u64 | tag u32 | length u32 | bytes``.

Resume points and invariants:

* A spill file is a cache of what the source re-sends. Nothing of a transaction is
  acknowledged before its last event is in the log, so a crash at any moment loses nothing:
  the next session starts with :meth:`SpillDirectory.clear` and the source sends the
  transaction again from the start.
* A file is removed once its transaction's events are built or it aborted (:meth:`SpillFile.remove`),
  and every spill file in the directory at each session start: spill files never outlive
  the transactions in flight, so the disk holds at most the spilled part of the open ones.
* A full disk (``ENOSPC``, ``EDQUOT``) drops the part of the batch written, and the
  :class:`FullDisk` given decides: it pauses (nothing is acknowledged meanwhile) and the
  write is retried, or it raises.
"""

from __future__ import annotations

import errno
import itertools
import os
import shutil
import struct
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import native

#: The spill directory's name in a source's capture state directory.
SPILL_DIRECTORY = "spill"
SPILL_SUFFIX = ".spill"
#: Bytes of changes buffered before a batch is written.
SPILL_BATCH_BYTES = 1 << 20
_MAGIC = b"HWS1"
_HEADER = struct.Struct("<4sIIII")
_CHANGE = struct.Struct("<QII")
#: zstd level of the bodies: as the file log's batches (fast; spilled changes are read back once).
ZSTD_LEVEL = -1
_FULL = (errno.ENOSPC, errno.EDQUOT)


class SpilledChange(NamedTuple):
    """One change read back: where the source sent it, its tag, its bytes."""

    position: int
    tag: int
    payload: bytes


class FullDisk(Protocol):
    """What a spill write does while the disk is full (see the module docstring)."""

    def wait(self, error: OSError, directory: Path) -> None:
        """Called after a write failed for lack of room: return to retry it, raise to give up."""

    def cleared(self) -> None:
        """Called once a write worked again after :meth:`wait`."""


@dataclass
class SpillBudget:
    """The bytes of changes a session's open transactions hold in memory, against the threshold.

    Sources add an estimate of each change's memory as decoded (:meth:`hold`) and release a
    transaction's at its end. Once ``held`` reaches ``threshold_bytes``, a transaction that
    grows spills when it holds a sixteenth of the threshold or more (:meth:`should_spill`):
    small transactions running beside a large one stay in memory, so the changes held stay
    under ``threshold_bytes`` plus a sixteenth of it per other open transaction.
    """

    threshold_bytes: int
    held: int = 0

    def hold(self, size: int) -> None:
        """Count ``size`` more bytes as held."""
        self.held += size

    def release(self, size: int) -> None:
        """A transaction holding ``size`` bytes ended."""
        self.held = max(0, self.held - size)

    def should_spill(self, own: int) -> bool:
        """Whether a transaction holding ``own`` bytes (counted in ``held``) spills its next changes."""
        return self.held >= self.threshold_bytes and own * 16 >= self.threshold_bytes


class SpillFile:
    """One transaction's spilled changes: appended with :meth:`add`, read back with :meth:`read`."""

    def __init__(self, path: Path, full_disk: FullDisk, *, batch_bytes: int = SPILL_BATCH_BYTES) -> None:
        self.path = path
        self._full_disk = full_disk
        self._batch_bytes = batch_bytes
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._fd: int | None = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        #: Bytes of whole batches in the file.
        self.size = 0
        #: Changes added.
        self.count = 0

    def add(self, position: int, tag: int, payload: bytes) -> None:
        """Add one change (written with the next full batch)."""
        self._pending += (_CHANGE.pack(position, tag, len(payload)), payload)
        self._pending_bytes += len(payload) + _CHANGE.size
        self.count += 1
        if self._pending_bytes >= self._batch_bytes:
            self._write_pending()

    def _write_pending(self) -> None:
        if not self._pending:
            return
        plain = b"".join(self._pending)
        body = _compress(plain)
        header = _HEADER.pack(_MAGIC, len(body), len(plain), len(self._pending) // 2, zlib.crc32(body))
        batch = header + body
        paused = False
        while True:
            try:
                self._write_at(batch, self.size)
                break
            except OSError as exc:
                if exc.errno not in _FULL:
                    raise
                os.ftruncate(self._require_fd(), self.size)  # nothing of the failed batch stays
                paused = True
                self._full_disk.wait(exc, self.path.parent)
        if paused:
            self._full_disk.cleared()
        self.size += len(batch)
        self._pending.clear()
        self._pending_bytes = 0

    def _write_at(self, data: bytes | bytearray, position: int) -> None:
        view = memoryview(data)
        written = 0
        fd = self._require_fd()
        while written < len(data):
            written += os.pwrite(fd, view[written:], position + written)

    def read(self, skip_tags: frozenset[int] = frozenset()) -> Iterator[list[SpilledChange]]:
        """Every change added, in order, one batch at a time; changes tagged in ``skip_tags`` left out.

        The changes still buffered are written first, so each piece read is one batch
        (about ``batch_bytes`` of changes) however large the file.
        """
        self._write_pending()
        fd = self._require_fd()
        position = 0
        while position < self.size:
            head = os.pread(fd, _HEADER.size, position)
            if len(head) < _HEADER.size or head[:4] != _MAGIC:
                msg = f"spill file {self.path}: no batch at byte {position}"
                raise OSError(errno.EIO, msg)
            _, length, plain_length, count, crc = _HEADER.unpack(head)
            body = os.pread(fd, length, position + _HEADER.size)
            if len(body) != length or zlib.crc32(body) != crc:
                msg = f"spill file {self.path}: damaged batch at byte {position}"
                raise OSError(errno.EIO, msg)
            plain = _decompress(body, plain_length)
            piece = []
            at = 0
            for _ in range(count):
                change, tag, size = _CHANGE.unpack_from(plain, at)
                at += _CHANGE.size
                if tag not in skip_tags:
                    piece.append(SpilledChange(change, tag, plain[at : at + size]))
                at += size
            yield piece
            position += _HEADER.size + length

    def remove(self) -> None:
        """Close and delete the file (its transaction is in the log, or aborted). Idempotent."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            self.path.unlink(missing_ok=True)
        self._pending.clear()

    def _require_fd(self) -> int:
        if self._fd is None:
            msg = f"spill file {self.path} was removed"
            raise ValueError(msg)
        return self._fd


class SpillDirectory:
    """``capture/<source>/spill/``: the spill files of one replication session."""

    def __init__(self, directory: Path, full_disk: FullDisk, budget: SpillBudget) -> None:
        self.directory = directory
        self.budget = budget
        self._full_disk = full_disk
        self._numbers = itertools.count(1)

    def clear(self) -> None:
        """Remove every spill file: a new session re-reads whatever was not acknowledged.

        Only spill files go (the directory may be a mount point, or hold an operator's files).
        """
        self.directory.mkdir(parents=True, exist_ok=True)
        for path in self.directory.glob(f"*{SPILL_SUFFIX}"):
            path.unlink(missing_ok=True)

    def new_file(self, name: str) -> SpillFile:
        """A new spill file for the transaction ``name`` (unique within the session)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        return SpillFile(self.directory / f"{name}.{next(self._numbers)}{SPILL_SUFFIX}", self._full_disk)


def _compress(data: bytes) -> bytes:
    # The extension's libzstd when it has one, else pyarrow's (imported only when spilling).
    speedups = native.speedups
    if speedups is not None and (frame := speedups.zstd_compress(data, ZSTD_LEVEL)) is not None:
        return frame  # type: ignore[no-any-return]
    return _codec().compress(data, asbytes=True)  # type: ignore[no-any-return]


def _decompress(frame: bytes, size: int) -> bytes:
    speedups = native.speedups
    if speedups is not None and (plain := speedups.zstd_decompress(frame, size)) is not None:
        return plain  # type: ignore[no-any-return]
    return _codec().decompress(frame, decompressed_size=size, asbytes=True)  # type: ignore[no-any-return]


def _codec() -> Any:
    import pyarrow as pa  # type: ignore[import-untyped]  # no stubs

    return pa.Codec("zstd", compression_level=ZSTD_LEVEL)


class PausingFullDisk:
    """A :class:`FullDisk` that pauses: says so once, keeps the source's connection alive, retries.

    ``keep_alive`` runs before each wait (a standby status to the walsender, so
    ``wal_sender_timeout`` does not end the session); ``stopped`` waits up to ``retry_s`` and
    returns True when capture is asked to stop, and then :meth:`wait` raises ``stop_error()``.
    """

    def __init__(
        self,
        *,
        say: Callable[[str], None],
        keep_alive: Callable[[], None],
        stopped: Callable[[float], bool],
        stop_error: Callable[[], BaseException],
        retry_s: float,
    ) -> None:
        self._say = say
        self._keep_alive = keep_alive
        self._stopped = stopped
        self._stop_error = stop_error
        self._retry_s = retry_s
        self._since: float | None = None

    def wait(self, error: OSError, directory: Path) -> None:
        """Pause once more (see the class docstring)."""
        if self._since is None:
            self._since = time.monotonic()
            free = shutil.disk_usage(directory).free if directory.exists() else 0
            self._say(
                f"spill disk full at {directory} ({os.strerror(error.errno or errno.ENOSPC)}, {free} bytes free): "
                f"capture paused, not acknowledging; retrying every {self._retry_s:g}s"
            )
        if self._stopped(self._retry_s):
            raise self._stop_error()
        self._keep_alive()

    def cleared(self) -> None:
        """A write worked again."""
        if self._since is not None:
            self._say(f"spill disk writable again; capture resumed after {time.monotonic() - self._since:.1f}s")
            self._since = None
