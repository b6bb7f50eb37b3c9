"""Snapshot values: a column's value as the text protocol returns it -> the same JSON as the binlog reader's.

The snapshot reads with PyMySQL and no converters, in a session with ``time_zone='+00:00'`` and
utf8mb4 results: numbers and temporal values arrive as their text, character columns as text
(converted by the server to utf8mb4), binary columns, BIT and GEOMETRY as bytes. Every
converter here must give exactly what :mod:`capture.mysql.types.values` gives for the same
stored value (the snapshot/stream conformance test compares them).
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

from capture.mysql.binlog.table_map import ColumnShape, ColumnType
from capture.mysql.types.decimal_codec import precise_bytes
from capture.mysql.types.temporal import days_since_epoch, micros_since_epoch, zoned_timestamp
from capture.mysql.types.values import (
    TypeModes,
    UnsupportedColumnError,
    binary_encoder,
    float32_value,
    geometry_json,
)

Converter = Callable[[Any], Any]
_MICROS = 1_000_000
_MICROS_PER_DAY = 86_400_000_000


def _identity(value: Any) -> Any:
    return value


def _plain_decimal(text: str) -> str:
    return text[1:] if text.startswith("-") and not text.strip("-0.") else text


def _decimal(mode: str) -> Converter:
    if mode == "double":
        return float
    if mode == "precise":
        return lambda text: precise_bytes(_plain_decimal(text))
    return _plain_decimal


def _fraction(text: str) -> int:
    frac = text.partition(".")[2]
    return int((frac + "000000")[:6]) if frac else 0


def _date_days(text: str) -> int | None:
    year, month, day = text.split("-")
    return days_since_epoch(int(year), int(month), int(day))


def _datetime_micros(text: str) -> int | None:
    date, _, clock = text.partition(" ")
    year, month, day = (int(p) for p in date.split("-"))
    hms = clock.split(".")[0].split(":")
    return micros_since_epoch(year, month, day, int(hms[0]), int(hms[1]), int(hms[2]), _fraction(clock))


def _time_micros(text: str) -> int:
    negative = text.startswith("-")
    hours, minutes, seconds = text.lstrip("-").split(":")
    micros = (int(hours) * 3600 + int(minutes) * 60 + int(seconds.split(".")[0])) * _MICROS + _fraction(seconds)
    return -micros if negative else micros


def _temporal(column: ColumnShape, modes: TypeModes) -> Converter:
    zero: Any = None if column.nullable else 0
    fsp = column.meta
    if column.type == ColumnType.DATE:

        def date(text: str) -> Any:
            days = _date_days(text)
            return zero if days is None else days

        return date
    if column.type == ColumnType.DATETIME2:
        millis = modes.time == "connect" or fsp <= 3

        def datetime(text: str) -> Any:
            micros = _datetime_micros(text)
            if micros is None:
                return zero
            return micros // 1000 if millis else micros

        return datetime
    if column.type == ColumnType.TIMESTAMP2:
        zero_text = None if column.nullable else zoned_timestamp(0, fsp)

        def timestamp(text: str) -> Any:
            micros = _datetime_micros(text)  # the session is in UTC
            return zero_text if not micros else zoned_timestamp(micros, fsp)

        return timestamp
    if modes.time == "connect":

        def time_of_day(text: str) -> Any:
            micros = _time_micros(text)
            return micros // 1000 if 0 <= micros < _MICROS_PER_DAY else None

        return time_of_day
    return _time_micros


def _geometry(column: ColumnShape) -> Converter:
    point = column.geometry_type == 1
    return lambda value: geometry_json(bytes(value), point=point)


def _integer(column: ColumnShape, modes: TypeModes) -> Converter:
    if column.type == ColumnType.LONGLONG and column.unsigned:
        if modes.bigint_unsigned == "precise":
            return precise_bytes
        return _java_long
    return int


def _java_long(text: str) -> int:
    value = int(text)
    return value - (1 << 64) if value >= 1 << 63 else value


def _bit(column: ColumnShape) -> Converter:
    size = (column.bits + 7) // 8
    if column.bits == 1:
        return lambda data: bool(data[-1])
    return lambda data: base64.b64encode(data.rjust(size, b"\0")[::-1]).decode()


def text_converter(column: ColumnShape, modes: TypeModes, where: str) -> Converter:
    """The converter of one column's snapshot values (never called with None)."""
    kind = column.type
    if kind in (ColumnType.TINY, ColumnType.SHORT, ColumnType.INT24, ColumnType.LONG, ColumnType.LONGLONG):
        return _integer(column, modes)
    if kind == ColumnType.FLOAT:
        return lambda text: float32_value(float(text))
    if kind == ColumnType.DOUBLE:
        return float
    if kind == ColumnType.NEWDECIMAL:
        return _decimal(modes.decimal)
    if kind == ColumnType.BIT:
        return _bit(column)
    if kind == ColumnType.YEAR:
        return int
    if kind in (ColumnType.DATE, ColumnType.DATETIME2, ColumnType.TIMESTAMP2, ColumnType.TIME2):
        return _temporal(column, modes)
    if kind == ColumnType.GEOMETRY:
        return _geometry(column)
    if kind in (ColumnType.VARCHAR, ColumnType.STRING, ColumnType.BLOB):
        if column.is_binary:
            encode = binary_encoder(modes.binary)
            return lambda data: encode(bytes(data))
        return _identity
    if kind in (ColumnType.ENUM, ColumnType.SET):
        return _identity
    msg = f"{where}: column type {kind.name} is not supported by MySQL capture yet"
    raise UnsupportedColumnError(msg)
