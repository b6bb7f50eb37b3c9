"""The session's MariaDB server (a binlog CDC source) and per-test databases.

The server is :class:`operations.embedded_mariadb.EmbeddedMariaDB`: MariaDB 10.11 from the
system packages (``make prereqs`` installs ``mariadb-server``), its own directory and free
port, ``log_bin``, ``binlog_format=ROW``, ``binlog_row_image=FULL``,
``binlog_row_metadata=FULL``, ``gtid_strict_mode``, its socket under its temp dir, run as
``nobody`` under root, killed by the kernel when the test process dies. Its time zone is
``Pacific/Chatham`` (as the PostgreSQL harness), so TIMESTAMP conversion bugs show.

``DEBEZIUM_VERSION_STRING`` is the version a server reports for Debezium's MySQL connector
(3.6.3) to accept it: that connector takes MariaDB 10.11's version for MySQL >= 8.4 and sends
``SHOW BINARY LOG STATUS`` (MariaDB 10.11 has no such statement); with an 8.0 version the
bundled Connector/J reads ``transaction_isolation`` (MariaDB 10.11 has only ``tx_isolation``).
A 5.7 version with ``MariaDB`` in it passes both, and the binlog client still sees MariaDB.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pymysql

from harness.postgres import TEST_TIMEZONE
from harness.processes import stop_at_exit
from operations.embedded_mariadb import EmbeddedMariaDB

DEBEZIUM_VERSION_STRING = "5.7.19-MariaDB-10.11-reported-for-debezium"


def start_mariadb_server(
    *, timezone: str = TEST_TIMEZONE, settings: dict[str, str] | None = None, version: str | None = None
) -> tuple[EmbeddedMariaDB, Callable[[], None]]:
    """Start a fresh server in its own temp dir; returns it and an idempotent kill-and-remove.

    Not under pytest's basetemp (reset to 0700 each session; the server runs as ``nobody``).
    The stop also runs at interpreter exit or SIGTERM; SIGKILL of the test process kills the
    server through the kernel's parent-death signal.
    """
    server = EmbeddedMariaDB(
        Path(tempfile.mkdtemp(prefix="hw-mariadb-")), timezone=timezone, settings=settings, version=version
    )
    stopper = stop_at_exit(server.remove)
    try:
        server.start()
    except BaseException:
        stopper()
        raise
    return server, stopper


@dataclass
class MariaDatabase:
    """One test's database on the session server; dropped after the test."""

    server: EmbeddedMariaDB
    name: str

    @property
    def dsn(self) -> str:
        """The administrator's ``mysql://`` URL of this database."""
        return self.server.dsn(self.name)

    def dsn_for(self, user: str, password: str | None = None) -> str:
        """``mysql://`` URL of this database for another account (e.g. a least-privilege capture user)."""
        return self.server.dsn(self.name, user, password)

    def connect(self, **kwargs: Any) -> pymysql.connections.Connection[Any]:
        """An autocommit administrator connection to this database (close it, or use ``with``)."""
        return pymysql.connect(**self.server.connect_args(self.name), autocommit=True, **kwargs)

    def execute(self, statement: str, params: Sequence[Any] | None = None) -> list[tuple[Any, ...]]:
        """Run one statement as administrator in autocommit mode; returns its rows (``[]`` when none)."""
        with self.connect() as conn, conn.cursor() as cur:
            cur.execute(statement, params)
            return list(cur.fetchall()) if cur.description is not None else []

    def script(self, *statements: str) -> None:
        """Run statements in order on one connection (autocommit: each its own transaction)."""
        with self.connect() as conn, conn.cursor() as cur:
            for statement in statements:
                cur.execute(statement)

    def drop(self) -> None:
        """Drop the database (binlog dump threads of the test's readers end on their own)."""
        if self.server.running:
            with pymysql.connect(**self.server.connect_args(), autocommit=True) as conn, conn.cursor() as cur:
                cur.execute(f"DROP DATABASE IF EXISTS `{self.name}`")


def create_database(server: EmbeddedMariaDB, name: str) -> MariaDatabase:
    """Create database ``name`` (utf8mb4) on ``server``."""
    with pymysql.connect(**server.connect_args(), autocommit=True) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
    return MariaDatabase(server, name)


def purge_binlogs(server: EmbeddedMariaDB, *, timeout_s: float = 30) -> str:
    """Switch to a new binlog and purge every older one; returns the binlog file that is left.

    MariaDB keeps a binlog until InnoDB's (asynchronous) binlog checkpoint no longer needs
    it, so the purge is repeated until only the current file is listed.
    """
    deadline = time.monotonic() + timeout_s
    with pymysql.connect(**server.connect_args(), autocommit=True) as conn, conn.cursor() as cur:
        while True:
            cur.execute("FLUSH BINARY LOGS")
            cur.execute("SHOW MASTER STATUS")
            current = str(cur.fetchone()[0])
            cur.execute(f"PURGE BINARY LOGS TO '{current}'")
            cur.execute("SHOW BINARY LOGS")
            if [row[0] for row in cur.fetchall()] == [current]:
                return current
            assert time.monotonic() < deadline, f"MariaDB did not purge its binlogs within {timeout_s:.0f} s"
            time.sleep(0.5)
