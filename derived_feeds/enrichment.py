"""Stream-table enrichment: a feed whose SQL joins other topics (``lookups``) read as tables.

``lookups: {customers: shop.public.customers}`` makes view ``customers`` hold the latest
value per key of that topic. Both sides arrive in one stream (the job reads the feed's
``from`` topic and its lookup topics together, so one Spark checkpoint orders them), and
the latest change per ``(topic, key)`` of both sides is kept in Spark's RocksDB state
store (:mod:`derived_feeds.enrichment_state`): a micro-batch writes only the keys it
changed, and a restart resumes from the checkpoint without rereading the topics.

Per micro-batch ``b`` (its changed keys, from the state store's aggregation):

* changed source keys: the SQL over their current images with the lookup views as they
  are after ``b``; a row is an upsert, no row is a delete (as plain feeds: a key that
  never had a row gets a harmless delete, except a key whose only change is an insert);
* when a lookup changed: every other source key is run through the SQL twice, with the
  lookup views as they were before ``b`` and as they are after it (the SQL is arbitrary,
  so which rows a lookup row reaches is only known by running it), and only the rows
  that differ are written: changed rows as upserts, rows gone as deletes. What was
  emitted before ``b`` is by induction the SQL over the views before ``b``.

Truncates (``enrichment_state`` keeps each topic's latest one): every image of a topic
older than its latest truncate is gone. A lookup truncate empties that lookup view (the
batch's later changes of that topic then apply) and is a lookup change like any other:
every source row is run again, so rows an inner join loses get deletes and left-join rows
get nulls. A source truncate passes through to the feed as a truncate record (as in plain
feeds), and the source rows it took away are out of the state a later lookup change runs;
changes of the batch older than it make no record (the truncate covers them). Images
are compared with the truncate by ``__hw_seq``, whichever batch they came in, except that
a change is taken to be newer than the truncates of earlier batches (capture appends each
topic in source order).

The views before ``b`` are read from the state store as of committed batch ``b - 1``; the
process keeps the lookup views of its last batch (checkpointed DataFrames) so a batch
without lookup changes reads no state. Re-emitted rows carry the sequence of the lookup
change that caused them when it is newer than their own, so sinks that apply only newer
sequences take them (the lookup and the source must come from one database for the
sequences to compare). A replayed batch recomputes the same result from the state of
``b - 1``; the append is idempotent anyway (``feed_writer``).

Cost: a batch of source changes only is O(changes) in the state store plus the SQL's join
with the lookup views; a lookup change (a lookup truncate too) costs a pass over the source
state (twice the SQL). The SQL must be deterministic, one row per source row (as for plain
feeds).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from derived_feeds.enrichment_state import CHANGES, TRUNCATE_KEY, newer_than, not_truncated, state_tables
from derived_feeds.feed_output import AFTER_JSON, KEY_JSON, META
from derived_feeds.feed_schema import JSON_OPTIONS
from derived_feeds.feed_writer import BatchMarker
from derived_feeds.transform import AFTER, IMAGE, SRC_KEY, apply_sql, typed_key_json
from log.base import Log
from log.envelope import Op
from spark_log import source_schema as cols

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

    from derived_feeds.feed_job import FeedPlan

_POSITION = (cols.SEQ, cols.COMMIT_LSN, cols.TXN_INDEX)


@dataclass(frozen=True)
class LookupTables:
    """Each lookup view's rows (``__hw_src_key``, ``__hw_image``, ``__hw_seq``) after micro-batch ``batch_id``."""

    batch_id: int
    frames: Mapping[str, DataFrame]


#: Per (checkpoint, query session), the lookup tables after the query's last batch (valid for its next batch
#: only). Per session because each streaming query runs on its own clone of the session, and the SQL sees
#: only the temporary views of its own session.
_last_tables: dict[tuple[str, str], LookupTables] = {}


def _cache_key(spark: SparkSession, plan: FeedPlan) -> tuple[str, str]:
    return (str(plan.spec.checkpoint), str(spark._jsparkSession.sessionUUID()))


def _project(frame: DataFrame, image: StructType) -> DataFrame:
    """The rows of a view: ``frame``'s images cut to that topic's own columns."""
    return frame.select(*[F.col(IMAGE)[name].alias(name) for name in image.fieldNames()])


def _views(tables: LookupTables, plan: FeedPlan) -> dict[str, DataFrame]:
    """The lookup views the SQL reads, from ``tables``."""
    return {view: _project(frame, plan.lookup_structs[view]) for view, frame in tables.frames.items()}


def _source_key_json(plan: FeedPlan) -> Column:
    return typed_key_json([F.col(IMAGE)[name] for name in plan.spec.key], plan.spec.key, plan.source_struct)


def _output_rows(output: DataFrame, plan: FeedPlan) -> DataFrame:
    """SQL rows as (key JSON, row, row JSON)."""
    row = F.struct(*[F.col(f"`{c}`") for c in output.columns])
    key = plan.spec.key
    return output.select(
        typed_key_json([F.col(f"`{name}`") for name in key], key, plan.source_struct).alias(KEY_JSON),
        row.alias(AFTER),
        F.to_json(row, JSON_OPTIONS).alias(AFTER_JSON),
    )


def _prior_state(spark: SparkSession, plan: FeedPlan, batch_id: int, schema: StructType) -> DataFrame:
    """Rows not deleted after batch ``batch_id - 1`` (empty before the first batch; ``state_tables`` is eager)."""
    if batch_id == 0:
        return spark.createDataFrame([], schema)
    image_type = schema[IMAGE].dataType
    assert isinstance(image_type, StructType)
    state = state_tables(spark, plan.spec.checkpoint / "spark", batch_id - 1, image_type)
    return state.where(F.col(cols.OP) != Op.DELETE.value).select(*schema.fieldNames())


def _lookup_tables(spark: SparkSession, plan: FeedPlan, batch_id: int, prior: Callable[[], DataFrame]) -> LookupTables:
    """The lookup views before ``batch_id``: this process's last ones if of ``batch_id - 1``, else the state's."""
    cached = _last_tables.get(_cache_key(spark, plan))
    if cached is not None and cached.batch_id == batch_id - 1:
        return cached
    state = prior()
    frames = {
        view: state.where(F.col(cols.TOPIC) == topic).select(SRC_KEY, IMAGE, cols.SEQ)
        for view, topic in plan.spec.lookup_topics.items()
    }
    return LookupTables(batch_id - 1, frames)


def _output(frame: DataFrame, op: Column, after: Column) -> DataFrame:
    """Feed output records (key JSON, ``op``, ``after``, META) of ``frame``'s rows."""
    return frame.select(KEY_JSON, op.alias(cols.OP), after.alias(AFTER), *META)


def process_enriched_batch(
    plan: FeedPlan,
    log: Log,
    batch: DataFrame,
    marker: BatchMarker,
    write: Callable[[FeedPlan, Log, DataFrame, BatchMarker], None],
) -> None:
    """One micro-batch of an enriched feed (see the module docstring); ``write`` appends the changes.

    ``batch``: the keys this micro-batch changed (:func:`derived_feeds.enrichment_state.latest_per_key`).
    """
    spark = batch.sparkSession
    spec, batch_id = plan.spec, marker.batch_id
    # Eager: the state store aggregation runs once per batch, whatever reads it after.
    batch_rows = batch.localCheckpoint()
    lookup_topics = set(spec.lookup_topics.values())
    is_truncate = F.col(SRC_KEY) == TRUNCATE_KEY
    summary = (  # per topic: its newest position (a lookup's truncate counts as a change of it), its truncate
        batch_rows.where(F.col(cols.TOPIC).isin(*lookup_topics) | is_truncate)
        .groupBy(cols.TOPIC)
        .agg(
            F.max(F.struct(*[F.col(c) for c in _POSITION])).alias("position"),
            F.max(F.when(is_truncate, F.struct(cols.SEQ))).alias("truncate"),
        )
        .collect()
    )
    positions = {row[cols.TOPIC]: row["position"] for row in summary if row[cols.TOPIC] in lookup_topics}
    # This batch's truncates are each topic's latest: the images before them are gone. The state
    # read back (prior) has the earlier truncates applied already (``state_tables``).
    truncated_at = {row[cols.TOPIC]: row["truncate"][cols.SEQ] for row in summary if row["truncate"] is not None}
    survives = not_truncated(truncated_at)
    changes = batch_rows.where(~is_truncate & survives)
    table_schema = StructType(
        [StructField(cols.TOPIC, StringType()), StructField(SRC_KEY, StringType()), changes.schema[IMAGE]]
        + [changes.schema[name] for name in (cols.OP, *META)]
    )
    prior_rows: list[DataFrame] = []

    def prior() -> DataFrame:  # read at most once per batch, only when needed
        if not prior_rows:
            prior_rows.append(_prior_state(spark, plan, batch_id, table_schema))
        return prior_rows[0]

    def prior_kept() -> DataFrame:  # the state before this batch without what its truncates took away
        return prior().where(survives) if truncated_at else prior()

    before = _lookup_tables(spark, plan, batch_id, prior)
    after_frames = dict(before.frames)
    for view, topic in spec.lookup_topics.items():
        if topic in positions:
            changed = changes.where(F.col(cols.TOPIC) == topic)
            kept = before.frames[view].join(changed.select(SRC_KEY), on=SRC_KEY, how="left_anti")
            if topic in truncated_at:
                kept = kept.where(newer_than(F.lit(truncated_at[topic]).cast(StringType())))
            current = changed.where(F.col(cols.OP) != Op.DELETE.value).select(SRC_KEY, IMAGE, cols.SEQ)
            after_frames[view] = kept.unionByName(current).localCheckpoint()
    trigger: Column | None = None
    for newest_position in positions.values():
        position = F.struct(
            F.lit(newest_position[cols.SEQ]).alias(cols.SEQ),
            F.lit(newest_position[cols.COMMIT_LSN]).cast("long").alias(cols.COMMIT_LSN),
            F.lit(newest_position[cols.TXN_INDEX]).cast("long").alias(cols.TXN_INDEX),
        )
        trigger = position if trigger is None else F.greatest(trigger, position)
    after = LookupTables(batch_id, after_frames)
    views_after = _views(after, plan)
    no_row = F.lit(None).cast(plan.output)

    # Changed source keys: their SQL rows with the lookups after this batch.
    source_changes = changes.where(F.col(cols.TOPIC) == spec.source_topic).withColumn(KEY_JSON, _source_key_json(plan))
    live = source_changes.where(F.col(cols.OP) != Op.DELETE.value)
    sql_rows = _output_rows(apply_sql(spark, _project(live, plan.source_struct), spec.config.sql, views_after), plan)
    upserts = live.join(sql_rows.select(KEY_JSON, AFTER), on=KEY_JSON, how="inner")
    never_in_feed = (F.col(CHANGES) == 1) & F.col(cols.OP).isin(Op.CREATE.value, Op.READ.value)
    deletes = source_changes.join(sql_rows.select(KEY_JSON), on=KEY_JSON, how="left_anti").where(~never_in_feed)
    records = _output(upserts, F.col(cols.OP), F.col(AFTER)).unionByName(
        _output(deletes, F.lit(Op.DELETE.value), no_row)
    )

    if trigger is not None:  # every other source key, before vs after the lookup changes
        rest = (
            prior_kept()
            .where(F.col(cols.TOPIC) == spec.source_topic)
            .join(source_changes.select(SRC_KEY), on=SRC_KEY, how="left_anti")
            .withColumn(KEY_JSON, _source_key_json(plan))
        )
        images = _project(rest, plan.source_struct)
        old = _output_rows(apply_sql(spark, images, spec.config.sql, _views(before, plan)), plan)
        new = _output_rows(apply_sql(spark, images, spec.config.sql, views_after), plan)
        changed = new.join(old.select(KEY_JSON, AFTER_JSON), on=[KEY_JSON, AFTER_JSON], how="left_anti")
        gone = old.select(KEY_JSON).join(new.select(KEY_JSON), on=KEY_JSON, how="left_anti")
        sources = rest.select(KEY_JSON, *META)
        records = records.unionByName(
            _output(changed.join(sources, on=KEY_JSON), F.lit(Op.UPDATE.value), F.col(AFTER))
        ).unionByName(_output(gone.join(sources, on=KEY_JSON), F.lit(Op.DELETE.value), no_row))
        # A lookup change re-emits with its (newer) sequence.
        position = F.greatest(F.struct(*[F.col(c) for c in _POSITION]), trigger)
        records = records.withColumns({name: position[name] for name in _POSITION})

    # A source truncate passes through with its own position (the rows after it are newer).
    if spec.source_topic in truncated_at:
        source_truncate = batch_rows.where(is_truncate & (F.col(cols.TOPIC) == spec.source_topic))
        no_key = source_truncate.withColumn(KEY_JSON, F.lit(None).cast(StringType()))
        records = records.unionByName(_output(no_key, F.col(cols.OP), no_row))

    write(plan, log, records, marker)
    key = _cache_key(spark, plan)
    for stale in [other for other in _last_tables if other[0] == key[0]]:  # an earlier query of this feed
        del _last_tables[stale]
    _last_tables[key] = after
