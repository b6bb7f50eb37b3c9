"""The demo's MariaDB shop (``headwater demo --kind mysql``): an embedded MariaDB, the shop, a capture account.

:class:`MariaDbShop` is the ``mysql`` :class:`~operations.demo.DemoSource`: the same shop and
workload as the PostgreSQL demo in MariaDB's types (an ENUM status, JSON details, DECIMAL
money, DATETIME(6) times; no array column), captured from the binlog by a least-privilege account (``REPLICATION
SLAVE, BINLOG MONITOR`` and ``SELECT`` on the shop: what ``source add`` checks). Topics are
``shop.shop.<table>`` (source ``shop``, database ``shop``). The server is
:class:`~operations.embedded_mariadb.EmbeddedMariaDB` in ``<demo>/mariadb``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pymysql

from operations.embedded_mariadb import EmbeddedMariaDB

if TYPE_CHECKING:
    from operations.demo import DemoSettings

TABLES = ("shop.customers", "shop.orders", "shop.order_items")

SCHEMA = (
    """CREATE TABLE customers (
    id          BIGINT PRIMARY KEY,
    email       VARCHAR(255) NOT NULL,
    country     VARCHAR(2),
    balance     DECIMAL(12,2) NOT NULL DEFAULT 0,
    created_at  DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
)""",
    """CREATE TABLE orders (
    id          BIGINT PRIMARY KEY,
    customer_id BIGINT NOT NULL,
    status      ENUM('new', 'paid', 'shipped', 'cancelled') NOT NULL DEFAULT 'new',
    total       DECIMAL(12,2) NOT NULL,
    details     JSON,
    notes       MEDIUMTEXT,
    ordered_at  DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    FOREIGN KEY (customer_id) REFERENCES customers(id)
)""",
    """CREATE TABLE order_items (
    order_id    BIGINT NOT NULL,
    line        INT NOT NULL,
    sku         VARCHAR(32) NOT NULL,
    quantity    INT NOT NULL,
    unit_price  DECIMAL(10,2) NOT NULL,
    PRIMARY KEY (order_id, line),
    FOREIGN KEY (order_id) REFERENCES orders(id) ON DELETE CASCADE
)""",
)


def _seed(cur: Any, settings: DemoSettings) -> str:
    """Customers that exist before capture starts: they arrive through the initial snapshot."""
    cur.execute(
        "INSERT INTO customers (id, email, country, balance) "
        "SELECT seq, concat('customer', seq, '@example.com'), elt(1 + seq % 5, 'NZ', 'FR', 'DE', 'US', 'JP'), "
        f"round((seq % 97) * 3.25, 2) FROM seq_1_to_{settings.customers:d}"
    )
    return f"seeded {settings.customers} customers (captured by the initial snapshot)"


def _workload(cur: Any, settings: DemoSettings) -> list[str]:
    """Streamed changes: inserts, updates, deletes, a schema change and one big transaction."""
    done = []
    cur.execute(
        "INSERT INTO orders (id, customer_id, status, total, details, notes) "
        f"SELECT seq, 1 + seq % {settings.customers:d}, 'new', round((seq % 500) * 1.1, 2), "
        "json_object('channel', elt(1 + seq % 3, 'web', 'app', 'store'), 'gift', seq % 7 = 0), "
        "CASE WHEN seq % 100 = 0 THEN repeat(md5(seq), 400) END "
        f"FROM seq_1_to_{settings.orders:d}"
    )
    cur.execute(
        "INSERT INTO order_items SELECT o.seq, l.seq, concat('SKU-', o.seq * l.seq % 50), 1 + l.seq % 3, "
        f"round(2.5 * l.seq, 2) FROM seq_1_to_{settings.orders:d} o, seq_1_to_3 l"
    )
    done.append(f"inserted {settings.orders} orders and {settings.orders * 3} order items")
    cur.execute("UPDATE orders SET status = 'paid' WHERE id % 2 = 0")
    cur.execute("UPDATE orders SET status = 'shipped', total = total + 1 WHERE id % 10 = 0")
    cur.execute("UPDATE customers SET balance = balance + 10 WHERE country = 'NZ'")
    done.append("updated order statuses and NZ balances")
    # A row-based binlog has no events for the rows an ON DELETE CASCADE removes (InnoDB deletes them
    # below the binlog; Debezium's MySQL connector misses them alike): the items go first, explicitly.
    cur.execute("BEGIN")
    cur.execute("DELETE FROM order_items WHERE order_id % 50 = 1")
    cur.execute("DELETE FROM orders WHERE id % 50 = 1")
    cur.execute("COMMIT")
    done.append("deleted every 50th order and its items (one transaction)")
    cur.execute("ALTER TABLE customers ADD COLUMN loyalty_points INT DEFAULT 0")
    cur.execute("UPDATE customers SET loyalty_points = id % 1000 WHERE id <= 100")
    done.append("schema change: customers.loyalty_points added and set")
    first = settings.customers + 1
    last = first + settings.big_transaction_rows - 1
    cur.execute("BEGIN")
    cur.execute(
        "INSERT INTO customers (id, email, country, balance) "
        f"SELECT seq, concat('bulk', seq, '@example.com'), 'NZ', 0 FROM seq_{first:d}_to_{last:d}"
    )
    cur.execute("COMMIT")
    done.append(f"one big transaction: {settings.big_transaction_rows} customers")
    return done


class MariaDbShop:
    """The shop on an embedded MariaDB (binlog ROW, FULL images and metadata) in ``<demo>/mariadb``."""

    kind = "mysql"
    server_name = "MariaDB"
    capture_settings = "binlog_format=ROW"
    #: Topics are ``shop.shop.<table>``.
    topic_prefix = "shop.shop"
    tables: tuple[str, ...] = TABLES

    def __init__(self, directory: Path) -> None:
        self.server = EmbeddedMariaDB(directory / "mariadb", timezone="Pacific/Auckland")

    def start(self) -> None:
        """Start the server (initialised on the first start)."""
        self.server.start()

    def stop(self) -> None:
        """Stop the server (a no-op when it is not running)."""
        self.server.stop()

    def _connect(self) -> Any:
        return pymysql.connect(**self.server.connect_args(), autocommit=True)

    def create_shop(self, password: str, settings: DemoSettings) -> str:
        """The database, its schema, the capture account, the seeded customers; returns the seed line."""
        with self._connect() as conn, conn.cursor() as cur:
            cur.execute("CREATE DATABASE shop CHARACTER SET utf8mb4")
            cur.execute("USE shop")
            for statement in SCHEMA:
                cur.execute(statement)
            cur.execute("CREATE USER 'capture'@'127.0.0.1' IDENTIFIED BY %s", (password,))
            cur.execute("GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* TO 'capture'@'127.0.0.1'")
            cur.execute("GRANT SELECT ON shop.* TO 'capture'@'127.0.0.1'")
            return _seed(cur, settings)

    def capture_dsn(self, password_var: str) -> str:
        """The capture account's DSN, its password a ``${VAR}`` reference."""
        return f"mysql://capture:${{{password_var}}}@{self.server.host}:{self.server.port}/shop"

    def workload(self, settings: DemoSettings) -> list[str]:
        """Run the streamed changes; returns a line per step."""
        with self._connect() as conn, conn.cursor() as cur:
            cur.execute("USE shop")
            return _workload(cur, settings)
