"""The Delta writer alone on one-row batches: each table kept open between batches against opened afresh.

What a streaming load's micro-batch of one change costs the driver's writer
(:func:`warehouse_loader.delta.writer.write_batch`, as the loader calls it), for SCD1 and SCD2:
``--batches`` one-row updates to a 40-row table, in the same run twice, alternated by batch so both
see the same machine: into a table whose handle the writer keeps
(:mod:`warehouse_loader.delta.kept_tables`, the product), and into a twin table whose kept handle
is dropped before every batch (the reference: a fresh open, as before the writer kept tables).
Each table grows a commit per batch, so a fresh open reads up to 100 JSON commits since the last
checkpoint. Printed: process CPU and wall per batch (medians over the batches). Paste the output
with the command and the load average into ``bench/RESULTS.md``.

    .venv/bin/python bench/kept_tables_bench.py [--batches 200]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.warehouse_config import TableConfig  # noqa: E402
from log.sequence import Sequence  # noqa: E402
from warehouse_loader.changes import COMMIT_TS, OP, SEQ  # noqa: E402
from warehouse_loader.delta import kept_tables  # noqa: E402
from warehouse_loader.delta.writer import write_batch  # noqa: E402
from warehouse_loader.location import TableLocation  # noqa: E402

ROWS = 40


def _changes(ids: list[int], names: list[str], op: str, at: int) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "name": pa.array(names, pa.string()),
            SEQ: pa.array([Sequence(at, n).sortable() for n in range(len(ids))], pa.string()),
            OP: pa.array([op] * len(ids), pa.string()),
            COMMIT_TS: pa.array([at * 1_000_000] * len(ids), pa.int64()).cast(pa.timestamp("us", tz="UTC")),
        }
    )


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run(mode: str, batches: int, root: Path) -> dict[str, tuple[float, float]]:
    """Per way (kept, reopened): median CPU and wall ms of a one-row batch."""
    config = TableConfig.model_validate({"from": "x", "mode": mode})
    tables = {way: root / f"{mode}_{way}" for way in ("kept", "reopened")}
    for path in tables.values():
        seed = _changes(list(range(ROWS)), [f"n{i}" for i in range(ROWS)], "c", 1)
        write_batch(str(path), seed, table="t", batch_id=0, keys=["id"], config=config)
    spent: dict[str, list[tuple[float, float]]] = {way: [] for way in tables}
    for batch in range(1, batches + 1):
        for way, path in tables.items():
            if way == "reopened":
                kept_tables.take(TableLocation(str(path)))  # taken and not put back: the write opens it
            change = _changes([batch % ROWS], [f"v{batch}"], "u", batch + 1)
            cpu, wall = _cpu(), time.perf_counter()
            write_batch(str(path), change, table="t", batch_id=batch, keys=["id"], config=config)
            spent[way].append((_cpu() - cpu, time.perf_counter() - wall))
    return {
        way: (1000 * statistics.median(c for c, _ in rows), 1000 * statistics.median(w for _, w in rows))
        for way, rows in spent.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=200)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}; {args.batches} one-row batches per table")
    print("| mode | table | CPU ms per batch (median) | wall ms per batch (median) |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="kept-tables-bench-") as scratch:
        for mode in ("scd1", "scd2"):
            for way, (cpu, wall) in run(mode, args.batches, Path(scratch)).items():
                print(f"| {mode} | {way} | {cpu:.1f} | {wall:.1f} |")
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
