"""The demo's PostgreSQL shop: an embedded Postgres, the shop schema, a least-privilege capture role, a workload.

:class:`PostgresShop` is the ``postgres`` :class:`~operations.demo.DemoSource` of ``headwater demo``:
the role ``capture`` may log in, replicate and read; the table owner creates the publication
(capture never needs a superuser). Streamed changes include a TOASTed column left unchanged by an
update, a schema change and one big transaction.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import psycopg

from operations.embedded_postgres import EmbeddedPostgres

if TYPE_CHECKING:
    from operations.demo import DemoSettings

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


class PostgresShop:
    """The shop on an embedded PostgreSQL (``wal_level=logical``) in ``<demo>/postgres``."""

    kind = "postgres"
    server_name = "PostgreSQL"
    capture_settings = "wal_level=logical"
    #: Topics are ``shop.public.<table>``.
    topic_prefix = "shop.public"
    tables: tuple[str, ...] = TABLES

    def __init__(self, directory: Path) -> None:
        self.server = EmbeddedPostgres(directory / "postgres", timezone="Pacific/Auckland")
        self._dsn = ""

    def start(self) -> None:
        """Start the server and create the ``shop`` database."""
        self.server.start()
        self._dsn = self.server.create_database("shop")

    def stop(self) -> None:
        """Stop the server (a no-op when it is not running)."""
        self.server.stop()

    def create_shop(self, password: str, settings: DemoSettings) -> str:
        """The schema, the capture role and its publication, the seeded customers; returns the seed line."""
        with psycopg.connect(self._dsn, autocommit=True) as conn:
            conn.execute(SCHEMA)
            # Least privilege: the capture role can log in, replicate and read; the table
            # owner creates the publication (capture never needs a superuser).
            conn.execute(f"CREATE ROLE capture WITH LOGIN REPLICATION PASSWORD '{password}'")
            conn.execute("GRANT SELECT ON customers, orders, order_items TO capture")
            conn.execute(
                "CREATE PUBLICATION headwater_shop FOR TABLE customers, orders, order_items "
                "WITH (publish_via_partition_root = true)"
            )
            return _seed(conn, settings)

    def capture_dsn(self, password_var: str) -> str:
        """The capture role's DSN, its password a ``${VAR}`` reference."""
        return f"postgresql://capture:${{{password_var}}}@{self.server.host}:{self.server.port}/shop"

    def workload(self, settings: DemoSettings) -> list[str]:
        """Run the streamed changes; returns a line per step."""
        with psycopg.connect(self._dsn, autocommit=True) as conn:
            return _workload(conn, settings)
