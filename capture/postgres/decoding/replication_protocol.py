"""Frames of the streaming replication protocol's CopyBoth phase (PostgreSQL docs 55.4).

The server sends ``XLogData`` ('w', carrying one pgoutput message) and ``Primary
keepalive`` ('k') frames; the client answers with ``Standby status update`` ('r').
Pure functions: the caller supplies the clock reading, so nothing here reads time.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass
from typing import TypeAlias

from capture.postgres.decoding.pgoutput import PG_EPOCH_OFFSET_US, PgoutputDecodeError
from log.sequence import Lsn


class FrameType(enum.IntEnum):
    """The first byte of a CopyData frame in a logical replication stream."""

    XLOG_DATA = ord("w")
    PRIMARY_KEEPALIVE = ord("k")
    STANDBY_STATUS_UPDATE = ord("r")


@dataclass(frozen=True, slots=True)
class XLogData:
    """One chunk of WAL data; for pgoutput, exactly one message in ``payload``.

    ``wal_end`` is the server's current end of WAL, not the end of this message.
    """

    wal_start: Lsn
    wal_end: Lsn
    send_time_us: int
    payload: memoryview


@dataclass(frozen=True, slots=True)
class PrimaryKeepalive:
    """Server heartbeat. When ``reply_requested``, answer with a status update at once or be disconnected."""

    wal_end: Lsn
    send_time_us: int
    reply_requested: bool


CopyDataFrame: TypeAlias = XLogData | PrimaryKeepalive

_XLOG_HEAD = struct.Struct(">QQq")
_KEEPALIVE = struct.Struct(">QqB")
_STATUS = struct.Struct(">BQQQqB")


def decode_copy_data(frame: bytes | bytearray | memoryview) -> CopyDataFrame:
    """Decode one CopyData frame from the server; times become Unix-epoch microseconds.

    ``XLogData.payload`` is a view into ``frame`` (no copy).
    """
    view = memoryview(frame)
    if not view:
        msg = "empty replication frame"
        raise PgoutputDecodeError(msg, offset=0)
    kind = view[0]
    try:
        if kind == FrameType.XLOG_DATA:
            start, end, sent = _XLOG_HEAD.unpack_from(view, 1)
            return XLogData(Lsn(start), Lsn(end), sent + PG_EPOCH_OFFSET_US, view[1 + _XLOG_HEAD.size :])
        if kind == FrameType.PRIMARY_KEEPALIVE:
            end, sent, reply = _KEEPALIVE.unpack_from(view, 1)
            return PrimaryKeepalive(Lsn(end), sent + PG_EPOCH_OFFSET_US, reply == 1)
    except struct.error as exc:
        msg = f"truncated replication frame: {exc}"
        raise PgoutputDecodeError(msg, message_type=kind) from exc
    msg = "unknown replication frame type"
    raise PgoutputDecodeError(msg, message_type=kind, offset=0)


def encode_standby_status(
    written: Lsn, flushed: Lsn, applied: Lsn, now_us: int, *, reply_requested: bool = False
) -> bytes:
    """Build a Standby status update ('r') frame.

    ``flushed`` is what the server may discard WAL up to (the slot's confirmed_flush_lsn):
    pass only an LSN whose events are durably stored. ``now_us`` is the client clock
    in Unix-epoch microseconds; the frame carries it relative to 2000-01-01.
    """
    return _STATUS.pack(
        FrameType.STANDBY_STATUS_UPDATE,
        written.value,
        flushed.value,
        applied.value,
        now_us - PG_EPOCH_OFFSET_US,
        1 if reply_requested else 0,
    )
