"""Stored records -> the source's Arrow batches (pure, no Spark session)."""

from __future__ import annotations

from decimal import Decimal

import orjson
import pytest

from derived_feeds.errors import UndecodableValueError
from derived_feeds.event_batches import EventBatchBuilder, arrow_schema
from derived_feeds.event_schema import output_schema, row_schema
from headwater.config import TypesConfig
from log.base import StoredRecord
from log.envelope import ChangeEvent, Op, SourceInfo, encode_key, encode_value
from log.sequence import Sequence

TOPIC = "shop.public.items"
V1 = {
    "version": 1,
    "columns": [
        {"name": "id", "type_oid": 23, "typmod": -1, "key": True},
        {"name": "price", "type_oid": 1700, "typmod": (10 << 16 | 2) + 4, "key": False},
    ],
}
V2 = {"version": 2, "columns": [*V1["columns"], {"name": "note", "type_oid": 25, "typmod": -1, "key": False}]}


def event(offset, op, before=None, after=None, lsn=1000, index=0):
    source = SourceInfo("shop", "db", "public", "items", 7, lsn, lsn, index, 1_700_000_000_000_000)
    return ChangeEvent(op, source, before, after, 0)


def stored(offset, key, value):
    return StoredRecord(TOPIC, 0, offset, 1_700_000_000_000, encode_key(key), value)


def builder(versions=(V1,), **kwargs):
    schema = row_schema(TOPIC, list(versions), TypesConfig())
    return EventBatchBuilder(output_schema(schema.struct()), {TOPIC: schema}, **kwargs)


RECORDS = [
    stored(0, {"id": 1}, encode_value(event(0, Op.CREATE, after={"id": 1, "price": "1.50"}))),
    stored(
        1, {"id": 1}, encode_value(event(1, Op.UPDATE, {"id": 1, "price": "1.50"}, {"id": 1, "price": "2.00"}, 1001))
    ),
    stored(2, {"id": 1}, encode_value(event(2, Op.DELETE, before={"id": 1, "price": None}, lsn=1002))),
    stored(3, {"id": 1}, None),
]


def test_batch_schema_is_exactly_sparks_and_values_typed():
    build = builder()
    batch = build.build(RECORDS)
    assert batch.schema.equals(arrow_schema(build.schema))
    rows = batch.to_pylist()
    assert [r["op"] for r in rows] == ["c", "u", "d"]  # tombstone skipped
    assert rows[1]["before"] == {"id": 1, "price": Decimal("1.50")}
    assert rows[1]["after"] == {"id": 1, "price": Decimal("2.00")}
    assert rows[2]["after"] is None
    assert rows[1]["__hw_seq"] == Sequence(1001, 0).sortable()
    assert rows[0]["key"] == '{"id":1}'
    assert rows[0]["source_table"] == "items"
    assert rows[0]["commit_ts"].year == 2023


def test_tombstones_on_request():
    rows = builder(include_tombstones=True).build(RECORDS).to_pylist()
    assert len(rows) == 4
    assert rows[3]["op"] is None and rows[3]["after"] is None and rows[3]["key"] == '{"id":1}'


def test_old_events_read_with_the_latest_schema():
    rows = builder((V1, V2)).build(RECORDS[:1]).to_pylist()
    assert rows[0]["after"] == {"id": 1, "price": Decimal("1.50"), "note": None}


def test_json_images_without_schema():
    build = EventBatchBuilder(output_schema(None), None)
    rows = build.build([*RECORDS[:1], stored(9, {"k": 1}, orjson.dumps({"k": 1, "v": "plain"}))]).to_pylist()
    assert orjson.loads(rows[0]["after"]) == {"id": 1, "price": "1.50"}
    assert rows[1]["op"] is None and orjson.loads(rows[1]["after"]) == {"k": 1, "v": "plain"}


def test_bad_value_names_the_record():
    bad = stored(5, {"id": 2}, encode_value(event(5, Op.CREATE, after={"id": "two", "price": "1"})))
    with pytest.raises(UndecodableValueError, match=r"shop.public.items/0@5: column 'after.id'") as caught:
        builder().build([bad])
    assert caught.value.offset == 5


def test_empty_input():
    assert builder().build([]).num_rows == 0
