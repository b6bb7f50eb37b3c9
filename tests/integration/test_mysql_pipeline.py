"""One project, a PostgreSQL and a MariaDB source: a feed joins a table of each; loads and query downstream.

Through the real CLI: both sources are added (``source add``, ``--kind mysql`` for MariaDB), then
``headwater run --until-caught-up`` captures both, runs a maintained-view feed joining MariaDB's
``orders`` with PostgreSQL's ``customers``, and loads SCD1/SCD2 tables from the MySQL topic and the
feed. After changes on both sides and a second run, the feed's table equals the same join computed
over both databases' final rows, and the SCD1 table equals MariaDB's table.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from operations.scaffold import init_project


def headwater(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "headwater", "--config", str(config), *args],
        capture_output=True,
        text=True,
        timeout=900,
        stdin=subprocess.DEVNULL,
        env=dict(os.environ),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    print(f"headwater {' '.join(args[:2])}: {time.monotonic() - started:.1f} s")
    return result


def query(config: Path, sql: str) -> list[dict[str, Any]]:
    return orjson.loads(headwater(config, "query", sql, "--format", "json").stdout)


def expected_join(pg_database: Any, mariadb_database: Any) -> list[dict[str, Any]]:
    """The feed's SQL over both sources' current rows, computed here from the databases themselves."""
    customers = {
        i: (name, country) for i, name, country in pg_database.execute("SELECT id, name, country FROM customers")
    }
    rows = []
    for order_id, customer, total in mariadb_database.execute("SELECT id, customer, total FROM orders"):
        if customer in customers:
            name, country = customers[customer]
            rows.append({"order_id": order_id, "name": name, "country": country, "total": f"{Decimal(total):.2f}"})
    return sorted(rows, key=lambda r: r["order_id"])


@pytest.mark.timeout(1200)  # two whole-pipeline runs (capture of two sources, a feed, three loads)
def test_a_feed_joins_a_mariadb_table_with_a_postgres_table(
    pg_database: Any, mariadb_database: Any, unique_name: Any, tmp_path: Path
) -> None:
    pg_database.execute("CREATE TABLE customers (id int PRIMARY KEY, name text, country text)")
    pg_database.execute("INSERT INTO customers VALUES (1, 'ann', 'NZ'), (2, 'bob', 'DE'), (3, 'cy', 'FR')")
    mariadb_database.script(
        "CREATE TABLE orders (id INT PRIMARY KEY, customer INT, total DECIMAL(10,2), placed DATETIME(6))",
        "INSERT INTO orders VALUES (10, 1, 9.99, '2026-01-01 10:00:00'), (11, 2, 20.00, '2026-01-02 11:00:00.5'), "
        "(12, 9, 1.00, '2026-01-03 12:00:00')",
    )
    init_project(tmp_path)
    config = tmp_path / "headwater.yaml"
    pg, my = unique_name("pg"), unique_name("my")
    headwater(config, "source", "add", pg, "--dsn", pg_database.dsn, "--tables", "public.customers", "--yes")
    db = mariadb_database.name
    headwater(
        config,
        "source",
        "add",
        my,
        "--kind",
        "mysql",
        "--dsn",
        mariadb_database.dsn,
        "--tables",
        f"{db}.orders",
        "--yes",
    )
    document = yaml.safe_load(config.read_text())
    orders, customers = f"{my}.{db}.orders", f"{pg}.public.customers"
    document["feeds"] = {
        "order_owners": {
            "from": orders,
            "lookups": {"customers": customers},
            "sql": "SELECT o.id AS order_id, c.name, c.country, o.total FROM source o "
            "JOIN customers c ON c.id = o.customer",
            "key": ["order_id"],
        }
    }
    document["warehouse"] = {
        "tables": {
            "orders_now": {"from": orders, "mode": "scd1"},
            "orders_hist": {"from": orders, "mode": "scd2"},
            "owners": {"from": "order_owners", "mode": "scd1"},
        }
    }
    config.write_text(yaml.safe_dump(document))

    headwater(config, "run", "--until-caught-up")
    assert query(
        config, "SELECT order_id, name, country, CAST(total AS VARCHAR) AS total FROM owners ORDER BY order_id"
    ) == [{**row, "total": row["total"]} for row in expected_join(pg_database, mariadb_database)]

    # Changes on both sides: a customer moves, an order is re-assigned, one deleted, one added.
    pg_database.execute("UPDATE customers SET country = 'AU' WHERE id = 1")
    pg_database.execute("INSERT INTO customers VALUES (9, 'di', 'JP')")
    mariadb_database.script(
        "UPDATE orders SET customer = 3, total = 21.50 WHERE id = 11",
        "DELETE FROM orders WHERE id = 10",
        "INSERT INTO orders VALUES (13, 2, 5.25, '2026-01-04 00:00:00')",
    )
    headwater(config, "run", "--until-caught-up")
    owners = query(
        config, "SELECT order_id, name, country, CAST(total AS VARCHAR) AS total FROM owners ORDER BY order_id"
    )
    assert owners == expected_join(pg_database, mariadb_database)

    now = query(config, "SELECT id, customer, CAST(total AS VARCHAR) AS total FROM orders_now ORDER BY id")
    source = mariadb_database.execute("SELECT id, customer, total FROM orders ORDER BY id")
    assert now == [{"id": i, "customer": c, "total": f"{Decimal(t):.2f}"} for i, c, t in source]
    history = query(config, "SELECT id, count(*) AS versions FROM orders_hist GROUP BY id ORDER BY id")
    assert {r["id"]: r["versions"] for r in history} == {10: 1, 11: 2, 12: 1, 13: 1}
