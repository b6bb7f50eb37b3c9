"""The native row decoder (native/binlog_rows.c) against its twin, the Python readers: same values, same types.

Row images are built from values of every column type the plan claims (extremes, NULLs, multi-byte
length prefixes, every fractional-second precision, zero and impossible dates) and from arbitrary
bytes; whatever the extension answers must be what the readers return, and it must answer every
well-formed image.
"""

from __future__ import annotations

import math
import struct
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import native
from capture.mysql.binlog.events import Rows
from capture.mysql.binlog.rows import RowDecoder
from capture.mysql.binlog.table_map import BINARY_COLLATION, ColumnShape, ColumnType, TableShape
from capture.mysql.types.charsets import Charsets
from capture.mysql.types.decimal_codec import decimal_size
from capture.mysql.types.row_plan import row_plan
from capture.mysql.types.values import TypeModes

pytestmark = pytest.mark.skipif(native.speedups is None, reason="the native extension is not built")

UTF8, LATIN1 = 45, 8
CHARSETS = Charsets(
    [
        (UTF8, "utf8mb4", "utf8mb4_general_ci"),
        (BINARY_COLLATION, "binary", "binary"),
        (LATIN1, "latin1", "latin1_swedish_ci"),
    ]
)
_DIG2BYTES = (0, 1, 1, 2, 2, 3, 3, 4, 4, 4)


def _decimal_bytes(digits: str, negative: bool, precision: int, scale: int) -> bytes:
    """MySQL's decimal2bin of ``digits`` (precision digits, the last ``scale`` of them the fraction)."""
    whole, fraction = digits[: precision - scale], digits[precision - scale :]
    out = bytearray()
    lead = len(whole) % 9
    if lead:
        out += int(whole[:lead]).to_bytes(_DIG2BYTES[lead], "big")
    for i in range(lead, len(whole), 9):
        out += int(whole[i : i + 9]).to_bytes(4, "big")
    for i in range(0, scale - scale % 9, 9):
        out += int(fraction[i : i + 9]).to_bytes(4, "big")
    if scale % 9:
        out += int(fraction[scale - scale % 9 :]).to_bytes(_DIG2BYTES[scale % 9], "big")
    out[0] |= 0x80
    return bytes(b ^ 0xFF for b in out) if negative else bytes(out)


def _fraction(micro: int, fsp: int) -> bytes:
    size = (fsp + 1) // 2
    return (micro // (10_000 if size == 1 else 100 if size == 2 else 1)).to_bytes(size, "big") if size else b""


@st.composite
def _datetime2(draw: st.DrawFn, fsp: int) -> bytes:
    if draw(st.booleans()):
        return draw(st.binary(min_size=5 + (fsp + 1) // 2, max_size=5 + (fsp + 1) // 2))
    year, month, day = draw(st.integers(0, 9999)), draw(st.integers(0, 12)), draw(st.integers(0, 31))
    hms = draw(st.integers(0, 23)) << 12 | draw(st.integers(0, 59)) << 6 | draw(st.integers(0, 59))
    packed = ((year * 13 + month) << 5 | day) << 17 | hms
    return (packed + 0x8000000000).to_bytes(5, "big") + _fraction(draw(st.integers(0, 999_999)), fsp)


@st.composite
def _timestamp2(draw: st.DrawFn, fsp: int) -> bytes:
    seconds = draw(st.one_of(st.just(0), st.integers(0, 2**32 - 1)))
    return seconds.to_bytes(4, "big") + _fraction(draw(st.integers(0, 999_999)), fsp)


@st.composite
def _decimal(draw: st.DrawFn, precision: int, scale: int) -> bytes:
    if draw(st.integers(0, 4)) == 0:
        size = decimal_size(precision, scale)
        return draw(st.binary(min_size=size, max_size=size))
    digits = draw(st.text("0123456789", min_size=precision, max_size=precision))
    return _decimal_bytes(digits, draw(st.booleans()), precision, scale)


def _prefixed(prefix: int, data: bytes) -> bytes:
    return len(data).to_bytes(prefix, "little") + data


def _raw(size: int) -> st.SearchStrategy[bytes]:
    return st.binary(min_size=size, max_size=size)


def _text(prefix: int, limit: int) -> st.SearchStrategy[bytes]:
    valid = st.text(max_size=limit // 4).map(lambda s: _prefixed(prefix, s.encode()))
    return st.one_of(valid, st.binary(max_size=limit).map(lambda b: _prefixed(prefix, b)))


_INTEGERS = {ColumnType.TINY: 1, ColumnType.SHORT: 2, ColumnType.INT24: 3, ColumnType.LONG: 4, ColumnType.LONGLONG: 8}


def _kinds() -> list[tuple[ColumnShape, st.SearchStrategy[bytes]]]:
    """Every column type the plan claims, with a strategy for one value's bytes."""
    kinds: list[tuple[ColumnShape, st.SearchStrategy[bytes]]] = []
    for kind, size in _INTEGERS.items():
        for unsigned in (False, True):
            extremes = st.sampled_from(
                [b"\x00" * size, b"\xff" * size, b"\x7f" + b"\xff" * (size - 1), b"\x80" + b"\x00" * (size - 1)]
            )
            extremes = extremes.map(lambda b: b[::-1])  # little-endian: the sign byte last
            kinds.append((ColumnShape("i", kind, unsigned=unsigned), st.one_of(extremes, _raw(size))))
    kinds += [
        (ColumnShape("f", ColumnType.FLOAT, meta=4), _raw(4)),
        (ColumnShape("f", ColumnType.FLOAT, meta=4), st.floats(width=32).map(lambda f: struct.pack("<f", f))),
        (ColumnShape("d", ColumnType.DOUBLE, meta=8), _raw(8)),
        (ColumnShape("y", ColumnType.YEAR), _raw(1)),
        (ColumnShape("b", ColumnType.BIT, meta=1, bits=1), _raw(1)),
        (ColumnShape("v", ColumnType.VARCHAR, meta=64, collation=UTF8), _text(1, 64)),
        (ColumnShape("v", ColumnType.VARCHAR, meta=1200, collation=UTF8), _text(2, 1200)),
        (ColumnShape("v", ColumnType.VARCHAR, meta=64, collation=None), _text(1, 64)),
        (ColumnShape("c", ColumnType.STRING, meta=40, collation=UTF8), _text(1, 40)),
        (
            ColumnShape("bn", ColumnType.STRING, meta=8, collation=BINARY_COLLATION),
            st.binary(max_size=8).map(lambda b: _prefixed(1, b)),
        ),
        (
            ColumnShape("vb", ColumnType.VARCHAR, meta=300, collation=BINARY_COLLATION),
            st.binary(max_size=300).map(lambda b: _prefixed(2, b)),
        ),
        (
            ColumnShape("e", ColumnType.ENUM, meta=1, collation=UTF8, enum_values=(b"a", b"b\xc3\xa9", b"c")),
            st.integers(0, 3).map(lambda i: bytes([i])),
        ),
        (
            ColumnShape(
                "e", ColumnType.ENUM, meta=2, collation=UTF8, enum_values=tuple(b"x%d" % i for i in range(300))
            ),
            st.integers(0, 301).map(lambda i: i.to_bytes(2, "little")),
        ),
        (ColumnShape("s", ColumnType.SET, meta=1, collation=UTF8, set_values=(b"r", b"g", b"b")), _raw(1)),
        (
            ColumnShape("s", ColumnType.SET, meta=2, collation=UTF8, set_values=tuple(b"m%d" % i for i in range(10))),
            _raw(2),
        ),
    ]
    for prefix in (1, 2, 3, 4):
        kinds.append((ColumnShape("t", ColumnType.BLOB, meta=prefix, collation=UTF8), _text(prefix, 300)))
        kinds.append(
            (
                ColumnShape("bl", ColumnType.BLOB, meta=prefix, collation=BINARY_COLLATION),
                st.binary(max_size=300).map(lambda b, p=prefix: _prefixed(p, b)),
            )
        )
    for precision, scale in ((12, 2), (10, 0), (9, 9), (1, 0), (18, 9), (38, 10), (65, 30), (65, 0), (30, 30)):
        kinds.append(
            (
                ColumnShape("n", ColumnType.NEWDECIMAL, meta=precision, precision=precision, scale=scale),
                _decimal(precision, scale),
            )
        )
    for nullable in (True, False):
        kinds.append((ColumnShape("dt", ColumnType.DATE, nullable=nullable), _raw(3)))
        for fsp in range(7):
            kinds += [
                (ColumnShape("dt2", ColumnType.DATETIME2, meta=fsp, nullable=nullable), _datetime2(fsp)),
                (ColumnShape("ts2", ColumnType.TIMESTAMP2, meta=fsp, nullable=nullable), _timestamp2(fsp)),
                (ColumnShape("t2", ColumnType.TIME2, meta=fsp, nullable=nullable), _raw(3 + (fsp + 1) // 2)),
            ]
    return kinds


KINDS = _kinds()
MODES = [
    TypeModes(),
    TypeModes(decimal="double", time="connect", binary="hex"),
    TypeModes(binary="base64-url-safe"),
]


def _same(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return struct.pack("<d", a) == struct.pack("<d", b) or (math.isnan(a) and math.isnan(b))
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _decode(decoder: RowDecoder, rows: Rows) -> Any:
    try:
        return decoder.decode(rows)
    except Exception as exc:
        return type(exc)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_native_rows_are_the_readers_rows(data: st.DataObject) -> None:
    columns = data.draw(st.lists(st.sampled_from(range(len(KINDS))), min_size=1, max_size=12))
    modes = data.draw(st.sampled_from(MODES))
    skip = frozenset(i for i in range(len(columns)) if data.draw(st.integers(0, 5)) == 0)
    shape = TableShape(1, "db", "t", tuple(KINDS[k][0] for k in columns))
    op = data.draw(st.sampled_from("cud"))
    body = bytearray(b"\x01\x02")  # the event's header fields the images follow
    for _ in range(data.draw(st.integers(1, 3)) * (2 if op == "u" else 1)):
        nulls = [data.draw(st.booleans()) and data.draw(st.booleans()) for _ in columns]
        body += sum(1 << i for i, null in enumerate(nulls) if null).to_bytes((len(columns) + 7) // 8, "little")
        for null, k in zip(nulls, columns, strict=True):
            if not null:
                body += data.draw(KINDS[k][1])
    everything = (1 << len(columns)) - 1
    rows = Rows(op, 1, 0, everything, everything, bytes(body), 2)
    native_decoder = RowDecoder(shape, modes, CHARSETS, skip)
    assert native_decoder._native is not None
    twin = _decode(RowDecoder(shape, modes, CHARSETS, skip, native=False), rows)
    answered = native.speedups.binlog_rows(rows.body, rows.start, {"c": 0, "d": 1}.get(op, 2), *native_decoder._native)  # type: ignore[union-attr]
    if answered is not None:
        assert _same(answered, twin), (answered, twin)
    else:
        assert _same(_decode(native_decoder, rows), twin)


def _one(column: ColumnShape, value: bytes, modes: TypeModes = MODES[0]) -> Any:
    shape = TableShape(1, "db", "t", (column,))
    rows = Rows("c", 1, 0, 1, 1, b"\x00" + value, 0)
    decoder = RowDecoder(shape, modes, CHARSETS)
    assert decoder._native is not None
    answered = native.speedups.binlog_rows(rows.body, 0, 0, *decoder._native)  # type: ignore[union-attr]
    assert answered is not None
    assert _same(answered, RowDecoder(shape, modes, CHARSETS, native=False).decode(rows))
    return answered[0][1][0]


def test_well_formed_values_are_answered_natively() -> None:
    assert _one(ColumnShape("i", ColumnType.LONGLONG, unsigned=True), b"\xff" * 8) == -1  # a Java long
    assert _one(ColumnShape("i", ColumnType.LONG, unsigned=True), b"\xff" * 4) == 2**32 - 1
    assert _one(ColumnShape("i", ColumnType.INT24), b"\x00\x00\x80") == -(2**23)
    assert _one(ColumnShape("f", ColumnType.FLOAT, meta=4), struct.pack("<f", 1.1)) == 1.1
    assert (
        _one(ColumnShape("n", ColumnType.NEWDECIMAL, precision=14, scale=4), bytes.fromhex("7EF204C72DFB2D"))
        == "-1234567890.1234"
    )
    assert (
        _one(ColumnShape("n", ColumnType.NEWDECIMAL, precision=4, scale=2), _decimal_bytes("0000", True, 4, 2))
        == "0.00"
    )
    assert (
        _one(ColumnShape("v", ColumnType.VARCHAR, meta=1200, collation=UTF8), _prefixed(2, ("é" * 300).encode()))
        == "é" * 300
    )
    assert _one(ColumnShape("b", ColumnType.STRING, meta=4, collation=BINARY_COLLATION), b"\x02ab") == "YWIAAA=="
    midnight = ((2026 * 13 + 1) << 5 | 1) << 17
    assert (
        _one(
            ColumnShape("dt", ColumnType.DATETIME2, meta=6),
            (midnight + 0x8000000000).to_bytes(5, "big") + (500_001).to_bytes(3, "big"),
        )
        == 1_767_225_600_500_001
    )
    assert _one(ColumnShape("dt", ColumnType.DATETIME2, meta=6, nullable=False), b"\x80" + b"\x00" * 7) == 0
    assert _one(ColumnShape("dt", ColumnType.DATETIME2, meta=6), b"\x80" + b"\x00" * 7) is None
    assert (
        _one(
            ColumnShape("ts", ColumnType.TIMESTAMP2, meta=3),
            (1_767_225_600).to_bytes(4, "big") + (5000).to_bytes(2, "big"),
        )
        == "2026-01-01T00:00:00.500Z"
    )
    # -12:34:56.7891 as TIME(4): integer part and fraction both two's complement (test_binlog_values)
    packed = -((12 << 12 | 34 << 6 | 56) << 24) - 789_100
    integral, frac = -((-packed) >> 24) - 1, 0x10000 - 7891
    time4 = (integral + 0x800000).to_bytes(3, "big") + frac.to_bytes(2, "big")
    assert _one(ColumnShape("t", ColumnType.TIME2, meta=4), time4) == -(
        (12 * 3600 + 34 * 60 + 56) * 1_000_000 + 789_100
    )
    assert _one(ColumnShape("t", ColumnType.TIME2, meta=4), time4, MODES[1]) is None  # connect: not a time of day


def test_a_shape_with_a_column_the_extension_does_not_write_has_no_plan() -> None:
    for column, modes in (
        (ColumnShape("g", ColumnType.GEOMETRY, meta=4), MODES[0]),
        (ColumnShape("b", ColumnType.BIT, meta=9, bits=9), MODES[0]),
        (ColumnShape("n", ColumnType.NEWDECIMAL, precision=10, scale=2), TypeModes(decimal="precise")),
        (ColumnShape("u", ColumnType.LONGLONG, unsigned=True), TypeModes(bigint_unsigned="precise")),
        (ColumnShape("l", ColumnType.VARCHAR, meta=10, collation=LATIN1), MODES[0]),
    ):
        shape = TableShape(1, "db", "t", (ColumnShape("id", ColumnType.LONG), column))
        assert row_plan(shape, modes, CHARSETS, frozenset()) is None
        assert row_plan(shape, modes, CHARSETS, frozenset({1})) is not None  # stepped over: planned
