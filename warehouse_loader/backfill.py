"""Rebuild whole days of an SCD2 table from the log (a daily backfill), leaving other days alone.

A day is a UTC calendar date of ``__hw_commit_ts``. For the chosen days:

1. **Read.** Per partition of the table's topic, the log's time index gives the offset
   range: ``offset_for_time(first day's start)`` to ``offset_for_time(last day's end +
   LOG_TIME_SLACK_MS)``. Capture stamps records with their append time, which is at or
   after the commit time, so the range holds every change committed in the days as long
   as capture appended it within the slack; the changes are then filtered on their
   commit time. With a Spark session the range is a batch read of ``headwater_log``
   (``startingOffsets``/``endingOffsets``) and :func:`derived_feeds.changes_frame.change_batch`,
   typed exactly like the streaming load; without one the records are decoded on the
   driver (:func:`warehouse_loader.changes.changes_from_events`, small ranges and tests).
2. **Clear.** One MERGE deletes the versions whose ``__hw_commit_ts`` falls in the days
   and reopens (``__END_AT`` null) the version before each of them, the one the first
   removed version closed.
3. **Rebuild.** The changes go through the normal SCD2 writer
   (:func:`warehouse_loader.delta_writer.write_scd2`), which reads the existing versions
   around them and places every change at its sequence position: the reopened version
   is closed again by the day's first change, and the day's last version is closed by the
   next surviving version or delete. A removed version's ``__END_AT`` that no surviving
   version starts at and no rebuilt change carries (a delete on a day not rebuilt) is
   handed to the writer as that delete, so it is not lost.

Limits: steps 2 and 3 are two Delta commits. A crash in between leaves the days empty
and their predecessors open until the backfill runs again (it converges: a rerun clears
nothing more and rebuilds the days). The backfill assumes no other writer works on the
table meanwhile (the streaming load included): one writer per table, as for the load.
Days must lie inside what the log still holds in full (``clean_offset``); earlier ones
are refused.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]
from deltalake import CommitProperties, DeltaTable

from headwater.config import ProjectConfig
from headwater.errors import PermanentError
from log.base import Log
from log.envelope import ChangeEvent, decode_value
from warehouse_loader.changes import (
    COMMIT_TS,
    COMMIT_TS_TYPE,
    DELETE_OP,
    END_AT,
    OP,
    SEQ,
    START_AT,
    changes_from_events,
)
from warehouse_loader.delta_scan import select_rows
from warehouse_loader.delta_writer import WriteResult, write_scd2
from warehouse_loader.errors import WarehouseError
from warehouse_loader.scd import quote

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
        clean = log.clean_offset(topic, partition)
        if start < clean:
            msg = (
                f"partition {partition} of {topic!r} holds every version only from offset {clean} on, "
                f"after the start of {min(days)} (offset {start}); backfill later days, or reprocess the table"
            )
            raise BackfillError(msg)
        ranges[partition] = (start, max(start, end))
    return ranges


def _changes_on_driver(
    log: Log, topic: str, ranges: dict[int, tuple[int, int]], keys: Sequence[str], schema: pa.Schema | None
) -> pa.Table:
    from derived_feeds.log_source import read_range

    events: list[ChangeEvent] = []
    for partition, (start, end) in sorted(ranges.items()):
        for records in read_range(log, topic, partition, start, end):
            events.extend(decode_value(r.value) for r in records if r.value is not None)
    return changes_from_events(events, keys, schema)


def _changes_with_spark(
    spark: SparkSession, config: ProjectConfig, topic: str, ranges: dict[int, tuple[int, int]], keys: Sequence[str]
) -> pa.Table:
    from derived_feeds.changes_frame import change_batch
    from derived_feeds.log_source import register_log_source

    register_log_source(spark)
    # Every partition named: one the options leave out would be read from earliest to latest.
    starting = {topic: {str(p): start for p, (start, _) in ranges.items()}}
    ending = {topic: {str(p): end for p, (_, end) in ranges.items()}}
    events = (
        spark.read.format("headwater_log")
        .option("config", str(config.config_path))
        .option("topic", topic)
        .option("startingOffsets", orjson.dumps(starting).decode())
        .option("endingOffsets", orjson.dumps(ending).decode())
        .load()
    )
    return change_batch(events, keys)


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
    column = f"{alias}.{quote(COMMIT_TS)}"
    parts = []
    for day in days:
        start, end = _day_bounds(day)
        parts.append(
            f"({column} >= '{start.isoformat()}'::timestamptz AND {column} < '{end.isoformat()}'::timestamptz)"
        )
    return "(" + " OR ".join(parts) + ")"


def _clear_days(
    target: DeltaTable, days: Sequence[dt.date], keys: Sequence[str], changes: pa.Table, sequence_by: str
) -> tuple[int, pa.Table]:
    """Delete the days' versions and reopen their predecessors (one MERGE).

    Returns the count removed and the deletes to hand back to the writer: removed versions'
    ends that no surviving version starts at and no rebuilt change carries.
    """
    k = ", ".join(f"t.{quote(key)}" for key in keys)
    on = " AND ".join(f"t.{quote(key)} = r.{quote(key)}" for key in keys)
    sa, ea, seq = quote(START_AT), quote(END_AT), quote(sequence_by)
    removed = select_rows(target, f"SELECT {k}, t.{sa}, t.{ea} FROM target t WHERE {_days_predicate(days, 't')}")
    if not removed.num_rows:
        return 0, changes.schema.empty_table()
    reopen = select_rows(
        target,
        f"SELECT {k}, t.{sa} FROM target t JOIN removed r ON {on} AND t.{ea} = r.{sa} "
        f"WHERE NOT {_days_predicate(days, 't')}",
        removed=removed,
    )
    lost = select_rows(
        target,
        f"SELECT {', '.join('r.' + quote(key) for key in keys)}, r.{ea} AS {seq} FROM removed r "
        f"WHERE r.{ea} IS NOT NULL "
        f"AND NOT EXISTS (SELECT 1 FROM target t WHERE {on} AND t.{sa} = r.{ea} AND NOT {_days_predicate(days, 't')}) "
        f"AND NOT EXISTS (SELECT 1 FROM changes c WHERE "
        f"{' AND '.join(f'c.{quote(key)} = r.{quote(key)}' for key in keys)} AND c.{seq} = r.{ea})",
        removed=removed,
        changes=changes.select([*keys, sequence_by]),
    )
    action = pa.array(["remove"] * removed.num_rows + ["reopen"] * reopen.num_rows, pa.string())
    source = pa.concat_tables([removed.select([*keys, START_AT]), reopen.select([*keys, START_AT])])
    source = source.append_column("__action", action)
    merge = target.merge(
        source,
        " AND ".join(f"t.{quote(key)} = s.{quote(key)}" for key in keys) + f" AND t.{sa} = s.{sa}",
        source_alias="s",
        target_alias="t",
        streamed_exec=False,
        commit_properties=CommitProperties(custom_metadata={"headwater.backfill": ",".join(map(str, days))}),
    )
    merge.when_matched_delete(predicate="s.__action = 'remove'").when_matched_update(
        {END_AT: "NULL"}, predicate="s.__action = 'reopen'"
    ).execute()
    deletes = _as_deletes(lost, changes.schema, keys, sequence_by)
    return removed.num_rows, deletes


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
    from warehouse_loader.load_job import load_identity, table_keys, table_path

    chosen = tuple(sorted(set(days)))
    settings = config.warehouse.tables.get(table)
    if settings is None or settings.mode != "scd2":
        msg = f"{table!r} is not an SCD2 table of warehouse.tables; only SCD2 history is backfilled by day"
        raise BackfillError(msg)
    if not chosen:
        return BackfillResult(table, chosen, 0, 0, None)
    sequence_by = settings.sequence_by or SEQ
    keys = table_keys(config, log, settings)
    build, topic = load_identity(config, table)
    path = table_path(config, table)
    target = DeltaTable(str(path)) if DeltaTable.is_deltatable(str(path)) else None
    ranges = offset_ranges(log, topic, chosen)
    if spark is None:
        schema = None if target is None else target.to_pyarrow_dataset().schema
        changes = _changes_on_driver(log, topic, ranges, keys, schema)
    else:
        changes = _changes_with_spark(spark, config, topic, ranges, keys)
    if changes.num_rows:
        changes = changes.filter(_in_days(changes.column(COMMIT_TS), chosen))
    if not changes.num_rows:
        if target is None:
            return BackfillResult(table, chosen, 0, 0, None)
        # No change on these days: clearing them still needs the change batch's columns.
        stored = target.to_pyarrow_dataset().schema
        changes = pa.schema([f for f in stored if f.name not in (START_AT, END_AT)]).empty_table()
    removed = 0
    if target is not None:
        removed, deletes = _clear_days(target, chosen, keys, changes, sequence_by)
        if deletes.num_rows:
            changes = pa.concat_tables([changes, deletes])
        target.update_incremental()
    if not changes.num_rows:
        return BackfillResult(table, chosen, 0, removed, None)
    # Its own app id, so the streaming load's batch ids are untouched; the table version only grows.
    batch_id = 0 if target is None else target.version() + 1
    write = write_scd2(
        path,
        changes,
        table=f"{build}.backfill",
        batch_id=batch_id,
        keys=keys,
        track_history_columns=settings.track_history_columns,
        sequence_by=sequence_by,
    )
    return BackfillResult(table, chosen, changes.num_rows, removed, write)
