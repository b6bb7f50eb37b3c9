"""The loader compacts a merge-on-read table itself once removed rows reach half its files' rows (real Delta tables)."""

from __future__ import annotations

from pathlib import Path

import pytest
from deltalake import DeltaTable

from operations.maintain import last_runs, maintenance_status
from tests.unit.operations.test_maintain import batch, project, rows
from warehouse_loader import maintenance
from warehouse_loader.formats import format_of
from warehouse_loader.load_job import _compact_if_buried, table_path
from warehouse_loader.maintenance import LOOK_EVERY_SHARE, BuriedRows


def test_a_table_whose_removed_rows_pile_up_is_compacted_between_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from warehouse_loader.delta import merge_on_read
    from warehouse_loader.delta.writer import write_batch

    monkeypatch.setattr(merge_on_read, "MIN_TABLE_BYTES", 0)
    monkeypatch.setattr(maintenance, "LOOK_AFTER_CHANGES", 100)  # a table of 1,000 rows
    # No maintenance stage would act first: its own threshold is above every share reached here.
    config = project(tmp_path, compact_min_small_files=100, compact_dirty_ratio=1.0)
    location = table_path(config, "t")
    settings = config.warehouse.tables["t"]
    buried = BuriedRows(format_of(config, "t").maintainer(location), config.warehouse.maintenance_of("t"))
    write_batch(location, batch(list(range(1000)), 0, 1, "c"), table="t", batch_id=0, keys=["id"], config=settings)
    expected = {i: 0 for i in range(1000)}
    shares, compactions = [], 0
    for n in range(1, 17):  # 16 x 150 updates of the 1,000 rows: without compaction 71 % of the rows removed
        ids = [(n * 151 + i * 7) % 1000 for i in range(150)]
        write_batch(
            location, batch(ids, n, n + 1), table="t", batch_id=n, keys=["id"], config=settings, merge_on_read=True
        )
        expected.update(dict.fromkeys(ids, n))
        before = maintenance_status(config, "t")["deleted_rows"]
        _compact_if_buried(config, "t", buried, changes=len(ids))
        status = maintenance_status(config, "t")
        compactions += status["deleted_rows"] < before
        shares.append(status["deleted_rows"] / (status["deleted_rows"] + 1000))
        assert rows(Path(str(location))) == [{"id": i, "v": v} for i, v in sorted(expected.items())]
    assert compactions >= 1
    # Looked at after every LOOK_EVERY_SHARE of the live rows changed: compacted at the first look at
    # BURIED_SHARE or more, so at most that many more removed rows (and one batch) pile up on top.
    assert max(shares) <= (1 + LOOK_EVERY_SHARE + 0.15) / (2 + LOOK_EVERY_SHARE + 0.15), shares
    assert "last_compaction" in last_runs(config, "t")  # status and the maintenance stage see it
    assert DeltaTable(str(location)).version() > 16  # the compactions committed beside the 17 loads
