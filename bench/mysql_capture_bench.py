"""MySQL capture benchmark: Headwater's agent vs Debezium's MySQL connector vs a bare binlog read, one run.

Starts its own MariaDB (reporting the version Debezium 3.6.3's MySQL connector accepts,
``tests/harness/mariadb.py``), fills ``items`` (BIGINT key, VARCHAR, INT, DECIMAL, DATETIME(6), TEXT)
with ``--rows`` rows, then measures on the same data:

(a) snapshot: the agent's initial snapshot into the durable file log (fsync per append) vs
    Debezium's initial snapshot (embedded engine, JSON records counted, JVM started before timing)
    vs ``mariadb -e 'SELECT * FROM items' > /dev/null`` (the bare read);
(b) streaming: ``--rows`` updates in transactions of 1,000 rows written while neither reads, then
    read as a backlog: the agent (until caught up) vs Debezium (its engine restarted on offsets
    saved before the updates) vs ``mariadb-binlog --read-from-remote-server > /dev/null`` over the
    same range.

Each line gives wall-clock rows/s and the reader's CPU per row (Debezium: its JVM and driver
process; the agent: this process), which depends much less on what else the machine runs.

    .venv/bin/python bench/mysql_capture_bench.py [--rows N] [--skip debezium]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import pymysql

from capture.mysql.agent import MySqlAgent
from capture.mysql.settings import MySqlSource
from capture.mysql.types.values import TypeModes
from core.log_config import LogConfig
from log.file.backend import FileLog
from operations.embedded_mariadb import find_mariadb_bin

TABLE = (
    "CREATE TABLE items (id BIGINT PRIMARY KEY, name VARCHAR(64), qty INT, price DECIMAL(12,2), "
    "ts DATETIME(6), note TEXT)"
)


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def line(part: str, rows: int, wall: float, cpu: float | None) -> float:
    rate = rows / wall
    cpu_text = "" if cpu is None else f", CPU {cpu / rows * 1e6:.2f} us/row"
    print(f"  {part}: {wall:.2f} s, {rate:,.0f} rows/s{cpu_text}", flush=True)
    return rate


def properties_of(server: Any, work: Path, name: str, snapshot_mode: str) -> dict[str, str]:
    from harness.debezium_mysql import MySqlModes, mysql_connector_properties

    return mysql_connector_properties(
        name=name,
        host=server.host,
        port=server.port,
        user=server.admin,
        password=server.password,
        database="bench",
        tables=("items",),
        server_id=6500,
        topic_prefix="bench",
        modes=MySqlModes(decimal="string"),
        work_dir=work,
        snapshot_mode=snapshot_mode,
        extra={"provide.transaction.metadata": "false"},
    )


def debezium_streaming_from_here(debezium: Any, server: Any, work: Path, cur: Any) -> None:
    """Start the streaming engine once and stop it after one change, so its offset (the binlog's end) is stored.

    An engine stores offsets only with records: one marker update gives it one.
    """
    engine = debezium.engine("stream", properties_of(server, work, "stream", "no_data"), count_only=True)
    time.sleep(5)
    deadline = time.monotonic() + 300
    while engine.counted < 1:
        cur.execute("UPDATE items SET qty = qty + 1 WHERE id = 1")
        if time.monotonic() > deadline:
            raise RuntimeError(f"Debezium did not start streaming:\n{debezium.log_tail()}")
        time.sleep(2)
    engine.stop()


def debezium_count(
    debezium: Any, server: Any, work: Path, name: str, records: int, snapshot_mode: str
) -> tuple[float, float, int]:
    properties = properties_of(server, work, name, snapshot_mode)
    cpu_started = debezium.cpu_seconds()
    started = time.monotonic()
    engine = debezium.engine(name, properties, count_only=True)
    try:
        # Until it handed over ``records``, or handed over nothing more for 30 s (then its count is reported:
        # a streaming run here once stopped at 85,530 of 100,000 changes, reason not found yet).
        last, last_at = -1, time.monotonic()
        while engine.counted < records:
            if engine.counted != last:
                last, last_at = engine.counted, time.monotonic()
            elif time.monotonic() - last_at > 30:
                print(f"  Debezium {name}: stalled at {engine.counted:,} of {records:,} records", flush=True)
                break
            time.sleep(0.2)
        done = engine.counted_at or time.monotonic()
        cpu = debezium.cpu_seconds() - cpu_started
    finally:
        engine.stop()
    return done - started, cpu, engine.counted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--skip", default="")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    rows = args.rows
    from harness.mariadb import DEBEZIUM_VERSION_STRING, start_mariadb_server

    print(f"load average before: {os.getloadavg()[0]:.2f}", flush=True)
    server, stop = start_mariadb_server(timezone="UTC", version=DEBEZIUM_VERSION_STRING)
    work = Path(tempfile.mkdtemp(prefix="hw-mysql-bench-"))
    debezium = None
    try:
        conn = pymysql.connect(**server.connect_args(), autocommit=True)
        cur = conn.cursor()
        cur.execute("CREATE DATABASE bench")
        cur.execute("USE bench")
        cur.execute(TABLE)
        for start in range(0, rows, 10_000):
            cur.execute(
                "INSERT INTO items SELECT seq, CONCAT('item-', seq), seq % 1000, seq / 7, "
                "TIMESTAMP'2026-01-01 00:00:00' + INTERVAL seq SECOND, REPEAT('x', 40) "
                f"FROM seq_{start + 1}_to_{min(rows, start + 10_000)}"
            )
        if "debezium" not in skip:
            from harness.debezium import DebeziumProcess

            (work / "debezium").mkdir()
            debezium = DebeziumProcess(work / "debezium").start()
            debezium.start_jvm()

        print("snapshot:", flush=True)
        home = work / "headwater"
        log = FileLog(home / "log")
        source = MySqlSource.from_dsn("bench", server.dsn("bench"), ("items",), modes=TypeModes(decimal="string"))
        agent = MySqlAgent(source, log, LogConfig(), home / "capture")
        cpu0, t0 = cpu_s(), time.perf_counter()
        agent.run(until_caught_up=True)
        ours_snapshot = line("Headwater agent -> file log", rows, time.perf_counter() - t0, cpu_s() - cpu0)
        client = find_mariadb_bin("mariadb")
        bare = [str(client), "-h", server.host, "-P", str(server.port), "-u", server.admin, f"-p{server.password}"]
        t0 = time.perf_counter()
        subprocess.run([*bare, "-e", "SELECT * FROM bench.items"], stdout=subprocess.DEVNULL, check=True)
        line("mariadb -e 'SELECT *' > /dev/null (bare)", rows, time.perf_counter() - t0, None)
        dbz_snapshot = None
        if debezium is not None:
            wall, cpu, counted = debezium_count(debezium, server, work, "snap", rows, "initial")
            dbz_snapshot = line("Debezium MySQL connector (embedded)", counted, wall, cpu)
            debezium_streaming_from_here(debezium, server, work, cur)

        print("streaming:", flush=True)
        agent.run(until_caught_up=True)  # the marker updates, not timed
        cur.execute("SHOW MASTER STATUS")
        file, offset = cur.fetchone()[:2]
        for start in range(0, rows, 1000):
            cur.execute(f"UPDATE items SET qty = qty + 1 WHERE id BETWEEN {start + 1} AND {start + 1000}")
        cpu0, t0 = cpu_s(), time.perf_counter()
        agent.run(until_caught_up=True)
        ours_stream = line("Headwater agent -> file log", rows, time.perf_counter() - t0, cpu_s() - cpu0)
        tool = find_mariadb_bin("mariadb-binlog")
        remote = [
            str(tool),
            "-R",
            "-h",
            server.host,
            "-P",
            str(server.port),
            "-u",
            server.admin,
            f"-p{server.password}",
        ]
        t0 = time.perf_counter()
        subprocess.run([*remote, f"--start-position={offset}", file], stdout=subprocess.DEVNULL, check=True)
        line("mariadb-binlog --read-from-remote-server > /dev/null (bare)", rows, time.perf_counter() - t0, None)
        if debezium is not None and dbz_snapshot is not None:
            wall, cpu, counted = debezium_count(debezium, server, work, "stream", rows, "no_data")
            dbz_stream = line("Debezium MySQL connector (embedded)", counted, wall, cpu)
            print(f"snapshot: Headwater is {ours_snapshot / dbz_snapshot:.1f}x Debezium", flush=True)
            print(f"streaming: Headwater is {ours_stream / dbz_stream:.1f}x Debezium", flush=True)
        print(f"load average after: {os.getloadavg()[0]:.2f}")
    finally:
        if debezium is not None:
            debezium.kill()
        stop()


if __name__ == "__main__":
    main()
