"""The Spark job that keeps one warehouse table up to date from the log.

``headwater_log`` (streaming) → ``foreachBatch`` on the driver → the change batch →
:func:`warehouse_loader.delta_writer.write_batch` (one MERGE, Delta app transaction
``(table, batch_id)``). Spark keeps the source offsets in its checkpoint
(``<home>/checkpoints/load/<table>``); a batch replayed after a crash between the Delta
commit and the checkpoint is skipped by the writer, so the table is exact.

The loader commits its position (Spark's end offsets) to consumer group
``headwater.load.<table>``, so ``headwater status`` can show its lag on any backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from headwater.config import ProjectConfig, TableConfig
from headwater.errors import HeadwaterError, PermanentError
from headwater.status import LOAD_GROUP_PREFIX
from log.base import SCHEMAS_TOPIC, Log
from warehouse_loader.errors import WarehouseError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery


#: The Headwater error that stopped a load's micro-batch, by query name (Spark only keeps its text).
_FAILURES: dict[str, HeadwaterError] = {}


class UnknownWarehouseTableError(WarehouseError, PermanentError):
    """A table name that ``warehouse.tables`` does not define."""


class TableKeyError(WarehouseError, PermanentError):
    """The key of a warehouse table cannot be determined."""


def table_path(config: ProjectConfig, name: str) -> Path:
    """Where the current version of Delta table ``name`` lives (``headwater reprocess`` moves it)."""
    from derived_feeds.versions import resolve_table_path

    return resolve_table_path(config, name)


def load_identity(config: ProjectConfig, name: str) -> tuple[str, str]:
    """``(build name, source topic)`` of the current version of table ``name``.

    The build name (``<name>`` for version 1, ``<name>.v<N>`` after a reprocess) keys the
    Delta app transaction, the checkpoint and the consumer group, so versions never share
    state; the source topic is the current version of the table's input.
    """
    from derived_feeds.versions import resolve_topic

    return table_path(config, name).name, resolve_topic(config, config.warehouse.tables[name].from_)


def checkpoint_path(config: ProjectConfig, name: str) -> Path:
    """Spark's checkpoint of the load of ``name`` (a build name: one per table version)."""
    return config.home_dir / "checkpoints" / "load" / name


def table_keys(config: ProjectConfig, log: Log, table: TableConfig) -> tuple[str, ...]:
    """The key columns: a feed's ``key``, or the source table's primary key from ``_headwater.schemas``."""
    feed = config.feeds.get(table.from_)
    if feed is not None:
        return feed.key
    latest: dict[str, Any] | None = None
    if SCHEMAS_TOPIC in log.list_topics():
        for partition in range(log.describe_topic(SCHEMAS_TOPIC).partitions):
            offset = log.beginning_offset(SCHEMAS_TOPIC, partition)
            while records := log.read(SCHEMAS_TOPIC, partition, offset):
                for record in records:
                    if record.key == table.from_.encode() and record.value is not None:
                        latest = orjson.loads(record.value)
                offset = records[-1].offset + 1
    if latest is None:
        msg = f"no schema is recorded for topic {table.from_!r} yet; run 'headwater capture' first"
        raise TableKeyError(msg)
    keys = tuple(column["name"] for column in latest["columns"] if column.get("key"))
    if not keys:
        msg = f"topic {table.from_!r} has no primary key, so it cannot be loaded as {table.mode}; add a key"
        raise TableKeyError(msg)
    return keys


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
    from derived_feeds.changes_frame import change_batch
    from derived_feeds.log_source import register_log_source
    from derived_feeds.progress import track_progress
    from warehouse_loader.delta_writer import write_batch

    if name not in config.warehouse.tables:
        known = ", ".join(config.warehouse.tables) or "none"
        msg = f"no warehouse table named {name!r}; known: {known} (see warehouse.tables in headwater.yaml)"
        raise UnknownWarehouseTableError(msg)
    table = config.warehouse.tables[name]
    keys = table_keys(config, log, table)
    path = table_path(config, name)
    build, source_topic = load_identity(config, name)
    register_log_source(spark)
    events = (
        spark.readStream.format("headwater_log")
        .option("config", str(config.config_path))
        .option("topic", source_topic)
        .option("maxRecordsPerBatch", str(max_records_per_batch))
        .load()
    )

    query_name = f"load_{build}"

    def apply(batch: DataFrame, batch_id: int) -> None:
        changes = change_batch(batch, keys)
        if changes.num_rows:
            try:
                write_batch(path, changes, table=build, batch_id=batch_id, keys=keys, config=table)
            except HeadwaterError as exc:
                _FAILURES[query_name] = exc  # Spark wraps it in a Java exception: keep it to re-raise as is
                raise

    if not available_now:
        track_progress(spark, log, query_name, LOAD_GROUP_PREFIX + build)
    writer = events.writeStream.queryName(query_name).foreachBatch(apply)
    writer = writer.option("checkpointLocation", str(checkpoint_path(config, build)))
    writer = writer.trigger(availableNow=True) if available_now else writer.trigger(processingTime=processing_interval)
    return writer.start()


def run_loads(
    spark: SparkSession, config: ProjectConfig, log: Log, names: Sequence[str], *, available_now: bool
) -> list[StreamingQuery]:
    """Start the loads of ``names`` (all tables when empty); with ``available_now`` wait for them."""
    selected = list(names) or list(config.warehouse.tables)
    queries = [start_load(spark, config, log, name, available_now=available_now) for name in selected]
    if available_now:
        from derived_feeds.progress import commit_progress

        for name, query in zip(selected, queries, strict=True):
            query.awaitTermination()
            error = query.exception()
            if error is not None:
                raise _FAILURES.pop(query.name, None) or error
            if query.lastProgress:
                commit_progress(log, LOAD_GROUP_PREFIX + load_identity(config, name)[0], query.lastProgress)
    return queries
