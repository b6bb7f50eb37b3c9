"""Binlog reader benchmark: which reader MySQL capture builds on (issue 29), measured on one binlog.

Starts its own MariaDB (``operations.embedded_mariadb``), writes ``--rows`` inserts then as many
updates (transactions of ``--txn-rows`` rows) into a table of common types, and reads that same
binlog range with:

(a) ``mariadb-binlog FILE > /dev/null``: the server's own tool on the file, rows left base64
    (the bare read: the limit);
(b) ``mariadb-binlog --read-from-remote-server > /dev/null``: the same over the replication
    protocol;
(c) Headwater's replication client alone (``capture.mysql.binlog.client``: packets, CRC check,
    event headers; no row decoding);
(d) Headwater's reader: (c) plus TABLE_MAPs and every row image decoded into Debezium JSON values
    (``capture.mysql.binlog.rows``);
(e) ``mysql-replication`` (PyPI ``pymysqlreplication``), every row of every row event.

Then correctness: one row of every type is decoded by (d) and (e) and compared with what the
server returns for it (``SELECT``); differences are printed per column.

    .venv/bin/python bench/mysql_binlog_bench.py [--rows N] [--txn-rows N] [--skip mysql-replication]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pymysql

from capture.mysql.binlog.client import BinlogStream, ServerAddress
from capture.mysql.binlog.events import Rows, TableMap, parse_event
from capture.mysql.binlog.position import BinlogPosition
from capture.mysql.binlog.rows import RowDecoder
from capture.mysql.types.charsets import Charsets
from capture.mysql.types.values import TypeModes
from operations.embedded_mariadb import EmbeddedMariaDB, find_mariadb_bin

TABLE = (
    "CREATE TABLE items (id BIGINT PRIMARY KEY, name VARCHAR(64), qty INT, price DECIMAL(12,2), "
    "ts DATETIME(6), seen TIMESTAMP(3) NULL, flag BIT(1), note TEXT)"
)


def timed(label: str, rows: int, run: Any) -> float:
    cpu0, start = time.process_time(), time.perf_counter()
    run()
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu0
    print(f"{label}: {wall:.2f} s, {rows / wall:,.0f} rows/s (this process's CPU {cpu:.2f} s)", flush=True)
    return rows / wall


def write_workload(conn: Any, rows: int, txn_rows: int) -> None:
    with conn.cursor() as cur:
        for start in range(0, rows, txn_rows):
            end = min(rows, start + txn_rows)
            cur.execute(
                "INSERT INTO items SELECT seq, CONCAT('item-', seq), seq % 1000, seq / 7, "
                "TIMESTAMP'2026-01-01 00:00:00' + INTERVAL seq SECOND, "
                "TIMESTAMP'2026-01-01 00:00:00' + INTERVAL seq MINUTE, seq % 2, REPEAT('x', 40) "
                f"FROM seq_{start + 1}_to_{end}"
            )
        for start in range(0, rows, txn_rows):
            cur.execute(f"UPDATE items SET qty = qty + 1 WHERE id BETWEEN {start + 1} AND {start + txn_rows}")


def headwater_read(address: ServerAddress, start: BinlogPosition, charsets: Charsets, *, decode: bool) -> int:
    decoders: dict[int, RowDecoder] = {}
    by_shape: dict[Any, RowDecoder] = {}
    rows = 0
    for event in BinlogStream(address, server_id=991, start=start, blocking=False).events():
        if not decode:
            rows += 1
            continue
        parsed = parse_event(event.data, event.header)
        if isinstance(parsed, TableMap):
            decoder = by_shape.get(parsed.shape.columns)
            if decoder is None:
                decoder = by_shape[parsed.shape.columns] = RowDecoder(parsed.shape, TypeModes(), charsets)
            decoders[parsed.shape.table_id] = decoder
        elif isinstance(parsed, Rows):
            rows += len(decoders[parsed.table_id].decode(parsed))
    return rows


def replication_read(address: ServerAddress, start: BinlogPosition) -> tuple[int, list[Any]]:
    from pymysqlreplication import BinLogStreamReader
    from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

    reader = BinLogStreamReader(
        connection_settings={
            "host": address.host,
            "port": address.port,
            "user": address.user,
            "passwd": address.password,
        },
        server_id=992,
        log_file=start.file,
        log_pos=start.offset,
        blocking=False,
        only_events=[WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent],
    )
    rows, last = 0, []
    try:
        for event in reader:
            last = event.rows
            rows += len(event.rows)
    finally:
        reader.close()
    return rows, last


CORRECTNESS_TABLE = (
    "CREATE TABLE kinds (id INT PRIMARY KEY, ti TINYINT, tu TINYINT UNSIGNED, mi MEDIUMINT UNSIGNED, "
    "bu BIGINT UNSIGNED, dec_ DECIMAL(30,12), f FLOAT, b BIT(10), y YEAR, d DATE, tm TIME(4), "
    "dt DATETIME(6), ts TIMESTAMP(6) NULL, e ENUM('a','b'), s SET('x','y','z'), bin BINARY(4), "
    "tx TEXT CHARACTER SET latin1, j JSON)"
)
CORRECTNESS_ROW = (
    "INSERT INTO kinds VALUES (1, -5, 250, 16777215, 18446744073709551615, -1234567890123.000000000001, 1.1, "
    "b'1000000001', 2026, '2026-03-04', '-12:34:56.7891', '2026-01-01 10:00:00.123456', "
    "'2026-01-01 00:00:00.5', 'b', 'x,z', 'ab', 'é', '{\"a\": 1}')"
)


def correctness(conn: Any, address: ServerAddress, charsets: Charsets) -> None:
    with conn.cursor() as cur:
        cur.execute("FLUSH BINARY LOGS")
        cur.execute("SHOW MASTER STATUS")
        file, offset = cur.fetchone()[:2]
        cur.execute(CORRECTNESS_TABLE)
        cur.execute(CORRECTNESS_ROW)
        cur.execute("SELECT * FROM kinds")
        names = [d[0] for d in cur.description]
        server = dict(zip(names, cur.fetchone(), strict=True))
    start = BinlogPosition(file, offset)
    ours: dict[str, Any] = {}
    decoders: dict[int, RowDecoder] = {}
    for event in BinlogStream(address, server_id=993, start=start, blocking=False).events():
        parsed = parse_event(event.data, event.header)
        if isinstance(parsed, TableMap):
            decoders[parsed.shape.table_id] = RowDecoder(parsed.shape, TypeModes(), charsets)
        elif isinstance(parsed, Rows):
            ((_, after),) = decoders[parsed.table_id].decode(parsed)
            ours = dict(zip(names, after or [], strict=True))
    _, rows = replication_read(address, start)
    theirs = rows[0]["values"] if rows else {}
    print("correctness (server's SELECT | Headwater's Debezium value | mysql-replication's value):")
    for name in names:
        print(f"  {name}: {server[name]!r} | {ours.get(name)!r} | {theirs.get(name)!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--txn-rows", type=int, default=1000)
    parser.add_argument("--skip", default="", help="comma list of: mysql-replication, correctness")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    print(f"load average before: {os.getloadavg()[0]:.2f}", flush=True)
    server = EmbeddedMariaDB(Path(tempfile.mkdtemp(prefix="hw-binlog-bench-")), timezone="UTC").start()
    try:
        conn = pymysql.connect(**server.connect_args(), autocommit=True)
        with conn.cursor() as cur:
            cur.execute("CREATE DATABASE bench")
            cur.execute("USE bench")
            cur.execute(TABLE)
            cur.execute("FLUSH BINARY LOGS")
            cur.execute("SHOW MASTER STATUS")
            file, offset = cur.fetchone()[:2]
            load_start = time.perf_counter()
            write_workload(conn, args.rows, args.txn_rows)
            load_s = time.perf_counter() - load_start
            cur.execute("FLUSH BINARY LOGS")
            cur.execute("SELECT ID, CHARACTER_SET_NAME FROM information_schema.COLLATIONS")
            charsets = Charsets(cur.fetchall())
        changes = 2 * args.rows
        path = server.data_dir / file
        print(
            f"workload: {changes:,} row changes in {load_s:.1f} s; binlog {path.stat().st_size / 1e6:.1f} MB",
            flush=True,
        )
        tool = str(find_mariadb_bin("mariadb-binlog"))
        address = ServerAddress(server.host, server.port, server.admin, server.password)
        start = BinlogPosition(file, offset)
        remote = [tool, "-R", "-h", server.host, "-P", str(server.port), "-u", server.admin, f"-p{server.password}"]
        bare = timed(
            "(a) mariadb-binlog FILE > /dev/null",
            changes,
            lambda: subprocess.run([tool, str(path)], stdout=subprocess.DEVNULL, check=True),
        )
        timed(
            "(b) mariadb-binlog --read-from-remote-server > /dev/null",
            changes,
            lambda: subprocess.run([*remote, file], stdout=subprocess.DEVNULL, check=True),
        )
        timed(
            "(c) Headwater client, events only", changes, lambda: headwater_read(address, start, charsets, decode=False)
        )
        ours = timed(
            "(d) Headwater reader, rows decoded to Debezium values",
            changes,
            lambda: headwater_read(address, start, charsets, decode=True),
        )
        if "mysql-replication" not in skip:
            theirs = timed("(e) mysql-replication, rows decoded", changes, lambda: replication_read(address, start))
            print(f"Headwater reader vs mysql-replication: {ours / theirs:.1f}x", flush=True)
        if "correctness" not in skip:
            correctness(conn, address, charsets)
        print(f"load average after: {os.getloadavg()[0]:.2f}")
        print(
            f"binlog read: Headwater {ours:,.0f} rows/s "
            f"(mariadb-binlog bare: {bare:,.0f} rows/s, ratio {ours / bare:.2f})"
        )
    finally:
        server.remove()


if __name__ == "__main__":
    main()
