"""Maintained views: after every micro-batch a feed's topic equals its SQL over the current rows, by diffs.

For every feed whose SQL is not the one-pass projection (:mod:`derived_feeds.plan_class`):
its ``from`` topic and lookup topics are read together, and the latest change per
``(topic, key)`` is kept in Spark's RocksDB state store (:mod:`derived_feeds.enrichment_state`,
changelog checkpointing). The process also keeps the current rows of every topic as a
checkpointed DataFrame (``rows``, rebuilt from the state store after a restart or a
replay), and, when the plan does not make the feed key unique, the index of the feed's
current keys.

Per micro-batch ``b`` (``prev``: the rows after ``b - 1``; ``next``: after ``b``):

1. **Region.** Which output rows can differ. Every view carries its record key as a hidden
   column (``__hw_key_<view>``), and :meth:`~derived_feeds.catalyst.Catalyst.with_hidden`
   passes them up through projections, so each row of the SQL (or below its aggregate)
   knows the source row and lookup rows it came from. Each comes from one source row, so
   the region is a set of source keys: those the batch changed, and those whose rows reached
   a changed lookup row over ``prev`` or over ``next``. Row shapes (projection, join)
   recompute the SQL over those source rows; grouped shapes (GROUP BY, DISTINCT) the groups
   their rows are in before or after (the group keys of the old and new images), each from
   all of its rows (so min, max and count(DISTINCT) are exact). A truncate makes the region
   everything, and so does a batch that changed at least half of the source's rows in a
   grouped shape (finding the region would then cost more than recomputing every group).
2. **Diff.** The region's rows over ``prev`` (what the feed holds, by induction) and over
   ``next``, matched by the feed key: a key only in ``next`` is a create, a key in both whose
   row differs an update, a key only in ``prev`` a delete (and its tombstone). Nothing else
   is written: an unchanged row or a key that never had a row makes no record. Grouped shapes
   keep their whole output on the driver (up to :data:`KEPT_OUTPUT_ROWS` rows), so when the
   region is everything the old side is that output, not a second pass over ``prev``.
3. **Key check.** Two rows of ``next``'s region with one key, or a new key that a row
   outside the region already has (the key index), stop the feed with
   :class:`~derived_feeds.errors.FeedKeyError` before anything is written: keeping one of the
   rows would make the feed differ from its SQL, and the cure is a better key in the config.

Every record of ``b`` carries the newest position of all changes read so far (``__hw_seq``
and the rest of the source block of the change that has it): a derived row comes from many
changes, and sinks that apply only newer sequences must take each batch's records. A
replayed batch recomputes the same records from the state of ``b - 1``; the append is
idempotent anyway (``feed_writer``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa  # type: ignore[import-untyped]  # no stubs
import pyarrow.compute as pc  # type: ignore[import-untyped]
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from derived_feeds.catalyst import HIDDEN_PREFIX, Catalyst, analyzed, hidden_view
from derived_feeds.enrichment_state import TRUNCATE_KEY, not_truncated, state_tables
from derived_feeds.errors import FeedKeyError
from derived_feeds.expectations import with_checks
from derived_feeds.feed_output import AFTER_JSON, KEY_JSON, META, diff_rows
from derived_feeds.feed_schema import JSON_OPTIONS, wire_column, wire_struct
from derived_feeds.feed_writer import BatchMarker
from derived_feeds.plan_class import grouping_expressions, top_chain
from derived_feeds.transform import AFTER, IMAGE, SOURCE_VIEW, SRC_KEY, apply_sql
from log.envelope import Op
from spark_log import source_schema as cols

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from derived_feeds.feed_job import FeedPlan

#: The columns of the kept rows: each topic's current row images by key (and their sequence, for truncates).
ROW_COLUMNS = (cols.TOPIC, SRC_KEY, IMAGE, cols.SEQ)
_POSITION = "__hw_position"
#: A batch that changed at least this share of the source's rows recomputes the whole view (no region).
EVERYTHING_SHARE = 0.5
#: Grouped shapes keep their whole output on the driver up to this many rows (the old side of the next diff).
KEPT_OUTPUT_ROWS = 1_000_000
_SIDE = "__hw_side"
_META_TYPES = {
    **dict.fromkeys(META, pa.string()),
    cols.COMMIT_LSN: pa.int64(),
    cols.TXN_INDEX: pa.int64(),
    cols.COMMIT_TS: pa.timestamp("us", tz="UTC"),
}


@dataclass
class KeptRows:
    """What a feed query keeps between micro-batches (valid for the batch after ``batch_id`` only)."""

    batch_id: int
    session: str
    rows: DataFrame
    #: The feed's current keys (``__hw_key``), when the plan does not make them unique.
    keys: pa.Array | None
    #: The newest META of every change read so far (a Row), None before the first.
    position: Any
    #: Grouped shapes: how many source rows ``rows`` holds (row shapes do not use it: None).
    source_rows: int | None
    #: Grouped shapes: the feed's whole current output (``_output``'s columns), when this process holds it.
    output: pa.Table | None = None


def views(
    plan: FeedPlan, rows: DataFrame, source_keys: DataFrame | None = None
) -> tuple[DataFrame, dict[str, DataFrame]]:
    """The SQL's views over ``rows``: ``source`` (cut to ``source_keys`` when given) and each lookup.

    Each view has its topic's own columns and its record key as the hidden column ``__hw_key_<view>``.
    """
    spec = plan.spec

    def view(name: str, topic: str, struct: StructType) -> DataFrame:
        frame = rows.where(F.col(cols.TOPIC) == topic)
        if name == SOURCE_VIEW and source_keys is not None:
            frame = frame.join(F.broadcast(source_keys), on=SRC_KEY, how="left_semi")
        images = [F.col(IMAGE)[column].alias(column) for column in struct.fieldNames()]
        return frame.select(*images, F.col(SRC_KEY).alias(HIDDEN_PREFIX + name))

    source = view(SOURCE_VIEW, spec.source_topic, plan.source_struct)
    lookups = {name: view(name, topic, plan.lookup_structs[name]) for name, topic in spec.lookup_topics.items()}
    return source, lookups


def sql_over(plan: FeedPlan, rows: DataFrame, source_keys: DataFrame | None = None) -> DataFrame:
    """The feed's SQL over ``rows`` (analyzed, not run)."""
    source, lookups = views(plan, rows, source_keys)
    return apply_sql(rows.sparkSession, source, plan.spec.config.sql, lookups)


class Region:
    """The part of the output a micro-batch can change (module docstring, step 1).

    Every output row (row shapes) or row below the aggregate (grouped shapes) comes from one
    source row, so the region is a set of source keys: those the batch changed, and those
    whose rows reached a changed lookup row before or after the batch (found by the hidden
    key columns). Row shapes recompute the SQL over those source rows on both sides; grouped
    shapes recompute the groups those source rows are in, before or after.
    """

    def __init__(self, plan: FeedPlan, catalyst: Catalyst, changed: Mapping[str, DataFrame], everything: bool) -> None:
        """``changed``: per view the record keys (``__hw_src_key``) of its rows this batch changed."""
        self.plan, self.catalyst, self.changed, self.everything = plan, catalyst, changed, everything

    def _lineage(self, state: DataFrame) -> DataFrame:
        """The SQL's rows (row shapes) or the rows below its aggregate over ``state``, with the hidden key columns.

        Hidden columns are renamed ``__hw_key_<view>#<position>`` (a lookup joined twice has two).
        """
        plan = analyzed(sql_over(self.plan, state))
        if self.plan.view_shape.grouped:
            plan = top_chain(plan)[1].child()
        lineage = self.catalyst.frame(self.catalyst.with_hidden(plan))
        named = [F.col(f"`{n}`").alias(f"{n}#{i}") for i, n in enumerate(lineage.columns) if hidden_view(n)]
        return lineage.select(*named)

    def source_keys(self, before: DataFrame, after: DataFrame) -> DataFrame:
        """The region's source keys (``__hw_src_key``): changed, or reaching a changed lookup row in either state."""
        parts = [self.changed[SOURCE_VIEW]] if SOURCE_VIEW in self.changed else []
        lookups = [view for view in self.changed if view != SOURCE_VIEW]
        for state in (before, after) if lookups else ():
            lineage = self._lineage(state)
            source = next(name for name in lineage.columns if _hidden_of(name) == SOURCE_VIEW)
            for name in lineage.columns:
                if _hidden_of(name) in lookups:
                    keys = self.changed[_hidden_of(name)].withColumnRenamed(SRC_KEY, "__hw_touched")
                    touched = lineage.join(F.broadcast(keys), lineage[name] == keys["__hw_touched"], "left_semi")
                    parts.append(touched.select(F.col(f"`{source}`").alias(SRC_KEY)))
        if not parts:
            return before.select(SRC_KEY).limit(0)
        if len(parts) == 1:  # the changed source keys: a filter of the checkpointed batch
            return parts[0]
        return functools.reduce(lambda a, b: a.unionByName(b), parts).distinct().localCheckpoint()

    def rows(self, state: DataFrame, keys: DataFrame | None) -> DataFrame:
        """Row shapes: the SQL's rows over ``state`` from the source rows ``keys`` (all when None)."""
        return sql_over(self.plan, state, keys)

    def groups(self, state: DataFrame, keys: DataFrame | None) -> DataFrame | None:
        """Grouped shapes: the groups (``__hw_g<i>``) of the rows below the aggregate from the source rows ``keys``.

        ``keys`` None: from every source row of ``state``.
        None when the aggregate has no GROUP BY (its one row is recomputed whenever anything changed).
        """
        catalyst = self.catalyst
        _, node = top_chain(analyzed(sql_over(self.plan, state, keys)))
        grouping = grouping_expressions(node)
        if not grouping:
            return None
        columns = [catalyst.column(e).alias(f"__hw_g{i}") for i, e in enumerate(grouping)]
        return catalyst.frame(node.child()).select(*columns)

    def grouped_rows(self, state: DataFrame, groups: DataFrame | None) -> DataFrame:
        """Grouped shapes: the SQL's rows over ``state`` of ``groups`` only (each group from all of its rows)."""
        frame = sql_over(self.plan, state)
        if groups is None:
            return frame
        catalyst = self.catalyst
        chain, node = top_chain(analyzed(frame))
        child = catalyst.frame(node.child())
        values = [catalyst.column(e) for e in grouping_expressions(node)]
        condition = functools.reduce(
            lambda a, b: a & b, [value.eqNullSafe(groups[f"__hw_g{i}"]) for i, value in enumerate(values)]
        )
        region = analyzed(child.join(F.broadcast(groups), condition, "left_semi"))
        return catalyst.frame(catalyst.rebuilt(chain, node.withNewChildren(catalyst.to_seq([region]))))


def _hidden_of(column: str) -> str:
    """The view of a hidden column renamed ``__hw_key_<view>#<position>`` (several may share a name)."""
    return hidden_view(column.split("#", maxsplit=1)[0])


def _output(plan: FeedPlan, frame: DataFrame, *, checked: bool = False) -> DataFrame:
    """SQL rows as the feed key (JSON) and the row as JSON; with ``checked``, the expectations' flags too."""
    output = plan.output
    row = F.struct(*[F.col(f"`{name}`") for name in output.fieldNames()])
    key = F.struct(*[wire_column(F.col(f"`{k}`"), output[k].dataType).alias(k) for k in plan.spec.key])
    rows = frame.select(
        F.to_json(key, JSON_OPTIONS).alias(KEY_JSON),
        row.alias(AFTER),
        F.to_json(wire_struct(row, output), JSON_OPTIONS).alias(AFTER_JSON),
    )
    flags = [check.flag for check in plan.checks] if checked else []
    checked_rows: DataFrame = with_checks(rows, plan.checks if checked else [])
    return checked_rows.select(KEY_JSON, AFTER_JSON, *flags)


def _kept_rows(spark: SparkSession, plan: FeedPlan, batch_id: int, image_type: Any) -> KeptRows:
    """The rows after batch ``batch_id - 1``: this process's, else read back from the state store."""
    session = str(spark._jsparkSession.sessionUUID())
    kept: KeptRows | None = plan.kept
    if kept is not None and kept.batch_id == batch_id - 1 and kept.session == session:
        return kept
    schema = StructType(
        [
            StructField(cols.TOPIC, StringType()),
            StructField(SRC_KEY, StringType()),
            StructField(IMAGE, image_type),
            StructField(cols.SEQ, StringType()),
        ]
    )
    position = None
    if batch_id == 0:
        rows = spark.createDataFrame([], schema)
    else:
        state = state_tables(spark, plan.spec.checkpoint / "spark", batch_id - 1, image_type, plan.row_schemas)
        position = state.agg(F.max(F.struct(*META)).alias(_POSITION)).collect()[0][_POSITION]
        rows = state.where(F.col(cols.OP) != Op.DELETE.value).select(*ROW_COLUMNS).localCheckpoint()
    keys = None
    if not plan.view_shape.unique_by_plan:
        keys = _output(plan, sql_over(plan, rows)).select(KEY_JSON).toArrow().column(KEY_JSON).combine_chunks()
    return KeptRows(batch_id - 1, session, rows, keys, position, _source_rows(plan, rows))


def _source_rows(plan: FeedPlan, rows: DataFrame) -> int | None:
    """How many of the kept ``rows`` are the source's, for grouped shapes (the share of a batch's changes)."""
    return rows.where(F.col(cols.TOPIC) == plan.spec.source_topic).count() if plan.view_shape.grouped else None


def process_maintained_batch(
    plan: FeedPlan, batch: DataFrame, marker: BatchMarker, append: Callable[[pa.Table], None]
) -> None:
    """One micro-batch of a maintained view (module docstring); ``append`` writes its records.

    ``batch``: the keys this micro-batch changed (:func:`derived_feeds.enrichment_state.latest_per_key`).
    ``append`` gets :func:`derived_feeds.feed_output.diff_rows`' records with this batch's position.
    """
    spark = batch.sparkSession
    spec, shape = plan.spec, plan.view_shape
    batch_rows = batch.localCheckpoint()  # eager: the state store aggregation runs once per batch
    image_type = batch_rows.schema[IMAGE].dataType
    kept = _kept_rows(spark, plan, marker.batch_id, image_type)
    is_truncate = F.col(SRC_KEY) == TRUNCATE_KEY
    summary = (
        batch_rows.groupBy(cols.TOPIC)
        .agg(
            F.max(F.struct(*META)).alias(_POSITION),
            F.max(F.when(is_truncate, F.struct(cols.SEQ))).alias("truncate"),
            F.count(F.lit(1)).alias("changed"),
        )
        .collect()
    )
    truncated_at = {row[cols.TOPIC]: row["truncate"][cols.SEQ] for row in summary if row["truncate"] is not None}
    positions = [row[_POSITION] for row in summary] + ([kept.position] if kept.position is not None else [])
    if not positions:  # nothing read yet and nothing now (Spark runs a stateful query's first batch empty)
        plan.kept = KeptRows(marker.batch_id, kept.session, kept.rows, kept.keys, None, kept.source_rows, kept.output)
        return
    position = max(positions, key=_order)
    survives = not_truncated(truncated_at)
    changes = batch_rows.where(~is_truncate & survives)
    prev = kept.rows
    before = prev.where(survives) if truncated_at else prev
    live = changes.where(F.col(cols.OP) != Op.DELETE.value).select(*ROW_COLUMNS)
    changed_keys = F.broadcast(changes.select(cols.TOPIC, SRC_KEY))
    after = before.join(changed_keys, on=[cols.TOPIC, SRC_KEY], how="left_anti")
    rows_after = after.unionByName(live).localCheckpoint()

    topics = {SOURCE_VIEW: spec.source_topic, **spec.lookup_topics}
    changed_topics = {row[cols.TOPIC] for row in summary}
    changed = {
        view: changes.where(F.col(cols.TOPIC) == topic).select(SRC_KEY)
        for view, topic in topics.items()
        if topic in changed_topics
    }
    changed_source = sum(row["changed"] for row in summary if row[cols.TOPIC] == spec.source_topic)
    # A truncate, or a batch that changed most source rows: recomputing everything costs less than finding the region.
    most = kept.source_rows is not None and changed_source >= kept.source_rows * EVERYTHING_SHARE
    everything = bool(truncated_at) or most
    region = Region(plan, Catalyst(spark), changed, everything=everything)
    keys = None if region.everything else region.source_keys(prev, rows_after)
    groups = None
    if shape.grouped:
        if keys is not None:
            # No lookups: the source rows after the batch of the changed keys are the batch's own (no join).
            only_source = not spec.lookup_topics and list(changed) == [SOURCE_VIEW]
            new_groups = region.groups(live, None) if only_source else region.groups(rows_after, keys)
            old_groups = region.groups(prev, keys)
            if old_groups is not None and new_groups is not None:
                groups = old_groups.unionByName(new_groups).distinct().localCheckpoint()
        over: Callable[[DataFrame], DataFrame] = functools.partial(region.grouped_rows, groups=groups)
    else:
        over = functools.partial(region.rows, keys=keys)
    new = over(rows_after)
    if region.everything and kept.output is not None:  # the old side is what the feed holds
        old_rows, new_rows = kept.output, _output(plan, new, checked=True).toArrow()
    else:  # one action for both sides: the region before and after, tagged
        sides = (
            _output(plan, over(prev), checked=True)
            .withColumn(_SIDE, F.lit(0))
            .unionByName(_output(plan, new, checked=True).withColumn(_SIDE, F.lit(1)))
            .toArrow()
        )
        is_new = pc.equal(sides.column(_SIDE), 1)
        old_rows, new_rows = (sides.filter(side).drop_columns([_SIDE]) for side in (pc.invert(is_new), is_new))
    records = diff_rows(old_rows, new_rows, plan.checks)
    _check_keys(plan, old_rows, new_rows, kept.keys)
    for name in META:  # every record of the batch at the newest position read so far
        records = records.append_column(name, pa.array([position[name]] * records.num_rows, _META_TYPES[name]))
    append(records)

    index = None
    if kept.keys is not None:
        kept_keys = kept.keys.filter(_not_among(kept.keys, old_rows))
        index = pa.concat_arrays([kept_keys, new_rows.column(KEY_JSON).combine_chunks()])
    output = None
    if shape.grouped and region.everything:
        output = new_rows
    elif shape.grouped and kept.output is not None:  # the region's rows replaced
        output = pa.concat_tables([kept.output.filter(_not_among(kept.output.column(KEY_JSON), old_rows)), new_rows])
    if output is not None and output.num_rows > KEPT_OUTPUT_ROWS:
        output = None
    source_rows = _source_rows(plan, rows_after)
    plan.kept = KeptRows(marker.batch_id, kept.session, rows_after, index, position, source_rows, output)
    for frame in (prev, batch_rows, groups, keys):  # their blocks now, not when the JVM collects them
        if frame is not None:
            release_checkpoint(frame)


def _not_among(keys: pa.Array | pa.ChunkedArray, rows: pa.Table) -> pa.Array:
    """Which of the feed keys ``keys`` no row of ``rows`` has (a mask)."""
    return pc.invert(pc.is_in(keys, value_set=rows.column(KEY_JSON).combine_chunks()))


def release_checkpoint(frame: DataFrame) -> None:
    """Drop the blocks of ``frame`` if it is a local checkpoint (reading it afterwards fails); else nothing.

    Spark keeps a local checkpoint's blocks until the JVM collects its RDD; a maintained view
    checkpoints the current rows every micro-batch, so without this the old copies crowd the heap.
    """
    node = frame._jdf.queryExecution().analyzed()
    if node.nodeName() == "LogicalRDD":
        node.rdd().unpersist(False)


def _order(position: Any) -> tuple[str, int, int]:
    """A META row's place in the source order (``__hw_seq``, then LSN and index; nulls first)."""
    return (position[cols.SEQ] or "", position[cols.COMMIT_LSN] or -1, position[cols.TXN_INDEX] or -1)


def _check_keys(plan: FeedPlan, old_rows: pa.Table, new_rows: pa.Table, index: pa.Array | None) -> None:
    """Stop the feed when two rows of the SQL would have one key (module docstring, step 3)."""
    keys = new_rows.column(KEY_JSON).combine_chunks()
    counts = pc.value_counts(keys)
    repeated = counts.filter(pc.greater(counts.field("counts"), 1))
    if len(repeated):
        raise FeedKeyError(plan.spec.name, repeated[0]["values"].as_py(), repeated[0]["counts"].as_py())
    if index is None:
        return
    fresh = keys.filter(_not_among(keys, old_rows))
    taken = fresh.filter(pc.is_in(fresh, value_set=index))
    if len(taken):
        raise FeedKeyError(plan.spec.name, taken[0].as_py(), 2)
