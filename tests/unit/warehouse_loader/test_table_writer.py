"""The table writers (Delta, Iceberg) against real tables in tmp_path, one suite for both formats.

deltalake and pyiceberg (with an embedded SQLite catalog) are libraries: no service.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from harness.auto_cdc_examples import DOC_FEED as DOC_INPUT
from harness.auto_cdc_examples import DOC_TRUNCATE, KEYS, changes, scd2_table
from harness.table_formats import TableFormat

from core.warehouse_config import TableConfig
from warehouse_loader.changes import SEQ
from warehouse_loader.errors import SchemaMismatchError, WarehouseWriteError

SCD1 = TableConfig.model_validate({"from": "users_feed", "mode": "scd1"})
SCD2 = TableConfig.model_validate({"from": "users_feed", "mode": "scd2"})


def rows1(fmt: TableFormat, where: Any) -> list[tuple[Any, ...]]:
    return sorted((r["userId"], r["name"], r["city"]) for r in fmt.rows(where).to_pylist())


def batches(split: list[int]) -> list[pa.Table]:
    out, start = [], 0
    for size in split:
        out.append(changes(DOC_INPUT[start : start + size]))
        start += size
    return out


def test_scd1_doc_example_in_three_batches(table_write_mode: TableFormat, tmp_path: Path) -> None:
    fmt = table_write_mode
    path = fmt.where(tmp_path / "users")
    for batch_id, batch in enumerate(batches([4, 2, 2])):
        result = fmt.write_batch(path, batch, table="users", batch_id=batch_id, keys=KEYS, config=SCD1)
        assert not result.skipped
    assert rows1(fmt, path) == [(124, "Raul", "Oaxaca"), (125, "Mercedes", "Guadalajara"), (126, "Lily", "Cancun")]
    assert fmt.committed_batch(path, "users") == 2
    # The late update of 123 (seq 5) did not resurrect it: its delete (seq 6) left a tombstone.
    assert fmt.tombstones(path).column("userId").to_pylist() == [123]


def test_scd1_replayed_batch_is_skipped_and_writes_nothing(table_write_mode: TableFormat, tmp_path: Path) -> None:
    fmt = table_write_mode
    path = fmt.where(tmp_path / "users")
    first = batches([4])[0]
    fmt.write_scd1(path, first, table="users", batch_id=0, keys=KEYS)
    version = fmt.commits(path)
    # Same batch id, different content: the recorded app transaction wins.
    replay = fmt.write_scd1(path, changes([(124, "X", "Y", "u", 99)]), table="users", batch_id=0, keys=KEYS)
    assert replay.skipped
    assert fmt.commits(path) == version
    assert (124, "Raul", "Oaxaca") in rows1(fmt, path)


def test_a_batch_that_changes_nothing_is_still_recorded(table_write_mode: TableFormat, tmp_path: Path) -> None:
    fmt = table_write_mode
    path = fmt.where(tmp_path / "users")
    fmt.write_scd1(path, changes([(1, "new", "x", "u", 9)]), table="users", batch_id=0, keys=KEYS)
    result = fmt.write_scd1(path, changes([(1, "old", "y", "u", 4)]), table="users", batch_id=1, keys=KEYS)
    assert not result.skipped and fmt.committed_batch(path, "users") == 1
    assert rows1(fmt, path) == [(1, "new", "x")]


def test_scd1_truncate_removes_older_rows(table_write_mode: TableFormat, tmp_path: Path) -> None:
    fmt = table_write_mode
    path = fmt.where(tmp_path / "users")
    fmt.write_scd1(path, changes(DOC_INPUT), table="users", batch_id=0, keys=KEYS)
    fmt.write_scd1(path, changes([DOC_TRUNCATE]), table="users", batch_id=1, keys=KEYS)
    assert rows1(fmt, path) == [(125, "Mercedes", "Guadalajara")]
    # A late insert older than the truncate stays out.
    fmt.write_scd1(path, changes([(127, "Late", "Puebla", "c", 2)]), table="users", batch_id=2, keys=KEYS)
    assert rows1(fmt, path) == [(125, "Mercedes", "Guadalajara")]


def test_scd2_doc_example_in_three_batches(table_write_mode: TableFormat, tmp_path: Path) -> None:
    fmt = table_write_mode
    path = fmt.where(tmp_path / "users_hist")
    for batch_id, batch in enumerate(batches([4, 2, 2])):
        fmt.write_batch(path, batch, table="users_hist", batch_id=batch_id, keys=KEYS, config=SCD2)
    assert scd2_table(fmt.rows(path)) == [
        (123, "Isabel", "Monterrey", 1, 5),
        (123, "Isabel", "Chihuahua", 5, 6),
        (124, "Raul", "Oaxaca", 1, None),
        (125, "Mercedes", "Tijuana", 2, 5),
        (125, "Mercedes", "Mexicali", 5, 6),
        (125, "Mercedes", "Guadalajara", 6, None),
        (126, "Lily", "Cancun", 2, None),
    ]
    assert fmt.write_scd2(path, changes(DOC_INPUT), table="users_hist", batch_id=1, keys=KEYS).skipped


def test_scd2_untracked_column_and_truncate(table_write_mode: TableFormat, tmp_path: Path) -> None:
    fmt = table_write_mode
    path = fmt.where(tmp_path / "users_hist")
    config = TableConfig.model_validate({"from": "f", "mode": "scd2", "track_history_columns": ["name"]})
    for batch_id, batch in enumerate(batches([4, 2, 2])):
        fmt.write_batch(path, batch, table="h", batch_id=batch_id, keys=KEYS, config=config)
    assert scd2_table(fmt.rows(path)) == [
        (123, "Isabel", "Chihuahua", 1, 6),
        (124, "Raul", "Oaxaca", 1, None),
        (125, "Mercedes", "Guadalajara", 2, None),
        (126, "Lily", "Cancun", 2, None),
    ]
    fmt.write_batch(path, changes([(None, None, None, "t", 8)]), table="h", batch_id=3, keys=KEYS, config=config)
    assert [v[4] for v in scd2_table(fmt.rows(path))] == [6, 8, 8, 8]


def test_schema_evolution_added_and_dropped_columns(table_write_mode: TableFormat, tmp_path: Path) -> None:
    fmt = table_write_mode
    path = fmt.where(tmp_path / "users")
    fmt.write_scd1(path, changes([(1, "a", "x", "c", 1)]), table="users", batch_id=0, keys=KEYS)
    added = changes([(2, "b", "y", "c", 2)]).append_column("email", pa.array(["b@example.com"]))
    fmt.write_scd1(path, added, table="users", batch_id=1, keys=KEYS)
    dropped = changes([(3, "c", "z", "c", 3)]).drop_columns(["city"])
    fmt.write_scd1(path, dropped, table="users", batch_id=2, keys=KEYS)
    table = fmt.rows(path)
    by_id = {r["userId"]: r for r in table.to_pylist()}
    assert "email" in table.column_names and "city" in table.column_names
    assert by_id[1]["email"] is None and by_id[2]["email"] == "b@example.com"
    assert by_id[3]["city"] is None and by_id[1]["city"] == "x"


def test_incompatible_type_change_raises_and_leaves_the_table_alone(
    table_write_mode: TableFormat, tmp_path: Path
) -> None:
    fmt = table_write_mode
    path = fmt.where(tmp_path / "users")
    fmt.write_scd1(path, changes([(1, "a", "x", "c", 1)]), table="users", batch_id=0, keys=KEYS)
    version = fmt.commits(path)
    bad = changes([(2, "b", "y", "c", 2)]).set_column(2, "city", pa.array([42], pa.int64()))
    with pytest.raises(SchemaMismatchError) as info:
        fmt.write_scd1(path, bad, table="users", batch_id=1, keys=KEYS)
    message = str(info.value)
    assert "\n" not in message and "'city'" in message and "nothing was written" in message
    assert fmt.commits(path) == version
    assert fmt.committed_batch(path, "users") == 0


def test_scd2_incompatible_type_change_writes_nothing(table_write_mode: TableFormat, tmp_path: Path) -> None:
    fmt = table_write_mode
    path = fmt.where(tmp_path / "h")
    fmt.write_scd2(path, changes([(1, "a", "x", "c", 1)]), table="h", batch_id=0, keys=KEYS)
    version = fmt.commits(path)
    bad = changes([(1, "b", "y", "u", 2)]).set_column(1, "name", pa.array([1.5]))
    with pytest.raises(SchemaMismatchError):
        fmt.write_scd2(path, bad, table="h", batch_id=1, keys=KEYS)
    assert fmt.commits(path) == version


def test_widening_integer_column_is_cast(table_write_mode: TableFormat, tmp_path: Path) -> None:
    fmt = table_write_mode
    path = fmt.where(tmp_path / "users")
    fmt.write_scd1(path, changes([(1, "a", "x", "c", 1)]), table="users", batch_id=0, keys=KEYS)
    narrow = changes([(2, "b", "y", "c", 2)])
    narrow = narrow.set_column(0, "userId", narrow.column("userId").cast(pa.int32()))
    fmt.write_scd1(path, narrow, table="users", batch_id=1, keys=KEYS)
    assert fmt.rows(path).schema.field("userId").type == pa.int64()
    assert SEQ in fmt.rows(path).column_names


def test_scd2_delete_before_the_insert_and_truncate_floor(table_write_mode: TableFormat, tmp_path: Path) -> None:
    fmt = table_write_mode
    path = fmt.where(tmp_path / "h")
    parts = [
        changes([(3, "a", "x", "c", 20), (1, "a", "x", "c", 3), (1, None, None, "d", 10), (2, "b", "y", "c", 2)]),
        changes([(3, None, None, "d", 17)]),
        changes([(None, None, None, "t", 5)]),
        changes([(3, "b", "y", "c", 4), (1, "c", "z", "u", 7), (4, "late", "w", "c", 1)]),
    ]
    for batch_id, batch in enumerate(parts):
        fmt.write_batch(path, batch, table="h", batch_id=batch_id, keys=KEYS, config=SCD2)
    assert scd2_table(fmt.rows(path)) == [
        (1, "a", "x", 3, 5),
        (1, "c", "z", 7, 10),
        (2, "b", "y", 2, 5),
        (3, "b", "y", 4, 5),
        (3, "a", "x", 20, None),
        (4, "late", "w", 1, 5),
    ]
    marks = fmt.tombstones(path).to_pylist()
    # d@17 closed nothing when it came; d@10 closed nothing once the truncate at 5 ended 1's version.
    assert sorted(((m["userId"], m["__hw_op"]) for m in marks), key=str) == [(1, "d"), (3, "d"), (None, "t")]


def test_scd2_crash_between_tombstones_and_merge_replays_to_the_same_table(
    table_write_mode: TableFormat, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fmt = table_write_mode
    path = fmt.where(tmp_path / "h")
    fmt.write_scd2(path, changes([(3, "a", "x", "c", 20)]), table="h", batch_id=0, keys=KEYS)
    delete = changes([(3, None, None, "d", 17)])
    with monkeypatch.context() as patch:
        fmt.break_main_commit(patch)
        with pytest.raises(WarehouseWriteError):
            fmt.write_scd2(path, delete, table="h", batch_id=1, keys=KEYS)
    assert fmt.committed_batch(path, "h") == 0 and fmt.commits(path, side=True) == 1
    assert not fmt.write_scd2(path, delete, table="h", batch_id=1, keys=KEYS).skipped
    fmt.write_scd2(path, changes([(3, "b", "y", "c", 4)]), table="h", batch_id=2, keys=KEYS)
    assert scd2_table(fmt.rows(path)) == [(3, "b", "y", 4, 17), (3, "a", "x", 20, None)]
    assert fmt.commits(path, side=True) == 1


@pytest.mark.parametrize("op", ["d", "t"])
def test_scd1_crash_between_tombstones_and_merge_replays_the_delete(
    table_write_mode: TableFormat, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, op: str
) -> None:
    fmt = table_write_mode
    path = fmt.where(tmp_path / "u")
    fmt.write_scd1(path, changes([(1, "a", "x", "c", 1)]), table="u", batch_id=0, keys=KEYS)
    batch = changes([(1 if op == "d" else None, None, None, op, 5)])
    with monkeypatch.context() as patch:
        fmt.break_main_commit(patch)
        with pytest.raises(WarehouseWriteError):
            fmt.write_scd1(path, batch, table="u", batch_id=1, keys=KEYS)
    fmt.write_scd1(path, batch, table="u", batch_id=1, keys=KEYS)
    assert rows1(fmt, path) == []
