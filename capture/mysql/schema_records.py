"""``_headwater.schemas`` records of MySQL tables: columns, key and types as the binlog describes them.

Written when a topic's shape first appears and whenever a TABLE_MAP shows it changed (DDL), before
the first event written with the new shape. A column has ``name``, ``native`` (MySQL's type, as
far as the binlog tells: ``int unsigned``, ``decimal(10,2)``, ``datetime(6)``, ``varchar``),
``nullable``, ``key``, and ``logical``: the form of its JSON values in Debezium's schema vocabulary
(:func:`log.row_types.connect_schema` of :func:`logical_type`), which readers decode by.
"""

from __future__ import annotations

from typing import Any

import orjson

from capture.mysql.binlog.table_map import ColumnShape, ColumnType
from capture.mysql.table_plan import TablePlan
from capture.mysql.types.values import TypeModes
from capture.records import SchemaRecord
from log.row_types import LogicalKind, LogicalType, connect_schema

_NAMES = {
    ColumnType.TINY: "tinyint",
    ColumnType.SHORT: "smallint",
    ColumnType.INT24: "mediumint",
    ColumnType.LONG: "int",
    ColumnType.LONGLONG: "bigint",
    ColumnType.FLOAT: "float",
    ColumnType.DOUBLE: "double",
    ColumnType.YEAR: "year",
    ColumnType.DATE: "date",
    ColumnType.JSON: "json",
    ColumnType.ENUM: "enum",
    ColumnType.SET: "set",
    ColumnType.GEOMETRY: "geometry",
}


def native_type(column: ColumnShape) -> str:
    """The column's MySQL type as far as the binlog tells."""
    kind = column.type
    if kind == ColumnType.NEWDECIMAL:
        return f"decimal({column.precision},{column.scale})"
    if kind == ColumnType.BIT:
        return f"bit({column.bits})"
    if kind in (ColumnType.DATETIME2, ColumnType.TIMESTAMP2, ColumnType.TIME2):
        name = {ColumnType.DATETIME2: "datetime", ColumnType.TIMESTAMP2: "timestamp", ColumnType.TIME2: "time"}[kind]
        return f"{name}({column.meta})" if column.meta else name
    if kind in (ColumnType.VARCHAR, ColumnType.VAR_STRING):
        return "varbinary" if column.is_binary else "varchar"
    if kind == ColumnType.STRING:
        return "binary" if column.is_binary else "char"
    if kind == ColumnType.BLOB:
        return "blob" if column.is_binary else "text"
    name = _NAMES.get(kind, kind.name.lower())
    return f"{name} unsigned" if column.unsigned else name


def logical_type(column: ColumnShape, modes: TypeModes) -> LogicalType:
    """The form of this column's JSON values (:mod:`log.row_types`) as ``capture.mysql.types.values`` writes them."""
    kind = column.type
    if kind == ColumnType.TINY or (kind == ColumnType.SHORT and not column.unsigned):
        return LogicalType(LogicalKind.INT16)
    if kind in (ColumnType.SHORT, ColumnType.INT24, ColumnType.YEAR) or (
        kind == ColumnType.LONG and not column.unsigned
    ):
        return LogicalType(LogicalKind.INT32)
    if kind in (ColumnType.LONG, ColumnType.LONGLONG):
        if kind == ColumnType.LONGLONG and column.unsigned and modes.bigint_unsigned == "precise":
            # A Connect Decimal whatever decimal_handling_mode says.
            return LogicalType(LogicalKind.DECIMAL_BASE64, 20, 0)
        return LogicalType(LogicalKind.INT64)
    if kind == ColumnType.NEWDECIMAL:
        if modes.decimal == "double":
            return LogicalType(LogicalKind.DOUBLE)
        decimal = LogicalKind.DECIMAL_BASE64 if modes.decimal == "precise" else LogicalKind.DECIMAL
        return LogicalType(decimal, column.precision, column.scale)
    if kind == ColumnType.BIT:
        return LogicalType(LogicalKind.BOOLEAN if column.bits == 1 else LogicalKind.BITS)
    if kind == ColumnType.DATETIME2:
        millis = modes.time == "connect" or column.meta <= 3
        return LogicalType(LogicalKind.TIMESTAMP_MS if millis else LogicalKind.TIMESTAMP_US)
    if kind == ColumnType.TIME2:
        return LogicalType(LogicalKind.TIME_MS if modes.time == "connect" else LogicalKind.TIME_US)
    if kind == ColumnType.GEOMETRY and column.geometry_type == 1:
        return LogicalType(LogicalKind.POINT)
    if kind in (ColumnType.VARCHAR, ColumnType.VAR_STRING, ColumnType.STRING, ColumnType.BLOB) and column.is_binary:
        return LogicalType(LogicalKind.BYTES_HEX if modes.binary == "hex" else LogicalKind.BYTES_BASE64)
    simple = {
        ColumnType.FLOAT: LogicalKind.FLOAT,
        ColumnType.DOUBLE: LogicalKind.DOUBLE,
        ColumnType.DATE: LogicalKind.DATE,
        ColumnType.TIMESTAMP2: LogicalKind.TIMESTAMPTZ_STRING,
        ColumnType.ENUM: LogicalKind.ENUM,
        ColumnType.JSON: LogicalKind.JSON,
    }
    # Text, SET, and a non-POINT geometry (its {"wkb", "srid"} object is read as its JSON text).
    return LogicalType(simple.get(kind, LogicalKind.STRING))


def columns_of(plan: TablePlan, modes: TypeModes) -> list[dict[str, Any]]:
    """The column list of a schema record: the columns written; a masked one is text (its values are masked)."""
    keys = set(plan.key)
    columns = []
    for i in plan.kept:
        c = plan.shape.columns[i]
        mask = plan.masks.get(i)
        column = {
            "name": c.name,
            "logical": connect_schema(LogicalType(LogicalKind.STRING) if mask is not None else logical_type(c, modes)),
            "native": native_type(c),
            "nullable": c.nullable,
            "key": i in keys,
        }
        if mask is not None:
            column["masked"] = mask.kind
        columns.append(column)
    return columns


def schema_record(plan: TablePlan, version: int, modes: TypeModes) -> SchemaRecord:
    """The record of the plan's topic's shape, the ``version``-th it has had."""
    shape = plan.shape
    return SchemaRecord(
        plan.topic,
        orjson.dumps(
            {
                "topic": plan.topic,
                "schema": shape.schema,
                "table": shape.table,
                "key": list(plan.key_names),
                "key_source": plan.key_source,
                "columns": columns_of(plan, modes),
                "version": version,
            }
        ),
    )
