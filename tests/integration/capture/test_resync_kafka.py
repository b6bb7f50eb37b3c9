"""``source resync`` on the Kafka backend: the reconcile reads the broker's topic and writes deletes there.

The real CLI against real Postgres and the tansu broker: a source captured into Kafka
loses its slot while capture is not running, rows are deleted, inserted and updated
meanwhile, then ``headwater source resync`` and ``headwater capture``. Checked through
the Kafka log: the records from before are untouched, every row the source still has
got one ``op: r`` read, exactly the keys deleted meanwhile got a delete (with their last
image) directly followed by a tombstone, nothing else was written, no change twice, and
the fresh slot streams on.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import psycopg
import yaml

from headwater.config import load_config
from log.factory import open_log

ROOT = Path(__file__).resolve().parents[3]
PASSWORD_VAR = "HW_RESYNC_KAFKA_PW"


def read_topic(config: Path, topic: str) -> dict[int, list[Any]]:
    """Every record of ``topic`` per partition, read back from the broker through the Kafka log."""
    log = open_log(load_config(config, strict_env=False))
    try:
        out: dict[int, list[Any]] = {}
        for partition in range(log.describe_topic(topic).partitions):
            records, offset = [], log.beginning_offset(topic, partition)
            while batch := log.read(topic, partition, offset):
                records.extend(batch)
                offset = batch[-1].offset + 1
            out[partition] = records
        return out
    finally:
        log.close()


def sequence(event: dict[str, Any]) -> tuple[int, int]:
    return event["source"]["commit_lsn"], event["source"]["txn_index"]


def test_resync_on_kafka_deletes_exactly_the_vanished_keys(pg_server, kafka_broker, unique_name, tmp_path):
    name = unique_name("rsk")
    pg_server.create_database(name)
    dsn = pg_server.dsn(name)
    env = {**os.environ, "PYTHONPATH": str(ROOT), PASSWORD_VAR: pg_server.password}
    config = tmp_path / "headwater.yaml"
    kafka = {"bootstrap_servers": kafka_broker.bootstrap_servers}
    body = {"project": "resync_kafka", "home": str(tmp_path / "home"), "sources": {}}
    config.write_text(yaml.safe_dump({**body, "log": {"backend": "kafka", "partitions": 3, "kafka": kafka}}))

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "headwater", "--config", str(config), *args]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, f"{args}: {done.stderr[-3000:]}"
        assert pg_server.password not in done.stdout + done.stderr
        return done

    def execute(statement: str) -> list[tuple[Any, ...]]:
        with psycopg.connect(dsn, autocommit=True) as conn:
            cur = conn.execute(statement)
            return cur.fetchall() if cur.description is not None else []

    execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    execute("INSERT INTO t SELECT g, 'initial' FROM generate_series(1, 60) g")
    masked = dsn.replace(pg_server.password, "${" + PASSWORD_VAR + "}")
    cli("source", "add", name, "--dsn", masked, "--tables", "public.t", "--snapshot", "initial", "--yes")
    cli("capture", "--until-caught-up")
    # Streamed changes: keys 51-55 end deleted in the log already (they must not get a second delete).
    execute("UPDATE t SET v = 'streamed' WHERE id BETWEEN 1 AND 10")
    execute("DELETE FROM t WHERE id BETWEEN 51 AND 55")
    cli("capture", "--until-caught-up")

    # The slot goes while capture is not running; the source changes meanwhile.
    execute(f"SELECT pg_drop_replication_slot('headwater_{name}')")
    execute("DELETE FROM t WHERE id BETWEEN 1 AND 5 OR id BETWEEN 20 AND 29")  # streamed and snapshot rows
    execute("INSERT INTO t SELECT g, 'while gone' FROM generate_series(61, 70) g")
    execute("UPDATE t SET v = 'updated while gone' WHERE id BETWEEN 30 AND 35")
    vanished = set(range(1, 6)) | set(range(20, 30))
    topic = f"{name}.public.t"
    before = read_topic(config, topic)
    assert sum(map(len, before.values())) == 60 + 10 + 2 * 5, "snapshot, streamed updates, deletes + tombstones"

    resync = cli("source", "resync", name, "--yes")
    assert "was dropped" in resync.stdout
    capture = cli("capture", "--until-caught-up")
    source = {i: {"id": i, "v": v} for i, v in execute("SELECT id, v FROM t")}
    after = read_topic(config, topic)

    last_before = max(sequence(orjson.loads(r.value)) for p in before.values() for r in p if r.value is not None)
    reads: list[int] = []
    deletes: dict[int, dict[str, Any]] = {}
    for partition, records in after.items():
        assert records[: len(before[partition])] == before[partition], "records from before moved or changed"
        new = records[len(before[partition]) :]
        for position, record in enumerate(new):
            key = orjson.loads(record.key)["id"]
            if record.value is None:
                assert position > 0 and new[position - 1].key == record.key, f"tombstone of {key} without its delete"
                assert orjson.loads(new[position - 1].value)["op"] == "d"
                continue
            event = orjson.loads(record.value)
            assert sequence(event) > last_before, "the resync wrote an event that sorts before the log's last"
            assert event["source"]["snapshot"] in ("true", "last"), event
            if event["op"] == "r":
                assert event["after"] == source[key]
                reads.append(key)
            else:
                assert event["op"] == "d" and event["after"] is None, event
                assert position + 1 < len(new) and new[position + 1].key == record.key, f"delete of {key}: no tombstone"
                deletes[key] = event["before"]
    assert sorted(reads) == sorted(source), "each row the source has: one read event"
    assert sorted(deletes) == sorted(vanished), "deletes for exactly the keys deleted while the slot was gone"
    # A delete carries the key's last image in the log (ids 1-5 were updated by the stream).
    assert all(deletes[i] == {"id": i, "v": "streamed" if i <= 10 else "initial"} for i in vanished)
    assert f"{len(vanished)} rows deleted while the slot was gone" in capture.stderr

    # The fresh slot streams on after the re-snapshot.
    execute("UPDATE t SET v = 'after resync' WHERE id = 40")
    cli("capture", "--until-caught-up")
    final = [orjson.loads(r.value) for records in read_topic(config, topic).values() for r in records if r.value]
    sequences = [sequence(e) for e in final]
    assert len(sequences) == len(set(sequences)), "a change is in the log twice"
    latest: dict[int, tuple[tuple[int, int], dict[str, Any] | None]] = {}
    for event in final:
        row = event["after"] if event["op"] != "d" else None
        key = (event["after"] or event["before"])["id"]
        if key not in latest or latest[key][0] < sequence(event):
            latest[key] = (sequence(event), row)
    source[40] = {"id": 40, "v": "after resync"}
    assert {k: row for k, (_, row) in latest.items() if row is not None} == source
    assert {k for k, (_, row) in latest.items() if row is None} == vanished | set(range(51, 56))
