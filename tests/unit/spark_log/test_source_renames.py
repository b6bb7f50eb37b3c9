"""A renamed column is read under its new name in every record (both decoding paths), the old name hidden."""

from __future__ import annotations

import pyarrow as pa
import pytest

from capture.postgres.events.source_block import postgres_source
from core.source_config import TypesConfig
from log.base import StoredRecord
from log.columns import RecordColumns
from log.envelope import ChangeEvent, Op, encode_key, encode_value
from spark_log.source_batches import SourceBatchBuilder
from spark_log.source_schema import output_schema, row_schema

TOPIC = "shop.public.items"
ID = {"name": "id", "type_oid": 23, "typmod": -1, "key": True, "attnum": 1}
V1 = {"version": 1, "columns": [ID, {"name": "note", "type_oid": 25, "typmod": -1, "key": False, "attnum": 2}]}
V2 = {
    "version": 2,
    "columns": [ID, {"name": "remark", "type_oid": 25, "typmod": -1, "key": False, "attnum": 2}],
    "change": {"at": [2000, 0], "renamed": {"remark": "note"}},
}
V3 = {
    "version": 3,
    "columns": [*V2["columns"], {"name": "note", "type_oid": 25, "typmod": -1, "key": False, "attnum": 3}],
    "change": {"at": [3000, 0]},
}


def stored(offset: int, lsn: int, after: dict) -> StoredRecord:
    source = postgres_source("shop", "db", "public", "items", 7, lsn, lsn, 0, 1_700_000_000_000_000)
    value = encode_value(ChangeEvent(Op.UPDATE, source, None, after, 0))
    return StoredRecord(TOPIC, 0, offset, 1_700_000_000_000, encode_key({"id": after["id"]}), value)


RECORDS = [
    stored(0, 1000, {"id": 1, "note": "old text"}),
    stored(1, 2500, {"id": 2, "remark": "new text"}),
    stored(2, 3500, {"id": 3, "remark": "later", "note": "new note"}),
]


def builder(versions: list[dict], *, current_only: bool = False) -> SourceBatchBuilder:
    schema = row_schema(TOPIC, versions, TypesConfig(), current_only=current_only)
    return SourceBatchBuilder(output_schema(schema.struct()), {TOPIC: schema})


@pytest.mark.parametrize("path", ["records", "columns"])
def test_records_before_the_rename_are_read_under_the_new_name(path: str) -> None:
    build = builder([V1, V2])
    if path == "records":
        batch = build.build(RECORDS[:2])
    else:
        batch = build.build_columns(RecordColumns.from_records(TOPIC, 0, RECORDS[:2]))
    assert build.schema["after"].dataType.fieldNames() == ["id", "remark"]
    assert [row["after"] for row in batch.to_pylist()] == [
        {"id": 1, "remark": "old text"},
        {"id": 2, "remark": "new text"},
    ]


def test_a_column_added_later_under_the_old_name_is_a_column_again() -> None:
    # (Of the same type: one name has one type in a topic's reads, so another type there fails
    # the read in one line naming the record, README "Schema changes".)
    rows = builder([V1, V2, V3]).build(RECORDS).to_pylist()
    assert [row["after"] for row in rows] == [
        {"id": 1, "remark": "old text", "note": None},
        {"id": 2, "remark": "new text", "note": None},
        {"id": 3, "remark": "later", "note": "new note"},
    ]


def test_current_columns_leave_dropped_ones_out() -> None:
    dropped = {"version": 2, "columns": [ID], "change": {"at": [2000, 0]}}
    assert builder([V1, dropped]).schema["after"].dataType.fieldNames() == ["id", "note"]
    assert builder([V1, dropped], current_only=True).schema["after"].dataType.fieldNames() == ["id"]


def test_renamed_columns_of_a_change_batch_read_on_the_driver() -> None:
    from log.schema_history import SchemaHistory
    from log.sequence import Sequence
    from warehouse_loader.schema_evolution import renamed_columns

    changes = pa.table(
        {
            "id": [1, 2],
            "__hw_seq": [Sequence(1000, 0).sortable(), Sequence(2500, 0).sortable()],
            "note": ["old text", None],
            "remark": [None, "new text"],
        }
    )
    out = renamed_columns(changes, SchemaHistory.of([V1, V2]).renames(), sequence="__hw_seq")
    assert out.column_names == ["id", "__hw_seq", "remark"]
    assert out.column("remark").to_pylist() == ["old text", "new text"]
