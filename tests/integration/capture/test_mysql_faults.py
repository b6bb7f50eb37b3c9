"""MySQL capture exactly once into the log across SIGKILLs of capture and restarts of the server (issue 29).

A writer commits small transactions (inserts, updates, deletes over two tables) while capture runs
as its own process and is SIGKILLed at seeded random moments; meanwhile the server is restarted,
once cleanly and once by SIGKILL (InnoDB and binlog crash recovery). Afterwards the log must hold
exactly the events a capture without faults writes for the same binlog range: each once, none
missing, in the same order per key.
"""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pymysql
import pytest
from harness.mariadb import start_mariadb_server
from harness.topics import read_topic

from capture.mysql.agent import MySqlAgent
from capture.mysql.settings import MySqlSource
from capture.mysql.snapshot import SNAPSHOT_FILE
from capture.mysql.state import StreamState, save_state
from core.log_config import LogConfig
from log.file.backend import FileLog

CHILD = Path(__file__).parents[2] / "harness" / "mysql_capture_child.py"
TABLES = ("faults.items", "faults.moves")
KILLS = 8


class Writer(threading.Thread):
    """Commits transactions until told to stop; survives server restarts (retries what failed)."""

    def __init__(self, server: Any) -> None:
        super().__init__(daemon=True)
        self.server = server
        self.stop = threading.Event()
        self.committed = 0

    def _connect(self) -> Any:
        while True:
            try:
                return pymysql.connect(**self.server.connect_args("faults"), autocommit=False, connect_timeout=2)
            except pymysql.err.OperationalError:
                time.sleep(0.1)

    def run(self) -> None:
        rng = random.Random(7)
        conn = self._connect()
        n = 0
        while not self.stop.is_set():
            n += 1
            try:
                with conn.cursor() as cur:
                    cur.execute(
                        "INSERT INTO items VALUES (%s, %s, 0) ON DUPLICATE KEY UPDATE qty = qty + 1", (n, f"i{n}")
                    )
                    cur.execute("UPDATE items SET qty = qty + 1 WHERE id = %s", (rng.randint(1, n),))
                    cur.execute("INSERT INTO moves (item, delta) VALUES (%s, %s)", (n, rng.randint(-5, 5)))
                    if n % 7 == 0:
                        cur.execute("DELETE FROM items WHERE id = %s", (n - 3,))
                conn.commit()
                self.committed += 1
            except pymysql.err.MySQLError:
                conn = self._connect()
            time.sleep(0.005)


def capture_events(log: FileLog) -> list[tuple[Any, ...]]:
    """Every change event and tombstone of the tables, without the capture-time fields."""
    events = []
    for table in TABLES:
        topic = f"f.{table}"
        for record in read_topic(log, topic):
            if record.value is None:
                events.append((topic, record.key, None))
                continue
            value = orjson.loads(record.value)
            source = value["source"]
            events.append(
                (
                    topic,
                    record.key,
                    value["op"],
                    orjson.dumps(value["before"]),
                    orjson.dumps(value["after"]),
                    source["commit_lsn"],
                    source["txn_index"],
                    source["file"],
                    source["pos"],
                    source["row"],
                )
            )
    return events


def final_state(events: list[tuple[Any, ...]], topic: str) -> dict[bytes, Any]:
    """The table the log defines: per key the latest image by sequence."""
    latest: dict[bytes, tuple[Any, ...]] = {}
    for event in events:
        if event[0] == topic and event[2] is not None:
            held = latest.get(event[1])
            if held is None or (event[5], event[6]) >= (held[5], held[6]):
                latest[event[1]] = event
    return {key: orjson.loads(e[4]) for key, e in latest.items() if e[2] != "d"}


def child(server: Any, home: Path) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, str(CHILD), "f", server.dsn("faults"), ",".join(TABLES), str(home)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and process.stdout.readline().strip() == "started"
    return process


def caught_up(server: Any, home: Path) -> None:
    """Run capture until its saved position reaches the binlog's end, then kill it."""
    with pymysql.connect(**server.connect_args(), autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("SHOW MASTER STATUS")
        end = cur.fetchone()[:2]
    process = child(server, home)
    try:
        deadline = time.monotonic() + 120
        state = home / "capture" / "f" / "binlog.json"
        while time.monotonic() < deadline:
            if state.exists():
                saved = orjson.loads(state.read_text())
                if (saved["file"], saved["offset"]) >= (end[0], int(end[1])):
                    return
            time.sleep(0.2)
        pytest.fail("capture did not catch up within 120 s")
    finally:
        process.kill()
        process.wait()


@pytest.mark.timeout(600)
def test_sigkills_of_capture_and_server_restarts_lose_and_double_nothing(tmp_path: Path) -> None:
    server, stop = start_mariadb_server()
    try:
        with pymysql.connect(**server.connect_args(), autocommit=True) as conn, conn.cursor() as cur:
            cur.execute("CREATE DATABASE faults")
            cur.execute("CREATE TABLE faults.items (id INT PRIMARY KEY, name VARCHAR(20), qty INT)")
            cur.execute("CREATE TABLE faults.moves (seq INT AUTO_INCREMENT PRIMARY KEY, item INT, delta INT)")
            cur.execute("INSERT INTO faults.items VALUES (-1, 'before the snapshot', 1)")
        home = tmp_path / "faulted"
        writer = Writer(server)
        writer.start()
        rng = random.Random(29)
        kills = 0
        for round_ in range(KILLS):
            process = child(server, home)
            time.sleep(rng.uniform(0.3, 1.5))
            if round_ == 3:
                server.restart()  # clean: capture's connection drops, it reconnects
            if round_ == 5:
                server.restart(crash=True)  # SIGKILL: InnoDB and the binlog recover
            time.sleep(rng.uniform(0.1, 0.8))
            process.kill()
            process.wait()
            kills += 1
        writer.stop.set()
        writer.join(30)
        caught_up(server, home)
        faulted = capture_events(FileLog(home / "log"))

        # The same binlog range captured once, without faults: from where the faulted run's snapshot stood.
        reference_home = tmp_path / "reference"
        first = orjson.loads((home / "capture" / "f" / SNAPSHOT_FILE).read_text())["stream_from"]
        save_state(reference_home / "capture" / "f", StreamState.from_json(first))
        source = MySqlSource.from_dsn("f", server.dsn("faults"), TABLES, snapshot="never")
        reference_log = FileLog(reference_home / "log")
        MySqlAgent(source, reference_log, LogConfig(), reference_home / "capture" / "f").run(until_caught_up=True)
        reference = capture_events(reference_log)
        with pymysql.connect(**server.connect_args("faults")) as conn, conn.cursor() as cur:
            cur.execute("SELECT id, name, qty FROM items")
            items = {orjson.dumps({"id": i}): {"id": i, "name": n, "qty": q} for i, n, q in cur.fetchall()}
            cur.execute("SELECT seq, item, delta FROM moves")
            moves = {orjson.dumps({"seq": s}): {"seq": s, "item": i, "delta": d} for s, i, d in cur.fetchall()}
    finally:
        stop()
    assert kills == KILLS and writer.committed > 50
    streamed = [e for e in faulted if e[2] != "r"]
    duplicates = [e for e, n in Counter(streamed).items() if n > 1]
    assert not duplicates, duplicates[:5]
    assert sorted(streamed, key=repr) == sorted(reference, key=repr)
    snapshot = [(e[0], e[1], e[5]) for e in faulted if e[2] == "r"]
    assert len(snapshot) == len(set(snapshot)), "a snapshot row twice at one point"
    assert final_state(faulted, "f.faults.items") == items
    assert final_state(faulted, "f.faults.moves") == moves
