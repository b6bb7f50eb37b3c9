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

import itertools
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import psycopg
import yaml
from harness.topics import topic_records

from capture.key_set import KEY_SET_FILE, Candidates, KeySet
from capture.postgres.agent import AgentSettings, CaptureAgent
from capture.postgres.catalog import typemap_decoders
from core.config import load_config
from core.log_config import KafkaConfig, LogConfig
from core.source_config import SourceConfig
from log.factory import open_log
from log.kafka.backend import KafkaLog

ROOT = Path(__file__).resolve().parents[3]
PASSWORD_VAR = "HW_RESYNC_KAFKA_PW"


def read_topic(config: Path, topic: str) -> dict[int, list[Any]]:
    """Every record of ``topic`` per partition, read back from the broker through the Kafka log."""
    log = open_log(load_config(config, strict_env=False))
    try:
        return topic_records(log, topic)
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
            # The re-snapshot's rows carry snapshot markers; the reconcile's deletes "true".
            assert event["source"]["snapshot"] in ("first", "true", "last"), event
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


def test_spilled_resync_on_kafka_appends_deletes_in_batches(pg_database, kafka_broker, tmp_path, monkeypatch):
    """The agent in-process, both scratch sets spilled to SQLite, deletes appended a few at a time."""

    name = pg_database.name
    topic = f"{name}.public.t"
    pg_database.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pg_database.execute(f"CREATE PUBLICATION headwater_{name} FOR TABLE t")
    pg_database.execute("INSERT INTO t SELECT g, 'initial' FROM generate_series(1, 40) g")
    source = SourceConfig(dsn=pg_database.dsn, tables=("public.t",), snapshot="when_needed", heartbeat_interval_s=1)
    kafka = KafkaConfig(bootstrap_servers=kafka_broker.bootstrap_servers)
    state_dir = tmp_path / "capture" / name
    appends: list[list[Any]] = []

    class RecordingKafkaLog(KafkaLog):
        def append(self, topic_name: str, partition: int, records: Any) -> Any:
            if topic_name == topic:
                appends.append(list(records))
            return super().append(topic_name, partition, records)

    def capture() -> None:
        log = RecordingKafkaLog(kafka)
        try:
            agent = CaptureAgent(
                name, source, log, LogConfig(backend="kafka", partitions=3, kafka=kafka),
                typemap_decoders(source.types), state_dir=state_dir, settings=AgentSettings(max_batch_records=6),
            )  # fmt: skip
            agent.run(until_caught_up=True)
        finally:
            log.close()

    capture()
    pg_database.execute(f"SELECT pg_drop_replication_slot('headwater_{name}')")
    pg_database.execute("DELETE FROM t WHERE id % 3 = 0")  # 13 rows vanish while the slot is gone
    spills: list[str] = []
    for cls in (KeySet, Candidates):
        spill = cls._spill
        recorded = lambda self, spill=spill, what=cls.__name__: (spills.append(what), spill(self))  # noqa: E731
        monkeypatch.setattr(cls, "_spill", recorded)
    monkeypatch.setattr(KeySet, "SPILL_AT", 10)
    monkeypatch.setattr(Candidates, "SPILL_BYTES", 0)
    appends.clear()
    capture()
    assert sorted(spills) == ["Candidates", "KeySet"], "the scratch sets did not spill"
    assert not (state_dir / KEY_SET_FILE).exists() and not (state_dir / "resync.json").exists()

    delete_batches = [batch for batch in appends if any(r.value is None for r in batch)]
    # At most max_batch_records pending at a time (13 deletes + tombstones = 26 records over 3 partitions).
    assert delete_batches and all(len(batch) <= 6 for batch in delete_batches), [len(b) for b in delete_batches]
    deleted = []
    for batch in delete_batches:
        assert batch[-1].value is None, "an append ends between a delete and its tombstone"
        for record, following in itertools.pairwise(batch):
            if record.value is not None and orjson.loads(record.value)["op"] == "d":
                assert following.key == record.key and following.value is None
                deleted.append(orjson.loads(record.key)["id"])
    assert sorted(deleted) == [i for i in range(1, 41) if i % 3 == 0]
    events = [orjson.loads(r.value) for batch in appends for r in batch if r.value is not None]
    assert sorted(e["after"]["id"] for e in events if e["op"] == "r") == [i for i in range(1, 41) if i % 3]
