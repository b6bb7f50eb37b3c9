"""Container variants of the services, through testcontainers, where a Docker engine answers.

Used when ``docker info`` succeeds or ``HEADWATER_TEST_SERVICES=containers``; the
local-process fixtures cover the same behaviour everywhere else.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from dataclasses import dataclass
from typing import Any

from operations.embedded_postgres import free_port

POSTGRES_IMAGE = "postgres:15"
KAFKA_IMAGE = "apache/kafka:3.9.0"
NO_ENGINE_REASON = (
    "no Docker engine: testcontainers cannot start containers; the local-process fixtures cover the same behaviour"
)


@functools.cache
def containers_wanted() -> tuple[bool, str]:
    """Whether container fixtures should run, and why not when they should not."""
    if os.environ.get("HEADWATER_TEST_SERVICES") == "containers":
        return True, ""
    docker = shutil.which("docker")
    if docker is None:
        return False, NO_ENGINE_REASON
    try:
        answered = subprocess.run([docker, "info"], capture_output=True, timeout=10, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        answered = False
    return answered, "" if answered else NO_ENGINE_REASON


@dataclass
class PostgresContainerService:
    """A running ``postgres`` container with ``wal_level=logical``."""

    container: Any
    dsn: str


def start_postgres_container() -> PostgresContainerService:
    """Start ``postgres:15`` with logical decoding enabled; the caller stops ``.container``."""
    try:
        from testcontainers.community.postgres import PostgresContainer
    except ImportError:  # testcontainers before the community/ split
        from testcontainers.postgres import PostgresContainer

    container = PostgresContainer(POSTGRES_IMAGE, username="postgres", password="postgres", dbname="postgres")
    container.with_command("postgres -c wal_level=logical -c max_replication_slots=20 -c max_wal_senders=20")
    container.start()
    return PostgresContainerService(container, container.get_connection_url(driver=None))


@dataclass
class KafkaContainerService:
    """A running single-node Apache Kafka (KRaft) container."""

    container: Any
    bootstrap_servers: str


def start_kafka_container() -> KafkaContainerService:
    """Start ``apache/kafka`` in KRaft mode; the caller stops ``.container``.

    The advertised listener must be the host-side address, so the host port is chosen
    here and bound, not left to Docker.
    """
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.waiting_utils import wait_for_logs

    host_port = free_port()
    container = DockerContainer(KAFKA_IMAGE).with_bind_ports(9092, host_port)
    env = {
        "KAFKA_NODE_ID": "1",
        "KAFKA_PROCESS_ROLES": "broker,controller",
        "KAFKA_LISTENERS": "PLAINTEXT://:9092,CONTROLLER://:9093",
        "KAFKA_ADVERTISED_LISTENERS": f"PLAINTEXT://127.0.0.1:{host_port}",
        "KAFKA_CONTROLLER_LISTENER_NAMES": "CONTROLLER",
        "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "KAFKA_CONTROLLER_QUORUM_VOTERS": "1@localhost:9093",
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": "1",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "1",
        "KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "0",
    }
    for key, value in env.items():
        container.with_env(key, value)
    container.start()
    wait_for_logs(container, r"Kafka Server started", timeout=120)
    return KafkaContainerService(container, f"127.0.0.1:{host_port}")
