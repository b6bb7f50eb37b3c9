"""Time Headwater's read of a maintained merge-on-read Iceberg table against a fresh copy (issue 34).

``build`` makes, under ``--home``, the table of ``iceberg_upkeep_bench.py``'s merge-on-read,
maintained variant (same seed: one insert batch of ``--rows`` rows, 200 batches of 300 random
updates, a maintenance pass every 60) and ``fresh``, the same rows written in one batch.
``query`` times the bench's query (open, plan, read) ``--repeats`` times in this process and
prints the median and the fastest; alternate ``--table t`` and ``--table fresh`` from a shell
(or ``farm-bench``) to compare them in one window::

    .venv/bin/python bench/iceberg_read_probe.py build --rows 2000000 --home /tmp/iceberg-probe
    .venv/bin/python bench/iceberg_read_probe.py query --home /tmp/iceberg-probe --table t
    .venv/bin/python bench/iceberg_read_probe.py query --home /tmp/iceberg-probe --table fresh
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HEADWATER_RETENTION_FLOOR_S", "0")

import iceberg_upkeep_bench as bench

from operations.maintain import maintain_table
from warehouse_loader.formats import format_of
from warehouse_loader.load_job import table_path

BATCHES, PER_BATCH, EVERY, SEED = 200, 300, 60, 7


def build(rows: int, home: Path) -> None:
    """The maintained merge-on-read table ``t`` and its fresh twin ``fresh`` under ``home``."""
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    config = bench.project(home, True)
    fmt, location = format_of(config, "t"), table_path(config, "t")
    write = bench.batch_writer(config)
    rng = np.random.default_rng(SEED)

    write("t", bench.changes(np.arange(rows), 1, "c"), 0)
    for n in range(1, BATCHES + 1):
        write("t", bench.changes(rng.choice(rows, PER_BATCH, replace=False), n + 1, "u"), n)
        if n % EVERY == 0:
            maintain_table(config, "t")
    current = fmt.open(location).select("SELECT id, v FROM target ORDER BY id")
    whole = bench.changes(current.column("id").to_numpy(), 10**9, "c").set_column(1, "v", current.column("v"))
    write("fresh", whole, 0)
    print(f"built {home}: t {bench.measure(config, 't')}, fresh {bench.measure(config, 'fresh')}")


def query(home: Path, table: str, repeats: int) -> None:
    """Time the bench's query of ``table`` ``repeats`` times; print the median and the fastest (ms)."""
    config = bench.project(home, True)
    fmt, location = format_of(config, table), table_path(config, table)
    times = []
    result = None
    for _ in range(repeats):
        started = time.perf_counter()
        result = fmt.open(location).select("SELECT count(*) AS n, sum(v) AS total FROM target")
        times.append(time.perf_counter() - started)
    rows = result.to_pylist() if result is not None else []
    print(f"{table}: median {statistics.median(times) * 1000:.1f} ms, fastest {min(times) * 1000:.1f} ms {rows}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    built = commands.add_parser("build")
    built.add_argument("--rows", type=int, default=2_000_000)
    built.add_argument("--home", type=Path, required=True)
    asked = commands.add_parser("query")
    asked.add_argument("--home", type=Path, required=True)
    asked.add_argument("--table", choices=("t", "fresh"), default="t")
    asked.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    if args.command == "build":
        build(args.rows, args.home)
    else:
        query(args.home, args.table, args.repeats)


if __name__ == "__main__":
    main()
