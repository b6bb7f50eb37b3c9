"""A source table read as capture's events, compared row by row with its warehouse table, a chunk at a time.

For sources whose verify reads rows as events (:class:`capture.consistent_read.ConsistentReads`,
MySQL/MariaDB): the source side is exactly what a load of those events would write. Each chunk
of event values is decoded by the log's own reader (:class:`spark_log.source_batches.SourceBatchBuilder`,
the decoder of every load) into the row image's Arrow columns, cast to the table's column types
(a column whose cast is refused is *not compared*, never half-compared) and compared in DuckDB
with the table's rows of those keys: a key the table lacks, a column that differs
(``IS DISTINCT FROM``: nulls and NaN compare equal to themselves). Memory is bounded by the chunk:
the table's rows are read per chunk (pruned by the chunk's key range), and only the keys seen
go into a DuckDB table, from which the keys only the warehouse has are found at the end.

A key's text is its columns' DuckDB text joined like :mod:`operations.row_hashes`' key texts, so
:func:`operations.table_diff.changed_since` and :func:`operations.table_diff.shown_key` take it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import duckdb
import pyarrow as pa  # type: ignore[import-untyped]  # no stubs

from capture.consistent_read import ConsistentRead
from core.config import ProjectConfig
from core.errors import PermanentError
from log.base import Log, StoredRecord
from log.table_schemas import read_schema_records
from operations.row_hashes import Canonical, text_sql
from operations.table_diff import Difference, DiffTarget, shown_key
from warehouse_loader.changes import METADATA_COLUMNS
from warehouse_loader.duckdb_connection import duckdb_connection
from warehouse_loader.errors import WarehouseError
from warehouse_loader.location import TableLocation
from warehouse_loader.sql_text import quote
from warehouse_loader.table_format import StoredTable

#: Source rows decoded and compared at a time.
CHUNK_ROWS = 20_000
_KEY = "__hw_key"


class UncomparableKeyError(WarehouseError, PermanentError):
    """A key column the source's images lack, or whose values have no exact form in the table's key type."""


class ImageDecoder:
    """Event values of one topic -> the Arrow columns of their ``after`` images, as a load decodes them."""

    def __init__(self, config: ProjectConfig, log: Log, topic: str) -> None:
        # pyspark's type mapping (no JVM): the load's own schema of the topic's images.
        from spark_log.data_source import topic_modes
        from spark_log.source_batches import SourceBatchBuilder
        from spark_log.source_schema import merged_struct, output_schema, row_schema

        records = read_schema_records(log, [topic])[topic]
        row = row_schema(topic, records, topic_modes(config, topic))
        self._builder = SourceBatchBuilder(output_schema(merged_struct([row])), {topic: row})
        self._topic = topic

    def images(self, values: Sequence[bytes]) -> pa.Table:
        """The ``after`` image of each value, a row each, in order."""
        from spark_log.source_schema import AFTER

        records = [StoredRecord(self._topic, 0, at, 0, None, value) for at, value in enumerate(values)]
        after = self._builder.build(records).column(AFTER)
        return pa.Table.from_arrays(after.flatten(), names=[f.name for f in after.type])


def key_texts(keys: Sequence[str]) -> list[Canonical]:
    """The key columns' texts (DuckDB only: both sides are read by DuckDB here)."""
    return [Canonical(name, "", f"CAST({quote(name)} AS VARCHAR)") for name in keys]


@dataclass
class ImageComparison:
    """What :func:`compare_images` found."""

    source_rows: int = 0
    warehouse_rows: int = 0
    chunks: int = 0
    differing_chunks: int = 0
    differences: dict[str, Difference] = field(default_factory=dict)
    not_compared: list[str] = field(default_factory=list)


def compare_images(  # noqa: PLR0917  (the read, its decoder, the table, the target, the keys to compare)
    read: ConsistentRead,
    decoder: ImageDecoder,
    where: TableLocation,
    stored: StoredTable,
    target: DiffTarget,
    only: Iterable[str] | None = None,
) -> ImageComparison:
    """Every row of ``read`` against the table ``stored`` (at ``where``); with ``only``, just those key texts."""
    found = ImageComparison()
    schema = stored.schema()
    keys = list(target.keys)
    compared = [n for n in schema.names if n not in keys and n not in METADATA_COLUMNS]
    key_sql = text_sql(target.key_text, "duck")
    listed = ", ".join(quote(k) for k in keys)
    con = duckdb_connection([where])
    try:
        stored.register(con, "target")
        wanted = None if only is None else sorted(only)
        if wanted is not None:
            con.register("wanted", pa.table({"k": pa.array(wanted, pa.string())}))
        keep = "" if wanted is None else f"WHERE {key_sql} IN (SELECT k FROM wanted)"
        con.execute(f"CREATE OR REPLACE TEMP TABLE seen AS SELECT {listed} FROM target LIMIT 0")
        skipped: set[str] = set()
        for values in read.values(CHUNK_ROWS):
            images = decoder.images(values)
            columns = _cast(images, schema, keys, [c for c in compared if c not in skipped], skipped)
            con.register("src", columns)
            found.source_rows += len(values)
            found.chunks += 1
            before = len(found.differences)
            _compare_chunk(con, target, [c for c in compared if c in columns.column_names], keep, found)
            con.execute(f"INSERT INTO seen SELECT {listed} FROM src")
            con.unregister("src")
            if len(found.differences) > before:
                found.differing_chunks += 1
        found.not_compared = [c for c in compared if c in skipped]
        if skipped:  # compared in earlier chunks only: never half-compared, so none of its values is reported
            _forget(found, skipped)
        found.warehouse_rows = int(con.sql("SELECT count(*) FROM target").fetchall()[0][0])
        only_wh = f"SELECT {key_sql} FROM target ANTI JOIN seen USING ({listed}) {keep}"
        for (key,) in con.sql(only_wh).fetchall():
            found.differences[key] = Difference(shown_key(target, key), "only in the warehouse")
    finally:
        con.close()
    return found


def _cast(images: pa.Table, schema: pa.Schema, keys: list[str], compared: list[str], skipped: set[str]) -> pa.Table:
    """The images' key and compared columns in the table's types; a column whose cast is refused joins ``skipped``."""
    arrays: dict[str, pa.Array] = {}
    for name in [*keys, *compared]:
        if name not in images.column_names:
            if name in keys:
                msg = f"key column {name!r} of the table is not in its source's row image: verify cannot compare it"
                raise UncomparableKeyError(msg)
            continue  # a column the source no longer writes (dropped): not a source column
        try:
            arrays[name] = images.column(name).cast(schema.field(name).type, safe=True)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            if name in keys:
                msg = f"key column {name!r} has no exact form in the table's type {schema.field(name).type}"
                raise UncomparableKeyError(msg) from None
            skipped.add(name)
    return pa.table(arrays)


def _compare_chunk(
    con: duckdb.DuckDBPyConnection, target: DiffTarget, columns: list[str], keep: str, found: ImageComparison
) -> None:
    """The chunk in ``src`` against the table's rows of its keys; adds what differs to ``found``."""
    keys = list(target.keys)
    key_sql = text_sql(target.key_text, "duck")
    first = quote(keys[0])
    low, high = con.sql(f"SELECT min({first}), max({first}) FROM src").fetchall()[0]
    if low is None:
        return
    joined = " AND ".join(f"s.{quote(k)} = t.{quote(k)}" for k in keys)
    flags = [f"s.{quote(c)} IS DISTINCT FROM t.{quote(c)}" for c in columns]
    texts = [f"CAST(s.{quote(c)} AS VARCHAR), CAST(t.{quote(c)} AS VARCHAR)" for c in columns]
    query = (
        f"WITH s AS (SELECT *, {key_sql} AS {_KEY} FROM src {keep}), "
        f"t AS (SELECT * FROM target WHERE {first} BETWEEN $low AND $high) "
        f"SELECT s.{_KEY}, t.{first} IS NULL{''.join(', ' + f for f in flags)}{''.join(', ' + t for t in texts)} "
        f"FROM s LEFT JOIN t ON {joined} "
        f"WHERE t.{first} IS NULL{''.join(' OR ' + f for f in flags)}"
    )
    width = len(columns)
    for row in con.execute(query, {"low": low, "high": high}).fetchall():
        key, missing = row[0], row[1]
        if missing:
            found.differences[key] = Difference(shown_key(target, key), "missing in the warehouse")
            continue
        differing = row[2 : 2 + width]
        values = row[2 + width :]
        found.differences[key] = Difference(
            shown_key(target, key),
            "differs",
            [(name, values[2 * i], values[2 * i + 1]) for i, name in enumerate(columns) if differing[i]],
        )


def _forget(found: ImageComparison, columns: set[str]) -> None:
    """Drop ``columns`` from the differences found (a key left with no differing column is not reported)."""
    for key, difference in list(found.differences.items()):
        if difference.kind != "differs":
            continue
        kept = [c for c in difference.columns if c[0] not in columns]
        if kept:
            found.differences[key] = Difference(difference.key, difference.kind, kept)
        else:
            del found.differences[key]
