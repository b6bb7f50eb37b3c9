"""Apply planned SCD actions to Iceberg tables: one copy-on-write snapshot per micro-batch, exactly once.

The planning is the Delta path's (:mod:`warehouse_loader.scd1`, :mod:`warehouse_loader.scd2`,
:mod:`warehouse_loader.cdc_options`): the same change batch, the same tombstones and the same
planner give the same actions. What differs is how they are committed. Iceberg has no MERGE
here, so the writer does what a copy-on-write MERGE does:

1. find the data files holding a row the actions touch (a key of the batch, or for SCD2 a
   version ``(keys, __START_AT)`` replaced or removed; a truncate touches every file with an
   older row), reading only the key columns;
2. read those files and apply the actions to their rows in DuckDB, with the Delta writer's
   MERGE clauses (SCD1: :func:`merge_scd1`; SCD2: :func:`~warehouse_loader.scd2.apply_scd2`,
   the in-memory twin of its MERGE);
3. commit one snapshot that removes those files and adds the result
   (:func:`warehouse_loader.iceberg.commit.commit_files`), with the marker ``(table, batch_id)``.

Exactly once: a batch at or below the table's recorded batch is skipped before planning; the
deletes and truncates to remember are committed to the side table first, with the same
marker (:mod:`warehouse_loader.iceberg.tombstones`). A commit that loses the race to another
writer is planned again on the winner's snapshot (:data:`COMMIT_ATTEMPTS`).
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa  # type: ignore[import-untyped]

from core.warehouse_config import TableConfig
from warehouse_loader.cdc_options import PlanOptions, prepare_changes
from warehouse_loader.changes import DELETE_OP, END_AT, OP, SEQ, START_AT
from warehouse_loader.errors import CommitConflictError
from warehouse_loader.iceberg import tombstones
from warehouse_loader.iceberg.commit import already, commit_files, commit_row_delta, files_where, read_files, reading
from warehouse_loader.iceberg.scan import TableFiles
from warehouse_loader.iceberg.schema import check_batch, widen_rows
from warehouse_loader.iceberg.table_ref import IcebergTableRef
from warehouse_loader.scd import conform, duckdb_tables, merged_schema
from warehouse_loader.scd1 import Scd1Actions, plan_scd1
from warehouse_loader.scd2 import (
    Scd2Actions,
    Scd2State,
    apply_scd2,
    plan_scd2,
    scd2_truncate_span,
    scd2_window,
    truncate_sequences,
)
from warehouse_loader.sql_text import column_list, key_match, quote, sql_literal
from warehouse_loader.table_format import WriteResult

if TYPE_CHECKING:
    from pyiceberg.table import Table

#: Merge-on-read writes deletes while a batch changes at most this share of the touched files' rows.
MERGE_ON_READ_MAX_SHARE = 0.25
#: The columns naming a stored row's file and position (DuckDB's ``filename``, ``file_row_number``).
POSITION_COLUMNS = ("filename", "file_row_number")

#: Attempts of one micro-batch when other writers keep winning the race for the next snapshot
#: (each waits a random 0-100 ms times the attempt, so two writers stop colliding in step).
COMMIT_ATTEMPTS = 20


def write_batch(
    ref: IcebergTableRef,
    changes: pa.Table,
    *,
    table: str,
    batch_id: int,
    keys: Sequence[str],
    config: TableConfig,
    merge_on_read: bool = False,
    reread_points: Sequence[str] = (),
) -> WriteResult:
    """Apply one micro-batch of changes to the Iceberg table ``ref`` (the Delta writer's contract).

    ``merge_on_read`` applies to SCD1 tables (:func:`write_scd1`); SCD2 tables are copy-on-write.
    ``reread_points``: where the input's schema changes that read the table again start (SCD2).
    """
    changes, options = prepare_changes(changes, keys, config, reread_points=reread_points)
    for attempt in range(1, COMMIT_ATTEMPTS + 1):
        try:
            if config.mode == "scd2":
                return write_scd2(ref, changes, table=table, batch_id=batch_id, keys=keys, options=options)
            return write_scd1(
                ref,
                changes,
                table=table,
                batch_id=batch_id,
                keys=keys,
                sequence_by=options.sequence_by,
                ignore_null_columns=options.ignore_null_columns,
                merge_on_read=merge_on_read,
            )
        except CommitConflictError:
            if attempt == COMMIT_ATTEMPTS:
                raise
            time.sleep(random.uniform(0, 0.1) * attempt)
    raise AssertionError  # the loop returns or raises


def _version(table: Table | None) -> int | None:
    """The table's version: its current snapshot's sequence number (grows with every commit)."""
    current = None if table is None else table.current_snapshot()
    return None if current is None else int(current.sequence_number or 0)


def _live_files(table: Table) -> int | None:
    """Live data and delete files of ``table``'s current snapshot, from its summary (no manifest read)."""
    current = table.current_snapshot()
    totals = None if current is None or current.summary is None else current.summary.additional_properties
    if totals is None or "total-data-files" not in totals:
        return None
    return int(totals["total-data-files"]) + int(totals.get("total-delete-files", 0))


# --------------------------------------------------------------------------- SCD type 1


def write_scd1(
    ref: IcebergTableRef,
    changes: pa.Table,
    *,
    table: str,
    batch_id: int,
    keys: Sequence[str],
    sequence_by: str = SEQ,
    ignore_null_columns: Sequence[str] = (),
    merge_on_read: bool = False,
) -> WriteResult:
    """Apply one micro-batch to an SCD1 table: tombstones first, then one snapshot.

    Copy-on-write rewrites the files holding the batch's keys; ``merge_on_read`` writes the
    batch's rows and position deletes of the rows they replace (falling back to a rewrite for
    a truncate, or a batch that changes a large share of them).
    """
    target = ref.load()
    if already(target, table, batch_id):
        return WriteResult(table, batch_id, skipped=True, version=_version(target))
    side_ref = ref.tombstones
    side = side_ref.load()
    remembered, watermark = tombstones.read_scd1(side_ref, side, changes, keys, sequence_by)
    files = _files(target)
    existing = None
    if ignore_null_columns and files is not None:
        with reading(ref, batch=changes.select(list(keys))) as con:
            files.register(con, "target")
            existing = widen_rows(
                con.sql(f"SELECT t.* FROM target t SEMI JOIN batch b ON {key_match(keys, 't', 'b')}").to_arrow_table(),
                changes.schema,
            )
    actions = plan_scd1(
        changes,
        keys,
        tombstones=remembered,
        truncated_through=watermark,
        sequence_by=sequence_by,
        ignore_null_columns=ignore_null_columns,
        existing=existing,
    )
    check_batch(table, target, actions.rows)
    needs_side = actions.deletes.num_rows > 0 or actions.truncate_at is not None
    if remembered is not None and remembered.num_rows and actions.upserts.num_rows:
        needs_side = True
    if needs_side and not already(side, table, batch_id):
        tombstones.write_scd1(side_ref, side, actions, keys=keys, app=table, batch_id=batch_id)
    if files is None:
        upserts = actions.upserts
        created = commit_files(ref, None, removed=(), rows=upserts, app=table, batch_id=batch_id, keys=keys)
        return WriteResult(
            table, batch_id, False, _version(created), inserted=upserts.num_rows, files=_live_files(created)
        )
    if merge_on_read and actions.truncate_at is None:
        done = _merge_on_read_scd1(ref, files, actions, keys=keys, table=table, batch_id=batch_id)
        if done is not None:
            return done
    seq = quote(actions.sequence_by)
    older = "false" if actions.truncate_at is None else f"t.{seq} < {sql_literal(actions.truncate_at)}"
    src = actions.rows.select(list(keys))
    affected = files_where(
        ref, files, f"EXISTS (SELECT 1 FROM src s WHERE {key_match(keys, 't', 's')}) OR {older}", src=src
    )
    old = widen_rows(read_files(ref, files, affected), actions.rows.schema)
    merged = merge_scd1(old, actions, keys)
    rows = pa.concat_tables([merged.kept, merged.written])
    committed = commit_files(ref, files, removed=affected, rows=rows, app=table, batch_id=batch_id, keys=keys)
    return WriteResult(table, batch_id, False, _version(committed), *merged.counts, files=_live_files(committed))


def _merge_on_read_scd1(
    ref: IcebergTableRef, files: TableFiles, actions: Scd1Actions, *, keys: Sequence[str], table: str, batch_id: int
) -> WriteResult | None:
    """Commit ``actions`` as new rows plus position deletes of the rows they replace (None: rewrite instead).

    Only the stored rows of the batch's keys are read. When the batch changes more than
    :data:`MERGE_ON_READ_MAX_SHARE` of the rows of the files it touches, rewriting those files
    costs little more and leaves no deletes for readers to apply: None, and the caller rewrites.
    """
    # The stored rows are not rewritten: their keys and sequences decide, and where they are.
    names = files.table.schema().column_names
    decide = [*keys, actions.sequence_by, *([SEQ] if SEQ in names and actions.sequence_by != SEQ else [])]
    with reading(ref, src=actions.rows.select(list(keys))) as con:
        files.register(con, "target", filename=True, positions=True)
        old = con.sql(
            f"SELECT {column_list([*decide, *POSITION_COLUMNS], 't')} FROM target t "
            f"SEMI JOIN src s ON {key_match(keys, 't', 's')}"
        ).to_arrow_table()
    old = widen_rows(old, actions.rows.schema)
    merged = merge_scd1(old, actions, keys)
    gone = old.select(list(POSITION_COLUMNS))
    if merged.kept.num_rows:
        kept = merged.kept.select(list(POSITION_COLUMNS))
        with duckdb_tables(gone=gone, kept=kept) as con:
            gone = con.sql("SELECT * FROM gone ANTI JOIN kept USING (filename, file_row_number)").to_arrow_table()
    touched = {files.path_of(name) for name in gone.column("filename").unique().to_pylist()}
    stored = sum(files.files[path].record_count for path in touched)
    if gone.num_rows > MERGE_ON_READ_MAX_SHARE * stored:
        return None
    positions = pa.table(
        {
            "file_path": pa.array([files.path_of(n) for n in gone.column("filename").to_pylist()], pa.string()),
            "pos": gone.column("file_row_number").cast(pa.int64()),
        }
    )
    committed = commit_row_delta(
        ref, files, rows=merged.written, positions=positions, app=table, batch_id=batch_id, keys=keys
    )
    return WriteResult(table, batch_id, False, _version(committed), *merged.counts, files=_live_files(committed))


@dataclass(frozen=True, slots=True)
class Scd1Merge:
    """The Delta writer's SCD1 MERGE applied to stored rows: the rows kept as they are and the rows written."""

    kept: pa.Table
    written: pa.Table
    inserted: int
    updated: int
    deleted: int

    @property
    def counts(self) -> tuple[int, int, int]:
        """Inserted, updated, deleted."""
        return self.inserted, self.updated, self.deleted


def merge_scd1(old: pa.Table, actions: Scd1Actions, keys: Sequence[str]) -> Scd1Merge:
    """The rows of ``old`` (stored rows) after the Delta writer's SCD1 MERGE of ``actions``.

    Clauses on a key match: an upsert replaces the row where newer (``>=`` when the rows were
    planned against the stored ones), a delete removes it where later; an unmatched upsert is
    inserted; a truncate removes every unmatched row older than it. On a custom sequence a
    tie goes to the later change in the source's order, as in the MERGE.
    """
    seq, op = quote(actions.sequence_by), quote(OP)
    newer = f"s.{seq} {'>=' if actions.rewrites else '>'} t.{seq}"
    later = f"s.{seq} > t.{seq}"
    if actions.sequence_by != SEQ and SEQ in actions.rows.column_names and SEQ in old.column_names:
        tie = f" OR (s.{seq} = t.{seq} AND s.{quote(SEQ)} > t.{quote(SEQ)})"
        newer, later = f"({newer}{tie})", f"({later}{tie})"
    older = "false" if actions.truncate_at is None else f"t.{seq} < {sql_literal(actions.truncate_at)}"
    updates = f"s.{op} <> '{DELETE_OP}' AND {newer}"
    deletes = f"s.{op} = '{DELETE_OP}' AND {later}"
    stored = [*keys, actions.sequence_by, *([SEQ] if SEQ in old.column_names and actions.sequence_by != SEQ else [])]
    schema = merged_schema(old.schema, actions.rows.schema)
    assert not any(c in actions.rows.column_names for c in POSITION_COLUMNS)
    # Each change's fate against the stored row of its key (one join), then the stored rows'
    # (one more): 'u' replaces the row, 'd' removes it, 'n' leaves it, 'i' has no stored row.
    fate = f"""
        SELECT s.*, CASE WHEN t.{quote(keys[0])} IS NULL THEN 'i' WHEN {updates} THEN 'u'
                         WHEN {deletes} THEN 'd' ELSE 'n' END AS __fate
        FROM src s LEFT JOIN (SELECT {column_list(stored)} FROM old) t ON {key_match(keys, "s", "t")}
    """
    kept = f"""
        SELECT t.* FROM old t LEFT JOIN (SELECT {column_list(keys)}, __fate FROM m) x ON {key_match(keys, "x", "t")}
        WHERE (x.__fate IS NULL OR x.__fate = 'n') AND (x.__fate IS NOT NULL OR NOT ({older}))
    """
    written = f"SELECT * EXCLUDE (__fate) FROM m WHERE __fate = 'u' OR (__fate = 'i' AND {op} <> '{DELETE_OP}')"
    with duckdb_tables(old=conform(old, schema), src=conform(actions.rows, schema)) as con:
        con.execute(f"CREATE TEMP TABLE m AS {fate}")
        kept_rows = con.sql(kept).to_arrow_table()
        new_rows = con.sql(written).to_arrow_table()
        counted = dict(con.execute("SELECT __fate, count(*) FROM m GROUP BY ALL").fetchall())
        inserts = con.execute(f"SELECT count(*) FROM m WHERE __fate = 'i' AND {op} <> '{DELETE_OP}'").fetchone()
    assert inserts is not None
    updated = int(counted.get("u", 0))
    return Scd1Merge(
        conform(kept_rows, schema),
        conform(new_rows, schema).drop_columns([c for c in POSITION_COLUMNS if c in schema.names]),
        int(inserts[0]),
        updated,
        old.num_rows - kept_rows.num_rows - updated,
    )


def _files(target: Table | None) -> TableFiles | None:
    return None if target is None else TableFiles.of(target)


# --------------------------------------------------------------------------- SCD type 2


def write_scd2(
    ref: IcebergTableRef,
    changes: pa.Table,
    *,
    table: str,
    batch_id: int,
    keys: Sequence[str],
    options: PlanOptions | None = None,
) -> WriteResult:
    """Apply one micro-batch to an SCD2 table: new tombstones first, then one copy-on-write snapshot."""
    options = options or PlanOptions()
    sequence_by = options.sequence_by
    target = ref.load()
    if already(target, table, batch_id):
        return WriteResult(table, batch_id, skipped=True, version=_version(target))
    files = _files(target)
    existing = None
    spanning = None
    if files is not None:
        check_batch(table, target, changes)  # before planning: planning unifies the batch with existing versions
        spanning = _spanning(ref, files, changes, keys, sequence_by)
    window = scd2_window(changes, keys, sequence_by, spanning)
    if files is not None:
        with reading(ref, win=window) as con:
            files.register(con, "target")
            existing = widen_rows(
                con.sql(
                    f"SELECT t.* FROM target t JOIN win w ON {key_match(keys, 't', 'w')} "
                    f"WHERE t.{quote(END_AT)} IS NULL OR t.{quote(END_AT)} >= w.__min_seq"
                ).to_arrow_table(),
                changes.schema,
            )
    remembered, truncates = tombstones.read_scd2(ref.tombstones, window, keys, sequence_by)
    actions = plan_scd2(
        changes,
        keys,
        existing,
        tombstones=remembered,
        truncates=truncates,
        track_history_columns=options.track_history_columns,
        sequence_by=sequence_by,
        track_history_except_columns=options.track_history_except_columns,
        ignore_null_columns=options.ignore_null_columns,
        reread_points=options.reread_points,
    )
    return commit_scd2(ref, files, actions, keys=keys, table=table, batch_id=batch_id)


def _spanning(
    ref: IcebergTableRef, files: TableFiles, changes: pa.Table, keys: Sequence[str], sequence_by: str
) -> pa.Table | None:
    """Keys, ``__START_AT`` and ``__END_AT`` of the versions spanning a truncate of ``changes`` (None: no truncate)."""
    truncates = truncate_sequences(changes, sequence_by)
    if not truncates:
        return None
    with reading(ref) as con:
        files.register(con, "target")
        return con.sql(
            f"SELECT {column_list(keys, 't')}, t.{quote(START_AT)}, t.{quote(END_AT)} "
            f"FROM target t WHERE {scd2_truncate_span(truncates, 't')}"
        ).to_arrow_table()


def commit_scd2(
    ref: IcebergTableRef,
    files: TableFiles | None,
    actions: Scd2Actions,
    *,
    keys: Sequence[str],
    table: str,
    batch_id: int,
    metadata: Mapping[str, str] | None = None,
) -> WriteResult:
    """Commit planned SCD2 ``actions``: new tombstones, then one snapshot replacing the versions' files.

    ``metadata`` joins the snapshot's summary (a backfill names its days there).
    """
    side_ref = ref.tombstones
    if actions.tombstones.num_rows or actions.truncates:
        side = side_ref.load()
        if not already(side, table, batch_id):
            tombstones.append_scd2(side_ref, side, actions, keys=keys, app=table, batch_id=batch_id)
    if files is None:
        created = commit_files(
            ref, None, removed=(), rows=actions.versions, app=table, batch_id=batch_id, keys=keys, metadata=metadata
        )
        return WriteResult(
            table,
            batch_id,
            False,
            _version(created),
            inserted=actions.versions.num_rows,
            files=_live_files(created),
        )
    sa = quote(START_AT)
    touched = pa.concat_tables(
        [
            actions.versions.select([*keys, START_AT]),
            conform(actions.removed, actions.versions.select([*keys, START_AT]).schema),
        ]
    )
    affected = files_where(
        ref,
        files,
        f"EXISTS (SELECT 1 FROM touched v WHERE {key_match(keys, 't', 'v')} AND t.{sa} = v.{sa})",
        touched=touched,
    )
    old = widen_rows(read_files(ref, files, affected), actions.versions.schema)
    after = apply_scd2(Scd2State(old, actions.tombstones.slice(0, 0)), actions, keys).rows
    committed = commit_files(
        ref, files, removed=affected, rows=after, app=table, batch_id=batch_id, keys=keys, metadata=metadata
    )
    replaced = _count_matches(old, actions.versions, keys)
    return WriteResult(
        table,
        batch_id,
        False,
        _version(committed),
        inserted=actions.versions.num_rows - replaced,
        updated=replaced,
        deleted=actions.removed.num_rows,
        files=_live_files(committed),
    )


def _count_matches(old: pa.Table, versions: pa.Table, keys: Sequence[str]) -> int:
    sa = quote(START_AT)
    with duckdb_tables(old=old.select([*keys, START_AT]), v=versions.select([*keys, START_AT])) as con:
        found = con.execute(
            f"SELECT count(*) FROM v JOIN old o ON {key_match(keys, 'v', 'o')} AND v.{sa} = o.{sa}"
        ).fetchone()
    return 0 if found is None else int(found[0])
