"""The operator jobs in process: re-snapshot against a real captured source, reprocess with a real Spark."""

from __future__ import annotations

import random
import threading
import time

import orjson
import psycopg
import pytest
import yaml
from dagster import AssetKey, DagsterInstance, materialize
from harness.topics import read_topic

from capture.postgres.agent import CaptureAgent
from capture.postgres.catalog import typemap_decoders
from capture.postgres.events.source_block import postgres_source
from capture.runner import run_capture
from core.config import load_config
from dagster_project.definitions import build_definitions
from log.base import Record, TopicSpec, append_keyed
from log.envelope import ChangeEvent, Op, encode_key, encode_value
from log.factory import open_log
from log.topics import SCHEMAS_TOPIC

ROWS = 3000  # three chunks of 1024: the snapshot opens several watermark windows


def all_events(config, topic: str) -> dict[int, list[dict]]:
    """Change events per key in sequence order (tombstones left out)."""
    out: dict[int, list[dict]] = {}
    with open_log(config) as log:
        for record in read_topic(log, topic):
            if record.value is not None:
                out.setdefault(orjson.loads(record.key)["id"], []).append(orjson.loads(record.value))
    for events in out.values():
        events.sort(key=lambda e: (e["source"]["commit_lsn"], e["source"]["txn_index"]))
    return out


def postgres_rows(dsn: str) -> dict[int, dict]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT id, label FROM items").fetchall()
    return {i: {"id": i, "label": label} for i, label in rows}


def writer(dsn: str, stop: threading.Event) -> int:
    """Updates and deletes at random keys until stopped; returns how many."""
    rng = random.Random(11)
    writes = 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        while not stop.is_set():
            key = rng.randint(1, ROWS)
            if rng.random() < 0.8:
                conn.execute("UPDATE items SET label = %s WHERE id = %s", (f"w{writes}", key))
            else:
                conn.execute("DELETE FROM items WHERE id = %s", (key,))
            writes += 1
            time.sleep(0.002)
    return writes


def resnapshot_config(source: str, tables: list[str]) -> dict:
    return {"ops": {"incremental_snapshot": {"config": {"source": source, "tables": tables}}}}


def test_resnapshot_job_while_capture_streams_and_without_it(pg_server, unique_name, tmp_path):
    source = unique_name("rs")
    dsn = pg_server.create_database(source)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE items (id int PRIMARY KEY, label text);"
            f"INSERT INTO items SELECT g, 'item ' || g FROM generate_series(1, {ROWS}) g;"
            f"CREATE PUBLICATION headwater_{source} FOR TABLE items;"
        )
    path = tmp_path / "headwater.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "project": "rs",
                "home": ".headwater",
                "log": {"partitions": 2, "file": {"fsync": "never"}},
                "sources": {source: {"dsn": dsn, "tables": ["public.items"], "snapshot": "never"}},
            }
        )
    )
    config = load_config(path)
    run_capture(config, (source,), until_caught_up=True)  # slot only: no initial snapshot
    topic = f"{source}.public.items"
    defs = build_definitions(config)
    job = defs.resolve_job_def("resnapshot_source")
    instance = DagsterInstance.ephemeral()

    # 1. A capture agent streams the source and writes go on: the job leaves the snapshot to the agent.
    log = open_log(config)
    settings = config.sources[source]
    agent = CaptureAgent(
        source,
        settings,
        log,
        config.log,
        typemap_decoders(settings.types),
        state_dir=config.home_dir / "capture" / source,
    )
    errors: list[BaseException] = []

    def follow() -> None:
        try:
            agent.run(until_caught_up=False)
        except BaseException as exc:
            errors.append(exc)

    stop_writer = threading.Event()
    writes: list[int] = []
    write = threading.Thread(target=lambda: writes.append(writer(dsn, stop_writer)))
    threads = [threading.Thread(target=follow), write]
    for thread in threads:
        thread.start()
    try:
        time.sleep(0.5)
        started = time.monotonic()
        result = job.execute_in_process(run_config=resnapshot_config(source, ["public.items"]), instance=instance)
        took = time.monotonic() - started
    finally:
        stop_writer.set()
        agent.stop()
        for thread in threads:
            thread.join(60)
        log.close()
    assert not errors, errors
    assert result.success
    assert agent.incremental.chunks_emitted >= 3 and not agent.incremental.pending
    assert writes[0] > 100, "writes should go on during the snapshot"
    (event,) = result.get_asset_materialization_events()
    assert event.asset_key == AssetKey([source, "public", "items"])
    request = event.materialization.metadata["snapshot/request"].value
    print(f"snapshot by the running agent in {took:.1f} s, {writes[0]} writes meanwhile")

    run_capture(config, (source,), until_caught_up=True)  # the writes after the agent stopped
    live = postgres_rows(dsn)
    by_key = all_events(config, topic)
    reads = 0
    for key, events in by_key.items():
        latest = {"id": key, "label": f"item {key}"}  # the row as inserted (before the slot existed)
        for event in events:
            if event["op"] == "r":
                assert event["source"]["snapshot"] == "incremental"
                # A snapshot row never carries an image older than a change before it in the log.
                assert event["after"] == latest, f"key {key}: snapshot row {event['after']} overwrote {latest}"
                reads += 1
            else:
                latest = event["after"]
        assert latest == live.get(key), f"key {key}: the log ends at {latest}, Postgres has {live.get(key)}"
    assert set(live) <= set(by_key)
    assert reads > len(live) // 2

    # 2. No agent running: the job runs capture until caught up, which finishes the snapshot.
    before = sum(1 for events in by_key.values() for e in events if e["op"] == "r")
    second = job.execute_in_process(run_config=resnapshot_config(source, ["public.items"]), instance=instance)
    assert second.success
    (event,) = second.get_asset_materialization_events()
    assert event.materialization.metadata["snapshot/request"].value != request
    after = sum(1 for events in all_events(config, topic).values() for e in events if e["op"] == "r")
    assert after - before == len(live)  # nothing changes meanwhile: every live row read once more

    # 3. A table the source does not capture: the run fails with the library's one-line message.
    bad = job.execute_in_process(
        run_config=resnapshot_config(source, ["public.orders"]), instance=instance, raise_on_error=False
    )
    assert not bad.success
    (failure,) = [e for e in bad.all_events if e.event_type_value == "STEP_FAILURE"]
    message = failure.event_specific_data.user_failure_data.description
    assert message == (
        f"source '{source}' does not capture public.orders (it captures tables public.items); "
        "snapshot only tables it captures, or add them with 'headwater source add'"
    )


INT4, TEXT = 23, 25


def raw_topic(config, topic: str, ids: range) -> None:
    """A captured table's topic as capture writes it: schema record, then keyed inserts."""
    with open_log(config) as log:
        log.create_topic(TopicSpec(topic, partitions=2))
        log.create_topic(TopicSpec(SCHEMAS_TOPIC, partitions=1))
        columns = [
            {"name": "id", "type_oid": INT4, "typmod": -1, "key": True},
            {"name": "label", "type_oid": TEXT, "typmod": -1, "key": False},
        ]
        schema = {"topic": topic, "schema": "public", "table": "t", "columns": columns, "version": 1}
        log.append(SCHEMAS_TOPIC, 0, [Record(topic.encode(), orjson.dumps(schema))])
        records = []
        for i in ids:
            source = postgres_source("src", "db", "public", "t", i, 1000 + i, 10_000 + i, 0, 1_700_000_000_000_000 + i)
            event = ChangeEvent(Op.CREATE, source, None, {"id": i, "label": f"n{i}"}, 0)
            records.append(Record(encode_key({"id": i}), encode_value(event)))
        append_keyed(log, topic, records)


def write_feed_config(tmp_path, topic: str, sql: str, fmt: str = "delta"):
    path = tmp_path / "headwater.yaml"
    document = {
        "project": "rp",
        "home": ".headwater",
        "log": {"partitions": 2, "file": {"fsync": "never"}},
        "feeds": {"labels": {"from": topic, "sql": sql, "key": ["id"]}},
        "warehouse": {"format": fmt, "tables": {"labels_now": {"from": "labels", "mode": "scd1"}}},
    }
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return load_config(path)


@pytest.mark.parametrize("table_format", ["delta", "iceberg"])
def test_reprocess_job_switches_the_version_and_readers_see_the_new_result(spark, unique_name, tmp_path, table_format):
    from spark_log.versions import resolve_topic
    from warehouse_loader.formats import format_of
    from warehouse_loader.load_job import table_path

    topic = unique_name("raw")
    config = write_feed_config(tmp_path, topic, "SELECT id, upper(label) AS label FROM source", table_format)
    raw_topic(config, topic, range(30))
    defs = build_definitions(config)
    instance = DagsterInstance.ephemeral()
    feed, table = AssetKey(["feeds", "labels"]), AssetKey(["warehouse", "labels_now"])
    assert materialize(list(defs.assets), resources=defs.resources, instance=instance, selection=[feed, table]).success

    def table_rows(config) -> dict[int, str]:
        stored = format_of(config, "labels_now").open(table_path(config, "labels_now"))
        assert stored is not None
        return {r["id"]: r["label"] for r in stored.select("SELECT id, label FROM target").to_pylist()}

    assert table_rows(config) == {i: f"N{i}" for i in range(30)}

    # The feed's SQL changes: reprocess the feed (dropping v1), then the table reading it.
    config = write_feed_config(
        tmp_path, topic, "SELECT id, concat(label, '!') AS label FROM source WHERE id < 20", table_format
    )
    job = build_definitions(config).resolve_job_def("reprocess")
    fed = job.execute_in_process(
        run_config={"ops": {"reprocess_version": {"config": {"name": "labels", "drop_old": True}}}}, instance=instance
    )
    assert fed.success
    (event,) = fed.get_asset_materialization_events()
    assert event.asset_key == feed
    assert event.materialization.metadata["reprocess/version"].value == 2
    assert event.materialization.metadata["reprocess/dropped"].value == ["labels"]
    assert resolve_topic(load_config(config.config_path), "labels") == "labels.v2"
    with open_log(config) as log:
        assert "labels" not in log.list_topics()
    assert table_rows(config) == {i: f"N{i}" for i in range(30)}  # the table still reads what it loaded

    loaded = job.execute_in_process(
        run_config={"ops": {"reprocess_version": {"config": {"name": "labels_now"}}}}, instance=instance
    )
    assert loaded.success
    (event,) = loaded.get_asset_materialization_events()
    assert event.asset_key == table and event.materialization.metadata["reprocess/version"].value == 2
    config = load_config(config.config_path)
    assert table_path(config, "labels_now").name == "labels_now.v2"  # readers resolve the new version
    assert table_rows(config) == {i: f"n{i}!" for i in range(20)}

    unknown = job.execute_in_process(
        run_config={"ops": {"reprocess_version": {"config": {"name": "nope"}}}}, instance=instance, raise_on_error=False
    )
    assert not unknown.success
    (failure,) = [e for e in unknown.all_events if e.event_type_value == "STEP_FAILURE"]
    assert failure.event_specific_data.user_failure_data.description == (
        "no feed or warehouse table named 'nope'; known: labels, labels_now"
    )
