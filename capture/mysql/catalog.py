"""A table's shape from ``information_schema``, in the binlog's terms (:class:`TableShape`).

The snapshot reads tables before any TABLE_MAP of them exists; it describes each table as its
TABLE_MAP with ``binlog_row_metadata=FULL`` would (type codes, byte lengths, fractional digits,
collation ids, ENUM/SET labels, primary key), so snapshot rows and streamed rows are converted by
the same rules and a table's schema record does not change between the two.
"""

from __future__ import annotations

import re
from typing import Any

from capture.mysql.binlog.table_map import ColumnShape, ColumnType, TableShape
from core.errors import PermanentError

_SIMPLE = {
    "tinyint": ColumnType.TINY,
    "smallint": ColumnType.SHORT,
    "mediumint": ColumnType.INT24,
    "int": ColumnType.LONG,
    "bigint": ColumnType.LONGLONG,
    "float": ColumnType.FLOAT,
    "double": ColumnType.DOUBLE,
    "decimal": ColumnType.NEWDECIMAL,
    "bit": ColumnType.BIT,
    "year": ColumnType.YEAR,
    "date": ColumnType.DATE,
    "time": ColumnType.TIME2,
    "datetime": ColumnType.DATETIME2,
    "timestamp": ColumnType.TIMESTAMP2,
    "varchar": ColumnType.VARCHAR,
    "varbinary": ColumnType.VARCHAR,
    "char": ColumnType.STRING,
    "binary": ColumnType.STRING,
    "enum": ColumnType.ENUM,
    "set": ColumnType.SET,
}
_BLOB_PREFIX = {
    "tinyblob": 1,
    "tinytext": 1,
    "blob": 2,
    "text": 2,
    "mediumblob": 3,
    "mediumtext": 3,
    "longblob": 4,
    "longtext": 4,
    "json": 4,
}
#: MySQL's geometry type codes (``Field::geometry_type``), as the TABLE_MAP's GEOMETRY_TYPE field.
_GEOMETRY = {
    "geometry": 0,
    "point": 1,
    "linestring": 2,
    "polygon": 3,
    "multipoint": 4,
    "multilinestring": 5,
    "multipolygon": 6,
    "geometrycollection": 7,
}
_LABEL = re.compile(r"'((?:[^']|'')*)'")


class CatalogError(PermanentError):
    """A table capture cannot describe (missing, or a type it does not know)."""


COLUMNS_QUERY = (
    "SELECT c.COLUMN_NAME, c.DATA_TYPE, c.COLUMN_TYPE, c.IS_NULLABLE, c.CHARACTER_OCTET_LENGTH, "
    "c.NUMERIC_PRECISION, c.NUMERIC_SCALE, c.DATETIME_PRECISION, c.COLLATION_NAME, co.ID "
    "FROM information_schema.COLUMNS c LEFT JOIN information_schema.COLLATIONS co "
    "ON co.COLLATION_NAME = c.COLLATION_NAME "
    "WHERE c.TABLE_SCHEMA = %s AND c.TABLE_NAME = %s ORDER BY c.ORDINAL_POSITION"
)
KEY_QUERY = (
    "SELECT COLUMN_NAME FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s "
    "AND INDEX_NAME = 'PRIMARY' ORDER BY SEQ_IN_INDEX"
)


def _labels(column_type: str) -> tuple[bytes, ...]:
    inside = column_type[column_type.index("(") + 1 : column_type.rindex(")")]
    return tuple(m.group(1).replace("''", "'").encode() for m in _LABEL.finditer(inside))


def column_shape(row: tuple[Any, ...], where: str) -> ColumnShape:
    """One ``COLUMNS_QUERY`` row -> the column as a FULL-metadata TABLE_MAP describes it."""
    name, data_type, column_type, nullable, octets, precision, scale, fsp, _collation_name, collation = row
    data_type = str(data_type).lower()
    column_type = str(column_type).lower()
    base = dict(name=str(name), nullable=nullable == "YES", unsigned="unsigned" in column_type)
    if data_type in _BLOB_PREFIX:
        coll = collation if collation is not None else 63
        return ColumnShape(type=ColumnType.BLOB, meta=_BLOB_PREFIX[data_type], collation=int(coll), **base)
    if data_type in _GEOMETRY:
        return ColumnShape(type=ColumnType.GEOMETRY, meta=4, collation=63, geometry_type=_GEOMETRY[data_type], **base)
    kind = _SIMPLE.get(data_type)
    if kind is None:
        msg = f"{where}: column type {column_type} is not supported by MySQL capture"
        raise CatalogError(msg)
    if kind == ColumnType.NEWDECIMAL:
        return ColumnShape(type=kind, meta=int(precision), precision=int(precision), scale=int(scale or 0), **base)
    if kind == ColumnType.BIT:
        return ColumnShape(type=kind, meta=int(precision), bits=int(precision), **base)
    if kind in (ColumnType.TIME2, ColumnType.DATETIME2, ColumnType.TIMESTAMP2):
        return ColumnShape(type=kind, meta=int(fsp or 0), **base)
    if kind == ColumnType.FLOAT:
        return ColumnShape(type=kind, meta=4, **base)
    if kind == ColumnType.DOUBLE:
        return ColumnShape(type=kind, meta=8, **base)
    if kind in (ColumnType.VARCHAR, ColumnType.STRING):
        coll = 63 if data_type in ("varbinary", "binary") else collation
        return ColumnShape(type=kind, meta=int(octets), collation=None if coll is None else int(coll), **base)
    if kind == ColumnType.ENUM:
        labels = _labels(column_type)
        return ColumnShape(
            type=kind, meta=1 if len(labels) < 256 else 2, enum_values=labels, collation=int(collation), **base
        )
    if kind == ColumnType.SET:
        labels = _labels(column_type)
        return ColumnShape(type=kind, meta=(len(labels) + 7) // 8, set_values=labels, collation=int(collation), **base)
    return ColumnShape(type=kind, **base)


def describe(cur: Any, database: str, table: str) -> TableShape:
    """The shape of ``database.table`` now (table id 0: it is no TABLE_MAP's)."""
    cur.execute(COLUMNS_QUERY, (database, table))
    rows = cur.fetchall()
    if not rows:
        msg = f"table {database}.{table} does not exist (or the capture user may not see it)"
        raise CatalogError(msg)
    columns = tuple(column_shape(row, f"{database}.{table}.{row[0]}") for row in rows)
    cur.execute(KEY_QUERY, (database, table))
    names = [c.name for c in columns]
    key = tuple(names.index(str(name)) for (name,) in cur.fetchall())
    return TableShape(0, database, table, columns, key)
