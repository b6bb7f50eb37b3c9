"""Disk full under the log directory: capture pauses without acknowledging, says so, and resumes.

Two ways to fill the disk, one scenario:

* ``tmpfs``: a real size-limited filesystem (``mount -t tmpfs -o size=...``) mounted on
  the log directory and filled with a file; room returns when the file is deleted.
  Needs root (CAP_SYS_ADMIN); skipped with the reason otherwise.
* ``injected``: ENOSPC injected at the file log's write call through the
  ``HEADWATER_TEST_ENOSPC_FLAG`` hook of :mod:`log.file.partition_writer` while a flag file exists.

The capture runs as a real ``headwater capture --follow`` subprocess against real Postgres.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import orjson
from harness.tmpfs import tmpfs
from harness.topics import topic_values

from log.file.backend import FileLog

ROOT = Path(__file__).resolve().parents[3]
PASSWORD_VAR = "HW_DISK_FULL_PASSWORD"
ROWS = 3000


def fill(directory: Path) -> Path:
    """Write a file into ``directory`` until the filesystem has no room left."""
    filler = directory / "filler.bin"
    with filler.open("wb", buffering=0) as handle:
        for size in (1 << 20, 1 << 12):
            block = b"\0" * size
            while True:
                try:
                    handle.write(block)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC
                    break
    return filler


def ids_in_log(log_dir: Path, topic: str) -> list[int]:
    with FileLog(log_dir) as log:
        if topic not in log.list_topics():
            return []
        return [value["after"]["id"] for value in topic_values(log, topic)]


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def disk_full_scenario(
    pg_database, home: Path, *, make_full: Callable[[], None], make_room: Callable[[], None], env: dict[str, str]
) -> None:
    name = pg_database.name
    slot = f"headwater_{name}"
    pg_database.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    pg_database.execute(f"CREATE PUBLICATION headwater_{name} FOR TABLE t")
    pg_database.execute("INSERT INTO t SELECT g, 'before' FROM generate_series(1, 10) g")
    password = pg_database.server.password
    config = home.parent / "headwater.yaml"
    source = {
        "dsn": pg_database.dsn.replace(password, "${" + PASSWORD_VAR + "}"),
        "tables": ["public.t"],
        "heartbeat_interval_s": 1,
    }
    config.write_text(orjson.dumps({"project": "full", "home": str(home), "sources": {name: source}}).decode())
    env = {**os.environ, "PYTHONPATH": str(ROOT), PASSWORD_VAR: password, **env}
    command = [sys.executable, "-m", "headwater", "--config", str(config), "capture"]
    first = subprocess.run([*command, "--until-caught-up"], env=env, capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    topic = f"{name}.public.t"
    assert sorted(ids_in_log(home / "log", topic)) == list(range(1, 11))

    make_full()
    process = subprocess.Popen(
        [*command, "--follow"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(process.stderr.readline, "")), daemon=True)
    reader.start()
    try:
        for start in range(11, 11 + ROWS, 1000):
            pg_database.execute(
                "INSERT INTO t SELECT g, repeat('x', 200) FROM generate_series(%s::int, %s::int) g",
                (start, start + 999),
            )
        [(written,)] = pg_database.execute("SELECT pg_current_wal_lsn()")
        wait_until(lambda: any("log disk full at" in line for line in lines), 30, "the disk-full line")
        time.sleep(2.5)  # a few retries while the disk stays full
        [(confirmed,)] = pg_database.execute(
            "SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = %s", (slot,)
        )
        [(behind,)] = pg_database.execute("SELECT %s::pg_lsn < %s::pg_lsn", (confirmed, written))
        assert behind, f"capture acknowledged {confirmed} while the log was full (changes end at {written})"
        assert sorted(ids_in_log(home / "log", topic)) == list(range(1, 11)), "a batch is visible in a full log"
        assert process.poll() is None, "capture exited instead of pausing"

        make_room()
        wait_until(lambda: len(ids_in_log(home / "log", topic)) >= 10 + ROWS, 45, "the paused changes in the log")
        wait_until(
            lambda: pg_database.execute(
                "SELECT confirmed_flush_lsn >= %s::pg_lsn FROM pg_replication_slots WHERE slot_name = %s",
                (written, slot),
            )[0][0],
            30,
            "the acknowledgement after the pause",
        )
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        finally:
            if process.poll() is None:
                process.kill()
        reader.join(5)
    err = "".join(lines)
    assert process.returncode == 0, err[-3000:]
    full_lines = [line for line in lines if "log disk full at" in line]
    assert len(full_lines) == 1, err  # said once per pause, not once per retry
    assert f"log disk full at {home / 'log'}: capture paused, not acknowledging; retrying every" in full_lines[0]
    assert any("log writable again" in line for line in lines), err
    assert password not in err
    ids = ids_in_log(home / "log", topic)
    assert sorted(ids) == list(range(1, 11 + ROWS)), "a change is missing or doubled"


def test_disk_full_on_a_size_limited_tmpfs(pg_database, tmp_path):
    home = tmp_path / "home"
    filler: list[Path] = []
    with tmpfs(home / "log", "16m"):
        disk_full_scenario(
            pg_database,
            home,
            make_full=lambda: filler.append(fill(home / "log")),
            make_room=lambda: filler[0].unlink(),
            env={},
        )


def test_disk_full_injected_enospc_at_the_write_call(pg_database, tmp_path):
    home = tmp_path / "home"
    flag = tmp_path / "disk-full.flag"
    disk_full_scenario(
        pg_database,
        home,
        make_full=flag.touch,
        make_room=flag.unlink,
        env={"HEADWATER_TEST_ENOSPC_FLAG": str(flag)},
    )
