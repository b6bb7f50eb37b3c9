"""One Iceberg snapshot per micro-batch: the batch marker, copy-on-write file replacement, conflicts.

Contract:

* **Marker.** Every snapshot Headwater commits carries ``headwater.table`` (the app id, as
  the Delta app transaction's) and ``headwater.batch_id`` in its summary, and the same
  commit sets the table property ``headwater.batch.<app>`` to the batch id. The property is
  what :func:`committed_batch` checks before a batch is planned: it survives snapshot expiry
  and other engines' snapshots, which the summary chain does not.
* **One snapshot.** A batch's schema changes (:mod:`warehouse_loader.iceberg.schema`), the
  marker property and its snapshot are one catalog commit: the data files whose rows the
  batch changes are removed and their rewritten rows plus the batch's new rows added
  (copy-on-write; no delete files, so every reader reads it). A batch that changes nothing
  still commits an empty snapshot, so it is recorded.
* **Conflicts.** Tables are created with ``commit.retry.num-retries = 0``: pyiceberg's own
  retry would rebase the snapshot on a newer parent without re-planning, and an append
  rebased onto another writer's rows of the same key would duplicate the key. A commit
  that loses the catalog's compare-and-swap raises
  :class:`~warehouse_loader.errors.CommitConflictError`; the writer reloads, checks the
  marker again and re-plans. A failed commit leaves only unreferenced files, which
  maintenance removes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

import duckdb
import orjson
import pyarrow as pa  # type: ignore[import-untyped]

from warehouse_loader.duckdb_connection import duckdb_connection, store_errors
from warehouse_loader.errors import CommitConflictError, WarehouseWriteError
from warehouse_loader.iceberg.scan import TableFiles, arrow_schema
from warehouse_loader.iceberg.schema import evolve
from warehouse_loader.iceberg.table_ref import IcebergTableRef
from warehouse_loader.location import classify_storage_error

if TYPE_CHECKING:
    from pyiceberg.manifest import DataFile
    from pyiceberg.table import Table, Transaction

#: Snapshot summary keys of a Headwater commit.
TABLE_SUMMARY = "headwater.table"
BATCH_SUMMARY = "headwater.batch_id"
KEY_SUMMARY = "headwater.key"
#: Table property prefix recording the highest batch committed per app id.
BATCH_PROPERTY = "headwater.batch."
#: Table properties every Headwater table is created with.
CREATE_PROPERTIES = {"commit.retry.num-retries": "0", "format-version": "2"}


def committed_batch(table: Table | None, app: str) -> int | None:
    """The highest batch id ``app`` committed to ``table`` (None: no table, or no batch yet)."""
    if table is None:
        return None
    value = table.properties.get(BATCH_PROPERTY + app)
    return None if value is None else int(value)


def already(table: Table | None, app: str, batch_id: int) -> bool:
    """True when ``table`` holds batch ``batch_id`` of ``app`` (or a later one)."""
    done = committed_batch(table, app)
    return done is not None and done >= batch_id


def recorded_key(table: Table | None) -> tuple[str, ...] | None:
    """The key the latest Headwater snapshot of ``table`` merged on, or None."""
    if table is None:
        return None
    from pyiceberg.table.snapshots import ancestors_of

    current = table.current_snapshot()
    for snapshot in ancestors_of(current, table.metadata) if current is not None else ():
        recorded = snapshot.summary.additional_properties.get(KEY_SUMMARY) if snapshot.summary else None
        if recorded is not None:
            return tuple(orjson.loads(recorded))
    return None


@contextmanager
def reading(ref: IcebergTableRef, **tables: pa.Table) -> Iterator[duckdb.DuckDBPyConnection]:
    """A DuckDB connection able to read ``ref``'s files, with ``tables`` registered by name.

    A connection of the process's database for its store (``duckdb_connection``): its views
    and registered tables are its own, so concurrent callers do not see each other's.
    """
    con = duckdb_connection([ref.location])
    try:
        with store_errors(ref.location):
            for name, value in tables.items():
                con.register(name, value)
            yield con
    finally:
        con.close()


def files_where(ref: IcebergTableRef, files: TableFiles, where: str, **tables: pa.Table) -> list[str]:
    """Paths of the files holding a row for which the SQL condition ``where`` (over ``t``) holds."""
    if not files.files:
        return []
    with reading(ref, **tables) as con:
        files.register(con, "target", filename=True)
        found = con.sql(f"SELECT DISTINCT t.filename FROM target t WHERE {where}").fetchall()
    return sorted(files.path_of(row[0]) for row in found)


def read_files(ref: IcebergTableRef, files: TableFiles, paths: Sequence[str]) -> pa.Table:
    """Every row of the files ``paths``, in the table's current schema."""
    schema = arrow_schema(files.table.schema())
    if not paths:
        return schema.empty_table()
    with reading(ref) as con:
        files.register(con, "target", paths)
        rows = con.sql("SELECT * FROM target").to_arrow_table()
    return rows.cast(schema) if rows.schema != schema else rows


def summary(app: str, batch_id: int, keys: Sequence[str] | None) -> dict[str, str]:
    """The snapshot summary properties of a Headwater commit."""
    marks = {TABLE_SUMMARY: app, BATCH_SUMMARY: str(batch_id)}
    if keys is not None:
        marks[KEY_SUMMARY] = orjson.dumps(list(keys)).decode()
    return marks


def commit_files(
    ref: IcebergTableRef,
    files: TableFiles | None,
    *,
    removed: Sequence[str],
    rows: pa.Table,
    app: str,
    batch_id: int,
    keys: Sequence[str] | None,
    metadata: Mapping[str, str] | None = None,
) -> Table:
    """Commit one snapshot that replaces the files ``removed`` by ``rows`` (creating the table if ``files`` is None).

    ``metadata`` joins the snapshot's summary.

    Schema changes the rows need are staged in the same commit. Raises
    :class:`CommitConflictError` when another writer committed first (nothing of ours landed).
    """
    from pyiceberg.exceptions import CommitFailedException, TableAlreadyExistsError

    marks = {**(metadata or {}), **summary(app, batch_id, keys)}
    try:
        tx: Transaction
        if files is None:
            creating = _writable(rows)
            tx = ref.open_catalog().create_table_transaction(
                ref.identifier, schema=creating.schema, location=ref.location_uri, properties=CREATE_PROPERTIES
            )
        else:
            tx = files.table.transaction()
        fitted = evolve(tx, app, _writable(rows))
        tx.set_properties({BATCH_PROPERTY + app: str(batch_id)})
        stage_snapshot(tx, [files.files[p] for p in removed] if files else [], fitted, marks)
        committed = tx.commit_transaction()
    except (CommitFailedException, TableAlreadyExistsError) as exc:
        raise CommitConflictError(app, batch_id, str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from exc
    except OSError as exc:
        raise classify_storage_error(exc, ref.location) or WarehouseWriteError(app, batch_id, str(exc)[:200]) from exc
    return committed if files is not None else _reloaded(ref)


def commit_row_delta(
    ref: IcebergTableRef,
    files: TableFiles,
    *,
    rows: pa.Table,
    positions: pa.Table,
    app: str,
    batch_id: int,
    keys: Sequence[str] | None,
) -> Table:
    """Commit one merge-on-read snapshot: ``rows`` in new data files, ``positions`` (``file_path``, ``pos``) deleted.

    Same marker, schema changes and conflict handling as :func:`commit_files`.
    """
    from pyiceberg.exceptions import CommitFailedException
    from pyiceberg.io.pyarrow import _dataframe_to_data_files

    from warehouse_loader.iceberg.row_delta import row_delta, write_position_deletes

    try:
        tx = files.table.transaction()
        fitted = evolve(tx, app, _writable(rows))
        tx.set_properties({BATCH_PROPERTY + app: str(batch_id)})
        added = (
            list(_dataframe_to_data_files(table_metadata=tx.table_metadata, df=fitted, io=tx._table.io))
            if fitted.num_rows
            else []
        )
        deletes = write_position_deletes(tx, positions)
        row_delta(tx, added=added, deletes=[deletes] if deletes else [], properties=summary(app, batch_id, keys))
        committed = tx.commit_transaction()
    except CommitFailedException as exc:
        raise CommitConflictError(app, batch_id, str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from exc
    except OSError as exc:
        raise classify_storage_error(exc, ref.location) or WarehouseWriteError(app, batch_id, str(exc)[:200]) from exc
    return committed


def _reloaded(ref: IcebergTableRef) -> Table:
    """The table just created (a create transaction returns a staged table, not the committed one)."""
    loaded = ref.load()
    assert loaded is not None
    return loaded


def append_rows(ref: IcebergTableRef, target: Table | None, rows: pa.Table, *, app: str, batch_id: int) -> None:
    """Commit ``rows`` as one appended snapshot of ``ref`` (created when ``target`` is None), with the marker."""
    commit_files(
        ref,
        None if target is None else TableFiles(target, {}),
        removed=(),
        rows=rows,
        app=app,
        batch_id=batch_id,
        keys=None,
    )


def _writable(rows: pa.Table) -> pa.Table:
    """``rows`` without null-typed columns (no value seen yet: Iceberg has no type for them)."""
    nulls = [f.name for f in rows.schema if pa.types.is_null(f.type)]
    return rows.drop_columns(nulls) if nulls else rows


def stage_snapshot(tx: Transaction, removed: Sequence[DataFile], rows: pa.Table, marks: dict[str, str]) -> None:
    """Stage one snapshot in ``tx`` removing the ``removed`` files and adding ``rows``' new ones.

    A row delta without deletes (:func:`~warehouse_loader.iceberg.row_delta.row_delta`), not
    pyiceberg's overwrite: it merges the parent's small manifests into the snapshot's own, where
    pyiceberg's adds one per commit and keeps the ones left with no live file.
    """
    from pyiceberg.io.pyarrow import _dataframe_to_data_files

    from warehouse_loader.iceberg.row_delta import row_delta

    written = (
        list(_dataframe_to_data_files(table_metadata=tx.table_metadata, df=rows, io=tx._table.io))
        if rows.num_rows
        else []
    )
    row_delta(tx, added=written, removed=removed, properties=marks)
