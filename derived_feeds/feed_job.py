"""The Spark job that keeps one feed's topic up to date from its input topic.

``headwater_log`` (streaming, the feed's ``from`` topic, resolved to its current version)
→ ``foreachBatch`` on the driver → :func:`derived_feeds.transform.compute_feed` →
expectations → encoded in Spark (JSON built by ``to_json``, no Python per column) →
``Arrow`` on the driver → :func:`derived_feeds.feed_writer.append_once` into the feed's
topic (compacted, keyed by the feed key) and its quarantine.

Spark keeps the input offsets in ``<home>/checkpoints/feeds/<feed>/<topic>``; a replayed
micro-batch is not appended twice (batch markers, see ``feed_writer``). After each batch
the job commits its input position to consumer group ``headwater.feed.<feed>`` (lag, and
catch-up progress for ``headwater reprocess``).

Before the stream starts, the job plans the feed once: the SQL's output schema from the
input's typed row image, checks of key and expectations (one-line config errors), and
the feed topic's schema record in ``_headwater.schemas`` (written when it changed), so
readers of the feed see typed STRUCTs exactly as for a raw table topic.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import orjson
from pyspark.sql.types import StructType

from derived_feeds import event_schema as cols
from derived_feeds.expectations import Check, compile_checks, drop_passing, with_checks
from derived_feeds.feed_errors import FeedConfigError
from derived_feeds.feed_graph import run_order
from derived_feeds.feed_schema import schema_columns, schema_record
from derived_feeds.feed_spec import FeedSpec, feed_spec
from derived_feeds.feed_writer import BatchMarker, append_once, checkpoint_run, plan_batch, record_quality
from derived_feeds.progress import commit_progress, track_progress
from derived_feeds.transform import apply_sql, compute_feed, encode_changes, latest_changes
from headwater.config import ProjectConfig
from headwater.errors import HeadwaterError
from log.base import SCHEMAS_TOPIC, Log, Record, TopicSpec, append_keyed

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

DEFAULT_MAX_RECORDS = 200_000


@dataclass
class FeedPlan:
    """A feed checked against its input: typed images, output schema, compiled expectations."""

    spec: FeedSpec
    source_struct: StructType
    lookup_structs: dict[str, StructType]
    output: StructType
    checks: list[Check]
    log: Log
    #: The Headwater error that stopped a micro-batch (Spark re-raises it wrapped; this keeps the original).
    error: Exception | None = None
    stats: dict[str, int] = field(default_factory=lambda: {"batches": 0, "upserts": 0, "deletes": 0, "dropped": 0})


def _image_struct(spark: SparkSession, config: ProjectConfig, feed: str, field_name: str, topic: str) -> StructType:
    from derived_feeds.log_source import register_log_source

    register_log_source(spark)
    schema = (
        spark.read.format("headwater_log").option("config", str(config.config_path)).option("topic", topic).load()
    ).schema
    image = schema[cols.AFTER].dataType
    if not isinstance(image, StructType):
        msg = f"topic {topic!r} has no schema record in {SCHEMAS_TOPIC}, so its rows are untyped; capture it first"
        raise FeedConfigError(feed, field_name, msg)
    return image


def plan_feed(spark: SparkSession, config: ProjectConfig, log: Log, spec: FeedSpec) -> FeedPlan:
    """Check ``spec`` against its input and write its topics and schema record (before any batch)."""
    topics = set(log.list_topics())
    for view, topic in {"from": spec.source_topic, **spec.lookup_topics}.items():
        if topic not in topics:
            where = "from" if view == "from" else f"lookups.{view}"
            raise FeedConfigError(spec.name, where, f"topic {topic!r} does not exist (yet); run its producer first")
    source = _image_struct(spark, config, spec.name, "from", spec.source_topic)
    lookups = {
        view: _image_struct(spark, config, spec.name, f"lookups.{view}", topic)
        for view, topic in spec.lookup_topics.items()
    }
    empty = {view: spark.createDataFrame([], struct) for view, struct in lookups.items()}
    try:
        output = apply_sql(spark, spark.createDataFrame([], source), spec.config.sql, empty).schema
    except Exception as exc:  # AnalysisException/ParseException: the user's SQL, one line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise FeedConfigError(spec.name, "sql", f"{first}; the SQL reads view 'source' (and its lookups)") from None
    for name in spec.key:
        if name not in output.fieldNames():
            raise FeedConfigError(spec.name, "key", f"{name!r} is not an output column of the SQL")
        if name not in source.fieldNames():
            msg = f"{name!r} must be a column of {spec.source_topic!r} passed through the SQL unchanged"
            raise FeedConfigError(spec.name, "key", msg)
    checks = compile_checks(spec.name, spec.config.expectations, output)
    _create_topics(config, log, spec)
    _write_schema(log, spec, output)
    return FeedPlan(spec, source, lookups, output, checks, log)


def _create_topics(config: ProjectConfig, log: Log, spec: FeedSpec) -> None:
    settings = config.log
    lag, retention = settings.min_compaction_lag_s * 1000, settings.delete_retention_s * 1000
    for name, partitions, compacted in (
        (spec.topic, settings.partitions, True),
        (spec.quarantine_topic, settings.partitions, False),  # quarantine keeps every dropped row
        (SCHEMAS_TOPIC, 1, True),
    ):
        log.create_topic(
            TopicSpec(name, partitions, compacted, min_compaction_lag_ms=lag, delete_retention_ms=retention)
        )


def _write_schema(log: Log, spec: FeedSpec, output: StructType) -> None:
    from derived_feeds.log_source import read_schema_records

    known = read_schema_records(log, [spec.topic]).get(spec.topic, [])
    latest = max(known, key=lambda record: int(record.get("version", 0)), default=None)
    if latest is not None and latest.get("columns") == schema_columns(output, spec.key):
        return
    version = int(latest.get("version", 0)) + 1 if latest is not None else 1
    value = schema_record(spec.topic, spec.name, output, spec.key, version)
    append_keyed(log, SCHEMAS_TOPIC, [Record(spec.topic.encode(), orjson.dumps(value))])


def process_batch(plan: FeedPlan, log: Log, batch: DataFrame, marker: BatchMarker) -> None:
    """One micro-batch of a plain feed: compute, check, encode, append exactly once, record counts."""
    spec = plan.spec
    spark = batch.sparkSession
    latest = latest_changes(batch).persist()
    try:
        changes = compute_feed(spark, latest, spec.config.sql, spec.key)
        _write(plan, log, changes, marker)
    finally:
        latest.unpersist()


def _write(plan: FeedPlan, log: Log, changes: DataFrame, marker: BatchMarker) -> None:
    spec, checks = plan.spec, plan.checks
    checked = with_checks(changes, checks)
    encoded = encode_changes(checked, spec.name, drop_passing(checks), keep=[c.flag for c in checks])
    planned = plan_batch(spec.name, encoded.toArrow(), checks, marker)
    append_once(log, spec.quarantine_topic, planned.quarantine, marker)
    append_once(log, spec.topic, planned.records, marker)
    record_quality(spec.home, spec.name, spec.topic, marker, planned.counts)
    plan.stats["batches"] += 1
    plan.stats["upserts"] += planned.upserts
    plan.stats["deletes"] += planned.deletes
    plan.stats["dropped"] += len(planned.quarantine)


def start_feed(
    spark: SparkSession,
    config: ProjectConfig,
    log: Log,
    spec: FeedSpec,
    *,
    available_now: bool,
    max_records_per_batch: int = DEFAULT_MAX_RECORDS,
    processing_interval: str = "1 second",
    options: Mapping[str, str] | None = None,
) -> tuple[StreamingQuery, FeedPlan]:
    """Plan feed ``spec`` and start its streaming query (returns the running query and the plan)."""
    from derived_feeds.log_source import register_log_source

    plan = plan_feed(spark, config, log, spec)
    register_log_source(spark)
    reader = (
        spark.readStream.format("headwater_log")
        .option("config", str(config.config_path))
        .option("topic", ",".join(spec.input_topics))
        .option("maxRecordsPerBatch", str(max_records_per_batch))
    )
    for name, value in (options or {}).items():
        reader = reader.option(name, value)
    run = checkpoint_run(spec.checkpoint)

    def apply(batch: DataFrame, batch_id: int) -> None:
        try:
            if spec.lookup_topics:
                from derived_feeds.enrichment import process_enriched_batch

                process_enriched_batch(plan, log, batch, BatchMarker(run, batch_id), _write)
            else:
                process_batch(plan, log, batch, BatchMarker(run, batch_id))
        except HeadwaterError as exc:
            plan.error = exc
            raise

    query_name = f"feed_{spec.name}"
    if not available_now:
        track_progress(spark, log, query_name, spec.group)
    writer = reader.load().writeStream.queryName(query_name).foreachBatch(apply)
    writer = writer.option("checkpointLocation", str(spec.checkpoint / "spark"))
    writer = writer.trigger(availableNow=True) if available_now else writer.trigger(processingTime=processing_interval)
    return writer.start(), plan


def run_feeds(
    spark: SparkSession,
    config: ProjectConfig,
    log: Log,
    names: Sequence[str] = (),
    *,
    available_now: bool,
    max_records_per_batch: int = DEFAULT_MAX_RECORDS,
) -> list[tuple[StreamingQuery, FeedPlan]]:
    """Run ``names`` (all feeds when empty) in DAG order.

    ``available_now``: each feed processes everything its input holds, upstream feeds
    first (so a feed of a feed sees its upstream's output of this run), then returns.
    Otherwise all queries start and keep running (the caller waits or stops them).
    """
    started: list[tuple[StreamingQuery, FeedPlan]] = []
    for name in run_order(config, names):
        spec = feed_spec(config, name)
        query, plan = start_feed(
            spark, config, log, spec, available_now=available_now, max_records_per_batch=max_records_per_batch
        )
        started.append((query, plan))
        if available_now:
            await_query(query, plan)
    return started


def await_query(query: StreamingQuery, plan: FeedPlan, timeout_s: int | None = None) -> bool:
    """Wait for the query to end (or ``timeout_s``); a failed batch re-raises its original Headwater error.

    Returns whether the query has ended.
    """
    try:
        ended = (
            bool(query.awaitTermination(int(timeout_s))) if timeout_s is not None else query.awaitTermination() or True
        )
    except Exception:
        if plan.error is not None:
            raise plan.error from None
        raise
    if query.exception() is not None:
        if plan.error is not None:
            raise plan.error from None
        raise RuntimeError(str(query.exception()))
    if ended and query.lastProgress:
        commit_progress(plan.log, plan.spec.group, query.lastProgress)
    return ended
