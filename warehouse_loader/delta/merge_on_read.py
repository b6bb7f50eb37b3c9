"""MERGE as merge-on-read: replaced rows go into deletion vectors, new rows into one new file.

delta-rs's MERGE is copy-on-write: every file holding a matched key is rewritten whole, so
a trickle of random updates rewrites most of a large table each micro-batch (issue 34:
~3 GB a minute for 2M rows at 300 updates/s). Here the same MERGE is one commit that

* adds one Parquet file with the rows the MERGE inserts or updates to;
* restates each file holding a replaced or deleted row with a deletion vector marking
  those rows (its earlier deletions included), written into ``_hw_dv/``
  (:mod:`warehouse_loader.delta.deletion_vectors`);
* carries the app transaction and custom metadata as delta-rs commits do.

Which rows are matched and what each clause does are decided by the same SQL predicates
delta-rs would evaluate (aliases ``s`` source, ``t`` target), run by DuckDB over the
batch's keys' live rows (their file and row position from ``read_parquet``, minus rows
earlier deletion vectors removed). Every reader that applies deletion vectors sees the
rows delta-rs's MERGE would have left: delta-rs's own query engine and MERGE, DuckDB
through :func:`warehouse_loader.delta.scan.register_delta`, Spark with Delta.

When: the table is on local disk or S3, where its files go through
:mod:`warehouse_loader.delta.table_files` (the commit is a put-if-absent: ``link`` locally, a
conditional ``PutObject`` on S3, which fails when the version exists: a lost race is a
conflict, re-planned by the writer; other object stores stay copy-on-write), and has the
``deletionVectors`` table feature
(:func:`enable_when_large` adds it once a table outgrows :data:`MIN_TABLE_BYTES`, 1 MiB, so small
tables stay readable by readers without deletion vector support, such as delta-rs's
``to_pyarrow_dataset``). Batches that add columns or truncate use delta-rs's MERGE.

Cost per batch: a scan of the key columns (DuckDB, row-group statistics), the batch's new
file, one deletion vector per touched file (2 bytes per deleted row of that file until
compaction rewrites it; :mod:`warehouse_loader.maintenance` compacts files whose deleted
share grows) and a small log entry.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]
from deltalake import DeltaTable, TableFeatures
from deltalake.exceptions import CommitFailedError

from warehouse_loader.delta import add_actions, deletion_vectors, log_entry
from warehouse_loader.delta.scan import deleted_rows, live_files
from warehouse_loader.delta.table_files import TableFiles, table_files
from warehouse_loader.duckdb_connection import duckdb_connection
from warehouse_loader.location import TableLocation
from warehouse_loader.sql_text import key_match, quote, sql_list

#: A table switches to deletion vectors once its files hold this many bytes.
MIN_TABLE_BYTES = 1024 * 1024
#: Columns DuckDB adds to a scan (a table with columns of these names stays copy-on-write).
_FILE, _ROW = "__hw_file", "file_row_number"
#: ``t."column"`` in a predicate: a target column it reads.
_TARGET_COLUMN = re.compile(r'\bt\."((?:[^"]|"")+)"')


def has_deletion_vectors(target: DeltaTable) -> bool:
    """Whether the table has the ``deletionVectors`` reader feature."""
    return "deletionVectors" in (target.protocol().reader_features or [])


def usable(location: TableLocation, target: DeltaTable) -> bool:
    """Whether a MERGE into ``target`` is done here: a table with deletion vectors, no reserved column, local or S3."""
    names = set(target.schema().to_arrow().names) if has_deletion_vectors(target) else set()
    return table_files(location) is not None and bool(names) and not names & {_FILE, _ROW}


def enable_when_large(location: TableLocation, target: DeltaTable) -> bool:
    """Add the ``deletionVectors`` feature to a local or S3 table past :data:`MIN_TABLE_BYTES`; whether it has it."""
    if has_deletion_vectors(target):
        return True
    if table_files(location) is None:
        return False
    size = sum(target.get_add_actions(flatten=True).column("size_bytes").to_pylist())
    if size < MIN_TABLE_BYTES:
        return False
    # Another writer committing first (it may have added the feature) is no failure: looked at again below.
    with contextlib.suppress(CommitFailedError):
        target.alter.add_feature(TableFeatures.DeletionVectors, allow_protocol_versions_increase=True)
    target.update_incremental()
    return has_deletion_vectors(target)


def _deleted_in(table: TableFiles, target: DeltaTable, files: list[str]) -> dict[str, np.ndarray]:
    """Row positions earlier deletion vectors remove from ``files``, by table-relative path.

    Read from the ``_hw_dv/`` files the add actions name; a deletion vector not written here
    (another engine's) is read through delta-rs, which materializes every file's.
    """
    current = add_actions.current_adds(table, target.version())
    found: dict[str, np.ndarray] = {}
    for uri in files:
        path = table.relative(uri)
        descriptor = current[path].get("deletionVector")
        if not descriptor:
            continue
        positions = deletion_vectors.read(table, descriptor)
        if positions is None:
            return _by_file(table, deleted_rows(target))
        found[path] = positions
    return found


def _by_file(table: TableFiles, gone: pa.Table | None) -> dict[str, np.ndarray]:
    """The positions in ``gone`` (:func:`~warehouse_loader.delta.scan.deleted_rows`) by table-relative file path."""
    if gone is None:
        return {}
    names = gone.column(_FILE).to_pylist()
    positions = gone.column("pos").to_numpy().astype(np.uint64)
    found: dict[str, list[int]] = {}
    for index, name in enumerate(names):
        found.setdefault(name, []).append(index)
    return {table.relative(f): positions[rows] for f, rows in found.items()}


def _removed_candidates(table: TableFiles, candidates: pa.Table, deleted: dict[str, np.ndarray]) -> pa.Table:
    """``(__hw_file, pos)`` of the ``candidates`` rows that earlier deletion vectors removed.

    Matched per file in numpy, so only those rows are built, not a row (with its file's path)
    per position the vectors hold: a backlog loaded without compaction holds millions of them,
    and that table took a load's driver past 3 GB at 10M events (issue 31).
    """
    names, positions = [pa.array([], pa.string())], [np.zeros(0, np.int64)]
    if deleted and candidates.num_rows:
        files = candidates.column(_FILE).combine_chunks().dictionary_encode()
        rows = candidates.column(_ROW).to_numpy()
        indices = files.indices.to_numpy(zero_copy_only=False)
        order = np.argsort(indices, kind="stable")
        bounds = np.searchsorted(indices[order], np.arange(len(files.dictionary) + 1))
        for index, name in enumerate(files.dictionary.to_pylist()):
            gone = deleted.get(table.relative(name))
            if gone is None:
                continue
            mine = rows[order[bounds[index] : bounds[index + 1]]]
            hit = mine[np.isin(mine.astype(np.uint64), gone)]
            names.append(pa.array([name] * len(hit), pa.string()))
            positions.append(hit.astype(np.int64))
    return pa.table({_FILE: pa.concat_arrays(names), "pos": pa.array(np.concatenate(positions))})


def merge(
    location: TableLocation,
    target: DeltaTable,
    source: pa.Table,
    *,
    keys: Sequence[str],
    also_on: str | None,
    drop_matched: str,
    insert_matched: str,
    insert_unmatched: str,
    app_id: str,
    version: int,
    metadata: dict[str, str],
) -> dict[str, int]:
    """One MERGE of ``source`` into ``target`` as a merge-on-read commit; delta-rs's metric names.

    Join: ``keys`` equal (and ``also_on``). A matched target row is removed where
    ``drop_matched`` holds; a source row is inserted where it matched a row and
    ``insert_matched`` holds, or matched none and ``insert_unmatched`` holds.
    Raises :class:`~deltalake.exceptions.CommitFailedError` when another commit took the version.
    """
    started = time.monotonic()
    table = table_files(location)
    assert table is not None, "merge-on-read on a store without conditional writes (usable() said so)"
    schema = pa.schema(target.schema().to_arrow())
    files = live_files(target)
    on = key_match(keys, "t", "s") + (f" AND {also_on}" if also_on else "")
    key_cols = ", ".join(quote(k) for k in keys)
    con = duckdb_connection([location])
    try:
        con.register("s_batch", source)
        scan = f"read_parquet({sql_list(files)}, filename = '{_FILE}', file_row_number = true, union_by_name = true)"
        # Only the columns the join and the predicates read: a scan of every column would cost
        # as much as the copy-on-write rewrite this replaces.
        read = _TARGET_COLUMN.findall(" ".join((also_on or "", drop_matched, insert_matched)))
        needed = [*keys, *sorted({name.replace('""', '"') for name in read})]
        wanted = ", ".join(f"t.{quote(c)}" for c in dict.fromkeys(needed) if c in schema.names)
        # Two steps: the batch's keys first (a scan of the needed columns), then the rows earlier
        # deletion vectors removed, read for the files holding those keys only (a batch's cost
        # then does not grow with the rows removed elsewhere in the table).
        con.execute(
            f"CREATE TEMP TABLE candidates AS SELECT {wanted}, t.{_FILE}, t.{_ROW} FROM {scan} t "
            f"SEMI JOIN (SELECT DISTINCT {key_cols} FROM s_batch) k ON {key_match(keys, 't', 'k')}"
        )
        candidates = con.sql(f"SELECT {_FILE}, {_ROW} FROM candidates").to_arrow_table()
        deleted = _deleted_in(table, target, candidates.column(_FILE).unique().to_pylist())
        con.register("gone", _removed_candidates(table, candidates, deleted))
        con.execute(
            f"CREATE TEMP TABLE live AS SELECT t.* FROM candidates t "
            f"ANTI JOIN gone g ON g.{_FILE} = t.{_FILE} AND g.pos = t.{_ROW}"
        )
        dropped = con.sql(
            f"SELECT DISTINCT t.{_FILE} AS f, t.{_ROW} AS r FROM s_batch s JOIN live t ON {on} WHERE {drop_matched}"
        ).to_arrow_table()
        inserted = con.sql(
            f"SELECT s.* FROM s_batch s LEFT JOIN live t ON {on} "
            f"WHERE (t.{_FILE} IS NULL AND ({insert_unmatched})) OR (t.{_FILE} IS NOT NULL AND ({insert_matched}))"
        ).to_arrow_table()
        matched_inserts = con.execute(
            f"SELECT count(*) FROM s_batch s JOIN live t ON {on} WHERE {insert_matched}"
        ).fetchone()
    finally:
        con.close()
    updated = int(matched_inserts[0]) if matched_inserts else 0
    actions = _file_actions(table, target, dropped, deleted)
    if inserted.num_rows:
        actions.append({"add": log_entry.write_data_file(table, conform(inserted, schema))})
    metrics = {
        "num_source_rows": source.num_rows,
        "num_target_rows_inserted": inserted.num_rows - updated,
        "num_target_rows_updated": updated,
        "num_target_rows_deleted": dropped.num_rows - updated,
        "num_target_files_added": 1 if inserted.num_rows else 0,
        "num_target_deletion_vectors_written": len(actions) - (1 if inserted.num_rows else 0),
        "execution_time_ms": int((time.monotonic() - started) * 1000),
    }
    log_entry.commit(
        table,
        target.version() + 1,
        actions,
        operation="MERGE",
        metrics=metrics,
        metadata=metadata,
        transaction=(app_id, version),
    )
    return metrics


def conform(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """``rows`` with the table's columns, in its order and types (absent ones null)."""
    columns = [
        rows.column(f.name).cast(f.type) if f.name in rows.column_names else pa.nulls(rows.num_rows, f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(columns, schema=schema)


def _file_actions(
    table: TableFiles, target: DeltaTable, dropped: pa.Table, deleted: dict[str, np.ndarray]
) -> list[dict[str, Any]]:
    """A remove and an add with the new deletion vector for every file that loses rows."""
    if dropped.num_rows == 0:
        return []
    names = dropped.column("f").to_pylist()
    relative = {name: table.relative(name) for name in set(names)}
    paths = np.array([relative[name] for name in names])
    rows = dropped.column("r").to_numpy().astype(np.uint64)
    touched = sorted(set(paths.tolist()))
    current = add_actions.current_adds(table, target.version())
    vectors = [np.concatenate([deleted.get(path, np.zeros(0, np.uint64)), rows[paths == path]]) for path in touched]
    descriptors = deletion_vectors.write_file(table, vectors)
    now = int(time.time() * 1000)
    actions: list[dict[str, Any]] = []
    for path, descriptor in zip(touched, descriptors, strict=True):
        old = current[path]
        remove = {
            "path": path,
            "deletionTimestamp": now,
            "dataChange": True,
            "extendedFileMetadata": True,
            "partitionValues": old.get("partitionValues", {}),
            "size": old["size"],
        }
        if old.get("deletionVector"):
            remove["deletionVector"] = old["deletionVector"]
        actions.append({"remove": remove})
        actions.append({"add": {**old, "deletionVector": descriptor, "dataChange": True}})
    return actions
