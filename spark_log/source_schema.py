"""The Spark schema of the ``headwater_log`` source, built from ``_headwater.schemas`` and the type map.

A table topic's ``before``/``after`` become typed STRUCTs: each column's logical type
(the record's logical type, :func:`log.table_schemas.column_type`) is decoded back
into the Spark type below:

=====================================  ===================================================
logical type (JSON value)              Spark type
=====================================  ===================================================
boolean / int16 / int32 / int64        Boolean / Short / Integer / Long
float / double (NaN, ±Infinity: text)  Float / Double (the strings become NaN, ±Infinity)
decimal(p,s), p <= 38 (string mode)    Decimal(p,s); NaN/±Infinity become null
decimal(p,s), p > 38                   String (the exact text)
numeric(p,s) with s < 0 (PG 15)        Decimal(p - s, 0)
decimal_base64 (precise mode)          Decimal as above (money: Decimal(38,2))
unconstrained numeric / variable       String by default (exact); Decimal(38,10) with
                                       option ``unconstrainedNumeric=decimal`` (rounded
                                       half-even; a value over 28 integer digits fails)
bytes (base64 / hex), bits             Binary
date (days)                            Date (±infinity, years outside 1..9999 clamped)
time_ms / time_us                      Long: microseconds past midnight (both precisions;
                                       24:00:00 -> 86399999999). Spark 4.3's TIME type is
                                       off unless spark.sql.timeType.enabled, and
                                       delta-rs cannot store it
timestamp_ms / timestamp_us            TimestampNTZ (clamped to years 1..9999)
timestamptz_string                     Timestamp (UTC; ±infinity clamped to years 1..9999)
timetz_string                          String ("HH:MM:SS[.f]Z", already in UTC)
interval_us                            Long (microseconds)
json / uuid / enum / string            String
point                                  struct<x: double, y: double>
array<T>                               Array<T> (multi-dimensional arrays are flattened
                                       in row-major order: Postgres types carry no rank)
=====================================  ===================================================

Types the schema record cannot resolve without the source's ``pg_type`` (enums,
domains, arrays of them) map to String; a non-string JSON value in a String column is
kept as its JSON text rather than dropped.

Schema evolution: a topic is read with its latest schema version; columns of older
versions that were dropped later are kept after the latest columns (null in rows of newer
versions), and a column that changed type takes its latest type. A renamed column
(:mod:`log.schema_history`) is read under its new name in every record, those written before
the rename included; its old name is not a column of the source (unless a later version has
a column of that name again).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from core.source_config import TypesConfig
from log.envelope import Op
from log.row_types import LogicalKind, LogicalType
from log.schema_history import Rename, SchemaHistory
from log.table_schemas import column_type
from spark_log.errors import SchemaConflictError

if TYPE_CHECKING:
    from pyspark.sql import Column

#: Output columns of the source, in order (``before``/``after`` last).
TOPIC = "topic"
PARTITION = "partition"
OFFSET = "offset"
TIMESTAMP = "timestamp"
KEY = "key"
OP = "op"
SEQ = "__hw_seq"
COMMIT_LSN = "commit_lsn"
TXN_INDEX = "txn_index"
COMMIT_TS = "commit_ts"
SNAPSHOT = "snapshot"
SOURCE_DB = "source_db"
SOURCE_SCHEMA = "source_schema"
SOURCE_TABLE = "source_table"
BEFORE = "before"
AFTER = "after"
#: Added by the source option ``latestPerKey``: the key's first op in the micro-batch.
FIRST_OP = "__hw_first_op"

#: ``op`` of a row change (its image is a row); with truncates, of every change. Messages
#: (``m``) and tombstones (``op`` null) change no row.
ROW_OPS = (Op.CREATE.value, Op.UPDATE.value, Op.READ.value, Op.DELETE.value)
CHANGE_OPS = (*ROW_OPS, Op.TRUNCATE.value)

#: Spark's DecimalType ceiling.
MAX_DECIMAL_PRECISION = 38
#: ``unconstrainedNumeric=decimal``: Decimal(38,10), as most warehouses default a bare NUMERIC.
UNCONSTRAINED_DECIMAL = (38, 10)

UnconstrainedNumeric = Literal["string", "decimal"]

_SIMPLE: Mapping[LogicalKind, DataType] = {
    LogicalKind.BOOLEAN: BooleanType(),
    LogicalKind.INT16: ShortType(),
    LogicalKind.INT32: IntegerType(),
    LogicalKind.INT64: LongType(),
    LogicalKind.FLOAT: FloatType(),
    LogicalKind.DOUBLE: DoubleType(),
    LogicalKind.STRING: StringType(),
    LogicalKind.JSON: StringType(),
    LogicalKind.UUID: StringType(),
    LogicalKind.ENUM: StringType(),
    LogicalKind.TIMETZ_STRING: StringType(),
    LogicalKind.BYTES_BASE64: BinaryType(),
    LogicalKind.BYTES_HEX: BinaryType(),
    LogicalKind.BITS: BinaryType(),
    LogicalKind.DATE: DateType(),
    LogicalKind.TIME_MS: LongType(),
    LogicalKind.TIME_US: LongType(),
    LogicalKind.TIMESTAMP_MS: TimestampNTZType(),
    LogicalKind.TIMESTAMP_US: TimestampNTZType(),
    LogicalKind.TIMESTAMPTZ_STRING: TimestampType(),
    LogicalKind.INTERVAL_US: LongType(),
}
POINT_TYPE = StructType([StructField("x", DoubleType()), StructField("y", DoubleType())])
_DECIMALS = (LogicalKind.DECIMAL, LogicalKind.DECIMAL_BASE64, LogicalKind.DECIMAL_VARIABLE)


def spark_type(logical: LogicalType, unconstrained: UnconstrainedNumeric = "string") -> DataType:
    """The Spark type a column of this logical type is read as (see the module table)."""
    simple = _SIMPLE.get(logical.kind)
    if simple is not None:
        return simple
    if logical.kind in _DECIMALS:
        return _decimal_type(logical, unconstrained)
    if logical.kind is LogicalKind.POINT:
        return POINT_TYPE
    if logical.kind is LogicalKind.ARRAY and logical.element is not None:
        return ArrayType(spark_type(logical.element, unconstrained), containsNull=True)
    return StringType()


def _decimal_type(logical: LogicalType, unconstrained: UnconstrainedNumeric) -> DataType:
    precision, scale = logical.precision, logical.scale
    if logical.kind is LogicalKind.DECIMAL_VARIABLE or (precision is None and scale is None):
        return DecimalType(*UNCONSTRAINED_DECIMAL) if unconstrained == "decimal" else StringType()
    if precision is None:  # money: a scale but no precision
        precision = MAX_DECIMAL_PRECISION
    scale = scale or 0
    if scale < 0:  # numeric(5,-2) holds integers up to 5 - (-2) digits; Spark refuses negative scales
        precision, scale = precision - scale, 0
    if precision > MAX_DECIMAL_PRECISION:
        return StringType()
    return DecimalType(precision, scale)


@dataclass(frozen=True, slots=True)
class ColumnSpec:
    """One row-image column: its name and the logical type of its JSON values."""

    name: str
    logical: LogicalType


@dataclass(frozen=True, slots=True)
class RowSchema:
    """The row image of one table topic: its columns (latest version first, then dropped ones).

    ``hidden``: names records may hold that are read under another name (``renames``, oldest
    first: records below a rename's position hold the old name); they are decoded, moved to
    their new name and left out of :meth:`struct`.
    """

    topic: str
    columns: tuple[ColumnSpec, ...]
    version: int
    hidden: frozenset[str] = frozenset()
    renames: tuple[Rename, ...] = ()
    #: Names the topic's record keys had in some version: a renamed one is renamed in keys too.
    key_names: frozenset[str] = frozenset()

    def struct(self, unconstrained: UnconstrainedNumeric = "string") -> StructType:
        """The STRUCT type of ``before``/``after`` (every field nullable: deletes carry only keys)."""
        return StructType(
            [
                StructField(c.name, spark_type(c.logical, unconstrained))
                for c in self.columns
                if c.name not in self.hidden
            ]
        )

    def hidden_fields(self, unconstrained: UnconstrainedNumeric = "string") -> list[StructField]:
        """The fields records may hold under a name the struct does not have (see ``hidden``)."""
        return [
            StructField(c.name, spark_type(c.logical, unconstrained)) for c in self.columns if c.name in self.hidden
        ]


def row_schema(
    topic: str, versions: Sequence[Mapping[str, Any]], modes: TypesConfig, *, current_only: bool = False
) -> RowSchema:
    """Merge a topic's schema records (any order) into the row schema it is read with.

    ``versions`` are the values of ``_headwater.schemas`` records keyed by ``topic``
    (``{"columns": [{"name", "logical", "native", "key"}], "version"}``, :mod:`log.table_schemas`);
    a column of an older record is typed by its oid (:func:`log.table_schemas.column_type`).
    ``current_only``: only the latest version's columns (no dropped ones), as feeds read.
    """
    if not versions:
        msg = f"no schema record for topic {topic!r}"
        raise ValueError(msg)
    ordered = sorted(versions, key=lambda record: int(record.get("version", 0)))
    latest = ordered[-1]
    columns: dict[str, ColumnSpec] = {}
    for column in latest["columns"]:
        columns[column["name"]] = _column(column, modes)
    history = SchemaHistory.of(ordered)
    hidden = history.renamed_away()
    for record in reversed(ordered[:-1]):
        for column in record["columns"]:
            if not current_only or column["name"] in hidden:
                columns.setdefault(column["name"], _column(column, modes))
    return RowSchema(
        topic,
        tuple(columns.values()),
        int(latest.get("version", 0)),
        hidden=hidden,
        renames=history.renames(),
        key_names=frozenset(str(name) for record in ordered for name in record.get("key") or ()),
    )


def _column(column: Mapping[str, Any], modes: TypesConfig) -> ColumnSpec:
    return ColumnSpec(str(column["name"]), column_type(column, modes))


def with_hidden_fields(
    image: StructType, schemas: Mapping[str, RowSchema], unconstrained: UnconstrainedNumeric = "string"
) -> StructType:
    """``image`` with the fields records may hold under a renamed-away name (decode with it, then :func:`renamed`)."""
    names = set(image.fieldNames())
    extra: dict[str, StructField] = {}
    for schema in schemas.values():
        for field in schema.hidden_fields(unconstrained):
            if field.name not in names:
                extra.setdefault(field.name, field)
    return image if not extra else StructType([*image.fields, *extra.values()])


def renamed(parsed: Column, image: StructType, schemas: Mapping[str, RowSchema], topic: Column, seq: Column) -> Column:
    """A row image decoded with :func:`with_hidden_fields`, as ``image``: renamed columns under their new name.

    Records of a topic below a rename's position hold the old name (:mod:`log.schema_history`);
    an image of such a record kept by a query that already read it under the new name (a feed's
    state) holds the new one: the old name's value is taken only where it is set.
    """
    fields = {name: parsed[name] for name in (f.name for f in image.fields)}
    types = {f.name: f.dataType for f in image.fields}
    for name, schema in schemas.items():
        for rename in schema.renames:
            if rename.new not in types:
                continue
            before = (topic == F.lit(name)) & (seq < F.lit(rename.at.sortable()))
            old = fields.get(rename.old, parsed[rename.old])
            moved = before & old.isNotNull()
            fields[rename.new] = F.when(moved, old.cast(types[rename.new])).otherwise(fields[rename.new])
            if rename.old in fields:
                fields[rename.old] = F.when(before, F.lit(None).cast(types[rename.old])).otherwise(fields[rename.old])
    rebuilt = F.struct(*[fields[f.name].alias(f.name) for f in image.fields])
    return F.when(parsed.isNull(), F.lit(None).cast(image)).otherwise(rebuilt)


def merged_struct(schemas: Sequence[RowSchema], unconstrained: UnconstrainedNumeric = "string") -> StructType:
    """One STRUCT for several topics read together: the union of their columns by name.

    Raises :class:`SchemaConflictError` when two topics give a column different Spark types.
    """
    fields: dict[str, StructField] = {}
    for schema in schemas:
        for field in schema.struct(unconstrained).fields:
            known = fields.get(field.name)
            if known is None:
                fields[field.name] = field
            elif known.dataType != field.dataType:
                raise SchemaConflictError(field.name, known.dataType.simpleString(), field.dataType.simpleString())
    return StructType(list(fields.values()))


def row_image() -> Column:
    """Each change's row image: ``after``, or ``before`` for a delete (its key, under the default replica identity)."""
    return F.when(F.col(OP) == Op.DELETE.value, F.col(BEFORE)).otherwise(F.col(AFTER))


def output_schema(row: StructType | None) -> StructType:
    """The source's full schema; ``row=None`` (a topic without schema record) gives JSON-string images."""
    image: DataType = StringType() if row is None else row
    return StructType(
        [
            StructField(TOPIC, StringType(), nullable=False),
            StructField(PARTITION, IntegerType(), nullable=False),
            StructField(OFFSET, LongType(), nullable=False),
            StructField(TIMESTAMP, TimestampType(), nullable=False),
            StructField(KEY, StringType()),
            StructField(OP, StringType()),
            StructField(SEQ, StringType()),
            StructField(COMMIT_LSN, LongType()),
            StructField(TXN_INDEX, LongType()),
            StructField(COMMIT_TS, TimestampType()),
            StructField(SNAPSHOT, StringType()),
            StructField(SOURCE_DB, StringType()),
            StructField(SOURCE_SCHEMA, StringType()),
            StructField(SOURCE_TABLE, StringType()),
            StructField(BEFORE, image),
            StructField(AFTER, image),
        ]
    )
