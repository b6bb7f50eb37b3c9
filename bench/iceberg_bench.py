"""Iceberg bench: Headwater's SCD1 Iceberg writer vs a bare pyiceberg upsert vs Headwater's Delta writer.

Two cases, each engine on its own copy of the same starting table, in this one run:

* ``bulk``: a table of ``--keys`` rows (one per key), then ``--changes`` changes over those keys
  as ONE micro-batch (inserts, updates, 3 % deletes, keys repeated).
* ``trickle``: a table of ``--rows`` rows, then ``--trickle`` updates of random keys, repeated
  ``--repeats`` times (the median is reported).

Headwater's Iceberg writer runs twice: copy-on-write (the default) and merge-on-read
(``merge_on_read=True``: new rows plus position deletes; it rewrites instead when a batch
changes over a quarter of the rows it touches, as the bulk case does).

Headwater's writers get the raw change batch (they plan it: latest change per key, deletes).
pyiceberg's ``Table.upsert`` refuses a batch with a key twice and cannot delete, so it gets the
batch already reduced to the latest upsert per key (the reduction is not timed): it does less
than Headwater's writers. It is stopped after ``--upsert-timeout`` seconds (then the ratio is a
lower bound). Seeding the tables is not timed. The load average is printed beside the numbers.

    .venv/bin/python bench/iceberg_bench.py [--changes 1000000] [--keys 200000] [--rows 2000000] [--trickle 1000]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from core.warehouse_config import TableConfig
from log.sequence import Sequence
from warehouse_loader.changes import COMMIT_TS, OP, SEQ
from warehouse_loader.delta import writer as delta_writer
from warehouse_loader.iceberg import writer as iceberg_writer
from warehouse_loader.iceberg.catalog import embedded_catalog
from warehouse_loader.iceberg.table_ref import IcebergTableRef
from warehouse_loader.location import TableLocation

KEYS = ["id"]
SCD1 = TableConfig.model_validate({"from": "bench", "mode": "scd1"})


def make_changes(
    ids: np.ndarray, first_seq: int, seed: int, *, deletes: float = 0.03, creates: bool = True
) -> pa.Table:
    rng = np.random.default_rng(seed)
    n = len(ids)
    first = np.zeros(n, dtype=bool)
    if creates:
        _, first_at = np.unique(ids, return_index=True)
        first[first_at] = True
    ops = np.where(first, "c", np.where(rng.random(n) < deletes, "d", "u"))
    seqs = [Sequence(first_seq + i // 4, i % 4).sortable() for i in range(n)]
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


def latest_upserts(changes: pa.Table) -> pa.Table:
    """One row per key, its latest change, deletes dropped: what pyiceberg's upsert can take."""
    import duckdb

    con = duckdb.connect()
    con.register("c", changes)
    rows = con.sql(
        f'SELECT * FROM c QUALIFY row_number() OVER (PARTITION BY id ORDER BY "{SEQ}" DESC) = 1'
    ).to_arrow_table()
    return rows.filter(pc.not_equal(rows.column(OP), "d"))


def seed_rows(count: int) -> pa.Table:
    return make_changes(np.arange(count, dtype=np.int64), 1, seed=1, deletes=0.0)


class Engines:
    """The three engines on their own tables under ``root``."""

    def __init__(self, root: Path, name: str) -> None:
        self.root = root
        self.iceberg = IcebergTableRef(embedded_catalog(root), TableLocation(str(root / "wh")), name)
        self.mor = IcebergTableRef(embedded_catalog(root), TableLocation(str(root / "wh")), f"{name}_mor")
        self.bare = IcebergTableRef(embedded_catalog(root), TableLocation(str(root / "wh")), f"{name}_bare")
        self.delta = root / "delta" / name
        self.batch = 0

    def seed(self, rows: pa.Table) -> None:
        iceberg_writer.write_batch(self.iceberg, rows, table="b", batch_id=0, keys=KEYS, config=SCD1)
        iceberg_writer.write_batch(self.mor, rows, table="b", batch_id=0, keys=KEYS, config=SCD1)
        delta_writer.write_batch(self.delta, rows, table="b", batch_id=0, keys=KEYS, config=SCD1)
        catalog = self.bare.open_catalog()
        plain = rows.drop_columns([])  # pyiceberg's own table: the same rows, created by pyiceberg
        table = catalog.create_table(self.bare.identifier, schema=plain.schema, location=self.bare.location_uri)
        table.append(plain)
        self.batch = 1

    def headwater_iceberg(self, changes: pa.Table) -> float:
        started = time.perf_counter()
        iceberg_writer.write_batch(self.iceberg, changes, table="b", batch_id=self.batch, keys=KEYS, config=SCD1)
        return time.perf_counter() - started

    def headwater_iceberg_mor(self, changes: pa.Table) -> float:
        started = time.perf_counter()
        iceberg_writer.write_batch(
            self.mor, changes, table="b", batch_id=self.batch, keys=KEYS, config=SCD1, merge_on_read=True
        )
        return time.perf_counter() - started

    def headwater_delta(self, changes: pa.Table) -> float:
        started = time.perf_counter()
        delta_writer.write_batch(self.delta, changes, table="b", batch_id=self.batch, keys=KEYS, config=SCD1)
        return time.perf_counter() - started

    def next_batch(self) -> None:
        self.batch += 1


def _bare_upsert(ref: IcebergTableRef, rows: pa.Table, out: Any) -> None:
    table = ref.open_catalog().load_table(ref.identifier)
    started = time.perf_counter()
    table.upsert(rows, join_cols=KEYS)
    out.put(time.perf_counter() - started)


def bare_upsert(ref: IcebergTableRef, rows: pa.Table, timeout: float) -> float | None:
    """pyiceberg's ``upsert`` in a spawned process, stopped after ``timeout`` s (None: it did not finish)."""
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    process = context.Process(target=_bare_upsert, args=(ref, rows, out))
    process.start()
    process.join(timeout)
    if process.is_alive():
        process.kill()
        process.join()
        return None
    return float(out.get()) if not out.empty() else None


def ratio(reference: float | None, ours: float, timeout: float) -> str:
    if reference is None:
        return f">= {timeout / ours:.1f}x (pyiceberg stopped after {timeout:.0f} s)"
    return f"{reference / ours:.1f}x"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--changes", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--trickle", type=int, default=1_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--upsert-timeout", type=float, default=600.0)
    parser.add_argument("--skip", default="", help="comma list: bulk, trickle")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    print(f"load average before: {os.getloadavg()}")
    with tempfile.TemporaryDirectory(prefix="iceberg-bench-") as scratch:
        root = Path(scratch)
        if "bulk" not in skip:
            engines = Engines(root / "bulk", "bulk")
            engines.seed(seed_rows(args.keys))
            rng = np.random.default_rng(3)
            changes = make_changes(rng.integers(0, args.keys, args.changes), 10_000_000, seed=5, creates=False)
            reduced = latest_upserts(changes)
            ice = engines.headwater_iceberg(changes)
            mor = engines.headwater_iceberg_mor(changes)
            delta = engines.headwater_delta(changes)
            bare = bare_upsert(engines.bare, reduced, args.upsert_timeout)
            print(
                f"bulk {args.changes:,} changes over {args.keys:,} keys into {args.keys:,} rows: "
                f"headwater iceberg {ice:.2f} s (merge-on-read mode {mor:.2f} s), headwater delta {delta:.2f} s, "
                f"pyiceberg upsert ({reduced.num_rows:,} reduced rows) "
                f"{'did not finish' if bare is None else f'{bare:.2f} s'}; "
                f"iceberg vs pyiceberg {ratio(bare, ice, args.upsert_timeout)}, iceberg vs delta {delta / ice:.2f}x"
            )
            print(f"load average: {os.getloadavg()}")
        if "trickle" not in skip:
            engines = Engines(root / "trickle", "trickle")
            engines.seed(seed_rows(args.rows))
            times: dict[str, list[float]] = {"iceberg": [], "mor": [], "delta": [], "bare": []}
            unfinished = False
            for repeat in range(args.repeats):
                engines.next_batch()
                rng = np.random.default_rng(100 + repeat)
                ids = rng.choice(args.rows, args.trickle, replace=False).astype(np.int64)
                changes = make_changes(ids, 20_000_000 + repeat * 10_000, seed=200 + repeat, deletes=0.0, creates=False)
                times["iceberg"].append(engines.headwater_iceberg(changes))
                times["mor"].append(engines.headwater_iceberg_mor(changes))
                times["delta"].append(engines.headwater_delta(changes))
                bare = bare_upsert(engines.bare, latest_upserts(changes), args.upsert_timeout)
                if bare is None:
                    unfinished = True
                else:
                    times["bare"].append(bare)
            ice, delta = statistics.median(times["iceberg"]), statistics.median(times["delta"])
            mor = statistics.median(times["mor"])
            bare_median = None if unfinished else statistics.median(times["bare"])
            print(
                f"trickle {args.trickle:,} updates into {args.rows:,} rows (median of {args.repeats}): "
                f"headwater iceberg copy-on-write {ice:.2f} s, merge-on-read {mor:.2f} s, "
                f"headwater delta {delta:.2f} s, "
                f"pyiceberg upsert {'did not finish' if bare_median is None else f'{bare_median:.2f} s'}; "
                f"vs pyiceberg: copy-on-write {ratio(bare_median, ice, args.upsert_timeout)}, "
                f"merge-on-read {ratio(bare_median, mor, args.upsert_timeout)}; "
                f"vs delta: copy-on-write {delta / ice:.2f}x, merge-on-read {delta / mor:.2f}x; all runs {times}"
            )
            print(f"load average: {os.getloadavg()}")


if __name__ == "__main__":
    main()
