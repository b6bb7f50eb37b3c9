"""How a batch's columns meet an Iceberg table's: by column IDs, every change a metadata change.

Iceberg names columns by field ID, so the schema changes below rewrite no data file; they are
staged in the same transaction as the batch's snapshot, so readers see the new columns and
the rows that fill them together:

* a batch column the table lacks is **added** (a new ID; older files read it as NULL);
* a batch column of a wider type than the table's, where Iceberg allows the promotion
  (``int`` -> ``long``, ``float`` -> ``double``, ``decimal(P, S)`` -> ``decimal(P', S)``
  with ``P' > P``), **widens** the column;
* any other type difference follows the Delta path's rule
  (:func:`warehouse_loader.schema_evolution.reconcile`): cast within one type family when
  every value fits, else :class:`~warehouse_loader.errors.SchemaMismatchError` before
  anything is committed;
* a table column the batch lacks stays and is NULL in the rows the batch writes.

Renames are decided from the source's schema records, not from a batch (a batch without a
column cannot tell a drop from a projection), for every format by
:func:`warehouse_loader.schema_evolution.table_changes`: :func:`source_changes` and
:func:`apply_changes` carry them out here as metadata changes (a renamed column keeps its ID);
a widening Iceberg has no promotion for (a decimal's scale: ``numeric(8,2)`` ->
``numeric(14,4)``) is refused in one line naming ``reprocess``, nothing changed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa  # type: ignore[import-untyped]

from warehouse_loader.errors import SchemaMismatchError, TypeChangeRefusedError
from warehouse_loader.iceberg.scan import arrow_schema
from warehouse_loader.schema_evolution import TableChanges, reconcile

if TYPE_CHECKING:
    from pyiceberg.table import Table, Transaction
    from pyiceberg.types import IcebergType


def _arrow_to_iceberg(table: str, field: pa.Field) -> IcebergType:
    """The Iceberg type a new column of Arrow type ``field.type`` gets."""
    from pyiceberg.io.pyarrow import _ConvertToIcebergWithoutIDs, visit_pyarrow
    from pyiceberg.schema import Schema

    try:
        kind = visit_pyarrow(field.type, _ConvertToIcebergWithoutIDs())
    except (TypeError, ValueError) as exc:
        msg = f"{field.type} ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"
        raise SchemaMismatchError(table, field.name, "an Iceberg column", msg) from None
    assert not isinstance(kind, Schema)  # a field's type, never a whole schema
    return kind


def promotion(current: IcebergType, wanted: IcebergType) -> bool:
    """True when Iceberg can widen ``current`` to ``wanted`` as a metadata change."""
    from pyiceberg import types as t

    if isinstance(current, t.IntegerType) and isinstance(wanted, t.LongType):
        return True
    if isinstance(current, t.FloatType) and isinstance(wanted, t.DoubleType):
        return True
    return (
        isinstance(current, t.DecimalType)
        and isinstance(wanted, t.DecimalType)
        and current.scale == wanted.scale
        and wanted.precision > current.precision
    )


def _wider(current: pa.DataType, wanted: pa.DataType) -> bool:
    """True when ``wanted`` is an Iceberg promotion of ``current`` (Arrow types)."""
    if pa.types.is_int32(current) or pa.types.is_int16(current) or pa.types.is_int8(current):
        return bool(pa.types.is_int64(wanted))
    if pa.types.is_float32(current):
        return bool(pa.types.is_float64(wanted))
    return bool(
        pa.types.is_decimal(current)
        and pa.types.is_decimal(wanted)
        and current.scale == wanted.scale
        and wanted.precision > current.precision
    )


def widen_rows(stored: pa.Table, batch: pa.Schema) -> pa.Table:
    """``stored`` rows (read from the table) with each column the batch widens cast to the batch's type.

    So merging them with the batch keeps the wider type, and :func:`evolve` widens the column.
    """
    for index, field in enumerate(stored.schema):
        if field.name in batch.names and _wider(field.type, batch.field(field.name).type):
            wide = batch.field(field.name).type
            stored = stored.set_column(index, pa.field(field.name, wide), stored.column(index).cast(wide))
    return stored


def evolve(tx: Transaction, table: str, batch: pa.Table) -> pa.Table:
    """Stage the batch's added and widened columns in ``tx``; return the batch fitted to the new schema.

    Raises :class:`SchemaMismatchError` (nothing staged) for a type that cannot be stored.
    """
    current = tx.table_metadata.schema()
    adds: list[tuple[str, IcebergType]] = []
    widens: list[tuple[str, IcebergType]] = []
    for field in batch.schema:
        if pa.types.is_null(field.type):
            continue  # no value seen yet: no type to add or compare
        existing = current.find_field(field.name) if field.name in current.column_names else None
        wanted = _arrow_to_iceberg(table, field)
        if existing is None:
            adds.append((field.name, wanted))
        elif existing.field_type != wanted and promotion(existing.field_type, wanted):
            widens.append((field.name, wanted))
    if adds or widens:
        with tx.update_schema() as update:
            for name, kind in adds:
                update.add_column(name, kind)
            for name, kind in widens:
                update.update_column(name, kind)
    fitted, _ = reconcile(table, arrow_schema(tx.table_metadata.schema()), batch)
    return fitted


def check_batch(table: str, target: Table | None, batch: pa.Table) -> None:
    """Raise :class:`SchemaMismatchError` when ``batch`` cannot be written to ``target`` (nothing is staged)."""
    if target is None:
        for field in batch.schema:
            if not pa.types.is_null(field.type):
                _arrow_to_iceberg(table, field)
        return
    current = target.schema()
    widened = []
    for field in batch.schema:
        if field.name in current.column_names and not pa.types.is_null(field.type):
            existing = current.find_field(field.name).field_type
            if promotion(existing, _arrow_to_iceberg(table, field)):
                widened.append(field.name)
    reconcile(table, arrow_schema(current), batch.drop_columns(widened))


def rename_column(tx: Transaction, old: str, new: str) -> None:
    """Stage a rename: the column keeps its ID, so every file written before reads under the new name."""
    with tx.update_schema() as update:
        update.rename_column(old, new)


def drop_column(tx: Transaction, name: str) -> None:
    """Stage a drop: the ID is retired; files keep the values, no reader sees them any more."""
    with tx.update_schema() as update:
        update.delete_column(name)


def source_changes(table: str, target: Table, changes: TableChanges) -> TableChanges:
    """The part of ``changes`` (renames, then widenings under the new names, then additions) ``target`` still needs.

    A widening Iceberg cannot do in metadata (a decimal's scale, a type outside the promotions
    of :func:`promotion`) raises :class:`TypeChangeRefusedError`: nothing is changed, the table
    is rebuilt by ``reprocess``.
    """
    current = target.schema()
    names = list(current.column_names)
    renames = tuple((old, new) for old, new in changes.renames if old in names and new not in names)
    for old, new in renames:
        names[names.index(old)] = new
    old_name = {new: old for old, new in renames}
    widen = {}
    for name, kind in changes.widen.items():
        if name not in names:
            continue
        have = current.find_field(old_name.get(name, name)).field_type
        wanted = _arrow_to_iceberg(table, pa.field(name, kind))
        if have == wanted:
            continue
        if not promotion(have, wanted):
            raise TypeChangeRefusedError(table, name, str(have), str(wanted), "an Iceberg table")
        widen[name] = kind
    adds = {name: kind for name, kind in changes.adds.items() if name not in names}
    for name, kind in adds.items():
        _arrow_to_iceberg(table, pa.field(name, kind))  # a type Iceberg cannot store: refused before any change
    return TableChanges(renames, widen, adds)


def apply_changes(table: str, target: Table, changes: TableChanges) -> None:
    """Rename, widen and add (optional) columns of ``target`` in one metadata commit; no file is rewritten."""
    tx = target.transaction()
    if changes.renames:
        with tx.update_schema() as update:
            for old, new in changes.renames:
                update.rename_column(old, new)
    if changes.widen:
        with tx.update_schema() as update:
            for name, kind in changes.widen.items():
                update.update_column(name, _arrow_to_iceberg(table, pa.field(name, kind)))
    if changes.adds:
        with tx.update_schema() as update:
            for name, kind in changes.adds.items():
                update.add_column(name, _arrow_to_iceberg(table, pa.field(name, kind)))
    tx.commit_transaction()
