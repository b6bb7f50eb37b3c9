"""The feed computation as pure DataFrame -> DataFrame steps (no I/O; unit-tested on small frames).

Per micro-batch of the feed's input (``headwater_log`` rows):

1. :func:`latest_changes` keeps, per source key, the latest row change by ``__hw_seq``
   (offset breaks ties) and remembers the key's first op in the batch;
2. :func:`apply_sql` runs the feed's SQL over the current images (``source`` view);
3. :func:`feed_changes` pairs each latest change with its SQL output by the feed key and
   decides the feed's event: the SQL's row as an upsert (the source op ``c``/``u``/``r``),
   or a delete when the source row was deleted or no longer passes the SQL.

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
from derived_feeds.expectations import Check, with_checks
from derived_feeds.feed_events import AFTER_JSON
from derived_feeds.feed_schema import JSON_OPTIONS, wire_struct
from log.envelope import CONNECTOR, EVENT_VERSION, Op

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

#: Columns of :func:`latest_changes` besides the image.
SRC_KEY = "__hw_src_key"
FIRST_OP = cols.FIRST_OP
IMAGE = "__hw_image"
#: Columns of :func:`feed_changes`.
KEY_JSON = "__hw_key"
AFTER = "after"
#: The source position and provenance every feed event keeps.
META = (
    cols.SEQ,
    cols.COMMIT_LSN,
    cols.TXN_INDEX,
    cols.COMMIT_TS,
    cols.SNAPSHOT,
    cols.SOURCE_DB,
    cols.SOURCE_SCHEMA,
    cols.SOURCE_TABLE,
)
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


def truncates(latest: DataFrame) -> DataFrame:
    """The batch's truncates (from :func:`latest_changes`), as feed events without key or image."""
    return latest.where(F.col(cols.OP) == Op.TRUNCATE.value).select(
        F.lit(None).cast("string").alias(KEY_JSON), F.col(cols.OP), *META
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


def _key_alias(index: int) -> str:
    return f"__hw_k{index}"


def feed_changes(latest: DataFrame, output: DataFrame, key: Sequence[str]) -> DataFrame:
    """Pair latest changes with the SQL output by the feed key; decide each key's feed event.

    Columns: ``__hw_key`` (the key as JSON, from the source image), ``op``, ``after`` (the
    SQL's row, null for deletes) and META. Rows: an upsert per key whose current image
    passes; a delete per key deleted in the source or whose image no longer passes, except
    keys whose first change in the batch was an insert (never in the feed).
    """
    left = latest.where(F.col(cols.OP) != Op.TRUNCATE.value).select(
        *[F.col(IMAGE)[name].alias(_key_alias(i)) for i, name in enumerate(key)],
        cols.OP,
        FIRST_OP,
        *META,
    )
    right = output.select(
        F.struct(*[F.col(f"`{c}`") for c in output.columns]).alias(AFTER),
        *[F.col(f"`{name}`").alias(f"__hw_o{i}") for i, name in enumerate(key)],
    )
    condition: Column | None = None
    for i in range(len(key)):
        term = F.col(_key_alias(i)).eqNullSafe(F.col(f"__hw_o{i}"))
        condition = term if condition is None else condition & term
    joined = left.join(right, on=condition, how="left")
    passed = F.col(AFTER).isNotNull() & (F.col(cols.OP) != Op.DELETE.value)
    op = (
        F.when(passed, F.col(cols.OP))
        .when((F.col(cols.OP) != Op.DELETE.value) & (F.col(FIRST_OP) == Op.CREATE.value), F.lit(None))
        .otherwise(F.lit(Op.DELETE.value))
    )
    key_json = F.to_json(F.struct(*[F.col(_key_alias(i)).alias(name) for i, name in enumerate(key)]), JSON_OPTIONS)
    return (
        joined.withColumn("__hw_feed_op", op)
        .where(F.col("__hw_feed_op").isNotNull())
        .select(
            key_json.alias(KEY_JSON),
            F.col("__hw_feed_op").alias(cols.OP),
            F.when(F.col("__hw_feed_op") == Op.DELETE.value, F.lit(None)).otherwise(F.col(AFTER)).alias(AFTER),
            *META,
        )
    )


def compute_feed(
    spark: SparkSession, latest: DataFrame, sql: str, key: Sequence[str], views: Mapping[str, DataFrame] = {}
) -> DataFrame:
    """Steps 2-3 over a micro-batch's :func:`latest_changes` (see the module docstring), truncates included.

    ``latest`` is read three times (SQL input, join side, truncates): the caller persists it,
    so the micro-batch is decoded once (streaming runs without adaptive execution, which
    would otherwise be the one to reuse the exchange).
    """
    output = apply_sql(spark, current_images(latest), sql, views)
    changes = feed_changes(latest, output, key)
    after_type = changes.schema[AFTER].dataType
    return changes.unionByName(truncates(latest).withColumn(AFTER, F.lit(None).cast(after_type)))


# --------------------------------------------------------------------------- driver-side pairing


def change_rows(latest: DataFrame, key: Sequence[str]) -> DataFrame:
    """What the driver pairs (``feed_events.pair_changes``): per latest change its feed key as JSON, ops, META.

    The key JSON is built from the source image exactly as :func:`feed_changes` builds it
    (null for truncates, which have no key).
    """
    key_json = F.to_json(F.struct(*[F.col(IMAGE)[name].alias(name) for name in key]), JSON_OPTIONS)
    return latest.select(
        F.when(F.col(cols.OP) != Op.TRUNCATE.value, key_json).alias(KEY_JSON), cols.OP, FIRST_OP, *META
    )


def output_rows(output: DataFrame, key: Sequence[str], image: StructType, checks: Sequence[Check] = ()) -> DataFrame:
    """The SQL's rows for the driver: the feed key as JSON (typed as in the source image), the row as JSON, checks.

    The key columns are cast to the image's types so the JSON equals :func:`change_rows`'
    wherever :func:`feed_changes`' join condition holds.
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


# --------------------------------------------------------------------------- encoding


def source_block(feed: str) -> Column:
    """The Debezium ``source`` object of a feed event (JSON text): provenance plus the source position."""
    ts_us = F.coalesce(F.unix_micros(F.col(cols.COMMIT_TS)), F.lit(0))
    return F.to_json(
        F.struct(
            F.lit(EVENT_VERSION).alias("version"),
            F.lit(CONNECTOR).alias("connector"),
            F.lit(feed).alias("name"),
            F.floor(ts_us / 1000).cast("long").alias("ts_ms"),
            ts_us.alias("ts_us"),
            F.coalesce(F.col(cols.SNAPSHOT), F.lit("false")).alias("snapshot"),
            F.col(cols.SOURCE_DB).alias("db"),
            F.lit("[null,null]").alias("sequence"),
            F.col(cols.SOURCE_SCHEMA).alias("schema"),
            F.col(cols.SOURCE_TABLE).alias("table"),
            F.lit(None).cast("long").alias("txId"),
            F.lit(None).cast("long").alias("lsn"),
            F.lit(None).cast("long").alias("xmin"),
            F.col(cols.COMMIT_LSN).alias("commit_lsn"),
            F.col(cols.TXN_INDEX).alias("txn_index"),
        ),
        JSON_OPTIONS,
    )


def envelope(before: Column, after: Column, source: Column, op: Column) -> Column:
    """A change event's value (JSON text), in ``log.envelope.encode_value``'s key order."""
    ts_us = F.coalesce(F.unix_micros(F.col(cols.COMMIT_TS)), F.lit(0))
    return F.concat(
        F.lit('{"before":'),
        F.coalesce(before, F.lit("null")),
        F.lit(',"after":'),
        F.coalesce(after, F.lit("null")),
        F.lit(',"source":'),
        source,
        F.lit(',"op":"'),
        op,
        F.lit('","ts_ms":'),
        F.floor(ts_us / 1000).cast("long").cast("string"),
        F.lit(',"ts_us":'),
        ts_us.cast("string"),
        F.lit(',"transaction":null}'),
    )


def encode_changes(changes: DataFrame, feed: str, passing: Column | None = None, keep: Sequence[str] = ()) -> DataFrame:
    """Feed events -> ``key``, ``value`` (JSON text) and ``dropped_value`` (the delete to write instead).

    ``passing`` (boolean, from the expectations with action ``drop``) marks rows kept; for
    the others ``dropped_value`` holds the delete that takes the key out of the feed.
    Deletes carry the key columns in ``before``, as Debezium's with the default replica identity.
    Columns named in ``keep`` (expectation results) are passed through.
    """
    after_type = changes.schema[AFTER].dataType
    assert isinstance(after_type, StructType)
    after_json = F.to_json(wire_struct(F.col(AFTER), after_type), JSON_OPTIONS)
    source = source_block(feed)
    is_delete = F.col(cols.OP) == Op.DELETE.value
    before = F.when(is_delete, F.col(KEY_JSON))
    value = envelope(before, after_json, source, F.col(cols.OP))
    if passing is None:
        dropped = F.lit(None).cast("string")
    else:
        dropped = F.when(~passing, envelope(F.col(KEY_JSON), F.lit(None), source, F.lit(Op.DELETE.value)))
    return changes.select(
        F.col(KEY_JSON).alias("key"),
        F.col(cols.OP),
        value.alias("value"),
        dropped.alias("dropped_value"),
        *keep,
    )
