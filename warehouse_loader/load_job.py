"""The Spark job that keeps one warehouse table up to date from the log.

``headwater_log`` (streaming) → ``foreachBatch`` on the driver → the change batch → the
table's format (:meth:`warehouse_loader.table_format.TableFormat.write_batch`: one atomic commit
carrying ``(table, batch_id)``; Delta: one MERGE with the app transaction). Spark keeps the
source offsets in its checkpoint (``<spark.checkpoint_path>/load/<table>``, a POSIX path only
the driver writes); a batch replayed after a crash between the table's commit and the
checkpoint is skipped by the writer, so the table is exact.

The loader commits its position (Spark's end offsets) to consumer group
``headwater.load.<table>``, so ``headwater status`` can show its lag on any backend.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.config import ProjectConfig
from core.errors import HeadwaterError, PermanentError
from core.stage_problems import clear_problem, record_problem
from core.table_leases import committing
from core.warehouse_config import TableConfig
from log.base import Log
from log.schema_history import SchemaHistory
from log.sequence import Sequence as Seq
from log.table_schemas import read_schema_records, schema_key
from log.topics import load_group
from spark_log.checkpoint_leftovers import drop_first_batch_leftovers
from spark_log.errors import is_schema_changed
from spark_log.versions import resolve_table_target, resolve_topic
from warehouse_loader.errors import SchemaMismatchError, WarehouseError
from warehouse_loader.formats import format_of
from warehouse_loader.formats import merge_on_read as merge_on_read_of
from warehouse_loader.location import TableLocation, location_in
from warehouse_loader.maintenance import BuriedRows, PiledFiles
from warehouse_loader.maintenance_runs import record_runs
from warehouse_loader.table_format import TableFormat

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery


logger = logging.getLogger(__name__)

#: The Headwater error that stopped a load's micro-batch, by query name (Spark only keeps its text).
_FAILURES: dict[str, HeadwaterError] = {}


class UnknownWarehouseTableError(WarehouseError, PermanentError):
    """A table name that ``warehouse.tables`` does not define."""


class TableKeyError(WarehouseError, PermanentError):
    """The key of a warehouse table cannot be determined."""


def table_path(config: ProjectConfig, name: str) -> TableLocation:
    """Where the current version of warehouse table ``name`` lives (``headwater reprocess`` moves it)."""
    return location_in(config, resolve_table_target(config, name))


def load_identity(config: ProjectConfig, name: str) -> tuple[str, str]:
    """``(build name, source topic)`` of the current version of table ``name``.

    The build name (``<name>`` for version 1, ``<name>.v<N>`` after a reprocess) keys the
    table's commits (Delta: the app transaction), the checkpoint and the consumer group, so versions never share
    state; the source topic is the current version of the table's input.
    """
    return table_path(config, name).name, resolve_topic(config, config.warehouse.tables[name].from_)


def checkpoint_path(config: ProjectConfig, name: str) -> Path:
    """Spark's checkpoint of the load of ``name`` (a build name: one per table version)."""
    return config.checkpoint_dir / "load" / name


def table_keys(config: ProjectConfig, log: Log, name: str) -> tuple[str, ...]:
    """The key columns of warehouse table ``name``, checked against the rows it already holds.

    A feed's ``key``, or the key ``_headwater.schemas`` records for the source topic
    (:func:`log.table_schemas.schema_key`: the primary key or the configured key, whatever
    the replica identity). A table whose rows were merged on another key is refused: merging
    on the new key would leave its old rows beside the new ones.
    """
    source = config.warehouse.tables[name].from_
    feed = config.feeds.get(source)
    versions = [] if feed is not None else read_schema_records(log, [source]).get(source, [])
    if feed is not None:
        keys = feed.key
    else:
        if not versions:
            msg = f"no schema is recorded for topic {source!r} yet; run 'headwater capture' first"
            raise TableKeyError(msg)
        latest = max(versions, key=lambda record: int(record.get("version", 0)))
        recorded = schema_key(latest)
        if recorded is None:
            msg = (
                f"topic {source!r} (REPLICA IDENTITY FULL) has a schema record from before keys were recorded; "
                f"run 'headwater capture {source.split('.', 1)[0]} --until-caught-up' once to record its key"
            )
            raise TableKeyError(msg)
        if not recorded:
            where = f"sources.{source.split('.', 1)[0]}.keys"
            table = f"{latest.get('schema')}.{latest.get('table')}"
            msg = (
                f"topic {source!r} has no key (its table has no primary key), so warehouse table {name!r} "
                f"cannot be merged; give it one in {where}: {{{table}: [column, ...]}}"
            )
            raise TableKeyError(msg)
        keys = recorded
    _check_loaded_key(config, name, keys, versions)
    return keys


def _check_loaded_key(config: ProjectConfig, name: str, keys: tuple[str, ...], versions: list[dict[str, Any]]) -> None:
    path = table_path(config, name)
    fmt = format_of(config, name)
    merged_on = fmt.loaded_key(path)
    if merged_on is not None and versions:
        # A key column the source renamed is the same key: the load renames it in the table.
        history = SchemaHistory.of(versions)
        merged_on = tuple(history.current_name(column, Seq(0, 0)) for column in merged_on)
    if merged_on is not None and merged_on != keys:
        msg = (
            f"warehouse table {name!r} was merged on key ({', '.join(merged_on)}) but its input is now keyed by "
            f"({', '.join(keys)}); rebuild it with 'headwater reprocess {name}'"
        )
        raise TableKeyError(msg)
    if merged_on is None and any(schema_key(v) is None for v in versions) and fmt.exists(path):
        msg = (
            f"warehouse table {name!r} was loaded before Headwater recorded the key of REPLICA IDENTITY FULL "
            f"tables, so its rows were merged on every column; rebuild it with 'headwater reprocess {name}'"
        )
        raise TableKeyError(msg)


def table_key_problem(config: ProjectConfig, log: Log, name: str) -> str | None:
    """Why table ``name`` cannot be loaded as it is (a one-line message), or None."""
    try:
        table_keys(config, log, name)
    except TableKeyError as exc:
        return str(exc)
    return None


def start_load(
    spark: SparkSession,
    config: ProjectConfig,
    log: Log,
    name: str,
    *,
    available_now: bool,
    max_records_per_batch: int = 200_000,
    processing_interval: str = "1 second",
) -> StreamingQuery:
    """Start the streaming load of warehouse table ``name`` (returns the running query)."""
    # These import pyspark: `headwater status` imports this module (table keys and paths) without Spark.
    from spark_log.data_source import log_reader
    from spark_log.progress import track_progress
    from warehouse_loader.changes_frame import ChangeProjection, change_batch

    if name not in config.warehouse.tables:
        known = ", ".join(config.warehouse.tables) or "none"
        msg = f"no warehouse table named {name!r}; known: {known} (see warehouse.tables in headwater.yaml)"
        raise UnknownWarehouseTableError(msg)
    table = config.warehouse.tables[name]
    keys = table_keys(config, log, name)
    path = table_path(config, name)
    build, source_topic = load_identity(config, name)
    fmt = format_of(config, name)
    reader = log_reader(spark, config, source_topic, streaming=True)
    rows = reader.option("maxRecordsPerBatch", str(max_records_per_batch)).load()
    try:
        with committing(config.home_dir, build):  # a rename or widening commits too: never beside maintenance
            points = follow_schema_changes(log, fmt, path, source_topic, rows, keys=keys, config=table)
    except SchemaMismatchError as exc:  # a change the table's format cannot follow: status shows why
        record_problem(config.home_dir, "load", name, str(exc))
        raise
    clear_problem(config.home_dir, "load", name)

    query_name = f"load_{build}"
    merge_on_read = merge_on_read_of(config, name)
    upkeep = config.warehouse.maintenance_of(name)
    buried = BuriedRows(fmt.maintainer(path), upkeep) if merge_on_read and upkeep.enabled else None
    piled = PiledFiles(fmt.maintainer(path), upkeep) if upkeep.enabled else None

    projection = ChangeProjection(keys)

    def apply(batch: DataFrame, batch_id: int) -> None:
        changes = change_batch(batch, keys, projection)
        if changes.num_rows:
            try:
                # The commit lease: maintenance (compaction, vacuum) never commits in between.
                with committing(config.home_dir, build):
                    written = fmt.write_batch(
                        path,
                        changes,
                        table=build,
                        batch_id=batch_id,
                        keys=keys,
                        config=table,
                        reread_points=points,
                        merge_on_read=merge_on_read,
                    )
                    if buried is not None:
                        _compact_if_buried(config, build, buried, changes=changes.num_rows)
                    if piled is not None:
                        _compact_if_piled(config, build, piled, files=written.files)
            except HeadwaterError as exc:
                _FAILURES[query_name] = exc  # Spark wraps it in a Java exception: keep it to re-raise as is
                if isinstance(exc, SchemaMismatchError):  # waits for an operator: status shows why
                    record_problem(config.home_dir, "load", name, str(exc))
                raise

    if not available_now:
        track_progress(spark, log, query_name, load_group(build))
    writer = rows.writeStream.queryName(query_name).foreachBatch(apply)
    # A file: URL, so a cluster whose default filesystem is HDFS still uses the driver's path.
    location = checkpoint_path(config, build).absolute()
    drop_first_batch_leftovers(location)  # a load killed during its first start would never start again
    writer = writer.option("checkpointLocation", location.as_uri())
    writer = writer.trigger(availableNow=True) if available_now else writer.trigger(processingTime=processing_interval)
    return writer.start()


def _compact_if_buried(config: ProjectConfig, build: str, buried: BuriedRows, *, changes: int) -> None:
    """After a committed batch of ``changes`` rows: compact the table if removed rows piled up (lease held)."""
    started = time.monotonic()
    done = buried.after_commit(changes)
    if done is not None:
        _compacted(
            config,
            build,
            done,
            started,
            say=logger.warning,
            what="half its rows were removed ones; compacted %d files into %d",
        )


def _compact_if_piled(config: ProjectConfig, build: str, piled: PiledFiles, *, files: int | None) -> None:
    """After a commit that left ``files`` live files: compact the table if its files piled up (lease held)."""
    started = time.monotonic()
    done = piled.after_commit(files)
    if done is not None and done[0]:
        _compacted(config, build, done, started, say=logger.info, what="compacted %d files its batches added into %d")


def _compacted(
    config: ProjectConfig, build: str, done: tuple[int, int, int], started: float, *, say: Any, what: str
) -> None:
    """Record the loader's compaction as the table's last one and say what it did (``what``: files removed, added)."""
    record_runs(config.home_dir, build, ["compaction"], dt.datetime.now(dt.UTC))
    removed, added, written = done
    say(f"warehouse table %s: {what} (%d B) in %.1f s", build, removed, added, written, time.monotonic() - started)


def follow_schema_changes(
    log: Log,
    fmt: TableFormat,
    path: TableLocation,
    topic: str,
    rows: DataFrame,
    *,
    keys: Sequence[str],
    config: TableConfig,
) -> tuple[str, ...]:
    """Bring the table at ``path`` to its input's schema before loading; where the input's re-reads start.

    Columns the source renamed, widened or added change in the table now (:mod:`warehouse_loader.schema_evolution`
    decides for every format, the table's format does it): an added column is there, null,
    before any row brings a value, except one the table's ``column_list`` /
    ``except_column_list`` leaves out. The returned sequences let SCD2 place the values a
    re-read finds changed at the DDL's position.
    """
    from pyspark.sql.pandas.types import to_arrow_schema  # pyspark, as in start_load
    from pyspark.sql.types import StructType

    from spark_log.source_schema import AFTER
    from warehouse_loader.schema_evolution import table_changes

    history = SchemaHistory.of(read_schema_records(log, [topic]).get(topic, []))
    image = rows.schema[AFTER].dataType
    target = fmt.open(path)
    if target is not None and isinstance(image, StructType):
        # As the change batch's columns come (toArrow): timestamps in UTC.
        reading = {
            field.name: field.type
            for field in to_arrow_schema(image, timezone="UTC")
            if field.name in keys or _kept(field.name, config)
        }
        changes = table_changes(target.schema(), history.renames(), reading)
        if changes and fmt.evolve(path, changes, keys=keys):
            logger.info("warehouse table at %s: %s", path, changes.describe())
    return tuple(point.sortable() for point in history.reread_points())


def _kept(column: str, config: TableConfig) -> bool:
    """Whether the table's ``column_list`` / ``except_column_list`` keep a row-image column."""
    if config.column_list is not None:
        return column in config.column_list
    return column not in (config.except_column_list or ())


def run_loads(
    spark: SparkSession, config: ProjectConfig, log: Log, names: Sequence[str], *, available_now: bool
) -> list[StreamingQuery]:
    """Start the loads of ``names`` (all tables when empty); with ``available_now`` wait for them."""
    from spark_log.job import wait_for_sources  # pyspark, as in start_load

    selected = list(names) or list(config.warehouse.tables)
    queries = []
    for name in selected:
        queries.append(start_load(spark, config, log, name, available_now=available_now))
        wait_for_sources(queries[-1])  # one source start-up at a time (see wait_for_sources)
    if available_now:
        from spark_log.progress import commit_progress  # pyspark, as in start_load

        for at, name in enumerate(selected):
            query = queries[at]
            query.awaitTermination()
            while is_schema_changed(query.exception()):
                # Stopped before reading records of a new schema version: planned again with it.
                query = queries[at] = start_load(spark, config, log, name, available_now=True)
                query.awaitTermination()
            error = query.exception()
            if error is not None:
                raise _FAILURES.pop(query.name, None) or error
            if query.lastProgress:
                commit_progress(log, load_group(load_identity(config, name)[0]), query.lastProgress)
    return queries
