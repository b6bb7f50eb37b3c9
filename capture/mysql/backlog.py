"""The binlog between capture's saved position and the server's end, and what the server keeps before it.

A MySQL server keeps no slot for capture: it purges whole binlog files by age
(``binlog_expire_logs_seconds``), oldest first, never the current one. So what ``status`` and
``/metrics`` say about a MySQL source is read from ``SHOW BINARY LOGS`` (each file's size) and
``SHOW MASTER STATUS`` (the end), against the position capture saved:

* **lag**: binlog bytes from the saved position to the end, across files (the rest of the
  position's file, every file between, the end's offset in the last);
* **headroom**: bytes of the files older than the position's file, which the server purges
  before it; with none left, the next purge takes changes capture has not read (unless the
  position is in the current file, which is never purged);
* **purged**: the position's file is gone, so capture cannot resume (``source resync``).

:func:`binlog_backlog` is pure; :func:`read_server_binlogs` is the one read, on any connection
allowed ``BINLOG MONITOR`` (MySQL: ``REPLICATION CLIENT``), as capture's account is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from capture.mysql.binlog.position import BinlogPosition
from capture.mysql.prerequisites import ServerFacts, retention_seconds


@dataclass(frozen=True)
class BinlogFile:
    """One binlog file the server holds, with its size in bytes."""

    name: str
    size: int


@dataclass(frozen=True)
class ServerBinlogs:
    """The server's binlog files, oldest first, its end, and how long it keeps them (None: forever)."""

    files: tuple[BinlogFile, ...]
    end: BinlogPosition
    expire_s: int | None = None


@dataclass(frozen=True)
class BinlogBacklog:
    """Where a saved position stands against the server's binlogs (see the module docstring)."""

    #: False: the server no longer holds the position's file (capture needs ``source resync``).
    present: bool
    #: Bytes from the position to the server's end; None when the position's file is purged.
    lag_bytes: int | None
    #: Bytes of the files older than the position's file (0 when purged).
    headroom_bytes: int
    #: How many files are older than the position's file (0 when purged).
    headroom_files: int
    #: The oldest file the server still holds (None: binary logging holds no file).
    oldest: str | None


def binlog_backlog(position: BinlogPosition, server: ServerBinlogs) -> BinlogBacklog:
    """How far ``position`` is behind ``server``'s end, and what the server may purge before it."""
    names = [f.name for f in server.files]
    oldest = names[0] if names else None
    if position.file == server.end.file:
        # The current file may be missing from SHOW BINARY LOGS read a moment before SHOW MASTER STATUS.
        index = names.index(position.file) if position.file in names else len(names)
        before = server.files[:index]
        return BinlogBacklog(
            True, max(server.end.offset - position.offset, 0), sum(f.size for f in before), len(before), oldest
        )
    if position.file not in names:
        return BinlogBacklog(False, None, 0, 0, oldest)
    index = names.index(position.file)
    lag = max(server.files[index].size - position.offset, 0)
    for item in server.files[index + 1 :]:
        if item.name == server.end.file:
            break
        lag += item.size
    lag += server.end.offset
    before = server.files[:index]
    return BinlogBacklog(True, lag, sum(f.size for f in before), len(before), oldest)


def read_server_binlogs(cursor: Any) -> ServerBinlogs | None:
    """The server's binlog files, end and retention; None when binary logging is off."""
    cursor.execute("SHOW BINARY LOGS")
    files = tuple(BinlogFile(str(row[0]), int(row[1])) for row in cursor.fetchall())
    cursor.execute("SHOW MASTER STATUS")
    end = cursor.fetchone()
    if end is None:
        return None
    cursor.execute("SHOW GLOBAL VARIABLES WHERE Variable_name IN ('binlog_expire_logs_seconds', 'expire_logs_days')")
    variables = {str(name).lower(): str(value) for name, value in cursor.fetchall()}
    expire_s = retention_seconds(ServerFacts(variables))
    return ServerBinlogs(files, BinlogPosition(str(end[0]), int(end[1])), expire_s)
