"""One conformance run: the workload of ``harness.conformance_workload`` captured by real Debezium and by
the real ``headwater capture`` CLI, side by side on one database, in several type modes at once.

Each mode is one Headwater source and one Debezium engine (all engines in the session's one
JVM), each with its own slot and publication (made alike: ``publish_via_partition_root``).
The order keeps the tools from seeing each other: Headwater takes its snapshot first (its
``caught_up`` marker message is written before Debezium's slots exist), the Debezium engines
then take theirs, the changes run, the engines are stopped once they have the workload's end
message, and only then does Headwater stream (its next marker comes after every engine
stopped). So neither tool's events carry the other's traffic.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import psycopg

from core.config import load_config
from harness import conformance_workload as workload
from harness.debezium import DebeziumModes, DebeziumProcess, connector_properties
from harness.event_comparison import Event, debezium_events, headwater_events
from harness.processes import die_with_parent, stop_at_exit
from harness.topics import read_topic
from log.factory import open_log
from log.topics import is_quarantine_topic
from operations.embedded_postgres import EmbeddedPostgres

REPO = Path(__file__).resolve().parents[2]
PASSWORD_VAR = "HW_CONFORMANCE_PASSWORD"


@dataclass
class HeadwaterProject:
    """A ``headwater.yaml`` written by the test, and the real CLI run against it."""

    dir: Path
    password: str

    @property
    def config(self) -> Path:
        """The config file."""
        return self.dir / "headwater.yaml"

    def write(self, sources: Mapping[str, Mapping[str, Any]], *, partitions: int = 3) -> None:
        """Write the config: a file log under ``<dir>/home``, ``sources`` as given (JSON is YAML)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        config = {
            "project": "conformance",
            "home": str(self.dir / "home"),
            "log": {"backend": "file", "partitions": partitions},
            "sources": dict(sources),
        }
        self.config.write_text(orjson.dumps(config, option=orjson.OPT_INDENT_2).decode())

    def env(self) -> dict[str, str]:
        """The environment of a CLI run (the DSN's password comes from ``${HW_CONFORMANCE_PASSWORD}``)."""
        return {**os.environ, "PYTHONPATH": str(REPO), PASSWORD_VAR: self.password}

    def command(self, *args: str) -> list[str]:
        """``python -m headwater --config <file> ARGS``."""
        return [sys.executable, "-m", "headwater", "--config", str(self.config), *args]

    def run(self, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
        """Run one CLI command to its end, whatever its exit code."""
        return subprocess.run(
            self.command(*args), env=self.env(), capture_output=True, text=True, timeout=timeout_s, check=False
        )

    def cli(self, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
        """Run one CLI command to its end; raise with its stderr when it fails."""
        result = self.run(*args, timeout_s=timeout_s)
        if result.returncode != 0:
            msg = f"headwater {' '.join(args)} exited {result.returncode}:\n{result.stderr[-4000:]}"
            raise AssertionError(msg)
        return result

    def follow(self, *names: str) -> FollowingCapture:
        """Start ``headwater capture NAMES --follow`` in its own process group (killed at session end at the latest)."""
        process = subprocess.Popen(
            self.command("capture", *names, "--follow"),
            env=self.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        following = FollowingCapture(process)
        stop_at_exit(following.kill)
        return following

    def events(self, source: str) -> list[Event]:
        """Every record of ``source`` in its log, in the source's order."""
        log = open_log(load_config(self.config, strict_env=False))
        try:
            return headwater_events(log, source)
        finally:
            log.close()

    def quarantined(self, source: str) -> dict[str, int]:
        """Records per quarantine topic of ``source`` (``<topic>.quarantine``)."""
        log = open_log(load_config(self.config, strict_env=False))
        try:
            return {
                topic: len(read_topic(log, topic))
                for topic in log.list_topics()
                if topic.startswith(f"{source}.") and is_quarantine_topic(topic)
            }
        finally:
            log.close()


@dataclass
class FollowingCapture:
    """A running ``headwater capture --follow``."""

    process: subprocess.Popen[str]

    def stop(self, timeout_s: float = 30) -> tuple[int, str, str]:
        """SIGTERM (capture finishes the batch in hand and exits 0); returns (exit code, stdout, stderr)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            out, err = self.process.communicate(timeout=timeout_s)
        finally:
            self.kill()
        return self.process.returncode, out, err

    def kill(self) -> None:
        """Kill the whole process group (a no-op once it has exited)."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)


def masked_dsn(server: EmbeddedPostgres, dbname: str) -> str:
    """The superuser DSN of ``dbname`` with the password as ``${HW_CONFORMANCE_PASSWORD}``."""
    return server.dsn(dbname).replace(server.password, "${" + PASSWORD_VAR + "}")


@dataclass
class CapturedPair:
    """What both tools captured in one mode."""

    modes: DebeziumModes
    debezium: list[Event]
    headwater: list[Event]
    #: Headwater's quarantined records per quarantine topic.
    quarantined: dict[str, int]


def run_conformance(
    server: EmbeddedPostgres,
    debezium: DebeziumProcess,
    modes: Mapping[str, DebeziumModes],
    *,
    work_dir: Path,
    unique: Callable[[str], str],
    timeout_s: float = 120,
) -> dict[str, CapturedPair]:
    """Capture the workload with both tools in every mode (``label -> modes``); per label what each emitted."""
    dbname = unique("conformance")
    server.create_database(dbname)
    dsn = server.dsn(dbname)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            workload.create_schema(conn)
            workload.insert_snapshot_rows(conn)
            names = {label: (unique(f"hw_{label}"), unique(f"dbz_{label}")) for label in modes}
            tables = ", ".join(workload.TABLES)
            for hw_name, dbz_name in names.values():
                for publication in (hw_name, dbz_name):
                    conn.execute(
                        f"CREATE PUBLICATION {publication} FOR TABLE {tables} WITH (publish_via_partition_root = true)"
                    )
        project = HeadwaterProject(work_dir / "headwater", server.password)
        sources = {"src_" + re.sub(r"\W", "_", label): label for label in modes}
        project.write(
            {
                source: {
                    "dsn": masked_dsn(server, dbname),
                    "tables": list(workload.TABLES),
                    "slot": names[label][0],
                    "publication": names[label][0],
                    "types": modes[label].headwater_types(),
                }
                for source, label in sources.items()
            }
        )
        project.cli("capture", "--until-caught-up")  # the snapshots, before Debezium's slots exist

        engines = {}
        for source, label in sources.items():
            slot = names[label][1]
            properties = connector_properties(
                name=slot,
                host=server.host,
                port=server.port,
                user=server.superuser,
                password=server.password,
                dbname=dbname,
                topic_prefix=source,
                slot=slot,
                publication=slot,
                tables=workload.TABLES,
                modes=modes[label],
                offsets=work_dir / f"{slot}.offsets",
            )
            engines[label] = debezium.engine(slot, properties)
        for engine in engines.values():
            engine.wait_for(_snapshot_done, timeout_s, "end of its snapshot (source.snapshot 'last')")

        with psycopg.connect(dsn, autocommit=True) as conn:
            workload.run_stream_changes(conn)
        for engine in engines.values():
            engine.wait_for(_workload_done, timeout_s, f"the {workload.END_PREFIX} message")
            engine.stop()

        started = time.monotonic()
        project.cli("capture", "--until-caught-up", timeout_s=timeout_s)
        assert time.monotonic() - started < timeout_s
        return {
            label: CapturedPair(
                modes[label],
                debezium_events(engines[label].records()),
                project.events(source),
                project.quarantined(source),
            )
            for source, label in sources.items()
        }
    finally:
        server.drop_database(dbname)


def _snapshot_done(records: list[dict[str, Any]]) -> bool:
    return any(((r["value"] or {}).get("source") or {}).get("snapshot") == "last" for r in records)


def _workload_done(records: list[dict[str, Any]]) -> bool:
    return any(
        r["topic"].endswith(".message")
        and ((r["value"] or {}).get("message") or {}).get("prefix") == workload.END_PREFIX
        for r in records
    )
