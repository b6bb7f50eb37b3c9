"""Schema changes of a Delta table (a column renamed or widened), carried out by rewriting it in one commit.

What changes is decided for any table format by :func:`warehouse_loader.schema_evolution.table_changes`;
this is how Delta does it with delta-rs 1.x, which has neither a column rename nor a type
change: Delta's column mapping (rename by metadata) is a table feature delta-rs does not write
correctly here (rows appended to a ``columnMapping.mode = name`` table read back as nulls,
deltalake 1.6.6), and type widening is not implemented. So the table is read whole, its
columns renamed or cast, and written back with ``mode="overwrite", schema_mode="overwrite"``:
one commit, atomic for readers, the earlier versions kept in the Delta log (time travel).
The cost is one rewrite of the table (``bench/ddl_bench.py``); it happens once per schema
change, before the load's first micro-batch after it.

The table's tombstones (``_hw_tombstones``) hold its key columns: a renamed or widened key
column changes there too, each table on its own (a crash between the two commits leaves the
second for the next start, which finds it still to do).

A column the source added is added to the table alone (the tombstones hold only key
columns) by a metadata commit (delta-rs ``alter.add_columns``): no file is rewritten, rows
written before read it as null, deletion vectors stay as they are, and the next batch's
schema merge finds the column already there, of the type it brings.
"""

from __future__ import annotations

from collections.abc import Sequence

import orjson
import pyarrow as pa  # type: ignore[import-untyped]  # no stubs
from deltalake import CommitProperties, DeltaTable, Field, write_deltalake

from warehouse_loader.delta.scan import select_rows
from warehouse_loader.delta.table import open_delta, table_schema
from warehouse_loader.delta.writer import KEY_METADATA, TOMBSTONES_DIR, Where
from warehouse_loader.location import TableLocation, as_location
from warehouse_loader.schema_evolution import TableChanges
from warehouse_loader.sql_text import quote

#: Commit metadata of a rewrite: what it changed.
CHANGE_METADATA = "headwater.schema_change"


def evolve(path: Where, changes: TableChanges, *, keys: Sequence[str]) -> bool:
    """Rename, widen and add columns of the table at ``path`` (its tombstones: rename, widen); True if any changed.

    ``keys``: the table's key after the change (recorded with each commit, as every commit does).
    """
    location = as_location(path)
    rewritten = _rewrite(location, changes, keys=keys)
    added = _add_columns(location, changes, keys=keys)
    side = location / TOMBSTONES_DIR
    return _rewrite(side, changes, keys=None) or rewritten or added


def _add_columns(location: TableLocation, changes: TableChanges, *, keys: Sequence[str]) -> bool:
    """Add the columns of ``changes.adds`` the table lacks, nullable, in one metadata commit."""
    target = open_delta(location)
    if target is None:
        return False
    have = set(table_schema(target).names)
    adds = {name: kind for name, kind in changes.adds.items() if name not in have}
    if not adds:
        return False
    metadata = {
        CHANGE_METADATA: TableChanges(adds=adds).describe(),
        KEY_METADATA: orjson.dumps(list(keys)).decode(),
    }
    fields = [Field.from_arrow(pa.field(name, kind, nullable=True)) for name, kind in adds.items()]
    target.alter.add_columns(fields, commit_properties=CommitProperties(custom_metadata=metadata))
    return True


def _rewrite(location: TableLocation, changes: TableChanges, *, keys: Sequence[str] | None) -> bool:
    target = open_delta(location)
    if target is None:
        return False
    schema = table_schema(target)
    renames = [(old, new) for old, new in changes.renames if old in schema.names and new not in schema.names]
    names = [dict(renames).get(name, name) for name in schema.names]
    widen = {name: kind for name, kind in changes.widen.items() if name in names}
    if not renames and not widen:
        return False
    data = _current_rows(location, target, schema).rename_columns(names)
    fields = [pa.field(f.name, widen.get(f.name, f.type), f.nullable) for f in data.schema]
    data = data.cast(pa.schema(fields))
    described = TableChanges(tuple(renames), widen).describe()
    metadata = {CHANGE_METADATA: described}
    if keys is not None:
        metadata[KEY_METADATA] = orjson.dumps(list(keys)).decode()
    write_deltalake(
        location.uri,
        data,
        mode="overwrite",
        schema_mode="overwrite",
        storage_options=location.storage_options,
        commit_properties=CommitProperties(custom_metadata=metadata),
    )
    return True


def _current_rows(location: TableLocation, target: DeltaTable, schema: pa.Schema) -> pa.Table:
    """The rows of the table's current version in its column order and types, deletion vectors applied.

    delta-rs's ``to_pyarrow_dataset`` refuses a table with the ``deletionVectors`` reader feature
    (merge-on-read tables), so such a table is read as every Headwater reader reads it.
    """
    if "deletionVectors" not in (target.protocol().reader_features or []):
        return target.to_pyarrow_dataset().to_table()
    columns = ", ".join(quote(name) for name in schema.names)
    return select_rows(location, target, f"SELECT {columns} FROM target").cast(schema)
