"""Fixtures of the log tests: every backend behind one ``any_log`` fixture.

``any_log`` runs a test against the file backend and against KafkaLog with each
Kafka client. The Kafka broker is the session ``kafka_broker`` fixture of
``tests/conftest.py``; tests that stop a broker start their own with ``start_tansu``.
"""

from __future__ import annotations

import hashlib
import itertools
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from harness.broker import TansuBroker, free_port

from core.log_config import KafkaConfig

#: ``file`` stores batches zstd-compressed (the default), ``file-plain`` uncompressed.
BACKENDS = ["file", "file-plain", "kafka-python", "confluent-kafka"]
_RUN = uuid.uuid4().hex[:6]
_COUNTER = itertools.count()


@pytest.fixture
def start_tansu() -> Iterator[Callable[[], TansuBroker]]:
    """Start a throwaway tansu of the test's own (e.g. to stop it mid-test); stopped after the test."""
    started: list[TansuBroker] = []

    def start() -> TansuBroker:
        broker = TansuBroker(free_port()).start()
        started.append(broker)
        return broker

    yield start
    for broker in started:
        broker.stop()


@pytest.fixture
def unused_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on."""
    return free_port()


@pytest.fixture(scope="session")
def log_kafka_bootstrap(request: pytest.FixtureRequest) -> str:
    """Bootstrap servers of the session's Kafka-protocol broker."""
    broker: Any = request.getfixturevalue("kafka_broker")
    return str(broker.bootstrap_servers)


def _open(backend: str, request: pytest.FixtureRequest, root: Path) -> Any:
    if backend in {"file", "file-plain"}:
        from log.file.backend import FileLog

        return FileLog(root, compression="none" if backend == "file-plain" else "zstd")
    from log.kafka.backend import KafkaLog

    bootstrap = request.getfixturevalue("log_kafka_bootstrap")
    return KafkaLog(KafkaConfig(bootstrap_servers=bootstrap, client=backend))


@pytest.fixture(params=BACKENDS)
def log_backend(request: pytest.FixtureRequest) -> str:
    """The backend of this parametrization: ``file``, ``file-plain``, ``kafka-python`` or ``confluent-kafka``."""
    return str(request.param)


@pytest.fixture
def open_log(log_backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Any]]:
    """Open another Log on the same store (another process's view); all are closed after the test."""
    opened: list[Any] = []

    def factory() -> Any:
        log = _open(log_backend, request, tmp_path / "log")
        opened.append(log)
        return log

    yield factory
    for log in opened:
        log.close()


@pytest.fixture
def any_log(open_log: Callable[[], Any]) -> Any:
    """A Log of each backend; closed after the test."""
    return open_log()


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> str:
    """A topic name unique to this test (and run): ``t-<node id hash>-<counter>``."""
    digest = hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:10]
    return f"t-{_RUN}-{digest}-{next(_COUNTER)}"
