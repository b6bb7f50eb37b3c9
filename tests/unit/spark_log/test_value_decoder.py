"""JSON values -> Arrow arrays for each logical type (pure, no Spark)."""

from __future__ import annotations

import base64
import datetime as dt
import math
from decimal import Decimal

import pyarrow as pa
import pytest

from log.row_types import LogicalKind as K
from log.row_types import LogicalType as L
from spark_log.value_decoder import MAX_TIMESTAMP_US, MIN_TIMESTAMP_US, BadValue, decode_values

UTC = dt.UTC


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_integers_and_booleans():
    assert decode_values([1, None, 3], L(K.INT32), pa.int32()).to_pylist() == [1, None, 3]
    assert decode_values([True, None], L(K.BOOLEAN), pa.bool_()).to_pylist() == [True, None]
    with pytest.raises(BadValue) as caught:
        decode_values([1, "x"], L(K.INT64), pa.int64())
    assert caught.value.index == 1


def test_float_specials():
    got = decode_values([1.5, "NaN", "Infinity", "-Infinity", None], L(K.DOUBLE), pa.float64()).to_pylist()
    assert got[0] == 1.5
    assert math.isnan(got[1])
    assert got[2:] == [math.inf, -math.inf, None]


def test_decimal_string_mode():
    target = pa.decimal128(10, 2)
    got = decode_values(["1.50", None, "-3.25"], L(K.DECIMAL, 10, 2), target)
    assert got.type == target
    assert got.to_pylist() == [Decimal("1.50"), None, Decimal("-3.25")]
    # NaN cannot live in a DECIMAL: null (documented); more scale: rounded half-even.
    special = decode_values(["NAN", "2.345", "2.355"], L(K.DECIMAL, 10, 2), target).to_pylist()
    assert special == [None, Decimal("2.34"), Decimal("2.36")]
    with pytest.raises(BadValue, match="more than 10 digits"):
        decode_values(["123456789012.5"], L(K.DECIMAL, 10, 2), target)


def test_unconstrained_decimal_as_string_and_as_decimal():
    assert decode_values(["1.000000000001", "NAN"], L(K.DECIMAL), pa.string()).to_pylist() == [
        "1.000000000001",
        "NAN",
    ]
    got = decode_values(["1.00000000000149"], L(K.DECIMAL), pa.decimal128(38, 10)).to_pylist()
    assert got == [Decimal("1.0000000000")]


def test_precise_modes():
    unscaled = (-12345).to_bytes(2, "big", signed=True)
    assert decode_values([b64(unscaled)], L(K.DECIMAL_BASE64, 10, 2), pa.decimal128(10, 2)).to_pylist() == [
        Decimal("-123.45")
    ]
    variable = {"scale": 3, "value": b64((1234).to_bytes(2, "big", signed=True))}
    assert decode_values([variable, None], L(K.DECIMAL_VARIABLE), pa.string()).to_pylist() == ["1.234", None]


def test_bytes():
    assert decode_values([b64(b"\x00\xff"), None], L(K.BYTES_BASE64), pa.binary()).to_pylist() == [b"\x00\xff", None]
    assert decode_values(["00ff"], L(K.BYTES_HEX), pa.binary()).to_pylist() == [b"\x00\xff"]
    with pytest.raises(BadValue, match="base64"):
        decode_values(["not base64!"], L(K.BYTES_BASE64), pa.binary())


def test_dates_clamp_infinity():
    got = decode_values([0, 19_723, 2_147_483_647, -(2**31), None], L(K.DATE), pa.date32()).to_pylist()
    assert got == [dt.date(1970, 1, 1), dt.date(2024, 1, 1), dt.date(9999, 12, 31), dt.date(1, 1, 1), None]


def test_times():
    us = decode_values([3_723_000_001, 86_400_000_000, None], L(K.TIME_US), pa.time64("ns")).to_pylist()
    assert us == [dt.time(1, 2, 3, 1), dt.time(23, 59, 59, 999_999), None]
    ms = decode_values([3_723_004], L(K.TIME_MS), pa.time64("ns")).to_pylist()
    assert ms == [dt.time(1, 2, 3, 4000)]
    # The default Spark type (Long): microseconds past midnight for both precisions.
    assert decode_values([3_723_004, None], L(K.TIME_MS), pa.int64()).to_pylist() == [3_723_004_000, None]
    assert decode_values([86_400_000_000], L(K.TIME_US), pa.int64()).to_pylist() == [86_399_999_999]


def test_local_timestamps():
    target = pa.timestamp("us")
    assert decode_values([1_000], L(K.TIMESTAMP_MS), target).to_pylist() == [dt.datetime(1970, 1, 1, 0, 0, 1)]
    got = decode_values([1, 9_223_372_036_825_200_000], L(K.TIMESTAMP_US), target).cast(pa.int64()).to_pylist()
    assert got == [1, MAX_TIMESTAMP_US]


def test_timestamptz():
    target = pa.timestamp("us", tz="UTC")
    got = decode_values(["2024-03-01T10:00:00.250Z", None], L(K.TIMESTAMPTZ_STRING), target).to_pylist()
    assert got == [dt.datetime(2024, 3, 1, 10, 0, 0, 250_000, tzinfo=UTC), None]
    special = decode_values(
        ["infinity", "-infinity", "-0043-03-15T12:00:00Z", "2000-01-01T00:00:00Z"], L(K.TIMESTAMPTZ_STRING), target
    )
    micros = special.cast(pa.int64()).to_pylist()
    assert micros[:3] == [MAX_TIMESTAMP_US, MIN_TIMESTAMP_US, MIN_TIMESTAMP_US]
    assert micros[3] == 946_684_800_000_000


def test_arrays_nested_and_null():
    target = pa.list_(pa.field("element", pa.int32()))
    got = decode_values([[1, None], None, [], [[1, 2], [3, 4]]], L(K.ARRAY, element=L(K.INT32)), target)
    assert got.type == target
    assert got.to_pylist() == [[1, None], None, [], [1, 2, 3, 4]]  # 2-D flattened row-major


def test_array_bad_element_names_its_row():
    target = pa.list_(pa.field("element", pa.int32()))
    with pytest.raises(BadValue) as caught:
        decode_values([[1], [2, "x"]], L(K.ARRAY, element=L(K.INT32)), target)
    assert caught.value.index == 1


def test_array_of_dates():
    target = pa.list_(pa.field("element", pa.date32()))
    got = decode_values([[0, None]], L(K.ARRAY, element=L(K.DATE)), target).to_pylist()
    assert got == [[dt.date(1970, 1, 1), None]]


def test_point():
    target = pa.struct([pa.field("x", pa.float64()), pa.field("y", pa.float64())])
    got = decode_values([{"x": 1.0, "y": 2.5, "wkb": "", "srid": None}, None], L(K.POINT), target)
    assert got.to_pylist() == [{"x": 1.0, "y": 2.5}, None]


def test_strings_keep_non_string_values_as_json_text():
    got = decode_values(["a", ["happy", "sad"], 5, None], L(K.STRING), pa.string()).to_pylist()
    assert got == ["a", '["happy","sad"]', "5", None]
