"""Derived feeds end to end: real Postgres + capture agent, the file log, a real Spark session."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import orjson
import yaml
from harness.topics import partition_records

from capture.postgres.agent import CaptureAgent
from capture.postgres.catalog import typemap_decoders
from capture.postgres.events.source_block import postgres_source
from core.config import load_config
from core.log_config import LogConfig
from derived_feeds.feed_job import await_query, run_feeds, start_feed
from derived_feeds.feed_spec import feed_spec
from log.base import Record, TopicSpec, append_keyed, end_offsets
from log.envelope import ChangeEvent, Op, encode_key, encode_value
from log.factory import open_log
from log.topics import SCHEMAS_TOPIC
from spark_log.data_source import register_log_source

# ----------------------------------------------------------------------------- helpers


def write_config(tmp_path: Path, name: str, dsn: str, tables: list[str], feeds: dict) -> Path:
    path = tmp_path / "headwater.yaml"
    body = {
        "project": "t",
        "home": str(tmp_path / "home"),
        "log": {"partitions": 2},
        "sources": {name: {"dsn": dsn, "tables": tables}},
        "feeds": feeds,
    }
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def capture(db, name: str, config_path: Path) -> None:
    config = load_config(config_path)
    source = config.sources[name]
    log = open_log(config)
    try:
        agent = CaptureAgent(
            name,
            source,
            log,
            LogConfig(partitions=2),
            typemap_decoders(source.types),
            state_dir=config.home_dir / "capture" / name,
        )
        agent.run(until_caught_up=True)
    finally:
        log.close()


def run(spark, config_path: Path, *names: str) -> None:
    config = load_config(config_path)
    log = open_log(config)
    try:
        run_feeds(spark, config, log, names, available_now=True)
    finally:
        log.close()


def ends(config_path: Path, topic: str) -> dict[int, int]:
    log = open_log(load_config(config_path))
    try:
        return end_offsets(log, topic)
    finally:
        log.close()


def records(config_path: Path, topic: str, since: dict[int, int] | None = None) -> list:
    """Every record of ``topic`` (partition by partition), or those at or after the offsets ``since``."""
    log = open_log(load_config(config_path))
    try:
        partitions = range(log.describe_topic(topic).partitions)
        return [r for p in partitions for r in partition_records(log, topic, p, (since or {}).get(p))]
    finally:
        log.close()


def fold(config_path: Path, topic: str) -> dict:
    """The topic as a table: latest value per key, tombstoned and deleted keys removed."""
    state: dict = {}
    for record in records(config_path, topic):
        key = orjson.loads(record.key)["id"] if record.key else None
        if record.value is None:
            state.pop(key, None)
            continue
        event = orjson.loads(record.value)
        if event["op"] == "d":
            state.pop(key, None)
        else:
            state[key] = event["after"]
    return state


def events_of(config_path: Path, topic: str) -> list[tuple[int, str | None]]:
    """``(id, op)`` of every record, ``None`` for a tombstone."""
    return [
        (orjson.loads(r.key)["id"], None if r.value is None else orjson.loads(r.value)["op"])
        for r in records(config_path, topic)
    ]


CUSTOMERS = """
CREATE TABLE customers (id int PRIMARY KEY, email text, country text, balance numeric(10,2));
INSERT INTO customers VALUES
  (1, 'A@X.COM', 'PT', 10.50), (2, 'b@x.com', 'DE', 20), (3, NULL, 'PT', 30), (4, 'd@x.com', 'XX', 40),
  (5, 'E@x.com', 'PT', 50), (6, NULL, 'DE', 60);
"""
CLEAN_SQL = "SELECT id, lower(email) AS email, country, balance FROM source WHERE country <> 'XX'"


def expected_clean(db) -> dict:
    rows = db.execute(
        "SELECT id, lower(email), country, balance::text FROM customers WHERE country <> 'XX' AND email IS NOT NULL"
    )
    return {i: {"id": i, "email": e, "country": c, "balance": b} for i, e, c, b in rows}


# ----------------------------------------------------------------------------- tests


def test_chained_feeds_propagate_changes_deletes_and_quarantine(spark, pg_database, unique_name, tmp_path):
    name = unique_name("src")
    pg_database.execute(CUSTOMERS)
    pg_database.execute(f"CREATE PUBLICATION headwater_{name} FOR TABLE customers")
    feeds = {
        "customers_clean": {
            "from": f"{name}.public.customers",
            "sql": CLEAN_SQL,
            "key": ["id"],
            "expectations": [
                {"expect": "expect_column_values_to_not_be_null", "column": "email", "action": "drop"},
                {"expect": "expect_column_values_to_be_between", "column": "balance", "min_value": 0, "action": "warn"},
            ],
        },
        "pt_customers": {
            "from": "customers_clean",
            "sql": "SELECT id, email FROM source WHERE country = 'PT'",
            "key": ["id"],
        },
    }
    config = write_config(tmp_path, name, pg_database.dsn, ["public.customers"], feeds)
    capture(pg_database, name, config)
    run(spark, config)  # both, in DAG order
    dropped_first = {
        i for (i,) in pg_database.execute("SELECT id FROM customers WHERE email IS NULL AND country <> 'XX'")
    }

    assert fold(config, "customers_clean") == expected_clean(pg_database)
    assert fold(config, "pt_customers") == {
        i: {"id": i, "email": row["email"]} for i, row in expected_clean(pg_database).items() if row["country"] == "PT"
    }

    # Phase 2: a row leaves the filter, a row is deleted, a row gets a null email, one arrives, one changes.
    pg_database.execute("UPDATE customers SET country = 'XX' WHERE id = 1")
    pg_database.execute("DELETE FROM customers WHERE id = 5")
    pg_database.execute("UPDATE customers SET email = NULL WHERE id = 2")
    pg_database.execute("INSERT INTO customers VALUES (7, 'G@x.com', 'PT', -1)")
    pg_database.execute("UPDATE customers SET balance = 31 WHERE id = 3")  # still null email: dropped again
    dropped_second = {2, 3}
    capture(pg_database, name, config)
    run(spark, config)

    assert fold(config, "customers_clean") == expected_clean(pg_database)
    assert fold(config, "pt_customers") == {
        i: {"id": i, "email": row["email"]} for i, row in expected_clean(pg_database).items() if row["country"] == "PT"
    }
    clean_events = events_of(config, "customers_clean")
    for key in (1, 5):  # left the filter / deleted: a delete, then a tombstone, on both feeds
        assert [e for e in clean_events if e[0] == key][-2:] == [(key, "d"), (key, None)]
        assert [e for e in events_of(config, "pt_customers") if e[0] == key][-2:] == [(key, "d"), (key, None)]

    quarantine = records(config, "customers_clean.quarantine")
    assert len(quarantine) == len(dropped_first) + len(dropped_second)
    assert sorted(orjson.loads(r.key)["id"] for r in quarantine) == sorted([*dropped_first, *dropped_second])
    headers = dict(quarantine[0].headers)
    assert headers["headwater.expectation"] == b"expect_column_values_to_not_be_null"
    assert b"email" in headers["headwater.error"]

    quality = [orjson.loads(line) for line in (tmp_path / "home" / "quality" / "feeds.jsonl").read_text().splitlines()]
    between = [q for q in quality if q["expectation"] == "expect_column_values_to_be_between"]
    assert sum(q["failed"] for q in between) == 1  # id 7, balance -1: warned, kept
    assert fold(config, "customers_clean")[7]["balance"] == "-1.00"

    # The feed topic reads back typed through the same source, like a raw table topic.
    register_log_source(spark)
    frame = spark.read.format("headwater_log").option("config", str(config)).option("topic", "customers_clean").load()
    assert frame.schema["after"].dataType.simpleString() == (
        "struct<id:int,email:string,country:string,balance:decimal(10,2)>"
    )
    sources = {r["commit_lsn"] for r in frame.where("op IN ('c', 'u', 'r')").collect()}
    raw = spark.read.format("headwater_log").option("config", str(config)).option("topic", f"{name}.public.customers")
    assert sources <= {r["commit_lsn"] for r in raw.load().collect()}, "feed events keep the source sequence"


SHOP = """
CREATE TABLE customers (id int PRIMARY KEY, country text);
CREATE TABLE orders (id int PRIMARY KEY, customer_id int, amount int);
INSERT INTO customers VALUES (1, 'PT'), (2, 'DE'), (3, 'MX');
INSERT INTO orders VALUES (10, 1, 100), (11, 2, 110), (12, 1, 120), (13, 3, 130);
"""
ENRICHED_SQL = (
    "SELECT o.id, o.amount, c.country FROM source o LEFT JOIN customers c ON o.customer_id = c.id WHERE o.amount > 0"
)


def expected_enriched(db) -> dict:
    rows = db.execute(ENRICHED_SQL.replace("source o", "orders o"))
    return {i: {"id": i, "amount": a, "country": c} for i, a, c in rows}


def test_enrichment_is_correct_after_updates_on_both_sides(spark, pg_database, unique_name, tmp_path):
    name = unique_name("shop")
    pg_database.execute(SHOP)
    pg_database.execute(f"CREATE PUBLICATION headwater_{name} FOR TABLE customers, orders")
    feeds = {
        "orders_enriched": {
            "from": f"{name}.public.orders",
            "lookups": {"customers": f"{name}.public.customers"},
            "sql": ENRICHED_SQL,
            "key": ["id"],
        }
    }
    config = write_config(tmp_path, name, pg_database.dsn, ["public.customers", "public.orders"], feeds)
    capture(pg_database, name, config)
    run(spark, config)
    assert fold(config, "orders_enriched") == expected_enriched(pg_database)
    emitted_first = len(records(config, "orders_enriched"))
    assert emitted_first == 4

    # Table side: a customer moves, one is deleted; stream side: an order changes customer, one is
    # deleted, one arrives, one leaves the filter.
    pg_database.execute("UPDATE customers SET country = 'ES' WHERE id = 1")
    pg_database.execute("DELETE FROM customers WHERE id = 3")
    pg_database.execute("UPDATE orders SET customer_id = 1 WHERE id = 11")
    pg_database.execute("DELETE FROM orders WHERE id = 12")
    pg_database.execute("INSERT INTO orders VALUES (14, 2, 140), (15, 9, 150)")
    pg_database.execute("UPDATE orders SET amount = -1 WHERE id = 10")
    capture(pg_database, name, config)
    run(spark, config)
    assert fold(config, "orders_enriched") == expected_enriched(pg_database)

    # Only a lookup change: the affected enriched row is re-emitted, the others are not.
    before = ends(config, "orders_enriched")
    pg_database.execute("UPDATE customers SET country = 'FR' WHERE id = 2")
    capture(pg_database, name, config)
    run(spark, config)
    assert fold(config, "orders_enriched") == expected_enriched(pg_database)
    new = records(config, "orders_enriched", since=before)
    assert sorted(orjson.loads(r.key)["id"] for r in new) == [14], "only the order of customer 2 changed"

    # Per key, sequences never go backwards, so SCD1 sinks (newest sequence wins) apply re-emitted rows.
    last: dict = {}
    for record in records(config, "orders_enriched"):
        if record.value is None:
            continue
        source = orjson.loads(record.value)["source"]
        position = (source["commit_lsn"], source["txn_index"])
        key = orjson.loads(record.key)["id"]
        assert position >= last.get(key, (0, 0))
        last[key] = position


# ----------------------------------------------------------------------------- exactly once

INT4, TEXT = 23, 25


def raw_topic(config_path: Path, topic: str) -> None:
    """A table topic with its schema record, as capture writes them."""
    log = open_log(load_config(config_path))
    try:
        log.create_topic(TopicSpec(topic, partitions=2))
        log.create_topic(TopicSpec(SCHEMAS_TOPIC, partitions=1))
        columns = [
            {"name": "id", "type_oid": INT4, "typmod": -1, "key": True},
            {"name": "label", "type_oid": TEXT, "typmod": -1, "key": False},
        ]
        schema = {"topic": topic, "schema": "public", "table": "t", "columns": columns, "version": 1}
        log.append(SCHEMAS_TOPIC, 0, [Record(topic.encode(), orjson.dumps(schema))])
    finally:
        log.close()


def append_rows(config_path: Path, topic: str, ids: range, op: Op = Op.CREATE, label: str = "n") -> None:
    log = open_log(load_config(config_path))
    try:
        out = []
        for i in ids:
            source = postgres_source("src", "db", "public", "t", i, 1000 + i, 10_000 + i, 0, 1_700_000_000_000_000 + i)
            after = None if op is Op.DELETE else {"id": i, "label": f"{label}{i}"}
            before = {"id": i} if op is Op.DELETE else None
            out.append(Record(encode_key({"id": i}), encode_value(ChangeEvent(op, source, before, after, 0))))
        append_keyed(log, topic, out)
    finally:
        log.close()


def plain_config(tmp_path: Path, feeds: dict) -> Path:
    path = tmp_path / "headwater.yaml"
    path.write_text(yaml.safe_dump({"project": "t", "home": str(tmp_path / "home"), "feeds": feeds}))
    return path


def test_restart_from_checkpoint_mid_stream_appends_nothing_twice(spark, unique_name, tmp_path):
    topic = unique_name("raw")
    feeds = {
        "labels": {
            "from": topic,
            "sql": "SELECT id, upper(label) AS label FROM source WHERE id % 7 <> 0",
            "key": ["id"],
        }
    }
    config_path = plain_config(tmp_path, feeds)
    raw_topic(config_path, topic)
    append_rows(config_path, topic, range(0, 90))

    def run_once() -> None:
        config = load_config(config_path)
        log = open_log(config)
        try:
            query, plan = start_feed(
                spark, config, log, feed_spec(config, "labels"), available_now=True, max_records_per_batch=30
            )
            await_query(query, plan)
        finally:
            log.close()

    run_once()
    checkpoint = tmp_path / "home" / "checkpoints" / "feeds" / "labels" / "labels" / "spark"
    commits = sorted(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    assert len(commits) >= 3
    # A crash after the append but before Spark recorded the batch: its commit entry is missing,
    # so the restart replays that micro-batch (same offsets) before going on.
    (checkpoint / "commits" / str(commits[-1])).unlink()
    (checkpoint / "commits" / f".{commits[-1]}.crc").unlink(missing_ok=True)
    append_rows(config_path, topic, range(90, 120))
    append_rows(config_path, topic, range(0, 10), op=Op.UPDATE, label="v")  # later versions of keys 0..9
    run_once()

    feed = records(config_path, "labels")
    expected = [(i, "c") for i in range(120) if i % 7] + [(i, "u") for i in range(10) if i % 7]
    expected += [(0, "d"), (0, None), (7, "d"), (7, None)]  # updates that fail the filter: delete + tombstone
    assert sorted(events_of(config_path, "labels"), key=str) == sorted(expected, key=str), "every change once"
    assert all(dict(r.headers)["headwater.feed.batch"] for r in feed)
    assert fold(config_path, "labels")[3] == {"id": 3, "label": "V3"}


# ----------------------------------------------------------------------------- reprocess


def test_reprocess_with_changed_sql_switches_readers_atomically(spark, unique_name, tmp_path):
    from operations.reprocess import drop_old, reprocess
    from spark_log.versions import resolve_topic

    topic = unique_name("raw")
    old_sql = "SELECT id, upper(label) AS label FROM source"
    config_path = plain_config(tmp_path, {"labels": {"from": topic, "sql": old_sql, "key": ["id"]}})
    raw_topic(config_path, topic)
    append_rows(config_path, topic, range(0, 60))
    run(spark, config_path)
    old = {i: {"id": i, "label": f"N{i}"} for i in range(60)}
    assert fold(config_path, "labels") == old

    new_sql = "SELECT id, concat(label, '!') AS label FROM source WHERE id < 40"
    config_path = plain_config(tmp_path, {"labels": {"from": topic, "sql": new_sql, "key": ["id"]}})
    new = {i: {"id": i, "label": f"n{i}!"} for i in range(40)}

    seen: list[str] = []
    stop = threading.Event()

    def reader() -> None:  # a concurrent reader resolving the version pointer once per read
        while not stop.is_set():
            state = fold(config_path, resolve_topic(load_config(config_path), "labels"))
            seen.append("old" if state == old else "new" if state == new else f"mix: {sorted(state)[:5]}")

    thread = threading.Thread(target=reader)
    thread.start()
    config = load_config(config_path)
    log = open_log(config)
    steps: list[tuple[int, int]] = []
    try:
        version = reprocess(spark, config, log, "labels", progress=lambda done, total: steps.append((done, total)))
        time.sleep(0.5)
    finally:
        stop.set()
        thread.join()
        log.close()

    assert version.number == 2 and version.topic == "labels.v2"
    assert resolve_topic(load_config(config_path), "labels") == "labels.v2"
    assert fold(config_path, "labels.v2") == new
    assert seen and set(seen) <= {"old", "new"}, f"readers saw a mix: {set(seen) - {'old', 'new'}}"
    assert seen[-1] == "new" and "old" in seen
    assert steps[-1] == (60, 60)
    assert fold(config_path, "labels") == old, "the old version stays until dropped"

    # The next run continues version 2 from its own checkpoint.
    append_rows(config_path, topic, range(60, 62))
    append_rows(config_path, topic, range(0, 1), op=Op.UPDATE, label="w")
    run(spark, config_path)
    assert fold(config_path, "labels.v2") == {**new, 0: {"id": 0, "label": "w0!"}}

    log = open_log(load_config(config_path))
    try:
        assert drop_old(load_config(config_path), log, "labels") == ["labels"]
        assert "labels" not in log.list_topics()
    finally:
        log.close()
