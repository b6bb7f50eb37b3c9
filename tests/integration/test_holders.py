"""Who holds what: a second capture or loader names the holder, a ``--follow`` standby takes over.

Real CLI processes: a ``--follow`` holder, a run that must finish (gives up after
``--holder-timeout`` with one line naming the holder: pid, host, command, since when; no
Spark stack trace), a ``--follow`` standby that says so once and takes over when the holder
is SIGKILLed. For capture also a holder the project's lease cannot see (a capture with
another home): it is named from ``pg_stat_replication``.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import orjson
import yaml
from harness.process_tree import descendants, kill_all, wait_all_gone
from harness.processes import stop_at_exit
from harness.topics import topic_values

from capture.postgres.events.source_block import postgres_source
from core.config import load_config
from log.base import Record, TopicSpec, append_keyed
from log.envelope import ChangeEvent, Op, encode_key, encode_value
from log.factory import open_log
from log.topics import SCHEMAS_TOPIC
from warehouse_loader.errors import UnknownTableError
from warehouse_loader.load_job import table_path
from warehouse_loader.query import run_query

INT4, TEXT = 23, 25


class Cli:
    """A ``headwater`` command in the background, its output in a file."""

    def __init__(self, project: Path, name: str, *args: str) -> None:
        self.log = project.parent / f"{name}.log"
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "headwater", *args],
                cwd=project,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                # as if started by a process that captured itself: its name names another pid
                env={**os.environ, "PGAPPNAME": f"headwater capture 1@{socket.gethostname()}"},
            )
        stop_at_exit(self.kill)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, text: str, timeout_s: float = 300) -> None:
        deadline = time.monotonic() + timeout_s
        while text not in self.output():
            assert self.process.poll() is None, f"exited {self.process.returncode}:\n{self.output()[-3000:]}"
            assert time.monotonic() < deadline, f"no {text!r} within {timeout_s:.0f}s:\n{self.output()[-3000:]}"
            time.sleep(0.5)

    def sigkill(self) -> set[int]:
        """SIGKILL the command alone; its process tree as it was."""
        tree = descendants(self.process.pid)
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait()
        return tree

    def stop(self) -> int:
        self.process.send_signal(signal.SIGINT)
        return self.process.wait(timeout=120)

    def kill(self) -> None:
        kill_all(descendants(self.process.pid) | {self.process.pid})
        self.process.wait()


def headwater(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "headwater", *args], cwd=project, capture_output=True, text=True, timeout=300
    )


def assert_names_the_holder(result: subprocess.CompletedProcess[str], what: str, holder: Cli, command: str) -> None:
    assert result.returncode == 1, result.stdout + result.stderr
    # Not a silent wait: one notice when it starts waiting, one error line when it gives up (no stack trace).
    notice, line = result.stderr.strip().splitlines()
    holder_text = f"{what} is held by pid {holder.process.pid} on {socket.gethostname()} ("
    assert notice.startswith(holder_text) and notice.endswith("waiting up to 2s"), notice
    assert line.startswith(f"error: {holder_text}"), line
    assert command in line and " since 20" in line and "gave up after 2s" in line, line


def slot_application(pg_database, slot: str) -> str | None:
    rows = pg_database.execute(
        "SELECT r.application_name FROM pg_replication_slots s JOIN pg_stat_replication r ON r.pid = s.active_pid "
        "WHERE s.slot_name = %s",
        (slot,),
    )
    return rows[0][0] if rows else None


def wait_until(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.5)


def test_capture_holder_is_named_and_a_standby_takes_over(pg_database, unique_name, tmp_path):
    name = unique_name("held")
    pg_database.execute("CREATE TABLE things (id int PRIMARY KEY, label text)")
    pg_database.execute("INSERT INTO things SELECT g, 'x' || g FROM generate_series(1, 5) g")
    pg_database.execute(f"CREATE PUBLICATION headwater_{name} FOR TABLE things")
    project = tmp_path / "project"
    project.mkdir()
    source = {"dsn": pg_database.dsn, "tables": ["public.things"], "heartbeat_interval_s": 1}
    (project / "headwater.yaml").write_text(yaml.safe_dump({"project": "held", "sources": {name: source}}))
    slot = f"headwater_{name}"
    holder = Cli(project, "holder", "capture", "--follow")
    standby = None
    try:
        # The slot is active twice: while its creation's exported snapshot is read, then for streaming, with a
        # moment between them when no one holds it; wait for the name rather than for the first sight of a holder.
        wait_until(
            lambda: (slot_application(pg_database, slot) or "").startswith(f"headwater capture {holder.process.pid}@"),
            120,
            "the holder streams under its name",
        )

        second = headwater(project, "capture", "--until-caught-up", "--holder-timeout", "2")
        assert_names_the_holder(second, f"capture of source {name}", holder, "capture --follow")

        standby = Cli(project, "standby", "capture", "--follow", "--log-format", "json")
        standby.wait_for('"message":"standby: capture of source')
        time.sleep(2)
        holder.sigkill()
        wait_until(
            lambda: (slot_application(pg_database, slot) or "").startswith(f"headwater capture {standby.process.pid}@"),
            60,
            f"the standby did not take over:\n{standby.output()[-3000:]}",
        )
        pg_database.execute("INSERT INTO things VALUES (100, 'after the takeover')")
        config = load_config(project / "headwater.yaml")

        def arrived() -> bool:
            with open_log(config) as log:
                return any(
                    (v or {}).get("after", {}).get("id") == 100 for v in topic_values(log, f"{name}.public.things")
                )

        wait_until(arrived, 60, "the standby captured the change made after it took over")
        lines = [orjson.loads(line) for line in standby.output().splitlines() if line.startswith("{")]
        standby_lines = [line for line in lines if line["message"].startswith("standby:")]
        assert len(standby_lines) == 1, lines  # said once
        assert standby_lines[0]["stage"] == "capture" and standby_lines[0]["level"] == "info"
        assert f"pid {holder.process.pid} on " in standby_lines[0]["message"]

        # A capture whose lease is elsewhere (another home): the slot itself names the holder.
        other = tmp_path / "other"
        other.mkdir()
        (other / "headwater.yaml").write_text(
            yaml.safe_dump({"project": "held", "home": "elsewhere", "sources": {name: source}})
        )
        third = headwater(other, "capture", "--until-caught-up", "--holder-timeout", "2")
        assert_names_the_holder(third, f"capture of source {name}", standby, "headwater capture, walsender pid ")
        assert standby.stop() in (0, 130), standby.output()[-3000:]
    finally:
        holder.kill()
        if standby is not None:
            standby.kill()


def change_records(keys: range, label: str) -> list[Record]:
    records = []
    for key in keys:
        ts_us = int(dt.datetime.now(dt.UTC).timestamp() * 1_000_000)
        lsn = 1000 + key * 10 + (1 if label == "second" else 0) * 100_000
        source = postgres_source("src", "db", "public", "t", lsn, lsn, lsn, 0, ts_us)
        event = ChangeEvent(Op.CREATE, source, None, {"id": key, "label": f"{label}-{key}"}, ts_us)
        records.append(Record(encode_key({"id": key}), encode_value(event)))
    return records


def test_load_holder_is_named_and_a_standby_takes_over(unique_name, tmp_path):
    topic = unique_name("raw")
    project = tmp_path / "project"
    project.mkdir()
    document = {
        "project": "held",
        "log": {"partitions": 2, "file": {"fsync": "never"}},
        "warehouse": {"tables": {"t": {"from": topic, "mode": "scd1"}}},
    }
    (project / "headwater.yaml").write_text(yaml.safe_dump(document))
    config = load_config(project / "headwater.yaml")
    with open_log(config) as log:
        log.create_topic(TopicSpec(SCHEMAS_TOPIC, partitions=1))
        columns = [
            {"name": "id", "type_oid": INT4, "typmod": -1, "key": True},
            {"name": "label", "type_oid": TEXT, "typmod": -1, "key": False},
        ]
        schema = {"topic": topic, "schema": "public", "table": "t", "columns": columns, "version": 1}
        log.append(SCHEMAS_TOPIC, 0, [Record(topic.encode(), orjson.dumps(schema))])
        log.create_topic(TopicSpec(topic, partitions=2))
        append_keyed(log, topic, change_records(range(10), "first"))

    holder = Cli(project, "holder", "load", "--follow")
    standby = None
    try:
        holder.wait_for("loading")
        started = time.monotonic()
        second = headwater(project, "load", "--available-now", "--holder-timeout", "2")
        assert time.monotonic() - started < 60  # refused before Spark starts
        assert_names_the_holder(second, "load of warehouse table t", holder, "load --follow")
        assert "java" not in second.stderr.lower() and "spark" not in second.stderr.lower()

        standby = Cli(project, "standby", "load", "--follow")
        standby.wait_for("standby: load of warehouse table t is held by pid")
        tree = holder.sigkill()
        assert not wait_all_gone(tree, 10), "the holder's Spark JVM outlived it"
        standby.wait_for("loading load_t")  # the streaming query is named load_<table>
        with open_log(config) as log:
            append_keyed(log, topic, change_records(range(5, 15), "second"))

        def loaded() -> bool:
            try:
                rows = run_query(
                    "SELECT count(*) AS n FROM t WHERE label LIKE 'second-%'", {"t": table_path(config, "t")}
                )
            except UnknownTableError:  # not loaded yet (the holder may have died before its first commit)
                return False
            return rows.to_pylist() == [{"n": 10}]

        wait_until(loaded, 180, f"the standby did not load after taking over:\n{standby.output()[-3000:]}")
        assert standby.output().count("standby:") == 1
        assert standby.stop() in (0, 130), standby.output()[-3000:]
    finally:
        holder.kill()
        if standby is not None:
            standby.kill()
