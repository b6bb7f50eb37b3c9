"""SCD type 1 and type 2 semantics: a change batch (and the state it touches) → actions.

Semantics follow Databricks AUTO CDC (``create_auto_cdc_flow`` / ``APPLY CHANGES``,
https://docs.databricks.com/aws/en/ldp/cdc):

* The sequence column orders changes; per key the highest sequence wins, whatever the
  arrival order. Ties on (key, sequence) are the same change delivered twice.
* SCD1: an upsert replaces the row when newer than it; a delete removes it. A delete is
  remembered as a *tombstone* (Databricks keeps them in its backing table, see "Control
  tombstone management for SCD type 1 queries"), so a late older change cannot resurrect a
  deleted key. A truncate (``apply_as_truncates``) removes every row with a lower sequence
  and leaves a watermark under which later-arriving changes are stale.
* SCD2: each version carries ``__START_AT`` / ``__END_AT`` with the *sequence* value (as
  Databricks propagates the ``sequence_by`` value into them, same type); the current
  version has ``__END_AT`` null; a delete closes the current version. An out-of-order
  change is placed at its sequence position: it splits the enclosing version. With
  ``track_history_columns`` (Databricks ``track_history_column_list``), a change that
  alters only untracked columns updates the version in place instead of opening one;
  the version keeps only its latest values, so a late change that would split it (a
  tracked change, delete or truncate at or before the last change it absorbed) is refused.
  Without it every change opens a version (even one repeating the values), which keeps
  every boundary so late changes are placed exactly. A delete that closes no version (it
  arrived before the key's older changes, or a late delete now precedes it) is kept as a
  *tombstone* (keys + sequence, the same layout as SCD1's), so a late older change opens
  a version that it closes; tombstones are never forgotten, a redundant one is harmless.
* Truncate in SCD2 (Databricks supports truncates for SCD1 only): every version spanning
  the truncate is closed at its sequence, as if each key were deleted there, whatever the
  arrival order; truncates are remembered, so a late change older than one opens a
  version already closed at it.

The planners (:mod:`warehouse_loader.scd1`, :mod:`warehouse_loader.scd2`) are vectorised
with DuckDB over Arrow (no per-row Python) and never touch storage. The Delta writer
(``delta_writer``) feeds them the slice of the table a batch can affect and commits the
result; ``apply_scd1`` / ``apply_scd2`` are the in-memory twins of its MERGEs, used by
tests and as the executable specification. This module holds what both planners share:
the in-memory DuckDB database they run their SQL in, and fitting results to Arrow schemas.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import duckdb
import pyarrow as pa  # type: ignore[import-untyped]  # no stubs

_DATABASE: duckdb.DuckDBPyConnection | None = None


@contextmanager
def duckdb_tables(**tables: pa.Table) -> Iterator[duckdb.DuckDBPyConnection]:
    """A cursor of the process's in-memory DuckDB database with ``tables`` registered under their names."""
    # One in-memory database per process (opening one costs ~20 ms); each call gets its own
    # connection, whose registered tables and temp tables are private to it, so calls
    # from several threads do not see each other. Timestamps need no session time zone:
    # results are cast back to the input's Arrow types.
    global _DATABASE  # noqa: PLW0603
    if _DATABASE is None:
        _DATABASE = duckdb.connect(":memory:")
    con = _DATABASE.cursor()
    try:
        for name, table in tables.items():
            con.register(name, table)
        yield con
    finally:
        con.close()


def merged_schema(*schemas: pa.Schema) -> pa.Schema:
    """Union of columns, first occurrence wins for the type; null-typed columns take a later type."""
    fields: dict[str, pa.Field] = {}
    for schema in schemas:
        for field in schema:
            if field.name not in fields or pa.types.is_null(fields[field.name].type):
                fields[field.name] = field
    return pa.schema(list(fields.values()))


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` with exactly ``schema``'s columns in order; absent columns become nulls."""
    arrays = []
    for field in schema:
        if field.name in table.column_names:
            column = table.column(field.name)
            arrays.append(column if column.type == field.type else column.cast(field.type))
        else:
            arrays.append(pa.nulls(table.num_rows, field.type))
    return pa.Table.from_arrays(arrays, schema=schema)
