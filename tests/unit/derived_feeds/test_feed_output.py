"""Pairing latest changes with SQL rows, and the events' JSON, on the driver (pure Arrow, no Spark)."""

from __future__ import annotations

import datetime as dt

import orjson
import pyarrow as pa

from derived_feeds.expectations import Check
from derived_feeds.feed_output import AFTER_JSON, KEY_JSON, diff_rows, encode_output, pair_changes, paired_output
from derived_feeds.feed_output import FEED_CONNECTOR as CONNECTOR
from log.envelope import EVENT_VERSION

UTC = dt.UTC
TS = dt.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)


def changes_table(rows):
    """rows: (key json | None, op, first op, commit_lsn)."""
    n = len(rows)
    return pa.table(
        {
            KEY_JSON: pa.array([r[0] for r in rows], pa.string()),
            "op": pa.array([r[1] for r in rows], pa.string()),
            "__hw_first_op": pa.array([r[2] for r in rows], pa.string()),
            "__hw_seq": pa.array([f"{r[3]:016x}.{0:016x}" for r in rows], pa.string()),
            "commit_lsn": pa.array([r[3] for r in rows], pa.int64()),
            "txn_index": pa.array([0] * n, pa.int64()),
            "commit_ts": pa.array([TS] * n, pa.timestamp("us", tz="UTC")),
            "snapshot": pa.array([None] * n, pa.string()),
            "source_db": pa.array(['d"b'] * n, pa.string()),
            "source_schema": pa.array(["public"] * n, pa.string()),
            "source_table": pa.array(["items"] * n, pa.string()),
        }
    )


def outputs_table(rows, flags=None):
    table = {
        KEY_JSON: pa.array([r[0] for r in rows], pa.string()),
        AFTER_JSON: pa.array([r[1] for r in rows], pa.string()),
    }
    for name, values in (flags or {}).items():
        table[name] = pa.array(values, pa.bool_())
    return pa.table(table)


def by_key(table):
    return {(r["key"], r["op"]): r for r in table.to_pylist()}


def test_upserts_deletes_filtered_rows_and_truncates():
    changes = changes_table(
        [
            ('{"id":1}', "u", "u", 10),  # passes the SQL: upsert
            ('{"id":2}', "d", "u", 11),  # deleted in the source: delete
            ('{"id":3}', "u", "c", 12),  # first seen as insert, fails the filter: nothing
            ('{"id":4}', "u", "u", 13),  # fails the filter now: delete
            (None, "t", "t", 14),  # truncate
        ]
    )
    outputs = outputs_table([('{"id":1}', '{"id":1,"name":"a"}')])
    events = pair_changes(changes, outputs)
    encoded = encode_output(events, "clean")
    rows = by_key(encoded)
    assert set(rows) == {('{"id":1}', "u"), ('{"id":2}', "d"), ('{"id":4}', "d"), (None, "t")}
    upsert = orjson.loads(rows[('{"id":1}', "u")]["value"])
    ts_us = int((TS - dt.datetime(1970, 1, 1, tzinfo=UTC)).total_seconds()) * 1_000_000 + 678901
    assert upsert == {
        "before": None,
        "after": {"id": 1, "name": "a"},
        "source": {
            "version": EVENT_VERSION,
            "connector": CONNECTOR,
            "name": "clean",
            "ts_ms": ts_us // 1000,
            "ts_us": ts_us,
            "snapshot": "false",
            "db": 'd"b',
            "sequence": "[null,null]",
            "schema": "public",
            "table": "items",
            "txId": None,
            "lsn": None,
            "xmin": None,
            "commit_lsn": 10,
            "txn_index": 0,
        },
        "op": "u",
        "ts_ms": ts_us // 1000,
        "ts_us": ts_us,
        "transaction": None,
    }
    # Key order of log.envelope.encode_value: before, after, source, op, ts_ms, ts_us, transaction.
    assert list(orjson.loads(rows[('{"id":4}', "d")]["value"])) == list(upsert)
    delete = orjson.loads(rows[('{"id":4}', "d")]["value"])
    assert delete["before"] == {"id": 4}
    assert delete["after"] is None
    assert delete["source"]["commit_lsn"] == 13
    truncate = orjson.loads(rows[(None, "t")]["value"])
    assert (truncate["before"], truncate["after"], truncate["op"]) == (None, None, "t")
    assert encoded.column("dropped_value").null_count == encoded.num_rows


def test_drop_check_writes_a_delete_instead():
    check = Check(0, "expect_column_values_to_not_be_null", "name", "drop")
    changes = changes_table([('{"id":1}', "u", "u", 10), ('{"id":2}', "c", "c", 11), ('{"id":3}', "d", "u", 12)])
    outputs = outputs_table(
        [('{"id":1}', '{"id":1,"name":null}'), ('{"id":2}', '{"id":2,"name":"b"}')], {check.flag: [False, True]}
    )
    encoded = encode_output(pair_changes(changes, outputs, [check]), "clean", [check])
    rows = {r["key"]: r for r in encoded.to_pylist()}
    assert rows['{"id":1}'][check.flag] is False
    dropped = orjson.loads(rows['{"id":1}']["dropped_value"])
    assert (dropped["op"], dropped["before"], dropped["after"]) == ("d", {"id": 1}, None)
    assert rows['{"id":2}']["dropped_value"] is None
    assert rows['{"id":3}'][check.flag] is None  # deletes pass every check
    assert rows['{"id":3}']["dropped_value"] is None


def test_several_sql_rows_per_key_and_empty_batches():
    changes = changes_table([('{"id":1}', "u", "u", 10)])
    outputs = outputs_table([('{"id":1}', '{"id":1,"n":1}'), ('{"id":1}', '{"id":1,"n":2}')])
    assert encode_output(pair_changes(changes, outputs), "f").num_rows == 2
    empty = pair_changes(changes_table([]), outputs_table([]))
    assert encode_output(empty, "f").num_rows == 0


def test_changes_paired_in_spark_make_the_same_events_as_the_driver_join():
    rows = [
        ('{"id":1}', "u", "u", 10),
        ('{"id":2}', "d", "u", 11),
        ('{"id":3}', "u", "c", 12),
        ('{"id":4}', "u", "u", 13),
        (None, "t", "t", 14),
        ('{"id":5}', "c", "c", 15),
    ]
    afters = {'{"id":1}': '{"id":1,"name":"a"}', '{"id":5}': '{"id":5,"name":null}'}
    flags = {'{"id":1}': True, '{"id":5}': False}
    check = Check(0, "expect_column_values_to_not_be_null", "name", "drop")
    changes = changes_table(rows)
    outputs = outputs_table(list(afters.items()), {check.flag: list(flags.values())})
    paired = changes.append_column(AFTER_JSON, pa.array([afters.get(r[0]) for r in rows], pa.string()))
    paired = paired.append_column(check.flag, pa.array([flags.get(r[0]) for r in rows], pa.bool_()))

    joined = encode_output(pair_changes(changes, outputs, [check]), "f", [check])
    one_pass = encode_output(paired_output(paired, [check]), "f", [check])

    def key(row):
        return (row["key"] or "", row["op"])

    assert sorted(one_pass.to_pylist(), key=key) == sorted(joined.to_pylist(), key=key)
    assert {(r["key"], r["op"]) for r in one_pass.to_pylist()} == {
        ('{"id":1}', "u"),
        ('{"id":2}', "d"),
        ('{"id":4}', "d"),
        (None, "t"),
        ('{"id":5}', "c"),
    }


def test_a_region_before_and_after_a_batch_makes_only_its_differences():
    old = pa.table({KEY_JSON: ['{"g":"a"}', '{"g":"b"}', '{"g":"c"}'], AFTER_JSON: ['{"n":1}', '{"n":2}', '{"n":3}']})
    new = pa.table(
        {
            KEY_JSON: ['{"g":"a"}', '{"g":"b"}', '{"g":"d"}'],
            AFTER_JSON: ['{"n":1}', '{"n":5}', '{"n":4}'],
            "__hw_ok0": [True, False, True],
        }
    )
    check = Check(0, "expect_column_values_to_be_between", "n", "warn", {"max_value": 4})
    records = diff_rows(old, new, [check]).sort_by(KEY_JSON).to_pylist()
    assert records == [  # a: unchanged, no record; b: changed; c: gone; d: new
        {KEY_JSON: '{"g":"b"}', "op": "u", AFTER_JSON: '{"n":5}', "__hw_ok0": False},
        {KEY_JSON: '{"g":"c"}', "op": "d", AFTER_JSON: None, "__hw_ok0": None},
        {KEY_JSON: '{"g":"d"}', "op": "c", AFTER_JSON: '{"n":4}', "__hw_ok0": True},
    ]
    empty = pa.table({KEY_JSON: pa.array([], pa.string()), AFTER_JSON: pa.array([], pa.string())})
    assert diff_rows(empty, empty).num_rows == 0
