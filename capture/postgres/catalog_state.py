"""A published table as the catalog holds it now: column identities, storage, partitions.

pgoutput's Relation message names a table's columns but carries no ``attnum``, no defaults
and nothing about the table's storage, so it cannot tell a renamed column from a dropped and
re-added one, a constant default from a NULL, or a table rewritten by ``ALTER COLUMN ... TYPE
... USING``. What capture needs to tell them apart is read here, in one query per look:

* each live, non-generated column (the columns pgoutput sends) with its ``attnum`` (never
  reused: a dropped column keeps its number), type, typmod, whether PostgreSQL fills it for
  older rows from ``attmissingval`` (a constant default added without a rewrite), and whether
  it belongs to the replica identity (as :func:`capture.postgres.catalog.relation_from_catalog` flags it);
* the table's *storage*: its ``relfilenode``, or for a partitioned table every leaf
  partition's ``oid:relfilenode``. It changes exactly when rows may have changed without
  a row change in the WAL: a rewrite (``ALTER COLUMN ... TYPE``, a volatile default,
  ``VACUUM FULL``, ``CLUSTER``, ``TRUNCATE``) or a partition attached or detached.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

import orjson
import psycopg

from capture.postgres.decoding.pgoutput_messages import Relation, RelationColumn, ReplicaIdentity


@dataclass(frozen=True, slots=True)
class CatalogColumn:
    """One live column: ``filled`` when older rows read it from ``attmissingval`` (a default added in place)."""

    attnum: int
    name: str
    type_oid: int
    typmod: int
    filled: bool
    key: bool


@dataclass(frozen=True, slots=True)
class CatalogTable:
    """A table's identity, columns (pgoutput's order: by ``attnum``) and storage, read at one moment."""

    oid: int
    namespace: str
    name: str
    replica_identity: ReplicaIdentity
    storage: str
    columns: tuple[CatalogColumn, ...]
    primary_key: tuple[str, ...]

    @property
    def qualified(self) -> str:
        """``schema.table`` (raw names)."""
        return f"{self.namespace}.{self.name}"

    def relation(self) -> Relation:
        """The Relation message pgoutput sends for the table in this state."""
        return Relation(
            oid=self.oid,
            namespace=self.namespace,
            name=self.name,
            replica_identity=self.replica_identity,
            columns=tuple(RelationColumn(c.key, c.name, c.type_oid, c.typmod) for c in self.columns),
        )

    def matches(self, relation: Relation) -> bool:
        """True when ``relation`` has exactly these columns (names, types, typmods, in order)."""
        ours = [(c.name, c.type_oid, c.typmod) for c in self.columns]
        theirs = [(c.name, c.type_oid, c.atttypmod) for c in relation.columns]
        return ours == theirs


_TABLES_QUERY: Final = """
SELECT c.oid::int8, n.nspname, c.relname, c.relreplident::text,
       CASE WHEN c.relkind = 'p' THEN
           coalesce((SELECT string_agg(p.oid::text || ':' || p.relfilenode::text, ',' ORDER BY p.oid)
                     FROM pg_partition_tree(c.oid) t JOIN pg_class p ON p.oid = t.relid
                     WHERE t.isleaf), '')
       ELSE c.relfilenode::text END,
       coalesce((SELECT json_agg(json_build_array(a.attnum, a.attname, a.atttypid::int8, a.atttypmod,
                                                  a.atthasmissing, coalesce(a.attnum = ANY(i.indkey), false))
                                 ORDER BY a.attnum)
                 FROM pg_attribute a
                 LEFT JOIN pg_index i ON i.indrelid = a.attrelid
                      AND (CASE WHEN c.relreplident = 'i' THEN i.indisreplident ELSE i.indisprimary END)
                 WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''),
                '[]'),
       coalesce((SELECT json_agg(a.attname ORDER BY a.attnum) FROM pg_index i
                 JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
                 WHERE i.indrelid = c.oid AND i.indisprimary), '[]')
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
"""


def read_tables(conn: psycopg.Connection[Any], oids: Iterable[int]) -> dict[int, CatalogTable]:
    """The catalog state of tables by oid (a table that no longer exists is left out)."""
    wanted = sorted(set(oids))
    if not wanted:
        return {}
    rows = conn.execute(_TABLES_QUERY + " WHERE c.oid = ANY(%s::oid[])", (wanted,)).fetchall()
    return {table.oid: table for table in map(_table, rows)}


def published_tables(conn: psycopg.Connection[Any], publication: str) -> dict[int, CatalogTable]:
    """The catalog state of every table the publication publishes (partitioned ones by their root)."""
    rows = conn.execute(
        _TABLES_QUERY + " WHERE c.oid IN (SELECT format('%%I.%%I', pt.schemaname, pt.tablename)::regclass "
        "FROM pg_publication_tables pt WHERE pt.pubname = %s)",
        (publication,),
    ).fetchall()
    return {table.oid: table for table in map(_table, rows)}


def _table(row: tuple[Any, ...]) -> CatalogTable:
    oid, namespace, name, identity, storage, columns, primary = row
    parsed = columns if isinstance(columns, list) else orjson.loads(columns)
    full = identity == ReplicaIdentity.FULL.value
    return CatalogTable(
        oid=int(oid),
        namespace=str(namespace),
        name=str(name),
        replica_identity=ReplicaIdentity(identity),
        storage=str(storage),
        columns=tuple(
            CatalogColumn(int(attnum), str(column), int(type_oid), int(typmod), bool(filled), bool(key) or full)
            for attnum, column, type_oid, typmod, filled, key in parsed
        ),
        primary_key=tuple(primary if isinstance(primary, list) else orjson.loads(primary)),
    )
