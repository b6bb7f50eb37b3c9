"""A MySQL capture agent in its own process, for fault tests that SIGKILL it.

    python tests/harness/mysql_capture_child.py SOURCE DSN TABLES HOME

Captures ``TABLES`` (comma-separated ``db.table``) of ``DSN`` into the file log ``HOME/log``
(state in ``HOME/capture/SOURCE``), following the binlog until killed. Prints ``started`` once
the agent runs. Until ``headwater capture`` reaches MySQL sources (issue 28's source interface),
this is how a test runs capture as a separate process.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from capture.mysql.agent import MySqlAgent
from capture.mysql.settings import MySqlSource
from core.log_config import LogConfig
from log.file.backend import FileLog


def main() -> None:
    name, dsn, tables, home = sys.argv[1:5]
    source = MySqlSource.from_dsn(name, dsn, tuple(tables.split(",")))
    agent = MySqlAgent(source, FileLog(Path(home) / "log"), LogConfig(), Path(home) / "capture" / name)
    print("started", flush=True)
    agent.run(until_caught_up=False)


if __name__ == "__main__":
    main()
