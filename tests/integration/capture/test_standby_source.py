"""A source that is a hot standby is refused, in one line that says why and what to do.

PostgreSQL 16+ can decode on a standby, but Headwater writes logical messages into the WAL the
slot decodes (the caught-up marker, heartbeats that let the slot advance on an idle database,
incremental-snapshot watermarks), and a standby cannot write WAL: ``pg_logical_emit_message``
fails there ("cannot assign TransactionIds during recovery"). Writing them through the primary
instead would leave incremental-snapshot windows unsound (a chunk read on the standby may come
before the standby replayed its opening watermark). So ``source add`` and ``capture`` refuse a
standby and point at the primary; with PostgreSQL 17+ failover slots capture follows a promoted
standby (``test_failover.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.conformance import PASSWORD_VAR, HeadwaterProject
from harness.standby import StandbyPair, start_standby_pair
from harness.tool_cache import postgres_bin

DBNAME = "shop"


def prepare(primary: object) -> None:
    primary.create_database(DBNAME)  # type: ignore[attr-defined]
    primary.execute("CREATE TABLE t (id int PRIMARY KEY, v text)", dbname=DBNAME)  # type: ignore[attr-defined]
    primary.execute("CREATE PUBLICATION standby_pub FOR TABLE t", dbname=DBNAME)  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def pair() -> Iterator[StandbyPair]:
    started, stop = start_standby_pair(postgres_bin(18), before_backup=prepare)
    try:
        yield started
    finally:
        stop()


def standby_dsn(pair: StandbyPair) -> str:
    return pair.standby.dsn(DBNAME).replace(pair.standby.password, "${" + PASSWORD_VAR + "}")


def assert_refused(stderr: str, code: int) -> None:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert code == 3, stderr
    assert len(lines) == 1, stderr
    assert "standby" in lines[0] and "primary" in lines[0], lines[0]


def test_source_add_refuses_a_standby(pair: StandbyPair, tmp_path: Path) -> None:
    project = HeadwaterProject(tmp_path / "project", pair.standby.password)
    project.write({})
    result = project.run("source", "add", "src", "--dsn", standby_dsn(pair), "--tables", "public.t", "--yes")
    assert_refused(result.stderr, result.returncode)
    assert pair.standby.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_type = 'logical'") == [(0,)]


def test_capture_refuses_a_standby(pair: StandbyPair, tmp_path: Path) -> None:
    project = HeadwaterProject(tmp_path / "project", pair.standby.password)
    project.write(
        {"src": {"dsn": standby_dsn(pair), "tables": ["public.t"], "publication": "standby_pub", "slot": "sb_src"}}
    )
    result = project.run("capture", "--until-caught-up")
    assert_refused(result.stderr, result.returncode)
    assert pair.standby.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_type = 'logical'") == [(0,)]
