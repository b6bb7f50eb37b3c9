"""The capture agent against real Postgres and the real file log."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import orjson
import psycopg
import pytest
from harness.topics import read_topic, topic_values

from capture.postgres.agent import CaptureAgent
from capture.postgres.catalog import typemap_decoders
from core.log_config import LogConfig
from core.source_config import SourceConfig
from log.base import Record, TopicSpec, append_keyed
from log.file.backend import FileLog
from log.table_schemas import latest_schemas, schema_key
from log.topics import SCHEMAS_TOPIC


def create_source(pg_server, name: str) -> tuple[str, str]:
    dsn = pg_server.create_database(name)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE items (id int PRIMARY KEY, label text, price numeric(10,2), doc text);"
            "ALTER TABLE items ALTER COLUMN doc SET STORAGE EXTERNAL;"
            "INSERT INTO items SELECT g, 'item ' || g, g * 1.25, NULL FROM generate_series(1, 500) g;"
            f"CREATE PUBLICATION headwater_{name} FOR TABLE items;"
        )
    return dsn, name


def agent_for(dsn: str, name: str, log: FileLog, home: Path, snapshot: str = "initial") -> CaptureAgent:
    source = SourceConfig(dsn=dsn, tables=("public.items",), snapshot=snapshot, heartbeat_interval_s=1)
    return CaptureAgent(
        name,
        source,
        log,
        LogConfig(partitions=3),
        typemap_decoders(source.types),
        state_dir=home / "capture" / name,
    )


def sequences(evts: list[dict]) -> list[tuple[int, int]]:
    return [(e["source"]["commit_lsn"], e["source"]["txn_index"]) for e in evts]


def test_snapshot_then_stream_every_change_once(pg_server, unique_name, tmp_path):
    dsn, name = create_source(pg_server, unique_name("cap"))
    log = FileLog(tmp_path / "log")
    topic = f"{name}.public.items"
    agent_for(dsn, name, log, tmp_path).run(until_caught_up=True)
    snap = topic_values(log, topic)
    assert len(snap) == 500
    assert {e["op"] for e in snap} == {"r"}
    # One table: its first row "first", its last "last", the others "true" (as Debezium marks them).
    markers = [e["source"]["snapshot"] for e in sorted(snap, key=lambda e: e["source"]["txn_index"])]
    assert markers == ["first"] + ["true"] * 498 + ["last"]

    big = "".join(f"{i:08d}" for i in range(2000))  # 16 kB, stored out of line (EXTERNAL)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE items SET doc = %s WHERE id = 1", (big,))
        conn.execute("UPDATE items SET label = 'renamed' WHERE id = 1")  # doc unchanged: TOAST not sent
        conn.execute("UPDATE items SET id = 1001 WHERE id = 2")
        conn.execute("DELETE FROM items WHERE id = 3")
        with conn.transaction():
            conn.execute("INSERT INTO items VALUES (2000, 'kept', 1, NULL)")
        try:
            with conn.transaction():
                conn.execute("INSERT INTO items VALUES (3000, 'rolled back', 1, NULL)")
                raise RuntimeError
        except RuntimeError:
            pass
        conn.execute("TRUNCATE items")
    agent_for(dsn, name, log, tmp_path).run(until_caught_up=True)

    evts = topic_values(log, topic)
    seqs = sequences(evts)
    assert len(seqs) == len(set(seqs)), "an event was written twice"
    streamed = [e for e in evts if e["op"] != "r"]
    by_op = Counter(e["op"] for e in streamed)
    assert by_op == {"u": 2, "d": 2, "c": 2, "t": 1}
    renamed = next(e for e in streamed if e["op"] == "u" and e["after"]["label"] == "renamed")
    assert renamed["after"]["doc"] == big, "unchanged TOAST value must be filled, never a placeholder"
    assert not any(e["after"] and e["after"]["id"] == 3000 for e in streamed), "rolled back insert leaked"
    keys_with_tombstone = {r.key for r in read_topic(log, topic) if r.value is None}
    assert {orjson.loads(k)["id"] for k in keys_with_tombstone} == {2, 3}
    assert SCHEMAS_TOPIC in log.list_topics()
    log.close()


def test_restart_writes_nothing_twice(pg_server, unique_name, tmp_path):
    dsn, name = create_source(pg_server, unique_name("cap"))
    topic = f"{name}.public.items"
    log = FileLog(tmp_path / "log")
    agent_for(dsn, name, log, tmp_path).run(until_caught_up=True)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE items SET price = price + 1 WHERE id <= 100")
    for _ in range(3):
        agent_for(dsn, name, log, tmp_path).run(until_caught_up=True)
    seqs = sequences(topic_values(log, topic))
    assert len(seqs) == 600
    assert len(set(seqs)) == 600
    log.close()


WORKER = """
import sys
from pathlib import Path
from capture.postgres.agent import CaptureAgent
from capture.postgres.catalog import typemap_decoders
from core.log_config import LogConfig
from core.source_config import SourceConfig
from log.file.backend import FileLog
dsn, name, home = sys.argv[1], sys.argv[2], Path(sys.argv[3])
source = SourceConfig(dsn=dsn, tables=("public.items",), heartbeat_interval_s=1)
log = FileLog(home / "log")
agent = CaptureAgent(name, source, log, LogConfig(partitions=3), typemap_decoders(source.types),
                     state_dir=home / "capture" / name)
agent.install_signal_handlers()
agent.run(until_caught_up=False)
"""


def test_sigkill_during_workload_leaves_each_change_once(pg_server, unique_name, tmp_path):
    dsn, name = create_source(pg_server, unique_name("kill"))
    topic = f"{name}.public.items"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    rounds, per_round = 6, 40
    rng = random.Random(1234)  # seeded: a failure reproduces
    first = FileLog(tmp_path / "log")
    agent_for(dsn, name, first, tmp_path).run(until_caught_up=True)  # snapshot + slot before the kills
    first.close()
    with psycopg.connect(dsn, autocommit=True) as conn:
        for round_no in range(rounds):
            worker = subprocess.Popen([sys.executable, "-c", WORKER, dsn, name, str(tmp_path)], env=env)
            for i in range(per_round):
                key = 10_000 + round_no * per_round + i
                conn.execute("INSERT INTO items VALUES (%s, 'w', 1, NULL)", (key,))
                conn.execute("UPDATE items SET price = price + 1 WHERE id = %s", ((key % 500) + 1,))
            time.sleep(rng.uniform(1.0, 3.0))  # worker start-up is ~1 s: kill before, during or after catching up
            worker.send_signal(signal.SIGKILL)
            worker.wait(timeout=30)
    log = FileLog(tmp_path / "log")
    agent_for(dsn, name, log, tmp_path).run(until_caught_up=True)
    evts = topic_values(log, topic)
    seqs = sequences(evts)
    assert len(seqs) == len(set(seqs)), "duplicates after SIGKILL"
    streamed = [e for e in evts if e["op"] != "r"]
    assert len(streamed) == rounds * per_round * 2, "a committed change is missing"
    log.close()


@pytest.mark.parametrize("mode", ["never"])
def test_snapshot_never_streams_only(pg_server, unique_name, tmp_path, mode):
    dsn, name = create_source(pg_server, unique_name("nev"))
    log = FileLog(tmp_path / "log")
    agent_for(dsn, name, log, tmp_path, snapshot=mode).run(until_caught_up=True)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO items VALUES (9999, 'new', 1, NULL)")
    agent_for(dsn, name, log, tmp_path, snapshot=mode).run(until_caught_up=True)
    evts = topic_values(log, f"{name}.public.items")
    assert [e["op"] for e in evts] == ["c"]
    log.close()


def test_a_full_identity_schema_from_before_recorded_keys_is_recorded_again_at_start(pg_server, unique_name, tmp_path):
    """Logs written before schema records named their key: capture records it at its next start (issue 15)."""

    dsn, name = create_source(pg_server, unique_name("cap"))
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE items REPLICA IDENTITY FULL")
    log = FileLog(tmp_path / "log")
    topic = f"{name}.public.items"
    agent_for(dsn, name, log, tmp_path).run(until_caught_up=True)
    recorded = latest_schemas(log, prefix=topic)[topic]
    assert schema_key(recorded) == ("id",)
    # What the old code wrote: every column flagged (the replica identity), no "key".
    legacy = {k: v for k, v in recorded.items() if k not in ("key", "key_source")}
    legacy["columns"] = [{**column, "key": True} for column in legacy["columns"]]
    legacy["version"] = recorded["version"] + 1
    log.create_topic(TopicSpec(SCHEMAS_TOPIC, partitions=1), exist_ok=True)
    append_keyed(log, SCHEMAS_TOPIC, [Record(topic.encode(), orjson.dumps(legacy))])
    assert schema_key(latest_schemas(log, prefix=topic)[topic]) is None

    agent_for(dsn, name, log, tmp_path).run(until_caught_up=True)  # no change to the table meanwhile
    latest = latest_schemas(log, prefix=topic)[topic]
    assert schema_key(latest) == ("id",)
    assert latest["version"] == legacy["version"] + 1
    assert [c["name"] for c in latest["columns"] if c["key"]] == ["id"]
