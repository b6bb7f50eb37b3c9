"""The warehouse writer alone (no Spark, no capture): per-batch cost and bytes of a MERGE, and a compressed day.

Two tables like issue 34's, 200k and 2M rows of ``id bigint, v int, pad text`` (~100-byte
``pad``), written by :func:`warehouse_loader.delta.writer.write_batch` as the loader does.

* ``--batches`` batches of ``--changes`` random updates (300: one second at 300 updates/s) go
  to each table, the tables interleaved batch by batch so both see the same machine, once
  copy-on-write (delta-rs's MERGE; ``merge_on_read: false``) and once merge-on-read
  (the default), with a maintenance pass (:func:`operations.maintain.maintain_table`'s steps
  through the Delta maintainer, default policy) every ``--maintain-every`` batches for the
  latter. Printed: per-batch time (p50, p90), bytes written per change (data files, deletion
  vectors, log entries: everything the batches and the maintenance passes added), files.
* a long run: ``--day-batches`` one-second batches of ``--day-changes`` updates (600 x 300:
  ten minutes of issue 34's load, back to back) into each merge-on-read table with a
  maintenance pass every ``--day-maintain-every`` batches (the stage's minute); then its files
  and ``query`` time (Headwater's DuckDB view and delta-rs's query engine) against a fresh
  table holding the same rows. Every quantity that grows with time is bounded by the policy
  (small files by ``compact_min_small_files``, removed rows by ``compact_dirty_ratio``, log
  entries by the retention and the checkpoint interval), so the state after ten minutes of
  maintenance cycles is the state after a day.

* ``--s3``: the per-batch comparison on ``s3://`` tables of a local ``moto_server`` (in-memory S3
  over HTTP: merge-on-read's conditional-PUT commits against delta-rs's copy-on-write MERGE on
  the same store; the long run stays local).

    .venv/bin/python bench/merge_cost_bench.py [--rows 200000,2000000] [--batches 60] [--day-batches 864] [--s3]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
from deltalake import DeltaTable, QueryBuilder, write_deltalake

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.warehouse_config import MaintenanceConfig, TableConfig  # noqa: E402
from warehouse_loader.changes import COMMIT_TS, OP, SEQ  # noqa: E402
from warehouse_loader.delta.maintenance import DeltaMaintainer  # noqa: E402
from warehouse_loader.delta.writer import write_batch  # noqa: E402
from warehouse_loader.location import TableLocation, as_location  # noqa: E402
from warehouse_loader.maintenance import plan, small_file_size  # noqa: E402
from warehouse_loader.query import run_query  # noqa: E402

SCD1 = TableConfig.model_validate({"from": "x", "mode": "scd1"})
POLICY = MaintenanceConfig()
ROW_BYTES = 8 + 4 + 100


class Table:
    """One benchmark table: its directory, next batch id and sequence, and a byte meter over its files."""

    def __init__(self, root: Path | TableLocation, rows: int, variant: str, name: str = "") -> None:
        self.path = root / f"{name}t{rows}_{variant}"
        self.rows = rows
        self.variant = variant
        self.batch = 0
        self.seq = 1
        self.rng = np.random.default_rng(rows)
        pad = [f"{i:032x}" * 3 + f"{i % 10000:04d}" for i in range(rows)]
        first = self._changes(np.arange(rows), np.zeros(rows, np.int32), "c", pad)
        write_batch(self.path, first, table="t", batch_id=0, keys=["id"], config=SCD1)
        self.pad = pa.array(pad)
        self.seen: dict[str, int] = {}
        self.meter()

    def _changes(self, ids: np.ndarray, values: np.ndarray, op: str, pad: Any) -> pa.Table:
        n = len(ids)
        seqs = [f"{self.seq:012d}{i:08d}" for i in range(n)]
        self.seq += 1
        return pa.table(
            {
                "id": pa.array(ids, pa.int64()),
                "v": pa.array(values, pa.int32()),
                "pad": pad,
                SEQ: pa.array(seqs),
                OP: pa.array([op] * n),
                COMMIT_TS: pa.array([self.seq * 1_000_000] * n, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
            }
        )

    def update(self, count: int) -> float:
        """One batch of ``count`` random updates; its wall time."""
        ids = self.rng.choice(self.rows, count, replace=False)
        changes = self._changes(ids, np.full(count, self.batch + 1, np.int32), "u", self.pad.take(pa.array(ids)))
        self.batch += 1
        started = time.perf_counter()
        write_batch(
            self.path,
            changes,
            table="t",
            batch_id=self.batch,
            keys=["id"],
            config=SCD1,
            merge_on_read=self.variant == "mor",
        )
        return time.perf_counter() - started

    def maintain(self) -> int:
        """Compaction and checkpoint as the maintenance stage would decide them (no vacuum: bytes are counted).

        Returns 1 when it compacted, else 0.
        """
        maintainer = DeltaMaintainer(as_location(self.path))
        shape = maintainer.shape(small_file_size(POLICY))
        assert shape is not None
        todo = plan(shape, POLICY, dt.datetime.now(dt.UTC))
        if todo.compact:
            maintainer.compact(POLICY.target_file_size, small_file_size(POLICY), POLICY.compact_dirty_ratio)
        if todo.checkpoint or todo.compact:
            maintainer.checkpoint()
        return int(bool(todo.compact))

    def meter(self) -> int:
        """Bytes of files that appeared since the last call (nothing is vacuumed here)."""
        fs, root = as_location(self.path).filesystem()
        new = 0
        for info in fs.get_file_info(pafs.FileSelector(root, recursive=True)):
            if info.type == pafs.FileType.File and info.path not in self.seen:
                self.seen[info.path] = int(info.size or 0)
                new += self.seen[info.path]
        return new

    def files(self) -> int:
        location = as_location(self.path)
        return len(DeltaTable(location.uri, storage_options=location.storage_options).file_uris())


def query_times(path: Path, positional_files: int | None = None) -> tuple[float, float]:
    """Best of three: ``headwater query``'s engine and delta-rs's query engine, count and sum over the table.

    ``positional_files``: :data:`warehouse_loader.delta.scan.POSITIONAL_FILES` for the run
    (0: every file with removed rows anti-joined by position, as before files were read beside
    their keep-masks).
    """
    from warehouse_loader.delta import scan

    saved = scan.POSITIONAL_FILES
    scan.POSITIONAL_FILES = saved if positional_files is None else positional_files
    try:
        return _query_times(path)
    finally:
        scan.POSITIONAL_FILES = saved


def _query_times(path: Path) -> tuple[float, float]:
    ours, theirs = [], []
    for _ in range(3):
        started = time.perf_counter()
        run_query("SELECT count(*) AS n, sum(v) AS s FROM t", {"t": as_location(path)})
        ours.append(time.perf_counter() - started)
        started = time.perf_counter()
        QueryBuilder().register("t", DeltaTable(str(path))).execute("SELECT count(*), sum(v) FROM t").read_all()
        theirs.append(time.perf_counter() - started)
    return min(ours), min(theirs)


def load_average() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def per_batch(root: Path | TableLocation, sizes: list[int], args: argparse.Namespace) -> None:
    tables = [Table(root, rows, variant) for variant in ("cow", "mor") for rows in sizes]
    times: dict[str, list[float]] = {t.path.name: [] for t in tables}
    written = dict.fromkeys(times, 0)
    for table in tables:
        table.update(args.changes)  # warm-up (the merge-on-read one switches to deletion vectors here)
        table.meter()
    for number in range(1, args.batches + 1):
        for table in tables:
            times[table.path.name].append(table.update(args.changes))
            if table.variant == "mor" and number % args.maintain_every == 0:
                table.maintain()
            written[table.path.name] += table.meter()
    where = "s3 (moto)" if isinstance(root, TableLocation) else "local disk"
    print(f"\nper batch, {where}, {args.batches} batches of {args.changes} random updates (load {load_average()})")
    print("| table | variant | batch p50 s | p90 s | bytes per change (x change) | files |")
    print("| --- | --- | --- | --- | --- | --- |")
    p50 = {}
    for table in tables:
        name = table.path.name
        p50[name] = statistics.median(times[name])
        per_change = written[name] / (args.batches * args.changes)
        print(
            f"| {table.rows:,} | {table.variant} | {p50[name]:.3f} | "
            f"{statistics.quantiles(times[name], n=10)[-1]:.3f} | {per_change:,.0f} ({per_change / ROW_BYTES:,.1f}x) | "
            f"{table.files()} |"
        )
    for variant in ("cow", "mor"):
        small, large = (p50[f"t{rows}_{variant}"] for rows in (min(sizes), max(sizes)))
        print(f"{variant}: per-batch p50 {max(sizes):,} / {min(sizes):,} rows = {large / small:.2f}")
    for table in tables:
        as_location(table.path).remove()


def day(root: Path, sizes: list[int], args: argparse.Namespace) -> None:
    every = args.day_maintain_every
    print(f"\nlong run: {args.day_batches} batches of {args.day_changes} updates, maintenance every {every} batches")
    print(
        "| table | changes (x table) | compactions | bytes per change (x change) | files after | fresh table files "
        "| query s after (ours / delta-rs) | ours, files anti-joined | fresh (ours / delta-rs) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for rows in sizes:
        table = Table(root, rows, "mor", "day")
        written = compactions = 0
        changes = min(args.day_changes, rows)
        for number in range(1, args.day_batches + 1):
            table.update(changes)
            if number % every == 0:
                compactions += table.maintain()
            written += table.meter()
        compactions += table.maintain()
        written += table.meter()
        per_change = written / (args.day_batches * changes)
        after = query_times(table.path)
        anti_joined = query_times(table.path, positional_files=0)
        current = run_query("SELECT id, v, pad FROM t ORDER BY id", {"t": as_location(table.path)})
        fresh = root / f"fresh{rows}"
        write_deltalake(str(fresh), current)
        before = query_times(fresh)
        print(
            f"| {rows:,} | {args.day_batches * changes:,} ({args.day_batches * changes / rows:.2f}) | {compactions} | "
            f"{per_change:,.0f} ({per_change / ROW_BYTES:,.1f}x) | {table.files()} | "
            f"{len(DeltaTable(str(fresh)).file_uris())} | "
            f"{after[0]:.3f} / {after[1]:.3f} | {anti_joined[0]:.3f} | {before[0]:.3f} / {before[1]:.3f} |"
        )
        shutil.rmtree(table.path)
        shutil.rmtree(fresh)
    print(f"(load {load_average()})")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", default="200000,2000000")
    parser.add_argument("--batches", type=int, default=60)
    parser.add_argument("--changes", type=int, default=300)
    parser.add_argument("--maintain-every", type=int, default=10)
    parser.add_argument("--day-batches", type=int, default=600)
    parser.add_argument("--day-changes", type=int, default=300)
    parser.add_argument("--day-maintain-every", type=int, default=60)
    parser.add_argument("--s3", action="store_true", help="per-batch tables on a local moto_server's S3")
    args = parser.parse_args()
    sizes = [int(r) for r in args.rows.split(",")]
    root = Path(tempfile.mkdtemp(prefix="headwater-merge-cost-"))
    print(f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC")
    moto = None
    try:
        if args.batches and args.s3:
            sys.path.insert(0, str(ROOT / "tests"))
            from harness.broker import MotoS3
            from harness.moto import create_bucket, warehouse_options

            moto = MotoS3().start()
            bucket = create_bucket(moto, "merge-cost")
            per_batch(TableLocation(bucket, tuple(sorted(warehouse_options(moto).items()))), sizes, args)
        elif args.batches:
            per_batch(root, sizes, args)
        if args.day_batches:
            day(root, sizes, args)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        if moto is not None:
            moto.stop()


if __name__ == "__main__":
    main()
