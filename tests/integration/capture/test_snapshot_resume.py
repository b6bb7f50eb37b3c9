"""The initial snapshot SIGKILLed mid-way resumes without restarting from zero, without a duplicate or a gap."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import psycopg
import pytest
from harness.topics import topic_values

from capture.postgres.agent import AgentSettings, CaptureAgent
from capture.postgres.catalog import typemap_decoders
from capture.postgres.snapshot import copy_text
from capture.postgres.snapshot import plan as snapshot_plan
from core.log_config import LogConfig
from core.source_config import SourceConfig
from log.file.backend import FileLog
from native import speedups

ROWS = 15_000

# The agent in a subprocess with small chunks and pieces. Once three chunks are recorded done,
# it lets appends of the table's topic through until one has returned and SIGKILLs itself at
# the next: the chunk in progress is then partly in the log (native pieces, or the Python
# path's records). "Returned", not "called": a piece's partitions are appended by parallel
# threads, so a kill at the second call could land before the first call wrote anything.
WORKER = """
import json, os, signal, sys
from pathlib import Path
from capture.postgres.snapshot import copy_text, plan as snapshot_plan
from log.file.backend import FileLog
snapshot_plan.CHUNK_PAGES = 16
copy_text.PIECE_BYTES = 8192
state = Path(sys.argv[2]) / "state" / "snapshot.json"
real_append = FileLog.append
written = []
def append(self, topic, partition, records):
    if topic == "snap.public.t" and state.exists() and len(json.loads(state.read_text())["done_chunks"]) >= 3:
        if written:
            os.kill(os.getpid(), signal.SIGKILL)
        result = real_append(self, topic, partition, records)
        written.append(partition)
        return result
    return real_append(self, topic, partition, records)
FileLog.append = append
sys.path.insert(0, sys.argv[3])
sys.path.insert(0, str(Path(sys.argv[3]).parents[1]))  # tests/: the harness package
from test_snapshot_resume import agent_for
agent_for(sys.argv[1], Path(sys.argv[2])).run(until_caught_up=True)
"""


def agent_for(dsn: str, home: Path, log: FileLog | None = None, settings: AgentSettings | None = None) -> CaptureAgent:
    source = SourceConfig(dsn=dsn, tables=("public.t",), snapshot="initial_only", publication="pub_snap")
    return CaptureAgent(
        "snap",
        source,
        log or FileLog(home / "log"),
        LogConfig(partitions=3),
        typemap_decoders(source.types),
        state_dir=home / "state",
        settings=settings,
    )


def read_values(log: FileLog) -> list[dict]:
    return topic_values(log, "snap.public.t")


def captured_values(dsn: str, home: Path) -> list[dict]:
    """Run the agent until caught up; the table topic's values then."""
    log = FileLog(home / "log")
    try:
        agent_for(dsn, home, log).run(until_caught_up=True)
        return read_values(log)
    finally:
        log.close()


def assert_every_row_once(values: list[dict]) -> None:
    ids = Counter(v["after"]["id"] for v in values)
    assert sorted(ids) == list(range(1, ROWS + 1)), "a row is missing"
    assert max(ids.values()) == 1, f"rows written twice: {[k for k, c in ids.items() if c > 1][:5]}"


def snapshot_source(pg_server, name: str, label: str = "'row ' || g") -> str:
    """A database with table ``t`` of ``ROWS`` rows published as ``pub_snap``, analyzed (relpages: the chunk plan)."""
    dsn = pg_server.create_database(name)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE t (id bigint PRIMARY KEY, label text, at timestamptz);"
            f"INSERT INTO t SELECT g, {label}, now() FROM generate_series(1, {ROWS}) g;"
            "CREATE PUBLICATION pub_snap FOR TABLE t"
        )
        conn.execute("VACUUM ANALYZE t")
    return dsn


def test_snapshot_sigkilled_mid_chunk_resumes_with_every_row_once(pg_server, unique_name, tmp_path, monkeypatch):
    dsn = snapshot_source(pg_server, unique_name("snapkill"), label="'row ' || g || E'\\twith a tab'")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    worker = subprocess.run(
        [sys.executable, "-c", WORKER, dsn, str(tmp_path), str(Path(__file__).parent)], env=env, timeout=120
    )
    assert worker.returncode == -signal.SIGKILL, "the snapshot ended before the kill: nothing was tested"
    state = tmp_path / "state" / "snapshot.json"
    done = json.loads(state.read_text())["done_chunks"]
    assert len(done) == 3
    assert json.loads(state.read_text())["completed"] is False
    # The log holds part of a chunk that is not done: the resume must not write those rows twice.
    before = read_values(FileLog(tmp_path / "log"))
    chunks = {(v["source"]["txn_index"] >> 24) & 0xFFFF for v in before}
    assert chunks - {int(c.rsplit("#", 1)[1]) for c in done}, "no partly written chunk: nothing was tested"

    # Resume in this process, with the same small chunks (chunk ids must mean the same pages).
    monkeypatch.setattr(snapshot_plan, "CHUNK_PAGES", 16)
    monkeypatch.setattr(copy_text, "PIECE_BYTES", 8192)
    log = FileLog(tmp_path / "log")
    try:
        resumed = agent_for(dsn, tmp_path, log)
        resumed.run(until_caught_up=True)
        after = json.loads(state.read_text())
        assert after["completed"] is True
        assert set(done) < set(after["done_chunks"])
        # Chunks done before the kill were not read again.
        assert resumed.stats.events < ROWS
        values = read_values(log)
    finally:
        log.close()
    assert_every_row_once(values)
    assert {v["op"] for v in values} == {"r"}
    # The table's first row was marked before the kill, its last one after the resume: each once.
    markers = Counter(v["source"]["snapshot"] for v in values)
    assert (markers["first"], markers["last"], markers["true"]) == (1, 1, len(values) - 2), markers
    assert all(v["after"]["label"].endswith("\twith a tab") for v in values)
    sequences = [(v["source"]["commit_lsn"], v["source"]["txn_index"]) for v in values]
    assert len(set(sequences)) == len(sequences)


def test_snapshot_append_failure_stops_the_writer_and_resumes_with_every_row_once(
    pg_server, unique_name, tmp_path, monkeypatch
):
    """A failed append mid-snapshot: nothing after it is written (no gap behind a later batch), the
    chunk is not done, and the next run writes every row once."""
    dsn = snapshot_source(pg_server, unique_name("snapfail"))
    monkeypatch.setattr(snapshot_plan, "CHUNK_PAGES", 16)
    monkeypatch.setattr(copy_text, "PIECE_BYTES", 4096)
    real_append = FileLog.append
    calls = Counter()

    def append(self, topic, partition, records):
        if topic == "snap.public.t" and partition == 1:
            calls[partition] += 1
            if calls[partition] == 6:
                raise RuntimeError("injected append failure")
        return real_append(self, topic, partition, records)

    monkeypatch.setattr(FileLog, "append", append)
    log = FileLog(tmp_path / "log")
    try:
        with pytest.raises(RuntimeError, match="injected append failure"):
            agent_for(dsn, tmp_path, log).run(until_caught_up=True)
        stored = read_values(log)
    finally:
        log.close()
    assert calls[1] == 6, "the writer went on appending to the partition after its failed append"
    assert 0 < len(stored) < ROWS
    monkeypatch.setattr(FileLog, "append", real_append)
    values = captured_values(dsn, tmp_path)
    assert_every_row_once(values)


def test_snapshot_goes_on_with_one_reader_when_a_second_connection_is_refused(
    pg_server, unique_name, tmp_path, monkeypatch
):
    """The next chunk is read ahead on a second connection; when the server refuses it (e.g. at
    max_connections), the agent's own reader takes every chunk and nothing is lost."""
    dsn = snapshot_source(pg_server, unique_name("snaponeconn"))
    monkeypatch.setattr(snapshot_plan, "CHUNK_PAGES", 16)
    real_connect = psycopg.connect
    refused = []

    def connect(*args, **kwargs):
        if threading.current_thread().name == "snapshot-next-chunk":
            refused.append(1)
            raise psycopg.OperationalError("FATAL: sorry, too many clients already")
        return real_connect(*args, **kwargs)

    monkeypatch.setattr(psycopg, "connect", connect)
    values = captured_values(dsn, tmp_path)
    assert refused == ([] if speedups is None else [1])  # the Python path reads on one connection
    assert_every_row_once(values)
    assert json.loads((tmp_path / "state" / "snapshot.json").read_text())["completed"] is True
