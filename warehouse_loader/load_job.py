"""The Spark job that keeps one warehouse table up to date from the log.

``headwater_log`` (streaming) → ``foreachBatch`` on the driver → the change batch →
:func:`warehouse_loader.delta_writer.write_batch` (one MERGE, Delta app transaction
``(table, batch_id)``). Spark keeps the source offsets in its checkpoint
(``<spark.checkpoint_path>/load/<table>``, a POSIX path only the driver writes); a batch
replayed after a crash between the Delta commit and the checkpoint is skipped by the
writer, so the table is exact.

The loader commits its position (Spark's end offsets) to consumer group
``headwater.load.<table>``, so ``headwater status`` can show its lag on any backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.config import ProjectConfig
from core.errors import HeadwaterError, PermanentError
from log.base import Log
from log.table_schemas import read_schema_records, schema_key
from log.topics import load_group
from spark_log.checkpoint_leftovers import drop_first_batch_leftovers
from spark_log.versions import resolve_table_target, resolve_topic
from warehouse_loader import delta_writer
from warehouse_loader.errors import WarehouseError
from warehouse_loader.location import TableLocation, location_in

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery


#: The Headwater error that stopped a load's micro-batch, by query name (Spark only keeps its text).
_FAILURES: dict[str, HeadwaterError] = {}


class UnknownWarehouseTableError(WarehouseError, PermanentError):
    """A table name that ``warehouse.tables`` does not define."""


class TableKeyError(WarehouseError, PermanentError):
    """The key of a warehouse table cannot be determined."""


def table_path(config: ProjectConfig, name: str) -> TableLocation:
    """Where the current version of Delta table ``name`` lives (``headwater reprocess`` moves it)."""
    return location_in(config, resolve_table_target(config, name))


def load_identity(config: ProjectConfig, name: str) -> tuple[str, str]:
    """``(build name, source topic)`` of the current version of table ``name``.

    The build name (``<name>`` for version 1, ``<name>.v<N>`` after a reprocess) keys the
    Delta app transaction, the checkpoint and the consumer group, so versions never share
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
    merged_on = delta_writer.loaded_key(path)
    if merged_on is not None and merged_on != keys:
        msg = (
            f"warehouse table {name!r} was merged on key ({', '.join(merged_on)}) but its input is now keyed by "
            f"({', '.join(keys)}); rebuild it with 'headwater reprocess {name}'"
        )
        raise TableKeyError(msg)
    if merged_on is None and any(schema_key(v) is None for v in versions) and path.exists():
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
    from warehouse_loader.changes_frame import change_batch

    if name not in config.warehouse.tables:
        known = ", ".join(config.warehouse.tables) or "none"
        msg = f"no warehouse table named {name!r}; known: {known} (see warehouse.tables in headwater.yaml)"
        raise UnknownWarehouseTableError(msg)
    table = config.warehouse.tables[name]
    keys = table_keys(config, log, name)
    path = table_path(config, name)
    build, source_topic = load_identity(config, name)
    reader = log_reader(spark, config, source_topic, streaming=True)
    rows = reader.option("maxRecordsPerBatch", str(max_records_per_batch)).load()

    query_name = f"load_{build}"

    def apply(batch: DataFrame, batch_id: int) -> None:
        changes = change_batch(batch, keys)
        if changes.num_rows:
            try:
                delta_writer.write_batch(path, changes, table=build, batch_id=batch_id, keys=keys, config=table)
            except HeadwaterError as exc:
                _FAILURES[query_name] = exc  # Spark wraps it in a Java exception: keep it to re-raise as is
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

        for name, query in zip(selected, queries, strict=True):
            query.awaitTermination()
            error = query.exception()
            if error is not None:
                raise _FAILURES.pop(query.name, None) or error
            if query.lastProgress:
                commit_progress(log, load_group(load_identity(config, name)[0]), query.lastProgress)
    return queries
