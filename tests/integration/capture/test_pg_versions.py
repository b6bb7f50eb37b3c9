"""Capture on every supported PostgreSQL version (14, 15, 16, 17, 18): the cases that differ by version.

Per version, one server (``pg_version``, started once for the module, one version at a time):

* the Debezium conformance run (snapshot and streaming of the whole conformance workload, the
  default type modes), compared with the same allow-list as ``test_debezium_conformance.py``;
  on 15 that module already compares all three mode configurations on the session server;
* the slot ``source add`` creates: a failover slot from 17 on, before that a note of what a
  failover needs (``source resync``);
* a walsender killed twice while large transactions stream (``logical_decoding_work_mem``
  at 64 kB, so pgoutput protocol 2 sends them in pieces): the real ``capture --follow``
  reconnects and the log equals an audit trigger's record, nothing lost, nothing twice.

The rest of the capture suite runs on the session's server (15) only: it does not depend on
the server version.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from harness import audit
from harness.conformance import HeadwaterProject, masked_dsn, run_conformance
from harness.debezium import DebeziumModes
from harness.debezium_differences import DELIBERATE
from harness.event_comparison import compare, summary
from harness.names import NameFactory
from harness.standby import wait_until

DEFAULT_MODES = {"string/adaptive/base64": DebeziumModes()}
BATCHES = 6
ROWS_PER_BATCH = 1000


def server_major(server: Any) -> int:
    return int(server.execute("SHOW server_version_num")[0][0]) // 10000


def test_server_runs_the_version(pg_version: tuple[int, Any]) -> None:
    major, server = pg_version
    assert server_major(server) == major


def test_capture_matches_debezium(
    pg_version: tuple[int, Any], debezium: Any, tmp_path: Path, report: Callable[[str], None]
) -> None:
    major, server = pg_version
    if major == 15:
        pytest.skip("15 is the session server: test_debezium_conformance.py compares all three mode configurations")
    captured = run_conformance(
        server, debezium, DEFAULT_MODES, work_dir=tmp_path, unique=NameFactory(f"test_pg_versions_{major}")
    )
    comparisons = [compare(f"pg{major} {label}", p.debezium, p.headwater, DELIBERATE) for label, p in captured.items()]
    report(summary(comparisons))
    comparison = comparisons[0]
    assert comparison.pairs > 60
    assert not comparison.unexpected, summary(comparisons)


def test_walsender_killed_mid_stream_resumes_without_loss_or_duplicates(
    pg_version: tuple[int, Any], tmp_path: Path
) -> None:
    major, server = pg_version
    names = NameFactory(f"walsender_{major}")
    dbname = names("kill")
    server.create_database(dbname)
    dsn = server.dsn(dbname)
    try:
        server.execute(audit.SCHEMA, dbname=dbname)
        server.execute(f"ALTER DATABASE {dbname} SET logical_decoding_work_mem = '64kB'")
        project = HeadwaterProject(tmp_path / "project", server.password)
        project.write({})
        source = names("src")
        dsn_ref = masked_dsn(server, dbname)
        added = project.cli("source", "add", source, "--dsn", dsn_ref, "--tables", "public.t", "--yes")
        slot = f"headwater_{source}"
        # 17+: a failover slot (a promoted standby keeps it); before: one note line saying what a failover needs.
        if major >= 17:
            failover = f"SELECT failover FROM pg_replication_slots WHERE slot_name = '{slot}'"
            assert server.execute(failover, dbname=dbname) == [(True,)]
            assert "note:" not in added.stderr
        else:
            notes = [line for line in added.stderr.splitlines() if line.startswith("note: ")]
            assert len(notes) == 1 and "failover" in notes[0] and f"headwater source resync {source}" in notes[0]
        capture = project.follow(source)
        try:
            wait_until(lambda: slot_active(server, dbname, slot), 60, "capture to start streaming")
            with psycopg.connect(dsn, autocommit=True) as conn:
                for batch in range(BATCHES):
                    audit.run_batch(conn, batch, ROWS_PER_BATCH)
                    if batch % 3 == 1:
                        # The walsender is busy decoding or streaming the transaction just committed.
                        # Under load capture may still be between its snapshot and streaming (no
                        # walsender yet): wait for one, so every kill kills (CI once killed none).
                        wait_until(lambda: terminated(conn, slot), 60, "a walsender to kill")
            total = len(audit.audited_changes(dsn))
            wait_until(lambda: len(audit.logged_changes(project, source)) >= total, 120, f"{total} changes in the log")
        finally:
            code, _out, err = capture.stop()
        assert code == 0, err[-3000:]
        assert "retrying with backoff" in err, err[-3000:]  # it did lose the walsender, and came back
        streamed = f"SELECT stream_txns FROM pg_stat_replication_slots WHERE slot_name = '{slot}'"
        wait_until(lambda: server.execute(streamed, dbname=dbname)[0][0] > 0, 10, "transactions streamed in pieces")
        audit.assert_log_equals_audit(project, source, dsn)
    finally:
        server.drop_database(dbname)


def terminated(conn: psycopg.Connection[Any], slot: str) -> bool:
    """Terminate the slot's walsender; False when the slot has none right now."""
    rows = conn.execute(
        "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
        "WHERE slot_name = %s AND active_pid IS NOT NULL",
        (slot,),
    ).fetchall()
    return rows == [(True,)]


def slot_active(server: Any, dbname: str, slot: str) -> bool:
    query = f"SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{slot}' AND active_pid IS NOT NULL"
    return bool(server.execute(query, dbname=dbname)[0][0])
