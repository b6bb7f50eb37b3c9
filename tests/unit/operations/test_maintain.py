"""A maintenance pass on real Delta tables (deltalake is a library): compaction, checkpoint, vacuum, leases."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pyarrow as pa
import pytest
import yaml
from deltalake import DeltaTable, QueryBuilder

from core.config import ProjectConfig, load_config
from core.leases import HeldError
from core.table_leases import committing, reading
from operations import maintain as maintain_module
from operations.maintain import last_runs, maintain_table, maintenance_status
from warehouse_loader.changes import COMMIT_TS, OP, SEQ
from warehouse_loader.delta.writer import TOMBSTONES_DIR, loaded_key, write_scd1
from warehouse_loader.load_job import table_path


def project(tmp_path: Path, **maintenance: object) -> ProjectConfig:
    settings = {"target_file_size": 1 << 20, "compact_min_small_files": 4, **maintenance}
    body = {
        "project": "p",
        "warehouse": {"tables": {"t": {"from": "src.public.t", "mode": "scd1"}}, "maintenance": settings},
    }
    (tmp_path / "headwater.yaml").write_text(yaml.safe_dump(body))
    return load_config(tmp_path / "headwater.yaml")


def batch(ids: list[int], value: int, seq: int, op: str = "u") -> pa.Table:
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "v": pa.array([value] * len(ids), pa.int32()),
            SEQ: pa.array([f"{seq:020d}{i:08d}" for i in range(len(ids))], pa.string()),
            OP: pa.array([op] * len(ids), pa.string()),
            COMMIT_TS: pa.array([seq * 1_000_000] * len(ids), pa.int64()).cast(pa.timestamp("us", tz="UTC")),
        }
    )


def load(config: ProjectConfig, batches: int) -> None:
    path = table_path(config, "t")
    write_scd1(path, batch(list(range(1000)), 0, 1, "c"), table="t", batch_id=0, keys=["id"])
    for n in range(1, batches + 1):
        # new keys only: a MERGE that matches nothing adds a file and removes none (small files pile up)
        ids = [1000 * n + i for i in range(20)]
        write_scd1(path, batch(ids, n, n + 1, "c"), table="t", batch_id=2 * n - 1, keys=["id"])
        # a delete of a key the table never had: the tombstone side table grows, no data file is rewritten
        write_scd1(path, batch([10**9 + n], 0, n + 1_000_000, "d"), table="t", batch_id=2 * n, keys=["id"])


def rows(path: Path) -> list[dict[str, object]]:
    """The table as delta-rs's own query engine reads it (a reader Headwater did not write)."""
    reader = QueryBuilder().register("t", DeltaTable(str(path)))
    return pa.table(reader.execute("SELECT id, v FROM t ORDER BY id").read_all()).to_pylist()  # type: ignore[no-any-return]


def test_a_pass_compacts_checkpoints_and_keeps_rows_and_key(tmp_path: Path) -> None:
    config = project(tmp_path)
    load(config, 12)
    path = Path(str(table_path(config, "t")))
    before, files_before = rows(path), len(DeltaTable(str(path)).file_uris())
    assert files_before >= 4
    done = maintain_table(config, "t")
    main, side = done
    assert main.table == "t" and side.table == f"t/{TOMBSTONES_DIR}"
    assert main.compacted_files == files_before and main.written_files == 1 and main.checkpointed
    assert side.compacted_files > 1 and side.checkpointed
    assert rows(path) == before
    assert len(DeltaTable(str(path)).file_uris()) == 1
    assert loaded_key(table_path(config, "t")) == ("id",)  # the maintenance commits name the key
    state = last_runs(config, "t")
    assert {"last_compaction", "last_checkpoint", "last_vacuum"} <= set(state)
    status = maintenance_status(config, "t")
    assert status["files"] == 1 and status["dirty_ratio"] == 0.0 and status["commits_since_checkpoint"] == 0
    # Nothing was vacuumed: every replaced file is younger than the retention's one-hour floor.
    assert main.vacuumed_files == 0 and len(list(path.glob("*.parquet"))) > 1


def test_vacuum_removes_replaced_files_unless_a_reader_holds_the_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = project(tmp_path)
    load(config, 6)
    path = Path(str(table_path(config, "t")))
    maintain_table(config, "t")
    monkeypatch.setattr(maintain_module, "effective_retention_s", lambda _settings: 0.0)
    (tmp_path / ".headwater" / "maintenance" / "t.json").unlink()  # expiry is due again
    before = rows(path)
    with reading(config.home_dir, "t"):
        held = maintain_table(config, "t")
    assert held[0].deferred and held[0].vacuumed_files == 0
    done = maintain_table(config, "t")
    assert done[0].vacuumed_files > 0 and done[0].vacuumed_bytes > 0
    assert sorted(p.name for p in path.glob("*.parquet")) == [
        os.path.basename(uri) for uri in DeltaTable(str(path)).file_uris()
    ]
    assert rows(path) == before


def test_maintenance_waits_for_the_commit_lease(tmp_path: Path) -> None:
    config = project(tmp_path)
    load(config, 5)
    with committing(config.home_dir, "t"), pytest.raises(HeldError, match="commits to warehouse table t"):
        maintain_table(config, "t", commit_wait_s=0.2)


def test_merge_on_read_table_is_purged_and_its_old_deletion_vectors_collected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from warehouse_loader.delta import merge_on_read
    from warehouse_loader.delta.deletion_vectors import DV_DIR
    from warehouse_loader.delta.writer import write_batch

    monkeypatch.setattr(merge_on_read, "MIN_TABLE_BYTES", 0)
    config = project(tmp_path, target_file_size=1 << 20, compact_min_small_files=100, compact_dirty_ratio=0.1)
    location = table_path(config, "t")
    path = Path(str(location))
    settings = config.warehouse.tables["t"]
    write_batch(location, batch(list(range(1000)), 0, 1, "c"), table="t", batch_id=0, keys=["id"], config=settings)
    for n in range(1, 9):  # 8 x 20 updates of the 1,000 rows: 16 % removed by deletion vectors
        ids = [(n * 131 + i * 7) % 1000 for i in range(20)]
        write_batch(
            location, batch(ids, n, n + 1), table="t", batch_id=n, keys=["id"], config=settings, merge_on_read=True
        )
    before = rows(path)
    status = maintenance_status(config, "t")
    assert status["deleted_rows"] == 160 and status["dirty_ratio"] >= 0.16
    assert len(list((path / DV_DIR).glob("*.bin"))) == 8  # one file per merge-on-read commit
    done = maintain_table(config, "t")
    assert done[0].compacted_files >= 1
    assert rows(path) == before  # as delta-rs reads it
    assert maintenance_status(config, "t")["deleted_rows"] == 0
    # With no retention left, vacuum removes the replaced files and every deletion vector file no
    # version in the log uses; the log still holds versions that use some of them.
    monkeypatch.setattr(maintain_module, "effective_retention_s", lambda _settings: 0.0)
    (tmp_path / ".headwater" / "maintenance" / "t.json").unlink()
    done = maintain_table(config, "t")
    assert done[0].vacuumed_files > 0
    assert rows(path) == before
    left = {p.name for p in (path / DV_DIR).glob("*.bin")}
    from warehouse_loader.delta.deletion_vectors import referenced_files
    from warehouse_loader.delta.table_files import table_files

    assert left == referenced_files(table_files(location))  # exactly those the remaining log names


def test_log_expiry_keeps_every_version_inside_the_retention_readable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = project(tmp_path)
    load(config, 6)
    path = Path(str(table_path(config, "t")))
    maintain_table(config, "t")  # compaction and a checkpoint
    checkpointed = DeltaTable(str(path)).version()
    for n in range(7, 12):
        write_scd1(table_path(config, "t"), batch([1000 * n], n, n + 1, "c"), table="t", batch_id=2 * n, keys=["id"])
    newest = DeltaTable(str(path)).version()
    old = time.time() - 1000
    for entry in (path / "_delta_log").glob("*.json"):  # entries up to two after the checkpoint are old
        if int(entry.name.split(".")[0]) <= checkpointed + 2:
            os.utime(entry, (old, old))
    monkeypatch.setattr(maintain_module, "effective_retention_s", lambda _settings: 500.0)
    (tmp_path / ".headwater" / "maintenance" / "t.json").unlink()
    done = maintain_table(config, "t")
    assert done[0].expired_log_entries > 0
    for version in range(checkpointed, newest + 1):  # the cutoff commit's checkpoint and everything after
        DeltaTable(str(path), version=version).file_uris()
    with pytest.raises(Exception, match=r"(?i)not found|no files|invalid|version"):
        DeltaTable(str(path), version=checkpointed - 2).file_uris()
