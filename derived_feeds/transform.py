"""The feed computation's Spark steps as pure DataFrame -> DataFrame functions (no I/O).

Per micro-batch of the feed's input (``headwater_log`` rows):

1. :func:`latest_changes` keeps, per source key, the latest row change by ``__hw_seq``
   (offset breaks ties) and remembers the key's first op in the batch; a plain feed reads
   its input with ``latestPerKey``, so the source has done this per log partition already
   and :func:`reduced_changes` is a projection (no shuffle);
2. :func:`apply_sql` runs the feed's SQL over the current images (``source`` view);
3. :func:`change_rows` and :func:`output_rows` are what the driver pairs by the feed key
   (``derived_feeds.feed_events.pair_changes``) to decide each key's event: the SQL's row
   as an upsert (the source op ``c``/``u``/``r``), or a delete when the source row was
   deleted or no longer passes the SQL.

Why deletes without state (decision): a key whose latest image fails the filter gets a
delete (and a tombstone) whether or not it was in the feed before. Deleting an absent key
is harmless downstream (SCD1: no-op, SCD2: closes nothing; compaction removes the pair),
and it keeps the feed stateless: restarts and reprocessing need nothing but the log. The
one cheap exception: a key whose first change in the batch is an insert cannot have been
in the feed, so a failing insert produces nothing.

Invariant: every output event carries its source change's ``(commit_lsn, txn_index)``
and ``__hw_seq``, so downstream sinks apply it exactly as they would the raw change.
Feed keys are source columns passed through the SQL unchanged (checked at start).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from derived_feeds import event_schema as cols
from derived_feeds import feed_events
from derived_feeds.expectations import Check, with_checks
from derived_feeds.feed_events import AFTER_JSON
from derived_feeds.feed_schema import JSON_OPTIONS, wire_struct
from log.envelope import Op

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: Columns of :func:`latest_changes` besides the image.
SRC_KEY = "__hw_src_key"
FIRST_OP = cols.FIRST_OP
IMAGE = "__hw_image"
#: The feed event's row (a STRUCT of the SQL's columns) in frames of feed events.
AFTER = "after"
#: The feed key as JSON text (the feed record's key).
KEY_JSON = feed_events.KEY_JSON
#: The source position and provenance every feed event keeps.
META = feed_events.META
ROW_OPS = (Op.CREATE.value, Op.UPDATE.value, Op.READ.value, Op.DELETE.value)
SOURCE_VIEW = "source"


def latest_changes(events: DataFrame) -> DataFrame:
    """One row per ``(topic, key)``: its latest change (``op``, image, META) and its first op in the batch.

    The image is ``after`` for upserts and ``before`` for deletes. Events without a key
    (keyless tables, truncates) stay one row each. Messages and tombstones are left out.
    One aggregation over one scan of ``events``: every later step reads its result, so the
    source is decoded once per micro-batch (Spark reuses the exchange).
    """
    image = F.when(F.col(cols.OP) == Op.DELETE.value, F.col(cols.BEFORE)).otherwise(F.col(cols.AFTER))
    rows = events.where(F.col(cols.OP).isin(*ROW_OPS, Op.TRUNCATE.value))
    group = F.coalesce(F.col(cols.KEY), F.format_string("\u0000%d:%d", F.col(cols.PARTITION), F.col(cols.OFFSET)))
    order = F.struct(F.col(cols.SEQ), F.col(cols.PARTITION), F.col(cols.OFFSET))
    latest = F.max_by(F.struct(F.col(cols.KEY).alias(SRC_KEY), cols.OP, image.alias(IMAGE), *META), order)
    return (
        rows.groupBy(F.col(cols.TOPIC), group.alias("__hw_group"))
        .agg(latest.alias("last"), F.min_by(F.col(cols.OP), order).alias(FIRST_OP))
        .select(cols.TOPIC, "last.*", FIRST_OP)
    )


def reduced_changes(events: DataFrame) -> DataFrame:
    """:func:`latest_changes` of a read the source already reduced per key (option ``latestPerKey``).

    The source applied the same rule per log partition (``derived_feeds.latest_per_key``),
    so this is a projection: no aggregation, no shuffle.
    """
    image = F.when(F.col(cols.OP) == Op.DELETE.value, F.col(cols.BEFORE)).otherwise(F.col(cols.AFTER))
    return events.select(
        cols.TOPIC, F.col(cols.KEY).alias(SRC_KEY), cols.OP, image.alias(IMAGE), *META, F.col(FIRST_OP)
    )


def current_images(latest: DataFrame) -> DataFrame:
    """The rows of the ``source`` view: the current image of every key not deleted."""
    return latest.where(~F.col(cols.OP).isin(Op.DELETE.value, Op.TRUNCATE.value)).select(f"{IMAGE}.*")


def apply_sql(spark: SparkSession, images: DataFrame, sql: str, views: Mapping[str, DataFrame] = {}) -> DataFrame:
    """The feed's SQL over ``images`` as view ``source`` (and ``views`` under their names)."""
    images.createOrReplaceTempView(SOURCE_VIEW)
    for name, frame in views.items():
        frame.createOrReplaceTempView(name)
    return spark.sql(sql)


# --------------------------------------------------------------------------- driver-side pairing


def change_rows(latest: DataFrame, key: Sequence[str]) -> DataFrame:
    """What the driver pairs (``feed_events.pair_changes``): per latest change its feed key as JSON, ops, META.

    The key JSON is built from the source image (null for truncates, which have no key);
    deletes carry it as their ``before``.
    """
    key_json = F.to_json(F.struct(*[F.col(IMAGE)[name].alias(name) for name in key]), JSON_OPTIONS)
    return latest.select(
        F.when(F.col(cols.OP) != Op.TRUNCATE.value, key_json).alias(KEY_JSON), cols.OP, FIRST_OP, *META
    )


def output_rows(output: DataFrame, key: Sequence[str], image: StructType, checks: Sequence[Check] = ()) -> DataFrame:
    """The SQL's rows for the driver: the feed key as JSON (typed as in the source image), the row as JSON, checks.

    The key columns are cast to the image's types so the JSON equals :func:`change_rows`'
    wherever the source's key equals the SQL row's key.
    """
    after_type = output.schema
    row = F.struct(*[F.col(f"`{c}`") for c in output.columns])
    key_json = F.to_json(
        F.struct(*[F.col(f"`{name}`").cast(image[name].dataType).alias(name) for name in key]), JSON_OPTIONS
    )
    checked: DataFrame = with_checks(output.select(row.alias(AFTER), key_json.alias(KEY_JSON)), checks)
    return checked.select(
        KEY_JSON,
        F.to_json(wire_struct(F.col(AFTER), after_type), JSON_OPTIONS).alias(AFTER_JSON),
        *[check.flag for check in checks],
    )
