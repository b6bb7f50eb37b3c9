"""Headwater's own logical messages in the WAL: heartbeats, the caught-up marker, snapshot watermarks.

Every replication slot on the database receives every logical message, so Headwater's
markers carry one prefix, :data:`MARKER_PREFIX` (``headwater``), that other consumers can
filter (Debezium: ``message.prefix.exclude.list=headwater``), and say what they are in their
content: ``<kind>`` or ``<kind> <token>``. Capture itself never writes them to the log.
Prefixes starting with ``headwater.`` are the markers of earlier versions (a slot may re-send
them after an upgrade): they are markers too.
"""

from __future__ import annotations

import secrets
from typing import Any, Final

import psycopg

from capture.postgres.decoding.pgoutput_messages import LogicalMessage

MARKER_PREFIX: Final = "headwater"
_LEGACY_PREFIX: Final = "headwater."

HEARTBEAT: Final = "heartbeat"
CAUGHT_UP: Final = "caught-up"
WINDOW_OPEN: Final = "snapshot-window-open"
WINDOW_CLOSE: Final = "snapshot-window-close"


def is_marker(prefix: str) -> bool:
    """True for the prefix of a Headwater marker (never captured)."""
    return prefix == MARKER_PREFIX or prefix.startswith(_LEGACY_PREFIX)


def marker_content(kind: str, token: str | None = None) -> str:
    """The content of a marker: its kind, and its token when it has one."""
    return kind if token is None else f"{kind} {token}"


def marker_of(message: LogicalMessage) -> tuple[str, str | None] | None:
    """``(kind, token)`` of a Headwater marker message, else None."""
    if message.prefix != MARKER_PREFIX:
        return None
    kind, _, token = message.content.decode(errors="replace").partition(" ")
    return kind, token or None


def emit_marker(
    conn: psycopg.Connection[Any], kind: str, *, token: str | None = None, transactional: bool = False
) -> str | None:
    """Write a marker into the WAL; with ``token=""`` a fresh one is made. Returns the token."""
    if token == "":
        token = secrets.token_hex(8)
    conn.execute(
        "SELECT pg_logical_emit_message(%s, %s, %s)", (transactional, MARKER_PREFIX, marker_content(kind, token))
    )
    return token
