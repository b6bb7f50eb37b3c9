"""Follow CPU bench: what ``headwater run --follow`` spends per micro-batch over many tables, against idling.

An embedded Postgres gets ``--tables`` small tables (default 15, 40 rows each), each loaded as SCD1
and SCD2 (two streaming queries per table, as the DDL matrix runs them). ``run --follow`` snapshots
and loads them (not measured), then two windows of ``--seconds`` each are measured:

* reference: idle, nothing written (every query still triggers each second and finds nothing);
* busy: a writer updates a random row of a random table ``--rate`` times a second.

For each window: the CPU seconds of ``run --follow``'s whole process tree (its capture, the load's
Python driver, JVM, Python workers and source runners; read from ``/proc``), the cores that makes,
the micro-batches Spark committed (files in the checkpoints' ``commits`` directories) and the CPU
per micro-batch above idling. Paste the output with the command and the load average into
``bench/RESULTS.md``.

    .venv/bin/python bench/follow_cpu_bench.py [--tables 15] [--rate 2] [--seconds 30]
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from process_tree import stop_group, tree_cpu

from core.config import load_config
from operations.embedded_postgres import EmbeddedPostgres
from warehouse_loader.load_job import table_path

ROWS = 40


def commits(home: Path) -> int:
    """Micro-batches Spark committed under ``home``'s checkpoints."""
    return sum(1 for path in home.glob("checkpoints/**/commits/*") if not path.name.endswith(".crc"))


def loaded(uris: list[str]) -> bool:
    """Whether every SCD1 table (by URI) holds its source's rows (a poll of the Delta tables, no Spark)."""
    from deltalake import DeltaTable

    for uri in uris:
        try:
            if DeltaTable(uri).to_pyarrow_table().num_rows != ROWS:
                return False
        except Exception:  # not created yet
            return False
    return True


def window(process: subprocess.Popen[bytes], home: Path, spend: Callable[[], object]) -> tuple[float, int]:
    """CPU seconds of the pipeline's tree and micro-batches committed while ``spend()`` runs."""
    cpu, batches = tree_cpu(process.pid), commits(home)
    spend()
    return tree_cpu(process.pid) - cpu, commits(home) - batches


def write(dsn: str, tables: int, rate: float, seconds: float) -> int:
    """Update a random row of a random table ``rate`` times a second for ``seconds``; the updates made."""
    rng = random.Random(7)
    with psycopg.connect(dsn, autocommit=True) as conn:
        began, written = time.monotonic(), 0
        while time.monotonic() < began + seconds:
            number, key = rng.randrange(tables), rng.randrange(1, ROWS + 1)
            conn.execute(f"UPDATE t{number} SET qty = qty + 1 WHERE id = %s", (key,))
            written += 1
            time.sleep(max(0.0, began + written / rate - time.monotonic()))
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", type=int, default=15)
    parser.add_argument("--rate", type=float, default=2.0, help="row updates per second while busy")
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hw-follow-bench-") as work:
        root = Path(work)
        server = EmbeddedPostgres(root / "pg", settings={"max_wal_senders": "10", "fsync": "off"})
        server.start()
        process = None
        try:
            dsn = server.create_database("bench")
            with psycopg.connect(dsn, autocommit=True) as conn:
                for number in range(args.tables):
                    conn.execute(f"CREATE TABLE t{number} (id int PRIMARY KEY, qty int, note text)")
                    conn.execute(f"INSERT INTO t{number} SELECT i, i, 'n' || i FROM generate_series(1, {ROWS}) i")
                conn.execute("CREATE PUBLICATION headwater_bench FOR ALL TABLES")
            home, config = root / "home", root / "headwater.yaml"
            names = [f"public.t{number}" for number in range(args.tables)]
            tables = {
                f"t{number}_{mode}": {"from": f"bench.public.t{number}", "mode": mode}
                for number in range(args.tables)
                for mode in ("scd1", "scd2")
            }
            config.write_text(
                yaml.safe_dump(
                    {
                        "project": "follow_bench",
                        "home": str(home),
                        "log": {"partitions": 2, "file": {"fsync": "never"}},
                        "sources": {"bench": {"dsn": dsn, "tables": names, "heartbeat_interval_s": 1}},
                        "warehouse": {"tables": tables},
                    }
                )
            )
            process = subprocess.Popen(
                [sys.executable, "-m", "headwater", "--config", str(config), "run", "--follow"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            started = time.monotonic()
            project = load_config(config)
            scd1 = [table_path(project, f"t{number}_scd1").uri for number in range(args.tables)]
            while not loaded(scd1):
                if process.poll() is not None or time.monotonic() - started > 900:
                    raise SystemExit("run --follow did not load the tables (exited or 15 min passed)")
                time.sleep(2)
            print(f"loaded {args.tables} tables ({2 * args.tables} queries) in {time.monotonic() - started:.0f} s")
            time.sleep(10)  # the last first batches settle
            idle_cpu, idle_batches = window(process, home, lambda: time.sleep(args.seconds))
            written: list[int] = []
            busy_cpu, busy_batches = window(
                process, home, lambda: written.append(write(dsn, args.tables, args.rate, args.seconds))
            )
            print(f"follow_cpu_bench tables={args.tables} rate={args.rate}/s seconds={args.seconds:.0f}")
            print("| window | CPU s | cores | micro-batches | CPU s per micro-batch above idle |")
            print("| --- | --- | --- | --- | --- |")
            print(f"| idle (reference) | {idle_cpu:.1f} | {idle_cpu / args.seconds:.3f} | {idle_batches} | |")
            per_batch = (busy_cpu - idle_cpu) / busy_batches if busy_batches else float("nan")
            print(
                f"| busy ({written[0]} updates) | {busy_cpu:.1f} | {busy_cpu / args.seconds:.3f} | {busy_batches} "
                f"| {per_batch:.3f} |"
            )
            print(f"load average at the end {os.getloadavg()[0]:.1f}")
        finally:
            if process is not None:
                stop_group(process)
            server.stop("fast")


if __name__ == "__main__":
    main()
