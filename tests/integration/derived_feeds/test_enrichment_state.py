"""Enrichment state in Spark's RocksDB state store: correctness on both sides, restarts, SIGKILL.

Topics are written as capture writes them (schema records, Debezium events, delete +
tombstone) on the file log; the feed runs on the session's Spark (in-process restarts)
or as ``headwater feeds run`` processes (SIGKILL).
"""

from __future__ import annotations

import itertools
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import yaml
from harness.fault_injection import CliProcess
from harness.topics import partition_records

from capture.postgres.events.source_block import postgres_source
from core.config import load_config
from derived_feeds.feed_job import await_query, start_feed
from derived_feeds.feed_spec import feed_spec
from log.base import Record, TopicSpec, append_keyed, end_offsets
from log.envelope import ChangeEvent, Op, encode_key, encode_value
from log.factory import open_log
from log.pg_types import Oid
from log.topics import SCHEMAS_TOPIC

SQL = "SELECT o.id, o.amount, c.country FROM source o LEFT JOIN customers c ON o.customer_id = c.id WHERE o.amount > 0"
COLUMNS = {
    "customers": [("id", Oid.INT4, True), ("country", Oid.TEXT, False)],
    "orders": [("id", Oid.INT4, True), ("customer_id", Oid.INT4, False), ("amount", Oid.INT4, False)],
}
FEED = "orders_enriched"


class Shop:
    """Two captured tables in the log and what the enriched feed must hold (a model of the SQL)."""

    def __init__(self, tmp_path: Path, name: str) -> None:
        self.name = name
        self.progress: list[Any] = []
        self.config_path = tmp_path / "headwater.yaml"
        self.topics = {table: f"{name}.public.{table}" for table in COLUMNS}
        feed = {"from": self.topics["orders"], "lookups": {"customers": self.topics["customers"]}, "sql": SQL}
        body = {"project": "t", "home": str(tmp_path / "home"), "log": {"partitions": 2}, "feeds": {FEED: feed}}
        body["feeds"][FEED]["key"] = ["id"]
        self.config_path.write_text(yaml.safe_dump(body, sort_keys=False))
        self.tables: dict[str, dict[int, dict]] = {table: {} for table in COLUMNS}
        self.lsn = itertools.count(1000)
        self.last_lsn = 0
        self.checkpoint = tmp_path / "home" / "checkpoints" / "feeds" / FEED / FEED / "spark"
        with self.log() as log:
            log.create_topic(TopicSpec(SCHEMAS_TOPIC, partitions=1))
            for table, columns in COLUMNS.items():
                log.create_topic(TopicSpec(self.topics[table], partitions=2))
                described = [{"name": n, "type_oid": int(t), "typmod": -1, "key": k} for n, t, k in columns]
                value = {"topic": self.topics[table], "schema": "public", "table": table, "columns": described}
                value["version"] = 1
                log.append(SCHEMAS_TOPIC, 0, [Record(self.topics[table].encode(), orjson.dumps(value))])

    def log(self):
        return _Closing(open_log(load_config(self.config_path)))

    def upsert(self, table: str, *rows: dict) -> None:
        self._write(table, [(Op.UPDATE if row["id"] in self.tables[table] else Op.CREATE, row) for row in rows])

    def delete(self, table: str, *ids: int) -> None:
        self._write(table, [(Op.DELETE, self.tables[table][i]) for i in ids])

    def _write(self, table: str, changes: list[tuple[Op, dict]]) -> None:
        records = []
        for op, row in changes:
            lsn = self.last_lsn = next(self.lsn)
            source = postgres_source(self.name, "db", "public", table, lsn, lsn, lsn, 0, 1_700_000_000_000_000 + lsn)
            before, after = (row, None) if op is Op.DELETE else (None, row)
            key = encode_key({"id": row["id"]})
            records.append(Record(key, encode_value(ChangeEvent(op, source, before, after, 0))))
            if op is Op.DELETE:
                records.append(Record(key, None))  # the tombstone capture writes after a delete
                del self.tables[table][row["id"]]
            else:
                self.tables[table][row["id"]] = row
        with self.log() as log:
            append_keyed(log, self.topics[table], records)

    def expected(self) -> dict:
        countries = {i: row["country"] for i, row in self.tables["customers"].items()}
        return {
            i: {"id": i, "amount": row["amount"], "country": countries.get(row["customer_id"])}
            for i, row in self.tables["orders"].items()
            if row["amount"] > 0
        }

    def feed_records(self, since: dict[int, int] | None = None) -> list[Record]:
        with self.log() as log:
            return [r for p in range(2) for r in partition_records(log, FEED, p, (since or {}).get(p))]

    def feed_ends(self) -> dict[int, int]:
        with self.log() as log:
            return end_offsets(log, FEED)

    def fold(self) -> dict:
        state: dict = {}
        for record in self.feed_records():
            key = orjson.loads(record.key)["id"]
            event = orjson.loads(record.value) if record.value is not None else None
            if event is None or event["op"] == "d":
                state.pop(key, None)
            else:
                state[key] = event["after"]
        return state

    def run(self, spark) -> int:
        """One ``--available-now`` run on ``spark``; returns the records it read (Spark's numInputRows)."""
        config = load_config(self.config_path)
        log = open_log(config)
        try:
            query, plan = start_feed(spark, config, log, feed_spec(config, FEED), available_now=True)
            await_query(query, plan)
            self.progress = [
                (p["batchId"], [(s["startOffset"], s["endOffset"], s["numInputRows"]) for s in p["sources"]])
                for p in query.recentProgress
            ]
            return sum(int(progress["numInputRows"]) for progress in query.recentProgress)
        finally:
            log.close()


class _Closing:
    def __init__(self, log) -> None:
        self.log = log

    def __enter__(self):
        return self.log

    def __exit__(self, *exc) -> None:
        self.log.close()


def changelog_files(checkpoint: Path) -> list[Path]:
    return sorted((checkpoint / "state").glob("0/*/*.changelog"))


def test_updates_on_both_sides_and_restarts_read_only_new_records(spark, unique_name, tmp_path):
    shop = Shop(tmp_path, unique_name("shop"))
    shop.upsert("customers", {"id": 1, "country": "PT"}, {"id": 2, "country": "DE"}, {"id": 3, "country": "MX"})
    orders = [(10, 1, 100), (11, 2, 110), (12, 1, 120), (13, 3, 130)]
    shop.upsert("orders", *[{"id": i, "customer_id": c, "amount": a} for i, c, a in orders])
    assert shop.run(spark) == 7
    assert shop.fold() == shop.expected()
    assert len(shop.feed_records()) == 4
    # The state is Spark's RocksDB store with changelog checkpointing, recorded in the checkpoint.
    assert changelog_files(shop.checkpoint), "no RocksDB changelog files in the checkpoint"
    assert "RocksDBStateStoreProvider" in (shop.checkpoint / "offsets" / "0").read_text()
    assert not (shop.checkpoint.parent / "lookup_state").exists()

    # A restart (new query, same checkpoint) with changes on both sides: the table side moves a
    # customer and deletes one; the stream side re-points, deletes, inserts, and leaves the filter.
    shop.upsert("customers", {"id": 1, "country": "ES"})
    shop.delete("customers", 3)
    shop.upsert("orders", {"id": 11, "customer_id": 1, "amount": 110})
    shop.delete("orders", 12)
    shop.upsert("orders", {"id": 14, "customer_id": 2, "amount": 140}, {"id": 15, "customer_id": 9, "amount": 150})
    shop.upsert("orders", {"id": 10, "customer_id": 1, "amount": -1})
    # Only these 7 changes are read (the source hands out no tombstones), not the 16 records the
    # topics now hold: the 7 earlier changes come from the state store.
    assert shop.run(spark) == 7
    assert shop.fold() == shop.expected()


def _committed(checkpoint: Path) -> list[int]:
    return sorted(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())


def _batch_ends(checkpoint: Path, batch: int) -> dict[str, dict[str, int]]:
    """The input topics' end offsets of micro-batch ``batch`` (the source's line of its offsets file)."""
    return orjson.loads((checkpoint / "offsets" / str(batch)).read_text().splitlines()[-1])


def _records_up_to(checkpoint: Path, batch: int) -> int:
    """How many records of the input topics micro-batches up to ``batch`` covered (its end offsets)."""
    return sum(sum(partitions.values()) for partitions in _batch_ends(checkpoint, batch).values())


def _ends(offsets: Any) -> dict[str, dict[int, int]]:
    """Offsets per topic and partition, from an offsets file, Spark's progress (JSON text) or the log."""
    parsed = orjson.loads(offsets) if isinstance(offsets, str) else offsets
    return {topic: {int(p): int(n) for p, n in partitions.items() if int(n)} for topic, partitions in parsed.items()}


def _wait(condition, timeout_s: float, what: str, process: CliProcess) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert process.exit_code() is None, f"feeds run exited: {process.tail()}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {process.tail()}"
        time.sleep(0.2)


def test_sigkill_of_feeds_run_resumes_from_the_state_store_without_duplicates(spark, unique_name, tmp_path):
    shop = Shop(tmp_path, unique_name("shop"))
    shop.upsert("customers", *[{"id": c, "country": f"C{c}"} for c in range(20)])
    shop.upsert("orders", *[{"id": i, "customer_id": i % 20, "amount": i + 1} for i in range(200)])
    argv = [sys.executable, "-m", "headwater", "feeds", "run", "--config", str(shop.config_path)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    follow = CliProcess("feeds", [*argv, "--follow"], tmp_path / "logs", env)
    follow.start()
    try:
        _wait(lambda: (shop.checkpoint / "commits").is_dir() and _committed(shop.checkpoint), 240, "batch 0", follow)
        # More changes on both sides while the job runs; the kill lands during or between batches.
        shop.upsert("customers", *[{"id": c, "country": f"D{c}"} for c in range(0, 20, 2)])
        shop.upsert("orders", *[{"id": i, "customer_id": (i + 1) % 20, "amount": i + 1} for i in range(0, 200, 3)])
        time.sleep(1.0)
    finally:
        follow.kill()

    committed = _committed(shop.checkpoint)[-1]
    read_before_kill = _records_up_to(shop.checkpoint, committed)

    # After the kill: orders of customers whose records were read only before it, and a lookup change.
    shop.upsert("orders", *[{"id": i, "customer_id": i % 20, "amount": 7} for i in range(200, 260)])
    shop.delete("orders", *range(100, 110))
    shop.upsert("customers", {"id": 5, "country": "Z5"})
    # The catch-up runs on this session's Spark, so its progress says what the source handed out.
    read_after = shop.run(spark)

    assert shop.fold() == shop.expected()
    feed = shop.feed_records()
    values = Counter((r.key, r.value) for r in feed if r.value is not None)
    assert [pair for pair, n in values.items() if n > 1] == [], "a feed event was appended twice"
    # Orders no change after the first batch reached: emitted once, in the first batch. A restart
    # that reread the topics into an empty state would emit them again (their keys look new).
    quiet = {i for i in range(200) if i % 3 and (i % 20) % 2 and i % 20 != 5 and not 100 <= i < 110}
    emitted = Counter(orjson.loads(r.key)["id"] for r in feed)
    assert len(quiet) > 50
    assert {i: emitted[i] for i in quiet} == dict.fromkeys(quiet, 1)
    # The restart read from where the last batch committed before the kill ended (nothing before
    # it) to the log's end. Not a count of rows: that depends on where batches fell, as a batch
    # holding a key's update and its delete hands out the delete only (the reader keeps each key's
    # latest change; seen when the kill came before the next batch was planned).
    with shop.log() as log:
        log_ends = {topic: end_offsets(log, topic) for topic in shop.topics.values()}
    total = sum(sum(ends.values()) for ends in log_ends.values())
    assert 0 < read_before_kill < total and read_after > 0
    context = f"committed batch {committed}; batches after the restart: {shop.progress}"
    assert _ends(shop.progress[0][1][0][0]) == _ends(_batch_ends(shop.checkpoint, committed)), context
    assert _ends(shop.progress[-1][1][0][1]) == _ends(log_ends), context
    assert changelog_files(shop.checkpoint)
