"""Decode pgoutput logical replication messages (protocol versions 1 and 2) into frozen value objects.

Input is the payload of one ``XLogData`` frame (or one ``data`` row of
``pg_logical_slot_peek_binary_changes``): exactly one pgoutput message. Output is
one of the message classes of :mod:`capture.postgres.decoding.pgoutput_messages`.
Nothing here does I/O or reads a clock.

Wire format: PostgreSQL 15 docs, "55.9. Logical Replication Message Formats".
Integers are big-endian; ``String`` is NUL-terminated UTF-8; timestamps are
microseconds since 2000-01-01 (we convert them to Unix-epoch microseconds).

Protocol 2 adds streamed transactions: between ``Stream Start`` and ``Stream Stop``
every Relation, Type, Insert, Update, Delete, Truncate and Message carries the
transaction's xid right after the type byte. Whether that field is present is
not visible in the message itself, so :class:`PgoutputDecoder` remembers whether
it is inside a stream block; keep one decoder per replication connection.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable
from typing import Final

import native
from capture.postgres.decoding.pgoutput_messages import (
    Begin,
    Commit,
    Delete,
    Insert,
    LogicalMessage,
    Origin,
    PgoutputMessage,
    Relation,
    RelationColumn,
    ReplicaIdentity,
    StreamAbort,
    StreamCommit,
    StreamStart,
    StreamStop,
    Truncate,
    TruncateOption,
    Type,
    Update,
)
from capture.tuples import UNCHANGED_TOAST, NonUtf8Text, TupleData, TupleValue
from core.errors import PermanentError
from log.sequence import Lsn

#: Microseconds between the Unix epoch and PostgreSQL's epoch (2000-01-01 00:00:00 UTC).
PG_EPOCH_OFFSET_US: Final = 946_684_800_000_000


class PgoutputDecodeError(PermanentError):
    """A pgoutput message could not be decoded: the bytes are damaged or the protocol version is wrong."""

    def __init__(self, detail: str, *, message_type: int | None = None, offset: int | None = None) -> None:
        kind = "?" if message_type is None else repr(chr(message_type))
        super().__init__(
            f"cannot decode pgoutput message {kind} at byte {offset}: {detail}; "
            "check that the slot is read with the same proto_version the decoder was built for"
        )
        self.message_type = message_type
        self.offset = offset


class MessageType(enum.IntEnum):
    """The first byte of every pgoutput message."""

    BEGIN = ord("B")
    COMMIT = ord("C")
    ORIGIN = ord("O")
    RELATION = ord("R")
    TYPE = ord("Y")
    INSERT = ord("I")
    UPDATE = ord("U")
    DELETE = ord("D")
    TRUNCATE = ord("T")
    MESSAGE = ord("M")
    STREAM_START = ord("S")
    STREAM_STOP = ord("E")
    STREAM_COMMIT = ord("c")
    STREAM_ABORT = ord("A")


class TupleKind(enum.IntEnum):
    """Marker bytes inside TupleData and in front of Update/Delete tuples."""

    NULL = ord("n")
    UNCHANGED_TOAST = ord("u")
    TEXT = ord("t")
    BINARY = ord("b")
    NEW = ord("N")
    KEY = ord("K")
    OLD = ord("O")


_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_BEGIN = struct.Struct(">QqI")
_COMMIT = struct.Struct(">BQQq")
_STREAM_START = struct.Struct(">IB")
_STREAM_COMMIT = struct.Struct(">IBQQq")
_STREAM_ABORT = struct.Struct(">II")
_MESSAGE_HEAD = struct.Struct(">BQ")
_RELATION_COLUMN_TAIL = struct.Struct(">Ii")
_OID_KIND = struct.Struct(">IB")
_STREAM_INSERT_HEAD = struct.Struct(">IIB")
_TRUNCATE_HEAD = struct.Struct(">IB")
_KIND_LEN = struct.Struct(">Bi")

_NULL = TupleKind.NULL.value
_UNCHANGED = TupleKind.UNCHANGED_TOAST.value
_TEXT = TupleKind.TEXT.value
_BINARY = TupleKind.BINARY.value
_NEW = TupleKind.NEW.value
_KEY = TupleKind.KEY.value
_OLD = TupleKind.OLD.value


def _lsn(value: int) -> Lsn:
    return Lsn(value)


def _read_tuple(data: bytes, pos: int) -> tuple[TupleData, int]:
    """Decode TupleData at ``pos``; return the values and the position after them."""
    if _native_read_tuple is not None:
        done = _native_read_tuple(data, pos, UNCHANGED_TOAST)
        if done is not None:
            return done
    return _read_tuple_python(data, pos)


#: The extension's twin of :func:`_read_tuple_python` (None: without the extension). It returns
#: None for malformed input, so the Python twin raises the error with its position.
_native_read_tuple: Callable[[bytes, int, object], tuple[TupleData, int] | None] | None = (
    native.speedups.read_tuple if native.speedups is not None else None
)


def _read_tuple_python(data: bytes, pos: int) -> tuple[TupleData, int]:
    (count,) = _I16.unpack_from(data, pos)
    pos += 2
    values: list[TupleValue] = []
    append = values.append
    kind_len = _KIND_LEN.unpack_from
    for _ in range(count):
        kind = data[pos]
        if kind == _TEXT:
            _, length = kind_len(data, pos)
            pos += 5
            end = pos + length
            try:
                append(data[pos:end].decode())
            except UnicodeDecodeError:
                append(NonUtf8Text(data[pos:end]))
            pos = end
        elif kind == _NULL:
            append(None)
            pos += 1
        elif kind == _UNCHANGED:
            append(UNCHANGED_TOAST)
            pos += 1
        elif kind == _BINARY:
            _, length = kind_len(data, pos)
            pos += 5
            end = pos + length
            append(data[pos:end])
            pos = end
        else:
            msg = f"unknown tuple column kind {kind!r}"
            raise PgoutputDecodeError(msg, offset=pos)
    if pos > len(data):
        msg = "tuple data runs past the end of the message"
        raise PgoutputDecodeError(msg, offset=pos)
    return tuple(values), pos


def _read_cstring(data: bytes, pos: int) -> tuple[str, int]:
    end = data.index(b"\x00", pos)
    return data[pos:end].decode(), end + 1


class PgoutputDecoder:
    """Decodes one pgoutput message at a time for one replication stream.

    State: the protocol version and whether a Stream Start..Stream Stop block is open
    (inside one, protocol 2 messages carry an xid). Not thread-safe; one per stream.
    """

    __slots__ = ("_dispatch", "in_stream", "protocol_version")

    def __init__(self, protocol_version: int = 1) -> None:
        if protocol_version not in (1, 2):
            msg = f"pgoutput protocol version {protocol_version} is not supported; use 1 or 2"
            raise ValueError(msg)
        self.protocol_version = protocol_version
        self.in_stream = False
        self._dispatch: dict[int, Callable[[bytes], PgoutputMessage]] = {
            MessageType.BEGIN.value: self._begin,
            MessageType.COMMIT.value: self._commit,
            MessageType.ORIGIN.value: self._origin,
            MessageType.RELATION.value: self._relation,
            MessageType.TYPE.value: self._type,
            MessageType.INSERT.value: self._insert,
            MessageType.UPDATE.value: self._update,
            MessageType.DELETE.value: self._delete,
            MessageType.TRUNCATE.value: self._truncate,
            MessageType.MESSAGE.value: self._message,
            MessageType.STREAM_START.value: self._stream_start,
            MessageType.STREAM_STOP.value: self._stream_stop,
            MessageType.STREAM_COMMIT.value: self._stream_commit,
            MessageType.STREAM_ABORT.value: self._stream_abort,
        }

    def decode(self, data: bytes | bytearray | memoryview) -> PgoutputMessage:
        """Decode one message. Raises :class:`PgoutputDecodeError` on malformed input."""
        if not isinstance(data, bytes):
            data = bytes(data)
        if _native_decode_change is not None:
            # Insert/Update/Delete (the hot path) in one native call; anything else, or a
            # malformed message, comes back as None and is decoded (or refused) below.
            change = _native_decode_change(data, self.in_stream)
            if change is not None:
                return change
        if not data:
            msg = "empty message"
            raise PgoutputDecodeError(msg, offset=0)
        handler = self._dispatch.get(data[0])
        if handler is None:
            msg = "unknown message type"
            raise PgoutputDecodeError(msg, message_type=data[0], offset=0)
        try:
            return handler(data)
        except (struct.error, IndexError, ValueError) as exc:
            raise PgoutputDecodeError(str(exc), message_type=data[0]) from exc

    def _xid(self, data: bytes) -> tuple[int | None, int]:
        """The streamed-transaction xid after the type byte, if present, and the position after it."""
        if self.in_stream:
            return _U32.unpack_from(data, 1)[0], 5
        return None, 1

    def _begin(self, data: bytes) -> Begin:
        final_lsn, ts, xid = _BEGIN.unpack_from(data, 1)
        return Begin(_lsn(final_lsn), ts + PG_EPOCH_OFFSET_US, xid)

    def _commit(self, data: bytes) -> Commit:
        flags, commit_lsn, end_lsn, ts = _COMMIT.unpack_from(data, 1)
        return Commit(flags, _lsn(commit_lsn), _lsn(end_lsn), ts + PG_EPOCH_OFFSET_US)

    def _origin(self, data: bytes) -> Origin:
        (lsn,) = _U64.unpack_from(data, 1)
        name, _ = _read_cstring(data, 9)
        return Origin(_lsn(lsn), name)

    def _relation(self, data: bytes) -> Relation:
        xid, pos = self._xid(data)
        (oid,) = _U32.unpack_from(data, pos)
        namespace, pos = _read_cstring(data, pos + 4)
        name, pos = _read_cstring(data, pos)
        identity = ReplicaIdentity(chr(data[pos]))
        (count,) = _I16.unpack_from(data, pos + 1)
        pos += 3
        columns = []
        for _ in range(count):
            flags = data[pos]
            column_name, pos = _read_cstring(data, pos + 1)
            type_oid, typmod = _RELATION_COLUMN_TAIL.unpack_from(data, pos)
            pos += 8
            columns.append(RelationColumn(bool(flags & 1), column_name, type_oid, typmod))
        return Relation(oid, namespace, name, identity, tuple(columns), xid)

    def _type(self, data: bytes) -> Type:
        xid, pos = self._xid(data)
        (oid,) = _U32.unpack_from(data, pos)
        namespace, pos = _read_cstring(data, pos + 4)
        name, _ = _read_cstring(data, pos)
        return Type(oid, namespace, name, xid)

    def _insert(self, data: bytes) -> Insert:
        if self.in_stream:
            xid, oid, kind = _STREAM_INSERT_HEAD.unpack_from(data, 1)
            pos = 10
        else:
            xid = None
            oid, kind = _OID_KIND.unpack_from(data, 1)
            pos = 6
        if kind != _NEW:
            msg = "insert without a new tuple"
            raise PgoutputDecodeError(msg, message_type=data[0], offset=pos - 1)
        new, _ = _read_tuple(data, pos)
        return Insert(oid, new, xid)

    def _update(self, data: bytes) -> Update:
        xid, pos = self._xid(data)
        oid, kind = _OID_KIND.unpack_from(data, pos)
        pos += 5
        old: TupleData | None = None
        old_is_key = False
        if kind in (_KEY, _OLD):
            old_is_key = kind == _KEY
            old, pos = _read_tuple(data, pos)
            kind = data[pos]
            pos += 1
        if kind != _NEW:
            msg = "update without a new tuple"
            raise PgoutputDecodeError(msg, message_type=data[0], offset=pos - 1)
        new, _ = _read_tuple(data, pos)
        return Update(oid, old, new, old_is_key, xid)

    def _delete(self, data: bytes) -> Delete:
        xid, pos = self._xid(data)
        oid, kind = _OID_KIND.unpack_from(data, pos)
        if kind not in (_KEY, _OLD):
            msg = "delete without a key or old tuple"
            raise PgoutputDecodeError(msg, message_type=data[0], offset=pos + 4)
        old, _ = _read_tuple(data, pos + 5)
        return Delete(oid, old, kind == _KEY, xid)

    def _truncate(self, data: bytes) -> Truncate:
        xid, pos = self._xid(data)
        count, options = _TRUNCATE_HEAD.unpack_from(data, pos)
        oids = struct.unpack_from(f">{count}I", data, pos + 5)
        return Truncate(TruncateOption(options), oids, xid)

    def _message(self, data: bytes) -> LogicalMessage:
        xid, pos = self._xid(data)
        flags, lsn = _MESSAGE_HEAD.unpack_from(data, pos)
        prefix, pos = _read_cstring(data, pos + 9)
        (length,) = _I32.unpack_from(data, pos)
        content = data[pos + 4 : pos + 4 + length]
        if len(content) != length:
            msg = "message content is truncated"
            raise PgoutputDecodeError(msg, message_type=data[0], offset=pos)
        return LogicalMessage(bool(flags & 1), _lsn(lsn), prefix, content, xid)

    def _stream_start(self, data: bytes) -> StreamStart:
        xid, first = _STREAM_START.unpack_from(data, 1)
        self.in_stream = True
        return StreamStart(xid, first == 1)

    def _stream_stop(self, data: bytes) -> StreamStop:
        self.in_stream = False
        return StreamStop()

    def _stream_commit(self, data: bytes) -> StreamCommit:
        xid, flags, commit_lsn, end_lsn, ts = _STREAM_COMMIT.unpack_from(data, 1)
        return StreamCommit(xid, flags, _lsn(commit_lsn), _lsn(end_lsn), ts + PG_EPOCH_OFFSET_US)

    def _stream_abort(self, data: bytes) -> StreamAbort:
        # Protocol 4 appends abort LSN and timestamp; versions 1-2 never send them.
        xid, subxid = _STREAM_ABORT.unpack_from(data, 1)
        return StreamAbort(xid, subxid)


#: The extension's twin of PgoutputDecoder's _insert/_update/_delete (None: without the extension).
_native_decode_change: Callable[[bytes, bool], Insert | Update | Delete | None] | None = None
if native.speedups is not None:
    native.speedups.configure(Insert, Update, Delete, UNCHANGED_TOAST)
    _native_decode_change = native.speedups.decode_change
