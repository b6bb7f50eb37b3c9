"""Session-scoped real services for the integration tests (started lazily, stopped at exit).

* ``pg_server``: one PostgreSQL cluster (wal_level=logical) run as an unprivileged OS
  user when the tests run as root, in an unusual time zone so time bugs show.
* ``unique_name``: Postgres- and Kafka-safe names, unique per test (slots, publications,
  databases, topics).
* ``spark``: one lean local[2] Spark session for the whole run.
"""

from __future__ import annotations

import hashlib
import itertools
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

_RUN = uuid.uuid4().hex[:6]
_COUNTER = itertools.count()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/integration" in str(item.path).replace("\\", "/"):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def pg_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from headwater.embedded_postgres import EmbeddedPostgres

    server = EmbeddedPostgres(
        Path(tmp_path_factory.mktemp("pg")) / "data",
        timezone="Pacific/Chatham",
        settings={"fsync": "off", "max_replication_slots": "40", "max_wal_senders": "40"},
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def unique_name(request: pytest.FixtureRequest) -> Callable[[str], str]:
    digest = hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:6]

    def make(prefix: str = "hw") -> str:
        return f"{prefix}_{_RUN}_{digest}_{next(_COUNTER)}"

    return make


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from derived_feeds.session import spark_session

    session = spark_session("headwater-tests", local_dir=Path(tmp_path_factory.mktemp("spark")))
    try:
        yield session
    finally:
        session.stop()
