"""A feed's output schema in both directions: Spark types -> ``_headwater.schemas`` columns, rows -> JSON values.

Feed topics are read back by the same ``headwater_log`` source as raw table topics, so a
feed records each column's logical type (:mod:`log.table_schemas`), with the Spark type as its
native name, and writes values in exactly the JSON form that type says. The logical types are
those of PG-like type descriptors (``type_oid``, ``typmod``, also recorded, as in records
written before logical types were) under the default type modes
(:func:`log.pg_types.logical_type`; a feed's topic belongs to no source):

=========================  =====================  ==========================================
Spark type                 type_oid (typmod)      JSON value
=========================  =====================  ==========================================
Boolean                    bool 16                true / false
Byte / Short               int2 21                number
Integer                    int4 23                number
Long                       int8 20                number
Float / Double             float4 700 / float8    number; NaN, Infinity as strings
Decimal(p,s)               numeric 1700 (p,s)     plain decimal string ("12.30")
String                     text 25                string
Binary                     bytea 17               base64 string
Date                       date 1082              days since 1970-01-01
Timestamp                  timestamptz 1184       ISO-8601 UTC string ("...Z")
TimestampNTZ               timestamp 1114         microseconds since epoch
Array<simple type>         the element's array    array of the element's values
struct, map, other         json 114               the value's JSON text, as a string
=========================  =====================  ==========================================

The round trip is exact: ``spark_log.source_schema.spark_type(logical_type(oid, typmod))`` gives the
original Spark type for every row above (``tests/unit/derived_feeds/test_feed_schema.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from core.source_config import TypesConfig
from log.pg_types import Oid, logical_type
from log.row_types import connect_schema

if TYPE_CHECKING:
    from pyspark.sql import Column

#: Array type oid of each element oid (PostgreSQL ``pg_type.typarray``).
_ARRAY_OF: dict[int, int] = {
    Oid.BOOL: 1000,
    Oid.BYTEA: 1001,
    Oid.INT2: 1005,
    Oid.INT4: 1007,
    Oid.TEXT: 1009,
    Oid.INT8: 1016,
    Oid.FLOAT4: 1021,
    Oid.FLOAT8: 1022,
    Oid.TIMESTAMP: 1115,
    Oid.DATE: 1182,
    Oid.TIMESTAMPTZ: 1185,
    Oid.NUMERIC: 1231,
}
#: Options of ``to_json`` for feed values: nulls kept (as capture writes them), microsecond UTC timestamps.
JSON_OPTIONS = {"ignoreNullFields": "false", "timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX"}


def numeric_typmod(precision: int, scale: int) -> int:
    """PostgreSQL's ``atttypmod`` of ``numeric(precision, scale)``."""
    return ((precision << 16) | (scale & 0xFFFF)) + 4


def _scalar_oid(dtype: DataType) -> tuple[int, int] | None:
    simple: list[tuple[type[DataType], int]] = [
        (BooleanType, Oid.BOOL),
        (ByteType, Oid.INT2),
        (ShortType, Oid.INT2),
        (IntegerType, Oid.INT4),
        (LongType, Oid.INT8),
        (FloatType, Oid.FLOAT4),
        (DoubleType, Oid.FLOAT8),
        (StringType, Oid.TEXT),
        (BinaryType, Oid.BYTEA),
        (DateType, Oid.DATE),
        (TimestampType, Oid.TIMESTAMPTZ),
        (TimestampNTZType, Oid.TIMESTAMP),
    ]
    for kind, oid in simple:
        if isinstance(dtype, kind):
            return int(oid), -1
    if isinstance(dtype, DecimalType):
        return int(Oid.NUMERIC), numeric_typmod(dtype.precision, dtype.scale)
    return None


def type_descriptor(dtype: DataType) -> tuple[int, int]:
    """``(type_oid, typmod)`` a feed column of Spark type ``dtype`` is recorded with (module table)."""
    scalar = _scalar_oid(dtype)
    if scalar is not None:
        return scalar
    if isinstance(dtype, ArrayType):
        element = _scalar_oid(dtype.elementType)
        if element is not None and element[0] in _ARRAY_OF:
            return _ARRAY_OF[element[0]], element[1]
    return int(Oid.JSON), -1


#: The type modes a feed topic is read with (it belongs to no source).
_FEED_MODES = TypesConfig()


def schema_columns(struct: StructType, key: Sequence[str]) -> list[dict[str, Any]]:
    """The ``columns`` of a feed's ``_headwater.schemas`` record."""
    columns = []
    for field in struct.fields:
        oid, typmod = type_descriptor(field.dataType)
        columns.append(
            {
                "name": field.name,
                "logical": connect_schema(logical_type(oid, typmod, _FEED_MODES)),
                "native": field.dataType.simpleString(),
                "type_oid": oid,
                "typmod": typmod,
                "key": field.name in key,
            }
        )
    return columns


def schema_record(topic: str, feed: str, struct: StructType, key: Sequence[str], version: int) -> dict[str, Any]:
    """The value written to ``_headwater.schemas`` (keyed by the feed's topic), shaped like capture's."""
    return {
        "topic": topic,
        "schema": "feed",
        "table": feed,
        "replica_identity": "d",
        "key": list(key),
        "key_source": "feed",
        "columns": schema_columns(struct, key),
        "version": version,
    }


def _wire_scalar(column: Column, dtype: DataType) -> Column | None:
    if isinstance(dtype, DecimalType):
        return column.cast("string")  # plain text, never E-notation (decimal_handling_mode=string)
    if isinstance(dtype, DateType):
        return F.unix_date(column)
    if isinstance(dtype, TimestampNTZType):
        return F.unix_micros(column.cast("timestamp"))  # session time zone is UTC (session.py)
    if isinstance(dtype, ByteType):
        return column.cast("short")
    if _scalar_oid(dtype) is not None:
        return column
    return None


def wire_column(column: Column, dtype: DataType) -> Column:
    """``column`` converted to the form whose ``to_json`` is the value the reader expects."""
    scalar = _wire_scalar(column, dtype)
    if scalar is not None:
        return scalar
    if isinstance(dtype, ArrayType) and type_descriptor(dtype)[0] != Oid.JSON:
        element = dtype.elementType
        if isinstance(element, (DecimalType, DateType, TimestampNTZType, ByteType)):
            return F.transform(column, lambda item: _wire_scalar(item, element))  # type: ignore[arg-type,return-value]
        return column
    return F.to_json(column, JSON_OPTIONS)


def wire_struct(column: Column, struct: StructType) -> Column:
    """A row image (STRUCT ``column`` of type ``struct``) ready for ``to_json``; null stays null."""
    fields = [wire_column(column[f.name], f.dataType).alias(f.name) for f in struct.fields]
    return F.when(column.isNull(), F.lit(None)).otherwise(F.struct(*fields))
