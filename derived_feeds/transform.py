"""The feed computation's Spark steps as pure DataFrame -> DataFrame functions (no I/O).

Per micro-batch of the feed's input (``headwater_log`` rows):

1. :func:`latest_changes` keeps, per source key, the latest row change by ``__hw_seq``
   (offset breaks ties) and remembers the key's first op in the batch; a plain feed reads
   its input with ``latestPerKey``, so the source has done this per log partition already
   and :func:`reduced_changes` is a projection (no shuffle);
2. :func:`apply_sql` runs the feed's SQL over the current images (``source`` view);
3. :func:`change_rows` and :func:`output_rows` are what the driver pairs by the feed key
   (``derived_feeds.feed_output.pair_changes``) to decide each key's output record: the SQL's row
   as an upsert (the source op ``c``/``u``/``r``), or a delete when the source row was
   deleted or no longer passes the SQL. For SQL that is projections and filters over
   ``source`` (the common case), :func:`paired_rows` does 2 and 3 in one pass instead:
   each change with its own SQL row, no second read, no join (same records); a feed query
   plans it at its first micro-batch and reuses that plan for the others (:class:`OnePass`).

Why deletes without state (decision): a key whose latest image fails the filter gets a
delete (and a tombstone) whether or not it was in the feed before. Deleting an absent key
is harmless downstream (SCD1: no-op, SCD2: closes nothing; compaction removes the pair),
and it keeps the feed stateless: restarts and reprocessing need nothing but the log. The
one cheap exception: a key whose first change in the batch is an insert cannot have been
in the feed, so a failing insert produces nothing.

Invariant: every output record carries its source change's ``(commit_lsn, txn_index)``
and ``__hw_seq``, so downstream sinks apply it exactly as they would the raw change.
Feed keys are source columns passed through the SQL unchanged (checked at start).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from derived_feeds.expectations import Check, with_checks
from derived_feeds.feed_output import AFTER_JSON, KEY_JSON, META
from derived_feeds.feed_schema import JSON_OPTIONS, wire_struct
from log.envelope import Op
from spark_log import source_schema as cols

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

#: Columns of :func:`latest_changes` besides the image, ``op``, META and ``__hw_first_op``.
SRC_KEY = "__hw_src_key"
IMAGE = "__hw_image"
#: The output record's row (a STRUCT of the SQL's columns) in frames of feed output records.
AFTER = "after"
SOURCE_VIEW = "source"


def latest_changes(rows: DataFrame) -> DataFrame:
    """One row per ``(topic, key)``: its latest change (``op``, image, META) and its first op in the batch.

    The image is ``after`` for upserts and ``before`` for deletes. Changes without a key
    (keyless tables, truncates) stay one row each. Messages and tombstones are left out.
    One aggregation over one scan of the source's ``rows``: every later step reads its result,
    so the source is decoded once per micro-batch (Spark reuses the exchange).
    """
    changes = rows.where(F.col(cols.OP).isin(*cols.CHANGE_OPS))
    group = F.coalesce(F.col(cols.KEY), F.format_string("\u0000%d:%d", F.col(cols.PARTITION), F.col(cols.OFFSET)))
    order = F.struct(F.col(cols.SEQ), F.col(cols.PARTITION), F.col(cols.OFFSET))
    latest = F.max_by(F.struct(F.col(cols.KEY).alias(SRC_KEY), cols.OP, cols.row_image().alias(IMAGE), *META), order)
    return (
        changes.groupBy(F.col(cols.TOPIC), group.alias("__hw_group"))
        .agg(latest.alias("last"), F.min_by(F.col(cols.OP), order).alias(cols.FIRST_OP))
        .select(cols.TOPIC, "last.*", cols.FIRST_OP)
    )


def reduced_changes(rows: DataFrame) -> DataFrame:
    """:func:`latest_changes` of a read the source already reduced per key (option ``latestPerKey``).

    The source applied the same rule per log partition (``spark_log.latest_per_key``),
    so this is a projection: no aggregation, no shuffle.
    """
    image = cols.row_image()
    return rows.select(
        cols.TOPIC, F.col(cols.KEY).alias(SRC_KEY), cols.OP, image.alias(IMAGE), *META, F.col(cols.FIRST_OP)
    )


def current_images(latest: DataFrame) -> DataFrame:
    """The rows of the ``source`` view: the current image of every key not deleted."""
    return latest.where(~F.col(cols.OP).isin(Op.DELETE.value, Op.TRUNCATE.value)).select(f"{IMAGE}.*")


def apply_sql(spark: SparkSession, images: DataFrame, sql: str, views: Mapping[str, DataFrame] = {}) -> DataFrame:
    """The feed's SQL over ``images`` as view ``source`` (and ``views`` under their names)."""
    # Temp views are the session's: feeds running side by side (one foreachBatch thread each)
    # must not analyze their SQL over another feed's ``source``. The SQL is analyzed eagerly,
    # so the views are not read after the lock is released.
    with _VIEWS:
        images.createOrReplaceTempView(SOURCE_VIEW)
        for name, frame in views.items():
            frame.createOrReplaceTempView(name)
        return spark.sql(sql)


_VIEWS = threading.Lock()


# --------------------------------------------------------------------------- driver-side pairing


def change_rows(latest: DataFrame, key: Sequence[str]) -> DataFrame:
    """What the driver pairs (``feed_output.pair_changes``): per latest change its feed key as JSON, ops, META.

    The key JSON is built from the source image (null for truncates, which have no key);
    deletes carry it as their ``before``.
    """
    key_json = F.to_json(F.struct(*[F.col(IMAGE)[name].alias(name) for name in key]), JSON_OPTIONS)
    return latest.select(
        F.when(F.col(cols.OP) != Op.TRUNCATE.value, key_json).alias(KEY_JSON), cols.OP, cols.FIRST_OP, *META
    )


def output_rows(output: DataFrame, key: Sequence[str], image: StructType, checks: Sequence[Check] = ()) -> DataFrame:
    """The SQL's rows for the driver: the feed key as JSON (typed as in the source image), the row as JSON, checks.

    The key columns are cast to the image's types so the JSON equals :func:`change_rows`'
    wherever the source's key equals the SQL row's key.
    """
    after_type = output.schema
    row = F.struct(*[F.col(f"`{c}`") for c in output.columns])
    key_json = typed_key_json([F.col(f"`{name}`") for name in key], key, image)
    checked: DataFrame = with_checks(output.select(row.alias(AFTER), key_json.alias(KEY_JSON)), checks)
    return checked.select(
        KEY_JSON,
        F.to_json(wire_struct(F.col(AFTER), after_type), JSON_OPTIONS).alias(AFTER_JSON),
        *[check.flag for check in checks],
    )


def typed_key_json(columns: Sequence[Column], key: Sequence[str], image: StructType) -> Column:
    """The feed key (``columns``, named ``key``) as JSON, each cast to its type in the source ``image``.

    Typed alike, a key taken from the SQL's row and one taken from the source's change give the same text.
    """
    typed = [column.cast(image[name].dataType).alias(name) for column, name in zip(columns, key, strict=True)]
    return F.to_json(F.struct(*typed), JSON_OPTIONS)


# --------------------------------------------------------------------------- one pass (projection/filter SQL)

#: The change behind each row of :func:`source_rows` (hidden from the SQL's output, see :func:`paired_rows`).
CHANGE = "__hw_change"


def source_rows(latest: DataFrame) -> DataFrame:
    """Every latest change's image columns (deletes: ``before``), plus the change itself as STRUCT ``__hw_change``."""
    return latest.select(F.col(f"{IMAGE}.*"), F.struct(cols.OP, cols.FIRST_OP, *META).alias(CHANGE))


def paired_rows(
    spark: SparkSession, latest: DataFrame, sql: str, key: Sequence[str], output: StructType, *, checks: Sequence[Check]
) -> DataFrame | None:
    """:func:`change_rows` already paired with :func:`output_rows`, in one pass over ``latest``; None if not possible.

    Possible when the SQL's analyzed plan is projections and filters over ``source`` (no
    join, aggregate, window, subquery, generator or Python UDF), only its top projection
    computes, and it passes the feed key through unchanged: then each change has at most
    one SQL row, whose key is the change's, and the SQL's expressions can be evaluated on
    the change's own row. Filters become one condition (the SQL's WHERE: null fails),
    evaluated only on the images of changes that are not deletes or truncates; the
    projection only where it holds. Columns: ``__hw_key``, ``op``, ``__hw_first_op``,
    META, ``__hw_after_json`` (null where the SQL has no row) and the check flags, i.e.
    what ``feed_output.paired_output`` reads. The caller makes sure the feed key is
    unique per change (one row per key in the SQL's output, as in the join).
    """
    if CHANGE in latest.schema[IMAGE].dataType.fieldNames():  # type: ignore[attr-defined]
        return None
    rows = source_rows(latest)
    try:
        frame = apply_sql(spark, rows, sql)
    except Exception:  # e.g. a UNION with SELECT *: the extra column changes its width; the general path runs it
        return None
    shape = _projection_shape(frame, rows)
    if shape is None:
        return None
    projection, conditions, names = shape
    if [f.name for f in output.fields] != [name for name, _ in projection] or not all(names.get(k) == k for k in key):
        return None
    live = ~F.col(f"{CHANGE}.{cols.OP}").isin(Op.DELETE.value, Op.TRUNCATE.value)
    passes = F.coalesce(live, F.lit(False))
    for condition in conditions:  # bottom-up, each evaluated only where the ones below hold (as the SQL)
        passes = F.when(passes, F.coalesce(condition, F.lit(False))).otherwise(F.lit(False))
    after = F.when(passes, F.struct(*[column for _, column in projection]))
    key_json = F.to_json(F.struct(*[rows[name].alias(name) for name in key]), JSON_OPTIONS)
    change = [F.col(f"{CHANGE}.{name}").alias(name) for name in (cols.OP, cols.FIRST_OP, *META)]
    paired = rows.select(
        F.when(F.col(f"{CHANGE}.{cols.OP}") != Op.TRUNCATE.value, key_json).alias(KEY_JSON), *change, after.alias(AFTER)
    )
    after_type = paired.schema[AFTER].dataType  # this batch's types, as output_rows takes them
    assert isinstance(after_type, StructType)
    checked: DataFrame = with_checks(paired, checks)
    return checked.select(
        KEY_JSON,
        cols.OP,
        cols.FIRST_OP,
        *META,
        F.to_json(wire_struct(F.col(AFTER), after_type), JSON_OPTIONS).alias(AFTER_JSON),
        *[check.flag for check in checks],
    )


@dataclass
class _Planned:
    """:func:`paired_rows` planned for one input: its signature and the pass's plan above the input's plan."""

    signature: tuple[str, str]
    #: The analyzed plan's nodes from the top down to the one reading the input's plan (py4j
    #: objects); None when the SQL is not fit for one pass, empty when they are not one chain.
    chain: list[Any] | None


class OnePass:
    """:func:`paired_rows` of one feed, planned once per input and reused for every micro-batch.

    Planning a batch (the SQL analyzed over its rows, the analyzed plan walked over py4j,
    the pass's columns built and analyzed) costs the driver ~100 ms and about a thousand
    py4j round trips, and depends only on the SQL, key, output columns, checks and the
    input's columns. So the first batch of an input plans it and keeps the analyzed plan;
    a batch with the same signature (its plan's output: names with expression ids, and the
    schema with types: every micro-batch of a streaming query has its source's) runs that
    plan with its own input plan in place of the first batch's, through a few py4j calls,
    nothing analyzed from SQL again. Another signature (a schema change: a new query over
    the changed source, or another frame) plans again, so the decision and the expressions
    always belong to the input's columns. One instance per feed query; not thread-safe.
    """

    def __init__(
        self,
        sql: str,
        key: Sequence[str],
        output: StructType,
        checks: Sequence[Check],
        latest_of: Callable[[DataFrame], DataFrame],
    ) -> None:
        """``latest_of`` turns a batch into :func:`paired_rows`' ``latest`` (Spark steps only, no action)."""
        self.sql, self.key, self.output, self.checks, self.latest_of = sql, list(key), output, list(checks), latest_of
        self._planned: _Planned | None = None
        self._jvm_calls: tuple[Any, Any] | None = None
        #: Inputs planned (the cache's misses), for tests and the bench.
        self.plans = 0

    def paired(self, batch: DataFrame) -> DataFrame | None:
        """:func:`paired_rows` over ``latest_of(batch)``; None when the SQL is not fit (then for this input only)."""
        spark = batch.sparkSession
        jplan = batch._jdf.logicalPlan()
        signature = (str(jplan.output().toString()), str(jplan.schema().json()))
        planned = self._planned
        if planned is not None and planned.signature == signature:
            if planned.chain is None:
                return None
            if planned.chain:
                return self._rebuilt(spark, planned.chain, jplan)
        frame = paired_rows(spark, self.latest_of(batch), self.sql, self.key, self.output, checks=self.checks)
        self.plans += 1
        self._planned = _Planned(signature, None if frame is None else _chain_above(frame, jplan))
        return frame

    def _rebuilt(self, spark: SparkSession, chain: list[Any], input_plan: Any) -> DataFrame:
        """The planned pass over ``input_plan``: ``chain`` (top down) rebuilt over it, as a DataFrame.

        The chain's expressions refer to the input's columns by expression id, which
        ``input_plan`` shares with the planned input (same signature), so the plan is
        resolved as it stands; Spark still checks, optimizes and compiles it per batch.
        """
        from pyspark.sql.classic.dataframe import DataFrame as ClassicDataFrame

        if self._jvm_calls is None:  # each name looked up over py4j costs a round trip per dot
            jvm = spark.sparkContext._jvm
            assert jvm is not None
            self._jvm_calls = (
                jvm.org.apache.spark.api.python.PythonUtils.toSeq,
                jvm.org.apache.spark.sql.classic.Dataset.ofRows,
            )
        to_seq, of_rows = self._jvm_calls
        node = input_plan
        for parent in reversed(chain):
            node = parent.withNewChildren(to_seq([node]))
        return ClassicDataFrame(of_rows(spark._jsparkSession, node), spark)


def _chain_above(frame: DataFrame, input_plan: Any) -> list[Any]:
    """``frame``'s analyzed plan from the top down to the node reading ``input_plan`` ([] if not one chain)."""
    chain: list[Any] = []
    node = frame._jdf.logicalPlan()
    while not node.equals(input_plan):
        children = node.children()
        if children.size() != 1:
            return []
        chain.append(node)
        node = children.head()
    return chain


def _projection_shape(
    frame: DataFrame, rows: DataFrame
) -> tuple[list[tuple[str, Column]], list[Column], dict[str, str]] | None:
    """The SQL over ``rows`` as (its top projection, its filters bottom-up, pass-through columns), or None.

    Walks the analyzed plan (py4j) from the top: one ``Project`` (the SQL's select list),
    then only ``Filter``, pass-through ``Project`` (bare columns), ``SubqueryAlias`` and
    the ``source`` view over ``rows``. The projection leaves ``__hw_change`` out (a
    ``SELECT *`` expands it); the third item maps each output column that is a bare
    column of ``rows`` to that column's name.
    """
    from pyspark.sql.classic.column import Column as ClassicColumn

    jvm = frame.sparkSession.sparkContext._jvm
    assert jvm is not None
    pattern = jvm.org.apache.spark.sql.catalyst.trees.TreePattern
    unsafe = [
        pattern.withName(name)
        for name in ("PLAN_EXPRESSION", "PYTHON_UDF", "GENERATOR", "AGGREGATE_EXPRESSION", "WINDOW_EXPRESSION")
    ]
    base = rows._jdf.queryExecution().analyzed()
    base_ids = {attribute.exprId().id(): attribute.name() for attribute in _seq(base.output())}
    hidden = next(i for i, name in base_ids.items() if name == CHANGE)
    to_column = jvm.org.apache.spark.sql.classic.ExpressionUtils.column

    def is_attribute(expression: Any) -> bool:
        return bool(expression.getClass().getName() == _ATTRIBUTE)

    node = frame._jdf.queryExecution().analyzed()
    if node.nodeName() != "Project":
        return None
    top = _seq(node.projectList())
    conditions: list[Any] = []
    node = node.child()
    while True:
        kind = node.nodeName()
        if kind == "Filter":
            conditions.append(node.condition())
        elif kind == "Project":
            if not all(is_attribute(e) for e in _seq(node.projectList())):
                return None
        elif kind == "SubqueryAlias":
            pass
        elif kind == "View":
            child = node.child()
            if [a.exprId().id() for a in _seq(child.output())] != list(base_ids):
                return None
            break
        else:
            return None
        node = node.child()
    for expression in [*top, *conditions]:
        if any(expression.containsPattern(p) for p in unsafe):
            return None
    projection: list[tuple[str, Column]] = [
        (str(e.name()), ClassicColumn(to_column(e))) for e in top if not (is_attribute(e) and e.exprId().id() == hidden)
    ]
    passed = {str(e.name()): base_ids[e.exprId().id()] for e in top if is_attribute(e) and e.exprId().id() in base_ids}
    filters: list[Column] = [ClassicColumn(to_column(c)) for c in reversed(conditions)]
    return projection, filters, passed


_ATTRIBUTE = "org.apache.spark.sql.catalyst.expressions.AttributeReference"


def _seq(items: Any) -> list[Any]:
    """A Scala ``Seq`` (py4j) as a list."""
    return [items.apply(i) for i in range(items.size())]
