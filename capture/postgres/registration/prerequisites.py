"""What a source database must provide before Headwater can capture it, checked before anything is created.

:func:`inspect_source` gathers facts over a connection (catalog reads only);
:func:`find_problems` turns facts into :class:`Problem` s without I/O, each one line
that says what is wrong and the SQL or setting that fixes it.

Standbys are refused (:func:`standby_refusal`). Version policy: PostgreSQL 14 or newer.
Logical decoding with pgoutput exists since 10, but the capture agent relies on pgoutput protocol 2 (streaming of large
in-progress transactions) and logical decoding messages, both new in 14; 10-13 are
also out of community support. ``--schemas`` needs 15 (``FOR TABLES IN SCHEMA``),
and, as Postgres requires, a superuser to create such a publication.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from capture.postgres.identifiers import TableName, quote_part
from capture.postgres.registration import publication as pub
from capture.postgres.registration.publication import PublicationInfo
from capture.postgres.registration.slot import SlotStatus, in_recovery, slot_status

MIN_SERVER_VERSION = 140000
SCHEMAS_MIN_SERVER_VERSION = 150000

_KINDS = {"r": "table", "p": "partitioned table", "v": "view", "m": "materialized view", "f": "foreign table"}


def standby_refusal(database: str) -> str:
    """Why a hot standby cannot be a source, and what to do (one line).

    PostgreSQL 16+ decodes on a standby, but capture writes logical messages into the WAL its
    slot decodes: the caught-up marker, heartbeats that move an idle slot, incremental-snapshot
    watermarks; a standby cannot write WAL (``pg_logical_emit_message`` fails in recovery).
    Writing them through the primary would leave an incremental snapshot's window unsound (a
    chunk read on the standby can come before the standby replayed its opening watermark).
    """
    return (
        f"database {database} is on a hot standby (in recovery): capture writes logical messages "
        "(heartbeats, markers, snapshot watermarks) into the WAL it decodes, which a standby cannot; "
        "give the primary's DSN (on PostgreSQL 17+ the slot is a failover slot, so capture follows a promoted "
        "standby when the DSN lists both hosts with target_session_attrs=read-write)"
    )


@dataclass(frozen=True, slots=True)
class CaptureRequest:
    """What a source asks to capture, and the slot and publication names it will use."""

    source: str
    slot: str
    publication: str
    tables: tuple[TableName, ...] | None = None
    schemas: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class Problem:
    """One failed check: ``fatal`` ones stop registration, the others are warnings."""

    check: str
    message: str
    fatal: bool = True
    table: str | None = None


@dataclass(frozen=True, slots=True)
class TableFacts:
    """One table to capture (listed, or found in a listed schema)."""

    name: TableName
    kind: str | None  # pg_class.relkind; None when the table does not exist
    can_select: bool = False
    schema_usage: bool = False
    has_primary_key: bool = False
    replica_identity: str = "d"  # d(efault) / n(othing) / f(ull) / i(ndex)
    owned: bool = False


@dataclass(frozen=True, slots=True)
class SourceFacts:
    """What the checks need to know about the server, the role and the tables."""

    server_version: int
    server_version_text: str
    in_recovery: bool = False
    database: str = ""
    role: str = ""
    is_superuser: bool = False
    has_replication: bool = False
    can_create_in_database: bool = False
    wal_level: str = ""
    max_replication_slots: int = 0
    slots_used: int = 0
    max_wal_senders: int = 0
    wal_senders_used: int = 0
    tables: tuple[TableFacts, ...] = ()
    missing_schemas: tuple[str, ...] = ()
    slot: SlotStatus | None = None
    publication: PublicationInfo | None = None


def _setting(conn: psycopg.Connection[Any], name: str) -> str:
    row = conn.execute("SELECT current_setting(%s)", (name,)).fetchone()
    assert row is not None
    return str(row[0])


_TABLE_FACTS = """
SELECT c.relkind,
       has_table_privilege(c.oid, 'SELECT'),
       has_schema_privilege(n.oid, 'USAGE'),
       EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary),
       c.relreplident,
       pg_has_role(current_user, c.relowner, 'USAGE')
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %s AND c.relname = %s
"""


def _table_facts(conn: psycopg.Connection[Any], table: TableName) -> TableFacts:
    row = conn.execute(_TABLE_FACTS, (table.schema, table.name)).fetchone()
    if row is None:
        return TableFacts(table, None)
    return TableFacts(
        table,
        kind=row[0],
        can_select=bool(row[1]),
        schema_usage=bool(row[2]),
        has_primary_key=bool(row[3]),
        replica_identity=row[4],
        owned=bool(row[5]),
    )


def inspect_source(conn: psycopg.Connection[Any], request: CaptureRequest) -> SourceFacts:
    """Read everything the checks need (catalog reads only; nothing is changed)."""
    version = conn.info.server_version
    version_text = _setting(conn, "server_version")
    if version < MIN_SERVER_VERSION:
        # Older catalogs lack columns queried below; the version problem is the one to report.
        return SourceFacts(server_version=version, server_version_text=version_text)
    if in_recovery(conn):
        # A standby is refused whatever else holds (standby_refusal); it is the one problem to report.
        return SourceFacts(version, version_text, in_recovery=True, database=str(conn.info.dbname))
    row = conn.execute(
        "SELECT current_database(), current_user, r.rolsuper, r.rolreplication, "
        "has_database_privilege(current_database(), 'CREATE'), "
        "(SELECT count(*) FROM pg_replication_slots), "
        "(SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'walsender') "
        "FROM pg_roles r WHERE r.rolname = current_user"
    ).fetchone()
    assert row is not None
    database, role, is_superuser, has_replication, can_create, slots_used, senders_used = row
    if request.tables is not None:
        tables = tuple(_table_facts(conn, t) for t in request.tables)
        missing_schemas: tuple[str, ...] = ()
    else:
        schemas = request.schemas or ()
        existing = {
            name
            for (name,) in conn.execute(
                "SELECT nspname FROM pg_namespace WHERE nspname = ANY(%s)", (list(schemas),)
            ).fetchall()
        }
        missing_schemas = tuple(s for s in schemas if s not in existing)
        in_schemas = conn.execute(
            "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = ANY(%s) AND c.relkind IN ('r', 'p') AND NOT c.relispartition ORDER BY 1, 2",
            (list(schemas),),
        ).fetchall()
        tables = tuple(_table_facts(conn, TableName(s, t)) for s, t in in_schemas)
    return SourceFacts(
        server_version=version,
        server_version_text=version_text,
        database=database,
        role=role,
        is_superuser=bool(is_superuser),
        has_replication=bool(has_replication),
        can_create_in_database=bool(can_create),
        wal_level=_setting(conn, "wal_level"),
        max_replication_slots=int(_setting(conn, "max_replication_slots")),
        slots_used=int(slots_used),
        max_wal_senders=int(_setting(conn, "max_wal_senders")),
        wal_senders_used=int(senders_used),
        tables=tables,
        missing_schemas=missing_schemas,
        slot=slot_status(conn, request.slot),
        publication=pub.publication_info(conn, request.publication),
    )


def _ident(name: str) -> str:
    return sql.Identifier(name).as_string(None)


def _table_problems(facts: SourceFacts, request: CaptureRequest) -> list[Problem]:
    problems: list[Problem] = []
    role = _ident(facts.role)
    for table in facts.tables:
        name = str(table.name)
        quoted = table.name.identifier.as_string(None)
        if table.kind is None:
            problems.append(
                Problem(
                    "table_exists",
                    f"table {name} does not exist in database {facts.database}; check the spelling "
                    "(unquoted names fold to lower case: quote mixed-case names) or create it first",
                    table=name,
                )
            )
            continue
        if table.kind not in ("r", "p"):
            kind = _KINDS.get(table.kind, f"relation of kind {table.kind!r}")
            problems.append(
                Problem("table_kind", f"{name} is a {kind}, not a table; only tables can be captured", table=name)
            )
            continue
        if not table.schema_usage:
            problems.append(
                Problem(
                    "schema_usage",
                    f"role {facts.role} lacks USAGE on schema {quote_part(table.name.schema)}; "
                    f"have an admin run: GRANT USAGE ON SCHEMA {_ident(table.name.schema)} TO {role}",
                    table=name,
                )
            )
        if not table.can_select:
            problems.append(
                Problem(
                    "select_privilege",
                    f"role {facts.role} lacks SELECT on {name} (needed for snapshots); "
                    f"have an admin run: GRANT SELECT ON {quoted} TO {role}",
                    table=name,
                )
            )
        if not table.has_primary_key and table.replica_identity in ("d", "n"):
            identity = "DEFAULT" if table.replica_identity == "d" else "NOTHING"
            problems.append(
                Problem(
                    "replica_identity",
                    f"{name} has no primary key and REPLICA IDENTITY {identity}, so its updates and deletes "
                    "cannot be captured (Postgres rejects them once the table is published); add a primary key, "
                    f"or run: ALTER TABLE {quoted} REPLICA IDENTITY FULL",
                    table=name,
                )
            )
    if request.tables is not None:
        return problems
    for schema in facts.missing_schemas:
        problems.append(
            Problem(
                "schema_exists",
                f"schema {quote_part(schema)} does not exist in database {facts.database}; "
                "check the spelling or create it first",
            )
        )
    return problems


def _slot_problems(facts: SourceFacts, request: CaptureRequest) -> list[Problem]:
    slot = facts.slot
    if slot is not None:
        where = f"plugin {slot.plugin}, database {slot.database}" if slot.plugin else f"{slot.slot_type} slot"
        if slot.active:
            message = (
                f"replication slot {slot.name} is in use by another consumer (process {slot.active_pid}, {where}); "
                "choose another name with --slot NAME"
            )
        else:
            message = (
                f"replication slot {slot.name} already exists ({where}, inactive) and may belong to another "
                "consumer; choose another name with --slot NAME, or if nothing uses it drop it: "
                f"SELECT pg_drop_replication_slot('{slot.name}')"
            )
        return [Problem("slot_name", message)]
    if facts.slots_used >= facts.max_replication_slots:
        return [
            Problem(
                "free_slot",
                f"no free replication slot: {facts.slots_used} of max_replication_slots = "
                f"{facts.max_replication_slots} in use; drop an unused one (see pg_replication_slots) or raise "
                "max_replication_slots in postgresql.conf and restart Postgres",
            )
        ]
    return []


def _publication_problems(facts: SourceFacts, request: CaptureRequest) -> list[Problem]:
    existing = facts.publication
    name = request.publication
    if existing is None:
        reasons: list[str] = []
        if not facts.is_superuser:
            if not facts.can_create_in_database:
                reasons.append(f"CREATE on database {facts.database}")
            if request.schemas is not None:
                reasons.append("superuser (FOR TABLES IN SCHEMA)")
            not_owned = [str(t.name) for t in facts.tables if t.kind in ("r", "p") and not t.owned]
            if not_owned:
                reasons.append("ownership of " + ", ".join(not_owned))
        if not reasons:
            return []
        create = pub.as_text(pub.create_statement(name, tables=request.tables, schemas=request.schemas))
        return [
            Problem(
                "publication_rights",
                f"role {facts.role} cannot create publication {name} (that needs {' and '.join(reasons)}); "
                f"have a table owner or superuser run: {create}; then run this command again",
            )
        ]
    if not existing.publishes_exactly(tables=request.tables, schemas=request.schemas):
        if existing.created_for(request.source) and existing.owned_by_current_role:
            return []  # ours: registration alters it to the requested tables
        wanted = (
            "tables " + ", ".join(str(t) for t in request.tables or ())
            if request.tables is not None
            else "schemas " + ", ".join(quote_part(s) for s in request.schemas or ())
        )
        drop = _ident(name)
        return [
            Problem(
                "publication_targets",
                f"publication {name} already exists with {existing.describe_targets()}, not {wanted}; name another "
                f"with --publication NAME, or if nothing else uses it: DROP PUBLICATION {drop} (or ALTER it to match)",
            )
        ]
    problems = []
    missing_ops = sorted(pub.REQUIRED_OPERATIONS - existing.operations)
    if missing_ops:
        problems.append(
            Problem(
                "publication_operations",
                f"publication {name} does not publish {', '.join(missing_ops)}, so those changes would be lost; "
                f"its owner can run: ALTER PUBLICATION {_ident(name)} "
                "SET (publish = 'insert, update, delete, truncate')",
            )
        )
    partitioned = [str(t.name) for t in facts.tables if t.kind == "p"]
    if partitioned and not existing.via_partition_root:
        problems.append(
            Problem(
                "publication_partition_root",
                f"publication {name} lacks publish_via_partition_root, so changes to {', '.join(partitioned)} "
                f"arrive under partition names; its owner can run: ALTER PUBLICATION {_ident(name)} "
                "SET (publish_via_partition_root = true)",
            )
        )
    return problems


def find_problems(facts: SourceFacts, request: CaptureRequest) -> list[Problem]:
    """Every failed check (fatal first, then warnings), in the order an operator would fix them."""
    if facts.server_version < MIN_SERVER_VERSION:
        return [
            Problem(
                "server_version",
                f"PostgreSQL {facts.server_version_text} is too old: Headwater needs 14 or newer "
                "(pgoutput protocol 2 and logical messages); upgrade the server",
            )
        ]
    if facts.in_recovery:
        return [Problem("standby", standby_refusal(facts.database))]
    problems: list[Problem] = []
    if request.schemas is not None and facts.server_version < SCHEMAS_MIN_SERVER_VERSION:
        problems.append(
            Problem(
                "server_version",
                f"--schemas needs PostgreSQL 15 or newer (FOR TABLES IN SCHEMA), this is {facts.server_version_text}; "
                "list the tables with --tables instead",
            )
        )
    if facts.wal_level != "logical":
        problems.append(
            Problem(
                "wal_level",
                f"wal_level is {facts.wal_level}, logical decoding needs logical: set wal_level = logical in "
                "postgresql.conf (ALTER SYSTEM SET wal_level = logical) and restart Postgres",
            )
        )
    if not (facts.has_replication or facts.is_superuser):
        problems.append(
            Problem(
                "replication_privilege",
                f"role {facts.role} lacks the REPLICATION attribute a replication slot needs; "
                f"have an admin run: ALTER ROLE {_ident(facts.role)} WITH REPLICATION",
            )
        )
    problems += _slot_problems(facts, request)
    if facts.wal_senders_used >= facts.max_wal_senders:
        problems.append(
            Problem(
                "free_wal_sender",
                f"no free WAL sender for the capture agent: {facts.wal_senders_used} of max_wal_senders = "
                f"{facts.max_wal_senders} in use; raise max_wal_senders in postgresql.conf and restart Postgres",
            )
        )
    problems += _table_problems(facts, request)
    problems += _publication_problems(facts, request)
    if facts.is_superuser:
        if request.schemas is not None:
            targets = "ALL TABLES IN SCHEMA " + ", ".join(_ident(s) for s in request.schemas)
        else:
            listed = [t.name.identifier.as_string(None) for t in facts.tables if t.kind in ("r", "p")]
            targets = ", ".join(listed) or "..."
        problems.append(
            Problem(
                "least_privilege",
                f"role {facts.role} is a superuser: this works, but prefer a least-privilege role: "
                f"CREATE ROLE capture WITH LOGIN REPLICATION PASSWORD '...'; GRANT SELECT ON {targets} TO capture; "
                "and have a table owner create the publication",
                fatal=False,
            )
        )
    return problems


def check_source(conn: psycopg.Connection[Any], request: CaptureRequest) -> tuple[SourceFacts, list[Problem]]:
    """Inspect the source and return its facts with every problem found."""
    facts = inspect_source(conn, request)
    return facts, find_problems(facts, request)


def fatal(problems: Sequence[Problem]) -> list[Problem]:
    """The problems that stop registration."""
    return [p for p in problems if p.fatal]
