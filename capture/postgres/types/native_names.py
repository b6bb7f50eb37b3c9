"""A column's type as PostgreSQL names it (``format_type``), kept beside its logical type in schema records.

Built-in types are named as ``format_type(oid, typmod)`` prints them (``integer``, ``numeric(10,2)``,
``character varying(20)``, ``timestamp(3) without time zone`` ...); a database's own types by
their schema-qualified name from the type registry (``public.mood``); arrays with ``[]``. A type
neither knows is ``oid <n>``. The name is for people and for other tools: nothing reads a value by it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from log.pg_types import Oid, TypeRegistry, numeric_typmod

#: ``format_type``'s names of the built-in types that take no modifier.
_NAMES: Final[Mapping[int, str]] = {
    Oid.BOOL: "boolean",
    Oid.BYTEA: "bytea",
    Oid.CHAR: '"char"',
    Oid.NAME: "name",
    Oid.INT8: "bigint",
    Oid.INT2: "smallint",
    Oid.INT4: "integer",
    Oid.TEXT: "text",
    Oid.OID: "oid",
    Oid.JSON: "json",
    Oid.XML: "xml",
    Oid.POINT: "point",
    Oid.CIDR: "cidr",
    Oid.FLOAT4: "real",
    Oid.FLOAT8: "double precision",
    Oid.MACADDR8: "macaddr8",
    Oid.MONEY: "money",
    Oid.MACADDR: "macaddr",
    Oid.INET: "inet",
    Oid.DATE: "date",
    Oid.UUID: "uuid",
    Oid.TSVECTOR: "tsvector",
    Oid.JSONB: "jsonb",
    Oid.INT4RANGE: "int4range",
    Oid.NUMRANGE: "numrange",
    Oid.TSRANGE: "tsrange",
    Oid.TSTZRANGE: "tstzrange",
    Oid.DATERANGE: "daterange",
    Oid.INT8RANGE: "int8range",
}
#: Types whose modifier is a length (``typmod - 4`` for the character types, ``typmod`` for bits).
_LENGTHS: Final[Mapping[int, tuple[str, int]]] = {
    Oid.BPCHAR: ("character", 4),
    Oid.VARCHAR: ("character varying", 4),
    Oid.BIT: ("bit", 0),
    Oid.VARBIT: ("bit varying", 0),
}
#: Types whose modifier is a fractional-seconds precision, and the words after it.
_PRECISIONS: Final[Mapping[int, tuple[str, str]]] = {
    Oid.TIME: ("time", " without time zone"),
    Oid.TIMETZ: ("time", " with time zone"),
    Oid.TIMESTAMP: ("timestamp", " without time zone"),
    Oid.TIMESTAMPTZ: ("timestamp", " with time zone"),
    Oid.INTERVAL: ("interval", ""),
}
_MAX_NESTING: Final = 16


def native_type_name(type_oid: int, typmod: int, registry: TypeRegistry | None = None, _depth: int = 0) -> str:
    """The type as PostgreSQL prints it (see the module docstring)."""
    if type_oid in _NAMES:
        return _NAMES[type_oid]
    if type_oid == Oid.NUMERIC:
        pair = numeric_typmod(typmod)
        return "numeric" if pair is None else f"numeric({pair[0]},{pair[1]})"
    if type_oid in _LENGTHS:
        name, offset = _LENGTHS[type_oid]
        return name if typmod < offset or typmod == -1 else f"{name}({typmod - offset})"
    if type_oid in _PRECISIONS:
        name, zone = _PRECISIONS[type_oid]
        if type_oid == Oid.INTERVAL:  # the low 16 bits are the precision (0xFFFF: none given)
            precision = typmod & 0xFFFF
            return name if typmod < 0 or precision == 0xFFFF else f"{name}({precision})"
        return f"{name}{zone}" if typmod < 0 else f"{name}({typmod}){zone}"
    registry = registry if registry is not None else TypeRegistry()
    element = registry.element_oid(type_oid)
    if element and _depth < _MAX_NESTING:
        return native_type_name(element, typmod, registry, _depth + 1) + "[]"
    found = registry.get(type_oid)
    if found is not None:
        return found.name if found.namespace == "pg_catalog" else f"{found.namespace}.{found.name}"
    return f"oid {type_oid}"
