"""The replication connection: registers as a replica and reads the binlog as a stream of raw events.

PyMySQL does the handshake, authentication and the session settings; after
``COM_BINLOG_DUMP`` the packets are read straight from its buffered socket (a 4-byte
header, the payload; payloads of 16 MiB - 1 continue in the next packet). Each payload is an
OK byte and one event, an EOF (the end of a non-blocking dump), or an error.

Session settings a binlog reader must send:

* ``@master_binlog_checksum``: the reader understands checksums (otherwise a server with
  ``binlog_checksum=CRC32`` refuses to send);
* ``@mariadb_slave_capability=4``: MariaDB sends its GTID events as they are (below 4 it
  rewrites them into dummy events);
* ``@master_heartbeat_period``: the server sends a heartbeat when it has nothing to send,
  so a silent connection is told from an idle server;
* MariaDB GTID resume: ``@slave_connect_state`` and an empty file name in the dump command.
"""

from __future__ import annotations

import contextlib
import select
import socket
import ssl
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import pymysql

from capture.mysql.binlog.event_types import EventType
from capture.mysql.binlog.events import (
    ARTIFICIAL,
    HEADER_SIZE,
    BinlogFormatError,
    EventHeader,
    parse_header,
    verify_checksum,
)
from capture.mysql.binlog.position import BinlogPosition, GtidPosition
from core.errors import PermanentError, TransientError

_COM_BINLOG_DUMP = 0x12
_BINLOG_DUMP_NON_BLOCK = 0x01
_MAX_PAYLOAD = 0xFFFFFF
_MARIADB_GTID_CAPABILITY = 4
_RECV_BYTES = 1 << 20
#: Server errors meaning the binlog the reader asked for is gone or never existed.
_PURGED_ERRORS = (1236,)


class BinlogStreamError(TransientError):
    """The replication connection failed; reconnecting from the last durable position is safe."""


class BinlogPurgedError(PermanentError):
    """The server no longer has the binlog capture must resume from."""


class _Connection(pymysql.connections.Connection):  # type: ignore[type-arg]
    """PyMySQL's connection, with the context of its preferred TLS mode built once per process.

    Preferred mode (no TLS setting given): encrypt when the server offers it, verify nothing.
    PyMySQL builds that context for every connection, loading the system's CA store it then never
    reads (~40 ms of CPU each, three connections per capture run); the one kept is PyMySQL's own.
    """

    _preferred: ClassVar[ssl.SSLContext | None] = None

    def _create_ssl_ctx(self, sslp: Any) -> ssl.SSLContext:
        if sslp:
            context: ssl.SSLContext = super()._create_ssl_ctx(sslp)  # type: ignore[misc]
            return context
        if _Connection._preferred is None:  # two threads may both build it: either one is kept
            _Connection._preferred = super()._create_ssl_ctx({})  # type: ignore[misc]
        return _Connection._preferred


@dataclass(frozen=True)
class ServerAddress:
    """Where and as whom to connect (the password is never printed)."""

    host: str
    port: int
    user: str
    password: str
    connect_timeout_s: float = 10.0

    def connect(self, **kwargs: Any) -> pymysql.connections.Connection[Any]:
        """A PyMySQL connection (autocommit, utf8mb4, UTC session)."""
        return _Connection(
            host=self.host,
            port=self.port,
            user=self.user,
            password=self.password,
            autocommit=True,
            charset="utf8mb4",
            connect_timeout=self.connect_timeout_s,
            init_command="SET time_zone = '+00:00'",
            **kwargs,
        )


@dataclass(frozen=True, slots=True)
class RawEvent:
    """One event as read: its header, its bytes (checksum removed, a FORMAT_DESCRIPTION whole), and where it ends."""

    header: EventHeader
    data: bytes
    #: The position after this event: where a reader that has everything up to it resumes.
    next_position: BinlogPosition


class _PacketReader:
    """Reads the replication socket through one growing buffer (so it knows when nothing is left)."""

    def __init__(self, sock: socket.socket, where: str) -> None:
        self.sock = sock
        self.where = where
        self.buffer = bytearray()
        self.pos = 0

    def read(self, size: int) -> bytes:
        while len(self.buffer) - self.pos < size:
            chunk = self.sock.recv(_RECV_BYTES)
            if not chunk:
                msg = f"the server closed the replication connection to {self.where}"
                raise BinlogStreamError(msg)
            if self.pos:
                del self.buffer[: self.pos]
                self.pos = 0
            self.buffer += chunk
        data = bytes(self.buffer[self.pos : self.pos + size])
        self.pos += size
        return data

    def idle(self) -> bool:
        if self.pos < len(self.buffer):
            return False
        readable, _, _ = select.select([self.sock], [], [], 0)
        return not readable


class BinlogStream:
    """Reads events from ``start`` on; ``blocking=False`` ends at the binlog's current end.

    ``start``: a file position, or (MariaDB) a GTID position: the server then begins after
    the last GTID of each domain.
    """

    def __init__(
        self,
        address: ServerAddress,
        *,
        server_id: int,
        start: BinlogPosition | GtidPosition,
        blocking: bool = True,
        heartbeat_s: float = 5.0,
    ) -> None:
        self.address = address
        self.server_id = server_id
        self.start = start
        self.blocking = blocking
        self.heartbeat_s = heartbeat_s
        self._conn: pymysql.connections.Connection[Any] | None = None
        self._reader: _PacketReader | None = None
        self._checksum = False

    def __enter__(self) -> BinlogStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection (the server's dump thread ends on its own)."""
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None

    def _open(self) -> pymysql.connections.Connection[Any]:
        # A read waits at most a few heartbeats: a server that sends nothing for that long is gone.
        conn = self.address.connect(read_timeout=max(30.0, self.heartbeat_s * 4))
        with conn.cursor() as cur:
            cur.execute("SELECT @@global.binlog_checksum")
            row = cur.fetchone()
            self._checksum = row is not None and str(row[0]).upper() != "NONE"
            if self._checksum:
                cur.execute("SET @master_binlog_checksum = @@global.binlog_checksum")
            cur.execute(f"SET @mariadb_slave_capability = {_MARIADB_GTID_CAPABILITY}")
            cur.execute("SET @master_heartbeat_period = %s", (int(self.heartbeat_s * 1_000_000_000),))
            if isinstance(self.start, GtidPosition):
                cur.execute("SET @slave_connect_state = %s", (str(self.start),))
                cur.execute("SET @slave_gtid_strict_mode = 1")
                cur.execute("SET @slave_gtid_ignore_duplicates = 0")
        if isinstance(self.start, GtidPosition):
            file, offset = b"", 4
        else:
            file, offset = self.start.file.encode(), self.start.offset
        flags = 0 if self.blocking else _BINLOG_DUMP_NON_BLOCK
        payload = struct.pack("<IHI", offset, flags, self.server_id) + file
        conn._execute_command(_COM_BINLOG_DUMP, payload)  # type: ignore[attr-defined]
        return conn

    def _payload(self, reader: _PacketReader) -> bytes:
        chunks = []
        while True:
            header = reader.read(4)
            length = header[0] | header[1] << 8 | header[2] << 16
            chunk = reader.read(length)
            chunks.append(chunk)
            if length < _MAX_PAYLOAD:
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def idle(self) -> bool:
        """True when nothing more has arrived from the server (read so far is all it sent)."""
        return self._reader is None or self._reader.idle()

    def events(self) -> Iterator[RawEvent]:
        """Every event from the start position, in binlog order."""
        try:
            conn = self._conn = self._open()
        except pymysql.err.OperationalError as exc:
            msg = f"cannot open the replication connection to {self.address.host}:{self.address.port}: {exc.args[-1]}"
            raise BinlogStreamError(msg) from exc
        # From here on the socket is read directly: PyMySQL's buffered reader is empty (the server
        # answers the dump command with events only), and our own buffer can tell "nothing more".
        reader = self._reader = _PacketReader(conn._sock, f"{self.address.host}:{self.address.port}")  # type: ignore[attr-defined]
        position = self.start if isinstance(self.start, BinlogPosition) else BinlogPosition("", 4)
        checksum = self._checksum
        try:
            while True:
                payload = self._payload(reader)
                marker = payload[0]
                if marker == 0xFE and len(payload) < 9:
                    return
                if marker == 0xFF:
                    self._raise_server_error(payload)
                data = payload[1:]
                header = parse_header(data)
                kind = header.type
                if kind == EventType.FORMAT_DESCRIPTION:
                    body = data
                elif checksum:
                    body = verify_checksum(data)
                else:
                    body = data
                if kind == EventType.ROTATE:
                    position = BinlogPosition(
                        body[HEADER_SIZE + 8 :].decode(), int.from_bytes(body[HEADER_SIZE : HEADER_SIZE + 8], "little")
                    )
                elif header.end_position and not header.flags & ARTIFICIAL:
                    position = BinlogPosition(position.file, header.end_position)
                # else: made up for this stream (a format description): the position stays.
                yield RawEvent(header, body, position)
        except (OSError, pymysql.err.OperationalError) as exc:  # socket.timeout included
            msg = f"the replication connection to {self.address.host}:{self.address.port} failed: {exc}"
            raise BinlogStreamError(msg) from exc
        finally:
            self.close()

    def _raise_server_error(self, payload: bytes) -> None:
        code = int.from_bytes(payload[1:3], "little")
        text = (
            payload[9:].decode("utf-8", "replace") if payload[3:4] == b"#" else payload[3:].decode("utf-8", "replace")
        )
        if code in _PURGED_ERRORS:
            msg = f"the server no longer has the binlog capture resumes from ({self.start}): {text}"
            raise BinlogPurgedError(msg)
        msg = f"the server refused the binlog stream from {self.start}: error {code}: {text}"
        raise BinlogFormatError(msg)
