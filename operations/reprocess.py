"""Reprocessing: build version N+1 of a feed or warehouse table from offset 0, then switch readers.

Version N keeps serving readers while N+1 is built beside it (a feed into topic
``<feed>.v<N+1>`` with its own checkpoint, a table into ``<warehouse>/<table>.v<N+1>``, local or
on an object store).
When N+1 has caught up with everything its input held when the rebuild started, the
version pointer is replaced atomically (``spark_log.versions``): a reader resolving
the pointer reads all of N or all of N+1, never a mix. The next ``headwater feeds run``
(or load) continues N+1 from its own checkpoint, where the rebuild stopped. Version N
stays until it is dropped (``--drop-old``).

Downstream of a rebuilt feed, sinks that apply only newer sequences (SCD1/SCD2) keep
their rows: version N+1 repeats the source sequences, so rebuild them too.

Stage libraries (psycopg, pyspark, deltalake behind them) are imported inside the functions
that need them, so a process that uses one part of this module does not load the others.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from core.config import ProjectConfig
from core.warehouse_config import TableConfig, WarehouseConfig
from derived_feeds.errors import FeedVersionError
from log.base import Log, end_offsets
from log.history import require_full_history
from log.topics import QUARANTINE_SUFFIX
from spark_log.versions import (
    Kind,
    Version,
    current_version,
    forget_previous,
    resolve_topic,
    switch_version,
    version_target,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

#: Called with (records processed, records to process) while a version catches up.
Progress = Callable[[int, int], None]


def _kind(config: ProjectConfig, name: str) -> Kind:
    if name in config.feeds:
        return "feed"
    if name in config.warehouse.tables:
        return "table"
    known = ", ".join([*config.feeds, *config.warehouse.tables]) or "none"
    msg = f"no feed or warehouse table named {name!r}; known: {known}"
    raise FeedVersionError(msg)


def next_version(config: ProjectConfig, name: str) -> Version:
    """The version a rebuild of ``name`` creates (after every version still listed)."""
    kind = _kind(config, name)
    current = current_version(config, name, kind)
    number = max([current.number, *(n for n, _ in current.previous)]) + 1
    return Version(name, kind, number, version_target(config, name, kind, number))


def _catch_up(query: StreamingQuery, wait: Callable[[], bool], total: int, progress: Progress | None) -> None:
    while not wait():
        last = query.lastProgress
        if last and progress is not None:
            progress(min(_processed(last), total), total)
    if progress is not None:
        progress(total, total)


def _processed(progress: dict[str, object]) -> int:
    sources = progress.get("sources") or []
    assert isinstance(sources, list)
    if not sources:
        return 0
    end = sources[0].get("endOffset")
    if isinstance(end, str):
        end = orjson.loads(end)
    return sum(int(n) for parts in (end or {}).values() for n in parts.values())


def check_history(config: ProjectConfig, log: Log, name: str) -> None:
    """Refuse to rebuild SCD2 table ``name`` from a topic the cleaner already compacted (one line, the clean offset).

    SCD1 tables and feeds need only the latest record per key, which compaction keeps.
    """
    table = config.warehouse.tables.get(name)
    if table is None or table.mode != "scd2":
        return
    topic = resolve_topic(config, table.from_)
    if topic not in log.list_topics():
        return
    require_full_history(
        log,
        topic,
        dict.fromkeys(range(log.describe_topic(topic).partitions), 0),
        what=f"rebuilding the history of SCD2 table {name!r}",
        remedy="pass --accept-incomplete-history to rebuild it from what the log still holds (older versions missing)",
    )


def reprocess(
    spark: SparkSession,
    config: ProjectConfig,
    log: Log,
    name: str,
    *,
    progress: Progress | None = None,
    max_records_per_batch: int | None = None,
    accept_incomplete_history: bool = False,
) -> Version:
    """Build the next version of feed or table ``name`` from offset 0, then make it current.

    An SCD2 table whose topic was compacted is refused (:func:`check_history`) unless
    ``accept_incomplete_history``. ``max_records_per_batch``: None for each job's default.
    """
    new = next_version(config, name)
    if not accept_incomplete_history:
        check_history(config, log, name)
    if new.kind == "feed":
        _rebuild_feed(spark, config, log, new, progress=progress, limit=max_records_per_batch)
    else:
        _rebuild_table(spark, config, log, new, progress=progress, limit=max_records_per_batch or 200_000)
    switch_version(config, new)
    return new


def _rebuild_feed(
    spark: SparkSession, config: ProjectConfig, log: Log, new: Version, *, progress: Progress | None, limit: int | None
) -> None:
    from derived_feeds.feed_job import await_query, start_feed
    from derived_feeds.feed_spec import feed_spec

    spec = feed_spec(config, new.name, topic=new.topic, version=new.number)
    # A rebuild that stopped half way starts over: its topic and checkpoint are not current yet.
    for topic in (spec.topic, spec.quarantine_topic):
        if topic in log.list_topics():
            log.delete_topic(topic)
    shutil.rmtree(spec.checkpoint, ignore_errors=True)
    total = sum(sum(end_offsets(log, t).values()) for t in spec.input_topics)
    query, plan = start_feed(spark, config, log, spec, available_now=True, max_records_per_batch=limit)
    _catch_up(query, lambda: await_query(query, plan, timeout_s=1), total, progress)


def table_build_config(config: ProjectConfig, new: Version) -> tuple[ProjectConfig, str]:
    """A config whose extra table ``<name>.v<N>`` is version N of ``name``, reading its input's current version.

    The load job keys its table's location, checkpoint and consumer group by table name, so
    the new version gets all three of its own without touching the current one.
    """
    from spark_log.versions import resolve_topic
    from warehouse_loader.formats import format_of

    table = config.warehouse.tables[new.name]
    build_name = Path(new.target).name
    source = resolve_topic(config, table.from_)
    data = table.model_dump(by_alias=True)
    data["from"] = source
    data["format"] = format_of(config, new.name).name  # version N+1 is written in the table's format
    build = TableConfig.model_validate(data)
    tables = {**config.warehouse.tables, build_name: build}
    return config.model_copy(update={"warehouse": WarehouseConfig(tables=tables)}), build_name


def _rebuild_table(
    spark: SparkSession, config: ProjectConfig, log: Log, new: Version, *, progress: Progress | None, limit: int
) -> None:
    from warehouse_loader.formats import format_of
    from warehouse_loader.load_job import checkpoint_path, start_load
    from warehouse_loader.location import location_in

    build_config, build_name = table_build_config(config, new)
    format_of(config, new.name).remove(location_in(config, new.target))
    shutil.rmtree(checkpoint_path(build_config, build_name), ignore_errors=True)
    source = build_config.warehouse.tables[build_name].from_
    total = sum(end_offsets(log, source).values())
    query = start_load(spark, build_config, log, build_name, available_now=True, max_records_per_batch=limit)

    def wait() -> bool:
        ended = bool(query.awaitTermination(1))
        if ended and query.exception() is not None:
            raise RuntimeError(str(query.exception()))
        return ended

    _catch_up(query, wait, total, progress)


def drop_old(config: ProjectConfig, log: Log, name: str) -> list[str]:
    """Delete every previous version of ``name`` (topics or tables, with checkpoints); what was dropped."""
    current = current_version(config, name, _kind(config, name))
    dropped = []
    for number, target in current.previous:
        if current.kind == "feed":
            for topic in (target, target + QUARANTINE_SUFFIX):
                if topic in log.list_topics():
                    log.delete_topic(topic)
            shutil.rmtree(config.checkpoint_dir / "feeds" / name / target, ignore_errors=True)
        else:
            from warehouse_loader.formats import format_of
            from warehouse_loader.location import location_in

            table = location_in(config, target)
            format_of(config, name).remove(table)
            shutil.rmtree(config.checkpoint_dir / "load" / table.name, ignore_errors=True)
        forget_previous(config, name, number)
        dropped.append(target)
    return dropped
