"""SCD type 2 planning: a change batch against the affected versions, remembered deletes and truncates → versions.

Semantics (versions keyed by ``__START_AT``, late changes placed at their sequence,
tombstones, truncates): :mod:`warehouse_loader.scd`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]  # no stubs
import pyarrow.compute as pc  # type: ignore[import-untyped]

from warehouse_loader.changes import (
    COMMIT_TS,
    DELETE_OP,
    END_AT,
    INHERITED,
    METADATA_COLUMNS,
    OP,
    READ_OP,
    SEQ,
    START_AT,
    TRUNCATE_OP,
    check_changes,
)
from warehouse_loader.errors import ChangeBatchError
from warehouse_loader.inheritance import authored, inherited_json
from warehouse_loader.scd import conform, duckdb_tables, merged_schema
from warehouse_loader.sql_text import column_list, key_match, quote, sql_literal


@dataclass(frozen=True, slots=True)
class Scd2State:
    """An SCD2 table as data: its versions, the deletes it remembers and the truncates applied.

    ``tombstones`` (keys + sequence) holds every delete that closed no version when it was
    planned (it arrived before the key's older changes, or a late change left it behind
    another delete): the versions cannot show it, yet it bounds a version that a later,
    older change opens. ``truncates``: the sequences of every truncate applied.
    """

    rows: pa.Table
    tombstones: pa.Table
    truncates: tuple[Any, ...] = ()


@dataclass(frozen=True, slots=True)
class Scd2Actions:
    """What one micro-batch does to an SCD2 table, keyed by ``(keys, __START_AT)``.

    ``versions``: full version rows to insert, or to replace the row with the same key
    and ``__START_AT`` (a closing is a replaced row whose ``__END_AT`` is now set).
    ``removed``: keys + ``__START_AT`` of versions that no longer exist (a late change
    moved a boundary). ``tombstones``: keys + sequence of deletes to remember from now on
    (see :class:`Scd2State`); none is ever forgotten, a remembered delete that a later
    batch turns into a version's end is merely redundant. ``truncates``: the batch's
    truncate sequences not remembered yet. Versions a truncate closes are in
    ``versions`` like any other closing, for every key (not only the batch's).
    """

    versions: pa.Table
    removed: pa.Table
    tombstones: pa.Table
    truncates: tuple[Any, ...] = ()
    sequence_by: str = SEQ


def truncate_sequences(changes: pa.Table, sequence_by: str = SEQ) -> tuple[Any, ...]:
    """The distinct sequences of the batch's truncates, ascending."""
    values = changes.filter(pc.equal(changes.column(OP), TRUNCATE_OP)).column(sequence_by)
    return tuple(sorted(set(values.to_pylist())))


def scd2_window(
    changes: pa.Table, keys: Sequence[str], sequence_by: str = SEQ, existing: pa.Table | None = None
) -> pa.Table:
    """Keys whose versions a batch can change, each with the lowest sequence that touches it: ``keys + __min_seq``.

    Those are the batch's keys and, with ``existing``, every key with a version that spans
    a truncate of the batch (started before it, open or ended after it; the writer passes
    the rows matching :func:`scd2_truncate_span`). A version of such a key can change only
    if it is open or ends at or after ``__min_seq``: the writer loads exactly those rows
    as ``existing`` for :func:`plan_scd2`, and these keys' tombstones from ``__min_seq`` on.
    """
    check_changes(changes, keys, sequence_by)
    seq = quote(sequence_by)
    truncates = truncate_sequences(changes, sequence_by)
    live = changes.filter(pc.not_equal(changes.column(OP), TRUNCATE_OP))
    truncs = pa.table({sequence_by: pa.array(truncates, changes.schema.field(sequence_by).type)})
    lowest = "min(l." + seq + ")"
    if truncates:
        lowest = f"least(min(l.{seq}), (SELECT min({seq}) FROM truncs))"
    sql = f"SELECT {column_list(keys, 'l')}, {lowest} AS __min_seq FROM live l GROUP BY ALL"
    spans = existing is not None and bool(truncates) and existing.num_rows > 0
    if spans:
        sql = f"""
            SELECT {column_list(keys)}, min(__min_seq) AS __min_seq FROM (
                {sql}
                UNION ALL
                SELECT {column_list(keys, "o")}, (SELECT min({seq}) FROM truncs) FROM existing o
                WHERE {scd2_truncate_span(truncates, "o")}
            ) GROUP BY ALL
        """
    tables = {"live": live, "truncs": truncs} | ({"existing": existing} if spans else {})
    with duckdb_tables(**tables) as con:
        window = con.sql(sql).to_arrow_table()
    return window


def scd2_truncate_span(truncates: Sequence[Any], alias: str) -> str:
    """SQL predicate: the version ``alias`` spans one of ``truncates`` (which it must end at).

    Sequences are inlined as literals (strings or integers), so the predicate also serves
    as a filter on the Delta table in the writer.
    """
    if not truncates:
        return "false"
    sa, ea = f"{alias}.{quote(START_AT)}", f"{alias}.{quote(END_AT)}"
    return " OR ".join(f"({sa} < {sql_literal(v)} AND ({ea} IS NULL OR {ea} > {sql_literal(v)}))" for v in truncates)


def plan_scd2(
    changes: pa.Table,
    keys: Sequence[str],
    existing: pa.Table | None = None,
    *,
    tombstones: pa.Table | None = None,
    truncates: Sequence[Any] = (),
    track_history_columns: Sequence[str] | None = None,
    sequence_by: str = SEQ,
    track_history_except_columns: Sequence[str] | None = None,
    ignore_null_columns: Sequence[str] = (),
    reread_points: Sequence[Any] = (),
) -> Scd2Actions:
    """Recompute the versions of the affected keys from their existing versions, tombstones and the batch.

    ``existing``: the target's versions, at least those the writer selects with
    :func:`scd2_window` and :func:`scd2_truncate_span` (passing the whole table is fine;
    it is narrowed here). ``tombstones`` (keys + sequence, a superset is fine) and
    ``truncates`` are the remembered deletes and truncates (:class:`Scd2State`).

    Existing versions are turned back into events (an upsert at ``__START_AT``, another
    at the sequence of the last change folded into it, a delete at an ``__END_AT`` no
    version starts at), merged with the batch, the tombstones and a delete per key at
    each truncate, deduplicated on (key, sequence) and folded into versions again. So a
    remembered delete bounds the version a late older change opens, and a late event
    older than a truncate opens a version closed at it. A version that absorbed
    untracked-only changes (``track_history_columns``) stores only its latest values, so
    a batch that would split it (a late tracked change, delete or truncate at or before
    the last change it absorbed) is refused with :class:`ChangeBatchError`: the earlier
    part's values are unknown. In-order delivery and replays never split one.

    ``track_history_except_columns``: every value column but these is tracked.
    ``ignore_null_columns``: nulls in these columns inherit the key's earlier value
    (:mod:`warehouse_loader.inheritance`); each version records what it inherited.

    Re-reads (``op: r`` after the first version of a key, e.g. a table read again after a
    schema change): one that finds the key's values unchanged opens no version (it is folded
    into the current one); one that finds them changed, with the key's previous change before
    one of ``reread_points`` (where a schema change that read the table again starts) and at
    or after which the re-read lies, opens its version at that point: no change of the key
    came between, so its values have been these since the DDL.
    """
    check_changes(changes, keys, sequence_by)
    live = changes.filter(pc.not_equal(changes.column(OP), TRUNCATE_OP))
    batch_truncates = truncate_sequences(changes, sequence_by)
    remembered = set(truncates)
    all_truncates = tuple(sorted(remembered.union(batch_truncates)))
    seq_type = changes.schema.field(sequence_by).type
    fixed = {*keys, sequence_by, OP, START_AT, END_AT, INHERITED}
    change_values = [f for f in live.schema if f.name not in fixed]
    if existing is None:
        existing_schema = pa.schema(
            [
                *[changes.schema.field(k) for k in keys],
                *change_values,
                pa.field(sequence_by, seq_type),
                pa.field(OP, pa.string()),
                pa.field(START_AT, seq_type),
                pa.field(END_AT, seq_type),
            ]
        )
        existing = existing_schema.empty_table()
    tomb_schema = pa.schema([*[changes.schema.field(k) for k in keys], pa.field(sequence_by, seq_type)])
    tomb = tomb_schema.empty_table() if tombstones is None else tombstones.select([*keys, sequence_by])
    value_schema = merged_schema(
        pa.schema([f for f in existing.schema if f.name not in fixed]), pa.schema(change_values)
    )
    values = value_schema.names
    listed, option = track_history_columns, "track_history_columns"
    if track_history_except_columns is not None:
        listed, option = track_history_except_columns, "track_history_except_column_list"
    unknown = [c for c in listed or () if c not in values]
    if unknown:
        msg = f"{option} names {', '.join(unknown)}, not columns of the table or batch"
        raise ChangeBatchError(msg)
    if track_history_columns is not None:
        tracked = list(track_history_columns)
    else:
        tracked = [v for v in values if v not in METADATA_COLUMNS and v not in (track_history_except_columns or ())]
    ignored = list(ignore_null_columns)
    inherits = bool(ignored) or INHERITED in existing.column_names
    out_schema = pa.schema(
        [
            *[changes.schema.field(k) for k in keys],
            *[f for f in value_schema if f.name not in (OP, COMMIT_TS)],
            pa.field(sequence_by, seq_type),
            pa.field(OP, pa.string()),
            *([value_schema.field(COMMIT_TS)] if COMMIT_TS in values else []),
            *([pa.field(INHERITED, pa.string())] if inherits else []),
            pa.field(START_AT, seq_type),
            pa.field(END_AT, seq_type),
        ]
    )
    window = scd2_window(changes, keys, sequence_by, existing)
    k = column_list(keys)
    s = quote(sequence_by)
    op = quote(OP)
    sa, ea = quote(START_AT), quote(END_AT)
    ex_vals = ", ".join((f"o.{quote(v)}" if v in existing.column_names else f"NULL AS {quote(v)}") for v in values)
    ch_vals = ", ".join((f"c.{quote(v)}" if v in live.column_names else f"NULL AS {quote(v)}") for v in values)
    null_vals = ", ".join(f"NULL AS {quote(v)}" for v in values)
    lags = "".join(f", lag({quote(t)}) OVER w AS __p{i}" for i, t in enumerate(tracked))
    # Tracking every column: each change opens a version, even one that repeats the values,
    # so no change is folded away and a late change can always be placed exactly.
    differs = "true"
    if track_history_columns is not None or track_history_except_columns is not None:
        differs = " OR ".join(f"{quote(t)} IS DISTINCT FROM __p{i}" for i, t in enumerate(tracked)) or "false"
    out_names = out_schema.names
    compare = [n for n in out_names if n not in (*keys, START_AT) and n in existing.column_names]
    changed = " OR ".join(f"v.{quote(n)} IS DISTINCT FROM o.{quote(n)}" for n in compare) or "false"
    renamed = {START_AT: f"__start AS {sa}", END_AT: f"__next AS {ea}", sequence_by: f"__seq AS {s}"}
    renamed[OP] = f"__op AS {op}"
    renamed[INHERITED] = (
        f"{inherited_json(ignored, [f'__m{i}' for i in range(len(ignored))], '__seq')} AS {quote(INHERITED)}"
    )
    select_version = ", ".join(renamed.get(n, quote(n)) for n in out_names)
    has_inherited = INHERITED in existing.column_names
    a_live = "".join(
        f", {authored(c, 'c', f'c.{s}', seq_type, remembered=False)} AS __a{i}" for i, c in enumerate(ignored)
    )
    a_start = "".join(f", {authored(c, 'o', f'o.{sa}', seq_type, remembered=has_inherited)}" for c in ignored)
    a_last = "".join(f", {authored(c, 'o', f'o.{s}', seq_type, remembered=has_inherited)}" for c in ignored)
    a_none = ", NULL" * len(ignored)
    # A re-read (op r) compared with the key's event before it, on every value column.
    compared = [v for v in values if v not in (*METADATA_COLUMNS, INHERITED)]
    same_lags = "".join(f", lag({quote(v)}) OVER w AS __q{i}" for i, v in enumerate(compared))
    same = " AND ".join(f"{quote(v)} IS NOT DISTINCT FROM __q{i}" for i, v in enumerate(compared)) or "true"
    # A re-read says nothing of columns its rows lack (dropped from the source): it keeps the key's
    # earlier values there, so a dropped column alone opens no version.
    present = [(i, v) for i, v in enumerate(compared) if v in live.column_names]
    same_present = " AND ".join(f"{quote(v)} IS NOT DISTINCT FROM __q{i}" for i, v in present) or "true"
    carried = "".join(
        f", CASE WHEN __op = '{READ_OP}' AND __lag_op IS NOT NULL AND __lag_op <> '{DELETE_OP}' "
        f"THEN __q{i} ELSE {quote(v)} END AS {quote(v)}"
        for i, v in enumerate(compared)
        if v not in live.column_names
    )
    point = "NULL"
    if reread_points:
        point = f"(SELECT max(p.{s}) FROM points p WHERE p.{s} <= d.__seq)"
    lagged = f"""
        SELECT d.*, lag(__seq) OVER w AS __lag_seq, lag(__op) OVER w AS __lag_op{same_lags}, {point} AS __point
        FROM dedup d WINDOW w AS (PARTITION BY {k} ORDER BY __seq)
    """
    dropped = ", ".join(["__lag_seq", "__lag_op", "__same", "__point", *(f"__q{i}" for i in range(len(compared)))])
    placed = f"""(
        SELECT * EXCLUDE ({dropped}) REPLACE (
            CASE WHEN __op = '{READ_OP}' AND __lag_op IS NOT NULL AND __lag_op <> '{DELETE_OP}' AND NOT __same
                      AND __point IS NOT NULL AND __lag_seq < __point THEN __point ELSE __seq END AS __seq{carried})
        FROM (SELECT *, ({same_present}) AS __same FROM ({lagged}))
    )"""
    # Ignored-null columns take the value authored latest since the key's last delete.
    filled = placed
    if ignored:
        # A stored version's inherited value keeps the sequence it was authored at: a delete
        # that arrived later between the two ends its inheritance.
        candidate = "FILTER (WHERE __a{i} IS NOT NULL AND (__since IS NULL OR __a{i} > __since)) OVER seg"
        fills = ", ".join(
            f"arg_max({quote(c)}, __a{i}) {candidate.format(i=i)} AS {quote(c)}" for i, c in enumerate(ignored)
        )
        marks = "".join(f", max(__a{i}) {candidate.format(i=i)} AS __m{i}" for i in range(len(ignored)))
        filled = f"""(
            SELECT * REPLACE ({fills}) {marks} FROM (
                SELECT *, sum(CASE WHEN __op = '{DELETE_OP}' THEN 1 ELSE 0 END)
                    OVER (PARTITION BY {k} ORDER BY __seq ROWS UNBOUNDED PRECEDING) AS __seg,
                    max(CASE WHEN __op = '{DELETE_OP}' THEN __seq END)
                    OVER (PARTITION BY {k} ORDER BY __seq ROWS UNBOUNDED PRECEDING) AS __since
                FROM {placed}
            ) WINDOW seg AS (PARTITION BY {k}, __seg ORDER BY __seq ROWS UNBOUNDED PRECEDING)
        )"""
    # Ties on a custom sequence: the later change in the source's order wins (scd1.source_order).
    tie = f"{quote(SEQ)} DESC NULLS LAST, " if sequence_by != SEQ and SEQ in values else ""
    versions_sql = f"""
        WITH events AS (
            SELECT {column_list(keys, "c")}, {ch_vals}, c.{s} AS __seq, c.{op} AS __op, 0 AS __prio {a_live}
            FROM live c
            UNION ALL
            SELECT {column_list(keys, "o")}, {ex_vals}, o.{sa}, o.{op}, 1 {a_start} FROM old o
            UNION ALL
            SELECT {column_list(keys, "o")}, {ex_vals}, o.{s}, o.{op}, 1 {a_last} FROM old o WHERE o.{s} <> o.{sa}
            UNION ALL
            SELECT {column_list(keys, "d")}, {null_vals}, d.{s}, '{DELETE_OP}', 1 {a_none} FROM stored_deletes d
            UNION ALL
            SELECT {column_list(keys, "w")}, {null_vals}, t.{s}, '{DELETE_OP}', 2 {a_none} FROM win w
            JOIN truncs t ON t.{s} >= w.__min_seq
        ),
        dedup AS (
            SELECT * FROM events
            QUALIFY row_number() OVER (PARTITION BY {k}, __seq ORDER BY __prio, {tie}__op DESC) = 1
        ),
        ordered AS (
            SELECT *, lag(__op) OVER w AS __prev_op, lead(__seq) OVER w AS __next {lags} {same_lags}
            FROM {filled} WINDOW w AS (PARTITION BY {k} ORDER BY __seq)
        ),
        flagged AS (
            SELECT *, sum(CASE WHEN __op = '{DELETE_OP}' THEN 0
                               WHEN __op = '{READ_OP}' AND __prev_op IS NOT NULL
                                    AND __prev_op <> '{DELETE_OP}' AND ({same}) THEN 0
                               WHEN __prev_op IS NULL OR __prev_op = '{DELETE_OP}' OR ({differs}) THEN 1
                               ELSE 0 END) OVER (PARTITION BY {k} ORDER BY __seq ROWS UNBOUNDED PRECEDING) AS __vid
            FROM ordered
        ),
        ups AS (
            SELECT *, min(__seq) OVER (PARTITION BY {k}, __vid) AS __start FROM flagged WHERE __op <> '{DELETE_OP}'
            QUALIFY row_number() OVER (PARTITION BY {k}, __vid ORDER BY __seq DESC) = 1
        ),
        versions AS (SELECT {select_version} FROM ups)
        SELECT v.*, (o.{sa} IS NULL OR {changed}) AS __changed FROM versions v
        LEFT JOIN old o ON {key_match(keys, "v", "o")} AND v.{sa} = o.{sa}
    """
    # Deletes the stored state already holds: version ends no version starts at, and the
    # tombstones from __min_seq on.
    stored_deletes_sql = f"""
        SELECT {column_list(keys, "o")}, o.{ea} AS {s} FROM old o
        WHERE o.{ea} IS NOT NULL
          AND NOT EXISTS (SELECT 1 FROM old n WHERE {key_match(keys, "n", "o")} AND n.{sa} = o.{ea})
        UNION ALL
        SELECT {column_list(keys, "b")}, b.{s} FROM tomb b
        JOIN win w ON {key_match(keys, "w", "b")} AND b.{s} >= w.__min_seq
    """
    # A delete that ends no rebuilt version (it follows a delete, or nothing) is invisible in
    # the versions: remember it, unless a truncate's (truncates are remembered whole) or
    # already remembered. Cheaper than a second pass over the ordered events: deletes are few.
    tombstones_sql = f"""
        WITH deletes AS (
            SELECT DISTINCT * FROM (
                SELECT {column_list(keys, "c")}, c.{s} FROM live c WHERE c.{op} = '{DELETE_OP}'
                UNION ALL SELECT * FROM stored_deletes
            )
        )
        SELECT d.* FROM deletes d
        WHERE NOT EXISTS (SELECT 1 FROM rebuilt r WHERE {key_match(keys, "r", "d")} AND r.{ea} = d.{s})
          AND NOT EXISTS (SELECT 1 FROM truncs t WHERE t.{s} = d.{s})
          AND NOT EXISTS (SELECT 1 FROM tomb b WHERE {key_match(keys, "b", "d")} AND b.{s} = d.{s})
    """
    # A stored version that absorbed changes (its last change is after its start) keeps only
    # its latest values: a rebuilt boundary in (start, last change] would need the values
    # it held before the boundary, which nothing remembers.
    split_sql = f"""
        SELECT min(b.__at) FROM old o
        JOIN (SELECT {k}, {sa} AS __at FROM rebuilt UNION ALL SELECT {k}, {ea} FROM rebuilt) b
          ON {key_match(keys, "b", "o")} AND b.__at > o.{sa} AND b.__at <= o.{s}
        HAVING count(*) > 0
    """
    truncs = pa.table({sequence_by: pa.array(all_truncates, seq_type)})
    points = pa.table({sequence_by: pa.array(list(reread_points), seq_type)})
    with duckdb_tables(existing=existing, win=window, live=live, truncs=truncs, tomb=tomb, points=points) as con:
        con.execute(
            f"""CREATE TEMP TABLE old AS SELECT o.* FROM existing o JOIN win w ON {key_match(keys, "o", "w")}
                WHERE o.{ea} IS NULL OR o.{ea} >= w.__min_seq"""
        )
        con.execute(f"CREATE TEMP TABLE stored_deletes AS {stored_deletes_sql}")
        con.execute(f"CREATE TEMP TABLE rebuilt AS {versions_sql}")
        split = con.execute(split_sql).fetchall()
        if split:
            msg = (
                f"a change at {sequence_by} {split[0][0]} arrived after later untracked-only changes were folded "
                "into its version, whose values before it are no longer known; reload the table from the "
                "log in order, or track every column"
            )
            raise ChangeBatchError(msg)
        versions = con.sql("SELECT * EXCLUDE (__changed) FROM rebuilt WHERE __changed").to_arrow_table()
        removed = con.sql(
            f"""SELECT {column_list(keys, "o")}, o.{sa} FROM old o
                WHERE NOT EXISTS (SELECT 1 FROM rebuilt r WHERE {key_match(keys, "r", "o")} AND r.{sa} = o.{sa})"""
        ).to_arrow_table()
        new_tombstones = con.sql(tombstones_sql).to_arrow_table()
    removed_schema = pa.schema([*[changes.schema.field(kk) for kk in keys], pa.field(START_AT, seq_type)])
    return Scd2Actions(
        versions=conform(versions, out_schema),
        removed=conform(removed, removed_schema),
        tombstones=conform(new_tombstones, tomb_schema),
        truncates=tuple(v for v in batch_truncates if v not in remembered),
        sequence_by=sequence_by,
    )


def apply_scd2(state: Scd2State, actions: Scd2Actions, keys: Sequence[str]) -> Scd2State:
    """Apply ``actions`` to an in-memory SCD2 table: the twin of the Delta writer's tombstone append and MERGE."""
    sa = quote(START_AT)
    schema = merged_schema(state.rows.schema, actions.versions.schema)
    sql = f"""
        SELECT r.* FROM target r
        WHERE NOT EXISTS (SELECT 1 FROM versions v WHERE {key_match(keys, "v", "r")} AND v.{sa} = r.{sa})
          AND NOT EXISTS (SELECT 1 FROM removed d WHERE {key_match(keys, "d", "r")} AND d.{sa} = r.{sa})
        UNION ALL BY NAME
        SELECT * FROM versions
    """
    with duckdb_tables(
        target=conform(state.rows, schema), versions=conform(actions.versions, schema), removed=actions.removed
    ) as con:
        out = con.sql(sql).to_arrow_table()
    tombstones = pa.concat_tables([state.tombstones, conform(actions.tombstones, state.tombstones.schema)])
    return Scd2State(
        rows=conform(out, schema),
        tombstones=tombstones,
        truncates=tuple(sorted({*state.truncates, *actions.truncates})),
    )
