"""Warehouse upkeep under a trickle of random updates (issue 34): write amplification, files, commits, query time.

For each table size (``--rows``, default 200k and 2M) and each variant (``--variants``), in
one run on one machine:

* a fresh PostgreSQL database holds ``t (id bigint primary key, v int, pad text)`` with a
  ~100-byte ``pad``; ``headwater run --follow`` loads it into an SCD1 table ``t1`` and its
  SCD2 twin ``t2``;
* once both are loaded, a writer updates random ids at ``--rate`` rows/s (300) for
  ``--minutes``; then the loader catches up;
* measured per table, over the writer's window: bytes written (every data file, deletion
  vector and log file the window added, side tables included), commits, files live and on
  disk, the loader's mean micro-batch time (``headwater_batch_duration_seconds``), the
  MERGE time delta-rs or the merge-on-read writer recorded per commit, ``query`` time
  (``SELECT count(*), sum(v)``) at the start and at the end, and how long the loader
  needed to catch up. The extrapolations to an hour and a month are linear in the rates.
* at the end every table is compared with the source by a reader Headwater did not write:
  delta-rs's own query engine (``QueryBuilder``) reads ``(id, v)`` of the SCD1 table and of
  the SCD2 table's open versions, and both must equal PostgreSQL's rows exactly.

Variants: ``before`` = copy-on-write MERGEs, no maintenance (``merge_on_read: false``,
``maintenance.enabled: false``: what the issue measured); ``after`` = the defaults.

    .venv/bin/python bench/upkeep_bench.py [--rows 200000,2000000] [--rate 300] [--minutes 3]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import psycopg
import pyarrow as pa
import yaml
from deltalake import DeltaTable, QueryBuilder

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from process_tree import stop_group  # noqa: E402

from core.config import load_config  # noqa: E402
from operations.embedded_postgres import EmbeddedPostgres, free_port  # noqa: E402
from warehouse_loader.load_job import table_path  # noqa: E402
from warehouse_loader.query import run_query  # noqa: E402

TABLES = ("t1", "t2")
MONTH_MIN = 30 * 24 * 60


def load_average() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def writer(dsn: str, rows: int, rate: int, seconds: float, done: list[int]) -> None:
    """Update ``rate`` random ids per second (one statement per 10 ms tick), for ``seconds``."""
    rng = random.Random(34)
    per_tick = max(1, rate // 100)
    n = 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        start = time.monotonic()
        while time.monotonic() - start < seconds:
            ids = [rng.randrange(rows) for _ in range(per_tick)]
            conn.execute("UPDATE t SET v = v + 1 WHERE id = ANY(%s)", (ids,))
            n += per_tick
            delay = start + (n / per_tick) * 0.01 - time.monotonic()
            if delay > 0:
                time.sleep(delay)
    done.append(n)


def scrape(port: int) -> dict[str, float]:
    """``headwater_batch_duration_seconds`` sum and count per loaded table."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    found = {}
    for line in text.splitlines():
        match = re.match(r'headwater_batch_duration_seconds_(sum|count)\{name="(\w+)",stage="load"\} (\S+)', line)
        if match:
            found[f"{match[2]}.{match[1]}"] = float(match[3])
    return found


def timed_query(paths: dict[str, Any], table: str) -> float:
    started = time.perf_counter()
    run_query(f"SELECT count(*) AS n, sum(v) AS s FROM {table}", paths)
    return time.perf_counter() - started


def log_window(path: Path, since_ms: int) -> dict[str, Any]:
    """Commits after ``since_ms`` (commitInfo timestamp) in ``path``'s log and its side tables: bytes and timings."""
    commits, added, log_bytes, merge_ms = 0, 0, 0, []
    for log_dir in [path / "_delta_log", *sorted(path.glob("_hw_*/_delta_log"))]:
        for entry in sorted(log_dir.iterdir()):
            if entry.suffix not in (".json", ".parquet") or entry.stat().st_mtime * 1000 < since_ms:
                continue
            log_bytes += entry.stat().st_size
            if entry.suffix != ".json":
                continue
            main = log_dir.parent == path
            actions = [orjson.loads(line) for line in entry.read_bytes().splitlines() if line.strip()]
            # A merge-on-read commit restates a file it puts a deletion vector on (a remove and an
            # add of the same path): that writes a log line and a vector, not the file again.
            restated = {a["remove"]["path"] for a in actions if "remove" in a}
            for action in actions:
                if "commitInfo" in action and main:
                    commits += 1
                    metrics = action["commitInfo"].get("operationMetrics") or {}
                    if action["commitInfo"].get("operation") == "MERGE" and "execution_time_ms" in metrics:
                        merge_ms.append(float(metrics["execution_time_ms"]))
                if "add" in action and action["add"]["path"] not in restated:
                    added += int(action["add"].get("size", 0))
    dv_bytes = sum(
        f.stat().st_size for f in path.rglob("deletion_vector_*.bin") if f.stat().st_mtime * 1000 >= since_ms
    )
    return {"commits": commits, "bytes": added + log_bytes + dv_bytes, "merge_ms": merge_ms}


def foreign_rows(path: Path, scd2: bool) -> pa.Table:
    """``(id, v)`` as delta-rs's query engine reads the table (open versions for SCD2), sorted by id."""
    where = 'WHERE "__END_AT" IS NULL' if scd2 else ""
    reader = QueryBuilder().register("t", DeltaTable(str(path)))
    return pa.table(reader.execute(f"SELECT id, v FROM t {where} ORDER BY id").read_all())


def run_one(
    server: EmbeddedPostgres, work: Path, rows: int, variant: str, args: argparse.Namespace
) -> list[dict[str, Any]]:
    name = f"b{rows}_{variant}"
    dsn = server.create_database(name)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id bigint PRIMARY KEY, v int NOT NULL, pad text NOT NULL)")
        conn.execute(
            "INSERT INTO t SELECT g, 0, repeat(md5(g::text), 3) || lpad(g::text, 4, '0') FROM generate_series(0, %s) g",
            (rows - 1,),
        )
        conn.execute(f"CREATE PUBLICATION headwater_{name} FOR TABLE t")
    home = work / name
    home.mkdir()
    warehouse: dict[str, Any] = {
        "tables": {
            "t1": {"from": f"{name}.public.t", "mode": "scd1"},
            "t2": {"from": f"{name}.public.t", "mode": "scd2"},
        }
    }
    if variant == "before":
        warehouse.update(merge_on_read=False, maintenance={"enabled": False})
    else:
        warehouse.update(maintenance={"interval_s": args.maintenance_interval})
    config_path = home / "headwater.yaml"
    config_path.write_text(
        yaml.safe_dump(
            {"project": name, "sources": {name: {"dsn": dsn, "tables": ["public.t"]}}, "warehouse": warehouse}
        )
    )
    config = load_config(config_path)
    paths = {t: table_path(config, t) for t in TABLES}
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # Capture once first: the snapshot records the table's schema (and key) before any load starts.
    headwater = [sys.executable, "-m", "headwater", "--config", str(config_path)]
    subprocess.run([*headwater, "capture", "--until-caught-up"], check=True, env=env, capture_output=True)
    run = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "headwater",
            "--config",
            str(config_path),
            "run",
            "--follow",
            "--metrics-port",
            str(port),
        ],
        env=env,
        stdout=(home / "run.log").open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    results = []
    try:
        loaded_at = time.monotonic()
        while True:
            try:
                counts = [run_query(f"SELECT count(*) AS n FROM {t}", paths).column("n")[0].as_py() for t in TABLES]
            except Exception:
                counts = [0, 0]
            if counts == [rows, rows]:
                break
            if run.poll() is not None or time.monotonic() - loaded_at > 1800:
                raise SystemExit(f"{name}: run --follow stopped or never loaded the tables; see {home / 'run.log'}")
            time.sleep(2)
        load_s = time.monotonic() - loaded_at
        time.sleep(5)
        query_start = {t: min(timed_query(paths, t) for _ in range(3)) for t in TABLES}
        before_metrics = scrape(port)
        since_ms = int(time.time() * 1000)
        done: list[int] = []
        writer(dsn, rows, args.rate, args.minutes * 60, done)
        writer_end = time.monotonic()
        with psycopg.connect(dsn) as conn:
            total = conn.execute("SELECT sum(v) FROM t").fetchone()[0]
        sums = {"t1": "SELECT sum(v) AS s FROM t1", "t2": 'SELECT sum(v) AS s FROM t2 WHERE "__END_AT" IS NULL'}
        for sql in sums.values():  # both tables: the SCD2 twin's batches can lag the SCD1 table's
            while run_query(sql, paths).column("s")[0].as_py() != total:
                time.sleep(0.5)
        caught_up_s = time.monotonic() - writer_end
        after_metrics = scrape(port)
        query_end = {t: min(timed_query(paths, t) for _ in range(3)) for t in TABLES}
        with psycopg.connect(dsn) as conn:
            source = conn.execute("SELECT id, v FROM t ORDER BY id").fetchall()
        ids = np.array([r[0] for r in source])
        values = np.array([r[1] for r in source])
        minutes = args.minutes + caught_up_s / 60
        change_bytes = done[0] * (8 + 4 + 100)  # one row image: id, v, pad
        for table in TABLES:
            path = Path(str(paths[table]))
            window = log_window(path, since_ms)
            read = foreign_rows(path, table == "t2")
            exact = bool(
                np.array_equal(read.column("id").to_numpy(), ids)
                and np.array_equal(read.column("v").to_numpy(), values)
            )
            batches = after_metrics.get(f"{table}.count", 0) - before_metrics.get(f"{table}.count", 0)
            batch_s = after_metrics.get(f"{table}.sum", 0) - before_metrics.get(f"{table}.sum", 0)
            delta = DeltaTable(str(path))
            on_disk = [f for f in path.rglob("*") if f.is_file()]
            results.append(
                {
                    "rows": rows,
                    "variant": variant,
                    "table": f"{table} ({'scd1' if table == 't1' else 'scd2'})",
                    "updates": done[0],
                    "initial_load_s": round(load_s, 1),
                    "bytes_per_min": window["bytes"] / minutes,
                    "bytes_per_change": window["bytes"] / done[0],
                    "amplification": window["bytes"] / change_bytes,
                    "commits": window["commits"],
                    "commits_per_hour": window["commits"] / minutes * 60,
                    "files_live": len(delta.file_uris()),
                    "files_on_disk": len(on_disk),
                    "disk_bytes": sum(f.stat().st_size for f in on_disk),
                    "batches": int(batches),
                    "batch_mean_s": batch_s / batches if batches else float("nan"),
                    "merge_p50_ms": statistics.median(window["merge_ms"]) if window["merge_ms"] else float("nan"),
                    "query_start_s": query_start[table],
                    "query_end_s": query_end[table],
                    "caught_up_s": round(caught_up_s, 1),
                    "exact": exact,
                    "load": load_average(),
                }
            )
            print(orjson.dumps(results[-1]).decode(), flush=True)
    finally:
        stop_group(run, timeout=120)
        server.drop_database(name)
    return results


def table(results: list[dict[str, Any]]) -> str:
    head = (
        "| rows | variant | table | MB written/min | bytes/change (x change) | commits/h | files live / on disk "
        "| batch mean s | MERGE p50 ms | query start → end s | caught up s | exact | load |\n"
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n"
    )
    lines = [
        f"| {r['rows']:,} | {r['variant']} | {r['table']} | {r['bytes_per_min'] / 1e6:,.1f} | "
        f"{r['bytes_per_change']:,.0f} ({r['amplification']:,.1f}x) | {r['commits_per_hour']:,.0f} | "
        f"{r['files_live']} / {r['files_on_disk']} | {r['batch_mean_s']:.2f} | {r['merge_p50_ms']:.0f} | "
        f"{r['query_start_s']:.2f} → {r['query_end_s']:.2f} | {r['caught_up_s']} | {r['exact']} | {r['load']} |"
        for r in results
    ]
    return head + "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", default="200000,2000000")
    parser.add_argument("--rate", type=int, default=300)
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--variants", default="before,after")
    parser.add_argument("--maintenance-interval", type=float, default=30.0)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="headwater-upkeep-"))
    os.chmod(work, 0o755)
    server = EmbeddedPostgres(work / "pg", settings={"max_wal_senders": "10", "max_replication_slots": "10"})
    server.start()
    results = []
    try:
        for rows in (int(r) for r in args.rows.split(",")):
            for variant in args.variants.split(","):
                results.extend(run_one(server, work, rows, variant, args))
    finally:
        server.stop()
    print(f"\n{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, {args.rate} updates/s for {args.minutes} min")
    print(table(results))


if __name__ == "__main__":
    main()
