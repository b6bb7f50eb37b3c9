"""Asset factories: capture per source, feeds, warehouse loads, sinks. Bodies only call library code.

Library modules are imported inside asset and check bodies: Dagster loads these definitions in
every process (webserver, daemon, each run), most of which never run a given stage.
"""

import datetime as dt
from collections.abc import Iterator
from typing import Any

from dagster import (
    AssetExecutionContext,
    AssetsDefinition,
    AssetSpec,
    BackfillPolicy,
    FreshnessPolicy,
    MaterializeResult,
    asset,
    multi_asset,
)

from core.config import ProjectConfig
from dagster_project.history_days import history_start
from dagster_project.lineage import (
    FEEDS_GROUP,
    SINKS_GROUP,
    SOURCES_GROUP,
    WAREHOUSE_GROUP,
    feed_key,
    feed_upstream_keys,
    sink_key,
    sink_upstream_keys,
    source_topics,
    topic_key,
    upstream_key,
    warehouse_key,
)
from dagster_project.metadata import capture_metadata, feed_metadata, table_metadata, topic_metadata
from dagster_project.partitions import INCREMENTAL, INCREMENTAL_TAG, history_partitions, partition_days
from dagster_project.resources import HeadwaterLog, HeadwaterProject, HeadwaterSpark
from log.factory import open_log


def capture_asset(source: str, topics: list[str], kind: str = "postgres") -> AssetsDefinition:
    """One asset per raw topic of ``source`` (of source ``kind``), materialised by one capture run until caught up."""
    keys = {topic: topic_key(topic) for topic in topics}

    @multi_asset(
        name=f"capture_{source}",
        specs=[
            AssetSpec(
                key,
                group_name=SOURCES_GROUP,
                kinds={kind},
                description=f"Change events of {topic.split('.', 1)[1]} captured from source {source!r} "
                f"(topic {topic}, keyed, compacted).",
            )
            for topic, key in keys.items()
        ],
        can_subset=False,
    )
    def capture(
        context: AssetExecutionContext, project: HeadwaterProject, log: HeadwaterLog
    ) -> Iterator[MaterializeResult[None]]:
        from capture.runner import run_capture

        config = project.load(needs_sources=True)
        stats = run_capture(config, (source,), until_caught_up=True)[source]
        context.log.info(f"{source}: {stats.events} events, {stats.records_written} records written")
        with log.open() as handle:
            for topic, key in keys.items():
                yield MaterializeResult(
                    asset_key=key,
                    metadata={
                        **topic_metadata(config, handle, topic),
                        **capture_metadata(kind, {"acked": str(stats.acked), "records_written": stats.records_written}),
                    },
                )

    return capture


def feed_asset(config: ProjectConfig, name: str) -> AssetsDefinition:
    """Feed ``name``: a Spark ``availableNow`` run of the feed runner into the feed's topic."""
    feed = config.feeds[name]

    @asset(
        key=feed_key(name),
        deps=feed_upstream_keys(config, name),
        group_name=FEEDS_GROUP,
        kinds={"spark"},
        description=f"Feed {name!r} derived from {feed.from_} (key {', '.join(feed.key)}).",
        metadata={"feed/sql": feed.sql, "feed/key": list(feed.key)},
    )
    def run(
        context: AssetExecutionContext, project: HeadwaterProject, log: HeadwaterLog, spark: HeadwaterSpark
    ) -> MaterializeResult[None]:
        from derived_feeds.feed_job import run_feeds

        config = project.load()
        with log.open() as handle:
            ((_, plan),) = run_feeds(spark.session(), config, handle, (name,), available_now=True)
            metadata = feed_metadata(config, handle, name, plan.stats)
        context.log.info(f"{name}: {plan.stats}")
        return MaterializeResult(metadata=metadata)

    return run


def warehouse_asset(config: ProjectConfig, name: str, history_from: dt.date) -> AssetsDefinition:
    """Warehouse table ``name``: a Spark ``availableNow`` load of its topic into Delta.

    An SCD2 table is also partitioned by commit day (UTC): materialising partitions rebuilds
    those days from the log (:func:`warehouse_loader.backfill.rebuild_days`, one run for a
    whole backfill); a materialisation without a partition, or in a run tagged
    :data:`~dagster_project.partitions.INCREMENTAL_TAG` (the new-data sensor's), runs the
    streaming load. Partitions start at ``history_from``. Each table has a freshness policy
    (``freshness`` of the table, else of ``warehouse``): its last materialization must be
    younger than ``fail_after_s`` (a warning after ``warn_after_s``).
    """
    table = config.warehouse.tables[name]
    freshness = table.freshness or config.warehouse.freshness
    by_day = table.mode == "scd2"

    @asset(
        key=warehouse_key(name),
        deps=[upstream_key(config, table.from_)],
        group_name=WAREHOUSE_GROUP,
        kinds={"spark", "delta"},
        description=f"Delta table {name!r} ({table.mode.upper()}) loaded from {table.from_}.",
        partitions_def=history_partitions(history_from) if by_day else None,
        freshness_policy=FreshnessPolicy.time_window(
            fail_window=dt.timedelta(seconds=freshness.fail_after_s),
            warn_window=dt.timedelta(seconds=freshness.warn_after_s) if freshness.warn_after_s else None,
        ),
        backfill_policy=BackfillPolicy.single_run() if by_day else None,
    )
    def load(
        context: AssetExecutionContext, project: HeadwaterProject, log: HeadwaterLog, spark: HeadwaterSpark
    ) -> MaterializeResult[None]:
        from warehouse_loader.backfill import rebuild_days
        from warehouse_loader.load_job import run_loads

        config = project.load()
        # A backfill of several days is one run over a partition range (BackfillPolicy.single_run).
        partitioned = context.has_partition_key or context.has_partition_key_range
        rebuild = partitioned and context.run.tags.get(INCREMENTAL_TAG) != INCREMENTAL
        with log.open() as handle:
            if rebuild:
                days = partition_days(context.partition_keys)
                rebuilt = rebuild_days(spark.session(), config, handle, name, days)
                context.log.info(f"{name}: rebuilt {len(days)} day(s): {rebuilt}")
            else:
                run_loads(spark.session(), config, handle, [name], available_now=True)
            metadata: dict[str, Any] = table_metadata(config, handle, name)
        if rebuild:
            metadata |= {"backfill/changes": rebuilt.changes, "backfill/removed_versions": rebuilt.removed}
        context.log.info(f"{name}: {metadata.get('dagster/row_count', 0)} rows")
        return MaterializeResult(metadata=metadata)

    return load


def sink_asset(config: ProjectConfig, name: str) -> AssetsDefinition:
    """Sink ``name``: its consumer group delivering its topics until caught up (``headwater sinks run``)."""
    sink = config.sinks[name]

    @asset(
        key=sink_key(name),
        deps=sink_upstream_keys(config, name),
        group_name=SINKS_GROUP,
        kinds={sink.kind},
        description=f"Sink {name!r} ({sink.kind}) delivering {', '.join(sink.from_)} as consumer group "
        f"headwater.sink.{name}.",
    )
    def deliver(
        context: AssetExecutionContext, project: HeadwaterProject, log: HeadwaterLog
    ) -> MaterializeResult[None]:
        from sinks.runner import run_sinks
        from sinks.status import sink_rows
        from spark_log.versions import resolve_topic

        config = project.load(needs_sources=False)
        resolve = lambda feed: resolve_topic(config, feed)  # noqa: E731
        (stats,) = run_sinks(config, (name,), follow=False, resolve_name=resolve, say=context.log.info)
        with log.open() as handle:
            (row,) = [r for r in sink_rows(config, handle, resolve) if r["sink"] == name]
        return MaterializeResult(
            metadata={
                "sink/kind": sink.kind,
                "sink/topics": row["topics"],
                "sink/lag": row["lag"],
                "sink/delivered": stats.delivered,
                "sink/skipped": stats.skipped,
                "sink/dead_lettered": row["dead_lettered"],
            }
        )

    return deliver


def _history_from(config: ProjectConfig) -> dt.date:
    """The first day of the history partitions (today when the log cannot be opened now)."""
    if not any(table.mode == "scd2" for table in config.warehouse.tables.values()):
        return dt.datetime.now(dt.UTC).date()
    try:
        log = open_log(config)
    except Exception:  # e.g. a broker that is down: the definitions still load
        return history_start(config, None)
    try:
        return history_start(config, log)
    finally:
        log.close()


def build_assets(config: ProjectConfig) -> list[AssetsDefinition | AssetSpec]:
    """Every asset of the project: captures, feeds, warehouse tables."""
    assets: list[AssetsDefinition | AssetSpec] = [
        capture_asset(source, topics, config.sources[source].kind)
        for source, topics in source_topics(config).items()
        if topics
    ]
    assets += [feed_asset(config, name) for name in config.feeds]
    history_from = _history_from(config)
    assets += [warehouse_asset(config, name, history_from) for name in config.warehouse.tables]
    assets += [sink_asset(config, name) for name in config.sinks]
    return assets
