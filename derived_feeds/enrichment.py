"""Stream-table enrichment: a feed whose SQL joins other topics (``lookups``) read as tables.

``lookups: {customers: shop.public.customers}`` makes view ``customers`` hold the latest
value per key of that topic. Both sides arrive in one stream (the job reads the feed's
``from`` topic and its lookup topics together, so one Spark checkpoint orders them), and
the job keeps, under the feed's checkpoint, versioned state of:

* ``source``: the current image per key of the ``from`` topic,
* ``lookup_<view>``: the current image per key of each lookup topic,
* ``output``: the feed row last emitted per feed key (as JSON, for diffs).

State version ``b`` is the state after micro-batch ``b`` (Parquet, written from the driver).
Micro-batch ``b`` always starts from the newest complete version before ``b``, so a replay
of ``b`` (crash before Spark's commit) recomputes the same result; the append is
idempotent anyway (``feed_writer``). Two versions are kept.

Per micro-batch: changed source keys are recomputed (SQL over their current images with
the lookup views); when a lookup changed, every source key is recomputed (the SQL is
arbitrary, so which rows a lookup row reaches is only known by running it) and only rows
whose output differs from the last emitted one are written. A row that stops matching
becomes a delete. Re-emitted rows carry the sequence of the lookup change that caused
them when it is newer than their own, so sinks that apply only newer sequences take them
(the lookup and the source must come from one database for the sequences to compare).

Honest limits: this is driver-orchestrated Spark with Parquet state, not Spark's RocksDB
state store (the SQL is arbitrary Spark SQL, which ``transformWithStateInPandas``
cannot run); a lookup change costs a pass over the source state.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from derived_feeds import event_schema as cols
from derived_feeds.feed_schema import JSON_OPTIONS
from derived_feeds.feed_writer import BatchMarker
from derived_feeds.transform import AFTER, IMAGE, KEY_JSON, META, SRC_KEY, apply_sql, latest_changes
from log.base import Log
from log.envelope import Op

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

    from derived_feeds.feed_job import FeedPlan

_DONE = "_complete"
_AFTER_JSON = "__hw_after_json"


def _state_schema(image: StructType, meta: StructType) -> StructType:
    return StructType([StructField(SRC_KEY, StringType()), StructField(IMAGE, image), *[meta[name] for name in META]])


def _output_schema() -> StructType:
    return StructType([StructField(n, StringType()) for n in (SRC_KEY, KEY_JSON, _AFTER_JSON)])


def _previous_version(root: Path, batch_id: int) -> Path | None:
    if not root.exists():
        return None
    done = [int(p.name) for p in root.iterdir() if p.name.isdigit() and (p / _DONE).exists()]
    earlier = [n for n in done if n < batch_id]
    return root / str(max(earlier)) if earlier else None


def _load(spark: SparkSession, previous: Path | None, part: str, schema: StructType) -> DataFrame:
    if previous is None or not (previous / part).exists():
        return spark.createDataFrame([], schema)
    return spark.read.schema(schema).parquet(str(previous / part))


def _project(frame: DataFrame, image: StructType) -> DataFrame:
    """Latest changes of one topic, their image cut to that topic's own columns."""
    projected = F.struct(*[F.col(IMAGE)[name].alias(name) for name in image.fieldNames()])
    return frame.select(SRC_KEY, cols.OP, projected.alias(IMAGE), *META)


def _updated(state: DataFrame, changes: DataFrame) -> DataFrame:
    """``state`` with ``changes`` applied: changed keys replaced, deleted keys removed."""
    kept = state.join(changes.select(SRC_KEY), on=SRC_KEY, how="left_anti")
    current = changes.where(F.col(cols.OP) != Op.DELETE.value).select(SRC_KEY, IMAGE, *META)
    return kept.unionByName(current)


def _save(frame: DataFrame, path: Path) -> DataFrame:
    frame.write.mode("overwrite").parquet(str(path))
    return frame.sparkSession.read.schema(frame.schema).parquet(str(path))


def _key_match(key: tuple[str, ...]) -> Column:
    condition: Column | None = None
    for i in range(len(key)):
        term = F.col(f"__hw_k{i}").eqNullSafe(F.col(f"__hw_o{i}"))
        condition = term if condition is None else condition & term
    assert condition is not None
    return condition


def process_enriched_batch(
    plan: FeedPlan,
    log: Log,
    batch: DataFrame,
    marker: BatchMarker,
    write: Callable[[FeedPlan, Log, DataFrame, BatchMarker], None],
) -> None:
    """One micro-batch of an enriched feed (see the module docstring); ``write`` appends the changes."""
    spark = batch.sparkSession
    spec = plan.spec
    root = spec.state_dir
    previous = _previous_version(root, marker.batch_id)
    target = root / str(marker.batch_id)
    shutil.rmtree(target, ignore_errors=True)  # a half-written attempt of this batch

    latest = latest_changes(batch).persist()
    try:
        meta = StructType([latest.schema[name] for name in META])
        source_changes = _project(latest.where(F.col(cols.TOPIC) == spec.source_topic), plan.source_struct)
        source_schema = _state_schema(plan.source_struct, meta)
        source_state = _save(
            _updated(_load(spark, previous, "source", source_schema), source_changes), target / "source"
        )
        views: dict[str, DataFrame] = {}
        trigger: Column | None = None
        lookup_changed = False
        for view, topic in spec.lookup_topics.items():
            struct = plan.lookup_structs[view]
            changes = _project(latest.where(F.col(cols.TOPIC) == topic), struct)
            state = _save(
                _updated(_load(spark, previous, f"lookup_{view}", _state_schema(struct, meta)), changes),
                target / f"lookup_{view}",
            )
            views[view] = state.select(f"{IMAGE}.*")
            newest = changes.agg(F.max(F.struct(*[F.col(c) for c in (cols.SEQ, cols.COMMIT_LSN, cols.TXN_INDEX)])))
            row = newest.first()
            if row is not None and row[0] is not None:
                lookup_changed = True
                current = F.struct(
                    F.lit(row[0][cols.SEQ]).alias(cols.SEQ),
                    F.lit(row[0][cols.COMMIT_LSN]).cast("long").alias(cols.COMMIT_LSN),
                    F.lit(row[0][cols.TXN_INDEX]).cast("long").alias(cols.TXN_INDEX),
                )
                trigger = current if trigger is None else F.greatest(trigger, current)

        changed_keys = source_changes.select(SRC_KEY)
        affected = source_state if lookup_changed else source_state.join(changed_keys, on=SRC_KEY, how="left_semi")
        changed_ops = source_changes.select(SRC_KEY, F.col(cols.OP).alias("__hw_changed_op"))
        affected = affected.join(changed_ops, on=SRC_KEY, how="left").withColumn(
            cols.OP, F.coalesce(F.col("__hw_changed_op"), F.lit(Op.UPDATE.value))
        )
        if trigger is not None:  # a lookup change re-emits with its (newer) sequence
            own = F.struct(F.col(cols.SEQ), F.col(cols.COMMIT_LSN), F.col(cols.TXN_INDEX))
            position = F.greatest(own, trigger)
            affected = affected.withColumns(
                {name: position[name] for name in (cols.SEQ, cols.COMMIT_LSN, cols.TXN_INDEX)}
            )

        output = apply_sql(spark, affected.select(f"{IMAGE}.*"), spec.config.sql, views)
        key = spec.key
        left = affected.select(
            SRC_KEY, cols.OP, *META, *[F.col(IMAGE)[name].alias(f"__hw_k{i}") for i, name in enumerate(key)]
        )
        right = output.select(
            F.struct(*[F.col(f"`{c}`") for c in output.columns]).alias(AFTER),
            *[F.col(f"`{name}`").alias(f"__hw_o{i}") for i, name in enumerate(key)],
        )
        key_json = F.to_json(F.struct(*[F.col(f"__hw_k{i}").alias(name) for i, name in enumerate(key)]), JSON_OPTIONS)
        new = (
            left.join(right, on=_key_match(key), how="inner")
            .withColumn(KEY_JSON, key_json)
            .withColumn(_AFTER_JSON, F.to_json(F.col(AFTER), JSON_OPTIONS))
        )
        output_prev = _load(spark, previous, "output", _output_schema())
        upserts = new.join(output_prev.select(KEY_JSON, _AFTER_JSON), on=[KEY_JSON, _AFTER_JSON], how="left_anti")

        deleted = source_changes.where(F.col(cols.OP) == Op.DELETE.value).select(SRC_KEY, *META)
        deciders = deleted.unionByName(affected.select(SRC_KEY, *META))
        deletes = (
            output_prev.select(SRC_KEY, KEY_JSON)
            .join(deciders, on=SRC_KEY, how="inner")
            .join(new.select(KEY_JSON), on=KEY_JSON, how="left_anti")
        )
        after_type = right.schema[AFTER].dataType
        changes_out = upserts.select(KEY_JSON, cols.OP, AFTER, *META).unionByName(
            deletes.select(
                KEY_JSON, F.lit(Op.DELETE.value).alias(cols.OP), F.lit(None).cast(after_type).alias(AFTER), *META
            )
        )
        touched = deciders.select(SRC_KEY)
        output_next = output_prev.join(touched, on=SRC_KEY, how="left_anti").unionByName(
            new.select(SRC_KEY, KEY_JSON, _AFTER_JSON)
        )
        changes_out = _save(changes_out, target / "changes")
        _save(output_next, target / "output")
        (target / _DONE).touch()
        write(plan, log, changes_out, marker)
    finally:
        latest.unpersist()
    for old in root.iterdir():
        if old.name.isdigit() and int(old.name) < marker.batch_id - 1:
            shutil.rmtree(old, ignore_errors=True)
