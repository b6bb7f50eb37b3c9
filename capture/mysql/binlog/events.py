"""Binlog events: bytes -> typed events (header, then the body each type has).

Common header (19 bytes, little-endian): timestamp u32, type u8, server id u32, event size
u32, end position u32 (the next event's offset in the file), flags u16. With
``binlog_checksum=CRC32`` every event ends in a CRC-32 of the rest, checked here: a corrupt
event stops capture rather than being decoded.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

from capture.mysql.binlog.event_types import ROW_OPERATIONS, UNREADABLE, EventType
from capture.mysql.binlog.position import Gtid
from capture.mysql.binlog.table_map import TableShape, parse_table_map, read_lenenc
from core.errors import PermanentError

HEADER_SIZE = 19
_HEADER = struct.Struct("<IBIIIH")
_QUERY_POST_HEADER = struct.Struct("<IIBHH")
_CHECKSUM_SIZE = 4
#: LOG_EVENT_ARTIFICIAL_F: a rotate or format description the server made up for this stream.
ARTIFICIAL = 0x20
#: MariaDB GTID flag: the transaction is a single statement without BEGIN/COMMIT (DDL).
GTID_STANDALONE = 0x01


class BinlogFormatError(PermanentError):
    """A binlog event that cannot be read (corrupt, or a feature capture does not read); capture stops."""


@dataclass(frozen=True, slots=True)
class EventHeader:
    """The common header of one event."""

    timestamp: int
    type: int
    server_id: int
    size: int
    end_position: int
    flags: int


@dataclass(frozen=True, slots=True)
class FormatDescription:
    """The first event of every binlog file: the server version and whether events carry a checksum."""

    server_version: str
    checksum: bool


@dataclass(frozen=True, slots=True)
class Rotate:
    """The stream continues in ``next_file`` at ``position``."""

    next_file: str
    position: int


@dataclass(frozen=True, slots=True)
class Query:
    """A statement: ``BEGIN``, DDL, ``TRUNCATE``, or ``COMMIT`` of a non-transactional table."""

    schema: str
    sql: str
    thread_id: int
    error_code: int


@dataclass(frozen=True, slots=True)
class Xid:
    """The commit of a transaction on a transactional engine."""

    xid: int


@dataclass(frozen=True, slots=True)
class MariaGtid:
    """MariaDB's GTID event opening an event group; ``standalone`` groups (DDL) have no BEGIN/COMMIT."""

    gtid: Gtid
    standalone: bool


@dataclass(frozen=True, slots=True)
class TableMap:
    """The shape of the table the following row events change."""

    shape: TableShape


@dataclass(frozen=True, slots=True)
class Rows:
    """One row event: ``op`` (c/u/d) on ``table_id``; ``body`` and ``start`` locate its row images."""

    op: str
    table_id: int
    flags: int
    present: int
    present_after: int
    body: bytes
    start: int


@dataclass(frozen=True, slots=True)
class Other:
    """An event capture does not need (heartbeat, checkpoint, annotate, intvar...)."""

    type: int


Event = FormatDescription | Rotate | Query | Xid | MariaGtid | TableMap | Rows | Other

#: Row event flag: the last row event of its statement.
STMT_END = 0x0001


def parse_header(data: bytes) -> EventHeader:
    """The common header at the start of ``data``."""
    return EventHeader(*_HEADER.unpack_from(data, 0))


def verify_checksum(data: bytes) -> bytes:
    """``data`` without its trailing CRC-32, which must match."""
    body, stored = data[:-_CHECKSUM_SIZE], int.from_bytes(data[-_CHECKSUM_SIZE:], "little")
    if zlib.crc32(body) != stored:
        header = parse_header(data)
        msg = (
            f"binlog event type {header.type} ending at {header.end_position} has a wrong checksum: "
            "the binlog is corrupt"
        )
        raise BinlogFormatError(msg)
    return body


def parse_event(data: bytes, header: EventHeader, *, mariadb: bool = True) -> Event:
    """One event (its checksum removed; a FORMAT_DESCRIPTION whole) -> its typed form.

    ``mariadb``: the binlog is MariaDB's (its FORMAT_DESCRIPTION's server version says so).
    """
    kind = header.type
    if kind in ROW_OPERATIONS:
        return _rows(data, kind)
    if kind == EventType.TABLE_MAP:
        return TableMap(parse_table_map(data[HEADER_SIZE:], mariadb=mariadb))
    if kind == EventType.XID:
        return Xid(int.from_bytes(data[HEADER_SIZE : HEADER_SIZE + 8], "little"))
    if kind == EventType.MARIADB_GTID:
        sequence = int.from_bytes(data[HEADER_SIZE : HEADER_SIZE + 8], "little")
        domain = int.from_bytes(data[HEADER_SIZE + 8 : HEADER_SIZE + 12], "little")
        flags = data[HEADER_SIZE + 12]
        return MariaGtid(Gtid(domain, header.server_id, sequence), bool(flags & GTID_STANDALONE))
    if kind == EventType.QUERY:
        return _query(data)
    if kind == EventType.ROTATE:
        position = int.from_bytes(data[HEADER_SIZE : HEADER_SIZE + 8], "little")
        return Rotate(data[HEADER_SIZE + 8 :].decode(), position)
    if kind == EventType.FORMAT_DESCRIPTION:
        return _format_description(data)
    if kind in UNREADABLE:
        msg = f"the binlog holds an event capture cannot read ({EventType(kind).name}): {UNREADABLE[kind]}"
        raise BinlogFormatError(msg)
    return Other(kind)


def _format_description(data: bytes) -> FormatDescription:
    """``data`` is the whole event, its checksum included: it ends in the checksum algorithm (1 byte) and 4 bytes."""
    version = data[HEADER_SIZE + 2 : HEADER_SIZE + 52].split(b"\0", 1)[0].decode()
    return FormatDescription(version, data[-_CHECKSUM_SIZE - 1] == 1)


def _query(data: bytes) -> Query:
    thread_id, _exec_time, schema_len, error_code, status_len = _QUERY_POST_HEADER.unpack_from(data, HEADER_SIZE)
    pos = HEADER_SIZE + _QUERY_POST_HEADER.size + status_len
    schema = data[pos : pos + schema_len].decode("utf-8", "surrogateescape")
    sql = data[pos + schema_len + 1 :].decode("utf-8", "surrogateescape")
    return Query(schema, sql, thread_id, error_code)


def _rows(data: bytes, kind: int) -> Rows:
    pos = HEADER_SIZE
    table_id = int.from_bytes(data[pos : pos + 6], "little")
    flags = int.from_bytes(data[pos + 6 : pos + 8], "little")
    pos += 8
    if kind >= EventType.WRITE_ROWS:  # v2: variable extra data
        extra = int.from_bytes(data[pos : pos + 2], "little")
        pos += extra
    count, pos = read_lenenc(data, pos)
    width = (count + 7) // 8
    present = int.from_bytes(data[pos : pos + width], "little")
    pos += width
    op = ROW_OPERATIONS[kind]
    present_after = present
    if op == "u":
        present_after = int.from_bytes(data[pos : pos + width], "little")
        pos += width
    return Rows(op, table_id, flags, present, present_after, data, pos)
