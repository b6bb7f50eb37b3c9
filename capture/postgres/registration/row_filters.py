"""Row filters (``sources.<name>.filters``): which rows of a table are captured, streamed and snapshotted alike.

Streaming applies a filter as the table's row filter in the source's publication
(PostgreSQL 15+: ``ALTER PUBLICATION ... ADD TABLE t WHERE (...)``), so pgoutput sends only
matching rows, and an update that moves a row in or out of the filter arrives as an insert or
a delete; every snapshot (initial, resync, incremental) reads ``WHERE (filter)``.

A condition is one SQL expression: it is checked before it reaches any SQL (balanced
parentheses, no ``;``, no comments outside quotes), so it cannot end the statement it is put
into. The publication is brought to the configured filters at each start; an unchanged one is
left as it is. A filter may use only replica identity columns (or the table has ``REPLICA
IDENTITY FULL``): PostgreSQL would otherwise refuse every UPDATE and DELETE of the table.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import psycopg
from psycopg import sql

from capture import sql_condition
from capture.errors import ColumnSettingError, PublicationError
from capture.postgres.registration.publication import as_text
from core.durable_files import replace_json
from core.errors import one_line

_DOLLAR_TAG = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)?\$")
_VAR_ATTNO = re.compile(r"\{VAR :varno 1 :varattno (\d+)")
#: The first server version with publication row filters.
ROW_FILTER_VERSION = 150000


def _quoted_span(text: str, i: int) -> int | str | None:
    """PostgreSQL's quoting: ``'...'``, ``"..."`` (doubled quotes inside, ``E'...'`` escapes), dollar quotes."""
    char = text[i]
    if char in "'\"":
        escapes = char == "'" and i > 0 and text[i - 1] in "eE"
        i += 1
        while i < len(text) and not (text[i] == char and not text.startswith(char * 2, i)):
            i += 2 if text.startswith(char * 2, i) or (escapes and text[i] == "\\") else 1
        return i if i < len(text) else f"a {char} quote is not closed"
    if char == "$" and (tag := _DOLLAR_TAG.match(text, i)) is not None:
        end = text.find(tag.group(0), tag.end())
        if end < 0:
            return f"the dollar quote {tag.group(0)} is not closed"
        return end + len(tag.group(0)) - 1
    return None


def condition_problem(text: str) -> str | None:
    """Why ``text`` is not one SQL condition this module puts into a statement (None: it is)."""
    return sql_condition.condition_problem(text, _quoted_span)


def condition_sql(*conditions: str | None) -> sql.Composable | None:
    """``(a) AND (b)`` of the conditions given (None: no condition). Check each with :func:`condition_problem`."""
    parts = [sql.SQL("(" + c + ")") for c in conditions if c]
    return sql.SQL(" AND ").join(parts) if parts else None


def split_table(name: str) -> tuple[str, str]:
    """``schema.table`` as the config writes it (raw names, as ``keys`` and ``columns`` take them)."""
    schema, _, table = name.partition(".")
    return schema, table


def sync_publication_filters(
    conn: psycopg.Connection[Any],
    source: str,
    publication: str,
    filters: Mapping[str, str],
    *,
    record: Path | None = None,
) -> None:
    """Make the publication's row filters the configured ones; refuse in one line what cannot be.

    Tables of the publication without a configured filter lose a row filter they have (the
    snapshots would not apply it). A role that may not alter the publication gets the statement
    its owner can run. Such a role cannot compare a filter the publication has with the
    configured one (only altering deparses it), so ``record`` (a JSON file) keeps the configured
    condition and the publication's filter last seen together: a filter found after the owner ran
    the statement is taken, but a configured condition changed since, or a publication filter
    changed since, is refused again.
    """
    for table, condition in filters.items():
        problem = condition_problem(condition)
        if problem:
            raise ColumnSettingError(source, f"filters.{table}", f"{problem}: {condition!r}", table=table)
    current = _current_filters(conn, publication)
    if filters and conn.info.server_version < ROW_FILTER_VERSION:
        version = conn.info.parameter_status("server_version")
        first = next(iter(filters))
        raise ColumnSettingError(
            source,
            f"filters.{first}",
            f"row filters need PostgreSQL 15 or later (the source runs {version}); remove the filters or upgrade",
            table=first,
        )
    for table in filters:
        if table not in current:
            raise ColumnSettingError(
                source,
                f"filters.{table}",
                f"{table} is not listed in publication {publication} (a table published through "
                "'schemas' cannot have a row filter: list the table in 'tables')",
                table=table,
            )
    seen: dict[str, dict[str, str | None]] = orjson.loads(record.read_bytes()) if record and record.exists() else {}
    for table, before in current.items():
        wanted = filters.get(table)
        after = before
        if wanted is not None or before is not None:
            known = seen.get(table)
            trusted = known is None or known == {"condition": wanted, "rowfilter": before}
            after = _set_filter(
                conn, _Target(source, publication, table), condition=wanted, before=before, trusted=trusted
            )
        if wanted is None:
            seen.pop(table, None)
        else:
            seen[table] = {"condition": wanted, "rowfilter": after}
    if record is not None and (seen or record.exists()):
        replace_json(record, seen)


def _current_filters(conn: psycopg.Connection[Any], publication: str) -> dict[str, str | None]:
    """``schema.table`` -> the deparsed row filter (None: none) of each table listed in the publication."""
    column = "pg_get_expr(r.prqual, r.prrelid)" if conn.info.server_version >= ROW_FILTER_VERSION else "NULL"
    rows = conn.execute(
        f"SELECT n.nspname, c.relname, {column} FROM pg_publication_rel r "
        "JOIN pg_publication p ON p.oid = r.prpubid JOIN pg_class c ON c.oid = r.prrelid "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE p.pubname = %s",
        (publication,),
    ).fetchall()
    return {f"{schema}.{name}": rowfilter for schema, name, rowfilter in rows}


class _Unchanged(Exception):
    """Rolls back an ALTER that left the row filter as it was."""


@dataclass(frozen=True)
class _Target:
    """The table of a publication whose row filter is set."""

    source: str
    publication: str
    table: str


def _set_filter(
    conn: psycopg.Connection[Any], target: _Target, *, condition: str | None, before: str | None, trusted: bool
) -> str | None:
    """Set one table's row filter (``before``: the publication's now); the publication's filter after."""
    source, publication, table = target.source, target.publication, target.table
    identifier = sql.Identifier(*split_table(table))
    pub = sql.Identifier(publication)
    add = sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(pub, identifier)
    if condition is not None:
        add = sql.SQL("{} WHERE ({})").format(add, sql.SQL(condition))
    field = f"filters.{table}"
    try:
        with conn.transaction():
            conn.execute(sql.SQL("ALTER PUBLICATION {} DROP TABLE {}").format(pub, identifier))
            conn.execute(add)
            row = conn.execute(
                "SELECT pg_get_expr(r.prqual, r.prrelid), r.prqual::text, c.relreplident, c.oid "
                "FROM pg_publication_rel r JOIN pg_publication p ON p.oid = r.prpubid "
                "JOIN pg_class c ON c.oid = r.prrelid WHERE p.pubname = %s AND r.prrelid = %s::regclass",
                (publication, identifier.as_string(conn)),
            ).fetchone()
            assert row is not None
            if row[0] == before:
                raise _Unchanged
            if condition is not None:
                _check_identity(conn, target, field=field, node=row[1], identity=row[2], oid=row[3])
    except _Unchanged:
        return before
    except psycopg.errors.InsufficientPrivilege as exc:
        if before is not None and condition is not None and trusted:
            return before  # set by the owner, as the statement below said (see sync_publication_filters)
        statement = (
            as_text(sql.SQL("ALTER PUBLICATION {} DROP TABLE {}").format(pub, identifier)) + "; " + add.as_string(conn)
        )
        msg = (
            f"cannot set the row filter of {table} in publication {publication}: {one_line(exc)}; "
            f"its owner can run: {statement}"
        )
        raise PublicationError(msg, source=source, publication=publication) from None
    except psycopg.OperationalError:
        raise
    except psycopg.Error as exc:
        if condition is None:
            raise
        raise ColumnSettingError(
            source, field, f"{condition!r} is not a row filter: {one_line(exc)}", table=table
        ) from None
    return str(row[0]) if row[0] is not None else None


def _check_identity(
    conn: psycopg.Connection[Any], target: _Target, *, field: str, node: str, identity: str, oid: int
) -> None:
    """Refuse a filter on columns outside the replica identity (PostgreSQL would refuse the table's updates)."""
    source, table = target.source, target.table
    if identity == "f":
        return
    used = {int(n) for n in _VAR_ATTNO.findall(node)}
    flag = "indisprimary" if identity == "d" else "indisreplident"
    covered = {
        int(n)
        for (n,) in conn.execute(
            f"SELECT unnest(indkey) FROM pg_index WHERE indrelid = %s AND {flag}",
            (oid,),
        ).fetchall()
    }
    outside = sorted(used - covered)
    if outside:
        (name,) = conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = %s AND attnum = %s", (oid, outside[0])
        ).fetchone() or ("?",)
        raise ColumnSettingError(
            source,
            field,
            f"the filter uses column {name!r}, which is not in the replica identity of {table}, so PostgreSQL would "
            f"refuse every UPDATE and DELETE of the table; filter on key columns or run "
            f"'ALTER TABLE {table} REPLICA IDENTITY FULL'",
            table=table,
        )
