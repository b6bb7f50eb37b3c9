"""How a batch's columns meet a warehouse table's: added, filled with nulls, cast within a type family, or refused.

A new batch column is added to the table (the writer merges with ``merge_schema``); a table
column missing from the batch stays and is null in the rows the batch writes; a batch column
of another type is cast to the table's when both are of one family (integers, floats,
strings, binaries, timestamps, dates, decimals) and every value fits, else
:class:`SchemaMismatchError` is raised before anything is committed: delta-rs' own MERGE
would cast silently (e.g. an integer to a string).

What a source's schema change asks of a table before a load starts (:func:`table_changes`,
the same for any table format; the writer of the format carries it out): a column the source
renamed is renamed in the table (every version keeps its values: one history under the new
name), and a column whose type the source widened (``int`` -> ``bigint``, ``real`` ->
``double precision``, ``numeric`` with more digits) is widened, so later values fit; a column
the source added (``ALTER TABLE ... ADD COLUMN``) is added to the table, nullable and in
metadata only, before any row brings a value (a query of the table finds it, null).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa  # type: ignore[import-untyped]  # no stubs
import pyarrow.compute as pc  # type: ignore[import-untyped]  # no stubs

from log.schema_history import Rename
from warehouse_loader.errors import SchemaMismatchError


@dataclass(frozen=True, slots=True)
class TableChanges:
    """Columns to rename (old -> new, in order), to widen (name -> new type) and to add (name -> type, nullable)."""

    renames: tuple[tuple[str, str], ...] = ()
    widen: Mapping[str, pa.DataType] = dataclasses.field(default_factory=dict)
    adds: Mapping[str, pa.DataType] = dataclasses.field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.renames or self.widen or self.adds)

    def describe(self) -> str:
        """One line: what changes."""
        parts = [f"{old} renamed to {new}" for old, new in self.renames]
        parts += [f"{name} widened to {kind}" for name, kind in self.widen.items()]
        parts += [f"{name} added as {kind}" for name, kind in self.adds.items()]
        return ", ".join(parts)


def table_changes(table: pa.Schema, renames: Sequence[Rename], reading: Mapping[str, pa.DataType]) -> TableChanges:
    """What ``table`` needs before rows read with ``reading`` (column -> type) merge into it.

    ``renames``: the input topic's renames, oldest first. A rename applies when the table has the
    old name and not the new one (a table loaded before the rename); a widening when the table
    holds a column of the reading's family in a type that cannot hold every value of the
    reading's type; an addition when the reading has a typed column the table lacks (the caller
    leaves out the columns the table's options do not keep).
    """
    types = {f.name: f.type for f in table}
    applied: list[tuple[str, str]] = []
    for rename in renames:
        if rename.old in types and rename.new not in types:
            types[rename.new] = types.pop(rename.old)
            applied.append((rename.old, rename.new))
    widen = {}
    for name, kind in reading.items():
        have = types.get(name)
        if have is not None and have != kind and _family(have) == _family(kind):
            wider = _wider(have, kind)
            if wider is not None and wider != have:
                widen[name] = wider
    adds = {name: kind for name, kind in reading.items() if name not in types and not pa.types.is_null(kind)}
    return TableChanges(tuple(applied), widen, adds)


def renamed_columns(changes: pa.Table, renames: Sequence[Rename], *, sequence: str) -> pa.Table:
    """A change batch read straight from the log (not through ``headwater_log``), renamed columns under their new name.

    Rows below a rename's position (``sequence``: the sortable source position) hold the old
    name; a name no later column reuses is dropped once moved.
    """
    for rename in renames:
        if rename.old not in changes.column_names:
            continue
        old = changes.column(rename.old)
        before = pc.and_(pc.less(changes.column(sequence), rename.at.sortable()), old.is_valid())
        if rename.new in changes.column_names:
            new = changes.column(rename.new)
            merged = pc.if_else(before, old.cast(new.type), new)
            changes = changes.set_column(changes.schema.get_field_index(rename.new), rename.new, merged)
        else:
            changes = changes.append_column(rename.new, pc.if_else(before, old, pa.nulls(len(old), old.type)))
        kept = pc.if_else(before, pa.nulls(len(old), old.type), old)
        if pc.all(kept.is_null()).as_py():
            changes = changes.drop_columns([rename.old])
        else:
            changes = changes.set_column(changes.schema.get_field_index(rename.old), rename.old, kept)
    return changes


def _wider(have: pa.DataType, want: pa.DataType) -> pa.DataType | None:
    """A type holding every value of both (None: none of the family, e.g. decimals beyond 38 digits)."""
    if pa.types.is_integer(have):
        return want if want.bit_width > have.bit_width else have
    if pa.types.is_floating(have):
        return want if want.bit_width > have.bit_width else have
    if pa.types.is_decimal(have):
        scale = max(have.scale, want.scale)
        digits = max(have.precision - have.scale, want.precision - want.scale)
        return pa.decimal128(digits + scale, scale) if digits + scale <= 38 else None
    if pa.types.is_string(have) and pa.types.is_large_string(want):
        return want
    return have


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
