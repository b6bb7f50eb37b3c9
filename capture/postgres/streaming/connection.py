"""The logical replication connection: pgoutput frames in, standby status out.

psycopg 3 has no replication API, but ``START_REPLICATION`` on a
``replication=database`` autocommit connection switches it to COPY BOTH, and
libpq's ``get_copy_data``/``put_copy_data`` drive it (126-132k changes/s raw here,
faster than psycopg2's ``LogicalReplicationConnection``, and it keeps one driver for
all SQL). The socket is polled with ``select`` so the agent can
send heartbeats and status updates while the server is quiet.
"""

from __future__ import annotations

import logging
import select
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import NamedTuple

import psycopg
from psycopg import pq, sql

from capture.errors import CaptureError, dsn_secrets, scrub_secrets
from capture.postgres.decoding.replication_protocol import (
    FrameType,
    PrimaryKeepalive,
    decode_copy_data,
    encode_standby_status,
)
from capture.stats import CaptureStats
from core.errors import TransientError, one_line
from log.sequence import Lsn
from native import speedups

logger = logging.getLogger(__name__)

#: Session settings pinned on every capture connection so text values decode one way
#: (:mod:`capture.postgres.types.typemap` reads values printed under exactly these).
PINNED_SETTINGS = {
    "TimeZone": "UTC",
    "DateStyle": "ISO",
    "IntervalStyle": "postgres",
    "extra_float_digits": "3",
    "bytea_output": "hex",
    # money text ($1,234.56) depends on the locale; the type map expects the C locale form.
    "lc_monetary": "C",
    # Text as str, also on a SQL_ASCII database (psycopg returns bytes there otherwise).
    "client_encoding": "UTF8",
}


class ReplicationLostError(CaptureError, TransientError):
    """The replication connection failed or was closed; the agent reconnects with backoff."""

    @classmethod
    def from_psycopg(cls, exc: Exception, *, slot: str, dsn: str = "") -> ReplicationLostError:
        """Wrap a driver error, scrubbing any password libpq may have quoted."""
        detail = scrub_secrets(str(exc), dsn_secrets(dsn)) if dsn else one_line(exc)
        return cls(f"replication connection for slot {slot!r} lost: {detail}; reconnecting", slot=slot)


class WalMessage(NamedTuple):
    """The payload of one XLogData frame (one pgoutput message) and the WAL position it was sent at."""

    wal_start: int
    payload: bytes


_WAL_START = struct.Struct(">Q")
#: 'w', wal_start, wal_end, send time.
_XLOG_HEADER_BYTES = 1 + 8 + 8 + 8


#: Frames one native read returns at most.
NATIVE_FRAMES = 4096

_LIBPQ_BOUND: list[ModuleType | None] = []


def libpq_speedups() -> ModuleType | None:
    """The extension when it can read from psycopg's own libpq (else the Python reads run)."""
    if not _LIBPQ_BOUND:
        native = speedups
        if native is not None and not native.bind_libpq(pq.version(), WalMessage):
            logger.debug("native libpq reads off: psycopg's libpq %s not found among loaded objects", pq.version())
            native = None
        _LIBPQ_BOUND.append(native)
    return _LIBPQ_BOUND[0]


def pgconn_pointer(pgconn: pq.abc.PGconn) -> int | None:
    """The libpq ``PGconn *`` behind psycopg's connection (``None`` once closed)."""
    ptr = getattr(pgconn, "pgconn_ptr", None)
    return ptr if isinstance(ptr, int) and ptr else None


def pinned_options() -> str:
    """The libpq ``options`` string that pins :data:`PINNED_SETTINGS`."""
    return " ".join(f"-c {name}={value}" for name, value in PINNED_SETTINGS.items())


@dataclass(frozen=True)
class StreamOptions:
    """``START_REPLICATION`` options for pgoutput."""

    slot: str
    publication: str
    proto_version: int = 2
    streaming: bool = True
    messages: bool = True


class ReplicationStream:
    """One ``START_REPLICATION`` session on a logical slot.

    Frames come out in WAL order. The caller reports progress with
    :meth:`send_status`; Postgres may discard WAL up to the reported flush LSN, so it
    must only be reported once everything before it is durable downstream.
    """

    def __init__(self, dsn: str, options: StreamOptions, *, connect_timeout_s: int = 10) -> None:
        self._dsn = dsn
        self._options = options
        self._connect_timeout_s = connect_timeout_s
        self._conn: psycopg.Connection[tuple[object, ...]] | None = None

    def start(self, from_lsn: Lsn) -> None:
        """Connect and start streaming at ``from_lsn`` (0/0: the slot's confirmed flush LSN)."""
        try:
            self._conn = psycopg.connect(
                self._dsn,
                autocommit=True,
                replication="database",
                options=pinned_options(),
                connect_timeout=self._connect_timeout_s,
            )
        except psycopg.OperationalError as exc:
            raise ReplicationLostError.from_psycopg(exc, slot=self._options.slot, dsn=self._dsn) from None
        if self._conn.info.parameter_status("server_encoding") == "SQL_ASCII":
            # The walsender checks text it converts to UTF8 and ends the stream on bytes that are
            # not: take them as stored (the decoder keeps them as NonUtf8Text, for quarantine).
            self._conn.execute("SET client_encoding = 'SQL_ASCII'")
        opts = self._options
        args: list[sql.Composable] = [
            sql.SQL("proto_version {}").format(sql.Literal(str(opts.proto_version))),
            sql.SQL("publication_names {}").format(sql.Literal(opts.publication)),
            sql.SQL("messages {}").format(sql.Literal("true" if opts.messages else "false")),
        ]
        if opts.streaming and opts.proto_version >= 2:
            args.append(sql.SQL("streaming 'on'"))
        command = sql.SQL("START_REPLICATION SLOT {} LOGICAL {} ({})").format(
            sql.Identifier(opts.slot), sql.SQL(str(from_lsn)), sql.SQL(", ").join(args)
        )
        pgconn = self._conn.pgconn
        pgconn.send_query(command.as_bytes(self._conn))
        while True:
            pgconn.consume_input()
            if not pgconn.is_busy():
                break
            select.select([pgconn.socket], [], [], 1.0)
        result = pgconn.get_result()
        if result is None or result.status != pq.ExecStatus.COPY_BOTH:
            message = (result.error_message.decode(errors="replace") if result is not None else "no result").strip()
            self.close()
            msg = f"START_REPLICATION on slot {opts.slot!r} failed: {message}"
            raise ReplicationLostError(msg, slot=opts.slot)

    def frames(self, timeout_s: float) -> Iterator[WalMessage | PrimaryKeepalive]:
        """Yield frames already received or arriving within ``timeout_s``; stop when quiet.

        XLogData frames come as :class:`WalMessage` (the hot path: one per change, so no
        value objects are built for their header), keepalives as :class:`PrimaryKeepalive`.
        """
        pgconn = self._require().pgconn
        native = libpq_speedups()
        if native is not None and pgconn_pointer(pgconn) is not None:
            for batch in self._native_batches(native, pgconn, timeout_s):
                yield from batch
            return
        waited = False
        xlog = FrameType.XLOG_DATA.value
        unpack_start = _WAL_START.unpack_from
        while True:
            nbytes, data = pgconn.get_copy_data(1)
            if nbytes > 0:
                if data[0] == xlog:
                    yield WalMessage(unpack_start(data, 1)[0], bytes(data[_XLOG_HEADER_BYTES:]))
                    continue
                frame = decode_copy_data(data)
                if isinstance(frame, PrimaryKeepalive):
                    yield frame
                continue
            if nbytes < 0:
                raise self._ended()
            if waited or not self._wait_for_input(pgconn, timeout_s):
                return
            waited = True

    def batches(self, timeout_s: float) -> Iterator[list[WalMessage | PrimaryKeepalive]]:
        """The frames of :meth:`frames` in lists: with the extension, each list is every frame libpq held."""
        pgconn = self._require().pgconn
        native = libpq_speedups()
        if native is None or pgconn_pointer(pgconn) is None:
            for frame in self.frames(timeout_s):
                yield [frame]
            return
        yield from self._native_batches(native, pgconn, timeout_s)

    def _native_batches(
        self, native: ModuleType, pgconn: pq.abc.PGconn, timeout_s: float
    ) -> Iterator[list[WalMessage | PrimaryKeepalive]]:
        # The loop of frames() with the libpq reads in the extension: one call returns every
        # frame libpq holds (up to NATIVE_FRAMES), XLogData frames already as WalMessage.
        read = native.wal_frames
        ptr = pgconn_pointer(pgconn)
        waited = False
        while True:
            batch, others, status = read(ptr, NATIVE_FRAMES)
            if others:
                kept: list[WalMessage | PrimaryKeepalive] = []
                for item in batch:
                    if type(item) is not bytes:
                        kept.append(item)
                        continue
                    frame = decode_copy_data(item)
                    if isinstance(frame, PrimaryKeepalive):
                        kept.append(frame)
                batch = kept
            if batch:
                yield batch
            if status > 0:
                continue
            if status < 0:
                raise self._ended()
            if waited or not self._wait_for_input(pgconn, timeout_s):
                return
            waited = True

    def _ended(self) -> ReplicationLostError:
        msg = f"replication stream on slot {self._options.slot!r} ended by the server; reconnecting"
        return ReplicationLostError(msg, slot=self._options.slot)

    def _wait_for_input(self, pgconn: pq.abc.PGconn, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for data on the socket and let libpq take it; False when quiet."""
        ready, _, _ = select.select([pgconn.socket], [], [], timeout_s)
        if not ready:
            return False
        try:
            pgconn.consume_input()
        except psycopg.OperationalError as exc:
            raise ReplicationLostError.from_psycopg(exc, slot=self._options.slot, dsn=self._dsn) from None
        return True

    def send_status(self, flushed: Lsn, *, reply: bool = False) -> None:
        """Report ``flushed`` as written, flushed and applied (everything before it is durable)."""
        pgconn = self._require().pgconn
        try:
            frame = encode_standby_status(flushed, flushed, flushed, time.time_ns() // 1000, reply_requested=reply)
            pgconn.put_copy_data(frame)
            pgconn.flush()
        except psycopg.OperationalError as exc:
            raise ReplicationLostError.from_psycopg(exc, slot=self._options.slot, dsn=self._dsn) from None

    def close(self) -> None:
        """Close the connection (the slot becomes inactive). Idempotent."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _require(self) -> psycopg.Connection[tuple[object, ...]]:
        if self._conn is None:
            msg = "replication stream is not started"
            raise RuntimeError(msg)
        return self._conn


def acked_lsn(stats: CaptureStats) -> Lsn:
    """The LSN a PostgreSQL agent last acknowledged (its stats hold only LSNs)."""
    acked = stats.acked
    if not isinstance(acked, Lsn):
        msg = f"a PostgreSQL agent acknowledges LSNs, not {type(acked).__name__}"
        raise TypeError(msg)
    return acked
