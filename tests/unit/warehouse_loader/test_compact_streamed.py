"""Delta compaction streams its rows: one batch in memory at a time, one row group per batch, stats over all."""

from __future__ import annotations

from pathlib import Path

import orjson
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.parquet as pq  # type: ignore[import-untyped]
import pytest
from deltalake import DeltaTable, write_deltalake

from warehouse_loader.delta import maintenance
from warehouse_loader.delta.maintenance import DeltaMaintainer
from warehouse_loader.location import TableLocation


@pytest.mark.parametrize("batch_rows", [97, 1000])
def test_a_compaction_writes_one_row_group_per_batch_and_the_rows_and_stats_of_them_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batch_rows: int
) -> None:
    monkeypatch.setattr(maintenance, "COMPACTION_BATCH_ROWS", (batch_rows, batch_rows))
    rows = pa.table(
        {
            "id": pa.array(range(1000), pa.int64()),
            "v": pa.array([None if i % 10 == 0 else -i for i in range(1000)], pa.int32()),
            "s": pa.array([f"row {i}" for i in range(1000)]),
        }
    )
    for part in range(2):  # two files of 500 rows, compacted into one
        write_deltalake(str(tmp_path), rows.slice(part * 500, 500), mode="append")
    table = DeltaTable(str(tmp_path))
    files = pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist()

    assert DeltaMaintainer(TableLocation(str(tmp_path)))._rewrite(table, [files], None)[:2] == (2, 1)

    compacted = DeltaTable(str(tmp_path))
    assert pa.table(compacted.to_pyarrow_table()).sort_by("id").equals(rows)
    (add,) = [orjson.loads(line)["add"] for line in _last_entry(tmp_path) if "add" in orjson.loads(line)]
    footer = pq.read_metadata(tmp_path / add["path"])
    groups = [footer.row_group(i).num_rows for i in range(footer.num_row_groups)]
    assert sum(groups) == 1000 and max(groups) <= batch_rows and len(groups) >= 1000 // batch_rows, groups
    stats = orjson.loads(add["stats"])
    assert stats["numRecords"] == 1000
    assert stats["nullCount"] == {"id": 0, "v": 100, "s": 0}
    assert (stats["minValues"], stats["maxValues"]) == ({"id": 0, "v": -999}, {"id": 999, "v": -1})


def _last_entry(table_dir: Path) -> list[bytes]:
    entries = sorted((table_dir / "_delta_log").glob("*.json"))
    return entries[-1].read_bytes().splitlines()
