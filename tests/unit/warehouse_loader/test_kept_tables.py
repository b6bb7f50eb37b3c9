"""The Delta writer keeps each table open between batches: the next batch sees every commit since, and a
table deleted and created again is opened afresh (real delta-rs tables in tmp_path)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from harness.auto_cdc_examples import KEYS, changes

from core.warehouse_config import TableConfig
from warehouse_loader.delta import kept_tables
from warehouse_loader.delta.writer import write_batch
from warehouse_loader.location import TableLocation

MODES = ["scd1", "scd2"]


def _config(mode: str) -> TableConfig:
    return TableConfig.model_validate({"from": "users_feed", "mode": mode})


def _current(path: Path) -> list[tuple[int, str]]:
    rows = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    return sorted((r["userId"], r["city"]) for r in rows if r.get("__END_AT") is None)


@pytest.mark.parametrize("mode", MODES)
def test_the_next_batch_takes_the_kept_table_with_every_commit_made_since(tmp_path: Path, mode: str) -> None:
    path = tmp_path / "users"
    location = TableLocation(str(path))
    write_batch(
        str(path), changes([(1, "a", "Oaxaca", "c", 1)]), table="u", batch_id=0, keys=KEYS, config=_config(mode)
    )
    write_batch(
        str(path), changes([(2, "b", "Tijuana", "c", 2)]), table="u", batch_id=1, keys=KEYS, config=_config(mode)
    )
    kept = kept_tables.take(location)
    assert kept is not None and kept.version() == DeltaTable(str(path)).version()
    kept_tables.keep(location, kept)
    # Another writer's commit (as maintain's): an append of the table's own rows, read back as its own.
    other = DeltaTable(str(path))
    write_deltalake(str(path), other.to_pyarrow_table().slice(0, 0), mode="append")
    taken = kept_tables.take(location)
    assert taken is kept  # the same object, brought up to date
    assert taken.version() == DeltaTable(str(path)).version() == other.version() + 1
    kept_tables.keep(location, taken)
    write_batch(
        str(path), changes([(1, "a", "Cancun", "u", 3)]), table="u", batch_id=2, keys=KEYS, config=_config(mode)
    )
    assert _current(path) == [(1, "Cancun"), (2, "Tijuana")]
    assert kept_tables.take(location) is kept  # kept again after the batch


@pytest.mark.parametrize("mode", MODES)
def test_a_table_deleted_and_created_again_is_opened_afresh(tmp_path: Path, mode: str) -> None:
    """Created again up to the kept version: only the commit file's identity tells the tables apart."""
    path = tmp_path / "users"
    location = TableLocation(str(path))
    for batch_id in range(3):
        row = (batch_id, "old", "Old town", "c", batch_id + 1)
        write_batch(str(path), changes([row]), table="u", batch_id=batch_id, keys=KEYS, config=_config(mode))
    version = DeltaTable(str(path)).version()
    shutil.rmtree(path)  # reprocess drops the table; another table is built there
    for at in range(version + 1):
        write_deltalake(str(path), pa.table({"userId": [100 + at], "city": ["New town"]}), mode="append")
    assert DeltaTable(str(path)).version() == version
    taken = kept_tables.take(location)
    assert taken is not None
    assert sorted(taken.to_pyarrow_table().column("userId").to_pylist()) == [100 + at for at in range(version + 1)]


def test_an_absent_table_is_none_and_nothing_is_kept_for_it(tmp_path: Path) -> None:
    location = TableLocation(str(tmp_path / "none"))
    assert kept_tables.take(location) is None
    kept_tables.keep(location, None)
    assert kept_tables.take(location) is None
