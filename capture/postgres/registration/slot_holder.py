"""Who streams from a replication slot: the holder of an active slot, named for the operator.

Postgres lets one connection at a time stream from a slot. Headwater's own processes
are serialised by a lease per source (:mod:`core.leases`), which only processes sharing
the project's home see; a capture on another host, or any other client, shows only as an
active slot. Every capture process names itself in ``application_name``
(:func:`application_name`), so such a holder is described from ``pg_stat_replication``.
"""

from __future__ import annotations

import os
import re
import socket
from typing import Any

import psycopg

from core.leases import Holder

_HEADWATER = re.compile(r"^headwater capture (\d+)@(.+)$")
#: Postgres keeps NAMEDATALEN - 1 bytes of an application_name.
_MAX_NAME = 63


def application_name() -> str:
    """``headwater capture <pid>@<host>``: how a capture process shows in ``pg_stat_replication``."""
    return f"headwater capture {os.getpid()}@{socket.gethostname()}"[:_MAX_NAME]


def slot_holder(conn: psycopg.Connection[Any], slot: str) -> Holder | None:
    """The process streaming from ``slot`` (None: the slot is free or does not exist)."""
    row = conn.execute(
        "SELECT s.active_pid, r.application_name, coalesce(r.client_hostname, host(r.client_addr)), "
        "to_char(r.backend_start AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"') "
        "FROM pg_replication_slots s LEFT JOIN pg_stat_replication r ON r.pid = s.active_pid "
        "WHERE s.slot_name = %s AND s.active",
        (slot,),
    ).fetchone()
    if row is None:
        return None
    walsender, name, client, since = row
    found = _HEADWATER.match(name or "")
    if found is not None:
        command = f"headwater capture, walsender pid {walsender}"
        return Holder(int(found.group(1)), found.group(2), command, since or "unknown")
    command = f"{name or 'a client'} streaming slot {slot}, walsender pid {walsender}"
    return Holder(int(walsender), client or "a local socket", command, since or "unknown")
