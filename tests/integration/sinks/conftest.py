"""Session servers for the sink tests: one Redis, one NATS (JetStream) and one RabbitMQ per session.

Each test uses its own streams, subjects, queues and databases (named by ``unique_name``), so
the servers are shared; a test that kills its server restarts it before it ends.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from harness.sink_pipeline import SinkPipeline
from harness.sink_servers import NatsServer, RabbitServer, RedisServer, missing_binary


def _server(cls: type[Any], binary: str) -> Iterator[Any]:
    missing = missing_binary(binary)
    if missing:
        pytest.skip(f"{missing} is not installed (make prereqs installs it)")
    server = cls().start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    yield from _server(RedisServer, "redis-server")


@pytest.fixture(scope="session")
def nats_server() -> Iterator[NatsServer]:
    yield from _server(NatsServer, "nats-server")


@pytest.fixture(scope="session")
def rabbit_server() -> Iterator[RabbitServer]:
    yield from _server(RabbitServer, "rabbitmq-server")


@pytest.fixture
def pipeline(pg_database: Any, unique_name: Any, tmp_path: Any) -> Iterator[SinkPipeline]:
    project = SinkPipeline(tmp_path / "project", pg_database.dsn, unique_name("src"))
    try:
        yield project
    finally:
        project.close()


#: The topic of :func:`direct_replica`'s sink: a table ``t (id int PRIMARY KEY, v int)``.
DIRECT_TOPIC = "src.public.t"


@pytest.fixture
def direct_replica(pg_server: Any, unique_name: Any, tmp_path: Any) -> Iterator[tuple[Any, str]]:
    """A PostgreSQL sink ``r`` of :data:`DIRECT_TOPIC` into a database of its own, opened, to drive batch by batch.

    Yields the sink and the database's DSN (the topic's schema record is in the log).
    """
    import orjson

    from core.config import parse_config
    from log.base import Record, TopicSpec
    from log.factory import open_log
    from log.topics import SCHEMAS_TOPIC
    from sinks.factory import build_sink

    database = unique_name("replica")
    pg_server.create_database(database)
    dsn = pg_server.dsn(database)
    config = parse_config(
        {
            "project": "p",
            "home": str(tmp_path / "home"),
            "sinks": {"r": {"kind": "postgres", "from": DIRECT_TOPIC, "options": {"dsn": dsn}}},
        },
        tmp_path / "headwater.yaml",
    )
    log = open_log(config)
    try:
        log.create_topic(TopicSpec(SCHEMAS_TOPIC, partitions=1))
        columns = [{"name": "id", "type_oid": 23, "typmod": -1}, {"name": "v", "type_oid": 23, "typmod": -1}]
        schema = {"topic": DIRECT_TOPIC, "key": ["id"], "columns": columns, "version": 1}
        log.append(SCHEMAS_TOPIC, 0, [Record(DIRECT_TOPIC.encode(), orjson.dumps(schema))])
        sink = build_sink(config, "r", log)
        sink.open()
        try:
            yield sink, dsn
        finally:
            sink.close()
    finally:
        log.close()
        pg_server.drop_database(database)
