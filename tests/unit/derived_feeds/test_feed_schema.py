"""Feed schema records: every Spark output type maps to a descriptor the log source reads back as that type."""

from __future__ import annotations

import pytest
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from core.source_config import TypesConfig
from derived_feeds.feed_schema import schema_record, type_descriptor
from spark_log.source_schema import row_schema

ROUND_TRIP = [
    BooleanType(),
    ShortType(),
    IntegerType(),
    LongType(),
    FloatType(),
    DoubleType(),
    DecimalType(10, 2),
    DecimalType(38, 0),
    StringType(),
    BinaryType(),
    DateType(),
    TimestampType(),
    TimestampNTZType(),
    ArrayType(IntegerType()),
    ArrayType(StringType()),
    ArrayType(DecimalType(5, 1)),
]


@pytest.mark.parametrize("dtype", ROUND_TRIP, ids=lambda t: t.simpleString())
def test_spark_type_round_trips_through_the_schema_record(dtype):
    struct = StructType([StructField("id", LongType()), StructField("c", dtype)])
    record = schema_record("f", "f", struct, ["id"], 1)
    read_back = row_schema("f", [record], TypesConfig()).struct()
    assert read_back["c"].dataType == dtype
    assert [c["key"] for c in record["columns"]] == [True, False]


def test_nested_types_are_recorded_as_json_text():
    assert type_descriptor(MapType(StringType(), IntegerType()))[0] == 114
    struct = StructType([StructField("m", StructType([StructField("x", IntegerType())]))])
    assert (
        row_schema("f", [schema_record("f", "f", struct, [], 1)], TypesConfig()).struct()["m"].dataType == StringType()
    )


def test_numeric_typmod_is_postgres_encoding():
    assert type_descriptor(DecimalType(10, 2)) == (1700, (10 << 16 | 2) + 4)
