"""``headwater demo``: an embedded Postgres with a sample shop, run through the pipeline.

Composition only: it starts :class:`~operations.embedded_postgres.EmbeddedPostgres`,
creates the shop schema, registers it with a least-privilege role through
:func:`capture.postgres.registration.registry.add_source`, drives a workload and runs the stages that
exist. Every run starts from a clean demo directory, so running it twice works.

Stage libraries (psycopg, pyspark, deltalake behind them) are imported inside the functions
that need them, so a process that uses one part of this module does not load the others.
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from core.config import load_config
from operations.embedded_postgres import EmbeddedPostgres
from operations.scaffold import init_project

PASSWORD_VAR = "HEADWATER_DEMO_PASSWORD"
TABLES = ("public.customers", "public.orders", "public.order_items")

SCHEMA = """
CREATE TYPE order_status AS ENUM ('new', 'paid', 'shipped', 'cancelled');
CREATE TABLE customers (
    id          bigint PRIMARY KEY,
    email       text NOT NULL,
    country     text,
    balance     numeric(12,2) NOT NULL DEFAULT 0,
    tags        text[],
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE orders (
    id          bigint PRIMARY KEY,
    customer_id bigint NOT NULL REFERENCES customers(id),
    status      order_status NOT NULL DEFAULT 'new',
    total       numeric(12,2) NOT NULL,
    details     jsonb,
    notes       text,
    ordered_at  timestamptz NOT NULL DEFAULT now()
);
ALTER TABLE orders ALTER COLUMN notes SET STORAGE EXTERNAL;
CREATE TABLE order_items (
    order_id    bigint NOT NULL REFERENCES orders(id) ON DELETE CASCADE,
    line        int NOT NULL,
    sku         text NOT NULL,
    quantity    int NOT NULL,
    unit_price  numeric(10,2) NOT NULL,
    PRIMARY KEY (order_id, line)
);
"""


#: The derived feeds, warehouse tables and quality suites the demo adds to its config.
PIPELINE_YAML = """
feeds:
  orders_enriched:
    from: shop.public.orders
    lookups: {customers: shop.public.customers}
    sql: >-
      SELECT o.id, o.customer_id, c.country, CAST(o.status AS STRING) AS status, o.total
      FROM source o JOIN customers c ON c.id = o.customer_id
      WHERE o.status <> 'cancelled'
    key: [id]
    expectations:
      - {expect: expect_column_values_to_be_between, column: total, min_value: 1, action: drop}
warehouse:
  tables:
    customers:    {from: shop.public.customers, mode: scd1}
    orders:       {from: orders_enriched, mode: scd1}
    orders_hist:  {from: shop.public.orders, mode: scd2}
quality:
  customers:
    - {expect: expect_column_values_to_be_unique, column: id, blocking: true}
    - {expect: expect_column_values_to_match_regex, column: email, regex: '^[^@]+@[^@]+$'}
  orders:
    - {expect: expect_column_values_to_not_be_null, column: country}
    - {expect: expect_column_values_to_be_in_set, column: status, value_set: [new, paid, shipped]}
"""

#: Queries printed at the end (warehouse tables by name).
DEMO_QUERIES = (
    (
        "revenue by country (orders, SCD1 from the enriched feed)",
        "SELECT country, count(*) AS orders, round(sum(CAST(total AS DOUBLE)), 2) AS revenue FROM orders "
        "GROUP BY 1 ORDER BY 3 DESC",
    ),
    (
        "order history (SCD2): versions per status",
        "SELECT status, count(*) AS versions, count(*) FILTER (WHERE __END_AT IS NULL) AS current FROM orders_hist "
        "GROUP BY 1 ORDER BY 1",
    ),
)


def configure_pipeline(config_path: Path) -> None:
    """Add the demo's feeds, warehouse tables and quality suites to its config (comments kept)."""
    from ruamel.yaml import YAML

    yaml = YAML()
    document = yaml.load(config_path.read_text(encoding="utf-8"))
    for key, value in yaml.load(PIPELINE_YAML).items():
        document[key] = value
    with config_path.open("w", encoding="utf-8") as handle:
        yaml.dump(document, handle)
    load_config(config_path)


@dataclass
class DemoSettings:
    """How big the demo is (CI uses a smaller one)."""

    customers: int = 2_000
    orders: int = 5_000
    big_transaction_rows: int = 20_000


@dataclass
class DemoResult:
    """What the demo did, for the summary and tests."""

    directory: Path
    config_path: Path
    steps: list[str] = field(default_factory=list)


def _seed(conn: psycopg.Connection[tuple[object, ...]], settings: DemoSettings) -> str:
    """Customers that exist before capture starts: they arrive through the initial snapshot."""
    conn.execute(
        "INSERT INTO customers (id, email, country, balance, tags) "
        "SELECT g, 'customer' || g || '@example.com', (ARRAY['NZ','FR','DE','US','JP'])[1 + g %% 5], "
        "round((g %% 97) * 3.25, 2), ARRAY['tier' || (g %% 3)] FROM generate_series(1, %s) g",
        (settings.customers,),
    )
    return f"seeded {settings.customers} customers (captured by the initial snapshot)"


def _workload(conn: psycopg.Connection[tuple[object, ...]], settings: DemoSettings) -> list[str]:
    """Streamed changes: inserts, updates, deletes, a schema change and one big transaction."""
    done = []
    conn.execute(
        "INSERT INTO orders (id, customer_id, status, total, details, notes) "
        "SELECT g, 1 + g %% %s, 'new', round((g %% 500) * 1.1, 2), "
        "jsonb_build_object('channel', (ARRAY['web','app','store'])[1 + g %% 3], 'gift', g %% 7 = 0), "
        "CASE WHEN g %% 100 = 0 THEN repeat(md5(g::text), 400) END "
        "FROM generate_series(1, %s) g",
        (settings.customers, settings.orders),
    )
    conn.execute(
        "INSERT INTO order_items SELECT o, l, 'SKU-' || (o * l %% 50), 1 + l %% 3, round(2.5 * l, 2) "
        "FROM generate_series(1, %s) o, generate_series(1, 3) l",
        (settings.orders,),
    )
    done.append(f"inserted {settings.orders} orders and {settings.orders * 3} order items")
    conn.execute("UPDATE orders SET status = 'paid' WHERE id % 2 = 0")
    conn.execute("UPDATE orders SET status = 'shipped', total = total + 1 WHERE id % 10 = 0")  # notes: TOAST unchanged
    conn.execute("UPDATE customers SET balance = balance + 10 WHERE country = 'NZ'")
    done.append("updated order statuses (TOASTed notes unchanged) and NZ balances")
    conn.execute("DELETE FROM orders WHERE id % 50 = 1")
    done.append("deleted every 50th order (items cascade)")
    conn.execute("ALTER TABLE customers ADD COLUMN loyalty_points int DEFAULT 0")
    conn.execute("UPDATE customers SET loyalty_points = id % 1000 WHERE id <= 100")
    done.append("schema change: customers.loyalty_points added and set")
    with conn.transaction():
        first = settings.customers + 1
        conn.execute(
            "INSERT INTO customers (id, email, country, balance) "
            "SELECT g, 'bulk' || g || '@example.com', 'NZ', 0 FROM generate_series(%s::bigint, %s::bigint) g",
            (first, first + settings.big_transaction_rows - 1),
        )
    done.append(f"one big transaction: {settings.big_transaction_rows} customers")
    return done


def run_demo(
    directory: Path,
    settings: DemoSettings | None = None,
    *,
    say: Callable[[str], None] = print,
    capture: Callable[[Path], str] | None = None,
    pipeline: Callable[[Path], list[str]] | None = None,
) -> DemoResult:
    """Run the demo in ``directory`` (wiped first).

    ``capture`` runs the capture stage (after registration and after the workload);
    ``pipeline`` runs everything after capture (feeds, loads, queries, quality) while the
    embedded Postgres is still up.
    """
    settings = settings or DemoSettings()
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    config_path = init_project(directory, "shop_demo")
    result = DemoResult(directory, config_path)
    password = secrets.token_hex(12)
    os.environ[PASSWORD_VAR] = password
    server = EmbeddedPostgres(directory / "postgres", timezone="Pacific/Auckland")
    say("starting embedded PostgreSQL (wal_level=logical)")
    server.start()
    try:
        dsn = server.create_database("shop")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(SCHEMA)
            # Least privilege: the capture role can log in, replicate and read; the table
            # owner creates the publication (capture never needs a superuser).
            conn.execute(f"CREATE ROLE capture WITH LOGIN REPLICATION PASSWORD '{password}'")
            conn.execute("GRANT SELECT ON customers, orders, order_items TO capture")
            conn.execute(
                "CREATE PUBLICATION headwater_shop FOR TABLE customers, orders, order_items "
                "WITH (publish_via_partition_root = true)"
            )
            result.steps.append(_seed(conn, settings))
            say(result.steps[-1])
        capture_dsn = f"postgresql://capture:${{{PASSWORD_VAR}}}@{server.host}:{server.port}/shop"
        from capture.kinds import source_kind
        from capture.source_kind import SourceRequest

        request = SourceRequest("shop", capture_dsn, tables=TABLES)
        source_kind("postgres").add(config_path, request, confirm=lambda _plan: True)
        result.steps.append(f"registered source shop ({', '.join(TABLES)}) as least-privilege role 'capture'")
        say(result.steps[-1])
        if capture is not None:
            result.steps.append(capture(config_path))
            say(result.steps[-1])
        with psycopg.connect(dsn, autocommit=True) as conn:
            for step in _workload(conn, settings):
                result.steps.append(step)
                say(step)
        if capture is not None:
            summary = capture(config_path)
            result.steps.append(summary)
            say(summary)
        if pipeline is not None:
            configure_pipeline(config_path)
            for line in pipeline(config_path):
                result.steps.append(line)
                say(line)
    finally:
        server.stop()
    return result
