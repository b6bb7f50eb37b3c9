"""Rebuild whole days of an SCD2 table from the log (a daily backfill), leaving other days alone.

A day is a UTC calendar date of ``__hw_commit_ts``. For the chosen days:

1. **Read.** Per partition of the table's topic, the log's time index gives the offset
   range: ``offset_for_time(first day's start)`` to ``offset_for_time(last day's end +
   LOG_TIME_SLACK_MS)``. Capture stamps records with their append time, which is at or
   after the commit time, so the range holds every change committed in the days as long
   as capture appended it within the slack; the changes are then filtered on their
   commit time. With a Spark session the range is a batch read of ``headwater_log``
   (``startingOffsets``/``endingOffsets``) and :func:`warehouse_loader.changes_frame.change_batch`,
   typed exactly like the streaming load; without one the records are decoded on the
   driver (:func:`warehouse_loader.changes.changes_from_events`, small ranges and tests).
2. **Plan.** The versions of every key the days touch are read and, in memory, the
   days' versions (``__hw_commit_ts`` on a chosen day) are removed and the version
   before each of them reopened (``__END_AT`` null). The changes are then planned
   against that state with the normal SCD2 planner (:func:`warehouse_loader.scd2.plan_scd2`,
   remembered tombstones included), which places every change at its sequence position:
   the reopened version is closed again by the day's first change, and the day's last
   version is closed by the next surviving version or delete. A removed version's
   ``__END_AT`` that no surviving version starts at and no rebuilt change carries (a
   delete on a day not rebuilt) is planned as that delete, so it is not lost.
3. **Commit once.** The affected keys' final versions replace their existing ones in
   one commit (:meth:`warehouse_loader.table_format.TableFormat.commit_scd2`): a concurrent reader
   sees the table before or after the backfill, never the days emptied.

Snapshot rows: capture stamps ``op: r`` rows with the time they were read (as Debezium
does), so they belong to the snapshot's day and a backfill of every day rebuilds them
too. Rows of logs written before that (commit time 0, 1970-01-01) lie outside every
daily partition: a backfill neither removes nor rebuilds them.

Limits: the backfill assumes no other writer works on the table meanwhile (the
streaming load included): one writer per table, as for the load. Days must lie inside
what the log still holds in full (``clean_offset``); earlier ones are refused. The
affected keys' whole histories are read into memory to plan.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import duckdb
import orjson
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]

from core.config import ProjectConfig
from core.errors import PermanentError
from core.table_leases import committing, reading
from core.warehouse_config import TableConfig
from log.base import Log
from log.envelope import ChangeEvent, decode_value
from log.history import require_full_history
from log.reading import read_range
from log.schema_history import SchemaHistory
from log.table_schemas import read_schema_records
from warehouse_loader.cdc_options import PlanOptions, prepare_changes
from warehouse_loader.changes import (
    COMMIT_TS,
    COMMIT_TS_TYPE,
    DELETE_OP,
    END_AT,
    INHERITED,
    OP,
    SEQ,
    START_AT,
    changes_from_events,
)
from warehouse_loader.errors import WarehouseError
from warehouse_loader.formats import format_of
from warehouse_loader.load_job import load_identity, table_keys, table_path
from warehouse_loader.location import TableLocation
from warehouse_loader.scd2 import Scd2Actions, Scd2State, apply_scd2, scd2_window
from warehouse_loader.scd2_slices import plan_with_remembered, spanning_versions
from warehouse_loader.schema_evolution import renamed_columns
from warehouse_loader.sql_text import column_list, key_match, quote
from warehouse_loader.table_format import StoredTable, TableFormat, WriteResult

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: How long after its commit a change may reach the log and still be found by its day's backfill.
LOG_TIME_SLACK_MS = 3600 * 1000
_DAY = dt.timedelta(days=1)


class BackfillError(WarehouseError, PermanentError):
    """A backfill that cannot run as asked (wrong table mode, days the log no longer holds)."""


@dataclass(frozen=True, slots=True)
class BackfillResult:
    """What :func:`rebuild_days` did: versions removed and written, changes read."""

    table: str
    days: tuple[dt.date, ...]
    changes: int
    removed: int
    write: WriteResult | None


def _day_bounds(day: dt.date) -> tuple[dt.datetime, dt.datetime]:
    start = dt.datetime.combine(day, dt.time(), tzinfo=dt.UTC)
    return start, start + _DAY


def _ms(moment: dt.datetime) -> int:
    return int(moment.timestamp() * 1000)


def offset_ranges(log: Log, topic: str, days: Sequence[dt.date]) -> dict[int, tuple[int, int]]:
    """Per partition (every one, an empty range where nothing applies), the offsets ``[start, end)``.

    The ranges hold every change committed in ``days`` (appended within the slack).
    """
    low, _ = _day_bounds(min(days))
    _, high = _day_bounds(max(days))
    ranges: dict[int, tuple[int, int]] = {}
    for partition in range(log.describe_topic(topic).partitions):
        end_of_log = log.end_offset(topic, partition)
        start = log.offset_for_time(topic, partition, _ms(low))
        if start is None:  # nothing appended since the first day began
            ranges[partition] = (end_of_log, end_of_log)
            continue
        end = log.offset_for_time(topic, partition, _ms(high) + LOG_TIME_SLACK_MS)
        end = end_of_log if end is None else end
        ranges[partition] = (start, max(start, end))
    require_full_history(
        log,
        topic,
        {partition: start for partition, (start, _) in ranges.items()},
        what=f"a backfill from {min(days)}",
        remedy="backfill later days, or rebuild the table with 'headwater reprocess' (--accept-incomplete-history)",
    )
    return ranges


def _changes_on_driver(
    log: Log, topic: str, ranges: dict[int, tuple[int, int]], keys: Sequence[str], schema: pa.Schema | None
) -> pa.Table:
    events: list[ChangeEvent] = []
    for partition, (start, end) in sorted(ranges.items()):
        for records in read_range(log, topic, partition, start, end):
            events.extend(decode_value(r.value) for r in records if r.value is not None)
    return changes_from_events(events, keys, schema)


def _changes_with_spark(
    spark: SparkSession, config: ProjectConfig, topic: str, ranges: dict[int, tuple[int, int]], keys: Sequence[str]
) -> pa.Table:
    # pyspark only where a Spark session reads the range (the driver path and its tests need none).
    from spark_log.data_source import log_reader
    from warehouse_loader.changes_frame import change_batch

    # Every partition named: one the options leave out would be read from earliest to latest.
    starting = {topic: {str(p): start for p, (start, _) in ranges.items()}}
    ending = {topic: {str(p): end for p, (_, end) in ranges.items()}}
    rows = (
        log_reader(spark, config, topic)
        .option("startingOffsets", orjson.dumps(starting).decode())
        .option("endingOffsets", orjson.dumps(ending).decode())
        .load()
    )
    return change_batch(rows, keys)


def _in_days(column: pa.ChunkedArray, days: Iterable[dt.date]) -> pa.ChunkedArray:
    mask = None
    for day in days:
        start, end = _day_bounds(day)
        inside = pc.and_(
            pc.greater_equal(column, pa.scalar(start, COMMIT_TS_TYPE)),
            pc.less(column, pa.scalar(end, COMMIT_TS_TYPE)),
        )
        mask = inside if mask is None else pc.or_(mask, inside)
    return pc.fill_null(mask, False)


def _days_predicate(days: Sequence[dt.date], alias: str) -> str:
    """SQL: the version ``alias`` was committed on one of ``days`` (false for a null commit time)."""
    column = f"{alias}.{quote(COMMIT_TS)}"
    parts = []
    for day in days:
        start, end = _day_bounds(day)
        parts.append(
            f"({column} >= '{start.isoformat()}'::timestamptz AND {column} < '{end.isoformat()}'::timestamptz)"
        )
    return "coalesce(" + " OR ".join(parts) + ", false)"


@dataclass(frozen=True, slots=True)
class _Rebuild:
    """The planned backfill: what one commit does to the table, and how many day versions it removes."""

    actions: Scd2Actions
    removed: int


def _plan_rebuild(
    fmt: TableFormat,
    path: TableLocation,
    target: StoredTable,
    *,
    days: Sequence[dt.date],
    keys: Sequence[str],
    changes: pa.Table,
    options: PlanOptions,
) -> _Rebuild:
    """Plan the whole rebuild of ``days`` in memory, as the final versions of every key it touches.

    Clearing (the days' versions removed, the version before each reopened) and rebuilding
    (``changes`` placed at their sequence positions) are applied to the affected keys'
    versions here, so the table sees one commit: readers never see the days cleared.
    """
    sequence_by = options.sequence_by
    k = column_list(keys, "t")
    sa, ea, seq = quote(START_AT), quote(END_AT), quote(sequence_by)
    on = partial(key_match, keys)
    in_days = partial(_days_predicate, days)
    removed = target.select(f"SELECT {k}, t.{sa} FROM target t WHERE {in_days('t')}")
    spanning = spanning_versions(target, changes, keys, sequence_by)
    window = scd2_window(changes, keys, sequence_by, spanning)
    key_list = column_list(keys)
    existing = target.select(
        f"WITH affected AS (SELECT DISTINCT {key_list} FROM (SELECT {key_list} FROM win UNION ALL "
        f"SELECT {key_list} FROM removed)) SELECT t.* FROM target t SEMI JOIN affected a ON {on('t', 'a')}",
        win=window.select(list(keys)),
        removed=removed.select(list(keys)),
    )
    # The days' versions go; the version each of them followed is open again until the
    # rebuilt changes (or a surviving later version) close it.
    reopened = (
        f"SELECT t.* REPLACE (CASE WHEN EXISTS (SELECT 1 FROM existing r WHERE {on('r', 't')} "
        f"AND r.{sa} = t.{ea} AND {in_days('r')}) THEN NULL ELSE t.{ea} END AS {ea}) "
        f"FROM existing t WHERE NOT {in_days('t')}"
    )
    # A removed version's end that no surviving version starts at and no rebuilt change
    # carries is a delete on a day not rebuilt: hand it back as that delete, or it is lost.
    lost = (
        f"SELECT {column_list(keys, 'r')}, r.{ea} AS {seq} FROM existing r "
        f"WHERE {in_days('r')} AND r.{ea} IS NOT NULL "
        f"AND NOT EXISTS (SELECT 1 FROM existing t WHERE {on('t', 'r')} AND t.{sa} = r.{ea} AND NOT {in_days('t')}) "
        f"AND NOT EXISTS (SELECT 1 FROM changes c WHERE {on('c', 'r')} AND c.{seq} = r.{ea})"
    )
    with duckdb.connect(":memory:") as con:
        con.execute("SET TimeZone = 'UTC'")
        con.register("existing", existing)
        con.register("changes", changes.select([*keys, sequence_by]))
        cleared = con.sql(reopened).to_arrow_table()
        deletes = _as_deletes(con.sql(lost).to_arrow_table(), changes.schema, keys, sequence_by)
    if deletes.num_rows:
        changes = pa.concat_tables([changes, deletes])
        window = scd2_window(changes, keys, sequence_by, spanning)
    actions = plan_with_remembered(fmt.tombstones(path), changes, keys, cleared, window, options=options)
    # Only the versions are wanted here: the tombstones and truncates go to the commit as planned.
    final = apply_scd2(Scd2State(cleared, actions.tombstones.schema.empty_table()), actions, keys).rows
    with duckdb.connect(":memory:") as con:
        con.register("existing", existing)
        con.register("final", final)
        gone = con.sql(
            f"SELECT {k}, t.{sa} FROM existing t WHERE NOT EXISTS "
            f"(SELECT 1 FROM final f WHERE {on('f', 't')} AND f.{sa} = t.{sa})"
        ).to_arrow_table()
    # Every final version of the affected keys is written (unchanged ones as they were),
    # and every existing one not among them removed, in the same MERGE.
    one_commit = Scd2Actions(
        versions=final,
        removed=gone,
        tombstones=actions.tombstones,
        truncates=actions.truncates,
        sequence_by=sequence_by,
    )
    return _Rebuild(one_commit, removed.num_rows)


def _as_deletes(lost: pa.Table, schema: pa.Schema, keys: Sequence[str], sequence_by: str) -> pa.Table:
    """Rows of the change batch's schema: delete ``d`` at each lost end, other columns null."""
    columns: list[Any] = []
    for field in schema:
        if field.name in (*keys, sequence_by):
            columns.append(lost.column(field.name).cast(field.type))
        elif field.name == OP:
            columns.append(pa.array([DELETE_OP] * lost.num_rows, field.type))
        else:
            columns.append(pa.nulls(lost.num_rows, field.type))
    return pa.Table.from_arrays(columns, schema=schema)


def rebuild_days(
    spark: SparkSession | None, config: ProjectConfig, log: Log, table: str, days: Iterable[dt.date]
) -> BackfillResult:
    """Rebuild the versions of SCD2 table ``table`` committed on ``days`` (UTC dates) from the log."""
    chosen = tuple(sorted(set(days)))
    settings = config.warehouse.tables.get(table)
    if settings is None or settings.mode != "scd2":
        msg = f"{table!r} is not an SCD2 table of warehouse.tables; only SCD2 history is backfilled by day"
        raise BackfillError(msg)
    if not chosen:
        return BackfillResult(table, chosen, 0, 0, None)
    keys = table_keys(config, log, table)
    build, topic = load_identity(config, table)
    # Read, plan and commit as one writer: a loader micro-batch or a compaction committing in
    # between would make the plan stale; no vacuum removes the files the plan reads.
    with reading(config.home_dir, build), committing(config.home_dir, build):
        return _rebuild_held(spark, config, log, table, chosen, keys=keys, build=build, topic=topic, settings=settings)


def _rebuild_held(
    spark: SparkSession | None,
    config: ProjectConfig,
    log: Log,
    table: str,
    chosen: tuple[dt.date, ...],
    *,
    keys: tuple[str, ...],
    build: str,
    topic: str,
    settings: TableConfig,
) -> BackfillResult:
    path = table_path(config, table)
    fmt = format_of(config, table)
    target = fmt.open(path)
    ranges = offset_ranges(log, topic, chosen)
    history = SchemaHistory.of(read_schema_records(log, [topic]).get(topic, []))
    if spark is None:
        schema = None if target is None else target.schema()
        changes = _changes_on_driver(log, topic, ranges, keys, schema)
        changes = renamed_columns(changes, history.renames(), sequence=SEQ)
    else:
        changes = _changes_with_spark(spark, config, topic, ranges, keys)
    if changes.num_rows:
        changes = changes.filter(_in_days(changes.column(COMMIT_TS), chosen))
    if not changes.num_rows:
        if target is None:
            return BackfillResult(table, chosen, 0, 0, None)
        # No change on these days: clearing them still needs the change batch's columns.
        stored = target.schema()
        changes = pa.schema([f for f in stored if f.name not in (START_AT, END_AT, INHERITED)]).empty_table()
    read = changes.num_rows
    points = [point.sortable() for point in history.reread_points()]
    changes, options = prepare_changes(changes, keys, settings, reread_points=points)
    metadata = {"headwater.backfill": ",".join(map(str, chosen))}
    # Its own app id, so the streaming load's batch ids are untouched; the table version only grows.
    app_id = f"{build}.backfill"
    if target is None:
        # As a first micro-batch would: every change planned against no versions, remembered deletes included.
        window = scd2_window(changes, keys, options.sequence_by, None)
        first = plan_with_remembered(fmt.tombstones(path), changes, keys, None, window, options=options)
        write = fmt.commit_scd2(path, None, first, keys=keys, table=app_id, batch_id=0)
        return BackfillResult(table, chosen, read, 0, write)
    rebuild = _plan_rebuild(fmt, path, target, days=chosen, keys=keys, changes=changes, options=options)
    write = fmt.commit_scd2(
        path, target, rebuild.actions, keys=keys, table=app_id, batch_id=target.version() + 1, metadata=metadata
    )
    return BackfillResult(table, chosen, read, rebuild.removed, write)
