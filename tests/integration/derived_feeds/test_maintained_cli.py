"""Maintained views through the real CLI against Postgres: an aggregate, a join-keyed aggregate and a join.

``headwater capture`` and ``headwater feeds run`` run as processes, as an operator runs them;
after each round every feed's topic, folded as a sink applies it, must equal the same SQL
run by Postgres over its tables. Refusals and a non-unique key end the run with one line.
"""

from __future__ import annotations

import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import yaml
from harness.topics import partition_records

from core.config import load_config
from log.factory import open_log

SHOP = """
CREATE TABLE customers (id int PRIMARY KEY, country text);
CREATE TABLE orders (id int PRIMARY KEY, customer_id int, status text, amount numeric(10,2));
INSERT INTO customers VALUES (1, 'PT'), (2, 'DE'), (3, 'MX');
INSERT INTO orders SELECT i, 1 + i % 3, (ARRAY['new','paid','sent'])[1 + i % 3], i * 1.25 FROM generate_series(1, 30) i;
"""
JOIN = "FROM {orders} o JOIN customers c ON o.customer_id = c.id"
FEEDS = {
    "orders_by_status": (
        "SELECT status, count(*) AS n, sum(amount) AS total FROM {orders} GROUP BY status",
        ["status"],
        "aggregate",
    ),
    "revenue_by_country": (
        f"SELECT c.country, count(*) AS n, sum(o.amount) AS total, max(o.amount) AS top {JOIN} GROUP BY c.country",
        ["country"],
        "aggregate over join",
    ),
    "orders_enriched": (f"SELECT o.id, o.status, o.amount, c.country {JOIN}", ["id"], "join"),
}


class Project:
    def __init__(self, tmp_path: Path, name: str, dsn: str) -> None:
        self.name = name
        self.config = tmp_path / "headwater.yaml"
        orders = f"{name}.public.orders"
        feeds: dict[str, Any] = {}
        for feed, (sql, key, _) in FEEDS.items():
            feeds[feed] = {"from": orders, "sql": sql.format(orders="source"), "key": key}
            if "customers" in sql:
                feeds[feed]["lookups"] = {"customers": f"{name}.public.customers"}
        body = {
            "project": "t",
            "home": str(tmp_path / "home"),
            "log": {"partitions": 2},
            "sources": {name: {"dsn": dsn, "tables": ["public.customers", "public.orders"]}},
            "feeds": feeds,
        }
        self.config.write_text(yaml.safe_dump(body, sort_keys=False))

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "headwater", "--config", str(self.config), *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=600, env=dict(os.environ), check=False)

    def round(self) -> str:
        captured = self.cli("capture", self.name, "--until-caught-up")
        assert captured.returncode == 0, captured.stderr
        ran = self.cli("feeds", "run", "--available-now")
        assert ran.returncode == 0, ran.stderr
        return ran.stdout

    def fold(self, feed: str) -> dict[str, dict[str, Any]]:
        log = open_log(load_config(self.config))
        try:
            records = [r for p in range(2) for r in partition_records(log, feed, p)]
        finally:
            log.close()
        state: dict[str, dict[str, Any]] = {}
        for record in records:
            event = orjson.loads(record.value) if record.value is not None else None
            if event is None or event["op"] == "d":
                state.pop(record.key.decode(), None)
            else:
                state[record.key.decode()] = event["after"]
        return state


def expected(db: Any, feed: str) -> dict[str, dict[str, Any]]:
    sql, key, _ = FEEDS[feed]
    cursor = db.connect().cursor()
    cursor.execute(sql.format(orders="orders"))
    names = [d.name for d in cursor.description]
    out = {}
    for values in cursor.fetchall():
        row = {n: f"{v:.2f}" if isinstance(v, Decimal) else v for n, v in zip(names, values, strict=True)}
        out[orjson.dumps({k: row[k] for k in key}).decode()] = row
    return out


def check(project: Project, db: Any) -> None:
    for feed in FEEDS:
        assert project.fold(feed) == expected(db, feed), feed


def test_aggregate_join_keyed_aggregate_and_join_through_the_cli(pg_database, unique_name, tmp_path):
    name = unique_name("shop")
    pg_database.execute(SHOP)
    pg_database.execute(f"CREATE PUBLICATION headwater_{name} FOR TABLE customers, orders")
    project = Project(tmp_path, name, pg_database.dsn)
    out = project.round()
    for feed, (_, _, plan_class) in FEEDS.items():
        assert f"{feed} -> {feed} ({plan_class}):" in out, out
    check(project, pg_database)

    # Orders move between statuses and customers, one changes its key, some go; a customer moves
    # country, one is deleted (its orders leave the inner join), one arrives.
    pg_database.execute("UPDATE orders SET status = 'paid', amount = amount + 100 WHERE id % 4 = 0")
    pg_database.execute("UPDATE orders SET customer_id = 4 WHERE id IN (5, 7)")
    pg_database.execute("UPDATE orders SET id = 99 WHERE id = 2")
    pg_database.execute("DELETE FROM orders WHERE id IN (3, 6, 9)")
    pg_database.execute("UPDATE customers SET country = 'PT' WHERE id = 2")
    pg_database.execute("DELETE FROM customers WHERE id = 3")
    pg_database.execute("INSERT INTO customers VALUES (4, 'ES')")
    pg_database.execute("DELETE FROM orders WHERE status = 'sent'")  # a group disappears
    project.round()
    check(project, pg_database)
    assert '{"status":"sent"}' not in project.fold("orders_by_status")
    assert '{"country":"DE"}' not in project.fold("revenue_by_country")

    # Nothing changed: nothing is written.
    ends = {feed: len(project.fold(feed)) for feed in FEEDS}
    out = project.cli("feeds", "run", "--available-now").stdout
    assert all(f"{feed} -> {feed} (" in out for feed in FEEDS)
    assert "0 upserts, 0 deletes" in out or "0 batch(es)" in out, out
    assert {feed: len(project.fold(feed)) for feed in FEEDS} == ends


def test_a_key_that_is_not_unique_ends_the_run_with_one_line(pg_database, unique_name, tmp_path):
    """Two rows of the SQL with one key: the feed stops before writing (refusals: ``test_plan_class``)."""
    name = unique_name("shop")
    pg_database.execute(SHOP)
    pg_database.execute(f"CREATE PUBLICATION headwater_{name} FOR TABLE customers, orders")
    project = Project(tmp_path, name, pg_database.dsn)
    body = yaml.safe_load(project.config.read_text())
    orders, customers = f"{name}.public.orders", f"{name}.public.customers"
    sql = "SELECT c.country, o.amount FROM source o JOIN customers c ON o.customer_id = c.id"
    body["feeds"] = {
        "by_country": {"from": orders, "lookups": {"customers": customers}, "sql": sql, "key": ["country"]}
    }
    project.config.write_text(yaml.safe_dump(body, sort_keys=False))
    assert project.cli("capture", name, "--until-caught-up").returncode == 0
    ran = project.cli("feeds", "run", "--available-now")
    assert ran.returncode == 3, ran
    assert ran.stderr.count("\n") == 1 and "rows of its SQL have the key" in ran.stderr, ran.stderr
    assert project.fold("by_country") == {}, "nothing of the batch was written"
