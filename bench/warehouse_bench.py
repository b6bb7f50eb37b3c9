"""Warehouse bench: 1M changes over 200k keys into SCD1 and SCD2 through plan + Delta writer.

Library path only (plan_scd1/plan_scd2 + delta_writer in this process); the Spark
foreachBatch path is measured separately later. The reference is a bare deltalake MERGE
of the same changes pre-reduced to one row per key (reduction not timed), i.e. the
floor the writer's single MERGE per batch can reach.

    .venv/bin/python bench/warehouse_bench.py [--changes 1000000] [--keys 200000] [--batch 100000]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from log.sequence import Sequence
from warehouse_loader.changes import COMMIT_TS, OP, SEQ
from warehouse_loader.delta.writer import write_scd1, write_scd2
from warehouse_loader.scd1 import plan_scd1

KEYS = ["id"]


def make_changes(n: int, keys: int, seed: int = 7) -> pa.Table:
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, keys, n)
    first = np.zeros(n, dtype=bool)
    _, first_at = np.unique(ids, return_index=True)
    first[first_at] = True
    ops = np.where(first, "c", np.where(rng.random(n) < 0.03, "d", "u"))
    seqs = [Sequence(1_000_000 + i // 4, i % 4).sortable() for i in range(n)]
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "name": pa.array(np.char.add("customer-", rng.integers(0, 10_000, n).astype(str))),
            "country": pa.array(rng.choice(np.array(["MX", "PT", "DE", "US", "JP"]), n)),
            "balance": pa.array(rng.random(n) * 1000),
            SEQ: pa.array(seqs, pa.string()),
            OP: pa.array(ops, pa.string()),
            COMMIT_TS: pa.array(1_700_000_000_000_000 + np.arange(n) * 10, pa.int64()).cast(
                pa.timestamp("us", tz="UTC")
            ),
        }
    )


def batches(changes: pa.Table, size: int) -> list[pa.Table]:
    return [changes.slice(start, size) for start in range(0, changes.num_rows, size)]


def run_writer(kind: str, parts: list[pa.Table], root: Path) -> tuple[float, float]:
    path = root / kind
    times = []
    for batch_id, part in enumerate(parts):
        start = time.perf_counter()
        if kind == "scd1":
            write_scd1(path, part, table=kind, batch_id=batch_id, keys=KEYS)
        else:
            write_scd2(path, part, table=kind, batch_id=batch_id, keys=KEYS)
        times.append(time.perf_counter() - start)
        print(f"  {kind} batch {batch_id}: {part.num_rows / times[-1]:,.0f} events/s ({times[-1]:.2f} s)", flush=True)
    return sum(times), sum(times[1:])


def run_bare_merge(parts: list[pa.Table], root: Path) -> tuple[float, float]:
    path = str(root / "bare")
    reduced = [plan_scd1(part, KEYS).rows for part in parts]  # not timed: the reference's input
    times = []
    for n, rows in enumerate(reduced):
        start = time.perf_counter()
        if n == 0:
            write_deltalake(path, rows.filter(np.asarray(rows.column(OP)) != "d"))
        else:
            (
                DeltaTable(path)
                .merge(rows, 't."id" = s."id"', source_alias="s", target_alias="t", streamed_exec=False)
                .when_matched_update_all(predicate="s.__hw_op <> 'd' AND s.__hw_seq > t.__hw_seq")
                .when_matched_delete(predicate="s.__hw_op = 'd' AND s.__hw_seq > t.__hw_seq")
                .when_not_matched_insert_all(predicate="s.__hw_op <> 'd'")
                .execute()
            )
        times.append(time.perf_counter() - start)
    return sum(times), sum(times[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--changes", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=100_000)
    args = parser.parse_args()
    changes = make_changes(args.changes, args.keys)
    parts = batches(changes, args.batch)
    steady_events = changes.num_rows - parts[0].num_rows
    print(f"warehouse bench: {changes.num_rows:,} changes over {args.keys:,} keys in {len(parts)} micro-batches")
    with tempfile.TemporaryDirectory(prefix="hw-warehouse-bench-") as tmp:
        root = Path(tmp)
        bare_total, bare_steady = run_bare_merge(parts, root)
        print(f"bare merge (pre-reduced): {changes.num_rows / bare_total:,.0f} events/s overall")
        scd2_total, scd2_steady = run_writer("scd2", parts, root)
        print(
            f"warehouse scd2: {changes.num_rows / scd2_total:,.0f} events/s overall, "
            f"{steady_events / scd2_steady:,.0f} steady"
        )
        scd1_total, scd1_steady = run_writer("scd1", parts, root)
        print(f"warehouse scd1 overall: {changes.num_rows / scd1_total:,.0f} events/s")
    scd1_rate = steady_events / scd1_steady
    bare_rate = steady_events / bare_steady
    print(f"warehouse scd1: {scd1_rate:,.0f} (bare merge: {bare_rate:,.0f}, ratio {scd1_rate / bare_rate:.2f})")


if __name__ == "__main__":
    main()
