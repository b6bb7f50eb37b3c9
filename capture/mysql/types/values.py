"""Row-image readers: a column's binlog bytes -> the JSON value Debezium's MySQL connector writes.

One reader per column, chosen once per table shape (:func:`column_reader`), called per value:
``reader(data, pos) -> (value, next_pos)``. Values follow Debezium 3.6's MySQL connector with
Kafka's JSON converter, in each handling mode (``docs/mysql-types.md`` has the matrix; the
conformance suite compares with the real connector):

* integers as numbers; unsigned BIGINT as a Java long (wrapping past 2^63-1) in ``long`` mode,
  as a DECIMAL in ``precise`` mode; FLOAT as the shortest decimal of its 32-bit value;
* DECIMAL per ``decimal_handling_mode``: ``string`` plain text, ``double`` a number,
  ``precise`` base64 of the unscaled two's-complement bytes;
* BIT(1) a boolean, BIT(n) base64 of its bytes little-endian; YEAR a number;
* CHAR/VARCHAR/TEXT text in the column's character set; ENUM its label, SET its labels joined
  by commas; BINARY/VARBINARY/BLOB per ``binary_handling_mode``; JSON (MariaDB) its text;
* DATE days since the epoch; DATETIME milliseconds (fsp <= 3, or ``connect`` mode) or
  microseconds since the epoch, read as UTC; TIME microseconds (milliseconds in ``connect``);
  TIMESTAMP ISO-8601 text in UTC; a zero date is null in a nullable column and the epoch in
  a NOT NULL one;
* GEOMETRY ``{"wkb": base64, "srid": n or null}``, plus ``x`` and ``y`` for a POINT column.
"""

from __future__ import annotations

import base64
import math
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from capture.mysql.binlog.table_map import ColumnShape, ColumnType
from capture.mysql.types.charsets import Charsets
from capture.mysql.types.decimal_codec import decimal_size, decode_decimal, precise_bytes
from capture.mysql.types.temporal import (
    fraction_bytes,
    unpack_date,
    unpack_datetime2,
    unpack_time2,
    unpack_timestamp2,
    zoned_timestamp,
)
from core.errors import PermanentError

Reader = Callable[[bytes, int], tuple[Any, int]]

DecimalMode = Literal["string", "precise", "double"]
TimeMode = Literal["adaptive_time_microseconds", "connect"]
BigintMode = Literal["long", "precise"]
BinaryMode = Literal["base64", "base64-url-safe", "hex"]


class UnsupportedColumnError(PermanentError):
    """A column type capture cannot decode exactly; the message names the column and what to do."""


@dataclass(frozen=True)
class TypeModes:
    """Debezium's MySQL handling modes (``binary`` ``bytes`` is ``base64`` in JSON)."""

    decimal: DecimalMode = "string"
    time: TimeMode = "adaptive_time_microseconds"
    bigint_unsigned: BigintMode = "long"
    binary: BinaryMode = "base64"


_INT = {
    (ColumnType.TINY, False): struct.Struct("<b"),
    (ColumnType.TINY, True): struct.Struct("<B"),
    (ColumnType.SHORT, False): struct.Struct("<h"),
    (ColumnType.SHORT, True): struct.Struct("<H"),
    (ColumnType.LONG, False): struct.Struct("<i"),
    (ColumnType.LONG, True): struct.Struct("<I"),
    (ColumnType.LONGLONG, False): struct.Struct("<q"),
    (ColumnType.LONGLONG, True): struct.Struct("<Q"),
}
_FLOAT = struct.Struct("<f")
_DOUBLE = struct.Struct("<d")
_MICROS_PER_MILLI = 1000
_MICROS_PER_DAY = 86_400_000_000


def float32_value(raw: float) -> float:
    """The double nearest the shortest decimal that reads back as the same 32-bit float (Java's Float.toString)."""
    if math.isnan(raw) or math.isinf(raw):
        return raw
    packed = _FLOAT.pack(raw)
    for digits in range(6, 10):
        candidate = float(f"{raw:.{digits}g}")
        if _FLOAT.pack(candidate) == packed:
            return candidate
    return raw


def binary_encoder(mode: BinaryMode) -> Callable[[bytes], str]:
    """Bytes -> their JSON text in ``binary_handling_mode``."""
    if mode == "hex":
        return lambda data: data.hex()
    if mode == "base64-url-safe":
        return lambda data: base64.urlsafe_b64encode(data).decode()
    return lambda data: base64.b64encode(data).decode()


def _integer(column: ColumnShape, modes: TypeModes) -> Reader:
    if column.type == ColumnType.INT24:
        signed = not column.unsigned

        def int24(data: bytes, pos: int) -> tuple[Any, int]:
            return int.from_bytes(data[pos : pos + 3], "little", signed=signed), pos + 3

        return int24
    unpack = _INT[(column.type, column.unsigned)].unpack_from
    size = _INT[(column.type, column.unsigned)].size
    if column.type == ColumnType.LONGLONG and column.unsigned:
        if modes.bigint_unsigned == "precise":
            # A Connect Decimal whatever decimal_handling_mode says: base64 of the unscaled bytes.
            return lambda data, pos: (precise_bytes(str(unpack(data, pos)[0])), pos + 8)

        def as_java_long(data: bytes, pos: int) -> tuple[Any, int]:
            value = unpack(data, pos)[0]
            return (value - (1 << 64) if value >= 1 << 63 else value), pos + 8

        return as_java_long

    def integer(data: bytes, pos: int) -> tuple[Any, int]:
        return unpack(data, pos)[0], pos + size

    return integer


def _decimal_from(text_reader: Reader, mode: DecimalMode) -> Reader:
    if mode == "string":
        return text_reader
    if mode == "double":

        def as_double(data: bytes, pos: int) -> tuple[Any, int]:
            text, pos = text_reader(data, pos)
            return float(text), pos

        return as_double

    def as_precise(data: bytes, pos: int) -> tuple[Any, int]:
        text, pos = text_reader(data, pos)
        return precise_bytes(text), pos

    return as_precise


def _decimal(column: ColumnShape, modes: TypeModes) -> Reader:
    precision, scale = column.precision, column.scale
    size = decimal_size(precision, scale)

    def text(data: bytes, pos: int) -> tuple[Any, int]:
        return decode_decimal(data[pos : pos + size], precision, scale), pos + size

    return _decimal_from(text, modes.decimal)


def _bit(column: ColumnShape) -> Reader:
    size = (column.bits + 7) // 8
    if column.bits == 1:
        return lambda data, pos: (bool(data[pos]), pos + 1)

    def bits(data: bytes, pos: int) -> tuple[Any, int]:
        return base64.b64encode(data[pos : pos + size][::-1]).decode(), pos + size

    return bits


def _length_prefixed(prefix: int, convert: Callable[[bytes], Any]) -> Reader:
    if prefix == 1:

        def short(data: bytes, pos: int) -> tuple[Any, int]:
            end = pos + 1 + data[pos]
            return convert(data[pos + 1 : end]), end

        return short

    def long(data: bytes, pos: int) -> tuple[Any, int]:
        length = int.from_bytes(data[pos : pos + prefix], "little")
        start = pos + prefix
        return convert(data[start : start + length]), start + length

    return long


def _string(column: ColumnShape, modes: TypeModes, charsets: Charsets, where: str) -> Reader:
    if column.type in (ColumnType.VARCHAR, ColumnType.VAR_STRING) or column.type == ColumnType.STRING:
        prefix = 1 if column.meta < 256 else 2
    else:  # BLOB family: the metadata is the length prefix's size
        prefix = column.meta
    if column.is_binary:
        encode = binary_encoder(modes.binary)
        if column.type == ColumnType.STRING:
            # BINARY(n) is stored without its trailing zero bytes; the row holds them.
            width = column.meta
            return _length_prefixed(prefix, lambda data: encode(data.ljust(width, b"\0")))
        return _length_prefixed(prefix, encode)
    return _length_prefixed(prefix, charsets.decoder(column.collation, where))


def _enum(column: ColumnShape, charsets: Charsets, where: str) -> Reader:
    decode = charsets.decoder(column.collation, where)
    labels = ("", *(decode(v) for v in column.enum_values))
    if column.meta == 1:
        return lambda data, pos: (labels[data[pos]], pos + 1)
    return lambda data, pos: (labels[data[pos] | data[pos + 1] << 8], pos + 2)


def _set(column: ColumnShape, charsets: Charsets, where: str) -> Reader:
    decode = charsets.decoder(column.collation, where)
    labels = [decode(v) for v in column.set_values]
    size = column.meta

    def members(data: bytes, pos: int) -> tuple[Any, int]:
        mask = int.from_bytes(data[pos : pos + size], "little")
        return ",".join(label for i, label in enumerate(labels) if mask >> i & 1), pos + size

    return members


def _temporal(column: ColumnShape, modes: TypeModes) -> Reader:
    fsp = column.meta
    frac = fraction_bytes(fsp)
    zero: Any = None if column.nullable else 0
    if column.type == ColumnType.DATE:

        def date(data: bytes, pos: int) -> tuple[Any, int]:
            days = unpack_date(data, pos)
            return (zero if days is None else days), pos + 3

        return date
    if column.type == ColumnType.DATETIME2:
        millis = modes.time == "connect" or fsp <= 3
        size = 5 + frac

        def datetime(data: bytes, pos: int) -> tuple[Any, int]:
            micros = unpack_datetime2(data, pos, fsp)
            if micros is None:
                return zero, pos + size
            return (micros // _MICROS_PER_MILLI if millis else micros), pos + size

        return datetime
    if column.type == ColumnType.TIMESTAMP2:
        size = 4 + frac
        zero_text = None if column.nullable else zoned_timestamp(0, fsp)

        def timestamp(data: bytes, pos: int) -> tuple[Any, int]:
            micros = unpack_timestamp2(data, pos, fsp)
            return (zero_text if micros == 0 else zoned_timestamp(micros, fsp)), pos + size

        return timestamp
    if column.type == ColumnType.TIME2:
        size = 3 + frac
        if modes.time == "connect":
            # Connect's Time is a time of day: a negative TIME or one of 24 hours or more is null.
            def time_of_day(data: bytes, pos: int) -> tuple[Any, int]:
                micros = unpack_time2(data, pos, fsp)
                return (micros // _MICROS_PER_MILLI if 0 <= micros < _MICROS_PER_DAY else None), pos + size

            return time_of_day

        def time(data: bytes, pos: int) -> tuple[Any, int]:
            return unpack_time2(data, pos, fsp), pos + size

        return time
    msg = f"old-format temporal column type {column.type.name}"
    raise UnsupportedColumnError(msg)


_GEOMETRY_POINT = 1


def geometry_json(value: bytes, *, point: bool) -> dict[str, Any]:
    """MySQL's internal geometry (SRID, 4 bytes little-endian, then WKB) -> Debezium's Geometry/Point JSON.

    SRID 0 is "none": null. A POINT column adds ``x`` and ``y``.
    """
    srid = int.from_bytes(value[:4], "little") or None
    wkb = value[4:]
    out: dict[str, Any] = {"wkb": base64.b64encode(wkb).decode(), "srid": srid}
    if point:
        out["x"], out["y"] = struct.unpack_from("<dd" if wkb[0] == 1 else ">dd", wkb, 5)
    return out


def _geometry(column: ColumnShape) -> Reader:
    point = column.geometry_type == _GEOMETRY_POINT
    return _length_prefixed(column.meta, lambda value: geometry_json(value, point=point))


def column_reader(column: ColumnShape, modes: TypeModes, charsets: Charsets, where: str) -> Reader:
    """The reader of one column's values; ``where`` (``db.table.column``) names it in errors."""
    kind = column.type
    if kind in (ColumnType.TINY, ColumnType.SHORT, ColumnType.INT24, ColumnType.LONG, ColumnType.LONGLONG):
        return _integer(column, modes)
    if kind == ColumnType.FLOAT:
        unpack_float = _FLOAT.unpack_from
        return lambda data, pos: (float32_value(unpack_float(data, pos)[0]), pos + 4)
    if kind == ColumnType.DOUBLE:
        unpack_double = _DOUBLE.unpack_from
        return lambda data, pos: (unpack_double(data, pos)[0], pos + 8)
    if kind == ColumnType.NEWDECIMAL:
        return _decimal(column, modes)
    if kind == ColumnType.BIT:
        return _bit(column)
    if kind == ColumnType.YEAR:
        return lambda data, pos: ((data[pos] + 1900 if data[pos] else 0), pos + 1)
    if kind in (ColumnType.VARCHAR, ColumnType.VAR_STRING, ColumnType.STRING, ColumnType.BLOB):
        return _string(column, modes, charsets, where)
    if kind == ColumnType.ENUM:
        return _enum(column, charsets, where)
    if kind == ColumnType.SET:
        return _set(column, charsets, where)
    if kind in (ColumnType.DATE, ColumnType.DATETIME2, ColumnType.TIMESTAMP2, ColumnType.TIME2):
        return _temporal(column, modes)
    if kind == ColumnType.GEOMETRY:
        return _geometry(column)
    msg = f"{where}: column type {kind.name} is not supported by MySQL capture yet"
    if kind == ColumnType.JSON:
        msg = f"{where}: MySQL's binary JSON is not supported by capture yet; exclude the column (columns.exclude)"
    raise UnsupportedColumnError(msg)


_FIXED_SIZE = {
    ColumnType.TINY: 1,
    ColumnType.SHORT: 2,
    ColumnType.INT24: 3,
    ColumnType.LONG: 4,
    ColumnType.LONGLONG: 8,
    ColumnType.FLOAT: 4,
    ColumnType.DOUBLE: 8,
    ColumnType.YEAR: 1,
    ColumnType.DATE: 3,
}


def skipped_size(column: ColumnShape) -> tuple[int, int]:
    """How a column's value is stepped over: ``(size, 0)`` for a fixed size, ``(0, prefix)`` for a length prefix."""
    kind = column.type
    if kind in _FIXED_SIZE:
        return _FIXED_SIZE[kind], 0
    if kind == ColumnType.NEWDECIMAL:
        return decimal_size(column.precision, column.scale), 0
    if kind == ColumnType.BIT:
        return (column.bits + 7) // 8, 0
    if kind in (ColumnType.ENUM, ColumnType.SET):
        return column.meta, 0
    if kind in (ColumnType.DATETIME2, ColumnType.TIMESTAMP2, ColumnType.TIME2):
        size = {ColumnType.DATETIME2: 5, ColumnType.TIMESTAMP2: 4, ColumnType.TIME2: 3}[kind]
        return size + fraction_bytes(column.meta), 0
    if kind in (ColumnType.VARCHAR, ColumnType.VAR_STRING, ColumnType.STRING):
        return 0, 1 if column.meta < 256 else 2
    if kind in (ColumnType.BLOB, ColumnType.GEOMETRY, ColumnType.JSON):
        return 0, column.meta
    msg = f"column type {kind.name} cannot be stepped over"
    raise UnsupportedColumnError(msg)


def skip_reader(column: ColumnShape) -> Reader:
    """A reader that steps over a column's value without converting it (a column capture leaves out): None."""
    size, prefix = skipped_size(column)
    if prefix:

        def variable(data: bytes, pos: int) -> tuple[Any, int]:
            return None, pos + prefix + int.from_bytes(data[pos : pos + prefix], "little")

        return variable
    return lambda _data, pos: (None, pos + size)
