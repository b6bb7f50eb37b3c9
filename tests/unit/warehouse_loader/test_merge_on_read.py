"""Merge-on-read MERGEs (deletion vectors) against delta-rs's copy-on-write MERGE: the same batches, the same rows.

Two tables get the same random change batches (late changes, deletes, re-inserts): one
through delta-rs's MERGE, one merge-on-read. After every batch both are read by delta-rs's
own query engine (a reader Headwater did not write) and by Headwater's DuckDB view; the rows
must be equal, including after compaction and checkpoints of the merge-on-read table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, QueryBuilder
from harness.auto_cdc_examples import KEYS, random_batches

from core.warehouse_config import TableConfig
from warehouse_loader.delta import log_entry, merge_on_read, scan
from warehouse_loader.delta.deletion_vectors import DV_DIR, decode, encode
from warehouse_loader.delta.evolution import evolve
from warehouse_loader.delta.maintenance import DeltaMaintainer
from warehouse_loader.delta.scan import select_rows
from warehouse_loader.delta.writer import write_batch
from warehouse_loader.duckdb_connection import duckdb_connection
from warehouse_loader.location import as_location
from warehouse_loader.schema_evolution import TableChanges

SCD1 = TableConfig.model_validate({"from": "users_feed", "mode": "scd1"})
SCD2 = TableConfig.model_validate({"from": "users_feed", "mode": "scd2"})
IGNORE_NULLS = TableConfig.model_validate({"from": "users_feed", "mode": "scd1", "ignore_null_updates": True})


def foreign(path: Path) -> list[dict[str, Any]]:
    """Every row as delta-rs's query engine reads it (deletion vectors applied by delta-rs)."""
    reader = QueryBuilder().register("t", DeltaTable(str(path)))
    table = pa.table(reader.execute("SELECT * FROM t").read_all())
    return sorted(table.to_pylist(), key=repr)


def ours(path: Path) -> list[dict[str, Any]]:
    """Every row as Headwater's DuckDB view reads it."""
    table = select_rows(as_location(path), DeltaTable(str(path)), "SELECT * FROM target")
    return sorted(table.to_pylist(), key=repr)


def merge_on_read_table(path: Path, monkeypatch: pytest.MonkeyPatch, seed: int, count: int) -> DeltaTable:
    """``count`` random batches of ``seed`` written merge-on-read from the first (a table with deletion vectors)."""
    monkeypatch.setattr(merge_on_read, "MIN_TABLE_BYTES", 0)
    for batch_id, batch in enumerate(random_batches(seed, count)):
        write_batch(path, batch, table="u", batch_id=batch_id, keys=KEYS, config=SCD1, merge_on_read=True)
    return DeltaTable(str(path))


@pytest.mark.parametrize(
    ("config", "seed"),
    # Both seeds' streams on SCD1 (the default mode), one each on the other modes (each seed's
    # stream still runs through two modes): a case costs 60-150 s on a loaded 2-core machine.
    [(SCD1, 1), (SCD1, 2), (SCD2, 1), (IGNORE_NULLS, 2)],
    ids=["scd1-1", "scd1-2", "scd2-1", "scd1-ignore-nulls-2"],
)
def test_merge_on_read_leaves_the_rows_copy_on_write_leaves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, config: TableConfig, seed: int
) -> None:
    monkeypatch.setattr(merge_on_read, "MIN_TABLE_BYTES", 0)  # switch at the first batch after creation
    monkeypatch.setattr(log_entry, "CHECKPOINT_INTERVAL", 7)
    # A space and a percent sign in the path: delta-rs percent-encodes its file URIs, DuckDB reads paths.
    cow, mor = tmp_path / "cow", tmp_path / "merge on read 5%"
    used_vectors = False
    for batch_id, batch in enumerate(random_batches(seed, 30)):
        write_batch(cow, batch, table="u", batch_id=batch_id, keys=KEYS, config=config)
        write_batch(mor, batch, table="u", batch_id=batch_id, keys=KEYS, config=config, merge_on_read=True)
        expected = foreign(cow)
        assert foreign(mor) == expected, f"batch {batch_id}"
        assert ours(mor) == expected, f"batch {batch_id}"
        used_vectors = used_vectors or any(True for _ in (mor / DV_DIR).glob("*.bin"))
        if batch_id in (12, 24):  # compaction rewrites files with deletion vectors; checkpoints keep them
            DeltaMaintainer(as_location(mor)).compact(1 << 20, 1 << 16, 0.05)  # packs small files, purges
            DeltaMaintainer(as_location(mor)).checkpoint()
            assert foreign(mor) == expected
    assert used_vectors
    engines = [c.get("engineInfo") for c in DeltaTable(str(mor)).history()]
    assert engines.count("headwater merge-on-read") >= 20  # the batches after the first went merge-on-read
    assert DeltaTable(str(mor)).transaction_version("u") == 29


def test_a_replayed_batch_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    version = merge_on_read_table(tmp_path, monkeypatch, 9, 4).version()
    last = random_batches(9, 4)[3]
    result = write_batch(tmp_path, last, table="u", batch_id=3, keys=KEYS, config=SCD1, merge_on_read=True)
    assert result.skipped and DeltaTable(str(tmp_path)).version() == version


def test_small_tables_stay_copy_on_write(tmp_path: Path) -> None:
    for batch_id, batch in enumerate(random_batches(4, 5)):
        write_batch(tmp_path, batch, table="u", batch_id=batch_id, keys=KEYS, config=SCD1, merge_on_read=True)
    assert not merge_on_read.has_deletion_vectors(DeltaTable(str(tmp_path)))
    DeltaTable(str(tmp_path)).to_pyarrow_table()  # readable by readers without deletion vector support


def test_roaring_encoding_of_large_and_sparse_sets() -> None:
    """Array and bitmap containers and a second 32-bit key, read back by delta-rs on a real table."""
    import numpy as np

    dense = np.arange(0, 70_000, dtype=np.uint64)  # one bitmap container (65,536) and an array container
    positions = np.concatenate([dense, np.array([5_000_000_000], dtype=np.uint64)])
    data = encode(positions)
    assert data[:4] == (1681511377).to_bytes(4, "little") and int.from_bytes(data[4:12], "little") == 2
    assert np.array_equal(decode(data), positions)
    sparse = np.unique(np.random.default_rng(3).integers(0, 3_000_000, 50_000, dtype=np.uint64))
    assert np.array_equal(decode(encode(sparse)), sparse)


def test_a_rename_rewrites_a_table_with_deletion_vectors_without_the_rows_they_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rewrite of a schema change reads through the vectors (delta-rs's dataset refuses such a table)."""
    assert merge_on_read.has_deletion_vectors(merge_on_read_table(tmp_path, monkeypatch, 5, 8))
    before = foreign(tmp_path)
    assert evolve(tmp_path, TableChanges(renames=(("name", "full_name"),)), keys=KEYS)
    renamed = [{("full_name" if k == "name" else k): v for k, v in row.items()} for row in before]
    assert foreign(tmp_path) == sorted(renamed, key=repr)
    assert ours(tmp_path) == sorted(renamed, key=repr)


@pytest.mark.parametrize("positional", [True, False], ids=["beside-keep-masks", "anti-joined"])
def test_the_view_leaves_removed_rows_out_under_filters_either_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, positional: bool
) -> None:
    """Files read beside their keep-masks (up to ``POSITIONAL_FILES``) or anti-joined by position: the same rows.

    Filters over the view must not reach a file scanned beside its mask (a row filtered out
    there would shift every later row against the mask): each key alone, a non-key condition
    and a range, all compared with delta-rs's own query engine.
    """
    monkeypatch.setattr(scan, "POSITIONAL_FILES", 32 if positional else 0)
    table = merge_on_read_table(tmp_path, monkeypatch, 3, 6)
    assert len(scan.keep_masks(table)) > 1, "no file has removed rows: the case tests nothing"
    con = duckdb_connection()
    scan.register_delta(con, "target", table)
    plan = con.sql("EXPLAIN SELECT * FROM target").fetchall()[0][1]
    con.close()
    assert ("POSITIONAL" in plan.upper()) == positional, plan
    assert ours(tmp_path) == foreign(tmp_path)
    conditions = [f'"userId" = {key}' for key in range(0, 40, 3)] + ["name IS NULL", '"userId" BETWEEN 10 AND 25']
    reader = QueryBuilder().register("t", table)
    for condition in conditions:
        theirs = pa.table(reader.execute(f"SELECT * FROM t WHERE {condition}").read_all()).to_pylist()
        mine = select_rows(as_location(tmp_path), table, f"SELECT * FROM target WHERE {condition}").to_pylist()
        assert sorted(mine, key=repr) == sorted(theirs, key=repr), condition


def test_keep_masks_from_our_vector_files_equal_delta_rs_reading_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Our ``_hw_dv/`` files read by our decoder give the masks delta-rs's ``deletion_vectors()`` gives.

    Ours cover their whole file (a byte per row); delta-rs's stop at the last removed row.
    """
    table = merge_on_read_table(tmp_path, monkeypatch, 5, 8)
    ours_masks = scan._our_keep_masks(table)
    assert ours_masks, "no file has removed rows: the case tests nothing"
    monkeypatch.setattr(scan, "_our_keep_masks", lambda _table: None)  # delta-rs reads them
    theirs = scan.keep_masks(table)
    assert ours_masks.keys() == theirs.keys()
    for name, mask in ours_masks.items():
        assert mask.whole and not theirs[name].whole, name
        assert len(mask.keep) == pq.read_metadata(name).num_rows, name
        shared = len(theirs[name].keep)
        assert mask.keep.slice(0, shared).cast(pa.bool_()).equals(theirs[name].keep), name
        assert set(mask.keep.slice(shared).to_pylist()) <= {1}, name  # rows past delta-rs's mask stay
        assert mask.removed.tolist() == theirs[name].removed.tolist(), name
