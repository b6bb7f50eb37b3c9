"""How a batch's columns meet a warehouse table's: added, filled with nulls, cast within a type family, or refused.

A new batch column is added to the table (the writer merges with ``merge_schema``); a table
column missing from the batch stays and is null in the rows the batch writes; a batch column
of another type is cast to the table's when both are of one family (integers, floats,
strings, binaries, timestamps, dates, decimals) and every value fits, else
:class:`SchemaMismatchError` is raised before anything is committed: delta-rs' own MERGE
would cast silently (e.g. an integer to a string).
"""

from __future__ import annotations

import pyarrow as pa  # type: ignore[import-untyped]  # no stubs

from warehouse_loader.errors import SchemaMismatchError


def _family(kind: pa.DataType) -> str:
    """Types within one family cast into each other when the values fit (checked, never silently)."""
    checks = (
        ("int", pa.types.is_integer),
        ("float", pa.types.is_floating),
        ("string", lambda t: pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)),
        ("binary", lambda t: pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t)),
        ("timestamp", pa.types.is_timestamp),
        ("date", pa.types.is_date),
        ("decimal", pa.types.is_decimal),
    )
    for name, check in checks:
        if check(kind):
            return name
    return str(kind)


def reconcile(table: str, target: pa.Schema | None, batch: pa.Table) -> tuple[pa.Table, bool]:
    """Fit ``batch`` to the table's schema; returns the batch and whether it adds columns.

    Null-typed columns (no value seen yet) carry no type and are dropped unless the table
    has the column; they are added when a batch brings a typed value.
    """
    adds = False
    for field in batch.schema:
        name = field.name
        if target is None or name not in target.names:
            if pa.types.is_null(field.type):
                batch = batch.drop_columns([name])
            else:
                adds = target is not None
            continue
        want = target.field(name).type
        if field.type == want:
            continue
        if not (pa.types.is_null(field.type) or _family(field.type) == _family(want)):
            raise SchemaMismatchError(table, name, str(want), str(field.type))
        try:
            column = batch.column(name).cast(want)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            raise SchemaMismatchError(table, name, str(want), str(field.type)) from None
        batch = batch.set_column(batch.schema.get_field_index(name), pa.field(name, want), column)
    if target is not None:
        for field in target:
            if field.name not in batch.column_names:
                batch = batch.append_column(field, pa.nulls(batch.num_rows, field.type))
    return batch, adds
