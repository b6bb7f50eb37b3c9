"""Range buckets of a single integer key: the bucket SQL and the level-2 key ranges pick the same rows."""

from __future__ import annotations

import random

import duckdb
import pyarrow as pa  # type: ignore[import-untyped]  # no stubs

from operations.row_hashes import Canonical, range_bucket_sql
from operations.table_diff import MAX_RANGES, DiffTarget, _Buckets


def target() -> DiffTarget:
    key = Canonical(name="id", pg='"id"::text', duck='CAST("id" AS VARCHAR)', integer=True)
    return DiffTarget("t", "b", "topic", "src", "slot", "dsn", '"public"."t"', ("id",), [key], [], [], "")


def test_the_ranges_of_differing_buckets_hold_exactly_their_keys() -> None:
    chooser = random.Random(7)
    keys = sorted(chooser.sample(range(-5000, 5000), 900))
    low, width = min(keys), 13
    key = target().key_text[0]
    buckets = _Buckets(range_bucket_sql(key, "pg", low, width), range_bucket_sql(key, "duck", low, width), low, width)
    duck = duckdb.connect()
    duck.register("target", pa.table({"id": pa.array(keys, pa.int64())}))
    computed = dict(duck.sql(f"SELECT id, {buckets.duck} FROM target").fetchall())
    assert computed == {k: (k - low) // width for k in keys}  # non-negative operands: floor division
    differing = sorted(chooser.sample(sorted(set(computed.values())), 25))
    picked = {
        r[0] for r in duck.sql(f"SELECT id FROM target WHERE {buckets.where(target(), differing, 'duck')}").fetchall()
    }
    assert picked == {k for k, b in computed.items() if b in differing}
    assert " OR " in buckets.where(target(), differing, "pg") and "IN" not in buckets.where(target(), differing, "pg")


def test_many_differing_buckets_fall_back_to_one_scan() -> None:
    buckets = _Buckets("pgexpr", "duckexpr", 0, 4)
    where = buckets.where(target(), list(range(MAX_RANGES + 1)), "pg")
    assert where.startswith("pgexpr IN (0, 1, 2")
