"""Publications: which tables pgoutput sends for a source.

A publication created by Headwater carries the comment ``headwater source <name>``.
That marker is how ``source add`` knows it may alter an existing publication and how
``source remove`` knows it may drop one: a publication an administrator created for
a least-privilege role (which cannot create one ``FOR TABLE`` without owning the
tables) has no marker and is never altered or dropped by Headwater.

Publications are created with ``publish_via_partition_root = true`` so a partitioned
table's changes arrive under the partitioned table's name, not its partitions'.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from capture.errors import InvalidIdentifierError, PublicationError
from capture.postgres.identifiers import MAX_IDENTIFIER_BYTES, TableName, quote_part
from core.errors import one_line

#: The operations a capture publication must publish; anything less loses changes silently.
REQUIRED_OPERATIONS = frozenset({"insert", "update", "delete", "truncate"})


def default_publication_name(source: str) -> str:
    """``headwater_<source>``."""
    return f"headwater_{source.lower()}"


def validate_publication_name(name: str) -> str:
    """Return ``name`` if Postgres accepts it verbatim as a publication name (it is taken literally, not parsed)."""
    if not name or len(name.encode()) > MAX_IDENTIFIER_BYTES:
        msg = f"invalid publication name {name!r}: give 1 to {MAX_IDENTIFIER_BYTES} bytes"
        raise InvalidIdentifierError(msg, publication=name)
    return name


def ownership_marker(source: str) -> str:
    """The publication comment that marks it as created by Headwater for ``source``."""
    return f"headwater source {source}"


@dataclass(frozen=True, slots=True)
class PublicationInfo:
    """An existing publication as the catalogs describe it."""

    name: str
    owner: str
    #: True when the current role may ALTER or DROP it (owner, member of the owner, or superuser).
    owned_by_current_role: bool
    all_tables: bool
    tables: tuple[TableName, ...]
    schemas: tuple[str, ...]
    operations: frozenset[str]
    via_partition_root: bool
    comment: str | None

    def created_for(self, source: str) -> bool:
        """True when Headwater created this publication for ``source``."""
        return self.comment == ownership_marker(source)

    def describe_targets(self) -> str:
        """What it publishes, for messages: ``tables a.b, c.d`` / ``schemas s`` / ``all tables``."""
        if self.all_tables:
            return "all tables"
        parts = []
        if self.tables:
            parts.append("tables " + ", ".join(str(t) for t in self.tables))
        if self.schemas:
            parts.append("schemas " + ", ".join(quote_part(s) for s in self.schemas))
        return " and ".join(parts) or "no tables"

    def publishes_exactly(self, *, tables: Sequence[TableName] | None, schemas: Sequence[str] | None) -> bool:
        """True when it publishes exactly these tables, or exactly these schemas."""
        if self.all_tables:
            return False
        return set(self.tables) == set(tables or ()) and set(self.schemas) == set(schemas or ())

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "name": self.name,
            "owner": self.owner,
            "all_tables": self.all_tables,
            "tables": [str(t) for t in self.tables],
            "schemas": list(self.schemas),
            "operations": sorted(self.operations),
            "via_partition_root": self.via_partition_root,
            "created_by_headwater": (self.comment or "").startswith("headwater source "),
        }


def publication_info(conn: psycopg.Connection[Any], name: str) -> PublicationInfo | None:
    """The publication ``name`` in the connected database, or None."""
    row = conn.execute(
        "SELECT p.oid, pg_get_userbyid(p.pubowner), "
        "pg_has_role(current_user, p.pubowner, 'USAGE') "
        "  OR (SELECT rolsuper FROM pg_roles WHERE rolname = current_user), "
        "p.puballtables, p.pubinsert, p.pubupdate, p.pubdelete, p.pubtruncate, p.pubviaroot, "
        "obj_description(p.oid, 'pg_publication') "
        "FROM pg_publication p WHERE p.pubname = %s",
        (name,),
    ).fetchone()
    if row is None:
        return None
    oid = row[0]
    tables = tuple(
        TableName(schema, table)
        for schema, table in conn.execute(
            "SELECT n.nspname, c.relname FROM pg_publication_rel r "
            "JOIN pg_class c ON c.oid = r.prrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE r.prpubid = %s ORDER BY 1, 2",
            (oid,),
        ).fetchall()
    )
    schemas: tuple[str, ...] = ()
    if conn.info.server_version >= 150000:  # pg_publication_namespace is new in 15
        schemas = tuple(
            schema
            for (schema,) in conn.execute(
                "SELECT n.nspname FROM pg_publication_namespace pn JOIN pg_namespace n ON n.oid = pn.pnnspid "
                "WHERE pn.pnpubid = %s ORDER BY 1",
                (oid,),
            ).fetchall()
        )
    flags = dict(zip(("insert", "update", "delete", "truncate"), row[4:8], strict=True))
    return PublicationInfo(
        name=name,
        owner=row[1],
        owned_by_current_role=bool(row[2]),
        all_tables=bool(row[3]),
        tables=tables,
        schemas=schemas,
        operations=frozenset(op for op, on in flags.items() if on),
        via_partition_root=bool(row[8]),
        comment=row[9],
    )


def _targets(*, tables: Sequence[TableName] | None, schemas: Sequence[str] | None) -> sql.Composed:
    if tables:
        return sql.SQL("TABLE {}").format(sql.SQL(", ").join(t.identifier for t in tables))
    if schemas:
        return sql.SQL("TABLES IN SCHEMA {}").format(sql.SQL(", ").join(sql.Identifier(s) for s in schemas))
    msg = "a publication needs tables or schemas"
    raise ValueError(msg)


def create_statement(
    name: str, *, tables: Sequence[TableName] | None = None, schemas: Sequence[str] | None = None
) -> sql.Composed:
    """``CREATE PUBLICATION name FOR ...`` as Headwater creates it (also shown to admins to run)."""
    return sql.SQL("CREATE PUBLICATION {} FOR {} WITH (publish_via_partition_root = true)").format(
        sql.Identifier(name), _targets(tables=tables, schemas=schemas)
    )


def alter_statement(
    name: str, *, tables: Sequence[TableName] | None = None, schemas: Sequence[str] | None = None
) -> sql.Composed:
    """``ALTER PUBLICATION name SET ...``: replace what it publishes."""
    return sql.SQL("ALTER PUBLICATION {} SET {}").format(sql.Identifier(name), _targets(tables=tables, schemas=schemas))


def as_text(statement: sql.Composable) -> str:
    """SQL text for messages (identifiers quoted as Postgres would read them)."""
    return statement.as_string(None)


def create_publication(
    conn: psycopg.Connection[Any],
    name: str,
    *,
    source: str,
    tables: Sequence[TableName] | None = None,
    schemas: Sequence[str] | None = None,
) -> None:
    """Create the publication with Headwater's ownership marker (one transaction: both or neither)."""
    statement = create_statement(name, tables=tables, schemas=schemas)
    try:
        with conn.transaction():
            conn.execute(statement)
            conn.execute(
                sql.SQL("COMMENT ON PUBLICATION {} IS {}").format(
                    sql.Identifier(name), sql.Literal(ownership_marker(source))
                )
            )
    except psycopg.Error as exc:
        raise _refused(name, exc, statement, action="create", source=source, who="an owner of the tables") from None


def set_publication_targets(
    conn: psycopg.Connection[Any],
    name: str,
    *,
    source: str,
    tables: Sequence[TableName] | None = None,
    schemas: Sequence[str] | None = None,
) -> None:
    """Make an existing (Headwater-created) publication publish exactly ``tables`` or ``schemas``."""
    statement = alter_statement(name, tables=tables, schemas=schemas)
    try:
        conn.execute(statement)
    except psycopg.Error as exc:
        raise _refused(name, exc, statement, action="alter", source=source) from None


def drop_publication(conn: psycopg.Connection[Any], name: str, *, source: str | None = None) -> bool:
    """Drop the publication; False when it did not exist."""
    statement = sql.SQL("DROP PUBLICATION {}").format(sql.Identifier(name))
    try:
        conn.execute(statement)
    except psycopg.errors.UndefinedObject:
        return False
    except psycopg.Error as exc:
        raise _refused(name, exc, statement, action="drop", source=source) from None
    return True


def _refused(
    name: str, exc: psycopg.Error, statement: sql.Composable, *, action: str, source: str | None, who: str = "its owner"
) -> PublicationError:
    """The error for a publication statement the server refused: what failed, and who can run it instead."""
    msg = f"cannot {action} publication {name}: {one_line(exc)}; {who} can run: {as_text(statement)}"
    return PublicationError(msg, source=source, publication=name)
