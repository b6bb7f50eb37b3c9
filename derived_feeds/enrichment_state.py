"""The enrichment state: the latest change per ``(topic, key)`` of a feed's topics, in Spark's RocksDB state store.

An enriched feed's stream (its ``from`` topic and its lookup topics read together, each
key's latest change per micro-batch and log partition already picked by the reader:
``latestPerKey``) goes through one streaming aggregation, ``max_by`` over the source order
per ``(topic, key)``, in ``update`` output mode: each micro-batch hands ``foreachBatch`` the
keys it changed, each with its latest change (op, row image, META) and in how many
micro-batches the key changed. Spark keeps the aggregation's state in the RocksDB state store with changelog
checkpointing (``<checkpoint>/state/0/<partition>/<version>.changelog``, a snapshot now and
then), so a micro-batch writes only the keys it changed, and a restart loads the state
from the checkpoint instead of rereading the topics.

:func:`state_tables` reads the whole state as it was after a committed micro-batch
(Spark's ``statestore`` data source): the current images of every key, used when a lookup
changes (which source rows it reaches is only known by running the arbitrary SQL).

Why an aggregation and not ``transformWithStateInPandas`` (measured, pyspark 4.3, local[2],
load 12-17): the Python processor makes state calls per key over a socket, 5,000 keys took
20 s per micro-batch (``applyInPandasWithState`` 37-49 s); the aggregation runs in the JVM,
20,000 keys took 1.7-4.3 s. Deleted keys stay in the state with op ``d`` (an aggregation
cannot drop a key); rows of keyless tables are left out.

Truncates (keyless ``t`` changes) count: each topic's latest truncate is one more grouping
row of the same aggregation, under the reserved key :data:`TRUNCATE_KEY`, so it is kept,
checkpointed and restored with the rows. Every image of a topic older than that topic's
latest truncate (by ``__hw_seq``, the order of ``max_by``) is gone: :func:`without_truncated`
applies the rule to the state read back, and the enrichment applies it to each
micro-batch. A checkpoint written before truncates were kept has no such row (its state
schema is the same), so it resumes as it is; truncates it consumed before stay ignored
(``headwater reprocess`` rebuilds the feed with them).

The state keeps each row image as JSON text, not as a STRUCT of the topics' columns: Spark
refuses to resume a state whose value schema changed, and a captured table gaining,
losing or renaming a column changes the row type of the stream. The text is parsed back
with the row type of the running query (a column added later is null in images written
before it; a dropped column is ignored; a renamed column is read under its new name,
:mod:`log.schema_history`), so the feed goes on across schema changes.
Checkpoints written while the state kept STRUCT images are refused with one line naming
``headwater reprocess``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructType

from core.errors import PermanentError
from derived_feeds.errors import DerivedFeedsError
from derived_feeds.feed_output import META
from derived_feeds.feed_schema import JSON_OPTIONS
from derived_feeds.transform import IMAGE, SRC_KEY
from log.envelope import Op
from spark_log import source_schema as cols
from spark_log.source_schema import RowSchema, renamed, with_hidden_fields

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery
    from pyspark.sql.streaming.readwriter import DataStreamWriter

    from derived_feeds.feed_spec import FeedSpec

#: Spark settings of the enrichment query (recorded in its checkpoint at the first batch).
STATE_STORE_CONF = {
    "spark.sql.streaming.stateStore.providerClass": (
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
    ),
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
    # By default every put first gets the key to count the store's rows (the ``numRowsTotal``
    # metric, unused here): one RocksDB get per changed key less (bench/RESULTS.md, issue 19).
    "spark.sql.streaming.stateStore.rocksdb.trackTotalNumberOfRows": "false",
}
#: How many micro-batches changed the key since the feed started (the reader keeps a key's latest change
#: per micro-batch, ``latestPerKey``). Not read by the maintenance; part of the state's schema.
CHANGES = "__hw_changes"
_LATEST = "__hw_latest"
#: The grouping key of a topic's latest truncate (a row key is a JSON object, never starting with NUL).
TRUNCATE_KEY = "\u0000truncate"
#: The row image in the state, as JSON text (see the module docstring).
_IMAGE_JSON = "__hw_image_json"
#: Lossless both ways for the types a row image holds (microsecond timestamps, NaN/Infinity, base64 bytes).
_STATE_JSON = {**JSON_OPTIONS, "timestampNTZFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSS"}


class EnrichmentStateError(DerivedFeedsError, PermanentError):
    """An enriched feed's checkpoint holds state this version cannot resume from."""


def check_checkpoint(spec: FeedSpec) -> None:
    """Refuse a checkpoint whose enrichment state an earlier Headwater wrote (Parquet, or STRUCT images)."""
    if spec.state_dir.exists():
        kept = "as Parquet"
    elif any(b'"name":"__hw_image",' in path.read_bytes() for path in _state_schemas(spec.checkpoint / "spark")):
        kept = "with typed row images"
    else:
        return
    msg = (
        f"feed {spec.name}: its checkpoint keeps enrichment state {kept} (an earlier Headwater), "
        f"which this version cannot resume from; run 'headwater reprocess {spec.name}' to rebuild it"
    )
    raise EnrichmentStateError(msg)


def _state_schemas(checkpoint: Path) -> list[Path]:
    """The state schema files Spark keeps per operator (``state/<op>/<partition>/_metadata/schema``)."""
    return sorted((checkpoint / "state").glob("*/*/_metadata/schema"))


def latest_per_key(rows: DataFrame, schemas: Mapping[str, RowSchema] | None = None) -> DataFrame:
    """The streaming aggregation over ``headwater_log`` rows: per ``(topic, key)`` its latest change.

    ``rows`` may be read with ``latestPerKey`` (its ``__hw_first_op`` is not kept) or not: the result is the same
    but for ``__hw_changes``, which counts the rows the key had.

    Columns: ``topic``, ``__hw_src_key``, ``op``, ``__hw_image`` (``after``, ``before`` for a
    delete), META, ``__hw_changes``. Order is the source order ``(__hw_seq, partition, offset)``,
    as :func:`derived_feeds.transform.latest_changes`. A topic's latest truncate is the row
    with key :data:`TRUNCATE_KEY` (op ``t``, null image). ``schemas``: the topics' row schemas,
    whose renames apply to images the state kept from before a rename.
    """
    image_type = rows.schema[cols.AFTER].dataType
    assert isinstance(image_type, StructType), "enriched topics are typed (checked by plan_feed)"
    is_truncate = F.col(cols.OP) == Op.TRUNCATE.value
    changes = rows.where((F.col(cols.OP).isin(*cols.ROW_OPS) & F.col(cols.KEY).isNotNull()) | is_truncate)
    key = F.when(is_truncate, F.lit(TRUNCATE_KEY)).otherwise(F.col(cols.KEY))
    order = F.struct(F.col(cols.SEQ), F.col(cols.PARTITION), F.col(cols.OFFSET))
    latest = F.max_by(F.struct(cols.OP, F.to_json(cols.row_image(), _STATE_JSON).alias(_IMAGE_JSON), *META), order)
    return (
        changes.groupBy(F.col(cols.TOPIC), key.alias(SRC_KEY))
        .agg(latest.alias(_LATEST), F.count(F.lit(1)).alias(CHANGES))
        .select(
            cols.TOPIC,
            SRC_KEY,
            F.col(_LATEST)[cols.OP].alias(cols.OP),
            _parsed(F.col(_LATEST)[_IMAGE_JSON], image_type, schemas, F.col(cols.TOPIC), F.col(_LATEST)[cols.SEQ]),
            *[F.col(_LATEST)[name].alias(name) for name in META],
            CHANGES,
        )
    )


def newer_than(truncated_at: Column) -> Column:
    """Whether a row's image (its ``__hw_seq``) is newer than a truncate at ``truncated_at`` (never null).

    A null sequence sorts before every other, as in :func:`latest_per_key`'s order.
    """
    seq = F.col(cols.SEQ)
    return F.coalesce(seq > truncated_at, truncated_at.isNull() & seq.isNotNull())


def not_truncated(truncated_at: Mapping[str, str | None]) -> Column:
    """True for rows (with ``topic``) that none of the truncates ``truncated_at`` (topic -> ``__hw_seq``) took away."""
    kept = F.lit(True)
    for topic, seq in truncated_at.items():
        kept = kept & ((F.col(cols.TOPIC) != topic) | newer_than(F.lit(seq).cast(StringType())))
    return kept


def without_truncated(state: DataFrame) -> DataFrame:
    """``state``'s rows (:func:`latest_per_key`'s columns) that no truncate took away; the truncate rows left out.

    A row is gone when its topic has a truncate row in ``state`` newer than its image.
    ``state`` is read twice (its few truncate rows first), so pass a checkpointed frame.
    """
    truncate_rows = state.where(F.col(SRC_KEY) == TRUNCATE_KEY).select(cols.TOPIC, cols.SEQ).collect()
    truncated_at = {row[cols.TOPIC]: row[cols.SEQ] for row in truncate_rows}
    return state.where((F.col(SRC_KEY) != TRUNCATE_KEY) & not_truncated(truncated_at))


def _parsed(
    image_json: Column,
    image_type: StructType,
    schemas: Mapping[str, RowSchema] | None = None,
    topic: Column | None = None,
    seq: Column | None = None,
) -> Column:
    """An image the state kept as JSON, read with the running query's row type (renamed columns moved)."""
    if not schemas or topic is None or seq is None or not any(schema.renames for schema in schemas.values()):
        return F.from_json(image_json, image_type, _STATE_JSON).alias(IMAGE)
    parsed = F.from_json(image_json, with_hidden_fields(image_type, schemas), _STATE_JSON)
    return renamed(parsed, image_type, schemas, topic, seq).alias(IMAGE)


def start_stateful(spark: SparkSession, writer: DataStreamWriter) -> StreamingQuery:
    """Start the enrichment query with the RocksDB state store (changelog checkpointing), ``update`` mode.

    The settings are set on the session only while the query starts: the query runs on a
    clone of the session's settings and records the provider in its checkpoint.
    """
    with _session_conf(spark, STATE_STORE_CONF):
        return writer.outputMode("update").start()


@contextlib.contextmanager
def _session_conf(spark: SparkSession, settings: dict[str, str]) -> Iterator[None]:
    previous: dict[str, str | None] = {name: spark.conf.get(name, None) for name in settings}
    for name, value in settings.items():
        spark.conf.set(name, value)
    try:
        yield
    finally:
        for name, old in previous.items():
            if old is None:
                spark.conf.unset(name)
            else:
                spark.conf.set(name, old)


def state_tables(
    spark: SparkSession,
    checkpoint: Path,
    batch_id: int,
    image_type: StructType,
    schemas: Mapping[str, RowSchema] | None = None,
) -> DataFrame:
    """The state after committed micro-batch ``batch_id``, in :func:`latest_per_key`'s columns, truncates applied.

    ``image_type``: the running query's row type (the images are parsed with it). Rows a
    later truncate of their topic took away and the truncate rows are left out
    (:func:`without_truncated`). Eager: the state is read once, into a local checkpoint.

    The operator's key is the grouping ``(topic, key)``, its value the aggregation buffer:
    ``max_by``'s (value, ordering) and ``count``. Both are read by position, so Spark's
    internal field names do not matter.
    """
    state = spark.read.format("statestore").option("batchId", batch_id).load(str(checkpoint))
    keys = state.schema["key"].dataType.fieldNames()  # type: ignore[attr-defined]
    values = state.schema["value"].dataType.fieldNames()  # type: ignore[attr-defined]
    latest, count = F.col("value")[values[0]], F.col("value")[values[-1]]
    rows = state.select(
        F.col("key")[keys[0]].alias(cols.TOPIC),
        F.col("key")[keys[1]].alias(SRC_KEY),
        latest[cols.OP].alias(cols.OP),
        _parsed(latest[_IMAGE_JSON], image_type, schemas, F.col("key")[keys[0]], latest[cols.SEQ]),
        *[latest[name].alias(name) for name in META],
        count.alias(CHANGES),
    )
    return without_truncated(rows.localCheckpoint())
