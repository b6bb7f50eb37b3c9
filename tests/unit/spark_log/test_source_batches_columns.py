"""A columnar read -> the source's Arrow batches: the same batches as from the records (pure, no Spark)."""

from __future__ import annotations

import orjson
import pytest
import yaml

from core.config import load_config
from log.base import Record, StoredRecord, TopicSpec
from log.columns import RecordColumns
from log.envelope import Op, encode_key, encode_value
from log.factory import open_log
from log.file.backend import FileLog
from log.reading import read_range, read_range_columns
from log.topics import SCHEMAS_TOPIC
from spark_log.data_source import HeadwaterLogDataSource, LogRangePartition
from spark_log.offsets import OffsetRange
from spark_log.source_batches import SourceBatchBuilder
from spark_log.source_schema import FIRST_OP, output_schema
from tests.unit.spark_log.test_source_batches import (
    RECORDS,
    TOPIC,
    V1,
    WIDE,
    builder,
    event,
    stored,
    wide_records,
)


def columns_of(records):
    return RecordColumns.from_records(records[0].topic, records[0].partition, records)


def unique_offsets(records):
    return [
        StoredRecord(r.topic, r.partition, i, r.timestamp_ms, r.key, r.value, r.headers) for i, r in enumerate(records)
    ]


@pytest.mark.parametrize("tombstones", [False, True])
@pytest.mark.parametrize("versions", [(WIDE,), None], ids=["typed", "json-images"])
def test_columns_build_the_batch_the_records_build(tombstones, versions):
    records = unique_offsets(wide_records())
    build = (
        builder(versions, include_tombstones=tombstones)
        if versions
        else SourceBatchBuilder(output_schema(None), None, include_tombstones=tombstones)
    )
    expected = build.build(records)
    if versions:  # regular envelopes: the bulk path, never the records
        build.build = None
    batch = build.build_columns(columns_of(records))
    assert batch.schema.equals(expected.schema)
    assert batch.equals(expected)


@pytest.mark.parametrize(
    "odd",
    [
        b'{"op":"c",\n"after":{"id":1,"price":"1.00"}}',  # more than one line: per-value path
        b'{"id":1,"price":"1.00"}',  # not an envelope
        b'{"op":"c","after":{"id":"1","price":"1.00"}}',  # text for an int column
        b"",
    ],
)
def test_irregular_values_give_the_same_rows_or_error(odd):
    records = [*RECORDS, stored(5, {"id": 1}, odd), StoredRecord(TOPIC, 0, 6, 7, None, RECORDS[0].value)]
    try:
        expected = builder().build(records)
    except Exception as exc:  # the per-value path's verdict stands, whichever it is
        with pytest.raises(type(exc)):
            builder().build_columns(columns_of(records))
        return
    assert builder().build_columns(columns_of(records)).equals(expected)


def test_all_tombstones_and_empty_columns():
    tombstone = StoredRecord(TOPIC, 0, 3, 1, b'{"id":1}', None)
    assert builder().build_columns(columns_of([tombstone])).num_rows == 0
    assert (
        builder(include_tombstones=True)
        .build_columns(columns_of([tombstone]))
        .equals(builder(include_tombstones=True).build([tombstone]))
    )


def test_a_range_read_from_the_file_log_builds_the_same_batches(tmp_path):
    log = FileLog(tmp_path / "log", compression="zstd", segment_bytes=4096)
    try:
        log.create_topic(TopicSpec(TOPIC, partitions=1, min_compaction_lag_ms=0, delete_retention_ms=3_600_000))
        records = wide_records(120)
        for start in range(0, len(records), 9):
            log.append(
                TOPIC, 0, [Record(r.key, r.value, (("m", b"1"),), r.timestamp_ms) for r in records[start : start + 9]]
            )
        log.append(TOPIC, 0, [Record(None, encode_value(event(0, Op.CREATE, after={"id": 1}))), Record(None, None)])
        log.compact(TOPIC)
        end = log.end_offset(TOPIC, 0)
        for tombstones in (False, True):
            build = builder((WIDE,), include_tombstones=tombstones)
            for start, stop, chunk in [(0, end, 10_000), (5, end - 3, 17)]:
                expected = [build.build(chunk_) for chunk_ in read_range(log, TOPIC, 0, start, stop, chunk=chunk)]
                columns = read_range_columns(log, TOPIC, 0, start, stop, max_records=chunk)
                got = [build.build_columns(c) for c in columns]
                assert [b.to_pylist() for b in got] == [b.to_pylist() for b in expected]
    finally:
        log.close()


def test_the_reader_gives_the_rows_of_the_record_path(tmp_path):
    config_path = tmp_path / "headwater.yaml"
    config_path.write_text(yaml.safe_dump({"project": "p", "home": str(tmp_path / "home"), "log": {"partitions": 1}}))
    log = open_log(load_config(config_path))
    try:
        log.create_topic(TopicSpec(TOPIC, partitions=1))
        log.create_topic(TopicSpec(SCHEMAS_TOPIC, partitions=1))
        schema = {"topic": TOPIC, "schema": "public", "table": "items", **V1}
        log.append(SCHEMAS_TOPIC, 0, [Record(TOPIC.encode(), orjson.dumps(schema))])
        changes = []
        for step in range(30):
            key = step % 7
            op = Op.CREATE if step < 7 else (Op.DELETE if step % 5 == 0 else Op.UPDATE)
            image = {"id": key, "price": f"{step}.50"}
            value = event(step, op, before=image if op == Op.DELETE else None, after=None if op == Op.DELETE else image)
            changes.append(Record(encode_key({"id": key}), encode_value(value)))
            if op == Op.DELETE:
                changes.append(Record(encode_key({"id": key}), None))
        for start in range(0, len(changes), 4):
            log.append(TOPIC, 0, changes[start : start + 4])
        end = log.end_offset(TOPIC, 0)
        records = [r for chunk in read_range(log, TOPIC, 0, 0, end) for r in chunk]
    finally:
        log.close()
    for latest in ("false", "true"):
        source = HeadwaterLogDataSource({"config": str(config_path), "topic": TOPIC, "latestPerKey": latest})
        reader = source.streamReader(source.schema())
        rows = [
            row for batch in reader.read(LogRangePartition(OffsetRange(TOPIC, 0, 0, end))) for row in batch.to_pylist()
        ]
        if latest == "false":
            assert rows == reader.builder.build(records).to_pylist()
        else:
            assert sorted((row["key"], row["op"], row[FIRST_OP]) for row in rows) == sorted(
                {
                    r.key.decode(): (r.key.decode(), orjson.loads(r.value)["op"], first)
                    for first, r in [
                        (next(orjson.loads(f.value)["op"] for f in records if f.key == r.key and f.value), r)
                        for r in records
                        if r.value is not None
                    ]
                }.values()
            )
