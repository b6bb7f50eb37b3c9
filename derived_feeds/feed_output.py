"""A micro-batch's feed output records on the driver, in Arrow: changes paired with SQL rows, then encoded.

Spark hands the driver two small tables per micro-batch (``transform.change_rows``: one
row per latest source change with its feed key as JSON and its position;
``transform.output_rows``: one row per SQL output row with the same key JSON and the row
as JSON). :func:`pair_changes` joins them here, where a hash join of 100k rows takes
milliseconds, instead of a shuffle and sort-merge join in Spark, and applies the feed's
rule (``transform`` module docstring). :func:`encode_output` then builds each record's
Debezium change-event value with Arrow string kernels: no Python per row, no JSON writer
per row in the JVM.

Pure (Arrow tables in and out). Values have ``log.envelope.encode_value``'s key order;
the ``source`` block names the feed and keeps the source position.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import orjson
import pyarrow as pa  # type: ignore[import-untyped]  # no stubs
import pyarrow.compute as pc  # type: ignore[import-untyped]

from derived_feeds.expectations import Check
from log.envelope import EVENT_VERSION, Op
from spark_log import source_schema as cols

#: ``source.connector`` of a feed's events: feeds have always written PostgreSQL-shaped ``source``
#: blocks (``txId``, ``lsn``, ``xmin`` null), so consumers of today's feed topics keep reading them.
FEED_CONNECTOR: Final = "postgresql"
#: The feed key as JSON text (both inputs), and the SQL row as JSON text (output rows).
KEY_JSON: Final = "__hw_key"
AFTER_JSON: Final = "__hw_after_json"
_NULL: Final = "null"
_OLD_JSON: Final = "__hw_old_json"
#: The source position and provenance every feed output record keeps.
META: Final = (
    cols.SEQ,
    cols.COMMIT_LSN,
    cols.TXN_INDEX,
    cols.COMMIT_TS,
    cols.SNAPSHOT,
    cols.SOURCE_DB,
    cols.SOURCE_SCHEMA,
    cols.SOURCE_TABLE,
)


def pair_changes(changes: pa.Table, outputs: pa.Table, checks: Sequence[Check] = ()) -> pa.Table:
    """Each latest change with its SQL rows (left join on the key JSON), and the feed op it makes.

    An upsert (the change's op) where the key's image passed the SQL; a delete where the
    source row was deleted or no longer passes, except keys whose first change in the
    batch was an insert (never in the feed: nothing). Truncates pass through. Columns:
    ``__hw_key``, ``op``, ``__hw_after_json`` (null for deletes), META, and check flags
    (null for deletes, which pass every check).
    """
    is_truncate = _is_truncate(changes)
    joined = changes.filter(pc.invert(is_truncate)).join(
        outputs, keys=KEY_JSON, join_type="left outer", use_threads=False
    )
    return _feed_ops(joined, changes.filter(is_truncate), checks)


def paired_output(rows: pa.Table, checks: Sequence[Check] = ()) -> pa.Table:
    """:func:`pair_changes` of changes already paired in Spark (``transform.paired_rows``: one pass).

    ``rows`` has every latest change with its SQL row's JSON and check flags (null where
    the SQL dropped the row); the same rule, the same columns.
    """
    is_truncate = _is_truncate(rows)
    return _feed_ops(rows.filter(pc.invert(is_truncate)), rows.filter(is_truncate), checks)


def _is_truncate(changes: pa.Table) -> pa.Array:
    return pc.fill_null(pc.equal(_array(changes, cols.OP), Op.TRUNCATE.value), False)


def _feed_ops(joined: pa.Table, truncates: pa.Table, checks: Sequence[Check]) -> pa.Table:
    """The feed rule over changes paired with their SQL rows (``joined``), then the truncates."""
    op = _array(joined, cols.OP)
    is_delete = pc.equal(op, Op.DELETE.value)
    passed = pc.and_(_array(joined, AFTER_JSON).is_valid(), pc.invert(is_delete))
    never_in_feed = pc.and_(pc.invert(is_delete), pc.equal(_array(joined, cols.FIRST_OP), Op.CREATE.value))
    feed_op = pc.if_else(
        passed, op, pc.if_else(never_in_feed, pa.scalar(None, pa.string()), pa.scalar(Op.DELETE.value))
    )
    keep = feed_op.is_valid()
    deleted = pc.equal(feed_op, Op.DELETE.value)
    columns: dict[str, pa.Array] = {
        KEY_JSON: _array(joined, KEY_JSON),
        cols.OP: feed_op,
        AFTER_JSON: _null_where(deleted, _array(joined, AFTER_JSON)),
        **{name: _array(joined, name) for name in META},
        **{check.flag: _null_where(deleted, _array(joined, check.flag)) for check in checks},
    }
    output = pa.table(columns).filter(keep)
    if truncates.num_rows:
        empty = {AFTER_JSON: pa.string(), **{check.flag: pa.bool_() for check in checks}}
        truncate_columns = {
            KEY_JSON: pa.nulls(truncates.num_rows, pa.string()),
            cols.OP: truncates.column(cols.OP),
            **{name: pa.nulls(truncates.num_rows, kind) for name, kind in empty.items()},
            **{name: truncates.column(name) for name in META},
        }
        output = pa.concat_tables([output, pa.table(truncate_columns).select(output.column_names)])
    return output


def _array(table: pa.Table, name: str) -> pa.Array:
    return table.column(name).combine_chunks()


def _null_where(mask: pa.Array, values: pa.Array) -> pa.Array:
    return pc.if_else(mask, pa.scalar(None, values.type), values)


def encode_output(output: pa.Table, feed: str, checks: Sequence[Check] = ()) -> pa.Table:
    """Feed output records (:func:`pair_changes`) -> ``key``, ``op``, ``value``, ``dropped_value`` and the check flags.

    ``value`` is the record's Debezium change event (JSON); ``dropped_value`` (only where a ``drop`` check
    failed) the delete that takes the key out of the feed instead. Deletes carry the key
    columns in ``before``, as Debezium's with the default replica identity.
    """
    key = _array(output, KEY_JSON)
    op = _array(output, cols.OP)
    is_delete = pc.fill_null(pc.equal(op, Op.DELETE.value), False)
    ts_us = pc.fill_null(_array(output, cols.COMMIT_TS).cast(pa.int64()), 0)
    # As Spark's floor(ts_us / 1000): a double division, then floor.
    ts_ms = pc.floor(pc.divide(ts_us.cast(pa.float64()), 1000.0)).cast(pa.int64())
    ts_ms_text, ts_us_text = _number_text(ts_ms), _number_text(ts_us)
    source = pc.binary_join_element_wise(
        f'{{"version":{_json(EVENT_VERSION)},"connector":{_json(FEED_CONNECTOR)},"name":{_json(feed)},"ts_ms":',
        ts_ms_text,
        ',"ts_us":',
        ts_us_text,
        ',"snapshot":',
        _string_text(pc.fill_null(_array(output, cols.SNAPSHOT), "false")),
        ',"db":',
        _string_text(_array(output, cols.SOURCE_DB)),
        ',"sequence":"[null,null]","schema":',
        _string_text(_array(output, cols.SOURCE_SCHEMA)),
        ',"table":',
        _string_text(_array(output, cols.SOURCE_TABLE)),
        ',"txId":null,"lsn":null,"xmin":null,"commit_lsn":',
        _number_text(_array(output, cols.COMMIT_LSN)),
        ',"txn_index":',
        _number_text(_array(output, cols.TXN_INDEX)),
        "}",
        "",
    )
    before = pc.fill_null(pc.if_else(is_delete, key, pa.scalar(None, pa.string())), _NULL)
    after = pc.fill_null(_array(output, AFTER_JSON), _NULL)
    value = _envelope(before, after, source, op, ts_ms_text, ts_us_text)
    dropped = pa.nulls(output.num_rows, pa.string())
    drop_flags = [pc.fill_null(_array(output, c.flag), True) for c in checks if c.action == "drop"]
    if drop_flags:
        passing = drop_flags[0]
        for flag in drop_flags[1:]:
            passing = pc.and_(passing, flag)
        delete = _envelope(pc.fill_null(key, _NULL), _NULL, source, Op.DELETE.value, ts_ms_text, ts_us_text)
        dropped = pc.if_else(pc.invert(passing), delete, pa.scalar(None, pa.string()))
    flags = {check.flag: _array(output, check.flag) for check in checks}
    return pa.table({"key": key, cols.OP: op, "value": value, "dropped_value": dropped, **flags})


def _envelope(before: object, after: object, source: object, op: object, *ts: object) -> pa.Array:
    """A change event's value in ``log.envelope.encode_value``'s key order."""
    return pc.binary_join_element_wise(
        '{"before":',
        before,
        ',"after":',
        after,
        ',"source":',
        source,
        ',"op":"',
        op,
        '","ts_ms":',
        ts[0],
        ',"ts_us":',
        ts[1],
        ',"transaction":null}',
        "",
    )


def _json(text: str) -> str:
    return orjson.dumps(text).decode()


def _number_text(values: pa.Array) -> pa.Array:
    return pc.fill_null(values.cast(pa.string()), _NULL)


def _string_text(values: pa.Array) -> pa.Array:
    """JSON text of each string (null: ``null``), escaping each distinct value once (provenance repeats)."""
    encoded = values.dictionary_encode()
    texts = pa.array([orjson.dumps(v).decode() for v in encoded.dictionary.to_pylist()], pa.string())
    return pc.fill_null(texts.take(encoded.indices), _NULL)


def diff_rows(old: pa.Table, new: pa.Table, checks: Sequence[Check] = ()) -> pa.Table:
    """Feed records from a region of the output before (``old``) and after (``new``) a micro-batch.

    Both have ``__hw_key`` and ``__hw_after_json`` (``new`` also the check flags), one row
    per key. A key only in ``new`` is a create, in both with another row an update, only in
    ``old`` a delete; an unchanged row makes no record. Columns: ``__hw_key``, ``op``,
    ``__hw_after_json`` (null for deletes) and the check flags (null for deletes).
    """
    before = old.select([KEY_JSON, AFTER_JSON]).rename_columns([KEY_JSON, _OLD_JSON])
    joined = new.select([KEY_JSON, AFTER_JSON, *[c.flag for c in checks]]).join(
        before, keys=KEY_JSON, join_type="full outer", use_threads=False
    )
    after, previous = _array(joined, AFTER_JSON), _array(joined, _OLD_JSON)
    op = pc.if_else(
        after.is_null(),
        pa.scalar(Op.DELETE.value),
        pc.if_else(
            previous.is_null(),
            pa.scalar(Op.CREATE.value),
            pc.if_else(pc.equal(previous, after), pa.scalar(None, pa.string()), pa.scalar(Op.UPDATE.value)),
        ),
    )
    columns = {
        KEY_JSON: _array(joined, KEY_JSON),
        cols.OP: op,
        AFTER_JSON: after,
        **{check.flag: _array(joined, check.flag) for check in checks},
    }
    return pa.table(columns).filter(op.is_valid())
