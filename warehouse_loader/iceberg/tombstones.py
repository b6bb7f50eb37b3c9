"""The deletes and truncates an Iceberg SCD table remembers, in its side table.

Same rows and rules as the Delta layout's ``_hw_tombstones`` (:mod:`warehouse_loader.scd`):
``keys, sequence, __hw_op`` with ``d`` per deleted key, or null keys and ``t`` per truncate.

* SCD1: one row per deleted key holding its latest delete; a newer upsert of the key removes
  it, a truncate removes older ones (the rules of the Delta writer's tombstone MERGE,
  applied copy-on-write to the side table's affected files).
* SCD2: append-only.

A side commit carries the same marker ``(table, batch_id)`` as the main table's and is made
before it: after a crash in between, the replay skips the side commit and plans with those
rows already remembered, which yields the same result (:mod:`warehouse_loader.delta.writer`
states why for both modes).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]

from warehouse_loader.changes import DELETE_OP, OP, TRUNCATE_OP
from warehouse_loader.iceberg.commit import append_rows, commit_files, files_where, read_files, reading
from warehouse_loader.iceberg.scan import TableFiles
from warehouse_loader.iceberg.table_ref import IcebergTableRef
from warehouse_loader.scd1 import Scd1Actions
from warehouse_loader.scd2 import Scd2Actions
from warehouse_loader.sql_text import column_list, key_match, quote, sql_literal

if TYPE_CHECKING:
    from pyiceberg.table import Table


def read_scd1(
    side_ref: IcebergTableRef, side: Table | None, changes: pa.Table, keys: Sequence[str], sequence_by: str
) -> tuple[pa.Table | None, Any]:
    """Tombstones of the batch's keys and the truncate watermark (highest truncate applied)."""
    if side is None:
        return None, None
    seq = quote(sequence_by)
    files = TableFiles.of(side)
    with reading(side_ref, batch=changes.select(list(keys))) as con:
        files.register(con, "target")
        tombs = con.sql(
            f"SELECT {column_list(keys, 't')}, t.{seq} FROM target t "
            f"WHERE t.{quote(OP)} = '{DELETE_OP}' AND EXISTS (SELECT 1 FROM batch b WHERE {key_match(keys, 't', 'b')})"
        ).to_arrow_table()
        mark = con.sql(f"SELECT max({seq}) AS m FROM target WHERE {quote(OP)} = '{TRUNCATE_OP}'").to_arrow_table()
    return tombs, mark.column("m")[0].as_py()


def write_scd1(
    side_ref: IcebergTableRef, side: Table | None, actions: Scd1Actions, *, keys: Sequence[str], app: str, batch_id: int
) -> None:
    """Record the batch's deletes and truncate; drop tombstones a newer upsert or the truncate overrides."""
    seq, op = quote(actions.sequence_by), quote(OP)
    marks = actions.rows.select([*keys, actions.sequence_by, OP])
    if actions.truncate_at is not None:
        truncate_row = {name: [None] for name in keys} | {actions.sequence_by: [actions.truncate_at], OP: [TRUNCATE_OP]}
        marks = pa.concat_tables([marks, pa.table(truncate_row, schema=marks.schema)])
    if side is None:
        first = marks.filter(pc.is_in(marks.column(OP), pa.array([DELETE_OP, TRUNCATE_OP])))
        commit_files(side_ref, None, removed=(), rows=first, app=app, batch_id=batch_id, keys=None)
        return
    files = TableFiles.of(side)

    def older(alias: str) -> str:  # the row is older than the batch's truncate
        return "false" if actions.truncate_at is None else f"{alias}{seq} < {sql_literal(actions.truncate_at)}"

    where = f"EXISTS (SELECT 1 FROM marks s WHERE {key_match(keys, 't', 's')}) OR {older('t.')}"
    affected = files_where(side_ref, files, where, marks=marks)
    old = read_files(side_ref, files, affected)
    # The Delta tombstone MERGE's clauses, over the affected files only: a key the marks
    # name is in one of them when the side table has it, so "not matched" is table-wide.
    sql = f"""
        WITH m AS (
            SELECT t.*, s.{seq} AS __s_seq, s.{op} AS __s_op FROM old t LEFT JOIN marks s ON {key_match(keys, "t", "s")}
        )
        SELECT * EXCLUDE (__s_seq, __s_op) REPLACE (
            CASE WHEN __s_op = '{DELETE_OP}' AND __s_seq > {seq} THEN __s_seq ELSE {seq} END AS {seq}
        ) FROM m
        WHERE NOT (__s_op IS NOT NULL AND __s_op <> '{DELETE_OP}' AND __s_seq > {seq})
          AND NOT (__s_op IS NULL AND {older("")})
        UNION ALL BY NAME
        SELECT s.* FROM marks s
        WHERE s.{op} IN ('{DELETE_OP}', '{TRUNCATE_OP}')
          AND NOT EXISTS (SELECT 1 FROM old t WHERE {key_match(keys, "t", "s")})
    """
    with reading(side_ref, old=old, marks=marks) as con:
        rows = con.sql(sql).to_arrow_table()
    commit_files(side_ref, files, removed=affected, rows=rows, app=app, batch_id=batch_id, keys=None)


def read_scd2(
    side_ref: IcebergTableRef, window: pa.Table, keys: Sequence[str], sequence_by: str
) -> tuple[pa.Table | None, tuple[Any, ...]]:
    """Remembered deletes of the window's keys from their ``__min_seq`` on, and every remembered truncate."""
    side = side_ref.load()
    if side is None:
        return None, ()
    seq = quote(sequence_by)
    files = TableFiles.of(side)
    with reading(side_ref, win=window) as con:
        files.register(con, "target")
        tombs = con.sql(
            f"SELECT {column_list(keys, 't')}, t.{seq} FROM target t JOIN win w ON {key_match(keys, 't', 'w')} "
            f"WHERE t.{quote(OP)} = '{DELETE_OP}' AND t.{seq} >= w.__min_seq"
        ).to_arrow_table()
        truncs = con.sql(f"SELECT DISTINCT {seq} AS v FROM target WHERE {quote(OP)} = '{TRUNCATE_OP}'").to_arrow_table()
    return tombs, tuple(sorted(truncs.column("v").to_pylist()))


def append_scd2(
    side_ref: IcebergTableRef, side: Table | None, actions: Scd2Actions, *, keys: Sequence[str], app: str, batch_id: int
) -> None:
    """Append the batch's new tombstones and truncates (the plan leaves out what is already remembered)."""
    tombs = actions.tombstones
    marks = tombs.append_column(OP, pa.array([DELETE_OP] * tombs.num_rows, pa.string()))
    if actions.truncates:
        count = len(actions.truncates)
        truncate_rows = {name: pa.nulls(count, marks.schema.field(name).type) for name in keys}
        truncate_rows[actions.sequence_by] = pa.array(actions.truncates, marks.schema.field(actions.sequence_by).type)
        truncate_rows[OP] = pa.array([TRUNCATE_OP] * count, pa.string())
        marks = pa.concat_tables([marks, pa.table(truncate_rows, schema=marks.schema)])
    append_rows(side_ref, side, marks, app=app, batch_id=batch_id)
