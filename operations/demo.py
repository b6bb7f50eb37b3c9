"""``headwater demo``: an embedded source database with a sample shop, run through the pipeline.

Composition only: it starts the demo's source (:class:`DemoSource`: an embedded PostgreSQL,
:class:`operations.demo_postgres.PostgresShop`, or with ``kind="mysql"`` an embedded MariaDB,
:class:`operations.demo_mysql.MariaDbShop`), creates the shop with a least-privilege capture
account, registers it through its kind's ``add`` (the prerequisite checks of ``source add``),
drives a workload and runs the stages. Every run starts from a clean demo directory, so running
it twice works.

Stage libraries (psycopg, pymysql, pyspark, deltalake behind them) are imported inside the
functions that need them, so a process that uses one part of this module does not load the others.
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from core.config import load_config
from operations.scaffold import init_project

PASSWORD_VAR = "HEADWATER_DEMO_PASSWORD"
#: The source kinds the demo can run on.
DemoKind = Literal["postgres", "mysql"]


class DemoSource(Protocol):
    """The demo's source database: started, given the shop and its capture account, then the workload."""

    #: The source kind (``sources.shop.kind``).
    kind: str
    #: What the server is called in the demo's lines, and the setting capture needs of it.
    server_name: str
    capture_settings: str
    #: ``<source>.<schema or database>``: the shop's topics are ``<topic_prefix>.<table>``.
    topic_prefix: str
    #: The captured tables, as ``source add --tables`` takes them.
    tables: tuple[str, ...]

    def start(self) -> None:
        """Start the embedded server."""

    def stop(self) -> None:
        """Stop it (a no-op when it is not running)."""

    def create_shop(self, password: str, settings: DemoSettings) -> str:
        """Create the shop and the capture account with ``password``, seed it; returns the seed line."""

    def capture_dsn(self, password_var: str) -> str:
        """The capture account's DSN, its password the ``${password_var}`` reference."""

    def workload(self, settings: DemoSettings) -> list[str]:
        """Run the streamed changes; returns a line per step."""


def demo_source(kind: DemoKind, directory: Path) -> DemoSource:
    """The demo's source of ``kind``, its server kept under ``directory``."""
    if kind == "mysql":
        from operations.demo_mysql import MariaDbShop

        return MariaDbShop(directory)
    from operations.demo_postgres import PostgresShop

    return PostgresShop(directory)


#: The derived feeds, warehouse tables and quality suites the demo adds to its config (``{prefix}``: the topics').
PIPELINE_YAML = """
feeds:
  orders_enriched:
    from: {prefix}.orders
    lookups: {{customers: {prefix}.customers}}
    sql: >-
      SELECT o.id, o.customer_id, c.country, CAST(o.status AS STRING) AS status, o.total
      FROM source o JOIN customers c ON c.id = o.customer_id
      WHERE o.status <> 'cancelled'
    key: [id]
    expectations:
      - {{expect: expect_column_values_to_be_between, column: total, min_value: 1, action: drop}}
warehouse:
  tables:
    customers:    {{from: {prefix}.customers, mode: scd1}}
    orders:       {{from: orders_enriched, mode: scd1}}
    orders_hist:  {{from: {prefix}.orders, mode: scd2}}
quality:
  customers:
    - {{expect: expect_column_values_to_be_unique, column: id, blocking: true}}
    - {{expect: expect_column_values_to_match_regex, column: email, regex: '^[^@]+@[^@]+$'}}
  orders:
    - {{expect: expect_column_values_to_not_be_null, column: country}}
    - {{expect: expect_column_values_to_be_in_set, column: status, value_set: [new, paid, shipped]}}
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


def configure_pipeline(config_path: Path, topic_prefix: str = "shop.public") -> None:
    """Add the demo's feeds, warehouse tables and quality suites to its config (comments kept)."""
    from ruamel.yaml import YAML

    yaml = YAML()
    document = yaml.load(config_path.read_text(encoding="utf-8"))
    for key, value in yaml.load(PIPELINE_YAML.format(prefix=topic_prefix)).items():
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
    #: What the demo's server is called, and the shop's topics' ``<source>.<schema or database>``.
    server_name: str = "PostgreSQL"
    topic_prefix: str = "shop.public"
    steps: list[str] = field(default_factory=list)


def run_demo(
    directory: Path,
    settings: DemoSettings | None = None,
    *,
    kind: DemoKind = "postgres",
    say: Callable[[str], None] = print,
    capture: Callable[[Path], str] | None = None,
    pipeline: Callable[[Path], list[str]] | None = None,
) -> DemoResult:
    """Run the demo in ``directory`` (wiped first) on a source of ``kind``.

    ``capture`` runs the capture stage (after registration and after the workload);
    ``pipeline`` runs everything after capture (feeds, loads, queries, quality) while the
    embedded server is still up.
    """
    settings = settings or DemoSettings()
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    config_path = init_project(directory, "shop_demo")
    source = demo_source(kind, directory)
    result = DemoResult(directory, config_path, source.server_name, source.topic_prefix)
    password = secrets.token_hex(12)
    os.environ[PASSWORD_VAR] = password
    say(f"starting embedded {source.server_name} ({source.capture_settings})")
    source.start()
    try:
        result.steps.append(source.create_shop(password, settings))
        say(result.steps[-1])
        from capture.kinds import source_kind
        from capture.source_kind import SourceRequest

        request = SourceRequest("shop", source.capture_dsn(PASSWORD_VAR), tables=source.tables)
        source_kind(source.kind).add(config_path, request, confirm=lambda _plan: True)
        result.steps.append(f"registered source shop ({', '.join(source.tables)}) as least-privilege account 'capture'")
        say(result.steps[-1])
        if capture is not None:
            result.steps.append(capture(config_path))
            say(result.steps[-1])
        for step in source.workload(settings):
            result.steps.append(step)
            say(step)
        if capture is not None:
            summary = capture(config_path)
            result.steps.append(summary)
            say(summary)
        if pipeline is not None:
            configure_pipeline(config_path, source.topic_prefix)
            for line in pipeline(config_path):
                result.steps.append(line)
                say(line)
    finally:
        source.stop()
    return result
