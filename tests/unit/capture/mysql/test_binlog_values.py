"""MySQL binlog value decoding without a server: binary DECIMAL, temporal formats, positions, Debezium forms."""

from __future__ import annotations

import base64
import struct
from decimal import Decimal, localcontext

import pytest
from hypothesis import given
from hypothesis import strategies as st

from capture.mysql.binlog.position import BinlogPosition, BinlogPositionError, Gtid, GtidPosition
from capture.mysql.types.decimal_codec import decimal_size, decode_decimal, precise_bytes
from capture.mysql.types.temporal import days_since_epoch, unpack_time2, zoned_timestamp
from capture.mysql.types.values import float32_value


def test_decimal_vectors_from_mysqls_documentation() -> None:
    # DECIMAL(14,4): 1234567890.1234 is 81 0D FB 38 D2 04 D2; its negation inverts every bit.
    assert decimal_size(14, 4) == 7
    assert decode_decimal(bytes.fromhex("810DFB38D204D2"), 14, 4) == "1234567890.1234"
    assert decode_decimal(bytes.fromhex("7EF204C72DFB2D"), 14, 4) == "-1234567890.1234"


def _encode_decimal(value: Decimal, precision: int, scale: int) -> bytes:
    """MySQL's decimal2bin, written from its description (the test's independent twin)."""
    dig2bytes = (0, 1, 1, 2, 2, 3, 3, 4, 4, 4)
    negative = value < 0
    digits = f"{abs(value):.{scale}f}"
    whole, _, fraction = digits.partition(".")
    whole = whole.lstrip("0").rjust(precision - scale, "0")
    out = bytearray()
    lead = (precision - scale) % 9
    if lead:
        out += int(whole[:lead]).to_bytes(dig2bytes[lead], "big")
    for i in range(lead, len(whole), 9):
        out += int(whole[i : i + 9]).to_bytes(4, "big")
    for i in range(0, scale - scale % 9, 9):
        out += int(fraction[i : i + 9]).to_bytes(4, "big")
    if scale % 9:
        out += int(fraction[scale - scale % 9 :]).to_bytes(dig2bytes[scale % 9], "big")
    out[0] |= 0x80
    if negative:
        out = bytearray(b ^ 0xFF for b in out)
    return bytes(out)


@given(st.data())
def test_decimal_round_trips_every_precision_and_scale(data: st.DataObject) -> None:
    precision = data.draw(st.integers(1, 65))
    scale = data.draw(st.integers(0, min(30, precision)))
    unscaled = data.draw(st.integers(-(10**precision) + 1, 10**precision - 1))
    with localcontext(prec=200):  # Decimal arithmetic rounds to 28 digits by default
        value = Decimal(unscaled).scaleb(-scale)
        encoded = _encode_decimal(value, precision, scale)
        expected_fraction = f"{abs(value):.{scale}f}".partition(".")[2]
    assert len(encoded) == decimal_size(precision, scale)
    text = decode_decimal(encoded, precision, scale)
    assert Decimal(text) == value
    assert not text.startswith("-0") or (text.startswith("-0.") and Decimal(text) != 0)
    assert (text.partition(".")[2] if scale else "") == expected_fraction


def test_precise_is_javas_biginteger_bytes() -> None:
    assert precise_bytes("1.50") == "AJY="  # Debezium 3.6.3 wrote this for DECIMAL(10,2) 1.50
    assert base64.b64decode(precise_bytes("-1")) == b"\xff"
    assert base64.b64decode(precise_bytes("128")) == b"\x00\x80"
    assert base64.b64decode(precise_bytes("-129")) == b"\xff\x7f"


def test_time2_fractions_of_negative_times() -> None:
    # -12:34:56.7891 as TIME(4): integer part 3 bytes (offset 2^23), fraction 2 bytes, both two's complement.
    packed = -((12 << 12 | 34 << 6 | 56) << 24) - 789_100
    integral, frac = -((-packed) >> 24) - 1, ((-packed) & 0xFFFFFF) and (0x10000 - 7891)
    data = (integral + 0x800000).to_bytes(3, "big") + frac.to_bytes(2, "big")
    assert unpack_time2(data, 0, 4) == -((12 * 3600 + 34 * 60 + 56) * 1_000_000 + 789_100)
    six = ((12 << 12 | 34 << 6 | 56) << 24 | 789_012) + 0x800000000000
    assert unpack_time2(six.to_bytes(6, "big"), 0, 6) == (12 * 3600 + 34 * 60 + 56) * 1_000_000 + 789_012


def test_zoned_timestamp_has_the_columns_fractional_digits() -> None:
    micros = 1_767_225_600_500_000  # 2026-01-01T00:00:00.5Z
    assert zoned_timestamp(micros, 0) == "2026-01-01T00:00:00Z"
    assert zoned_timestamp(micros, 3) == "2026-01-01T00:00:00.500Z"
    assert zoned_timestamp(micros, 6) == "2026-01-01T00:00:00.500000Z"


def test_zero_and_impossible_dates_have_no_day() -> None:
    assert days_since_epoch(0, 0, 0) is None
    assert days_since_epoch(2020, 0, 10) is None
    assert days_since_epoch(2021, 2, 29) is None
    assert days_since_epoch(1970, 1, 2) == 1
    assert days_since_epoch(1969, 12, 31) == -1


@given(st.floats(width=32, allow_nan=False, allow_infinity=False))
def test_float32_value_is_the_same_float_written_shortest(raw: float) -> None:
    value = float32_value(raw)
    assert struct.pack("<f", value) == struct.pack("<f", raw)
    assert len(repr(value)) <= len(repr(raw))


def test_positions_order_by_file_number_then_offset() -> None:
    a, b, c = (
        BinlogPosition("binlog.000009", 900),
        BinlogPosition("binlog.000010", 4),
        BinlogPosition.parse("binlog.000010:120"),
    )
    assert a < b < c
    assert a.sequence() < b.sequence() < c.sequence()
    assert str(c) == "binlog.000010:120"
    with pytest.raises(BinlogPositionError):
        BinlogPosition("binlog", 4).sequence()


def test_gtid_positions_keep_the_last_gtid_per_domain() -> None:
    position = GtidPosition.parse("0-1-42,1-2-7")
    assert str(position.advanced(Gtid.parse("0-1-43"))) == "0-1-43,1-2-7"
    with pytest.raises(BinlogPositionError):
        GtidPosition.parse("0-1-1,0-2-2")
    with pytest.raises(BinlogPositionError):
        Gtid.parse("3E11FA47-71CA-11E1-9E33-C80AA9429562:23")
