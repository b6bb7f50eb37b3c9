"""Incremental snapshots of MariaDB tables while the binlog streams: exact under concurrent writes and SIGKILLs.

The table is created empty and captured from its first row on (``snapshot: never``), so every
streamed change of every key is in the log: each ``op: r`` row must then equal the key's state
that the streamed changes before its sequence define (the source's state at the chunk's binlog
point), each key's events must keep increasing sequences in log order, and the log's final state
per key must equal the source. Under a concurrent writer in process, and across a SIGKILL of the
capture process mid-snapshot; then the signal table, ``headwater snapshot`` through the CLI (the
next capture and a running ``capture --follow`` pick it up) and the one-line refusals.
"""

from __future__ import annotations

import logging
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path
from signal import SIGTERM
from typing import Any

import orjson
import pytest
from harness.cli import ROOT, run_headwater
from harness.topics import read_topic

from capture.incremental_queue import STATE_FILE, IncrementalState, request_done, write_request
from capture.mysql.agent import MySqlAgent
from capture.mysql.settings import MySqlSource
from core.config import load_config
from core.log_config import LogConfig
from log.file.backend import FileLog
from log.topics import SCHEMAS_TOPIC
from operations.scaffold import init_project

CHILD = Path(__file__).parents[2] / "harness" / "mysql_capture_child.py"
ROWS = 1500


class Writer(threading.Thread):
    """Inserts, updates and deletes random keys of ``items`` in small transactions until told to stop."""

    def __init__(self, db: Any, seed: int) -> None:
        super().__init__(daemon=True)
        self.db = db
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.committed = 0

    def run(self) -> None:
        rng = self.rng
        with self.db.connect() as conn, conn.cursor() as cur:
            conn.autocommit(False)
            while not self.stop.is_set():
                for _ in range(rng.randint(1, 3)):
                    key = rng.randint(1, ROWS + 200)
                    roll = rng.random()
                    if roll < 0.5:
                        cur.execute("UPDATE items SET v = v + 1, note = %s WHERE id = %s", (f"u{self.committed}", key))
                    elif roll < 0.8:
                        cur.execute(
                            "INSERT INTO items VALUES (%s, 0, 'new') ON DUPLICATE KEY UPDATE v = v + 100", (key,)
                        )
                    else:
                        cur.execute("DELETE FROM items WHERE id = %s", (key,))
                conn.commit()
                self.committed += 1
                time.sleep(rng.uniform(0.0, 0.004))


def source_of(db: Any, **settings: Any) -> MySqlSource:
    return MySqlSource.from_dsn("inc", db.dsn, (f"{db.name}.items",), snapshot="never", heartbeat_s=0.5, **settings)


def events(log: FileLog, topic: str) -> list[dict[str, Any]]:
    if topic not in log.list_topics():
        return []
    return [orjson.loads(r.value) for r in read_topic(log, topic) if r.value is not None]


def check_exact(log: FileLog, topic: str, source_rows: dict[int, dict[str, Any]]) -> int:
    """Every ``r`` row equals the streamed state before it, sequences increase per key, the end equals the source.

    Returns how many ``r`` rows the log holds.
    """
    streamed: dict[int, list[tuple[tuple[int, int], dict[str, Any] | None]]] = {}
    by_key: dict[int, list[dict[str, Any]]] = {}
    for event in events(log, topic):
        image = event["after"] if event["op"] != "d" else event["before"]
        by_key.setdefault(image["id"], []).append(event)
    reads = 0
    for key, key_events in by_key.items():
        sequences = [(e["source"]["commit_lsn"], e["source"]["txn_index"]) for e in key_events]
        assert sequences == sorted(sequences), f"key {key}: events out of order {sequences}"
        history = streamed.setdefault(key, [])
        for event, sequence in zip(key_events, sequences, strict=True):
            if event["op"] == "r":
                reads += 1
                assert event["source"]["snapshot"] == "incremental"
                state = history[-1][1] if history else None
                assert event["after"] == state, f"key {key}: snapshot row {event['after']} but the stream had {state}"
            else:
                history.append((sequence, None if event["op"] == "d" else event["after"]))
    final: dict[int, dict[str, Any]] = {}
    for key, key_events in by_key.items():
        last = key_events[-1]
        if last["op"] != "d":
            final[key] = last["after"]
    assert final == source_rows
    return reads


def source_rows(db: Any) -> dict[int, dict[str, Any]]:
    return {i: {"id": i, "v": v, "note": n} for i, v, n in db.execute("SELECT id, v, note FROM items")}


def binlog_end(db: Any) -> tuple[str, int]:
    (row,) = db.execute("SHOW MASTER STATUS")
    return str(row[0]), int(row[1])


def wait_for(what: str, condition: Any, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def saved_position(state_dir: Path) -> tuple[str, int] | None:
    path = state_dir / "binlog.json"
    if not path.exists():
        return None
    saved = orjson.loads(path.read_text())
    return saved["file"], int(saved["offset"])


def caught_up(state_dir: Path, end: tuple[str, int]) -> bool:
    saved = saved_position(state_dir)
    return saved is not None and (int(saved[0].rsplit(".", 1)[1]), saved[1]) >= (int(end[0].rsplit(".", 1)[1]), end[1])


def setup_items(db: Any) -> None:
    db.script("CREATE TABLE items (id INT PRIMARY KEY, v INT, note VARCHAR(40))")


def fill(db: Any) -> None:
    with db.connect() as conn, conn.cursor() as cur:
        cur.executemany("INSERT INTO items VALUES (%s, %s, %s)", [(i, i, f"n{i}") for i in range(1, ROWS + 1)])


@pytest.mark.timeout(300)
def test_an_incremental_snapshot_while_a_writer_changes_the_keys(mariadb_database, tmp_path: Path) -> None:
    db = mariadb_database
    setup_items(db)
    log = FileLog(tmp_path / "log")
    state_dir = tmp_path / "capture" / "inc"
    agent = MySqlAgent(source_of(db), log, LogConfig(), state_dir)
    agent.incremental._chunk_rows = 100
    thread = threading.Thread(target=agent.run, kwargs={"until_caught_up": False}, daemon=True)
    thread.start()
    wait_for("capture to start", lambda: saved_position(state_dir) is not None)
    fill(db)
    writer = Writer(db, seed=11)
    writer.start()
    try:
        time.sleep(0.5)
        request = write_request(state_dir, [f"{db.name}.items"])
        wait_for("the incremental snapshot", lambda: request_done(state_dir, request))
        time.sleep(0.5)
    finally:
        writer.stop.set()
        writer.join(30)
    end = binlog_end(db)
    wait_for("capture to catch up", lambda: caught_up(state_dir, end))
    agent.stop()
    thread.join(30)
    assert not thread.is_alive()
    assert writer.committed > 100
    assert agent.incremental.chunks_emitted >= ROWS // 200  # 100-row chunks of what the deletes left
    reads = check_exact(log, f"inc.{db.name}.items", source_rows(db))
    assert reads > ROWS // 2
    # The chunks' table shape (from the catalog) is the streamed one (from the TABLE_MAPs): one schema version.
    schemas = [orjson.loads(r.value) for r in read_topic(log, SCHEMAS_TOPIC) if r.value is not None]
    versions = [v["version"] for v in schemas if v["topic"] == f"inc.{db.name}.items"]
    assert versions == [1]
    log.close()


def child(db: Any, home: Path) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, str(CHILD), "inc", db.dsn, f"{db.name}.items", str(home), "chunks=50"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and process.stdout.readline().strip() == "started"
    return process


@pytest.mark.timeout(300)
def test_a_sigkill_mid_snapshot_then_a_restart_completes_it_exactly(mariadb_database, tmp_path: Path) -> None:
    db = mariadb_database
    setup_items(db)
    home = tmp_path / "home"
    state_dir = home / "capture" / "inc"
    # The child's source takes the initial snapshot of the empty table: its position is the binlog's end.
    process = child(db, home)
    try:
        wait_for("capture to start", lambda: saved_position(state_dir) is not None)
        fill(db)
        writer = Writer(db, seed=23)
        writer.start()
        request = write_request(state_dir, [f"{db.name}.items"])

        def some_chunks_saved() -> bool:
            tables = IncrementalState.load(state_dir / STATE_FILE).tables
            return bool(tables) and tables[0].last_key is not None and int(tables[0].last_key[0]) > ROWS // 4

        wait_for("some chunks", some_chunks_saved)
        process.kill()
        process.wait()
        assert not request_done(state_dir, request), "killed mid-snapshot"
        time.sleep(0.5)  # the writer goes on while capture is down
        process = child(db, home)
        wait_for("the snapshot to complete after the restart", lambda: request_done(state_dir, request))
        writer.stop.set()
        writer.join(30)
        end = binlog_end(db)
        wait_for("capture to catch up", lambda: caught_up(state_dir, end))
    finally:
        process.kill()
        process.wait()
    log = FileLog(home / "log")
    assert writer.committed > 50
    reads = check_exact(log, f"inc.{db.name}.items", source_rows(db))
    assert reads > ROWS // 2
    log.close()


@pytest.mark.timeout(300)
def test_signals_through_the_signal_table(mariadb_database, tmp_path: Path, caplog) -> None:
    db = mariadb_database
    setup_items(db)
    db.script(
        "CREATE TABLE signals (id VARCHAR(64) PRIMARY KEY, type VARCHAR(32) NOT NULL, data TEXT)",
        "CREATE TABLE notes (id INT PRIMARY KEY, body VARCHAR(20))",
        "CREATE TABLE keyless (n INT)",
        "INSERT INTO notes VALUES " + ", ".join(f"({i}, 'note {i}')" for i in range(1, 31)),
    )
    fill(db)
    tables = tuple(f"{db.name}.{t}" for t in ("items", "notes", "signals", "keyless"))
    source = MySqlSource.from_dsn(
        "inc", db.dsn, tables, snapshot="never", heartbeat_s=0.5, signal_table=f"{db.name}.signals"
    )
    log = FileLog(tmp_path / "log")
    state_dir = tmp_path / "capture" / "inc"
    caplog.set_level(logging.INFO, logger="capture.signals")
    agent = MySqlAgent(source, log, LogConfig(), state_dir)
    thread = threading.Thread(target=agent.run, kwargs={"until_caught_up": False}, daemon=True)
    thread.start()
    notes, items = f"inc.{db.name}.notes", f"inc.{db.name}.items"

    def incremental(topic: str) -> list[int]:
        return sorted(e["after"]["id"] for e in events(log, topic) if e["source"]["snapshot"] == "incremental")

    def signal(ident: str, kind: str, data: str | None) -> None:
        db.execute("INSERT INTO signals VALUES (%s, %s, %s)", (ident, kind, data))

    def refusals() -> list[str]:
        rows = db.execute("SELECT data FROM signals WHERE type = 'log' AND id LIKE 'headwater-%%'")
        return [orjson.loads(data)["message"] for (data,) in rows]

    try:
        wait_for("capture to start", lambda: saved_position(state_dir) is not None)
        signal("s1", "log", '{"message": "hello from SQL"}')
        signal("s2", "bogus", "{}")
        signal("s3", "execute-snapshot", "not json")
        signal("s4", "execute-snapshot", f'{{"data-collections": ["{db.name}.keyless"]}}')
        signal(
            "s5",
            "execute-snapshot",
            f'{{"data-collections": ["{db.name}.notes"], "type": "incremental", "additional-conditions":'
            f' [{{"data-collection": "{db.name}.notes", "filter": "id > 25"}}]}}',
        )
        wait_for("the snapshot of notes", lambda: incremental(notes) == [26, 27, 28, 29, 30])
        signal("s6", "pause-snapshot", None)
        signal("s7", "execute-snapshot", f'{{"data-collections": ["{db.name}.items"]}}')
        signal("s8", "log", '{"message": "after the pause"}')
        wait_for("the log signal after the pause", lambda: "after the pause" in caplog.text)
        time.sleep(1.5)
        assert incremental(items) == [], "paused: nothing read"
        signal("s9", "resume-snapshot", None)
        wait_for("the snapshot after resume", lambda: len(incremental(items)) == ROWS)
        signal("s10", "execute-snapshot", f'{{"data-collections": ["{db.name}.notes"], "additional-conditions":'
               f' [{{"data-collection": "{db.name}.notes", "filter": "id > 0) OR (true"}}]}}')  # fmt: skip
        signal("s11", "execute-snapshot", f'{{"data-collections": ["{db.name}.items"]}}')
        signal("s12", "stop-snapshot", f'{{"data-collections": ["{db.name}.items"], "type": "incremental"}}')
        wait_for("the written-back refusals", lambda: len(refusals()) == 4)
        db.execute("INSERT INTO notes VALUES (0, 'streamed meanwhile')")
        wait_for("a change streamed after the signals", lambda: 0 in [e["after"]["id"] for e in events(log, notes)])
    finally:
        agent.stop()
        thread.join(30)
    found = refusals()
    assert any("'s2' ('bogus') refused: unknown signal type 'bogus'" in r for r in found)
    assert any("'s3' ('execute-snapshot') refused: its data 'not json' is not JSON" in r for r in found)
    assert any("'s4'" in r and "keyless" in r and "no primary key" in r for r in found), found
    assert any("'s10'" in r and "closes a parenthesis" in r for r in found)
    assert "signal s1: hello from SQL" in caplog.text
    assert IncrementalState.load(state_dir / STATE_FILE).tables == [], "s12 stopped what s11 queued"
    assert len(incremental(items)) in (ROWS, ROWS + 100), "s11 was stopped before or after its first chunk"
    # A restart carries out no signal twice.
    before = len(events(log, notes))
    MySqlAgent(source, log, LogConfig(), state_dir).run(until_caught_up=True)
    assert len(events(log, notes)) == before
    log.close()


def test_headwater_snapshot_through_the_cli_and_its_one_line_refusals(mariadb_database, tmp_path: Path) -> None:
    db = mariadb_database
    db.script(
        "CREATE TABLE t (id INT PRIMARY KEY, n INT)",
        "CREATE TABLE keyless (n INT)",
        "CREATE TABLE bin (id VARBINARY(8) PRIMARY KEY)",
        "INSERT INTO t VALUES (1, 1), (2, 2)",
        "INSERT INTO keyless VALUES (1)",
    )
    init_project(tmp_path)
    config = tmp_path / "headwater.yaml"
    tables = f"{db.name}.t,{db.name}.keyless,{db.name}.bin"
    run_headwater(config, "source", "add", "shop", "--kind", "mysql", "--dsn", db.dsn, "--tables", tables, "--yes")
    config.write_text(config.read_text().replace("snapshot: initial", "snapshot: never"))
    run_headwater(config, "capture", "shop", "--until-caught-up")
    db.script("UPDATE t SET n = 20 WHERE id = 2")

    refused = run_headwater(config, "snapshot", "shop", "--tables", f"{db.name}.keyless", ok=False)
    assert refused.returncode != 0
    assert refused.stderr.strip().splitlines() == [
        f"error: source shop: table {db.name}.keyless has no primary key (or does not exist), which incremental "
        "snapshots need"
    ]
    binary = run_headwater(config, "snapshot", "shop", "--tables", f"{db.name}.bin", ok=False)
    assert binary.stderr.strip().splitlines() == [
        f"error: source shop: table {db.name}.bin has a binary primary key column (id), which incremental "
        "snapshots do not chunk"
    ]
    other = run_headwater(config, "snapshot", "shop", "--tables", f"{db.name}.nope", ok=False)
    assert other.returncode != 0 and len(other.stderr.strip().splitlines()) == 1
    assert f"does not capture {db.name}.nope" in other.stderr

    asked = run_headwater(config, "snapshot", "shop", "--tables", f"{db.name}.t")
    assert "requested incremental snapshot" in asked.stdout
    run_headwater(config, "capture", "shop", "--until-caught-up")  # the next capture carries it out, then returns
    tail = run_headwater(config, "log", "tail", f"shop.{db.name}.t", "--from-beginning", "--json")
    values = [orjson.loads(line)["value"] for line in tail.stdout.splitlines()]
    assert sorted((v["op"], v["after"]["id"], v["after"]["n"]) for v in values) == [
        ("r", 1, 1),
        ("r", 2, 20),
        ("u", 2, 20),
    ]
    state = IncrementalState.load(load_config(config).home_dir / "capture" / "shop" / STATE_FILE)
    assert state.tables == []

    # A running `capture --follow` picks a request up while it streams.
    follow = subprocess.Popen(
        [sys.executable, "-m", "headwater", "--config", str(config), "capture", "shop", "--follow"],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        db.script("INSERT INTO t VALUES (3, 3)")
        run_headwater(config, "snapshot", "shop", "--tables", f"{db.name}.t")

        def reads() -> int:
            tail = run_headwater(config, "log", "tail", f"shop.{db.name}.t", "--from-beginning", "--json")
            return sum(orjson.loads(line)["value"]["op"] == "r" for line in tail.stdout.splitlines())

        wait_for("the running capture's snapshot", lambda: reads() == 5)
    finally:
        follow.send_signal(SIGTERM)
        _, errors = follow.communicate(timeout=60)
    assert follow.returncode == 0, errors


def test_a_mysql_source_refuses_a_signal_table_it_does_not_capture(mariadb_database, tmp_path: Path) -> None:
    db = mariadb_database
    db.script("CREATE TABLE t (id INT PRIMARY KEY)", "CREATE TABLE signals (id VARCHAR(64), type TEXT, data TEXT)")
    source = MySqlSource.from_dsn("inc", db.dsn, (f"{db.name}.t",), signal_table=f"{db.name}.signals")
    with FileLog(tmp_path / "log") as log, pytest.raises(Exception) as refused:
        MySqlAgent(source, log, LogConfig(), tmp_path / "state").run(until_caught_up=True)
    assert str(refused.value) == (
        f"sources.inc.signal_table: {db.name}.signals is not captured by the source, so its inserts are not read "
        "from the binlog; add it to the source's tables"
    )
