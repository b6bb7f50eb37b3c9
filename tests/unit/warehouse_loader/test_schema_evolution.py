"""What a source's schema change asks of a warehouse table: renames (chained), widenings and additions."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, TableFeatures
from harness.auto_cdc_examples import KEYS, changes

from core.warehouse_config import TableConfig
from log.schema_history import Rename
from log.sequence import Sequence as Seq
from warehouse_loader.delta.format import DeltaFormat
from warehouse_loader.delta.merge_on_read import has_deletion_vectors
from warehouse_loader.iceberg.format import IcebergFormat
from warehouse_loader.location import TableLocation
from warehouse_loader.schema_evolution import table_changes
from warehouse_loader.table_format import TableFormat

TABLE = pa.schema(
    [
        ("id", pa.int32()),
        ("note", pa.string()),
        ("qty", pa.int32()),
        ("price", pa.decimal128(8, 2)),
        ("r", pa.float32()),
    ]
)


def test_a_chain_of_renames_becomes_the_renames_the_table_still_needs() -> None:
    renames = [Rename("note", "remark", Seq(1, 0)), Rename("remark", "comment", Seq(2, 0))]
    changes = table_changes(TABLE, renames, {"comment": pa.string()})
    assert changes.renames == (("note", "remark"), ("remark", "comment"))
    assert not changes.widen


def test_a_table_already_renamed_needs_nothing() -> None:
    table = pa.schema([("id", pa.int32()), ("remark", pa.string())])
    assert not table_changes(table, [Rename("note", "remark", Seq(1, 0))], {"remark": pa.string()})


def test_widening_within_a_family_only() -> None:
    reading = {
        "qty": pa.int64(),
        "price": pa.decimal128(14, 4),
        "r": pa.float64(),
        "note": pa.int64(),
        "id": pa.int16(),
    }
    changes = table_changes(TABLE, [], reading)
    assert dict(changes.widen) == {"qty": pa.int64(), "price": pa.decimal128(14, 4), "r": pa.float64()}


def test_decimal_widening_keeps_both_integer_digits_and_scale() -> None:
    changes = table_changes(pa.schema([("p", pa.decimal128(10, 0))]), [], {"p": pa.decimal128(10, 4)})
    assert dict(changes.widen) == {"p": pa.decimal128(14, 4)}


@pytest.mark.parametrize("mode", ["scd1", "scd2"])
@pytest.mark.parametrize("kind", ["delta", "delta-deletion-vectors", "iceberg"])
def test_an_added_column_is_there_null_before_a_row_brings_it_and_takes_the_next_batch(
    tmp_path: Path, kind: str, mode: str
) -> None:
    """Issue 27: ``ADD COLUMN`` with no row change following still reaches the table, in metadata only."""
    fmt: TableFormat = IcebergFormat() if kind == "iceberg" else DeltaFormat()
    where = TableLocation(str(tmp_path / "warehouse" / "users"))
    config = TableConfig.model_validate({"from": "users_feed", "mode": mode})

    def write(batch: pa.Table, batch_id: int) -> None:
        dv = kind == "delta-deletion-vectors"
        fmt.write_batch(where, batch, table="users", batch_id=batch_id, keys=KEYS, config=config, merge_on_read=dv)

    write(changes([(1, "a", "x", "INSERT", 1), (2, "b", "y", "INSERT", 2)]), 0)
    if kind == "delta-deletion-vectors":
        target = DeltaTable(where.uri)
        target.alter.add_feature(TableFeatures.DeletionVectors, allow_protocol_versions_increase=True)
        write(changes([(2, "b", "z", "UPDATE", 3)]), 1)  # merge-on-read: a deletion vector
        assert has_deletion_vectors(DeltaTable(where.uri))
    before = fmt.open(where)
    assert before is not None
    files = None if kind == "iceberg" else DeltaTable(where.uri).file_uris()
    reading = {"userId": pa.int64(), "name": pa.string(), "city": pa.string(), "tag2": pa.int32()}
    needed = table_changes(before.schema(), [], reading)
    assert needed.adds == {"tag2": pa.int32()} and needed.describe() == "tag2 added as int32"
    assert fmt.evolve(where, needed, keys=KEYS)
    after = fmt.open(where)
    assert after is not None
    assert after.schema().field("tag2").type == pa.int32()
    if files is not None:
        assert DeltaTable(where.uri).file_uris() == files  # metadata only: no file rewritten
    current = "" if mode == "scd1" else " WHERE __END_AT IS NULL"
    got = after.select(f'SELECT "userId", city, tag2 FROM target{current} ORDER BY 1').to_pylist()
    city = "z" if kind == "delta-deletion-vectors" else "y"
    assert got == [{"userId": 1, "city": "x", "tag2": None}, {"userId": 2, "city": city, "tag2": None}]
    assert not fmt.evolve(where, table_changes(after.schema(), [], reading), keys=KEYS)  # done already
    if kind == "iceberg":
        side = IcebergFormat().tombstones(where)
        assert side is None or "tag2" not in side.schema().names
    later = changes([(3, "c", "w", "INSERT", 9)]).append_column("tag2", pa.array([7], pa.int32()))
    write(later, 2)
    final = fmt.open(where)
    assert final is not None
    assert [f.name for f in final.schema()].count("tag2") == 1 and final.schema().field("tag2").type == pa.int32()
    got = final.select(f'SELECT "userId", tag2 FROM target{current} ORDER BY 1').to_pylist()
    assert got == [{"userId": 1, "tag2": None}, {"userId": 2, "tag2": None}, {"userId": 3, "tag2": 7}]
