"""SCD type 1 planning: a change batch against the table's tombstones and truncate watermark → one action per key.

Semantics (latest sequence wins, tombstones, truncates): :mod:`warehouse_loader.scd`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]  # no stubs
import pyarrow.compute as pc  # type: ignore[import-untyped]

from warehouse_loader.changes import DELETE_OP, INHERITED, OP, SEQ, TRUNCATE_OP, check_changes
from warehouse_loader.inheritance import authored, inherited_json
from warehouse_loader.scd import conform, duckdb_tables, merged_schema
from warehouse_loader.sql_text import column_list, key_match, quote


def _max_truncate(changes: pa.Table, sequence_by: str) -> Any:
    truncates = changes.filter(pc.equal(changes.column(OP), TRUNCATE_OP))
    if truncates.num_rows == 0:
        return None
    return pc.max(truncates.column(sequence_by)).as_py()


@dataclass(frozen=True, slots=True)
class Scd1State:
    """An SCD1 table as data: visible rows, tombstones (keys + sequence) and the truncate watermark."""

    rows: pa.Table
    tombstones: pa.Table
    truncated_through: Any = None


@dataclass(frozen=True, slots=True)
class Scd1Actions:
    """What one micro-batch does to an SCD1 table.

    ``rows`` holds at most one row per key (a MERGE source must), the latest change that
    is not already stale against the tombstones and watermark it was planned with. Rows
    with ``__hw_op = 'd'`` delete; the others upsert. Each applies only where it is newer
    than the target row (the MERGE checks that: the target is not read here).
    ``truncate_at``: remove every target row whose sequence is lower. ``rewrites``: the
    rows were planned against the stored rows (ignore-null updates), so one at the stored
    row's own sequence replaces it too (a late change filled a value the row inherited).
    """

    rows: pa.Table
    truncate_at: Any
    sequence_by: str = SEQ
    rewrites: bool = False

    @property
    def upserts(self) -> pa.Table:
        """Rows to insert or to update where newer."""
        return self.rows.filter(pc.not_equal(self.rows.column(OP), DELETE_OP))

    @property
    def deletes(self) -> pa.Table:
        """Rows whose key is deleted where the delete is newer."""
        return self.rows.filter(pc.equal(self.rows.column(OP), DELETE_OP))


def source_order(changes: pa.Table, sequence_by: str) -> str:
    """SQL ordering term that breaks ties on a custom ``sequence_by`` by the source's order (``__hw_seq``).

    A delete's image carries the row's last ``sequence_by`` value (under ``REPLICA IDENTITY
    FULL``), so it ties with the change before it; the source order says which came last.
    """
    if sequence_by == SEQ or SEQ not in changes.column_names:
        return ""
    return f"{quote(SEQ)} DESC NULLS LAST, "


def empty_tombstones(changes: pa.Table, keys: Sequence[str], sequence_by: str = SEQ) -> pa.Table:
    """A tombstone table with no rows, typed like ``changes``' keys and sequence."""
    return changes.select([*keys, sequence_by]).slice(0, 0)


def plan_scd1(
    changes: pa.Table,
    keys: Sequence[str],
    *,
    tombstones: pa.Table | None = None,
    truncated_through: Any = None,
    sequence_by: str = SEQ,
    ignore_null_columns: Sequence[str] = (),
    existing: pa.Table | None = None,
) -> Scd1Actions:
    """Reduce a change batch to one action per key for an SCD1 table.

    With ``ignore_null_columns`` (:mod:`warehouse_loader.inheritance`) the stored rows of the
    batch's keys (``existing``; a superset is fine) take part: each planned upsert is the
    whole row the key ends with, its nulls in those columns filled from the latest change
    that set them.

    ``tombstones`` (keys + sequence of deleted keys; a superset of the batch's keys is
    fine) and ``truncated_through`` (the highest truncate already applied) are the state a
    late change is checked against. A change is dropped when a tombstone for its key is
    newer, or when it is older than a truncate. A tombstone at the change's own sequence
    is that delete, recorded by an earlier attempt of this batch: it still applies.
    """
    check_changes(changes, keys, sequence_by)
    batch_truncate = _max_truncate(changes, sequence_by)
    cutoffs = [c for c in (batch_truncate, truncated_through) if c is not None]
    cutoff = max(cutoffs) if cutoffs else None
    # ``>=``: a replayed batch whose truncate was already recorded (crash between the
    # tombstone commit and the MERGE) must still truncate the main table; truncating
    # twice is harmless.
    newer = batch_truncate is not None and (truncated_through is None or batch_truncate >= truncated_through)
    truncate_at = batch_truncate if newer else None
    live = changes.filter(pc.not_equal(changes.column(OP), TRUNCATE_OP))
    if cutoff is not None:
        # Truncate removes rows with a *lower* sequence (Databricks: "truncated because of
        # the TRUNCATE operation at sequenceNum=3"); a change at the truncate's own
        # sequence cannot exist, as sequences are unique per event.
        floor = pa.scalar(cutoff, live.schema.field(sequence_by).type)
        live = live.filter(pc.greater_equal(live.column(sequence_by), floor))
    tomb = tombstones if tombstones is not None else empty_tombstones(changes, keys, sequence_by)
    seq = quote(sequence_by)
    key_list = column_list(keys)
    tie = source_order(live, sequence_by)
    sql = f"""
        WITH latest AS (
            SELECT * FROM live
            QUALIFY row_number() OVER (PARTITION BY {key_list} ORDER BY {seq} DESC, {tie}{quote(OP)} DESC) = 1
        )
        SELECT l.* FROM latest l
        WHERE NOT EXISTS (
            SELECT 1 FROM tomb t WHERE {key_match(keys, "t", "l")} AND t.{seq} > l.{seq}
        )
    """
    if ignore_null_columns:
        return _plan_inheriting(
            live,
            keys,
            tomb=tomb,
            existing=existing,
            cutoff=cutoff,
            truncate_at=truncate_at,
            sequence_by=sequence_by,
            ignored=ignore_null_columns,
        )
    with duckdb_tables(live=live, tomb=tomb.select([*keys, sequence_by])) as con:
        rows = con.sql(sql).to_arrow_table()
    return Scd1Actions(rows=conform(rows, live.schema), truncate_at=truncate_at, sequence_by=sequence_by)


def _plan_inheriting(
    live: pa.Table,
    keys: Sequence[str],
    *,
    tomb: pa.Table,
    existing: pa.Table | None,
    cutoff: Any,
    truncate_at: Any,
    sequence_by: str,
    ignored: Sequence[str],
) -> Scd1Actions:
    """:func:`plan_scd1` with ignore-null updates: the stored rows join the batch's changes as candidates."""
    seq_type = live.schema.field(sequence_by).type
    out_schema = pa.schema([*live.schema, pa.field(INHERITED, pa.string())])
    stored = out_schema.empty_table() if existing is None else existing
    remembered = INHERITED in stored.column_names
    stored = conform(stored, merged_schema(out_schema, stored.schema)).select(out_schema.names)
    seq, op, k = quote(sequence_by), quote(OP), column_list(keys)
    tie = source_order(live, sequence_by)
    floor = ""
    if cutoff is not None:
        floor = f"WHERE {seq} >= (SELECT v FROM floor)"  # rows a truncate removes are no candidates
    auth = ", ".join(
        f"{authored(c, 'e', f'e.{seq}', seq_type, remembered=remembered)} AS __a{i}" for i, c in enumerate(ignored)
    )
    candidate = "__a{i} IS NOT NULL AND (__lastdel IS NULL OR __a{i} > __lastdel)"
    picks = ", ".join(
        f"arg_max({quote(c)}, __a{i}) FILTER (WHERE {candidate.format(i=i)}) AS __v{i}, "
        f"max(__a{i}) FILTER (WHERE {candidate.format(i=i)}) AS __m{i}"
        for i, c in enumerate(ignored)
    )
    filled = ", ".join(
        f"CASE WHEN l.{op} = '{DELETE_OP}' THEN l.{quote(c)} ELSE g.__v{i} END AS {quote(c)}"
        for i, c in enumerate(ignored)
    )
    inherited = inherited_json(ignored, [f"g.__m{i}" for i in range(len(ignored))], f"l.{seq}")
    sql = f"""
        WITH ev AS (
            SELECT *, 0 AS __stored FROM live
            UNION ALL BY NAME
            SELECT *, 1 AS __stored FROM (
                SELECT s.* FROM stored s SEMI JOIN live b ON {key_match(keys, "s", "b")}
            ) {floor}
        ),
        fresh AS (
            SELECT e.* FROM ev e
            WHERE NOT EXISTS (SELECT 1 FROM tomb t WHERE {key_match(keys, "t", "e")} AND t.{seq} > e.{seq})
        ),
        dels AS (SELECT {k}, max({seq}) AS __lastdel FROM fresh WHERE {op} = '{DELETE_OP}' GROUP BY ALL),
        scored AS (
            SELECT e.*, {auth}, d.__lastdel FROM fresh e LEFT JOIN dels d ON {key_match(keys, "d", "e")}
        ),
        picked AS (SELECT {k}, {picks} FROM scored GROUP BY ALL),
        latest AS (
            SELECT * FROM scored
            QUALIFY row_number() OVER (PARTITION BY {k} ORDER BY {seq} DESC, {tie}__stored, {op} DESC) = 1
        )
        SELECT l.* REPLACE ({filled}, {inherited} AS {quote(INHERITED)})
        FROM latest l JOIN picked g ON {key_match(keys, "g", "l")}
    """
    floor_table = pa.table({"v": pa.array([cutoff], seq_type)})
    with duckdb_tables(live=live, stored=stored, tomb=tomb.select([*keys, sequence_by]), floor=floor_table) as con:
        rows = con.sql(sql).to_arrow_table()
    return Scd1Actions(rows=conform(rows, out_schema), truncate_at=truncate_at, sequence_by=sequence_by, rewrites=True)


def apply_scd1(state: Scd1State, actions: Scd1Actions, keys: Sequence[str]) -> Scd1State:
    """Apply ``actions`` to an in-memory SCD1 table: the twin of the Delta writer's MERGE."""
    seq = quote(actions.sequence_by)
    src = actions.rows
    target = state.rows
    schema = merged_schema(target.schema, src.schema)
    truncate_filter = ""
    if actions.truncate_at is not None:
        truncate_filter = f"AND t.{seq} >= (SELECT max(v) FROM trunc)"
    trunc = pa.table({"v": pa.array([actions.truncate_at], src.schema.field(actions.sequence_by).type)})
    newer = ">=" if actions.rewrites else ">"
    older = "<" if actions.rewrites else "<="
    rows_sql = f"""
        SELECT t.* FROM target t
        WHERE NOT EXISTS (
            SELECT 1 FROM src s WHERE {key_match(keys, "s", "t")} AND s.{seq} {newer} t.{seq}
        ) {truncate_filter}
        UNION ALL BY NAME
        SELECT s.* FROM src s
        WHERE s.{quote(OP)} <> '{DELETE_OP}'
          AND NOT EXISTS (SELECT 1 FROM target t WHERE {key_match(keys, "s", "t")} AND s.{seq} {older} t.{seq})
    """
    tomb_sql = f"""
        WITH merged AS (
            SELECT {column_list(keys)}, max({seq}) AS {seq} FROM (
                SELECT {column_list(keys)}, {seq} FROM tomb
                UNION ALL SELECT {column_list(keys)}, {seq} FROM src WHERE {quote(OP)} = '{DELETE_OP}'
            ) GROUP BY ALL
        )
        SELECT m.* FROM merged m
        WHERE NOT EXISTS (
            SELECT 1 FROM src s
            WHERE {key_match(keys, "s", "m")} AND s.{quote(OP)} <> '{DELETE_OP}' AND s.{seq} > m.{seq}
        ) {truncate_filter.replace("t.", "m.")}
    """
    with duckdb_tables(
        target=conform(target, schema), src=conform(src, schema), tomb=state.tombstones, trunc=trunc
    ) as con:
        rows = con.sql(rows_sql).to_arrow_table()
        tombs = con.sql(tomb_sql).to_arrow_table()
    watermark = state.truncated_through
    if actions.truncate_at is not None and (watermark is None or actions.truncate_at > watermark):
        watermark = actions.truncate_at
    return Scd1State(
        rows=conform(rows, schema),
        tombstones=conform(tombs, state.tombstones.schema),
        truncated_through=watermark,
    )
