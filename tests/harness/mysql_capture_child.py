"""A MySQL capture agent in its own process, for fault tests that SIGKILL it.

    python tests/harness/mysql_capture_child.py SOURCE DSN TABLES HOME [KILL_AT]

Captures ``TABLES`` (comma-separated ``db.table``) of ``DSN`` into the file log ``HOME/log``
(state in ``HOME/capture/SOURCE``), following the binlog until killed. Prints ``started`` once
the agent runs: capture as a bare process, without a project or the CLI around it.

With ``KILL_AT`` it captures until caught up instead, and SIGKILLs itself at that point of a
resync (:mod:`capture.mysql.resync`), exiting 0 if it never got there:

* ``snapshot``: once three chunks of the re-snapshot's rows are durable (chunks of 50 rows);
* ``deletes``: once the first batch of its deletes is durable (batches of about 10 deletes);
* ``clear``: with everything durable, just before the request is cleared;
* ``save``: after the request was cleared, before the stream's start is saved.

``KILL_AT`` ``chunks=N`` instead follows the binlog (until killed) with incremental snapshot chunks
of ``N`` rows (:mod:`capture.mysql.incremental`).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from capture import resync
from capture.appender import Appender
from capture.mysql import agent as mysql_agent
from capture.mysql import incremental, snapshot
from capture.mysql.agent import MySqlAgent
from capture.mysql.settings import MySqlSource
from core.log_config import LogConfig
from log.file.backend import FileLog


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def kill_at(point: str) -> None:
    """Arrange the SIGKILL at ``point`` (see the module docstring)."""
    flush = Appender.flush
    flushed = {"rows": 0, "deletes": 0}

    def counting_flush(self: Appender, *args: Any, **kwargs: Any) -> None:
        ops = {b'"op":"r"' in r.value for r in self.records if r.value is not None}
        deletes = any(r.value is not None and b'"op":"d"' in r.value for r in self.records)
        flush(self, *args, **kwargs)
        flushed["rows"] += True in ops
        flushed["deletes"] += deletes
        if (point == "snapshot" and flushed["rows"] == 3) or (point == "deletes" and flushed["deletes"] == 1):
            _die()

    if point in ("snapshot", "deletes"):
        snapshot.CHUNK_ROWS = 50
        mysql_agent.FLUSH_RECORDS = 20
        Appender.flush = counting_flush  # type: ignore[method-assign]
    elif point == "clear":
        resync.ResyncRequest.clear = lambda self: _die()  # type: ignore[method-assign]
    elif point == "save":
        mysql_agent.save_state = lambda directory, state: _die()
    else:
        raise SystemExit(f"unknown kill point {point}")


def main() -> None:
    name, dsn, tables, home = sys.argv[1:5]
    point = sys.argv[5] if len(sys.argv) > 5 else None
    if point is not None and point.startswith("chunks="):
        incremental.CHUNK_ROWS = int(point.removeprefix("chunks="))
        point = None
    elif point is not None:
        kill_at(point)
    source = MySqlSource.from_dsn(name, dsn, tuple(tables.split(",")))
    agent = MySqlAgent(source, FileLog(Path(home) / "log"), LogConfig(), Path(home) / "capture" / name)
    print("started", flush=True)
    agent.run(until_caught_up=point is not None)


if __name__ == "__main__":
    main()
