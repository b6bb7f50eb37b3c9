"""Truncates in an enriched feed: a lookup truncate empties that lookup, a source truncate deletes its rows.

Topics are written as capture writes them (a truncate is a keyless ``op: "t"`` event); two
feeds read the same topics, one with a LEFT JOIN and one with an inner JOIN, so a lookup
truncate must turn into updates with nulls in one and deletes in the other. Every
``Shop.run`` is a new streaming query on the same checkpoint, so its first batch reads the
state back from the checkpoint (``enrichment_state.state_tables``).
"""

from __future__ import annotations

import orjson
import yaml
from harness.topics import partition_records
from test_enrichment_state import Shop

from capture.postgres.events.source_block import postgres_source
from core.config import load_config
from derived_feeds.feed_job import await_query, start_feed
from derived_feeds.feed_spec import feed_spec
from log.base import Record, append_keyed, end_offsets
from log.envelope import ChangeEvent, Op, encode_value
from log.factory import open_log

JOIN = "SELECT o.id, o.amount, c.country FROM source o {} JOIN customers c ON o.customer_id = c.id WHERE o.amount > 0"
FEEDS = {"left": JOIN.format("LEFT"), "inner": JOIN.format("INNER")}


class TruncatingShop(Shop):
    """:class:`Shop` with enriched feeds ``feeds`` (of :data:`FEEDS`: LEFT and INNER join) and truncates."""

    def __init__(self, tmp_path, name: str, feeds: tuple[str, ...] = tuple(FEEDS)) -> None:
        super().__init__(tmp_path, name)
        self.feeds = feeds
        body = yaml.safe_load(self.config_path.read_text())
        lookups = {"customers": self.topics["customers"]}
        body["feeds"] = {
            feed: {"from": self.topics["orders"], "lookups": lookups, "sql": sql, "key": ["id"]}
            for feed, sql in FEEDS.items()
            if feed in feeds
        }
        self.config_path.write_text(yaml.safe_dump(body, sort_keys=False))

    def truncate(self, table: str) -> None:
        lsn = self.last_lsn = next(self.lsn)
        source = postgres_source(self.name, "db", "public", table, lsn, lsn, lsn, 0, 1_700_000_000_000_000 + lsn)
        with self.log() as log:
            append_keyed(log, self.topics[table], [Record(None, encode_value(ChangeEvent(Op.TRUNCATE, source)))])
        self.tables[table].clear()

    def run_feeds(self, spark) -> None:
        """One ``--available-now`` run of the feeds side by side (new queries: their first batch reads the state)."""
        config = load_config(self.config_path)
        log = open_log(config)
        try:
            started = [start_feed(spark, config, log, feed_spec(config, f), available_now=True) for f in self.feeds]
            for query, plan in started:
                await_query(query, plan)
        finally:
            log.close()

    def expected_of(self, feed: str) -> dict:
        rows = self.expected()
        return rows if feed == "left" else {i: row for i, row in rows.items() if row["country"] is not None}

    def events(self, feed: str, since: dict[int, int] | None = None) -> list[dict]:
        """The feed's events after offsets ``since`` (tombstones left out), in source order as a sink applies them."""
        with self.log() as log:
            records = [r for p in range(2) for r in partition_records(log, feed, p, (since or {}).get(p))]
        out = [orjson.loads(r.value) for r in records if r.value is not None]
        return sorted(out, key=lambda e: (e["source"]["commit_lsn"], e["source"]["txn_index"]))

    def fold(self, feed: str) -> dict:  # type: ignore[override]
        """The feed applied as a sink does: newest sequence wins, a truncate removes every older row."""
        state: dict = {}
        for event in self.events(feed):
            if event["op"] == "t":
                state.clear()
            elif event["op"] == "d":
                state.pop(event["before"]["id"], None)
            else:
                state[event["after"]["id"]] = event["after"]
        return state

    def check(self) -> None:
        for feed in self.feeds:
            assert self.fold(feed) == self.expected_of(feed), feed

    def marks(self) -> dict[str, dict[int, int]]:
        with self.log() as log:
            return {feed: end_offsets(log, feed) for feed in self.feeds}

    def since(self, marks: dict[str, dict[int, int]], feed: str) -> list[tuple]:
        """The events appended since ``marks`` as sorted ``(op, id, country)`` (id None for a truncate)."""
        new = self.events(feed, marks[feed])
        row = [(e["op"], (e["after"] or e["before"] or {}).get("id"), (e["after"] or {}).get("country")) for e in new]
        return sorted(row, key=repr)


def _start(shop: TruncatingShop, spark) -> None:
    shop.upsert("customers", {"id": 1, "country": "PT"}, {"id": 2, "country": "DE"}, {"id": 3, "country": "MX"})
    orders = [(10, 1, 100), (11, 2, 110), (12, 1, 120), (13, 3, 130), (14, 9, 140)]
    shop.upsert("orders", *[{"id": i, "customer_id": c, "amount": a} for i, c, a in orders])
    shop.run_feeds(spark)
    shop.check()


def test_a_lookup_truncate_then_reinserts_deletes_and_updates_exactly_the_rows_it_reaches(spark, unique_name, tmp_path):
    shop = TruncatingShop(tmp_path, unique_name("shop"))
    _start(shop, spark)
    marks = shop.marks()

    # One batch: the truncate, then customer 1 comes back with another country (and a new one, 4).
    shop.truncate("customers")
    shop.upsert("customers", {"id": 1, "country": "ES"}, {"id": 4, "country": "FR"})
    shop.run_feeds(spark)

    shop.check()
    assert shop.since(marks, "inner") == [("d", 11, None), ("d", 13, None), ("u", 10, "ES"), ("u", 12, "ES")]
    assert shop.since(marks, "left") == [("u", 10, "ES"), ("u", 11, None), ("u", 12, "ES"), ("u", 13, None)]


def test_a_source_truncate_deletes_the_rows_it_took_and_they_never_come_back(spark, unique_name, tmp_path):
    shop = TruncatingShop(tmp_path, unique_name("shop"), feeds=("inner",))
    _start(shop, spark)
    marks = shop.marks()

    shop.truncate("orders")
    shop.upsert("orders", {"id": 20, "customer_id": 1, "amount": 200})
    shop.run_feeds(spark)
    shop.check()
    # The feed is a maintained view: each row the truncate took away gets a delete (no truncate record).
    gone = [("d", order, None) for order in (10, 11, 12, 13)]  # 14 has no customer: never in the inner join
    assert shop.since(marks, "inner") == [("c", 20, "PT"), *gone]

    # A lookup change reaches only the order written after the truncate.
    marks = shop.marks()
    shop.upsert("customers", {"id": 1, "country": "ES"}, {"id": 2, "country": "XX"}, {"id": 3, "country": "YY"})
    shop.run_feeds(spark)
    shop.check()
    assert shop.since(marks, "inner") == [("u", 20, "ES")]


def test_truncates_read_back_from_the_checkpoint_after_a_restart(spark, unique_name, tmp_path):
    shop = TruncatingShop(tmp_path, unique_name("shop"), feeds=("left",))
    _start(shop, spark)

    # Both tables truncated, then orders of customers that no longer exist.
    shop.truncate("customers")
    shop.truncate("orders")
    shop.upsert("orders", {"id": 21, "customer_id": 3, "amount": 210}, {"id": 22, "customer_id": 2, "amount": 220})
    shop.run_feeds(spark)
    shop.check()

    # A new query: its batch reads the state, truncates included, back from the checkpoint. A
    # customer comes back (reaching order 22 only, not the truncated order 11); a new order
    # of truncated customer 1 finds no customer.
    marks = shop.marks()
    shop.upsert("customers", {"id": 2, "country": "NL"})
    shop.upsert("orders", {"id": 23, "customer_id": 1, "amount": 230})
    shop.run_feeds(spark)
    shop.check()
    assert shop.since(marks, "left") == [("c", 23, None), ("u", 22, "NL")]  # re-emitted rows are updates
