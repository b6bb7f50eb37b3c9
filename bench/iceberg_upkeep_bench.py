"""Iceberg tables after a stream of one-second batches, with and without the maintenance stage's passes.

A table of ``--rows`` rows of ``id bigint, v int, pad text`` (~100-byte ``pad``) gets
``--batches`` batches of ``--changes`` random updates (issue 34's load: 300 updates/s, one batch
a second), written as the loader writes them (``IcebergFormat.write_batch``), once
copy-on-write (Iceberg's default) and once merge-on-read (``warehouse.merge_on_read: true``);
each with what the loader does after its commits (:class:`warehouse_loader.maintenance.PiledFiles`,
its compaction once the table's files pile up, under the lease the batch holds) and once with no
maintenance stage, once with a pass of :func:`operations.maintain.maintain_table` every
``--maintain-every`` batches (the default policy, but retention 0 with the floor lowered and
expiry due at every pass, so each pass expires all it may: the compressed day).
Then, against a fresh table holding the same rows
(written in one batch, in the same run): snapshots, manifests of the current snapshot, data and
delete files, files and MB on disk, the time to plan a scan (pyiceberg reads the manifests) and
a ``query`` (plan plus a DuckDB aggregate), best of 3; and the per-batch write time (p50 of the
first and of the last 20 batches; then the mean and the longest, which hold the loader's
compactions). The load average is printed beside the numbers.

    .venv/bin/python bench/iceberg_upkeep_bench.py [--rows 200000] [--batches 200] [--maintain-every 60]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.config import ProjectConfig, parse_config  # noqa: E402
from operations.maintain import maintain_table  # noqa: E402
from warehouse_loader.changes import COMMIT_TS, OP, SEQ  # noqa: E402
from warehouse_loader.formats import format_of, merge_on_read  # noqa: E402
from warehouse_loader.iceberg.maintenance import delete_files  # noqa: E402
from warehouse_loader.iceberg.scan import TableFiles  # noqa: E402
from warehouse_loader.load_job import table_path  # noqa: E402
from warehouse_loader.maintenance import PiledFiles  # noqa: E402

PAD = "x" * 100


def changes(ids: np.ndarray, seq: int, op: str) -> pa.Table:
    n = len(ids)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "v": pa.array(np.full(n, seq % 1_000_000), pa.int32()),
            "pad": pa.array([PAD] * n, pa.string()),
            SEQ: pa.array([f"{seq:016d}{i:08d}" for i in range(n)], pa.string()),
            OP: pa.array([op] * n, pa.string()),
            COMMIT_TS: pa.array(np.full(n, seq * 1_000_000), pa.int64()).cast(pa.timestamp("us", tz="UTC")),
        }
    )


def project(home: Path, mor: bool) -> ProjectConfig:
    body = {
        "project": "bench",
        "home": str(home),
        "warehouse": {
            "format": "iceberg",
            "merge_on_read": mor,
            "tables": {"t": {"from": "x", "mode": "scd1"}, "fresh": {"from": "x", "mode": "scd1"}},
            "maintenance": {"retention_s": 0, "interval_s": 1},  # expiry due at every pass
        },
    }
    return parse_config(body, home / "headwater.yaml")


def best(fn: Any, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def measure(config: ProjectConfig, name: str) -> dict[str, Any]:
    fmt = format_of(config, name)
    location = table_path(config, name)
    stored = fmt.open(location)
    assert stored is not None
    table = stored.table  # type: ignore[attr-defined]  # IcebergVersion
    files = TableFiles.of(table)
    on_disk = [p for sub in ("data", "metadata") for p in (Path(location.uri) / sub).rglob("*") if p.is_file()]

    def query() -> None:
        fresh = fmt.open(location)
        assert fresh is not None
        fresh.select("SELECT count(*), sum(v) FROM target")

    return {
        "snapshots": len(table.snapshots()),
        "manifests": len(table.current_snapshot().manifests(table.io)),
        "data files": len(files.files),
        "delete files": len(delete_files(table)),
        "files on disk": len(on_disk),
        "MB on disk": round(sum(p.stat().st_size for p in on_disk) / 1e6, 1),
        "plan s": round(best(lambda: TableFiles.of(fmt.open(location).table)), 3),  # type: ignore[union-attr]
        "query s": round(best(query), 3),
    }


def batch_writer(config: ProjectConfig) -> Callable[[str, pa.Table, int], float]:
    """Writes a batch into table ``t`` (compacting once its files pile up, as the loader does) or another; seconds."""
    fmt, location = format_of(config, "t"), table_path(config, "t")
    settings = config.warehouse.tables["t"]
    piled = PiledFiles(fmt.maintainer(location), config.warehouse.maintenance_of("t"))

    def write(name: str, batch: pa.Table, batch_id: int) -> float:
        started = time.perf_counter()
        written = fmt.write_batch(
            table_path(config, name),
            batch,
            table=name,
            batch_id=batch_id,
            keys=["id"],
            config=settings,
            merge_on_read=merge_on_read(config, name),
        )
        if name == "t":
            piled.after_commit(written.files)  # as the loader does, under the batch's lease
        return time.perf_counter() - started

    return write


def run(rows: int, batches: int, per_batch: int, every: int, mor: bool, maintained: bool) -> dict[str, Any]:
    rng = np.random.default_rng(7)
    with tempfile.TemporaryDirectory(prefix="iceberg-upkeep-") as scratch:
        config = project(Path(scratch), mor)
        fmt, location = format_of(config, "t"), table_path(config, "t")
        write = batch_writer(config)

        write("t", changes(np.arange(rows), 1, "c"), 0)
        times = []
        for n in range(1, batches + 1):
            times.append(write("t", changes(rng.choice(rows, per_batch, replace=False), n + 1, "u"), n))
            if maintained and n % every == 0:
                maintain_table(config, "t")
        after = measure(config, "t")
        final = fmt.open(location)
        assert final is not None
        current = final.select("SELECT id, v FROM target ORDER BY id")
        whole = changes(current.column("id").to_numpy(), 10**9, "c").set_column(1, "v", current.column("v"))
        write("fresh", whole, 0)
        fresh = measure(config, "fresh")
        same = fmt.open(table_path(config, "fresh")).select("SELECT id, v FROM target ORDER BY id")  # type: ignore[union-attr]
        assert same.equals(current)
    return {
        "variant": f"{'merge-on-read' if mor else 'copy-on-write'}, {'maintained' if maintained else 'no maintenance'}",
        "batch p50 first 20 / last 20 s": f"{statistics.median(times[:20]):.3f} / {statistics.median(times[-20:]):.3f}",
        "batch mean / max s": f"{statistics.mean(times):.3f} / {max(times):.3f}",
        "after": after,
        "fresh": fresh,
        "load": " ".join(f"{x:.1f}" for x in os.getloadavg()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--changes", type=int, default=300)
    parser.add_argument("--maintain-every", type=int, default=60)
    args = parser.parse_args()
    os.environ["HEADWATER_RETENTION_FLOOR_S"] = "0"
    for mor in (False, True):
        for maintained in (False, True):
            result = run(args.rows, args.batches, args.changes, args.maintain_every, mor, maintained)
            print(
                f"| {args.rows:,} | {result['variant']} | {result['batch p50 first 20 / last 20 s']} | "
                + " | ".join(f"{result['after'][k]} ({result['fresh'][k]})" for k in result["after"])
                + f" | {result['batch mean / max s']} | {result['load']} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
