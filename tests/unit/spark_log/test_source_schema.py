"""The pure schema mapping: logical types -> Spark types, schema versions -> row struct."""

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
    ShortType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from core.source_config import TypesConfig
from log.row_types import LogicalKind as K
from log.row_types import LogicalType as L
from spark_log.errors import SchemaConflictError
from spark_log.source_schema import POINT_TYPE, merged_struct, output_schema, row_schema, spark_type


@pytest.mark.parametrize(
    ("logical", "expected"),
    [
        (L(K.BOOLEAN), BooleanType()),
        (L(K.INT16), ShortType()),
        (L(K.INT32), IntegerType()),
        (L(K.INT64), LongType()),
        (L(K.FLOAT), FloatType()),
        (L(K.DOUBLE), DoubleType()),
        (L(K.DECIMAL, 10, 2), DecimalType(10, 2)),
        (L(K.DECIMAL, 50, 2), StringType()),
        (L(K.DECIMAL, 5, -2), DecimalType(7, 0)),
        (L(K.DECIMAL, None, 2), DecimalType(38, 2)),
        (L(K.DECIMAL), StringType()),
        (L(K.DECIMAL_BASE64, 12, 4), DecimalType(12, 4)),
        (L(K.DECIMAL_VARIABLE), StringType()),
        (L(K.BYTES_BASE64), BinaryType()),
        (L(K.BYTES_HEX), BinaryType()),
        (L(K.BITS), BinaryType()),
        (L(K.DATE), DateType()),
        (L(K.TIME_MS), LongType()),
        (L(K.TIME_US), LongType()),
        (L(K.TIMESTAMP_MS), TimestampNTZType()),
        (L(K.TIMESTAMP_US), TimestampNTZType()),
        (L(K.TIMESTAMPTZ_STRING), TimestampType()),
        (L(K.TIMETZ_STRING), StringType()),
        (L(K.INTERVAL_US), LongType()),
        (L(K.JSON), StringType()),
        (L(K.UUID), StringType()),
        (L(K.ENUM), StringType()),
        (L(K.STRING), StringType()),
        (L(K.POINT), POINT_TYPE),
        (L(K.ARRAY, element=L(K.INT32)), ArrayType(IntegerType())),
        (L(K.ARRAY, element=L(K.ARRAY, element=L(K.DATE))), ArrayType(ArrayType(DateType()))),
    ],
    ids=str,
)
def test_spark_type_table(logical, expected):
    assert spark_type(logical) == expected


def test_unconstrained_numeric_option():
    assert spark_type(L(K.DECIMAL), "decimal") == DecimalType(38, 10)
    assert spark_type(L(K.DECIMAL_VARIABLE), "decimal") == DecimalType(38, 10)
    assert spark_type(L(K.DECIMAL, 10, 2), "decimal") == DecimalType(10, 2)


def col(name, oid, typmod=-1, key=False):
    return {"name": name, "type_oid": oid, "typmod": typmod, "key": key}


def test_latest_version_wins_and_dropped_columns_stay():
    v1 = {"version": 1, "columns": [col("id", 23, key=True), col("old", 25), col("n", 23)]}
    v2 = {"version": 2, "columns": [col("id", 23, key=True), col("n", 20), col("added", 1184)]}
    schema = row_schema("s.public.t", [v2, v1], TypesConfig())  # any order
    assert schema.version == 2
    struct = schema.struct()
    assert struct.fieldNames() == ["id", "n", "added", "old"]
    assert struct["n"].dataType == LongType()  # type change: the latest type
    assert struct["added"].dataType == TimestampType()
    assert all(field.nullable for field in struct.fields)


def test_modes_change_the_logical_type():
    v1 = {"version": 1, "columns": [col("price", 1700, (10 << 16 | 2) + 4), col("b", 17)]}
    precise = row_schema("t", [v1], TypesConfig(decimal_handling_mode="precise", binary_handling_mode="hex"))
    assert precise.columns[0].logical.kind is K.DECIMAL_BASE64
    assert precise.columns[1].logical.kind is K.BYTES_HEX
    assert precise.struct()["price"].dataType == DecimalType(10, 2)
    double = row_schema("t", [v1], TypesConfig(decimal_handling_mode="double"))
    assert double.struct()["price"].dataType == DoubleType()


def test_unknown_type_oids_read_as_strings():
    # An enum's oid is database-specific: without pg_type the record cannot name it.
    schema = row_schema("t", [{"version": 1, "columns": [col("mood", 16_500)]}], TypesConfig())
    assert schema.struct()["mood"].dataType == StringType()


def test_merged_struct_unions_and_rejects_conflicts():
    a = row_schema("a", [{"version": 1, "columns": [col("id", 23), col("x", 25)]}], TypesConfig())
    b = row_schema("b", [{"version": 1, "columns": [col("id", 23), col("y", 16)]}], TypesConfig())
    assert merged_struct([a, b]).fieldNames() == ["id", "x", "y"]
    c = row_schema("c", [{"version": 1, "columns": [col("id", 25)]}], TypesConfig())
    with pytest.raises(SchemaConflictError, match="'id'"):
        merged_struct([a, c])


def test_output_schema_json_images_without_schema_record():
    schema = output_schema(None)
    assert schema["after"].dataType == StringType()
    assert schema.fieldNames()[:4] == ["topic", "partition", "offset", "timestamp"]
    typed = output_schema(StructType([]))
    assert isinstance(typed["before"].dataType, StructType)
