"""Who holds what: one process at a time captures a source, loads a table or runs a feed.

A :class:`Lease` is an ``flock`` on ``<home>/holders/<kind>.<name>.lock``. The kernel drops
it when its holder exits however it exits (SIGKILL included), so a lease is never stale.
The holder writes who it is into the file (pid, host, command, since when), so a second
process can name it instead of failing deep inside Postgres or Spark.

Waiting (:func:`acquire`) follows the command's mode: a run that must finish
(``--until-caught-up``, ``--available-now``) waits a bounded time and then fails with
:class:`HeldError`, one line naming the holder; a ``--follow`` run is a standby: it says
so once and takes over as soon as the holder goes away.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import os
import shlex
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import orjson

from core.errors import TransientError

#: How often a waiting process tries the lease again.
POLL_S = 0.5


@dataclass(frozen=True)
class Holder:
    """The process holding a lease."""

    pid: int
    host: str
    command: str
    since: str

    def describe(self) -> str:
        """``pid 123 on host (headwater capture --follow) since 2025-01-01T10:00:00Z``."""
        return f"pid {self.pid} on {self.host} ({self.command}) since {self.since}"

    @classmethod
    def of_this_process(cls, command: str | None = None) -> Holder:
        """This process, named by its command line (``headwater ...`` for the CLI)."""
        now = dt.datetime.now(dt.UTC).replace(microsecond=0)
        return cls(os.getpid(), socket.gethostname(), command or this_command(), now.isoformat().replace("+00:00", "Z"))


def this_command() -> str:
    """This process's command line, ``headwater capture --follow`` rather than ``.../__main__.py capture ...``."""
    argv = list(sys.argv)
    if argv and (argv[0].endswith(("headwater/__main__.py", "/headwater")) or argv[0] == "headwater"):
        argv[0] = "headwater"
    return shlex.join(argv) if argv else sys.executable


class HeldError(TransientError):
    """Another process holds the lease and did not let go within the wait."""

    def __init__(self, message: str, *, what: str, holder: Holder | None) -> None:
        super().__init__(message)
        self.what = what
        self.holder = holder


class Lease:
    """An exclusive claim on ``what`` (e.g. ``capture of source shop``), held until :meth:`release` or exit."""

    def __init__(self, path: Path, what: str) -> None:
        self.path = path
        self.what = what
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        """Whether this process holds it."""
        return self._fd is not None

    def try_acquire(self, holder: Holder | None = None) -> bool:
        """Take the lease if it is free now, recording ``holder`` (default: this process)."""
        if self._fd is not None:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.pwrite(fd, orjson.dumps(asdict(holder or Holder.of_this_process())), 0)
        self._fd = fd
        return True

    def holder(self) -> Holder | None:
        """Who holds the lease now (None: nobody, or it is being taken this instant)."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            return Holder(**orjson.loads(data))
        except (orjson.JSONDecodeError, TypeError):
            return None

    def taken(self) -> bool | None:
        """Whether some process (this one included) holds it now; None where the kernel's lock table is unreadable.

        Read from ``/proc/locks`` (Linux), so looking never takes the lock: a probe with ``flock``
        could make a process starting that instant find the lease held and wait.
        """
        try:
            status = self.path.stat()
        except FileNotFoundError:
            return False  # never taken on this host
        try:
            table = Path("/proc/locks").read_text()
        except OSError:
            return None
        device = f"{os.major(status.st_dev):02x}:{os.minor(status.st_dev):02x}:{status.st_ino}"
        return any(line.split()[1:2] == ["FLOCK"] and device in line.split() for line in table.splitlines())

    def release(self) -> None:
        """Let go (idempotent); the next waiting process takes over."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.ftruncate(fd, 0)
            os.close(fd)


def lease(home: Path, kind: str, name: str) -> Lease:
    """The lease of ``kind`` (``capture``, ``load``, ``feed``) of ``name`` under the project's ``home``."""
    nouns = {"capture": "capture of source", "load": "load of warehouse table", "feed": "feed"}
    return Lease(home / "holders" / f"{kind}.{name}.lock", f"{nouns.get(kind, kind)} {name}")


@dataclass(frozen=True)
class LeaseWait:
    """How to wait for a held lease: ``timeout_s`` None waits as a standby until it is free."""

    timeout_s: float | None
    say: Callable[[str], None] = lambda _line: None


def held_message(what: str, holder: Holder | None, waited_s: float) -> str:
    """The one line of a run that gave up waiting."""
    who = holder.describe() if holder is not None else "another process"
    return (
        f"{what} is held by {who}; gave up after {waited_s:.0f}s: stop that process, wait for it, "
        "or raise --holder-timeout"
    )


def acquire(leases: Sequence[Lease], wait: LeaseWait, *, is_free: Callable[[], Holder | None] | None = None) -> None:
    """Take every lease in ``leases`` (in order), waiting as ``wait`` says; :class:`HeldError` on timeout.

    ``is_free`` is a further check after the leases are held (e.g. a replication slot in
    use by a process elsewhere): it returns the holder while the resource is still taken.
    Leases taken before a timeout are released again.
    """
    started = time.monotonic()
    announced = False
    try:
        while True:
            blocking = next((item for item in leases if not item.try_acquire()), None)
            holder = blocking.holder() if blocking is not None else None
            what = blocking.what if blocking is not None else ""
            if blocking is None and is_free is not None:
                holder = is_free()
                what = leases[0].what if leases else "the resource"
                if holder is None:
                    return
            elif blocking is None:
                return
            waited = time.monotonic() - started
            if wait.timeout_s is not None and waited >= wait.timeout_s:
                raise HeldError(held_message(what, holder, waited), what=what, holder=holder)
            if not announced and holder is not None:
                announced = True
                plan = "taking over when it stops" if wait.timeout_s is None else f"waiting up to {wait.timeout_s:.0f}s"
                role = "standby: " if wait.timeout_s is None else ""
                wait.say(f"{role}{what} is held by {holder.describe()}; {plan}")
            time.sleep(POLL_S)
    except BaseException:
        for item in leases:
            item.release()
        raise
