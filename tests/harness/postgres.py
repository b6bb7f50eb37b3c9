"""The session's PostgreSQL server and per-test databases."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from harness.processes import stop_at_exit
from harness.reaper import reap_when_gone
from harness.workers import service_dir
from operations.embedded_postgres import EmbeddedPostgres

#: Unusual offsets (+12:45 / +13:45 with DST) so code that leaks the server's time zone fails.
TEST_TIMEZONE = "Pacific/Chatham"


def start_pg_server(
    *, timezone: str = TEST_TIMEZONE, settings: dict[str, str] | None = None, bin_dir: Path | None = None
) -> tuple[EmbeddedPostgres, Callable[[], None]]:
    """Start a fresh server in its own temp dir; returns it and an idempotent stop-and-remove.

    ``bin_dir``: the server binaries to run (another PostgreSQL version, ``harness.tool_cache``);
    default: what :func:`operations.embedded_postgres.find_postgres_bin` finds.

    The stop also runs at interpreter exit or SIGTERM if nobody called it.

    The directory is :func:`harness.workers.service_dir`'s (one per server, named after the
    xdist worker), not under pytest's basetemp, which the server running as ``nobody`` may not reach.
    """
    directory = service_dir("pg")
    server = EmbeddedPostgres(
        directory / "data",
        timezone=timezone,
        bin_dir=bin_dir,
        # fsync off: tests never survive a machine crash, and durability costs seconds per test run.
        # Not synchronous_commit=off: logical decoding reads only flushed WAL, so a committed
        # change would reach a slot up to wal_writer_delay later and tests would race.
        # Many slots: tests that do not drop their databases leave slots behind until session end.
        settings={
            "fsync": "off",
            "full_page_writes": "off",
            "max_replication_slots": "64",
            "max_wal_senders": "64",
            **(settings or {}),
        },
    )

    def stop() -> None:
        try:
            server.stop("fast")
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    stopper = stop_at_exit(stop)
    try:
        server.start()
    except BaseException:
        stopper()
        raise
    reap_when_gone(directory, [server.data_dir])  # pg_ctl daemonises: a SIGKILLed worker cannot stop it
    return server, stopper


@dataclass
class PgDatabase:
    """One test's database on the session server; dropped (slots first) after the test."""

    server: EmbeddedPostgres
    name: str

    @property
    def dsn(self) -> str:
        """Superuser DSN of this database."""
        return self.server.dsn(self.name)

    def dsn_for(self, user: str, password: str | None = None) -> str:
        """DSN of this database for another role (e.g. a least-privilege capture role)."""
        return self.server.dsn(self.name, user, password)

    def connect(self, **kwargs: Any) -> psycopg.Connection[Any]:
        """An autocommit superuser connection (close it, or use ``with``)."""
        return psycopg.connect(self.dsn, autocommit=True, **kwargs)

    def execute(self, statement: str | sql.Composable, params: Sequence[Any] | None = None) -> list[tuple[Any, ...]]:
        """Run one statement as superuser in autocommit mode; returns its rows (``[]`` when none)."""
        with self.connect() as conn:
            cur = conn.execute(statement, params)  # type: ignore[arg-type]
            return cur.fetchall() if cur.description is not None else []

    def drop(self) -> None:
        """Drop the database, its replication slots first (a slot pins its database)."""
        for attempt in range(3):
            try:
                self.server.drop_database(self.name)
                return
            except psycopg.errors.ObjectInUse:
                # A walsender may still be shutting down after its connection closed.
                if attempt == 2:
                    raise
                time.sleep(0.5)
