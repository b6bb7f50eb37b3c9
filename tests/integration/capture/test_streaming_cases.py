"""Capture end to end, one case per item of the capture issue's "must show" list.

Each test runs the real agent (or the real CLI) against the session's Postgres and a
FileLog, and checks what landed in the log.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import orjson
import psycopg
import pytest
from harness.topics import partition_records, read_topic, topic_values

from capture.postgres.agent import AgentSettings, CaptureAgent
from capture.postgres.catalog import typemap_decoders
from core.log_config import LogConfig
from core.source_config import SourceConfig, TypesConfig
from log.file.backend import FileLog
from log.topics import ERROR_HEADER, SCHEMAS_TOPIC

ROOT = Path(__file__).resolve().parents[3]


def make_source(pg_database, tables: str, ddl: str) -> tuple[str, str]:
    """Create the tables and the publication; returns (dsn, source name)."""
    name = pg_database.name
    pg_database.execute(ddl)
    pg_database.execute(f"CREATE PUBLICATION headwater_{name} FOR TABLE {tables}")
    return pg_database.dsn, name


def agent_for(
    dsn: str,
    name: str,
    log: FileLog,
    home: Path,
    *,
    tables: tuple[str, ...] = ("public.t",),
    snapshot: str = "initial",
    types: TypesConfig | None = None,
    heartbeat_s: float = 1.0,
    partitions: int = 3,
) -> CaptureAgent:
    source = SourceConfig(
        dsn=dsn, tables=tables, snapshot=snapshot, heartbeat_interval_s=heartbeat_s, types=types or TypesConfig()
    )
    return CaptureAgent(
        name,
        source,
        log,
        LogConfig(partitions=partitions),
        typemap_decoders(source.types),
        state_dir=home / "capture" / name,
        settings=AgentSettings(reconnect_backoff_s=(0.1, 0.2, 0.5)),
    )


def events(log: FileLog, topic: str) -> list[dict]:
    evts = topic_values(log, topic)
    return sorted(evts, key=lambda e: (e["source"]["commit_lsn"], e["source"]["txn_index"]))


def capture_once(dsn: str, name: str, home: Path, **kwargs) -> FileLog:
    log = FileLog(home / "log")
    agent_for(dsn, name, log, home, **kwargs).run(until_caught_up=True)
    return log


# -- types ---------------------------------------------------------------------------------

TYPES_DDL = """
CREATE TABLE t (
    id int PRIMARY KEY, price numeric(10,2), ts timestamp, ts3 timestamp(3), tstz timestamptz, d date,
    iv interval, b bytea, u uuid, j jsonb, arr int[], flag bool, f8 float8, money_ money, bits bit(4)
);
INSERT INTO t VALUES (1, 1.50, '2024-02-29 12:45:56.123456', '2024-02-29 12:45:56.123', '2024-02-29 12:45:56.123456+00',
    '2024-02-29', '1 day 00:00:01', '\\x0102', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{"a": 1}', '{1,NULL,3}', true,
    'NaN', '12.34', '1010');
"""


@pytest.mark.parametrize(
    ("types", "expected"),
    [
        (
            TypesConfig(),
            {"price": "1.50", "ts": 1709210756123456, "ts3": 1709210756123, "b": "AQI=", "money_": "12.34"},
        ),
        (
            TypesConfig(decimal_handling_mode="precise", time_precision_mode="connect", binary_handling_mode="hex"),
            {"price": "AJY=", "ts": 1709210756123, "ts3": 1709210756123, "b": "0102", "money_": "BNI="},
        ),
    ],
    ids=["string-adaptive-base64", "precise-connect-hex"],
)
def test_every_type_reaches_the_log_as_the_mode_says(pg_database, tmp_path, types, expected):
    dsn, name = make_source(pg_database, "t", TYPES_DDL)
    log = capture_once(dsn, name, tmp_path, types=types)  # row 1 by the snapshot (COPY)
    pg_database.execute(
        "INSERT INTO t SELECT 2, price, ts, ts3, tstz, d, iv, b, u, j, arr, flag, f8, money_, bits FROM t"
    )
    agent_for(dsn, name, log, tmp_path, types=types).run(until_caught_up=True)  # row 2 by the stream
    snapshot, streamed = events(log, f"{name}.public.t")
    assert (snapshot["op"], streamed["op"]) == ("r", "c")
    common = {
        "tstz": "2024-02-29T12:45:56.123456Z",
        "d": 19782,
        "iv": 86_401_000_000,
        "u": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
        "j": '{"a": 1}',
        "arr": [1, None, 3],
        "flag": True,
        "f8": "NaN",
        "bits": "Cg==",
    }
    for event in (snapshot, streamed):
        after = event["after"]
        assert {k: after[k] for k in expected} == expected
        assert {k: after[k] for k in common} == common
    log.close()


def test_unconvertible_value_goes_to_quarantine_and_capture_goes_on(pg_database, tmp_path):
    dsn, name = make_source(pg_database, "t", "CREATE TABLE t (id int PRIMARY KEY, amount numeric)")
    precise = TypesConfig(decimal_handling_mode="precise")
    log = capture_once(dsn, name, tmp_path, types=precise, snapshot="never")
    pg_database.execute("INSERT INTO t VALUES (1, 'NaN'), (2, 2.5)")
    pg_database.execute("INSERT INTO t VALUES (3, 3)")
    agent_for(dsn, name, log, tmp_path, types=precise, snapshot="never").run(until_caught_up=True)
    good = events(log, f"{name}.public.t")
    assert [e["after"]["id"] for e in good] == [2, 3]
    [bad] = read_topic(log, f"{name}.public.t.quarantine")
    assert orjson.loads(bad.key) == {"id": "1"}
    reason = dict(bad.headers)[ERROR_HEADER].decode()
    assert "NaN" in reason and "decimal_handling_mode" in reason
    body = orjson.loads(bad.value)
    assert body["after_raw"] == {"id": "1", "amount": "NaN"}
    assert body["source"]["txn_index"] == 0 and good[0]["source"]["txn_index"] == 1
    assert not log.describe_topic(f"{name}.public.t.quarantine").compacted
    log.close()
    # A restart re-reads nothing into quarantine twice.
    log = capture_once(dsn, name, tmp_path, types=precise, snapshot="never")
    assert len(read_topic(log, f"{name}.public.t.quarantine")) == 1
    log.close()


# -- TOAST, replica identity, truncate ------------------------------------------------------------


def test_replica_identity_full_vs_default_toast_and_truncate(pg_database, tmp_path):
    ddl = """
    CREATE TABLE d (id int PRIMARY KEY, label text, doc text);
    CREATE TABLE f (id int PRIMARY KEY, label text, doc text);
    ALTER TABLE d ALTER COLUMN doc SET STORAGE EXTERNAL;
    ALTER TABLE f ALTER COLUMN doc SET STORAGE EXTERNAL;
    ALTER TABLE f REPLICA IDENTITY FULL;
    """
    dsn, name = make_source(pg_database, "d, f", ddl)
    tables = ("public.d", "public.f")
    big = "".join(f"{i:08d}" for i in range(4000))  # 32 kB, stored out of line
    log = capture_once(dsn, name, tmp_path, tables=tables, snapshot="never")
    with psycopg.connect(dsn, autocommit=True) as conn:
        for table in ("d", "f"):
            conn.execute(f"INSERT INTO {table} VALUES (1, 'a', %s), (2, 'b', 'small')", (big,))
            conn.execute(f"UPDATE {table} SET label = 'a2' WHERE id = 1")  # doc unchanged: not sent
            conn.execute(f"DELETE FROM {table} WHERE id = 2")
    agent_for(dsn, name, log, tmp_path, tables=tables, snapshot="never").run(until_caught_up=True)
    # The next update of the same key comes after a restart: the image cache is empty,
    # so the unchanged TOAST value is found in the log.
    pg_database.execute("UPDATE d SET label = 'a3' WHERE id = 1")
    pg_database.execute("TRUNCATE d, f")
    agent_for(dsn, name, log, tmp_path, tables=tables, snapshot="never").run(until_caught_up=True)

    d = events(log, f"{name}.public.d")
    f = events(log, f"{name}.public.f")
    assert [e["op"] for e in d] == ["c", "c", "u", "d", "u", "t"]
    assert [e["op"] for e in f] == ["c", "c", "u", "d", "t"]
    # DEFAULT: no before on update; on delete every column, those not sent (all but the key) null.
    # FULL: whole old row both times.
    assert d[2]["before"] is None and d[3]["before"] == {"id": 2, "label": None, "doc": None}
    assert f[2]["before"] == {"id": 1, "label": "a", "doc": big}
    assert f[3]["before"] == {"id": 2, "label": "b", "doc": "small"}
    for e in (*d[2:3], d[4], f[2]):
        assert e["after"]["doc"] == big, "unchanged TOAST must be filled, never a placeholder"
    assert d[4]["after"]["label"] == "a3"
    # The key is the primary key under both identities; the delete is followed by a tombstone.
    for topic in (f"{name}.public.d", f"{name}.public.f"):
        stored = read_topic(log, topic)
        assert {r.key for r in stored if r.key is not None} == {b'{"id":1}', b'{"id":2}'}
        assert [r.key for r in stored if r.value is None] == [b'{"id":2}']
        truncate = next(orjson.loads(r.value) for r in stored if r.value and orjson.loads(r.value)["op"] == "t")
        assert truncate["before"] is None and truncate["after"] is None
    assert [r.key for r in read_topic(log, f"{name}.public.d") if r.value and b'"op":"t"' in r.value] == [None]
    # source.lsn is the change's own WAL position; sequence is [last commit, lsn] as Debezium.
    for e in d[2:]:
        source = e["source"]
        assert source["lsn"] is not None and source["lsn"] <= source["commit_lsn"]
        last, lsn = orjson.loads(source["sequence"])
        assert int(lsn) == source["lsn"] and (last is None or int(last) < source["commit_lsn"])
    log.close()


# -- schema changes -------------------------------------------------------------------------------


def test_add_rename_drop_column_mid_stream(pg_database, tmp_path):
    dsn, name = make_source(pg_database, "t", "CREATE TABLE t (id int PRIMARY KEY, a text)")
    log = capture_once(dsn, name, tmp_path, snapshot="never")
    for statement in (
        "INSERT INTO t VALUES (1, 'x')",
        "ALTER TABLE t ADD COLUMN b int DEFAULT 7",
        "INSERT INTO t VALUES (2, 'y', 8)",
        "ALTER TABLE t RENAME COLUMN a TO a2",
        "INSERT INTO t VALUES (3, 'z', 9)",
        "ALTER TABLE t DROP COLUMN b",
        "INSERT INTO t VALUES (4, 'w')",
    ):
        pg_database.execute(statement)
    agent_for(dsn, name, log, tmp_path, snapshot="never").run(until_caught_up=True)
    stored = events(log, f"{name}.public.t")
    afters = [e["after"] for e in stored if e["op"] != "r"]
    assert afters == [
        {"id": 1, "a": "x"},
        {"id": 2, "a": "y", "b": 8},
        {"id": 3, "a2": "z", "b": 9},
        {"id": 4, "a2": "w"},
    ]
    # The default gave row 1 a value the stream never carried, so capture reads the table again
    # after the DDL (op r, issue 27); it reads the table as it is by then.
    now = [{"id": 1, "a2": "x"}, {"id": 2, "a2": "y"}, {"id": 3, "a2": "z"}, {"id": 4, "a2": "w"}]
    reread = [e["after"] for e in stored if e["op"] == "r"]
    assert reread and all(row in now for row in reread) and {row["id"] for row in reread} == {1, 2, 3, 4}
    versions = [orjson.loads(r.value) for r in read_topic(log, SCHEMAS_TOPIC) if r.key == f"{name}.public.t".encode()]
    assert [v["version"] for v in versions] == list(range(1, len(versions) + 1))
    # A version may repeat its predecessor's columns (a Relation recorded with its position, issue 27);
    # the shapes, in order:
    shapes = [[c["name"] for c in v["columns"]] for v in versions]
    assert [shape for at, shape in enumerate(shapes) if at == 0 or shape != shapes[at - 1]] == [
        ["id", "a"],
        ["id", "a", "b"],
        ["id", "a2", "b"],
        ["id", "a2"],
    ]
    log.close()


# -- streamed (in-progress) transactions ------------------------------------------------------


def stream_big_transactions(pg_database) -> None:
    # The walsender decodes with its database's settings: spill to the stream at 64 kB.
    pg_database.execute(f"ALTER DATABASE \"{pg_database.name}\" SET logical_decoding_work_mem = '64kB'")


def slot_stream_txns(pg_database, slot: str) -> int:
    rows = pg_database.execute("SELECT stream_txns FROM pg_stat_replication_slots WHERE slot_name = %s", (slot,))
    return int(rows[0][0]) if rows else 0


def test_streamed_200k_row_transaction_arrives_once_in_order(pg_database, tmp_path):
    dsn, name = make_source(pg_database, "t", "CREATE TABLE t (id int PRIMARY KEY)")
    stream_big_transactions(pg_database)
    log = capture_once(dsn, name, tmp_path, snapshot="never")
    pg_database.execute("INSERT INTO t SELECT generate_series(1, 200000)")
    agent_for(dsn, name, log, tmp_path, snapshot="never").run(until_caught_up=True)
    assert slot_stream_txns(pg_database, f"headwater_{name}") > 0, "the transaction was not streamed"
    topic = f"{name}.public.t"
    commit_lsns, indexes = set(), []
    for partition in range(log.describe_topic(topic).partitions):
        stored = [orjson.loads(r.value)["source"] for r in partition_records(log, topic, partition)]
        part_indexes = [s["txn_index"] for s in stored]
        assert part_indexes == sorted(part_indexes), "out of order within a partition"
        commit_lsns.update(s["commit_lsn"] for s in stored)
        indexes.extend(part_indexes)
    assert len(commit_lsns) == 1
    assert sorted(indexes) == list(range(200_000)), "an event is missing or doubled"
    log.close()


def test_rolled_back_streamed_transaction_emits_nothing(pg_database, tmp_path):
    dsn, name = make_source(pg_database, "t", "CREATE TABLE t (id int PRIMARY KEY, pad text)")
    stream_big_transactions(pg_database)
    log = capture_once(dsn, name, tmp_path, snapshot="never")
    with psycopg.connect(dsn) as conn:
        conn.execute("INSERT INTO t SELECT g, 'rolled back' FROM generate_series(1, 20000) g")
        conn.execute("SAVEPOINT s")
        conn.execute("INSERT INTO t VALUES (-1, 'savepoint')")
        conn.rollback()
    with psycopg.connect(dsn) as conn:  # a subtransaction rolled back inside a committed streamed one
        conn.execute("INSERT INTO t SELECT g, 'kept' FROM generate_series(100001, 110000) g")
        conn.execute("SAVEPOINT s")
        conn.execute("INSERT INTO t SELECT g, 'dropped' FROM generate_series(200001, 210000) g")
        conn.execute("ROLLBACK TO SAVEPOINT s")
        conn.execute("INSERT INTO t VALUES (0, 'after savepoint')")
        conn.commit()
    agent_for(dsn, name, log, tmp_path, snapshot="never").run(until_caught_up=True)
    assert slot_stream_txns(pg_database, f"headwater_{name}") >= 2
    labels = Counter(e["after"]["pad"] for e in events(log, f"{name}.public.t"))
    assert labels == {"kept": 10_000, "after savepoint": 1}
    log.close()


# -- heartbeats, signals, connection loss -----------------------------------------------------------


def follow(agent: CaptureAgent) -> threading.Thread:
    thread = threading.Thread(target=agent.run, kwargs={"until_caught_up": False}, daemon=True)
    thread.start()
    return thread


def slot_lag(pg_database, slot: str) -> tuple[int, str]:
    [(lag, confirmed)] = pg_database.execute(
        "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint, confirmed_flush_lsn::text "
        "FROM pg_replication_slots WHERE slot_name = %s",
        (slot,),
    )
    return int(lag), confirmed


def test_heartbeats_keep_retained_wal_bounded_while_only_unpublished_tables_change(pg_database, tmp_path):
    dsn, name = make_source(pg_database, "t", "CREATE TABLE t (id int PRIMARY KEY); CREATE TABLE other (x text)")
    slot = f"headwater_{name}"
    log = capture_once(dsn, name, tmp_path, snapshot="never")
    agent = agent_for(dsn, name, log, tmp_path, snapshot="never", heartbeat_s=0.2)
    thread = follow(agent)
    try:
        _, confirmed_at_start = slot_lag(pg_database, slot)
        written = 0
        with psycopg.connect(dsn, autocommit=True) as conn:
            for _ in range(30):
                conn.execute("INSERT INTO other SELECT repeat('x', 200) FROM generate_series(1, 2000)")
                written += 2000
                time.sleep(0.05)
        bound = 2 << 20  # about 0.3 s of this workload; unbounded would be ~15 MB
        deadline = time.monotonic() + 10
        lag, confirmed = slot_lag(pg_database, slot)
        while lag > bound and time.monotonic() < deadline:
            time.sleep(0.2)
            lag, confirmed = slot_lag(pg_database, slot)
        assert lag <= bound, f"slot retains {lag} bytes of WAL"
        assert confirmed != confirmed_at_start
    finally:
        agent.stop()
        thread.join(30)
    assert not thread.is_alive()
    assert agent.stats.events == 0
    log.close()


def test_terminated_walsender_reconnects_without_loss_or_duplicates(pg_database, tmp_path):
    dsn, name = make_source(pg_database, "t", "CREATE TABLE t (id int PRIMARY KEY)")
    slot = f"headwater_{name}"
    log = capture_once(dsn, name, tmp_path, snapshot="never")
    agent = agent_for(dsn, name, log, tmp_path, snapshot="never")
    thread = follow(agent)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for batch in range(20):
                conn.execute(
                    "INSERT INTO t SELECT generate_series(%s::int, %s::int)", (batch * 500 + 1, batch * 500 + 500)
                )
                if batch % 5 == 2:
                    conn.execute(
                        "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
                        "WHERE slot_name = %s AND active_pid IS NOT NULL",
                        (slot,),
                    )
                time.sleep(0.1)
        deadline = time.monotonic() + 30
        while agent.stats.records_written + agent.stats.records_skipped < 10_000 and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        agent.stop()
        thread.join(30)
    assert agent.stats.reconnects >= 1
    log.close()
    log = capture_once(dsn, name, tmp_path, snapshot="never")
    ids = [e["after"]["id"] for e in events(log, f"{name}.public.t")]
    assert sorted(ids) == list(range(1, 10_001)), "a change is missing or doubled"
    log.close()


def wait_for_active_slot(pg_database, slot: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    query = "SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s AND active_pid IS NOT NULL"
    while pg_database.execute(query, (slot,))[0][0] == 0:
        assert time.monotonic() < deadline, f"slot {slot} never became active"
        time.sleep(0.1)


def test_sigterm_and_sigint_finish_the_batch_acknowledge_and_exit_zero(pg_database, tmp_path):
    dsn, name = make_source(pg_database, "t", "CREATE TABLE t (id int PRIMARY KEY)")
    project = tmp_path / "project"
    project.mkdir()
    config = {
        "project": "sig",
        "home": str(project / "home"),
        "sources": {name: {"dsn": dsn, "tables": ["public.t"], "snapshot": "never", "heartbeat_interval_s": 1}},
    }
    (project / "headwater.yaml").write_text(orjson.dumps(config).decode())  # JSON is YAML
    capture_once(dsn, name, project / "home", snapshot="never").close()  # the slot exists before any change
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "headwater", "--config", str(project / "headwater.yaml"), "capture", "--follow"]
    total = 0
    for sig in (signal.SIGTERM, signal.SIGINT):
        process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            wait_for_active_slot(pg_database, f"headwater_{name}")  # handlers are installed before streaming
            pg_database.execute("INSERT INTO t SELECT generate_series(%s::int, %s::int)", (total + 1, total + 3000))
            total += 3000
            time.sleep(1.0)
            process.send_signal(sig)
            out, err = process.communicate(timeout=30)
        finally:
            if process.poll() is None:
                process.kill()
        assert process.returncode == 0, err[-2000:]
        assert "acknowledged" in out
        # Everything appended was acknowledged: nothing is left for the slot to re-send.
        [(pending,)] = pg_database.execute(
            "SELECT count(*) FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL, "
            "'proto_version', '1', 'publication_names', %s)",
            (f"headwater_{name}", f"headwater_{name}"),
        )
        assert pending == 0, "the last batch was not acknowledged"
    log = FileLog(project / "home" / "log")
    assert sorted(e["after"]["id"] for e in events(log, f"{name}.public.t")) == list(range(1, total + 1))
    log.close()
