"""The native row decoder's plan of a table shape: per column, what ``native/binlog_rows.c`` reads and writes.

The readers of :mod:`capture.mysql.types.values` define every value; a plan names, per column,
the C twin of its reader (8 bytes: code, then arguments ``a`` (1 byte), ``b`` (2) and ``c`` (4),
little-endian) and, for ENUM/SET, its labels as the reader decodes them. A shape with a column
the C side does not write exactly has no plan (:func:`row_plan` returns None), so its rows are
decoded by the Python readers whole, never a row in part: GEOMETRY, JSON, BIT(n > 1), DECIMAL
in ``precise`` mode, unsigned BIGINT in ``precise`` mode, and text in a character set other
than UTF-8. Skipped columns (stepped over, never converted) are planned whatever their type.
"""

from __future__ import annotations

import struct
from enum import IntEnum

from capture.mysql.binlog.table_map import ColumnShape, ColumnType, TableShape
from capture.mysql.types.charsets import Charsets
from capture.mysql.types.values import TypeModes, skipped_size

_COLUMN = struct.Struct("<BBHI")

#: Character sets whose bytes the C side decodes (as Python's ``utf-8`` codec does, strictly).
_UTF8 = frozenset({"utf8mb4", "utf8mb3", "utf8"})
_INT_SIZES = {ColumnType.TINY: 1, ColumnType.SHORT: 2, ColumnType.INT24: 3, ColumnType.LONG: 4, ColumnType.LONGLONG: 8}
_BINARY_MODES = {"base64": 0, "base64-url-safe": 1, "hex": 2}
#: DECIMAL digits the C side formats (MariaDB's maximum precision and scale).
_MAX_PRECISION, _MAX_SCALE = 65, 38
_MAX_FSP = 6
#: A SET of up to 64 members is 1-8 bytes; a length prefix 1-4 bytes; a fixed size the plan's 1-byte argument.
_MAX_SET_BYTES, _MAX_PREFIX, _MAX_SKIP = 8, 4, 255


class Code(IntEnum):
    """Column codes of ``native/binlog_rows.c`` (its enum, the same numbers)."""

    SKIP_FIXED = 0
    SKIP_VAR = 1
    INT = 2
    UINT = 3
    FLOAT = 4
    DOUBLE = 5
    DECIMAL = 6
    DECIMAL_DOUBLE = 7
    YEAR = 8
    BIT1 = 9
    UTF8 = 10
    BINARY = 11
    ENUM = 12
    SET = 13
    DATE = 14
    DATETIME2 = 15
    TIMESTAMP2 = 16
    TIME2 = 17


Labels = tuple[str, ...] | None
Planned = tuple[Code, int, int, int, Labels]


def _prefix(column: ColumnShape) -> int:
    return skipped_size(column)[1]


def _text(column: ColumnShape, modes: TypeModes, charsets: Charsets) -> Planned | None:
    prefix = _prefix(column)
    if not 1 <= prefix <= _MAX_PREFIX:
        return None
    if column.is_binary:
        width = column.meta if column.type == ColumnType.STRING else 0
        return Code.BINARY, prefix, _BINARY_MODES[modes.binary], width, None
    if column.collation is not None and charsets.charset(column.collation) not in _UTF8:
        return None
    return Code.UTF8, prefix, 0, 0, None


def _labels(column: ColumnShape, values: tuple[bytes, ...], charsets: Charsets) -> tuple[str, ...]:
    decode = charsets.decoder(column.collation, column.name)
    return tuple(decode(v) for v in values)


def _temporal(column: ColumnShape, modes: TypeModes) -> Planned | None:
    fsp, nullable = column.meta, int(column.nullable)
    if fsp > _MAX_FSP:
        return None
    if column.type == ColumnType.DATE:
        return Code.DATE, nullable, 0, 0, None
    if column.type == ColumnType.DATETIME2:
        millis = modes.time == "connect" or fsp <= 3
        return Code.DATETIME2, nullable | (2 if millis else 0), fsp, 0, None
    if column.type == ColumnType.TIMESTAMP2:
        return Code.TIMESTAMP2, nullable, fsp, 0, None
    return Code.TIME2, int(modes.time == "connect"), fsp, 0, None


def _column(column: ColumnShape, modes: TypeModes, charsets: Charsets) -> Planned | None:
    kind = column.type
    if kind in _INT_SIZES:
        size = _INT_SIZES[kind]
        if size == 8 and column.unsigned:
            # A Java long: the signed reading of the same 8 bytes (precise mode: the Python reader).
            return (Code.INT, 8, 0, 0, None) if modes.bigint_unsigned == "long" else None
        return Code.UINT if column.unsigned else Code.INT, size, 0, 0, None
    if kind == ColumnType.FLOAT:
        return Code.FLOAT, 0, 0, 0, None
    if kind == ColumnType.DOUBLE:
        return Code.DOUBLE, 0, 0, 0, None
    if kind == ColumnType.NEWDECIMAL:
        if column.precision > _MAX_PRECISION or column.scale > min(_MAX_SCALE, column.precision):
            return None
        if modes.decimal == "string":
            return Code.DECIMAL, 0, column.precision, column.scale, None
        return (Code.DECIMAL_DOUBLE, 0, column.precision, column.scale, None) if modes.decimal == "double" else None
    if kind == ColumnType.YEAR:
        return Code.YEAR, 0, 0, 0, None
    if kind == ColumnType.BIT:
        return (Code.BIT1, 0, 0, 0, None) if column.bits == 1 else None
    if kind in (ColumnType.VARCHAR, ColumnType.VAR_STRING, ColumnType.STRING, ColumnType.BLOB):
        return _text(column, modes, charsets)
    if kind == ColumnType.ENUM:
        if column.meta not in (1, 2):
            return None
        return Code.ENUM, column.meta, 0, 0, ("", *_labels(column, column.enum_values, charsets))
    if kind == ColumnType.SET:
        if not 1 <= column.meta <= _MAX_SET_BYTES:
            return None
        return Code.SET, column.meta, 0, 0, _labels(column, column.set_values, charsets)
    if kind in (ColumnType.DATE, ColumnType.DATETIME2, ColumnType.TIMESTAMP2, ColumnType.TIME2):
        return _temporal(column, modes)
    return None


def _skipped(column: ColumnShape) -> Planned | None:
    size, prefix = skipped_size(column)
    if prefix:
        return (Code.SKIP_VAR, prefix, 0, 0, None) if prefix <= _MAX_PREFIX else None
    return (Code.SKIP_FIXED, size, 0, 0, None) if size <= _MAX_SKIP else None


def row_plan(
    shape: TableShape, modes: TypeModes, charsets: Charsets, skip: frozenset[int]
) -> tuple[bytes, tuple[Labels, ...]] | None:
    """``(plan, labels)`` for ``native.speedups.binlog_rows``, or None: the Python readers decode this shape.

    Call it after the Python readers are built: a column they refuse is refused there, with their message.
    """
    plan = bytearray()
    labels: list[Labels] = []
    for i, column in enumerate(shape.columns):
        planned = _skipped(column) if i in skip else _column(column, modes, charsets)
        if planned is None:
            return None
        code, a, b, c, column_labels = planned
        plan += _COLUMN.pack(code, a, b, c)
        labels.append(column_labels)
    return bytes(plan), tuple(labels)
