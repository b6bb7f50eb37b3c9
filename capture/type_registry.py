"""What the type mapper needs to know about non-built-in PostgreSQL types.

pgoutput names a column's type only by oid (Type messages carry a name, and for a
domain they name the *base* type, so they are not enough). Built-in oids are fixed
and known here; enums, domains, ranges, arrays of those and extension types
(hstore, citext, ltree ...) get database-specific oids, so the capture agent fills a
:class:`TypeRegistry` from ``pg_type`` with :func:`load_type_registry` (the only I/O
in this module) and again whenever a Relation names an oid it does not know.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol


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

    @property
    def is_array(self) -> bool:
        """True for array types (``typcategory = 'A'``)."""
        return self.element_oid != 0

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
    """Non-built-in types by oid. Mutable: the agent adds types as Relations reveal them."""

    __slots__ = ("_types",)

    def __init__(self, types: Iterable[PgType] = ()) -> None:
        self._types: dict[int, PgType] = {}
        for pg_type in types:
            self.add(pg_type)

    def add(self, pg_type: PgType) -> None:
        """Register (or replace) one type."""
        self._types[pg_type.oid] = pg_type

    def get(self, oid: int) -> PgType | None:
        """The type with this oid, or ``None`` when unknown (then the agent should reload)."""
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


class _Cursor(Protocol):
    def fetchall(self) -> list[tuple[Any, ...]]: ...


class _Connection(Protocol):
    def execute(self, query: Any, params: Any = ..., /) -> _Cursor: ...


#: Every user-defined or extension type (oid >= FirstNormalObjectId = 16384).
TYPE_REGISTRY_QUERY: Final = """
SELECT t.oid::int8, n.nspname, t.typname, t.typtype,
       CASE WHEN t.typcategory = 'A' THEN t.typelem::int8 ELSE 0 END,
       t.typbasetype::int8, t.typtypmod,
       COALESCE((SELECT array_agg(e.enumlabel::text ORDER BY e.enumsortorder)
                 FROM pg_catalog.pg_enum e WHERE e.enumtypid = t.oid), '{}'::text[]),
       COALESCE(r.rngsubtype::int8, 0)
FROM pg_catalog.pg_type t
JOIN pg_catalog.pg_namespace n ON n.oid = t.typnamespace
LEFT JOIN pg_catalog.pg_range r ON r.rngtypid = t.oid
WHERE t.oid >= 16384
ORDER BY t.oid
"""


def load_type_registry(conn: _Connection) -> TypeRegistry:
    """Read every non-built-in type from ``pg_type`` over a psycopg 3 connection (any ``execute``-able)."""
    rows = conn.execute(TYPE_REGISTRY_QUERY).fetchall()
    return TypeRegistry(
        PgType(
            oid=int(oid),
            namespace=str(namespace),
            name=str(name),
            kind=TypeKind(typtype if isinstance(typtype, str) else bytes(typtype).decode()),
            element_oid=int(element),
            base_oid=int(base),
            base_typmod=int(base_typmod),
            enum_labels=tuple(labels),
            range_subtype=int(subtype),
        )
        for oid, namespace, name, typtype, element, base, base_typmod, labels, subtype in rows
    )
