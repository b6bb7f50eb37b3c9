"""Logical types in Debezium's schema vocabulary: every kind has one form, and it reads back to itself."""

from __future__ import annotations

import pytest

from log.row_types import LogicalKind, LogicalType, UnknownLogicalTypeError, connect_schema, from_connect_schema

SAMPLES = [
    *(LogicalType(kind) for kind in LogicalKind if kind is not LogicalKind.ARRAY),
    LogicalType(LogicalKind.DECIMAL, 10, 2),
    LogicalType(LogicalKind.DECIMAL, None, 2),
    LogicalType(LogicalKind.DECIMAL_BASE64, 38, -3),
    LogicalType(LogicalKind.ARRAY, element=LogicalType(LogicalKind.INT32)),
    LogicalType(
        LogicalKind.ARRAY, element=LogicalType(LogicalKind.ARRAY, element=LogicalType(LogicalKind.DECIMAL, 5, 1))
    ),
]


@pytest.mark.parametrize("logical", SAMPLES, ids=str)
def test_every_logical_type_reads_back_from_its_schema(logical: LogicalType) -> None:
    assert from_connect_schema(connect_schema(logical)) == logical


def test_kinds_have_distinct_forms() -> None:
    forms = {(connect_schema(LogicalType(k))["type"], connect_schema(LogicalType(k)).get("name")) for k in LogicalKind}
    assert len(forms) == len(LogicalKind)


def test_debezium_names() -> None:
    assert connect_schema(LogicalType(LogicalKind.TIMESTAMP_US)) == {
        "type": "int64",
        "name": "io.debezium.time.MicroTimestamp",
    }
    assert connect_schema(LogicalType(LogicalKind.DECIMAL_BASE64, 10, 2)) == {
        "type": "bytes",
        "name": "org.apache.kafka.connect.data.Decimal",
        "parameters": {"scale": "2", "connect.decimal.precision": "10"},
    }
    assert connect_schema(LogicalType(LogicalKind.ARRAY, element=LogicalType(LogicalKind.STRING))) == {
        "type": "array",
        "items": {"type": "string"},
    }


def test_an_unknown_form_is_refused() -> None:
    with pytest.raises(UnknownLogicalTypeError, match="unknown logical type"):
        from_connect_schema({"type": "int64", "name": "io.debezium.time.NanoTimestamp"})
