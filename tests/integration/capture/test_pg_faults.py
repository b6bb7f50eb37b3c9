"""Postgres-side faults: a server restart mid-stream, a dropped slot, an invalidated slot, and resync.

Every test drives the real CLI (``headwater capture`` / ``source add`` / ``source resync``)
as a subprocess against real Postgres and checks the file log it wrote. Tests that
restart the server or need ``max_slot_wal_keep_size`` use a server of their own (the
module-scoped ``own_pg``), never the shared session server.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson
import psycopg
import pytest
from harness.topics import read_topic

from capture.key_set import KEY_SET_FILE, KeySet
from capture.postgres.agent import CaptureAgent
from capture.postgres.catalog import typemap_decoders
from core.log_config import LogConfig
from core.source_config import SourceConfig
from log.file.backend import FileLog

ROOT = Path(__file__).resolve().parents[3]
PASSWORD_VAR = "HW_PGF_PASSWORD"
WAL_STATUS = "SELECT wal_status FROM pg_replication_slots WHERE slot_name = %s"


@pytest.fixture(scope="module")
def own_pg() -> Iterator[object]:
    from harness.postgres import start_pg_server

    # Slots may hold back at most 1 MB of WAL beyond what the server keeps anyway, so a
    # few WAL segment switches invalidate a slot nobody reads.
    server, stop = start_pg_server(settings={"max_slot_wal_keep_size": "1MB", "wal_keep_size": "0"})
    try:
        yield server
    finally:
        stop()


@dataclass
class Project:
    """A headwater project on disk with one source registered through the CLI."""

    dir: Path
    name: str
    dsn: str
    password: str

    @property
    def config(self) -> Path:
        return self.dir / "headwater.yaml"

    @property
    def slot(self) -> str:
        return f"headwater_{self.name}"

    def env(self) -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": str(ROOT), PASSWORD_VAR: self.password}

    def cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "headwater", "--config", str(self.config), *args]
        return subprocess.run(command, env=self.env(), capture_output=True, text=True, timeout=timeout, check=False)

    def follow(self) -> subprocess.Popen[str]:
        command = [sys.executable, "-m", "headwater", "--config", str(self.config), "capture", "--follow"]
        return subprocess.Popen(command, env=self.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def execute(self, statement: str, params: tuple[object, ...] | None = None) -> list[tuple]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            cur = conn.execute(statement, params)
            return cur.fetchall() if cur.description is not None else []

    def log_records(self) -> list:
        with FileLog(self.dir / "home" / "log") as log:
            topic = f"{self.name}.public.t"
            return read_topic(log, topic) if topic in log.list_topics() else []


def make_project(server, name: str, tmp_path: Path) -> Project:
    """A database with table t (id, v), registered with ``headwater source add`` (slot + publication)."""
    server.create_database(name)
    dsn = server.dsn(name)
    password = server.password
    project = Project(tmp_path / "project", name, dsn, password)
    project.dir.mkdir()
    project.config.write_text(f"project: pgf\nhome: {project.dir / 'home'}\nsources: {{}}\n")
    project.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    masked = dsn.replace(password, "${" + PASSWORD_VAR + "}")
    added = project.cli(
        "source", "add", name, "--dsn", masked, "--tables", "public.t", "--snapshot", "initial", "--yes"
    )
    assert added.returncode == 0, added.stderr
    return project


def events(records: list) -> list[dict]:
    return [orjson.loads(r.value) for r in records if r.value is not None]


def sequence(event: dict) -> tuple[int, int]:
    return event["source"]["commit_lsn"], event["source"]["txn_index"]


def assert_each_change_once(records: list) -> None:
    seqs = [sequence(e) for e in events(records)]
    assert len(seqs) == len(set(seqs)), "an event is in the log twice"


def latest_per_key(records: list) -> dict[int, dict | None]:
    """Latest row image per id by sequence (None: deleted), plus tombstones checked after deletes."""
    by_key: dict[int, tuple[tuple[int, int], dict | None]] = {}
    for event in events(records):
        row = event["after"] if event["op"] != "d" else None
        key = (event["after"] or event["before"])["id"]
        if key not in by_key or by_key[key][0] < sequence(event):
            by_key[key] = (sequence(event), row)
    return {key: row for key, (_, row) in by_key.items()}


def source_rows(project: Project) -> dict[int, dict]:
    return {i: {"id": i, "v": v} for i, v in project.execute("SELECT id, v FROM t")}


def wait_until(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def stop(process: subprocess.Popen[str]) -> tuple[str, str]:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        return process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()


@pytest.mark.parametrize("mode", ["fast", "immediate"])  # a clean shutdown, and a crash with recovery
def test_postgres_restart_mid_stream_resumes_without_loss_or_duplicates(own_pg, unique_name, tmp_path, mode):
    project = make_project(own_pg, unique_name("pgf"), tmp_path)
    process = project.follow()
    try:
        wait_until(lambda: project.execute(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s AND active_pid IS NOT NULL",
            (project.slot,))[0][0] == 1, 30, "capture to start streaming")  # fmt: skip
        for batch in range(10):
            project.execute("INSERT INTO t SELECT g, 'v' || g FROM generate_series(%s::int, %s::int) g",
                            (batch * 500 + 1, batch * 500 + 500))  # fmt: skip
            if batch == 4:
                # Mid-stream: the agent is still busy with the batches just committed.
                own_pg.stop(mode)
                time.sleep(2.0)  # several reconnect attempts fail while the server is down
                own_pg.start()
        wait_until(lambda: len(events(project.log_records())) >= 5000, 45, "all 5000 inserts in the log")
        assert process.poll() is None, "capture exited instead of reconnecting"
    finally:
        out, err = stop(process)
    assert process.returncode == 0, err[-3000:]
    records = project.log_records()
    assert_each_change_once(records)
    assert sorted(e["after"]["id"] for e in events(records)) == list(range(1, 5001))
    lines = [line for line in err.splitlines() if line.strip()]
    retry_lines = [line for line in lines if "retrying with backoff" in line]
    resumed = [line for line in lines if "replication resumed after" in line]
    assert retry_lines, err
    assert resumed, err
    # One line per state change (lost, refused, starting up, ...), not one per attempt.
    assert len(retry_lines) <= 6, "\n".join(retry_lines)
    assert project.password not in err + out


def drop_slot_under_capture(project: Project) -> None:
    """Terminate the walsender and drop its slot (the agent may grab it again in between: retry)."""
    deadline = time.monotonic() + 20
    while True:
        project.execute(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
            "WHERE slot_name = %s AND active_pid IS NOT NULL",
            (project.slot,),
        )
        try:
            project.execute("SELECT pg_drop_replication_slot(%s)", (project.slot,))
            return
        except psycopg.errors.ObjectInUse:
            assert time.monotonic() < deadline, "could not drop the slot"
            time.sleep(0.05)


def test_dropped_slot_stops_capture_and_resync_converges_with_deletes(pg_server, unique_name, tmp_path):
    project = make_project(pg_server, unique_name("pgf"), tmp_path)
    project.execute("INSERT INTO t SELECT g, 'initial' FROM generate_series(1, 300) g")
    process = project.follow()
    try:
        wait_until(lambda: len(events(project.log_records())) >= 300, 30, "the snapshot")
        project.execute("UPDATE t SET v = 'streamed' WHERE id <= 10")
        wait_until(lambda: len(events(project.log_records())) >= 310, 30, "streamed updates")
        drop_slot_under_capture(project)
        # Changes while the slot is gone: inserts, updates, deletes (of snapshot and streamed rows).
        project.execute("INSERT INTO t SELECT g, 'while gone' FROM generate_series(301, 350) g")
        project.execute("UPDATE t SET v = 'updated while gone' WHERE id BETWEEN 11 AND 40")
        project.execute("DELETE FROM t WHERE id BETWEEN 1 AND 5 OR id BETWEEN 100 AND 149")
        out, err = process.communicate(timeout=30)
    finally:
        stop(process)
    assert process.returncode != 0
    error = err.strip().splitlines()[-1]
    assert error.startswith(f'error: source {project.name}: replication slot "{project.slot}" is gone (dropped'), err
    assert f"run: headwater source resync {project.name}" in error and "changes since LSN " in error
    assert "Traceback" not in err and project.password not in err + out
    # Nothing was created behind the operator's back, and a new run refuses the same way.
    assert project.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", (project.slot,)) == [(0,)]
    again = project.cli("capture", "--until-caught-up")
    assert again.returncode != 0 and "is gone (dropped" in again.stderr, again.stderr
    assert project.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", (project.slot,)) == [(0,)]
    before_resync = project.log_records()
    last_before = max(sequence(e) for e in events(before_resync))

    resync = project.cli("source", "resync", project.name, "--yes")
    assert resync.returncode == 0, resync.stderr
    assert "was dropped" in resync.stdout and project.password not in resync.stdout + resync.stderr
    done = project.cli("capture", "--until-caught-up")
    assert done.returncode == 0, done.stderr
    # The fresh slot streams on after the re-snapshot.
    project.execute("UPDATE t SET v = 'after resync' WHERE id = 41")
    project.execute("DELETE FROM t WHERE id = 42")
    done = project.cli("capture", "--until-caught-up")
    assert done.returncode == 0, done.stderr

    records = project.log_records()
    assert_each_change_once(records)
    new_events = [e for e in events(records) if sequence(e) > last_before]
    assert len(events(records)) == len(events(before_resync)) + len(new_events), "old events moved or vanished"
    assert all(sequence(e) > last_before for e in new_events)
    latest = latest_per_key(records)
    source = source_rows(project)
    assert {k: v for k, v in latest.items() if v is not None} == source
    deleted = set(range(1, 6)) | set(range(100, 150)) | {42}
    assert {k for k, v in latest.items() if v is None} == deleted
    # Each deleted key ends with a delete followed by its tombstone (compaction can drop it).
    last_record = {}
    for record in records:
        last_record[orjson.loads(record.key)["id"]] = record
    for key in deleted:
        assert last_record[key].value is None, f"key {key} does not end with a tombstone"
    reconciled = [e for e in new_events if e["op"] == "d" and e["after"] is None and e["source"]["snapshot"] == "true"]
    assert {e["before"]["id"] for e in reconciled} == deleted - {42}
    # Nothing is left to resync and the slot streams again.
    assert not (project.dir / "home" / "capture" / project.name / "resync.json").exists()


def test_invalidated_slot_stops_capture_and_resync_recovers(own_pg, unique_name, tmp_path):
    project = make_project(own_pg, unique_name("pgf"), tmp_path)
    project.execute("INSERT INTO t SELECT g, 'initial' FROM generate_series(1, 100) g")
    first = project.cli("capture", "--until-caught-up")
    assert first.returncode == 0, first.stderr
    # While capture is stopped: changes, then more WAL than max_slot_wal_keep_size allows.
    project.execute("DELETE FROM t WHERE id <= 10")
    project.execute("UPDATE t SET v = 'changed' WHERE id BETWEEN 11 AND 20")
    for _ in range(4):
        project.execute("INSERT INTO t SELECT 1000, 'x'; DELETE FROM t WHERE id = 1000")
        project.execute("SELECT pg_switch_wal()")
    project.execute("CHECKPOINT")
    [(wal_status,)] = project.execute(
        "SELECT wal_status FROM pg_replication_slots WHERE slot_name = %s", (project.slot,)
    )
    assert wal_status == "lost", f"the slot was not invalidated (wal_status {wal_status})"

    failed = project.cli("capture", "--until-caught-up")
    assert failed.returncode != 0
    error = failed.stderr.strip().splitlines()[-1]
    assert f'replication slot "{project.slot}" is gone (invalidated' in error, failed.stderr
    assert f"run: headwater source resync {project.name}" in error and "Traceback" not in failed.stderr

    unconfirmed = project.cli("source", "resync", project.name)  # stdin is no terminal: nothing happens
    assert unconfirmed.returncode != 0 and "pass --yes" in unconfirmed.stderr, unconfirmed.stderr
    assert project.execute(WAL_STATUS, (project.slot,)) == [("lost",)]
    resync = project.cli("source", "resync", project.name, "--yes")
    assert resync.returncode == 0, resync.stderr
    assert "was invalidated" in resync.stdout
    done = project.cli("capture", "--until-caught-up")
    assert done.returncode == 0, done.stderr
    records = project.log_records()
    assert_each_change_once(records)
    latest = latest_per_key(records)
    assert {k: v for k, v in latest.items() if v is not None} == source_rows(project)
    assert {k for k, v in latest.items() if v is None} == set(range(1, 11))
    [(wal_status,)] = project.execute(
        "SELECT wal_status FROM pg_replication_slots WHERE slot_name = %s", (project.slot,)
    )
    assert wal_status != "lost"


def test_when_needed_mode_resyncs_by_itself_after_the_slot_is_dropped(pg_database, tmp_path, monkeypatch):

    name = pg_database.name
    pg_database.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pg_database.execute(f"CREATE PUBLICATION headwater_{name} FOR TABLE t")
    pg_database.execute("INSERT INTO t SELECT g, 'initial' FROM generate_series(1, 50) g")
    source = SourceConfig(dsn=pg_database.dsn, tables=("public.t",), snapshot="when_needed", heartbeat_interval_s=1)
    project = Project(tmp_path, name, pg_database.dsn, pg_database.server.password)

    def capture() -> None:
        with FileLog(tmp_path / "home" / "log") as log:
            agent = CaptureAgent(
                name, source, log, LogConfig(partitions=3), typemap_decoders(source.types),
                state_dir=tmp_path / "home" / "capture" / name,
            )  # fmt: skip
            agent.run(until_caught_up=True)

    capture()
    pg_database.execute("SELECT pg_drop_replication_slot(%s)", (project.slot,))
    pg_database.execute("DELETE FROM t WHERE id <= 5")
    pg_database.execute("UPDATE t SET v = 'while gone' WHERE id = 6")
    # The re-snapshot's 45 keys spill to the on-disk key set (as a table past KeySet.SPILL_AT would).
    spilled = []
    spill = KeySet._spill
    monkeypatch.setattr(KeySet, "SPILL_AT", 10)
    monkeypatch.setattr(KeySet, "_spill", lambda self: (spilled.append(self), spill(self)))
    capture()
    assert len(spilled) == 1, "the key set did not spill"
    state_dir = tmp_path / "home" / "capture" / name
    assert not (state_dir / KEY_SET_FILE).exists() and not (state_dir / "resync.json").exists()
    records = project.log_records()
    assert_each_change_once(records)
    latest = latest_per_key(records)
    assert {k: v for k, v in latest.items() if v is not None} == source_rows(project)
    assert {k for k, v in latest.items() if v is None} == {1, 2, 3, 4, 5}
