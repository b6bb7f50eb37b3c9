"""PostgreSQL's types as the log's logical types (:mod:`log.row_types`), by type oid and typmod.

The PostgreSQL source kind types its columns with :func:`logical_type` (with the source's type
modes, :class:`core.source_config.TypesConfig`; ``capture/postgres/types/typemap.py`` picks each
column's converter for it). It lives in the log, not in the kind, because schema records written
before logical types were recorded (and feeds' records, which describe their columns with
PostgreSQL oids) name only ``type_oid``/``typmod``: readers type such a column with this mapping,
as they always have (:func:`log.table_schemas.column_type`).

The kinds follow the Debezium PostgreSQL connector's "Data type mappings" per mode.
Built-in oids are fixed (:class:`Oid`); enums, domains, ranges, arrays of those and
extension types get database-specific oids, which a :class:`TypeRegistry` (filled from
``pg_type`` by capture) resolves. Without a registry such a column reads as its text.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from core.errors import PermanentError
from core.source_config import TypesConfig
from log.row_types import LogicalKind, LogicalType


class Oid(enum.IntEnum):
    """Built-in type oids (PostgreSQL ``pg_type.dat``)."""

    BOOL = 16
    BYTEA = 17
    CHAR = 18
    NAME = 19
    INT8 = 20
    INT2 = 21
    INT4 = 23
    TEXT = 25
    OID = 26
    JSON = 114
    XML = 142
    POINT = 600
    CIDR = 650
    FLOAT4 = 700
    FLOAT8 = 701
    MACADDR8 = 774
    MONEY = 790
    MACADDR = 829
    INET = 869
    BPCHAR = 1042
    VARCHAR = 1043
    DATE = 1082
    TIME = 1083
    TIMESTAMP = 1114
    TIMESTAMPTZ = 1184
    INTERVAL = 1186
    TIMETZ = 1266
    BIT = 1560
    VARBIT = 1562
    NUMERIC = 1700
    UUID = 2950
    TSVECTOR = 3614
    JSONB = 3802
    INT4RANGE = 3904
    NUMRANGE = 3906
    TSRANGE = 3908
    TSTZRANGE = 3910
    DATERANGE = 3912
    INT8RANGE = 3926


class TypeNestingError(PermanentError):
    """A type's domain or array chain does not end (a damaged type registry)."""

    def __init__(self, message: str, *, type_oid: int | None = None) -> None:
        super().__init__(message)
        self.type_oid = type_oid


# -- database-specific types ----------------------------------------------------------------------


class TypeKind(enum.StrEnum):
    """``pg_type.typtype``."""

    BASE = "b"
    COMPOSITE = "c"
    DOMAIN = "d"
    ENUM = "e"
    PSEUDO = "p"
    RANGE = "r"
    MULTIRANGE = "m"


@dataclass(frozen=True, slots=True)
class PgType:
    """One ``pg_type`` row, reduced to what value conversion needs.

    ``element_oid`` is set for array types, ``base_oid``/``base_typmod`` for domains,
    ``enum_labels`` for enums (in sort order), ``range_subtype`` for range types.
    """

    oid: int
    namespace: str
    name: str
    kind: TypeKind = TypeKind.BASE
    element_oid: int = 0
    base_oid: int = 0
    base_typmod: int = -1
    enum_labels: tuple[str, ...] = ()
    range_subtype: int = 0

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (for recordings and caches); inverse of :meth:`from_json`."""
        return {
            "oid": self.oid,
            "namespace": self.namespace,
            "name": self.name,
            "kind": self.kind.value,
            "element_oid": self.element_oid,
            "base_oid": self.base_oid,
            "base_typmod": self.base_typmod,
            "enum_labels": list(self.enum_labels),
            "range_subtype": self.range_subtype,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PgType:
        """Inverse of :meth:`to_json`."""
        return cls(
            oid=int(data["oid"]),
            namespace=str(data["namespace"]),
            name=str(data["name"]),
            kind=TypeKind(data.get("kind", "b")),
            element_oid=int(data.get("element_oid", 0)),
            base_oid=int(data.get("base_oid", 0)),
            base_typmod=int(data.get("base_typmod", -1)),
            enum_labels=tuple(data.get("enum_labels", ())),
            range_subtype=int(data.get("range_subtype", 0)),
        )


#: Built-in array type oid -> element type oid (PostgreSQL 15 ``pg_type.dat``; stable across versions).
BUILTIN_ARRAY_ELEMENTS: Final[Mapping[int, int]] = {
    1000: 16,  # bool
    1001: 17,  # bytea
    1002: 18,  # char
    1003: 19,  # name
    1005: 21,  # int2
    1007: 23,  # int4
    1009: 25,  # text
    1014: 1042,  # bpchar
    1015: 1043,  # varchar
    1016: 20,  # int8
    1017: 600,  # point
    1021: 700,  # float4
    1022: 701,  # float8
    1028: 26,  # oid
    1040: 829,  # macaddr
    1041: 869,  # inet
    651: 650,  # cidr
    775: 774,  # macaddr8
    791: 790,  # money
    1115: 1114,  # timestamp
    1182: 1082,  # date
    1183: 1083,  # time
    1185: 1184,  # timestamptz
    1187: 1186,  # interval
    1231: 1700,  # numeric
    1270: 1266,  # timetz
    1561: 1560,  # bit
    1563: 1562,  # varbit
    143: 142,  # xml
    199: 114,  # json
    3807: 3802,  # jsonb
    2951: 2950,  # uuid
    3643: 3614,  # tsvector
    3645: 3615,  # tsquery
    3905: 3904,  # int4range
    3907: 3906,  # numrange
    3909: 3908,  # tsrange
    3911: 3910,  # tstzrange
    3913: 3912,  # daterange
    3927: 3926,  # int8range
}


class TypeRegistry:
    """Non-built-in types by oid. Mutable: capture adds types as Relations reveal them."""

    __slots__ = ("_types",)

    def __init__(self, types: Iterable[PgType] = ()) -> None:
        self._types: dict[int, PgType] = {}
        for pg_type in types:
            self.add(pg_type)

    def add(self, pg_type: PgType) -> None:
        """Register (or replace) one type."""
        self._types[pg_type.oid] = pg_type

    def get(self, oid: int) -> PgType | None:
        """The type with this oid, or ``None`` when unknown (then capture should reload)."""
        return self._types.get(oid)

    def element_oid(self, oid: int) -> int:
        """The element type of an array type, or 0 when ``oid`` is not a known array."""
        builtin = BUILTIN_ARRAY_ELEMENTS.get(oid)
        if builtin is not None:
            return builtin
        pg_type = self._types.get(oid)
        return pg_type.element_oid if pg_type is not None else 0

    def resolve_domain(self, oid: int, typmod: int) -> tuple[int, int]:
        """Follow a domain chain down to its base type; the innermost explicit typmod wins.

        A column of a domain has ``atttypmod = -1``; the domain's own ``typtypmod``
        (e.g. ``numeric(10,2)``) is what the value was coerced to.
        """
        seen: set[int] = set()
        pg_type = self._types.get(oid)
        while pg_type is not None and pg_type.kind is TypeKind.DOMAIN and oid not in seen:
            seen.add(oid)
            if typmod == -1:
                typmod = pg_type.base_typmod
            oid = pg_type.base_oid
            pg_type = self._types.get(oid)
        return oid, typmod

    def __contains__(self, oid: object) -> bool:
        return oid in self._types

    def __iter__(self) -> Iterator[PgType]:
        return iter(self._types.values())

    def __len__(self) -> int:
        return len(self._types)


# -- the logical type of a column -----------------------------------------------------------------

#: Money's ``scale`` (Debezium's ``money.fraction.digits`` default), in every mode.
MONEY_FRACTION_DIGITS: Final = 2

#: Types whose logical type is the same in every mode.
_FIXED: Final[Mapping[int, LogicalType]] = {
    Oid.BOOL: LogicalType(LogicalKind.BOOLEAN),
    Oid.INT2: LogicalType(LogicalKind.INT16),
    Oid.INT4: LogicalType(LogicalKind.INT32),
    Oid.INT8: LogicalType(LogicalKind.INT64),
    Oid.OID: LogicalType(LogicalKind.INT64),
    Oid.FLOAT4: LogicalType(LogicalKind.FLOAT),
    Oid.FLOAT8: LogicalType(LogicalKind.DOUBLE),
    Oid.JSON: LogicalType(LogicalKind.JSON),
    Oid.JSONB: LogicalType(LogicalKind.JSON),
    Oid.UUID: LogicalType(LogicalKind.UUID),
    Oid.POINT: LogicalType(LogicalKind.POINT),
    Oid.INTERVAL: LogicalType(LogicalKind.INTERVAL_US),
    Oid.DATE: LogicalType(LogicalKind.DATE),
    Oid.TIMETZ: LogicalType(LogicalKind.TIMETZ_STRING),
    Oid.TIMESTAMPTZ: LogicalType(LogicalKind.TIMESTAMPTZ_STRING),
}
_STRING: Final = LogicalType(LogicalKind.STRING)
#: Built-in types read as their text.
_STRING_OIDS: Final = frozenset(
    {
        Oid.TEXT,
        Oid.VARCHAR,
        Oid.BPCHAR,
        Oid.CHAR,
        Oid.NAME,
        Oid.XML,
        Oid.CIDR,
        Oid.INET,
        Oid.MACADDR,
        Oid.MACADDR8,
        Oid.TSVECTOR,
        Oid.INT4RANGE,
        Oid.INT8RANGE,
        Oid.NUMRANGE,
        Oid.TSRANGE,
        Oid.TSTZRANGE,
        Oid.DATERANGE,
    }
)
#: The extension type read as JSON objects (hstore.handling.mode=json), found by name: its oid
#: differs per database (as in Debezium's TypeRegistry).
HSTORE: Final = "hstore"
#: Deeper domain or array chains are taken for a cycle.
_MAX_NESTING: Final = 16


def numeric_typmod(typmod: int) -> tuple[int, int] | None:
    """``(precision, scale)`` of a ``numeric(p,s)`` typmod; None when unconstrained."""
    if typmod < 4:
        return None
    packed = typmod - 4
    scale = packed & 0x7FF
    if scale & 0x400:  # PostgreSQL 15 allows negative scales (11-bit two's complement)
        scale -= 0x800
    return (packed >> 16) & 0xFFFF, scale


def logical_type(type_oid: int, typmod: int, modes: TypesConfig, registry: TypeRegistry | None = None) -> LogicalType:
    """What the JSON value of a column of ``type_oid``/``typmod`` decodes back to under ``modes``.

    Domains are their base type (the innermost explicit typmod wins); types the registry
    does not know, and those Debezium does not map (composite, tsquery ...), are their text.
    """
    return _logical_type(type_oid, typmod, modes, registry if registry is not None else TypeRegistry(), 0)


def _logical_type(type_oid: int, typmod: int, modes: TypesConfig, registry: TypeRegistry, depth: int) -> LogicalType:
    if depth > _MAX_NESTING:
        msg = f"type {type_oid} nests too deeply (a domain or array cycle?)"
        raise TypeNestingError(msg, type_oid=type_oid)
    type_oid, typmod = registry.resolve_domain(type_oid, typmod)
    fixed = _FIXED.get(type_oid)
    if fixed is not None:
        return fixed
    if type_oid in _STRING_OIDS:
        return _STRING
    if type_oid == Oid.NUMERIC:
        return _decimal(modes, numeric_typmod(typmod))
    if type_oid == Oid.MONEY:
        return _decimal(modes, None, MONEY_FRACTION_DIGITS)
    if type_oid == Oid.BYTEA:
        hex_mode = modes.binary_handling_mode == "hex"
        return LogicalType(LogicalKind.BYTES_HEX if hex_mode else LogicalKind.BYTES_BASE64)
    if type_oid in (Oid.BIT, Oid.VARBIT):
        # "BIT(1) -> BOOLEAN"; "BIT( > 1), BIT VARYING[(M)] -> BYTES io.debezium.data.Bits".
        return LogicalType(LogicalKind.BOOLEAN if typmod == 1 else LogicalKind.BITS)
    if type_oid in (Oid.TIME, Oid.TIMESTAMP):
        return _temporal(type_oid, typmod, modes)
    element_oid = registry.element_oid(type_oid)
    if element_oid:
        element = _logical_type(element_oid, typmod, modes, registry, depth + 1)
        return LogicalType(LogicalKind.ARRAY, element=element)
    pg_type = registry.get(type_oid)
    if pg_type is not None:
        if pg_type.kind is TypeKind.ENUM:
            return LogicalType(LogicalKind.ENUM)
        if pg_type.name == HSTORE:
            return LogicalType(LogicalKind.JSON)
    # Ranges, extension types such as citext or ltree, and unknown or unmapped types (composite,
    # tsquery, geometric types but point ...): the text, unchanged.
    return _STRING


def _decimal(modes: TypesConfig, typmod_pair: tuple[int, int] | None, scale: int | None = None) -> LogicalType:
    precision, scale = typmod_pair if typmod_pair is not None else (None, scale)
    mode = modes.decimal_handling_mode
    if mode == "string":
        return LogicalType(LogicalKind.DECIMAL, precision, scale)
    if mode == "double":
        return LogicalType(LogicalKind.DOUBLE)
    if scale is not None:
        return LogicalType(LogicalKind.DECIMAL_BASE64, precision, scale)
    return LogicalType(LogicalKind.DECIMAL_VARIABLE)


def _temporal(type_oid: int, typmod: int, modes: TypesConfig) -> LogicalType:
    # adaptive: "TIME(1), TIME(2), TIME(3) -> INT32 io.debezium.time.Time ... milliseconds past midnight";
    # "TIME(4..6) -> MicroTime"; "TIMESTAMP(1..3) -> io.debezium.time.Timestamp (milliseconds)";
    # "TIMESTAMP(4..6), TIMESTAMP -> MicroTimestamp". Precision 0 counts as <= 3 (JdbcValueConverters),
    # and an unconstrained TIME is precision 6, like TIMESTAMP. connect: always milliseconds.
    millis = modes.time_precision_mode == "connect" or 0 <= typmod <= 3
    if type_oid == Oid.TIME:
        return LogicalType(LogicalKind.TIME_MS if millis else LogicalKind.TIME_US)
    return LogicalType(LogicalKind.TIMESTAMP_MS if millis else LogicalKind.TIMESTAMP_US)
