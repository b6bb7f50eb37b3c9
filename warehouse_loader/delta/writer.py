"""Apply planned SCD actions to Delta tables with deltalake (delta-rs), exactly once per micro-batch.

Contract:

* One micro-batch = one ``batch_id`` (Spark's ``foreachBatch`` id, stable across replays
  of the same batch). Its commit carries the Delta app transaction
  ``(app_id=<table>, version=<batch_id>)``; before planning, a batch whose id is at or
  below ``transaction_version(<table>)`` is skipped. delta-rs records app transactions
  but does not enforce them, so the check here is the whole guarantee; it assumes one
  writer per table (the Spark driver).
* SCD1: one MERGE on the table per batch. Deletes also go to a tombstone table under
  ``<table>/_hw_tombstones`` (the ``_`` prefix hides it from Delta readers and vacuum),
  committed *before* the main MERGE with the same app transaction: a crash in between
  replays the batch, and both MERGEs are idempotent (they only apply newer sequences).
* SCD2: one MERGE keyed by ``(keys, __START_AT)`` inserts, replaces (closes) and removes
  versions; a truncate's closings are planned versions like any other (the writer loads
  the versions spanning it, for every key). Deletes that close no version and truncates
  are appended to ``<table>/_hw_tombstones`` (rows ``keys, sequence, __hw_op`` with ``d``,
  or null keys and ``t``), append-only, before the MERGE and with the same app
  transaction; a replay after a crash in between skips the append and plans the same
  versions (remembered deletes are deduplicated with the batch's own).
* Schema: a new batch column is added (``merge_schema``); a table column missing from
  the batch stays and is null in rows the batch writes; a batch column whose type cannot
  be cast safely to the table's raises before anything is committed
  (:mod:`warehouse_loader.schema_evolution`).

* Concurrency: a commit that loses the race for its Delta version to another writer
  (:class:`~deltalake.exceptions.CommitFailedError`, on a local disk or an object store's
  conditional put) is planned again on the winner's version and retried
  (:data:`COMMIT_ATTEMPTS`); the tombstones a failed attempt committed are kept, as after a crash.
* Storage: ``path`` is a :class:`~warehouse_loader.location.TableLocation` (a local
  :class:`~pathlib.Path` is taken as one); an object store that refuses or cannot be
  reached fails the batch in one line (:func:`~warehouse_loader.location.storage_error`).

deltalake's Rust runtime panics in a forked child: call these functions from the process
that imported deltalake, or from a process started with ``spawn``; never from a
``fork``-started multiprocessing worker.

(Over 500 lines: the SCD1 and SCD2 writers share the commit protocol above (app
transactions, tombstones committed before the MERGE, re-planning after a lost race); it is
kept in one module so the exactly-once contract and every step that keeps it read together.
The planning itself lives in :mod:`warehouse_loader.scd1` and :mod:`warehouse_loader.scd2`.)
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import orjson
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError

from core.warehouse_config import TableConfig
from warehouse_loader.cdc_options import PlanOptions, prepare_changes
from warehouse_loader.changes import DELETE_OP, END_AT, OP, SEQ, START_AT, TRUNCATE_OP
from warehouse_loader.delta import kept_tables
from warehouse_loader.delta import merge_on_read as mor
from warehouse_loader.delta.scan import select_rows
from warehouse_loader.delta.table import DeltaVersion, open_delta, open_version, table_schema
from warehouse_loader.errors import CommitConflictError, WarehouseWriteError
from warehouse_loader.location import TableLocation, as_location, classify_storage_error
from warehouse_loader.scd1 import Scd1Actions, plan_scd1
from warehouse_loader.scd2 import Scd2Actions, scd2_window
from warehouse_loader.scd2_slices import plan_with_remembered, spanning_versions
from warehouse_loader.schema_evolution import reconcile
from warehouse_loader.sql_text import column_list, key_match, quote, sql_literal
from warehouse_loader.table_format import WriteResult

TOMBSTONES_DIR = "_hw_tombstones"
#: Attempts of one micro-batch when other writers keep winning the race for the next version.
COMMIT_ATTEMPTS = 5
#: Where a table is given: a location, or a local path.
Where = TableLocation | str | os.PathLike[str]
#: Commit metadata naming the key columns a table's rows are merged on (a JSON list).
KEY_METADATA = "headwater.key"


def write_batch(
    path: Where,
    changes: pa.Table,
    *,
    table: str,
    batch_id: int,
    keys: Sequence[str],
    config: TableConfig,
    reread_points: Sequence[str] = (),
    merge_on_read: bool = False,
) -> WriteResult:
    """Apply one micro-batch of changes to the warehouse table ``table`` stored at ``path``.

    ``changes`` follows :mod:`warehouse_loader.changes`; ``keys`` are the table's key
    columns (the feed's ``key`` or the source's replica identity); the table's AUTO CDC
    options apply first (:mod:`warehouse_loader.cdc_options`). A commit conflict with
    another writer re-plans the batch on the table's new version (up to :data:`COMMIT_ATTEMPTS`).
    ``reread_points``: where the input's schema changes that read the table again start (SCD2).
    ``merge_on_read``: a table (local or on S3) that outgrew 1 MiB gets the deletion vector feature, and
    from then on its MERGEs are merge-on-read (:mod:`warehouse_loader.delta.merge_on_read`).
    """
    changes, options = prepare_changes(changes, keys, config, reread_points=reread_points)
    if merge_on_read:
        location = as_location(path)
        existing = kept_tables.take(location)  # for the size check; the write takes it again (take_table)
        if existing is not None:
            mor.enable_when_large(location, existing)
        kept_tables.keep(location, existing)
    for attempt in range(1, COMMIT_ATTEMPTS + 1):
        try:
            if config.mode == "scd2":
                return write_scd2(path, changes, table=table, batch_id=batch_id, keys=keys, options=options)
            return write_scd1(
                path,
                changes,
                table=table,
                batch_id=batch_id,
                keys=keys,
                sequence_by=options.sequence_by,
                ignore_null_columns=options.ignore_null_columns,
            )
        except CommitConflictError:
            if attempt == COMMIT_ATTEMPTS:
                raise
            time.sleep(0.1 * attempt)
    raise AssertionError  # the loop returns or raises


def committed_batch(path: Where, table: str) -> int | None:
    """The highest batch id committed to the table at ``path``, or None (absent table, no batch)."""
    target = open_table(path)
    return None if target is None else _txn_version(target, table)


def open_table(path: Where) -> DeltaTable | None:
    """The Delta table at ``path``, or None when there is none (yet)."""
    return open_delta(as_location(path))


def take_table(path: TableLocation) -> DeltaTable | None:
    """The table at ``path`` for a write: the one this process kept from its last write there, or opened."""
    return kept_tables.take(path)


def _commit_failed(exc: Exception, where: TableLocation, table: str, batch_id: int) -> Exception | None:
    """The Headwater error for a failed commit: a conflict (retried), a storage problem, an I/O error.

    None: an error of another kind (delta-rs rejecting the data), raised as it is.
    """
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    # A table created by another writer between our look and our create lost the same race as a commit.
    if isinstance(exc, CommitFailedError) or (isinstance(exc, DeltaError) and "already exists" in first):
        return CommitConflictError(table, batch_id, first)
    if isinstance(exc, OSError):
        return classify_storage_error(exc, where) or WarehouseWriteError(table, batch_id, first)
    return None


def _txn_version(target: DeltaTable, app_id: str) -> int | None:
    version = target.transaction_version(app_id)
    return None if version is None else int(version)


def _already(target: DeltaTable | None, table: str, batch_id: int) -> bool:
    if target is None:
        return False
    done = _txn_version(target, table)
    return done is not None and done >= batch_id


def loaded_key(path: Where) -> tuple[str, ...] | None:
    """The key the table at ``path`` was last merged on (None: no table, or written before keys were recorded)."""
    target = open_table(path)
    history = target.history(1) if target is not None else []
    recorded = history[0].get(KEY_METADATA) if history else None
    return None if recorded is None else tuple(orjson.loads(recorded))


def recorded_key(path: Where, *, commits: int = 100) -> tuple[str, ...] | None:
    """The key recorded by the latest of the last ``commits`` commits that names one, or None.

    A commit made outside Headwater names none, so :func:`loaded_key` alone would miss it.
    """
    target = open_table(path)
    for commit in target.history(commits) if target is not None else []:
        if commit.get(KEY_METADATA) is not None:
            return tuple(orjson.loads(commit[KEY_METADATA]))
    return None


def _custom(batch_id: int, metadata: dict[str, str] | None, keys: Sequence[str] | None) -> dict[str, str]:
    custom = {"headwater.batch_id": str(batch_id), **(metadata or {})}
    if keys is not None:  # every commit of a warehouse table (not of its tombstones) names its key
        custom[KEY_METADATA] = orjson.dumps(list(keys)).decode()
    return custom


def _commit(
    table: str, batch_id: int, metadata: dict[str, str] | None = None, *, keys: Sequence[str] | None = None
) -> CommitProperties:
    custom = _custom(batch_id, metadata, keys)
    return CommitProperties(app_transactions=[Transaction(app_id=table, version=batch_id)], custom_metadata=custom)


def _merged_on_read(target: DeltaTable, table: str, batch_id: int, stats: dict[str, int]) -> WriteResult:
    target.update_incremental()
    return WriteResult(
        table=table,
        batch_id=batch_id,
        skipped=False,
        version=target.version(),
        inserted=stats["num_target_rows_inserted"],
        updated=stats["num_target_rows_updated"],
        deleted=stats["num_target_rows_deleted"],
    )


def _create(path: TableLocation, rows: pa.Table, table: str, batch_id: int, commit: CommitProperties) -> WriteResult:
    """Create the table at ``path`` holding ``rows``, in one commit."""
    write_deltalake(path.uri, rows, storage_options=path.storage_options, commit_properties=commit)
    created = open_delta(path)
    version = None if created is None else created.version()
    return WriteResult(table, batch_id, skipped=False, version=version, inserted=rows.num_rows)


def _metrics(
    table: str, batch_id: int, target: DeltaTable, before: int, stats: dict[str, Any], *, keys: Sequence[str]
) -> WriteResult:
    if target.version() == before:
        # delta-rs commits nothing for a MERGE that changes no row (a replayed or all-stale
        # batch); record the batch anyway, with an empty append carrying the app transaction.
        empty = table_schema(target).empty_table()
        write_deltalake(target, empty, mode="append", commit_properties=_commit(table, batch_id, keys=keys))
        target.update_incremental()
    return WriteResult(
        table=table,
        batch_id=batch_id,
        skipped=False,
        version=target.version(),
        inserted=int(stats.get("num_target_rows_inserted", 0)),
        updated=int(stats.get("num_target_rows_updated", 0)),
        deleted=int(stats.get("num_target_rows_deleted", 0)),
    )


# --------------------------------------------------------------------------- SCD type 1


def write_scd1(
    path: Where,
    changes: pa.Table,
    *,
    table: str,
    batch_id: int,
    keys: Sequence[str],
    sequence_by: str = SEQ,
    ignore_null_columns: Sequence[str] = (),
) -> WriteResult:
    """Apply one micro-batch to an SCD1 table: tombstones first, then one MERGE (see module doc).

    With ``ignore_null_columns`` the stored rows of the batch's keys are read to plan whole rows.
    """
    path = as_location(path)
    target = take_table(path)
    if _already(target, table, batch_id):
        kept_tables.keep(path, target)
        return WriteResult(table=table, batch_id=batch_id, skipped=True, version=target.version() if target else None)
    side_path = path / TOMBSTONES_DIR
    side = take_table(side_path)
    tombstones, watermark = _read_tombstones(side_path, side, changes, keys, sequence_by)
    existing = None
    if ignore_null_columns and target is not None:
        existing = select_rows(
            path,
            target,
            f"SELECT t.* FROM target t SEMI JOIN batch b ON {key_match(keys, 't', 'b')}",
            batch=changes.select(list(keys)),
        )
    actions = plan_scd1(
        changes,
        keys,
        tombstones=tombstones,
        truncated_through=watermark,
        sequence_by=sequence_by,
        ignore_null_columns=ignore_null_columns,
        existing=existing,
    )
    rows, adds = reconcile(table, None if target is None else table_schema(target), actions.rows)
    needs_side = actions.deletes.num_rows > 0 or actions.truncate_at is not None
    if tombstones is not None and tombstones.num_rows and actions.upserts.num_rows:
        needs_side = True
    try:
        if needs_side and not _already(side, table, batch_id):
            _write_tombstones(side_path, side, actions, keys=keys, table=table, batch_id=batch_id)
        result = _merge_scd1(path, target, rows, adds=adds, actions=actions, keys=keys, table=table, batch_id=batch_id)
    except (DeltaError, OSError) as exc:
        failure = _commit_failed(exc, path, table, batch_id)
        if failure is None:
            raise
        raise failure from exc
    kept_tables.keep(path, target)
    kept_tables.keep(side_path, side)
    return result


def _read_tombstones(
    side_path: TableLocation, side: DeltaTable | None, changes: pa.Table, keys: Sequence[str], sequence_by: str
) -> tuple[pa.Table | None, Any]:
    """Tombstones of the batch's keys and the truncate watermark (highest truncate applied)."""
    if side is None:
        return None, None
    seq = quote(sequence_by)
    batch_keys = changes.select(list(keys))
    tombs = select_rows(
        side_path,
        side,
        f"SELECT {column_list(keys, 't')}, t.{seq} FROM target t "
        f"WHERE t.{quote(OP)} = 'd' AND EXISTS (SELECT 1 FROM batch b WHERE {key_match(keys, 't', 'b')})",
        batch=batch_keys,
    )
    mark = select_rows(side_path, side, f"SELECT max({seq}) AS m FROM target WHERE {quote(OP)} = '{TRUNCATE_OP}'")
    return tombs, mark.column("m")[0].as_py()


def _write_tombstones(
    side_path: TableLocation,
    side: DeltaTable | None,
    actions: Scd1Actions,
    *,
    keys: Sequence[str],
    table: str,
    batch_id: int,
) -> None:
    seq = quote(actions.sequence_by)
    marks = actions.rows.select([*keys, actions.sequence_by, OP])
    if actions.truncate_at is not None:
        truncate_row = {name: [None] for name in keys} | {actions.sequence_by: [actions.truncate_at], OP: ["t"]}
        marks = pa.concat_tables([marks, pa.table(truncate_row, schema=marks.schema)])
    if side is None:
        first = marks.filter(pc.is_in(marks.column(OP), pa.array([DELETE_OP, TRUNCATE_OP])))
        write_deltalake(
            side_path.uri, first, storage_options=side_path.storage_options, commit_properties=_commit(table, batch_id)
        )
        return
    merge = side.merge(
        marks,
        key_match(keys, "t", "s"),
        source_alias="s",
        target_alias="t",
        commit_properties=_commit(table, batch_id),
    )
    merge = (
        merge.when_matched_update(
            {actions.sequence_by: f"s.{seq}"}, predicate=f"s.{quote(OP)} = 'd' AND s.{seq} > t.{seq}"
        )
        .when_matched_delete(predicate=f"s.{quote(OP)} <> 'd' AND s.{seq} > t.{seq}")
        .when_not_matched_insert_all(predicate=f"s.{quote(OP)} IN ('d', 't')")
    )
    if actions.truncate_at is not None:
        merge = merge.when_not_matched_by_source_delete(predicate=f"t.{seq} < {sql_literal(actions.truncate_at)}")
    merge.execute()


def _merge_scd1(
    path: TableLocation,
    target: DeltaTable | None,
    rows: pa.Table,
    *,
    adds: bool,
    actions: Scd1Actions,
    keys: Sequence[str],
    table: str,
    batch_id: int,
) -> WriteResult:
    op, seq = quote(OP), quote(actions.sequence_by)
    if target is None:
        upserts = rows.filter(pc.not_equal(rows.column(OP), DELETE_OP))
        return _create(path, upserts, table, batch_id, _commit(table, batch_id, keys=keys))
    newer = f"s.{seq} {'>=' if actions.rewrites else '>'} t.{seq}"
    later = f"s.{seq} > t.{seq}"
    if actions.sequence_by != SEQ and SEQ in rows.column_names:
        # Ties on a custom sequence go to the later change in the source's order (scd1.source_order).
        tie = f" OR (s.{seq} = t.{seq} AND s.{quote(SEQ)} > t.{quote(SEQ)})"
        newer, later = f"({newer}{tie})", f"({later}{tie})"
    if not adds and actions.truncate_at is None and mor.usable(path, target):
        stats = mor.merge(
            path,
            target,
            rows,
            keys=keys,
            also_on=None,
            drop_matched=f"(s.{op} <> 'd' AND {newer}) OR (s.{op} = 'd' AND {later})",
            insert_matched=f"s.{op} <> 'd' AND {newer}",
            insert_unmatched=f"s.{op} <> 'd'",
            app_id=table,
            version=batch_id,
            metadata=_custom(batch_id, None, keys),
        )
        return _merged_on_read(target, table, batch_id, stats)
    merge = target.merge(
        rows,
        key_match(keys, "t", "s"),
        source_alias="s",
        target_alias="t",
        merge_schema=adds,
        streamed_exec=False,
        commit_properties=_commit(table, batch_id, keys=keys),
    )
    merge = (
        merge.when_matched_update_all(predicate=f"s.{op} <> 'd' AND {newer}")
        .when_matched_delete(predicate=f"s.{op} = 'd' AND {later}")
        .when_not_matched_insert_all(predicate=f"s.{op} <> 'd'")
    )
    if actions.truncate_at is not None:
        merge = merge.when_not_matched_by_source_delete(predicate=f"t.{seq} < {sql_literal(actions.truncate_at)}")
    before = target.version()
    stats = merge.execute()
    return _metrics(table, batch_id, target, before, stats, keys=keys)


# --------------------------------------------------------------------------- SCD type 2


def write_scd2(
    path: Where,
    changes: pa.Table,
    *,
    table: str,
    batch_id: int,
    keys: Sequence[str],
    options: PlanOptions | None = None,
) -> WriteResult:
    """Apply one micro-batch to an SCD2 table: new tombstones first, then one MERGE on ``(keys, __START_AT)``."""
    options = options or PlanOptions()
    sequence_by = options.sequence_by
    path = as_location(path)
    target = take_table(path)
    if _already(target, table, batch_id):
        kept_tables.keep(path, target)
        return WriteResult(table=table, batch_id=batch_id, skipped=True, version=target.version() if target else None)
    existing = None
    spanning = None
    if target is not None:
        # Check types before planning: planning unifies the batch with existing versions.
        reconcile(table, table_schema(target), changes)
        spanning = spanning_versions(DeltaVersion(path, target), changes, keys, sequence_by)
    window = scd2_window(changes, keys, sequence_by, spanning)
    if target is not None:
        existing = select_rows(
            path,
            target,
            f"SELECT t.* FROM target t JOIN win w ON {key_match(keys, 't', 'w')} "
            f"WHERE t.{quote(END_AT)} IS NULL OR t.{quote(END_AT)} >= w.__min_seq",
            win=window,
        )
    actions = plan_with_remembered(
        open_version(path / TOMBSTONES_DIR), changes, keys, existing, window, options=options
    )
    result = commit_scd2(path, target, actions, keys=keys, table=table, batch_id=batch_id)
    kept_tables.keep(path, target)
    return result


def commit_scd2(
    path: Where,
    target: DeltaTable | None,
    actions: Scd2Actions,
    *,
    keys: Sequence[str],
    table: str,
    batch_id: int,
    metadata: dict[str, str] | None = None,
) -> WriteResult:
    """Commit planned SCD2 ``actions`` to the table at ``path``: new tombstones, then one table commit.

    The table commit (its creation, or one MERGE on ``(keys, __START_AT)``) is atomic:
    readers see all of ``actions`` or none. ``metadata`` joins the commit's custom metadata.
    """
    path = as_location(path)
    side_path = path / TOMBSTONES_DIR
    side = take_table(side_path)
    versions, adds = reconcile(table, None if target is None else table_schema(target), actions.versions)
    try:
        if (actions.tombstones.num_rows or actions.truncates) and not _already(side, table, batch_id):
            _append_scd2_tombstones(side_path, side, actions, keys=keys, table=table, batch_id=batch_id)
        result = _commit_versions(
            path, target, versions, actions, adds=adds, keys=keys, table=table, batch_id=batch_id, metadata=metadata
        )
    except (DeltaError, OSError) as exc:
        failure = _commit_failed(exc, path, table, batch_id)
        if failure is None:
            raise
        raise failure from exc
    kept_tables.keep(side_path, side)
    return result


def _commit_versions(
    path: TableLocation,
    target: DeltaTable | None,
    versions: pa.Table,
    actions: Scd2Actions,
    *,
    adds: bool,
    keys: Sequence[str],
    table: str,
    batch_id: int,
    metadata: dict[str, str] | None,
) -> WriteResult:
    """The table commit of :func:`commit_scd2`: its creation, or one MERGE on ``(keys, __START_AT)``."""
    if target is None:
        return _create(path, versions, table, batch_id, _commit(table, batch_id, metadata, keys=keys))
    # Removed versions ride in the same source with a null __hw_op (a real version always has one).
    removed = pa.Table.from_arrays(
        [
            actions.removed.column(f.name).cast(f.type)
            if f.name in actions.removed.column_names
            else pa.nulls(actions.removed.num_rows, f.type)
            for f in versions.schema
        ],
        schema=versions.schema,
    )
    source = pa.concat_tables([versions, removed])
    sa, op = quote(START_AT), quote(OP)
    if not adds and mor.usable(path, target):
        stats = mor.merge(
            path,
            target,
            source,
            keys=keys,
            also_on=f"t.{sa} = s.{sa}",
            drop_matched="TRUE",  # a removed version goes, a replaced one is written anew
            insert_matched=f"s.{op} IS NOT NULL",
            insert_unmatched=f"s.{op} IS NOT NULL",
            app_id=table,
            version=batch_id,
            metadata=_custom(batch_id, metadata, keys),
        )
        return _merged_on_read(target, table, batch_id, stats)
    merge = target.merge(
        source,
        f"{key_match(keys, 't', 's')} AND t.{sa} = s.{sa}",
        source_alias="s",
        target_alias="t",
        merge_schema=adds,
        streamed_exec=False,
        commit_properties=_commit(table, batch_id, metadata, keys=keys),
    )
    merge = (
        merge.when_matched_delete(predicate=f"s.{op} IS NULL")
        .when_matched_update_all(predicate=f"s.{op} IS NOT NULL")
        .when_not_matched_insert_all(predicate=f"s.{op} IS NOT NULL")
    )
    before = target.version()
    stats = merge.execute()
    return _metrics(table, batch_id, target, before, stats, keys=keys)


def _append_scd2_tombstones(
    side_path: TableLocation,
    side: DeltaTable | None,
    actions: Scd2Actions,
    *,
    keys: Sequence[str],
    table: str,
    batch_id: int,
) -> None:
    """Append the batch's new tombstones and truncates (the plan leaves out what is already remembered).

    Committed before the main MERGE with the same app transaction: after a crash in
    between, the replay skips this append and plans with these rows already remembered,
    which yields the same versions (remembered deletes are deduplicated with the batch's).
    """
    tombs = actions.tombstones
    marks = tombs.append_column(OP, pa.array([DELETE_OP] * tombs.num_rows, pa.string()))
    if actions.truncates:
        count = len(actions.truncates)
        truncate_rows = {name: pa.nulls(count, marks.schema.field(name).type) for name in keys}
        truncate_rows[actions.sequence_by] = pa.array(actions.truncates, marks.schema.field(actions.sequence_by).type)
        truncate_rows[OP] = pa.array([TRUNCATE_OP] * count, pa.string())
        marks = pa.concat_tables([marks, pa.table(truncate_rows, schema=marks.schema)])
    marks, _ = reconcile(table, None if side is None else table_schema(side), marks)
    write_deltalake(
        side_path.uri,
        marks,
        mode="append",
        storage_options=side_path.storage_options,
        commit_properties=_commit(table, batch_id),
    )
