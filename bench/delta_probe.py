"""What the installed deltalake (delta-rs) does with the maintenance and layout features issue 34 needs.

Each line printed is one fact, checked on real tables in a temporary directory (nothing
assumed from documentation): checkpoints, compaction and its target size, z-order,
vacuum (lite and full), log cleanup, deletion vectors (read and write), column mapping,
partitioning, and what DuckDB reads of a table with deletion vectors.

    .venv/bin/python bench/delta_probe.py
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
from deltalake import DeltaTable, QueryBuilder, __version__, write_deltalake

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.warehouse_config import TableConfig  # noqa: E402
from warehouse_loader.changes import COMMIT_TS, OP, SEQ  # noqa: E402
from warehouse_loader.delta import merge_on_read  # noqa: E402
from warehouse_loader.delta.writer import write_batch  # noqa: E402


def fact(name: str, value: object) -> None:
    print(f"- {name}: {value}")


def count(table: DeltaTable) -> int:
    return int(pa.table(QueryBuilder().register("t", table).execute("SELECT count(*) AS n FROM t").read_all())[0][0])


def rows(n: int, start: int = 0) -> pa.Table:
    return pa.table({"id": pa.array(np.arange(start, start + n), pa.int64()), "v": pa.array(np.zeros(n, np.int32))})


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="headwater-delta-probe-"))
    print(f"deltalake {__version__}, DuckDB {duckdb.__version__}")
    try:
        path = str(root / "a")
        write_deltalake(path, rows(1000))
        table = DeltaTable(path)
        for i in range(100):
            table.merge(
                rows(1, i), "t.id = s.id", source_alias="s", target_alias="t"
            ).when_matched_update_all().execute()
        logs = sorted(p.name for p in (root / "a" / "_delta_log").iterdir() if "checkpoint" in p.name)
        fact("checkpoint written by delta-rs itself after 100 commits (post-commit hook)", logs)
        fact("files after 100 one-row MERGEs (copy-on-write: the file rewritten each time)", len(table.file_uris()))
        for i in range(5):
            write_deltalake(path, rows(10, 5000 + 10 * i), mode="append")
        table = DeltaTable(path)
        before = len(table.file_uris())
        metrics = table.optimize.compact(target_size=1 << 20)
        fact(
            f"optimize.compact of {before} files",
            f"{metrics['numFilesRemoved']} removed, {metrics['numFilesAdded']} added",
        )
        metrics = DeltaTable(path).optimize.z_order(["id"])
        fact("optimize.z_order(['id'])", f"rewrites {metrics['numFilesRemoved']} files (every file)")
        doomed_lite = DeltaTable(path).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=True)
        doomed_full = DeltaTable(path).vacuum(
            retention_hours=0, enforce_retention_duration=False, dry_run=True, full=True
        )
        fact("vacuum lite / full (dry run, retention 0)", f"{len(doomed_lite)} / {len(doomed_full)} files")
        table = DeltaTable(path)
        table.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
        fact("vacuum commits", [c["operation"] for c in DeltaTable(path).history(2)])

        dv_path = root / "dv"
        write_deltalake(str(dv_path), rows(1000), configuration={"delta.enableDeletionVectors": "true"})
        dv = DeltaTable(str(dv_path))
        fact("deletion vector feature at creation", dv.protocol())
        dv.delete("id < 10")
        dv = DeltaTable(str(dv_path))
        fact(
            "delta-rs DELETE on a deletion-vector table writes a deletion vector",
            sum(1 for _ in dv.deletion_vectors()) > 0,
        )
        try:
            dv.to_pyarrow_dataset()
            fact("to_pyarrow_dataset of a deletion-vector table", "reads")
        except Exception as exc:
            fact("to_pyarrow_dataset of a deletion-vector table", str(exc).splitlines()[0])

        mor = root / "mor"
        merge_on_read.MIN_TABLE_BYTES = 0
        config = TableConfig.model_validate({"from": "x", "mode": "scd1"})

        def changes(ids: list[int], seq: int) -> pa.Table:
            return pa.table(
                {
                    "id": pa.array(ids, pa.int64()),
                    "v": pa.array([seq] * len(ids), pa.int32()),
                    SEQ: pa.array([f"{seq:010d}{i:08d}" for i in range(len(ids))]),
                    OP: pa.array(["u"] * len(ids)),
                    COMMIT_TS: pa.array([seq * 1_000_000] * len(ids), pa.int64()).cast(pa.timestamp("us", tz="UTC")),
                }
            )

        write_batch(mor, changes(list(range(1000)), 1), table="t", batch_id=0, keys=["id"], config=config)
        write_batch(mor, changes([1, 2, 3], 2), table="t", batch_id=1, keys=["id"], config=config, merge_on_read=True)
        write_batch(mor, changes([4, 5], 3), table="t", batch_id=2, keys=["id"], config=config, merge_on_read=True)
        table = DeltaTable(str(mor))
        files = table.file_uris()
        plain = duckdb.sql(f"SELECT count(*) FROM read_parquet({files})").fetchall()[0]
        fact(
            "Headwater merge-on-read: rows by delta-rs's query engine / DuckDB read_parquet of file_uris()",
            f"{count(table)} / {plain[0]}",
        )
        metrics = table.optimize.compact(target_size=1)
        fact(
            "optimize.compact with target below every file's size",
            f"{metrics['numFilesRemoved']} files rewritten (deletion vectors stay)",
        )
        metrics = DeltaTable(str(mor)).optimize.compact()
        fact(
            "optimize.compact (default target): rows after", f"{count(DeltaTable(str(mor)))} (deletion vectors applied)"
        )

        try:
            cm = root / "cm"
            write_deltalake(str(cm), rows(10), configuration={"delta.columnMapping.mode": "name"})
            fact("column mapping (name) at creation", DeltaTable(str(cm)).protocol())
        except Exception as exc:
            fact("column mapping (name) at creation", str(exc).splitlines()[0])

        part = root / "part"
        data = rows(1000).append_column("bucket", pa.array(np.arange(1000) % 8, pa.int32()))
        write_deltalake(str(part), data, partition_by=["bucket"], target_file_size=1 << 20)
        table = DeltaTable(str(part))
        source = data.slice(0, 3)
        stats = (
            table.merge(source, "t.bucket = s.bucket AND t.id = s.id", source_alias="s", target_alias="t")
            .when_matched_update_all()
            .execute()
        )
        fact(
            "partitioned by a key bucket (8): MERGE of 3 keys rewrites",
            f"{stats['num_target_files_removed']} of {len(table.file_uris())} files",
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
