"""Logical replication slots: create, inspect, drop.

A slot is the source's resume point: Postgres keeps every WAL segment from the
slot's ``restart_lsn`` on, and decodes from its ``confirmed_flush_lsn`` (the last
position the capture agent acknowledged, i.e. durably wrote to the log). A slot
nobody consumes therefore retains WAL without bound: ``slot_status`` reports how
much, so ``headwater status`` can warn before the disk fills.

Registration creates the slot with plain SQL. The capture agent re-creates it over
a replication connection with an exported snapshot when it needs an initial snapshot
that lines up exactly with the slot's start.

Failover: on PostgreSQL 17+ every slot is created with ``failover`` (and an older slot of a
source gets it at capture start), so a standby with ``sync_replication_slots`` keeps a copy
and, after a promotion, capture goes on from it on the new primary (a multi-host DSN with
``target_session_attrs=read-write`` finds it). Before 17 a slot lives on its server only: a
failover loses it, and ``headwater source resync`` recovers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from capture.errors import InvalidIdentifierError, SlotError
from core.errors import one_line
from log.sequence import Lsn

#: Postgres allows lower-case letters, digits and "_" in slot names, up to NAMEDATALEN - 1 bytes.
_SLOT_NAME = re.compile(r"^[a-z0-9_]{1,63}$")
PLUGIN = "pgoutput"
#: Slots that survive a failover (``failover`` option, slot sync on standbys).
FAILOVER_MIN_SERVER_VERSION = 170000


def has_failover_slots(conn: psycopg.Connection[Any]) -> bool:
    """Whether the server creates slots a standby can keep through a failover (PostgreSQL 17+)."""
    return conn.info.server_version >= FAILOVER_MIN_SERVER_VERSION


def no_failover_note(conn: psycopg.Connection[Any], source: str) -> str | None:
    """What to do after a failover where slots cannot survive one (before 17); None from 17 on."""
    if has_failover_slots(conn):
        return None
    version = conn.info.server_version
    return (
        f"PostgreSQL {version // 10000} keeps no replication slot through a failover (failover slots need 17+): "
        f"after promoting a standby, run: headwater source resync {source}"
    )


def export_snapshot_command(conn: psycopg.Connection[Any], slot: str) -> sql.Composed:
    """``CREATE_REPLICATION_SLOT`` with an exported snapshot, and ``failover`` where the server has it.

    The options list is 15+ syntax and ``FAILOVER`` exists only there (17+); 14 and 16 take the
    old form.
    """
    if has_failover_slots(conn):
        return sql.SQL("CREATE_REPLICATION_SLOT {} LOGICAL pgoutput (SNAPSHOT 'export', FAILOVER true)").format(
            sql.Identifier(slot)
        )
    return sql.SQL("CREATE_REPLICATION_SLOT {} LOGICAL pgoutput EXPORT_SNAPSHOT").format(sql.Identifier(slot))


def enable_failover(repl: psycopg.Connection[Any], slot: str) -> None:
    """Give an existing (inactive) slot ``failover`` (17+), over a replication connection."""
    repl.execute(sql.SQL("ALTER_REPLICATION_SLOT {} (FAILOVER true)").format(sql.Identifier(slot)))


def default_slot_name(source: str) -> str:
    """``headwater_<source>`` in the lower case Postgres requires of slot names."""
    return validate_slot_name(f"headwater_{source.lower()}")


def validate_slot_name(name: str) -> str:
    """Return ``name`` if Postgres accepts it as a slot name, else raise :class:`InvalidIdentifierError`."""
    if not _SLOT_NAME.match(name):
        msg = f"invalid slot name {name!r}: use 1-63 lower-case letters, digits and '_' (e.g. headwater_shop)"
        raise InvalidIdentifierError(msg, slot=name)
    return name


@dataclass(frozen=True, slots=True)
class SlotStatus:
    """A replication slot as ``pg_replication_slots`` shows it, plus the WAL it holds back."""

    name: str
    slot_type: str
    plugin: str | None
    database: str | None
    active: bool
    active_pid: int | None
    restart_lsn: Lsn | None
    confirmed_flush_lsn: Lsn | None
    #: WAL bytes between the server's current position and ``restart_lsn``: what the slot pins on disk.
    wal_retained_bytes: int | None
    #: ``reserved`` / ``extended`` / ``unreserved`` / ``lost`` (lost: the slot can no longer be used).
    wal_status: str | None
    #: Kept by standbys through a failover (17+; None before 17, where no slot is).
    failover: bool | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (LSNs as Postgres prints them)."""
        return {
            "name": self.name,
            "slot_type": self.slot_type,
            "plugin": self.plugin,
            "database": self.database,
            "active": self.active,
            "active_pid": self.active_pid,
            "restart_lsn": str(self.restart_lsn) if self.restart_lsn is not None else None,
            "confirmed_flush_lsn": str(self.confirmed_flush_lsn) if self.confirmed_flush_lsn is not None else None,
            "wal_retained_bytes": self.wal_retained_bytes,
            "wal_status": self.wal_status,
            "failover": self.failover,
        }


class SlotGoneError(SlotError):
    """The slot a source streams from was dropped or invalidated.

    The changes since its last acknowledged position can no longer be streamed; only a
    re-snapshot (``headwater source resync``) recovers.
    """


def is_gone(status: SlotStatus | None) -> bool:
    """True when the slot does not exist or Postgres invalidated it (``wal_status = 'lost'``)."""
    return status is None or status.wal_status == "lost"


def slot_gone_error(
    source: str, slot: str, status: SlotStatus | None, since: Lsn | None, *, failover_slots: bool = True
) -> SlotGoneError:
    """The one-line error for a gone slot, naming the last streamed position and the way out.

    ``failover_slots`` False (a server before 17): a missing slot may also be a failover's loss.
    """
    how = "dropped" if status is None else "invalidated: Postgres removed WAL it still needed (max_slot_wal_keep_size)"
    if status is None and not failover_slots:
        how = "dropped, or lost in a failover: before PostgreSQL 17 a standby keeps no replication slot"
    since_text = f"changes since LSN {since}" if since is not None and since.value else "changes since the last run"
    msg = (
        f'source {source}: replication slot "{slot}" is gone ({how}; {since_text} cannot be streamed); '
        f"run: headwater source resync {source}"
    )
    return SlotGoneError(msg, source=source, slot=slot, lsn=str(since) if since is not None else None)


def _lsn(text: str | None) -> Lsn | None:
    return Lsn.parse(text) if text is not None else None


def slot_status(conn: psycopg.Connection[Any], slot: str) -> SlotStatus | None:
    """The slot named ``slot``, or None when it does not exist."""
    # pg_current_wal_lsn() fails on a standby; there the retained size is unknown.
    current = "pg_current_wal_lsn()" if not in_recovery(conn) else "NULL::pg_lsn"
    failover = "failover" if has_failover_slots(conn) else "NULL::boolean"
    query = sql.SQL(
        "SELECT slot_name, slot_type, plugin, database, active, active_pid, "
        "restart_lsn::text, confirmed_flush_lsn::text, "
        "pg_wal_lsn_diff({current}, restart_lsn)::bigint, wal_status, {failover} "
        "FROM pg_replication_slots WHERE slot_name = %s"
    ).format(current=sql.SQL(current), failover=sql.SQL(failover))
    row = conn.execute(query, (slot,)).fetchone()
    if row is None:
        return None
    return SlotStatus(
        name=row[0],
        slot_type=row[1],
        plugin=row[2],
        database=row[3],
        active=bool(row[4]),
        active_pid=row[5],
        restart_lsn=_lsn(row[6]),
        confirmed_flush_lsn=_lsn(row[7]),
        wal_retained_bytes=row[8],
        wal_status=row[9],
        failover=row[10],
    )


def in_recovery(conn: psycopg.Connection[Any]) -> bool:
    """Whether the server is a standby (``pg_is_in_recovery()``)."""
    row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
    return bool(row and row[0])


def create_slot(conn: psycopg.Connection[Any], slot: str, *, source: str | None = None) -> Lsn:
    """Create logical slot ``slot`` with pgoutput (with ``failover`` on 17+); return its consistent point.

    ``conn`` must be in autocommit mode: Postgres refuses to create a logical slot in
    a transaction that has written anything, and waits for every running transaction
    that holds an xid (our own included) before it returns.
    """
    validate_slot_name(slot)
    # pg_create_logical_replication_slot(name, plugin, temporary, twophase, failover): 17+.
    failover = ", false, false, true" if has_failover_slots(conn) else ""
    try:
        row = conn.execute(
            f"SELECT lsn::text FROM pg_create_logical_replication_slot(%s, %s{failover})", (slot, PLUGIN)
        ).fetchone()
    except psycopg.errors.DuplicateObject:
        msg = f"replication slot {slot} already exists; choose another name with --slot NAME"
        raise SlotError(msg, source=source, slot=slot) from None
    except psycopg.Error as exc:
        detail = one_line(exc)
        msg = (
            f"cannot create replication slot {slot}: {detail}; "
            "run 'headwater source add' again to recheck the prerequisites"
        )
        raise SlotError(msg, source=source, slot=slot) from None
    assert row is not None
    return Lsn.parse(row[0])


def drop_slot(conn: psycopg.Connection[Any], slot: str, *, source: str | None = None) -> bool:
    """Drop ``slot``; False when it did not exist. An active slot is not touched (:class:`SlotError`)."""
    status = slot_status(conn, slot)
    if status is None:
        return False
    if status.active:
        msg = (
            f"replication slot {slot} is in use by process {status.active_pid}; "
            "stop the capture agent reading it (or end that process), then retry"
        )
        raise SlotError(msg, source=source, slot=slot)
    try:
        conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    except psycopg.errors.UndefinedObject:
        return False
    except psycopg.Error as exc:
        detail = one_line(exc)
        msg = (
            f"cannot drop replication slot {slot}: {detail}; "
            f"a superuser can run SELECT pg_drop_replication_slot('{slot}')"
        )
        raise SlotError(msg, source=source, slot=slot) from None
    return True
