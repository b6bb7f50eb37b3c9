"""The ``headwater_log`` Spark source against real logs (file and Kafka) and the real capture agent."""

from __future__ import annotations

import datetime as dt
import math
import time
from decimal import Decimal
from pathlib import Path

import orjson
import yaml

from capture.postgres.agent import CaptureAgent
from capture.postgres.catalog import typemap_decoders
from capture.postgres.events.source_block import postgres_source
from core.config import load_config
from core.log_config import LogConfig
from core.source_config import SourceConfig
from core.warehouse_config import TableConfig
from log.base import Record, TopicSpec, append_keyed
from log.envelope import ChangeEvent, Op, encode_key, encode_value
from log.factory import open_log
from log.topics import SCHEMAS_TOPIC
from spark_log.data_source import register_log_source
from warehouse_loader.changes_frame import change_batch

UTC = dt.UTC
INT4, TEXT = 23, 25


# ----------------------------------------------------------------------------- helpers


def write_config(tmp_path: Path, **extra) -> Path:
    path = tmp_path / "headwater.yaml"
    path.write_text(yaml.safe_dump({"project": "t", "home": str(tmp_path / "home"), **extra}))
    return path


def schema_value(topic: str, columns: list[tuple[str, int]], version: int = 1) -> bytes:
    cols = [{"name": n, "type_oid": oid, "typmod": -1, "key": n == "id"} for n, oid in columns]
    return orjson.dumps(
        {"topic": topic, "schema": "public", "table": "t", "replica_identity": "d", "columns": cols, "version": version}
    )


def events(topic: str, ids: range, lsn_base: int = 1000) -> list[Record]:
    out = []
    for i in ids:
        source = postgres_source(
            "src", "db", "public", "t", i, lsn_base + i, lsn_base + i, 0, 1_700_000_000_000_000 + i
        )
        event = ChangeEvent(Op.CREATE, source, None, {"id": i, "label": f"n{i}"}, 0)
        out.append(Record(encode_key({"id": i}), encode_value(event)))
    return out


def make_topic(config_path: Path, topic: str, partitions: int = 2) -> None:
    log = open_log(load_config(config_path))
    try:
        log.create_topic(TopicSpec(topic, partitions=partitions))
        log.create_topic(TopicSpec(SCHEMAS_TOPIC, partitions=1))
        log.append(SCHEMAS_TOPIC, 0, [Record(topic.encode(), schema_value(topic, [("id", INT4), ("label", TEXT)]))])
    finally:
        log.close()


def append(config_path: Path, topic: str, ids: range) -> None:
    log = open_log(load_config(config_path))
    try:
        append_keyed(log, topic, events(topic, ids))
    finally:
        log.close()


def batch_read(spark, config_path: Path, topic: str, **options):
    register_log_source(spark)
    reader = spark.read.format("headwater_log").option("config", str(config_path)).option("topic", topic)
    for name, value in options.items():
        reader = reader.option(name, str(value))
    return reader.load()


def stream(spark, config_path: Path, topic: str, checkpoint: Path, seen: list, trigger: dict, **options):
    register_log_source(spark)
    reader = spark.readStream.format("headwater_log").option("config", str(config_path)).option("topic", topic)
    for name, value in options.items():
        reader = reader.option(name, str(value))

    def sink(frame, batch_id):
        rows = frame.select("partition", "offset", "after.id").collect()
        seen.append((batch_id, [(r["partition"], r["offset"], r["id"]) for r in rows]))

    return (
        reader.load()
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(**trigger)
        .start()
    )


def ids_of(seen: list) -> list[int]:
    return sorted(i for _, rows in seen for _, _, i in rows)


def run_capture(db, name: str, tmp_path: Path, tables: tuple[str, ...]) -> None:
    source = SourceConfig(dsn=db.dsn, tables=tables, heartbeat_interval_s=1)
    log = open_log(load_config(tmp_path / "headwater.yaml"))
    try:
        agent = CaptureAgent(
            name,
            source,
            log,
            LogConfig(partitions=2),
            typemap_decoders(source.types),
            state_dir=tmp_path / "home" / "capture" / name,
        )
        agent.run(until_caught_up=True)
    finally:
        log.close()


# ----------------------------------------------------------------------------- captured tables

TYPED_TABLE = """
CREATE TYPE mood AS ENUM ('happy', 'sad');
CREATE TABLE things (
    id int PRIMARY KEY, price numeric(10,2), amount numeric, seen timestamptz, born date, blob bytea,
    tags text[], nums int[], feeling mood, doc jsonb, ratio double precision, at time, local timestamp
);
INSERT INTO things VALUES
  (1, 12.34, 1.000000000001, '2024-03-01 10:00:00+13', '2000-02-29', '\\x00ff', '{a,b}', '{1,NULL,3}',
   'happy', '{"k": [1, 2]}', 'NaN', '12:34:56.5', '2024-01-01 00:00:00'),
  (2, NULL, NULL, 'infinity', NULL, NULL, NULL, NULL, 'sad', NULL, 2.5, NULL, NULL);
"""


def test_batch_read_of_a_captured_table_is_typed(spark, pg_database, unique_name, tmp_path):
    name = unique_name("src")
    pg_database.execute(TYPED_TABLE)
    pg_database.execute(f"CREATE PUBLICATION headwater_{name} FOR TABLE things")
    config = write_config(tmp_path, sources={name: {"dsn": pg_database.dsn, "tables": ["public.things"]}})
    run_capture(pg_database, name, tmp_path, ("public.things",))
    pg_database.execute("UPDATE things SET price = 99.99 WHERE id = 1")
    pg_database.execute("DELETE FROM things WHERE id = 2")
    run_capture(pg_database, name, tmp_path, ("public.things",))
    topic = f"{name}.public.things"

    frame = batch_read(spark, config, topic)
    after = frame.schema["after"].dataType
    assert after.simpleString() == (
        "struct<id:int,price:decimal(10,2),amount:string,seen:timestamp,born:date,blob:binary,"
        "tags:array<string>,nums:array<int>,feeling:string,doc:string,ratio:double,at:bigint,local:timestamp_ntz>"
    )
    rows = {(r["op"], r["key"]): r for r in frame.collect()}
    assert sorted(op for op, _ in rows) == ["d", "r", "r", "u"]  # no tombstone
    one = rows[("r", '{"id":1}')]["after"]
    assert one["price"] == Decimal("12.34")
    assert one["amount"] == "1.000000000001"  # unconstrained numeric: exact text
    assert one["seen"] == dt.datetime(2024, 2, 29, 21, 0)  # UTC (session time zone)
    assert one["born"] == dt.date(2000, 2, 29)
    assert one["blob"] == b"\x00\xff"
    assert one["tags"] == ["a", "b"]
    assert one["nums"] == [1, None, 3]
    assert one["feeling"] == "happy"
    assert orjson.loads(one["doc"]) == {"k": [1, 2]}
    assert math.isnan(one["ratio"])
    assert one["at"] == (12 * 3600 + 34 * 60 + 56) * 1_000_000 + 500_000  # micros past midnight
    assert one["local"] == dt.datetime(2024, 1, 1)
    two = rows[("r", '{"id":2}')]["after"]
    assert two["seen"] == dt.datetime(9999, 12, 31, 23, 59, 59, 999_999)  # infinity, clamped
    assert rows[("u", '{"id":1}')]["after"]["price"] == Decimal("99.99")
    deleted = rows[("d", '{"id":2}')]
    assert deleted["before"]["id"] == 2 and deleted["after"] is None
    update = rows[("u", '{"id":1}')]
    assert update["__hw_seq"] > rows[("r", '{"id":1}')]["__hw_seq"]
    assert update["commit_lsn"] > 0 and update["source_table"] == "things" and update["snapshot"] == "false"

    with_tombstones = batch_read(spark, config, topic, includeTombstones="true")
    assert with_tombstones.where("op IS NULL").count() == 1

    changes = change_batch(frame, ["id"])
    assert changes.column_names[:4] == ["id", "__hw_seq", "__hw_op", "__hw_commit_ts"]
    assert str(changes.schema.field("__hw_commit_ts").type) == "timestamp[us, tz=UTC]"
    by_op = {(row["__hw_op"], row["id"]): row for row in changes.to_pylist()}
    assert by_op[("d", 2)]["price"] is None and by_op[("u", 1)]["price"] == Decimal("99.99")

    from warehouse_loader.delta.writer import write_batch

    loadable = changes.drop_columns(["at"])  # delta-rs has no TIME type (see report)
    result = write_batch(
        tmp_path / "wh" / "things",
        loadable,
        table="things",
        batch_id=0,
        keys=["id"],
        config=TableConfig.model_validate({"from": topic}),
    )
    assert not result.skipped


def test_column_added_mid_stream_reads_with_latest_schema(spark, pg_database, unique_name, tmp_path):
    name = unique_name("evo")
    pg_database.execute("CREATE TABLE items (id int PRIMARY KEY, label text)")
    pg_database.execute("INSERT INTO items VALUES (1, 'a'), (2, 'b')")
    pg_database.execute(f"CREATE PUBLICATION headwater_{name} FOR TABLE items")
    config = write_config(tmp_path, sources={name: {"dsn": pg_database.dsn, "tables": ["public.items"]}})
    run_capture(pg_database, name, tmp_path, ("public.items",))
    pg_database.execute("ALTER TABLE items ADD COLUMN weight numeric(6,3)")
    pg_database.execute("INSERT INTO items VALUES (3, 'c', 1.5)")
    run_capture(pg_database, name, tmp_path, ("public.items",))

    frame = batch_read(spark, config, f"{name}.public.items")
    assert frame.schema["after"].dataType.fieldNames() == ["id", "label", "weight"]
    weights = {r["after"]["id"]: r["after"]["weight"] for r in frame.collect()}
    assert weights == {1: None, 2: None, 3: Decimal("1.500")}


# ----------------------------------------------------------------------------- streaming


def test_available_now_resumes_from_checkpoint_without_duplicates(spark, unique_name, tmp_path):
    config = write_config(tmp_path)
    topic = unique_name("feed")
    make_topic(config, topic)
    append(config, topic, range(0, 40))
    seen: list = []
    checkpoint = tmp_path / "checkpoint"
    stream(spark, config, topic, checkpoint, seen, {"availableNow": True}).awaitTermination(120)
    assert ids_of(seen) == list(range(40))

    append(config, topic, range(40, 55))
    seen.clear()
    stream(spark, config, topic, checkpoint, seen, {"availableNow": True}).awaitTermination(120)
    assert ids_of(seen) == list(range(40, 55)), "only the new records, each once"

    seen.clear()
    stream(spark, config, topic, checkpoint, seen, {"availableNow": True}).awaitTermination(120)
    assert ids_of(seen) == []


def test_a_new_session_registers_the_source_after_its_parent_did(spark, unique_name, tmp_path):
    """A session made by ``newSession()`` registers and reads the source while its parent has it.

    Spark checks a new name against the data sources of the thread's *active* session, which is
    the parent here: registering in the child failed with ``DATA_SOURCE_ALREADY_EXISTS`` (seen
    in CI when the maintained-feeds oracle's child sessions came after another module registered
    the source in the worker's shared session).
    """
    config = write_config(tmp_path)
    topic = unique_name("child")
    make_topic(config, topic)
    append(config, topic, range(0, 5))
    assert batch_read(spark, config, topic).count() == 5  # the parent has the source
    child = spark.newSession()
    assert sorted(r["id"] for r in batch_read(child, config, topic).select("after.id").collect()) == list(range(5))
    assert batch_read(spark, config, topic).count() == 5  # and the parent still reads it


def drained(spark, config: Path, topic: str, checkpoint: Path, **options) -> list:
    """``(batch_id, rows)`` of an ``availableNow`` run of ``topic`` with ``options``, once it ended."""
    seen: list = []
    stream(spark, config, topic, checkpoint, seen, {"availableNow": True}, **options).awaitTermination(120)
    return seen


def test_max_records_per_batch_splits_micro_batches(spark, unique_name, tmp_path):
    config = write_config(tmp_path)
    topic = unique_name("feed")
    make_topic(config, topic)
    append(config, topic, range(0, 45))
    seen = drained(spark, config, topic, tmp_path / "cp", maxRecordsPerBatch=10, maxRecordsPerPartition=4)
    non_empty = [rows for _, rows in seen if rows]
    assert len(non_empty) == 5  # 45 records, 10 per batch
    assert all(len(rows) <= 10 for rows in non_empty)
    assert ids_of(seen) == list(range(45))


def test_max_bytes_per_batch_splits_a_backlog_by_its_records_bytes(spark, unique_name, tmp_path):
    config = write_config(tmp_path)
    topic = unique_name("feed")
    make_topic(config, topic)
    append(config, topic, range(0, 60))
    budget = int(sum(len(r.key) + len(r.value) for r in events(topic, range(0, 60))) / 60 * 10)  # ~10 records
    seen = drained(spark, config, topic, tmp_path / "cp", maxBytesPerBatch=budget)
    sizes = [len(rows) for _, rows in seen if rows]
    assert 6 <= len(sizes) <= 8 and all(size <= 11 for size in sizes), sizes
    assert ids_of(seen) == list(range(60))
    # With a record budget too, the smaller of the two ends a batch.
    append(config, topic, range(60, 90))
    seen = drained(spark, config, topic, tmp_path / "cp", maxBytesPerBatch=budget, maxRecordsPerBatch=4)
    assert [len(rows) for _, rows in seen if rows] == [4] * 7 + [2]
    assert ids_of(seen) == list(range(60, 90))


def test_processing_time_trigger_picks_up_appends(spark, unique_name, tmp_path):
    config = write_config(tmp_path)
    topic = unique_name("feed")
    make_topic(config, topic)
    append(config, topic, range(0, 5))
    seen: list = []
    query = stream(
        spark,
        config,
        topic,
        tmp_path / "cp",
        seen,
        {"processingTime": "300 milliseconds"},
        startingOffsets="latest",
    )
    try:
        deadline = time.monotonic() + 60
        while query.lastProgress is None and time.monotonic() < deadline:
            time.sleep(0.2)  # the first batch fixes the start at the then-current ends
        append(config, topic, range(5, 12))
        while ids_of(seen) != list(range(5, 12)) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        query.stop()
    assert ids_of(seen) == list(range(5, 12))


# ----------------------------------------------------------------------------- kafka backend


def test_kafka_backend_batch_read(spark, kafka_broker, unique_name, tmp_path):
    config = write_config(
        tmp_path, log={"backend": "kafka", "kafka": {"bootstrap_servers": kafka_broker.bootstrap_servers}}
    )
    topic = unique_name("kfeed")
    make_topic(config, topic)
    append(config, topic, range(0, 30))
    frame = batch_read(spark, config, topic, maxRecordsPerPartition=7)
    rows = frame.select("after.id", "after.label", "__hw_seq").collect()
    assert sorted(r["id"] for r in rows) == list(range(30))
    assert {r["label"] for r in rows} == {f"n{i}" for i in range(30)}
    assert frame.rdd.getNumPartitions() >= 4  # 2 partitions split into ranges of 7


def test_latest_per_key_read_equals_sparks_aggregation(spark, unique_name, tmp_path):
    """``latestPerKey`` (per log partition, in the reader) gives exactly ``transform.latest_changes`` of the read."""
    from derived_feeds.transform import latest_changes, reduced_changes

    config = write_config(tmp_path)
    topic = unique_name("latest")
    make_topic(config, topic, partitions=3)
    records = []
    for step in range(400):
        key = (step * 7) % 23
        op = [Op.CREATE, Op.UPDATE, Op.UPDATE, Op.DELETE][step % 4]
        lsn = 1000 + step // 3  # several changes share a transaction
        source = postgres_source("src", "db", "public", "t", step, lsn, lsn, step % 3, 1_700_000_000_000_000 + step)
        image = {"id": key, "label": f"v{step}"}
        event = ChangeEvent(op, source, image if op == Op.DELETE else None, None if op == Op.DELETE else image, 0)
        records.append(Record(encode_key({"id": key}), encode_value(event)))
        if op == Op.DELETE:
            records.append(Record(encode_key({"id": key}), None))
    truncate = postgres_source("src", "db", "public", "t", 999, 5000, 5000, 0, 1_700_000_000_000_000)
    records.append(Record(None, encode_value(ChangeEvent(Op.TRUNCATE, truncate, None, None, 0))))
    log = open_log(load_config(config))
    try:
        for start in range(0, len(records), 97):  # several appends per partition
            append_keyed(log, topic, records[start : start + 97])
    finally:
        log.close()

    columns = ["topic", "__hw_src_key", "op", "__hw_seq", "commit_lsn", "txn_index", "__hw_first_op"]
    expected = latest_changes(batch_read(spark, config, topic)).select(*columns, "__hw_image.*").collect()
    reduced = batch_read(spark, config, topic, latestPerKey="true", maxRecordsPerPartition=50)
    assert "__hw_first_op" in reduced.columns
    got = reduced_changes(reduced).select(*columns, "__hw_image.*").collect()
    assert sorted(map(tuple, got), key=repr) == sorted(map(tuple, expected), key=repr)
    assert len(got) == 24  # 23 keys and the truncate


# ----------------------------------------------------------------------------- split topics


def keyed_events(ids: range, keys: int) -> list[Record]:
    """Changes of ``keys`` keys; the label is the sequence number written."""
    out = []
    for i in ids:
        source = postgres_source("src", "db", "public", "t", i, 1000 + i, 1000 + i, 0, 1_700_000_000_000_000 + i)
        event = ChangeEvent(Op.UPDATE, source, None, {"id": i % keys, "label": str(i)}, 0)
        out.append(Record(encode_key({"id": i % keys}), encode_value(event)))
    return out


def test_micro_batches_of_a_split_topic_keep_every_keys_order(spark, unique_name, tmp_path):
    config = write_config(tmp_path)
    topic = unique_name("feed")
    make_topic(config, topic)
    keys = 7
    log = open_log(load_config(config))
    try:
        append_keyed(log, topic, keyed_events(range(0, 60), keys))
        log.split_partition(topic, 0)
        append_keyed(log, topic, keyed_events(range(60, 120), keys))
        log.merge_partitions(topic, 2, 3)
        log.split_partition(topic, 1)
        append_keyed(log, topic, keyed_events(range(120, 180), keys))
    finally:
        log.close()
    register_log_source(spark)
    rows_seen: list = []

    def sink(frame, batch_id):
        rows = frame.select("partition", "offset", "after.id", "after.label").collect()
        rows_seen.extend((batch_id, r["partition"], r["offset"], r["id"], int(r["label"])) for r in rows)

    query = (
        spark.readStream.format("headwater_log")
        .option("config", str(config))
        .option("topic", topic)
        .option("maxRecordsPerBatch", "25")
        .load()
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(180)
    assert sorted(label for *_, label in rows_seen) == list(range(180))
    for key in range(keys):
        mine = sorted((b, o, label, p) for b, p, o, k, label in rows_seen if k == key)
        for batch in {b for b, *_ in mine}:
            assert len({p for b, _, _, p in mine if b == batch}) == 1, "a key from two partitions in one batch"
        labels = [label for _, _, label, _ in mine]
        assert labels == sorted(labels), f"key {key} out of order: {labels}"
    # A batch read with latestPerKey refuses a split topic in one line.
    try:
        batch_read(spark, config, topic, latestPerKey="true").collect()
    except Exception as exc:  # Spark wraps the data source's error
        assert "partitions were split or merged" in str(exc)
    else:
        raise AssertionError("latestPerKey batch read of a split topic did not refuse")
