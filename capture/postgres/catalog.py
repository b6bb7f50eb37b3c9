"""What capture reads from the source's catalog: table shapes, primary keys and types.

Every function here queries ``pg_catalog`` over a psycopg connection; what they return is
plain data (:class:`capture.postgres.decoding.pgoutput.Relation`, :class:`log.pg_types.TypeRegistry`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import psycopg

from capture.postgres.decoding.pgoutput_messages import Relation, RelationColumn, ReplicaIdentity
from capture.postgres.events.relations import PrimaryKeyLookup, RowDecoder, RowDecoderFactory
from capture.postgres.events.rows import RowConverter, TextRowDecoder
from core.source_config import TypesConfig
from log.pg_types import PgType, TypeKind, TypeRegistry


def relation_from_catalog(conn: psycopg.Connection[Any], qualified: str) -> Relation:
    """A pgoutput-equivalent :class:`Relation` for a table, read from the catalog (for snapshots)."""
    row = conn.execute(
        "SELECT c.oid, n.nspname, c.relname, c.relreplident FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = %s::regclass",
        (qualified,),
    ).fetchone()
    if row is None:
        msg = f"table {qualified} does not exist"
        raise ValueError(msg)
    oid, namespace, name, identity = row
    columns = conn.execute(
        "SELECT a.attname, a.atttypid, a.atttypmod, "
        "coalesce(a.attnum = ANY(i.indkey), false) AS key "
        "FROM pg_attribute a LEFT JOIN pg_index i ON i.indrelid = a.attrelid AND "
        "(CASE WHEN %s = 'i' THEN i.indisreplident ELSE i.indisprimary END) "
        "WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
        (identity, oid),
    ).fetchall()
    cols = tuple(
        RelationColumn(key=bool(key) or identity == "f", name=n, type_oid=int(t), atttypmod=int(m))
        for n, t, m, key in columns
    )
    return Relation(
        oid=int(oid), namespace=namespace, name=name, replica_identity=ReplicaIdentity(identity), columns=cols
    )


def primary_key_lookup(conn: psycopg.Connection[Any]) -> PrimaryKeyLookup:
    """Primary-key column names by relation oid, from the catalog."""

    def lookup(relation: Relation) -> tuple[str, ...] | None:
        rows = conn.execute(
            "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
            "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = %s AND i.indisprimary ORDER BY a.attnum",
            (relation.oid,),
        ).fetchall()
        return tuple(r[0] for r in rows) or None

    return lookup


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


def load_type_registry(conn: psycopg.Connection[Any]) -> TypeRegistry:
    """Every non-built-in type (enums, domains, ranges, arrays of those, extension types) from ``pg_type``.

    pgoutput names a column's type only by oid (a Type message names a domain's *base*
    type), so these database-specific oids are resolved from the catalog.
    """
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


def typemap_decoders(modes: TypesConfig) -> Callable[[psycopg.Connection[Any]], RowDecoderFactory]:
    """Row decoders from :mod:`capture.postgres.types.typemap`, with the database's types loaded once per connection."""

    def for_connection(conn: psycopg.Connection[Any]) -> RowDecoderFactory:
        registry = load_type_registry(conn)

        def decoder_for(relation: Relation) -> RowDecoder:
            # A TextRowDecoder also lets the event builder use the native encoder of the same conversion.
            return TextRowDecoder(RowConverter(relation.columns, modes, registry))

        return decoder_for

    return for_connection
