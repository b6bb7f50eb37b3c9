"""Stored records -> the source's Arrow batches (pure, no Spark session)."""

from __future__ import annotations

from decimal import Decimal

import orjson
import pytest

from capture.postgres.events.source_block import postgres_source
from core.source_config import TypesConfig
from log.base import StoredRecord
from log.envelope import ChangeEvent, Op, encode_key, encode_value
from log.sequence import Sequence
from spark_log.errors import UndecodableValueError
from spark_log.source_batches import SourceBatchBuilder, arrow_schema
from spark_log.source_schema import output_schema, row_schema

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
    source = postgres_source("shop", "db", "public", "items", 7, lsn, lsn, index, 1_700_000_000_000_000)
    return ChangeEvent(op, source, before, after, 0)


def stored(offset, key, value):
    return StoredRecord(TOPIC, 0, offset, 1_700_000_000_000, encode_key(key), value)


def builder(versions=(V1,), **kwargs):
    schema = row_schema(TOPIC, list(versions), TypesConfig())
    return SourceBatchBuilder(output_schema(schema.struct()), {TOPIC: schema}, **kwargs)


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
    build = SourceBatchBuilder(output_schema(None), None)
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


# --------------------------------------------------------------------------- bulk path == per-value path

WIDE = {
    "version": 1,
    "columns": [
        {"name": n, "type_oid": o, "typmod": t, "key": n == "id"}
        for n, o, t in [
            ("id", 20, -1),
            ("small", 21, -1),
            ("num", 23, -1),
            ("flag", 16, -1),
            ("ratio", 700, -1),
            ("score", 701, -1),
            ("price", 1700, (10 << 16 | 2) + 4),
            ("free", 1700, -1),
            ("name", 25, -1),
            ("born", 1082, -1),
            ("at", 1083, -1),
            ("local", 1114, -1),
            ("stamp", 1184, -1),
            ("span", 1186, -1),
            ("blob", 17, -1),
            ("uid", 2950, -1),
            ("doc", 114, -1),
            ("spot", 600, -1),
        ]
    ],
}


def wide_row(i):
    return {
        "id": i,
        "small": i % 300 - 150,
        "num": -i * 7,
        "flag": i % 2 == 0,
        "ratio": i / 7,
        "score": -i / 3,
        "price": f"{i}.{i % 100:02d}",
        "free": f"-{i}.000123",
        "name": f'n\u00e9-{i} "q" \\ \t',
        "born": 19000 + i,
        "at": i * 1_000_000,
        "local": 1_700_000_000_000_000 + i,
        "stamp": f"2024-02-{1 + i % 28:02d}T10:00:00.{i % 1000:06d}Z",
        "span": i * 60_000_000,
        "blob": "3q2+7w==",
        "uid": "6f1c3c8e-1111-4a4a-8f8f-000000000001",
        "doc": '{"a": [1, 2]}',
        "spot": {"x": 1.5, "y": -i, "wkb": "AQ==", "srid": None},
    }


def wide_records(count=40):
    out = []
    for i in range(count):
        row = wide_row(i)
        if i % 5 == 4:
            row = {k: None for k in row} | {"id": i}  # all-null columns
        op = [Op.CREATE, Op.UPDATE, Op.READ, Op.DELETE][i % 4]
        value = event(
            i,
            op,
            before=row if op == Op.DELETE else None,
            after=None if op == Op.DELETE else row,
            lsn=1000 + i,
            index=i % 3,
        )
        out.append(StoredRecord(TOPIC, 0, i, 1_700_000_000_000 + i, encode_key({"id": i}), encode_value(value)))
        if op == Op.DELETE:
            out.append(StoredRecord(TOPIC, 0, i, 1_700_000_000_000 + i, encode_key({"id": i}), None))
    return out


def both_paths(records, versions=(WIDE,), **kwargs):
    """(bulk-path batch, per-value batch, whether the bulk path was taken)."""
    build = builder(versions, **kwargs)
    bulk = build._build_bulk(
        list(records) if build.include_tombstones else [r for r in records if r.value is not None],
        arrow_schema(build.schema),
    )
    batch = build.build(records)
    per_value = builder(versions, **kwargs)
    per_value._build_bulk = lambda records, target: None
    return batch, per_value.build(records), bulk is not None


@pytest.mark.parametrize("tombstones", [False, True])
def test_bulk_path_equals_per_value_path(tombstones):
    batch, expected, bulk = both_paths(wide_records(), include_tombstones=tombstones)
    assert bulk, "regular envelopes must take the bulk path"
    assert batch.schema.equals(expected.schema)
    assert batch.equals(expected)
    rows = batch.to_pylist()
    assert rows[0]["__hw_seq"] == Sequence(1000, 0).sortable()
    assert rows[0]["after"]["spot"] == {"x": 1.5, "y": 0.0}


@pytest.mark.parametrize(
    "irregular",
    [
        b'{"op":"c","after":{"id":1,"price":"NaN"}}',  # special value of a decimal
        b'{"op":"c","after":{"id":1.0,"price":"1.00"}}',  # integral float for an int column
        b'{"op":"c",\n"after":{"id":1,"price":"1.00"}}',  # more than one line
        b'{"id":1,"price":"1.00"}',  # not an envelope: the whole value is the row
        b'{"op":"c","after":{"id":"1","price":"1.00"}}',  # text for an int column
        b'{"op":"c","after":{"id":1,"price":"1.00"},"source":{"commit_lsn":-1,"txn_index":0}}',
        b'  {"op":"c","after":{"id":1,"price":"1.00"}}',
    ],
)
def test_irregular_values_take_the_per_value_path(irregular):
    records = [*RECORDS[:2], stored(5, {"id": 1}, irregular)]
    build = builder()
    try:
        expected = build.build(records)
    except Exception as exc:  # the per-value path's verdict stands, whichever it is
        expected = exc
    per_value = builder()
    per_value._build_bulk = lambda records, target: None
    try:
        reference = per_value.build(records)
    except Exception as exc:
        assert type(expected) is type(exc)
        return
    assert expected.equals(reference)
