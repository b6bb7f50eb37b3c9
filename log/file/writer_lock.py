"""The one-writer-per-partition lock of the file backend (``flock`` on ``writer.lock``).

The kernel drops an ``flock`` when its holder dies, so a crashed writer never leaves a
stale lock behind. The holder writes its pid, host and command line into the file so
that a refused writer can say who holds it.
"""

from __future__ import annotations

import fcntl
import os
import socket
import sys
import time
from pathlib import Path

from log.errors import WriterLockedError

LOCK_NAME = "writer.lock"
#: A competing process may hold the lock for a moment to repair a torn tail; wait that out.
_CONTENDED_WAIT_S = 0.3


def _describe_self() -> str:
    cmdline = " ".join(sys.argv) or sys.executable
    return f"pid {os.getpid()} on {socket.gethostname()} ({cmdline})"


class WriterLock:
    """An exclusive lock on one partition's directory; held until :meth:`release`."""

    def __init__(self, directory: Path, topic: str, partition: int) -> None:
        self.path = directory / LOCK_NAME
        self.topic = topic
        self.partition = partition
        self._fd: int | None = None

    def acquire(self, *, announce: bool = True, wait: bool = False) -> None:
        """Take the lock; ``WriterLockedError`` naming the holder if another writer keeps it.

        ``wait`` blocks until the lock is free (short critical sections such as a
        shared internal topic's append); otherwise a holder that keeps the lock for
        more than a moment is an error. ``announce`` records this process as holder.
        """
        if self._fd is not None:
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if wait:
                fcntl.flock(fd, fcntl.LOCK_EX)
            else:
                deadline = time.monotonic() + _CONTENDED_WAIT_S
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        if time.monotonic() >= deadline:
                            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "another process"
                            raise WriterLockedError(self.topic, self.partition, holder) from None
                        time.sleep(0.02)
            if announce:
                os.ftruncate(fd, 0)
                os.pwrite(fd, _describe_self().encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    def try_acquire(self) -> bool:
        """Take the lock only if it is free right now, without recording a holder."""
        if self._fd is not None:
            return True
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            return False  # e.g. read-only storage: this process can only read
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def release(self) -> None:
        """Drop the lock (idempotent)."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)
