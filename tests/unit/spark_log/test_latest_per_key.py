"""The latest change per key in Arrow equals the rule of ``transform.latest_changes`` (pure, no Spark)."""

from __future__ import annotations

import random

import pyarrow as pa

from capture.postgres.events.source_block import postgres_source
from core.source_config import TypesConfig
from log.base import StoredRecord
from log.envelope import ChangeEvent, Op, encode_key, encode_value
from spark_log.latest_per_key import latest_per_key
from spark_log.source_batches import SourceBatchBuilder
from spark_log.source_schema import output_schema, row_schema

TOPIC = "shop.public.items"
SCHEMA = {"version": 1, "columns": [{"name": "id", "type_oid": 23, "typmod": -1, "key": True}]}


def records(seed: int, count: int = 300) -> list[StoredRecord]:
    rng = random.Random(seed)
    out = []
    for offset in range(count):
        key = rng.randrange(20)
        op = rng.choice([Op.CREATE, Op.UPDATE, Op.DELETE, Op.READ, Op.TRUNCATE, Op.MESSAGE])
        lsn = rng.randrange(5)  # ties and out-of-order sequences on purpose
        source = postgres_source("shop", "db", "public", "items", 1, lsn, lsn, rng.randrange(3), 0)
        image = {"id": key}
        event = ChangeEvent(op, source, image if op == Op.DELETE else None, None if op == Op.DELETE else image, 0)
        keyless = op == Op.TRUNCATE or rng.random() < 0.05
        out.append(StoredRecord(TOPIC, 0, offset, 0, None if keyless else encode_key(image), encode_value(event)))
        if op == Op.DELETE and rng.random() < 0.5:
            out.append(StoredRecord(TOPIC, 0, offset, 0, encode_key(image), None))  # tombstone (same offset: fine)
    return out


def expected(rows: list[dict]) -> list[tuple]:
    """The rule, spelled out: max / min by (seq, partition, offset) per (topic, key); keyless rows alone."""
    changes = [r for r in rows if r["op"] in ("c", "u", "r", "d", "t")]
    groups: dict = {}
    for r in changes:
        group = (r["topic"], r["key"]) if r["key"] is not None else (r["topic"], None, r["partition"], r["offset"])
        groups.setdefault(group, []).append(r)

    def order(r):
        return (r["__hw_seq"] is not None, r["__hw_seq"] or "", r["partition"], r["offset"])

    out = []
    for members in groups.values():
        last, first = max(members, key=order), min(members, key=order)
        out.append((last["topic"], last["key"], last["offset"], last["op"], first["op"]))
    return sorted(out, key=repr)


def test_latest_per_key_follows_the_rule():
    schema = row_schema(TOPIC, [SCHEMA], TypesConfig())
    build = SourceBatchBuilder(output_schema(schema.struct()), {TOPIC: schema})
    for seed in range(5):
        batch = build.build(records(seed))
        got = latest_per_key(pa.Table.from_batches([batch])).to_pylist()
        assert sorted(((r["topic"], r["key"], r["offset"], r["op"], r["__hw_first_op"]) for r in got), key=repr) == (
            expected(batch.to_pylist())
        )
        assert len({(r["topic"], r["key"]) for r in got if r["key"] is not None}) == sum(
            1 for r in got if r["key"] is not None
        )


def test_empty_and_message_only_input():
    schema = row_schema(TOPIC, [SCHEMA], TypesConfig())
    build = SourceBatchBuilder(output_schema(schema.struct()), {TOPIC: schema})
    empty = pa.Table.from_batches([build.build([])])
    assert latest_per_key(empty).num_rows == 0
    assert "__hw_first_op" in latest_per_key(empty).column_names


def test_several_topics_and_partitions_in_one_table():
    """Topic and partition order the rows when they vary (a reader's table has one of each)."""
    schema = row_schema(TOPIC, [SCHEMA], TypesConfig())
    other = "shop.public.others"
    build = SourceBatchBuilder(output_schema(schema.struct()), {TOPIC: schema, other: schema})
    mixed = [
        StoredRecord(other if i % 3 == 0 else TOPIC, i % 2, r.offset, 0, r.key, r.value)
        for i, r in enumerate(records(7))
    ]
    batch = build.build(mixed)
    got = latest_per_key(pa.Table.from_batches([batch])).to_pylist()
    assert {r["topic"] for r in got} == {TOPIC, other}
    assert sorted(((r["topic"], r["key"], r["offset"], r["op"], r["__hw_first_op"]) for r in got), key=repr) == (
        expected(batch.to_pylist())
    )
