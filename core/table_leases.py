"""The two leases of a warehouse table beside its loader's: who commits now, and who is reading.

* **Commit lease** (``<home>/holders/commit.<build>.lock``, exclusive): held around every
  commit to a table (the loader's micro-batch from its read to its commit, a backfill's
  read-plan-commit, a compaction, a vacuum). So maintenance never races the loader for a
  Delta version: a compaction whose files a MERGE rewrote meanwhile would fail its commit,
  and under a steady stream of MERGEs it would never land. The wait is bounded; the
  holder is named in the error.
* **Reader lease** (``<home>/holders/read.<build>.lock``): a long read that must see one
  version's files to its end (``verify``, a backfill's planning) holds it *shared*;
  expiry (vacuum) takes it *exclusive without waiting* and, when a reader holds it,
  puts the vacuum off to its next pass instead of removing files under the reader.

Both are ``flock``s, so the kernel drops them with their holder, SIGKILL included.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from core.leases import HeldError, Lease, held_message

#: How often a waiting committer tries again (seconds): a loader waiting out a compaction step.
_POLL_S = 0.02


def commit_lease(home: Path, build: str) -> Lease:
    """The commit lease of table build ``build`` (``orders``, ``orders.v2``)."""
    return Lease(home / "holders" / f"commit.{build}.lock", f"commits to warehouse table {build}")


@contextmanager
def committing(home: Path, build: str, timeout_s: float = 600.0) -> Iterator[None]:
    """Hold ``build``'s commit lease for the block, waiting up to ``timeout_s`` (then :class:`HeldError`)."""
    held = commit_lease(home, build)
    started = time.monotonic()
    while not held.try_acquire():
        waited = time.monotonic() - started
        if waited >= timeout_s:
            holder = held.holder()
            raise HeldError(held_message(held.what, holder, waited), what=held.what, holder=holder)
        time.sleep(_POLL_S)
    try:
        yield
    finally:
        held.release()


def _reader_lock(home: Path, build: str) -> int:
    path = home / "holders" / f"read.{build}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)


@contextmanager
def reading(home: Path, build: str) -> Iterator[None]:
    """Hold ``build``'s reader lease shared: no vacuum removes files while the block reads a version."""
    fd = _reader_lock(home, build)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # waits only while a vacuum runs
        yield
    finally:
        os.close(fd)


@contextmanager
def no_readers(home: Path, build: str) -> Iterator[bool]:
    """Yield True, holding new readers off, when nobody reads ``build``; False (and hold nothing) when someone does."""
    fd = _reader_lock(home, build)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)
