"""The Spark job that keeps one feed's topic up to date from its input topic.

``headwater_log`` (streaming, the feed's ``from`` topic, resolved to its current version,
reduced to the latest change per key by the source) → ``foreachBatch`` on the driver →
the feed's SQL in Spark (:mod:`derived_feeds.transform`) → SQL rows paired with their
source changes, checked and encoded on the driver in Arrow (:mod:`derived_feeds.feed_output`)
→ :func:`derived_feeds.feed_writer.append_once` into the feed's
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

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson
import pyarrow as pa  # type: ignore[import-untyped]  # no stubs
from pyspark.sql.types import StringType, StructField, StructType

from core.config import ProjectConfig
from core.durable_files import replace_file
from core.errors import HeadwaterError
from core.stage_problems import clear_problem, record_problem
from derived_feeds.catalyst import HIDDEN_PREFIX, Catalyst, analyzed
from derived_feeds.enrichment_state import check_checkpoint, latest_per_key, start_stateful
from derived_feeds.errors import FeedConfigError
from derived_feeds.expectations import Check, compile_checks
from derived_feeds.feed_graph import run_order
from derived_feeds.feed_output import encode_output, pair_changes, paired_output
from derived_feeds.feed_schema import schema_columns, schema_record
from derived_feeds.feed_spec import FeedSpec, feed_spec
from derived_feeds.feed_writer import AppendMemo, BatchMarker, append_once, checkpoint_run, plan_batch, record_quality
from derived_feeds.maintained_view import KeptRows, process_maintained_batch
from derived_feeds.plan_class import PlanClass, ViewShape, classify
from derived_feeds.transform import (
    SOURCE_VIEW,
    SRC_KEY,
    OnePass,
    apply_sql,
    change_rows,
    current_images,
    latest_changes,
    output_rows,
    paired_rows,
    reduced_changes,
)
from log.base import Log, Record, TopicSpec, append_keyed
from log.schema_history import SchemaHistory
from log.table_schemas import read_schema_records, schema_key
from log.topics import SCHEMAS_TOPIC
from spark_log import source_schema as cols
from spark_log.checkpoint_leftovers import drop_first_batch_leftovers
from spark_log.data_source import log_reader, plan_row_schemas
from spark_log.errors import is_schema_changed
from spark_log.job import wait_for_sources
from spark_log.progress import commit_progress, track_progress
from spark_log.source_schema import RowSchema

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

#: The one pass's default micro-batch (records). A cap that binds only while the feed has a backlog
#: (catching up): the reader keeps each key's latest change per micro-batch, so larger batches fold more
#: repeated changes into one row, and the per-batch costs (planning, the append's commit) spread over
#: more records. The batch's output is held as Arrow on the driver (~100 bytes a row, one per key).
#: On a topic of 400k keys at load 5-6: 0.68 of a bare read at 1.2M, 0.47 at 600k (``bench/RESULTS.md``).
DEFAULT_MAX_RECORDS = 1_200_000
#: A maintained view's default micro-batch (records). Its work per micro-batch is per changed key (the
#: state store, the current rows rewritten, the touched groups recomputed), not per record read, so a
#: backlog is worked off in large batches: 1.8M measured 0.70-0.75 CPU s per 100k events against
#: 1.07-1.11 at 1.2M and ~2 at 600k on a topic of 400k keys (``bench/RESULTS.md``, issue 19).
MAINTAINED_MAX_RECORDS = 1_800_000


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
    stats: dict[str, int] = field(
        default_factory=lambda: {"batches": 0, "upserts": 0, "deletes": 0, "dropped": 0, "one_pass": 0}
    )
    #: This process's last append per partition of the feed's topics (``feed_writer.append_once``).
    appended: AppendMemo = field(default_factory=dict)
    #: The one-pass batch (``transform.paired_rows``, planned once per input), when the feed key holds
    #: every version's key of the source topic (one change per feed key in a batch).
    one_pass: OnePass | None = None
    #: How the SQL is maintained when it is not the one pass (``plan_class``), and what it keeps between batches.
    shape: ViewShape | None = None
    kept: KeptRows | None = None
    #: The input topics' row schemas the feed was planned with (their renames apply to its state's images).
    row_schemas: dict[str, RowSchema] | None = None

    @property
    def plan_class(self) -> PlanClass:
        """The SQL's plan class (``derived_feeds.plan_class``)."""
        return PlanClass.PROJECTION if self.shape is None else self.shape.plan_class

    @property
    def view_shape(self) -> ViewShape:
        """The shape of a maintained view (not the one pass)."""
        assert self.shape is not None, "a one-pass feed is not a maintained view"
        return self.shape


def _image_struct(spark: SparkSession, config: ProjectConfig, feed: str, field_name: str, topic: str) -> StructType:
    schema = log_reader(spark, config, topic).option("currentColumns", "true").load().schema
    image = schema[cols.AFTER].dataType
    if not isinstance(image, StructType):
        msg = f"topic {topic!r} has no schema record in {SCHEMAS_TOPIC}, so its rows are untyped; capture it first"
        raise FeedConfigError(feed, field_name, msg)
    return image


def plan_feed(spark: SparkSession, config: ProjectConfig, log: Log, spec: FeedSpec) -> FeedPlan:
    """Check ``spec`` against its input and write its topics and schema record (before any batch)."""
    topics = set(log.list_topics())
    for where, topic in spec.input_fields.items():
        if topic not in topics:
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
        gone = _gone_column(log, spec, str(exc))
        if gone is not None:
            refusal = FeedConfigError(spec.name, "sql", gone)
            record_problem(config.home_dir, "feed", spec.name, str(refusal))  # status shows it
            raise refusal from None
        raise FeedConfigError(spec.name, "sql", f"{first}; the SQL reads view 'source' (and its lookups)") from None
    for name in spec.key:
        if name not in output.fieldNames():
            raise FeedConfigError(spec.name, "key", f"{name!r} is not an output column of the SQL")
    shape: ViewShape | None = _shape(spark, log, spec, source, lookups)
    checks = compile_checks(spec.name, spec.config.expectations, output)
    one_pass = None
    rows = shape is not None and shape.plan_class is PlanClass.REKEYED
    if rows and _unique_key(log, spec) and _one_pass_fits(spark, config, spec, output):
        one_pass, shape = OnePass(spec.config.sql, spec.key, output, checks, latest_of=_latest), None
    clear_problem(config.home_dir, "feed", spec.name)
    _create_topics(config, log, spec)
    _write_schema(log, spec, output)
    spec.record_plan_class(PlanClass.PROJECTION if shape is None else shape.plan_class)
    schemas = plan_row_schemas(log, config, spec.input_topics, current_only=True)
    return FeedPlan(spec, source, lookups, output, checks, log, one_pass=one_pass, shape=shape, row_schemas=schemas)


_UNRESOLVED = re.compile(r"UNRESOLVED_COLUMN.*?name `(?:[^`]*`\.`)*([^`]+)` cannot be resolved")


def _gone_column(log: Log, spec: FeedSpec, error: str) -> str | None:
    """The one-line refusal when the SQL failed on a column its input renamed or dropped (None: another error)."""
    found = _UNRESOLVED.search(error)
    if found is None:
        return None
    column = found.group(1)
    histories = read_schema_records(log, list(spec.input_topics))
    for topic in spec.input_topics:
        gone = SchemaHistory.of(histories.get(topic, [])).gone(column)
        if gone is None:
            continue
        how, new = gone
        if how == "renamed":
            return (
                f"the SQL reads column {column!r} of {topic}, which the source renamed to {new!r}; "
                f"change the SQL to read {new!r} and start the feed again (its rows then come under the new name)"
            )
        return (
            f"the SQL reads column {column!r} of {topic}, which the source dropped; remove it from the SQL "
            "and start the feed again (no value of it arrives any more)"
        )
    return None


def _shape(
    spark: SparkSession, log: Log, spec: FeedSpec, source: StructType, lookups: Mapping[str, StructType]
) -> ViewShape:
    """The SQL's shape, analyzed over empty views carrying the hidden key columns, or a one-line refusal."""

    def empty(view: str, struct: StructType) -> DataFrame:
        return spark.createDataFrame([], StructType([*struct.fields, StructField(HIDDEN_PREFIX + view, StringType())]))

    views = {view: empty(view, struct) for view, struct in lookups.items()}
    frame = apply_sql(spark, empty(SOURCE_VIEW, source), spec.config.sql, views)
    return classify(Catalyst(spark), spec.name, analyzed(frame), spec.key, _source_key(log, spec))


def _one_pass_fits(spark: SparkSession, config: ProjectConfig, spec: FeedSpec, output: StructType) -> bool:
    """Whether the one pass takes the SQL (``transform.paired_rows`` over an empty batch of the feed's input)."""
    reader = log_reader(spark, config, spec.source_topic).option("currentColumns", "true")
    schema = reader.option("latestPerKey", "true").load().schema
    latest = _latest(spark.createDataFrame([], schema))
    return paired_rows(spark, latest, spec.config.sql, spec.key, output, checks=[]) is not None


def _source_key(log: Log, spec: FeedSpec) -> tuple[str, ...] | None:
    """The source topic's key columns, when every schema version has the same non-empty key."""
    versions = read_schema_records(log, [spec.source_topic]).get(spec.source_topic, [])
    keys = {tuple(schema_key(record) or ()) for record in versions}
    return keys.pop() if len(keys) == 1 and () not in keys else None


def _unique_key(log: Log, spec: FeedSpec) -> bool:
    """Whether the feed key contains the source topic's key columns in every schema version (none keyless).

    Then the latest changes of a batch (one per source key) have distinct feed keys.
    """
    versions = read_schema_records(log, [spec.source_topic]).get(spec.source_topic, [])
    keys = [schema_key(record) for record in versions]
    return bool(keys) and all(key and set(key) <= set(spec.key) for key in keys)


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
    known = read_schema_records(log, [spec.topic]).get(spec.topic, [])
    latest = max(known, key=lambda record: int(record.get("version", 0)), default=None)
    if latest is not None and latest.get("columns") == schema_columns(output, spec.key):
        return
    version = int(latest.get("version", 0)) + 1 if latest is not None else 1
    value = schema_record(spec.topic, spec.name, output, spec.key, version)
    if latest is not None:
        renamed = _output_renames(log, spec, [str(c["name"]) for c in latest.get("columns", ())], output.fieldNames())
        if renamed is not None:
            value["change"] = renamed
    append_keyed(log, SCHEMAS_TOPIC, [Record(spec.topic.encode(), orjson.dumps(value))])


def _check_key_renames(log: Log, spec: FeedSpec) -> None:
    """Refuse a maintained view's state built before an input's key column was renamed (it keys rows by the old name).

    The state groups each input's rows by record key; records before the rename carry the old
    name in it (the reader renames them, but the state holds what it was given then), so a key
    would be held twice. The key renames known when the state was started are kept beside it.
    """
    histories = read_schema_records(log, list(spec.input_topics))
    renames = sorted(
        f"{topic}:{rename.old}->{rename.new}@{rename.at.sortable()}"
        for topic in spec.input_topics
        for rename in SchemaHistory.of(histories.get(topic, [])).renames()
        if any(rename.old in (record.get("key") or ()) for record in histories.get(topic, []))
    )
    known = spec.checkpoint / "key_renames.json"
    recorded = orjson.loads(known.read_bytes()) if known.exists() else None
    started = (spec.checkpoint / "spark" / "state").exists()
    if started and renames and set(renames) - set(recorded or ()):
        new = next(r for r in renames if r not in (recorded or ()))
        msg = (
            f"a key column of its input was renamed ({new.split('@')[0]}) after the feed's state was built, "
            f"which keeps rows by the old key; run 'headwater reprocess {spec.name}' to rebuild it"
        )
        refusal = FeedConfigError(spec.name, "from", msg)
        record_problem(spec.home, "feed", spec.name, str(refusal))
        raise refusal
    if recorded != renames:
        replace_file(known, orjson.dumps(renames))


def _output_renames(log: Log, spec: FeedSpec, before: Sequence[str], after: Sequence[str]) -> dict[str, Any] | None:
    """The ``change`` of the feed's schema when output columns follow an input's renames (None: none do).

    An output column that had an input column's old name and now has its new one is the same
    column (the SQL passes it through, as ``SELECT *`` does): the feed's records before the
    rename's position (they carry their source's position) hold the old name, and readers of the
    feed's topic map it as they do for a source topic (:mod:`log.schema_history`).
    """
    histories = read_schema_records(log, list(spec.input_topics))
    renamed: dict[str, str] = {}
    at = None
    for topic in spec.input_topics:
        for rename in SchemaHistory.of(histories.get(topic, [])).renames():
            if rename.old in before and rename.old not in after and rename.new in after and rename.new not in before:
                renamed[rename.new] = rename.old
                at = rename.at if at is None else max(at, rename.at)
    if at is None:
        return None
    return {"at": [at.commit_lsn, at.txn_index], "renamed": renamed}


def process_batch(plan: FeedPlan, log: Log, batch: DataFrame, marker: BatchMarker) -> None:
    """One micro-batch of a plain feed: compute, check, encode, append exactly once, record counts.

    Spark computes the latest change per key (already done by the source when read with
    ``latestPerKey``) and the SQL; the driver pairs changes with SQL rows and encodes the
    output records in Arrow (``feed_output``): no shuffle, no join in Spark. When the SQL is
    projections and filters over ``source`` and the feed key holds the source's key, one
    Spark pass returns each change with its SQL row (``transform.paired_rows``, planned at
    the query's first batch and reused: ``transform.OnePass``); otherwise the reduced
    changes are cached and read twice (changes, SQL rows) and joined here.
    """
    spec = plan.spec
    spark = batch.sparkSession
    if plan.one_pass is not None:
        paired = plan.one_pass.paired(batch)  # planned at the query's first batch, then reused
        if paired is not None:  # projections/filters: one Spark pass, no cache, no join
            records = paired_output(paired.toArrow(), plan.checks)
            _append(plan, log, encode_output(records, spec.name, plan.checks), marker)
            plan.stats["one_pass"] += 1
            return
    latest = _latest(batch).persist()  # only what the SQL and the pairing read: the cache is built per batch
    try:
        output = apply_sql(spark, current_images(latest), spec.config.sql)
        changes = change_rows(latest, spec.key).toArrow()
        outputs = output_rows(output, spec.key, plan.source_struct, plan.checks).toArrow()
        records = pair_changes(changes, outputs, plan.checks)
        _append(plan, log, encode_output(records, spec.name, plan.checks), marker)
    finally:
        latest.unpersist()


def _latest(batch: DataFrame) -> DataFrame:
    """The batch's latest change per key (``transform.latest_changes``' columns without topic and source key)."""
    reduced = cols.FIRST_OP in batch.columns  # read with latestPerKey: one row per key already
    return (reduced_changes(batch) if reduced else latest_changes(batch)).drop(cols.TOPIC, SRC_KEY)


def _append(plan: FeedPlan, log: Log, encoded: pa.Table, marker: BatchMarker) -> None:
    spec, checks = plan.spec, plan.checks
    planned = plan_batch(spec.name, encoded, checks, marker)
    append_once(log, spec.quarantine_topic, planned.quarantine, marker, plan.appended)
    append_once(log, spec.topic, planned.records, marker, plan.appended)
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
    max_records_per_batch: int | None = None,
    processing_interval: str = "1 second",
    options: Mapping[str, str] | None = None,
) -> tuple[StreamingQuery, FeedPlan]:
    """Plan feed ``spec`` and start its streaming query (returns the running query and the plan).

    ``max_records_per_batch``: records per micro-batch; None: :data:`MAINTAINED_MAX_RECORDS` for a
    maintained view, :data:`DEFAULT_MAX_RECORDS` for the one pass.
    """
    plan = plan_feed(spark, config, log, spec)
    maintained = plan.shape is not None
    if max_records_per_batch is None:
        max_records_per_batch = MAINTAINED_MAX_RECORDS if maintained else DEFAULT_MAX_RECORDS
    reader = log_reader(spark, config, ",".join(spec.input_topics), streaming=True)
    # The latest version's columns only: SQL naming a dropped or renamed column failed at planning.
    reader = reader.option("currentColumns", "true").option("maxRecordsPerBatch", str(max_records_per_batch))
    # Each key's latest change of the micro-batch only, per log partition in the reader (no shuffle); a
    # maintained view then keeps it per key in its state store (fewer rows to encode and aggregate there).
    reader = reader.option("latestPerKey", "true")
    for name, value in (options or {}).items():
        reader = reader.option(name, value)
    run = checkpoint_run(spec.checkpoint)
    feed, checks = spec.name, plan.checks

    def apply(batch: DataFrame, batch_id: int) -> None:
        marker = BatchMarker(run, batch_id)
        try:
            if maintained:
                process_maintained_batch(
                    plan,
                    batch,
                    marker,
                    lambda records: _append(plan, log, encode_output(records, feed, checks), marker),
                )
            else:
                process_batch(plan, log, batch, marker)
        except HeadwaterError as exc:
            plan.error = exc
            raise

    query_name = f"feed_{spec.name}"
    if not available_now:
        track_progress(spark, log, query_name, spec.group)
    stream = reader.load()
    if maintained:  # the latest change per (topic, key) in Spark's state store
        check_checkpoint(spec)
        _check_key_renames(log, spec)
        stream = latest_per_key(stream, plan.row_schemas)
    writer = stream.writeStream.queryName(query_name).foreachBatch(apply)
    drop_first_batch_leftovers(spec.checkpoint / "spark")  # a feed killed during its first start would never start
    writer = writer.option("checkpointLocation", str(spec.checkpoint / "spark"))
    writer = writer.trigger(availableNow=True) if available_now else writer.trigger(processingTime=processing_interval)
    return (start_stateful(spark, writer) if maintained else writer.start()), plan


def run_feeds(
    spark: SparkSession,
    config: ProjectConfig,
    log: Log,
    names: Sequence[str] = (),
    *,
    available_now: bool,
    max_records_per_batch: int | None = None,
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
        if available_now:
            while not await_query(query, plan, restartable=True):
                # Stopped before reading records of a new schema version: planned again with it.
                query, plan = start_feed(
                    spark, config, log, spec, available_now=True, max_records_per_batch=max_records_per_batch
                )
        started.append((query, plan))
        if not available_now:
            wait_for_sources(query)  # one source start-up at a time (see wait_for_sources)
    return started


def await_query(
    query: StreamingQuery, plan: FeedPlan, timeout_s: int | None = None, *, restartable: bool = False
) -> bool:
    """Wait for the query to end (or ``timeout_s``); a failed batch re-raises its original Headwater error.

    Returns whether the query has ended; with ``restartable``, False when it stopped for a new
    schema version of its input (:class:`spark_log.errors.SchemaChangedError`: start it again).
    """
    try:
        ended = (
            bool(query.awaitTermination(int(timeout_s))) if timeout_s is not None else query.awaitTermination() or True
        )
    except Exception:
        if restartable and is_schema_changed(query.exception()):
            return False
        if plan.error is not None:
            raise plan.error from None
        raise
    if restartable and is_schema_changed(query.exception()):
        return False
    if query.exception() is not None:
        if plan.error is not None:
            raise plan.error from None
        raise RuntimeError(str(query.exception()))
    if ended and query.lastProgress:
        commit_progress(plan.log, plan.spec.group, query.lastProgress)
    return ended
