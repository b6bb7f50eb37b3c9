"""A replica column's PostgreSQL type, and its log value (Debezium JSON) turned back into a value PostgreSQL parses.

The type follows the column's logical type (:func:`log.row_types.logical_type` of its schema
record under the source's type modes): what the log holds is what the replica gets. Values are
written in ``COPY``'s text form (as elements of the statements' arrays, :mod:`sinks.postgres.arrays`),
so each converter returns a Python value whose text PostgreSQL reads as the column's type
(``infinity`` timestamps as the text itself).

Enums, domains over unknown types and other types capture writes as text become ``text``.
Bit strings (``bit(n)``/``varbit`` as Debezium's little-endian bytes) cannot be written back
exactly without their length: a sink that would need one is refused when it first meets the
column, in one line (leave the column out with ``transform.fields``).
"""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Callable, Iterable, Mapping, Sequence
from decimal import Decimal
from typing import Any

from log.pg_types import Oid
from log.row_types import LogicalKind, LogicalType

Convert = Callable[[Any], Any]

_EPOCH = dt.datetime(1970, 1, 1)  # noqa: DTZ001  # timestamp without time zone: naive on purpose
_EPOCH_DATE = dt.date(1970, 1, 1)
_SPECIAL_FLOATS = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}
_SPECIAL_DECIMALS = {"NAN": "NaN", "POSITIVE_INFINITY": "Infinity", "NEGATIVE_INFINITY": "-Infinity"}

_SIMPLE_TYPES = {
    LogicalKind.BOOLEAN: "boolean",
    LogicalKind.INT16: "smallint",
    LogicalKind.INT32: "integer",
    LogicalKind.INT64: "bigint",
    LogicalKind.FLOAT: "real",
    LogicalKind.DOUBLE: "double precision",
    LogicalKind.STRING: "text",
    LogicalKind.UUID: "uuid",
    LogicalKind.ENUM: "text",
    LogicalKind.BYTES_BASE64: "bytea",
    LogicalKind.BYTES_HEX: "bytea",
    LogicalKind.DATE: "date",
    LogicalKind.TIME_MS: "time",
    LogicalKind.TIME_US: "time",
    LogicalKind.TIMESTAMP_MS: "timestamp",
    LogicalKind.TIMESTAMP_US: "timestamp",
    LogicalKind.TIMESTAMPTZ_STRING: "timestamptz",
    LogicalKind.TIMETZ_STRING: "timetz",
    LogicalKind.INTERVAL_US: "interval",
    LogicalKind.POINT: "point",
}


class UnwritableColumnError(ValueError):
    """A column whose log values the replica cannot hold exactly."""


def column_type(logical: LogicalType, type_oid: int) -> str:
    """The replica's SQL type for a column of ``logical`` type (``type_oid`` tells json from jsonb)."""
    kind = logical.kind
    if kind is LogicalKind.ARRAY:
        assert logical.element is not None
        return column_type(logical.element, 0) + "[]"
    if kind is LogicalKind.JSON:
        return "json" if type_oid == Oid.JSON else "jsonb" if type_oid == Oid.JSONB else "text"
    if kind in (LogicalKind.DECIMAL, LogicalKind.DECIMAL_BASE64, LogicalKind.DECIMAL_VARIABLE):
        if logical.precision is not None and (logical.scale or 0) >= 0:
            return f"numeric({logical.precision},{logical.scale or 0})"
        return "numeric"
    if kind is LogicalKind.BITS:
        msg = "a bit string (bit(n)/varbit), which the log holds without its length"
        raise UnwritableColumnError(msg)
    return _SIMPLE_TYPES[kind]


def converter(logical: LogicalType) -> Convert:
    """Turns a non-null JSON value of ``logical`` type into what ``COPY`` writes for the replica column."""
    kind = logical.kind
    if kind is LogicalKind.ARRAY:
        assert logical.element is not None
        element = converter(logical.element)
        return lambda value: [None if item is None else element(item) for item in value]
    make = _CONVERTERS.get(kind)
    if make is not None:
        return make(logical)
    return same


def copy_rows(
    rows: Iterable[Mapping[str, Any]], columns: Sequence[str], converters: Mapping[str, Convert]
) -> Iterable[list[Any]]:
    """Each row's values of ``columns`` as ``COPY`` writes them (a missing or null value is null).

    Columns whose converter is :func:`same` are taken as they are; only the others are converted
    (most columns of most tables need nothing, and a call per value is most of a batch's Python).
    """
    converted = [(i, converters[c]) for i, c in enumerate(columns) if converters[c] is not same]
    for row in rows:
        values = list(map(row.get, columns))
        for i, convert in converted:
            if values[i] is not None:
                values[i] = convert(values[i])
        yield values


#: The native path's code of a column whose COPY text it writes itself (``native/sink_rows.c``):
#: ``i`` the JSON value as it is, ``d`` days to a date, ``T``/``t`` micro-/milliseconds to a timestamp.
_NATIVE_KINDS = {LogicalKind.DATE: "d", LogicalKind.TIMESTAMP_US: "T", LogicalKind.TIMESTAMP_MS: "t"}


def native_kind(logical: LogicalType) -> str | None:
    """The native path's code for a column of ``logical`` type, or None when only its converter writes it."""
    if logical.kind in _NATIVE_KINDS:
        return _NATIVE_KINDS[logical.kind]
    return "i" if converter(logical) is same else None


def same(value: Any) -> Any:
    """The converter of a column whose log value is already what ``COPY`` writes."""
    return value


def _float(_logical: LogicalType) -> Convert:
    return lambda value: _SPECIAL_FLOATS[value] if isinstance(value, str) else value


def _decimal(_logical: LogicalType) -> Convert:
    return lambda value: Decimal(_SPECIAL_DECIMALS.get(value) or value)


def _decimal_base64(logical: LogicalType) -> Convert:
    scale = logical.scale or 0

    def convert(value: str) -> Decimal:
        return Decimal(int.from_bytes(base64.b64decode(value), "big", signed=True)).scaleb(-scale)

    return convert


def _decimal_variable(_logical: LogicalType) -> Convert:
    def convert(value: dict[str, Any]) -> Decimal:
        unscaled = int.from_bytes(base64.b64decode(value["value"]), "big", signed=True)
        return Decimal(unscaled).scaleb(-int(value["scale"]))

    return convert


def _bytes_base64(_logical: LogicalType) -> Convert:
    return base64.b64decode


def _bytes_hex(_logical: LogicalType) -> Convert:
    return bytes.fromhex


def _date(_logical: LogicalType) -> Convert:
    return lambda days: _EPOCH_DATE + dt.timedelta(days=days)


def _time(unit_us: int) -> Callable[[LogicalType], Convert]:
    def make(_logical: LogicalType) -> Convert:
        def convert(value: int) -> dt.time:
            micros = value * unit_us
            if micros >= 86_400_000_000:
                return dt.time(0)  # 24:00:00 is stored as 86400000000 past midnight
            return (_EPOCH + dt.timedelta(microseconds=micros)).time()

        return convert

    return make


def _timestamp(unit_us: int) -> Callable[[LogicalType], Convert]:
    def make(_logical: LogicalType) -> Convert:
        return lambda value: _EPOCH + dt.timedelta(microseconds=value * unit_us)

    return make


def _timestamptz(_logical: LogicalType) -> Convert:
    def convert(value: str) -> Any:
        if value in ("infinity", "-infinity"):
            return value
        return dt.datetime.fromisoformat(value)

    return convert


def _interval(_logical: LogicalType) -> Convert:
    return lambda value: dt.timedelta(microseconds=value)


def _point(_logical: LogicalType) -> Convert:
    return lambda value: f"({value['x']!r},{value['y']!r})"


def _json(_logical: LogicalType) -> Convert:
    return lambda value: value if isinstance(value, str) else _json_text(value)


def _json_text(value: Any) -> str:
    import orjson

    return orjson.dumps(value).decode()


_CONVERTERS: dict[LogicalKind, Callable[[LogicalType], Convert]] = {
    LogicalKind.FLOAT: _float,
    LogicalKind.DOUBLE: _float,
    LogicalKind.DECIMAL: _decimal,
    LogicalKind.DECIMAL_BASE64: _decimal_base64,
    LogicalKind.DECIMAL_VARIABLE: _decimal_variable,
    LogicalKind.BYTES_BASE64: _bytes_base64,
    LogicalKind.BYTES_HEX: _bytes_hex,
    LogicalKind.DATE: _date,
    LogicalKind.TIME_MS: _time(1000),
    LogicalKind.TIME_US: _time(1),
    LogicalKind.TIMESTAMP_MS: _timestamp(1000),
    LogicalKind.TIMESTAMP_US: _timestamp(1),
    LogicalKind.TIMESTAMPTZ_STRING: _timestamptz,
    LogicalKind.INTERVAL_US: _interval,
    LogicalKind.POINT: _point,
    LogicalKind.JSON: _json,
}
