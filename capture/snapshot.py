"""The initial snapshot: every row of the captured tables as ``op: r`` events.

Consistency: the slot is created with ``EXPORT_SNAPSHOT`` and readers run in
``REPEATABLE READ`` with ``SET TRANSACTION SNAPSHOT``, so they see exactly the data
before the slot's consistent point; the stream then starts at that point. The
exported snapshot lives only while the slot-creating connection stays idle
(DESIGN section 8), so that connection is held, untouched, until reading ends.

Speed: ``COPY (SELECT ...) TO STDOUT`` in text format (the same text the stream
sends, so one type map decodes both), split into chunks of heap pages
(``ctid`` ranges, a TID range scan since PG 14).

With the extension and the file log, each COPY block is cut into pieces of about
``PIECE_BYTES`` (by the reader, as the rows arrive) that threads turn into finished,
zstd-compressed file-log batches, one per partition, in one native pass without the GIL
(:func:`encode_piece`), while the server produces the next block and the agent appends
(fsync per append, as ever; the partitions of a piece at the same time) the pieces before,
in order.

Resume: a chunk is recorded in the state file only after its events are appended.
After a crash the slot (and its consistent point) stay; the chunks not yet done are
read with a fresh snapshot taken later. Their rows may be newer than the consistent
point, but every change after that point is streamed afterwards and sorts later, so
the latest image per key still converges to the source.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeVar, overload

import psycopg
import psycopg.errors
from psycopg import pq, sql

import native
from capture.pgoutput_messages import NonUtf8Text, TupleData
from capture.stream import libpq_speedups, pgconn_pointer
from core.durable_files import replace_json
from log.file.batch_codec import ZSTD_LEVEL, Compression, EncodedBatch
from log.sequence import Sequence as Seq

if TYPE_CHECKING:
    from capture.events import EventBuilder, OutRecord
    from native._speedups import RowEncoder

#: Heap pages per chunk (8 KiB pages: about 8 MiB of table per COPY).
CHUNK_PAGES = 1024
#: COPY data parsed and appended at a time.
BATCH_BYTES = 4 << 20
#: The first native COPY read of a chunk: the encoders start on it while the rest arrives.
FIRST_BLOCK_BYTES = 1 << 20
#: COPY text per piece of the native snapshot pass (~35k rows of a narrow table, ~18 MB of records
#: before compression): two pieces per COPY block, one per encoder thread; each piece is one append
#: (one fsync) per partition, so larger pieces mean fewer fsyncs.
PIECE_BYTES = 2 << 20
#: Threads encoding pieces (the extension releases the GIL while it encodes).
ENCODE_THREADS = 2


@dataclass(frozen=True)
class Chunk:
    """Pages ``[first_page, last_page)`` of one table; ``last_page=None`` means to the end."""

    schema: str
    name: str
    number: int
    first_page: int
    last_page: int | None

    @property
    def id(self) -> str:
        """Stable identity in the state file."""
        return f"{self.schema}.{self.name}#{self.number}"


@dataclass
class SnapshotState:
    """Progress of a source's snapshot, stored as JSON beside the log."""

    path: Path
    consistent_lsn: int | None = None
    done_chunks: set[str] = field(default_factory=set)
    completed: bool = False

    @classmethod
    def load(cls, path: Path) -> SnapshotState:
        """Read the state file (a missing file is a snapshot never started)."""
        if not path.exists():
            return cls(path)
        data = json.loads(path.read_text())
        return cls(path, data.get("consistent_lsn"), set(data.get("done_chunks", [])), bool(data.get("completed")))

    def save(self) -> None:
        """Write atomically and durably (:func:`core.durable_files.replace_json`)."""
        body = {
            "consistent_lsn": self.consistent_lsn,
            "done_chunks": sorted(self.done_chunks),
            "completed": self.completed,
        }
        replace_json(self.path, body)


def plan_chunks(conn: psycopg.Connection[Any], schema: str, name: str, oid: int) -> list[Chunk]:
    """Split a table into page-range chunks (``relpages`` is an estimate: the last chunk is open-ended)."""
    row = conn.execute("SELECT relpages FROM pg_class WHERE oid = %s", (oid,)).fetchone()
    pages = max(int(row[0]) if row else 0, 0)
    chunks = []
    first = 0
    number = 0
    while first + CHUNK_PAGES < pages:
        chunks.append(Chunk(schema, name, number, first, first + CHUNK_PAGES))
        first += CHUNK_PAGES
        number += 1
    chunks.append(Chunk(schema, name, number, first, None))
    return chunks


_UNESCAPE = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\"}


def _unescape(field: str) -> str:
    # COPY text format: backslash escapes (octal/hex forms do not occur for valid UTF-8 text).
    out = []
    i = 0
    while i < len(field):
        char = field[i]
        if char == "\\" and i + 1 < len(field):
            out.append(_UNESCAPE.get(field[i + 1], field[i + 1]))
            i += 2
            continue
        out.append(char)
        i += 1
    return "".join(out)


def _copy_field(raw: bytes) -> str | bytes | None:
    if raw == b"\\N":
        return None
    text = raw.decode("utf-8", "surrogateescape")
    text = _unescape(text) if "\\" in text else text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return NonUtf8Text(text.encode("utf-8", "surrogateescape"))
    return text


def parse_copy_text(data: bytes) -> list[TupleData]:
    r"""Rows of COPY text format (complete lines only) as text tuples; ``\\N`` is NULL."""
    rows: list[TupleData] = []
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:  # not UTF-8 (SQL_ASCII database): such fields stay bytes, for quarantine
        return [tuple(_copy_field(f) for f in line.split(b"\t")) for line in data.split(b"\n") if line]
    for line in text.split("\n"):
        if not line:
            continue
        rows.append(tuple(None if f == "\\N" else (_unescape(f) if "\\" in f else f) for f in line.split("\t")))
    return rows


class CopyRows(Sequence[TupleData]):
    """Complete lines of COPY text as rows, parsed (:func:`parse_copy_text`) when first indexed.

    The event builder reads ``data`` itself where it can (native code), so most snapshot rows
    never become Python tuples.
    """

    __slots__ = ("_rows", "blank", "data", "pieces")

    def __init__(self, data: bytes, pieces: list[tuple[int, int, int]] | None = None, blank: bool = True) -> None:
        self.data = data
        self._rows: list[TupleData] | None = None
        #: :func:`copy_pieces` of ``data`` and whether a line is empty, when the reader knows them (native reads).
        self.pieces = pieces
        self.blank = blank

    def native_pieces(self) -> list[tuple[int, int, int]] | None:
        """The :func:`copy_pieces` of ``data`` when it can take the native pass (:func:`encodable`), else None."""
        if self.pieces is None:
            return copy_pieces(self.data) if encodable(self.data) else None
        return None if self.blank or not encodable_text(self.data) else self.pieces

    def _parsed(self) -> list[TupleData]:
        if self._rows is None:
            self._rows = parse_copy_text(self.data)
        return self._rows

    def __len__(self) -> int:
        data = self.data
        if self._rows is not None or data.startswith(b"\n") or b"\n\n" in data:
            return len(self._parsed())  # empty lines are no rows
        return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)

    @overload
    def __getitem__(self, index: int) -> TupleData: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[TupleData]: ...
    def __getitem__(self, index: int | slice) -> TupleData | Sequence[TupleData]:
        return self._parsed()[index]


def read_chunk(conn: psycopg.Connection[Any], chunk: Chunk, columns: Sequence[str]) -> Iterator[CopyRows]:
    """COPY one chunk; yields batches of rows as they arrive."""
    if conn.info.parameter_status("server_encoding") != "SQL_ASCII":
        yield from _read_chunk(conn, chunk, columns)
        return
    # A SQL_ASCII database holds any bytes, and the server refuses to send non-UTF-8 ones as
    # UTF8: read them as stored (parse_copy_text keeps such fields as NonUtf8Text).
    conn.execute("SET client_encoding = 'SQL_ASCII'")
    try:
        yield from _read_chunk(conn, chunk, columns)
    finally:
        conn.execute("SET client_encoding = 'UTF8'")


def _read_chunk(conn: psycopg.Connection[Any], chunk: Chunk, columns: Sequence[str]) -> Iterator[CopyRows]:
    where = sql.SQL("ctid >= {}::tid").format(sql.Literal(f"({chunk.first_page},0)"))
    if chunk.last_page is not None:
        where = sql.SQL("{} AND ctid < {}::tid").format(where, sql.Literal(f"({chunk.last_page},0)"))
    query = sql.SQL("COPY (SELECT {} FROM {}.{} WHERE {}) TO STDOUT").format(
        sql.SQL(", ").join(sql.Identifier(c) for c in columns),
        sql.Identifier(chunk.schema),
        sql.Identifier(chunk.name),
        where,
    )
    blocks: list[bytes] = []
    size = 0
    native = libpq_speedups()
    if native is not None and pgconn_pointer(conn.pgconn) is not None:
        for read, pieces, blank in _prefetched(_native_copy_blocks(native, conn, query, PIECE_BYTES)):
            if not blocks and pieces is not None:  # whole rows, as COPY sends them: pieces cut by the reader
                yield CopyRows(read, pieces, blank)
                continue
            data = b"".join((*blocks, read)) if blocks else read
            blocks = []
            cut = data.rfind(b"\n") + 1
            if cut:
                yield CopyRows(data if cut == len(data) else data[:cut])
            if cut < len(data):
                blocks = [data[cut:]]
        rest = b"".join(blocks)
        if rest:
            yield CopyRows(rest)
        return
    for block in copy_out(conn, query):
        blocks.append(block)
        size += len(block)
        if size < BATCH_BYTES:
            continue
        data = b"".join(blocks)
        cut = data.rfind(b"\n") + 1
        blocks, size = [data[cut:]], len(data) - cut
        yield CopyRows(data[:cut])
    rest = b"".join(blocks)
    if rest:
        yield CopyRows(rest)


_END = object()
_Block = TypeVar("_Block")


def _prefetched(blocks: Generator[_Block, None, None]) -> Iterator[_Block]:
    """``blocks``, read one block ahead in a thread (the extension's reads release the GIL).

    The server produces the next block while the caller encodes and appends this one. The
    thread alone drives ``blocks`` (and so the connection) until it ends; closing this
    generator early stops it and waits for it, and ``blocks`` is closed (drained) there.
    """
    ahead: queue.Queue[object] = queue.Queue(maxsize=1)
    stop = threading.Event()

    def pump() -> None:
        try:
            for block in blocks:
                while not stop.is_set():
                    try:
                        ahead.put(block, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    break
        except BaseException as exc:  # handed to the consumer, raised there
            ahead.put(exc)
            return
        finally:
            blocks.close()
        ahead.put(_END)

    thread = threading.Thread(target=pump, name="snapshot-copy-reader", daemon=True)
    thread.start()
    try:
        while True:
            item = ahead.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item  # type: ignore[misc]
    finally:
        stop.set()
        while thread.is_alive():
            try:
                ahead.get(timeout=0.1)
            except queue.Empty:
                continue
        thread.join()


class ReadAhead(Iterator[_Block]):
    """The items of ``source``, produced by a thread from construction on, one item ahead.

    The snapshot starts the next chunk's COPY (on a second connection) this way while the
    agent still takes the chunk before, so the server runs it meanwhile. The thread alone
    drives ``source`` (and its connection) until it ends; :meth:`close` stops it early and
    waits for it (``source`` is closed, so a COPY is drained, in that thread).
    """

    def __init__(self, source: Iterator[_Block], name: str = "snapshot-read-ahead") -> None:
        self._ahead: queue.Queue[object] = queue.Queue(maxsize=1)
        self._stop = threading.Event()
        self._done = False
        self._thread = threading.Thread(target=self._pump, args=(source,), name=name, daemon=True)
        self._thread.start()

    def _pump(self, source: Iterator[_Block]) -> None:
        try:
            for item in source:
                while not self._stop.is_set():
                    try:
                        self._ahead.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if self._stop.is_set():
                    break
        except BaseException as exc:  # handed to the consumer, raised there
            self._ahead.put(exc)
            return
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()
        self._ahead.put(_END)

    def __next__(self) -> _Block:
        if self._done:
            raise StopIteration
        item = self._ahead.get()
        if item is _END:
            self._done = True
            self._thread.join()
            raise StopIteration
        if isinstance(item, BaseException):
            self._done = True
            self._thread.join()
            raise item
        return item  # type: ignore[return-value]

    def close(self) -> None:
        """Stop reading (idempotent); returns once the thread has ended."""
        self._stop.set()
        while self._thread.is_alive():
            try:
                self._ahead.get(timeout=0.1)
            except queue.Empty:
                continue
        self._thread.join()
        self._done = True


def _start_copy(conn: psycopg.Connection[Any], query: sql.Composable) -> None:
    pgconn = conn.pgconn
    encoding = conn.info.encoding
    pgconn.send_query(query.as_bytes(conn))
    result = pgconn.get_result()
    if result is None or result.status != pq.ExecStatus.COPY_OUT:
        while pgconn.get_result() is not None:
            pass
        if result is None:
            msg = f"COPY returned no result: {pgconn.get_error_message(encoding)}"
            raise psycopg.OperationalError(msg)
        raise psycopg.errors.error_from_result(result, encoding=encoding)


def _end_copy(conn: psycopg.Connection[Any], *, finished: bool) -> None:
    pgconn = conn.pgconn
    if not finished and pgconn.status == pq.ConnStatus.OK:
        while pgconn.get_copy_data(0)[0] > 0:
            pass
    final = None
    while (next_result := pgconn.get_result()) is not None:
        final = final or next_result
    if finished and final is not None and final.status != pq.ExecStatus.COMMAND_OK:
        raise psycopg.errors.error_from_result(final, encoding=conn.info.encoding)


def _native_copy_out(
    native: ModuleType, conn: psycopg.Connection[Any], query: sql.Composable
) -> Generator[bytes, None, None]:
    """:func:`copy_out` with the reads in the extension: blocks of about ``BATCH_BYTES`` (whole messages)."""
    blocks = _native_copy_blocks(native, conn, query, 0)
    try:
        for data, _pieces, _blank in blocks:
            yield data
    finally:
        blocks.close()


def _native_copy_blocks(
    native: ModuleType, conn: psycopg.Connection[Any], query: sql.Composable, piece_bytes: int
) -> Generator[tuple[bytes, list[tuple[int, int, int]] | None, bool], None, None]:
    """:func:`_native_copy_out` with each block's pieces and blank-line flag (``copy_chunk``)."""
    _start_copy(conn, query)
    pgconn = conn.pgconn
    ptr = pgconn_pointer(pgconn)
    finished = False
    size = min(FIRST_BLOCK_BYTES, BATCH_BYTES)
    try:
        while True:
            data, status, pieces, blank = native.copy_chunk(ptr, size, piece_bytes)
            size = BATCH_BYTES
            if data:
                yield data, pieces, blank
            if status == -1:
                break
            if status < 0:
                msg = f"COPY failed: {pgconn.get_error_message(conn.info.encoding)}"
                raise psycopg.OperationalError(msg)
        finished = True
    finally:
        _end_copy(conn, finished=finished)


def copy_out(conn: psycopg.Connection[Any], query: sql.Composable) -> Iterator[bytes]:
    """Run ``COPY ... TO STDOUT`` on ``conn`` and yield its CopyData messages (one row each).

    Drives libpq directly (blocking reads, as pg_dump does): psycopg's Copy iterator costs a
    generator round trip per message, several microseconds per row, more than the rest of a
    snapshot row's work. Errors are psycopg's own (``error_from_result``). Stopping early
    drains the copy, so the connection stays usable.
    """
    _start_copy(conn, query)
    pgconn = conn.pgconn
    finished = False
    try:
        while True:
            nbytes, data = pgconn.get_copy_data(0)
            if nbytes > 0:
                yield bytes(data)
            elif nbytes == -1:
                break
            else:
                msg = f"COPY failed: {pgconn.get_error_message(conn.info.encoding)}"
                raise psycopg.OperationalError(msg)
        finished = True
    finally:
        _end_copy(conn, finished=finished)


# -- the native snapshot pass ------------------------------------------------------------


def encodable(data: bytes) -> bool:
    """Whether COPY text can go through :func:`encode_piece`: UTF-8 and without empty lines.

    Not UTF-8 (a SQL_ASCII database) or empty lines (no row): :meth:`EventBuilder.snapshot_records`.
    """
    if data.startswith(b"\n") or b"\n\n" in data:
        return False
    return encodable_text(data)


def encodable_text(data: bytes) -> bool:
    """Whether COPY text is UTF-8 (:func:`encodable` without the empty-line check)."""
    from capture.events import is_utf8  # events imports this module

    return is_utf8(data)


def copy_pieces(data: bytes, target: int | None = None) -> list[tuple[int, int, int]]:
    """``(start, end, rows)`` of consecutive pieces of ``data`` (:func:`encodable`), cut after a newline."""
    target = target or PIECE_BYTES
    pieces = []
    start, size = 0, len(data)
    while start < size:
        end = size if start + target >= size else (data.find(b"\n", start + target - 1) + 1 or size)
        rows = data.count(b"\n", start, end) + (0 if data[end - 1] == 0x0A else 1)
        pieces.append((start, end, rows))
        start = end
    return pieces


@dataclass(frozen=True)
class PartitionBatch:
    """An encoded batch of one partition and the sequence of its last record."""

    partition: int
    batch: EncodedBatch
    commit_lsn: int
    last_index: int


#: What a piece became, in row order: runs of native batches (one per partition with rows)
#: and, between them, the records of rows the Python path built (quarantined ones included).
EncodedPiece = list[list[PartitionBatch] | list["OutRecord"]]

_threads = threading.local()
_python_rows = threading.Lock()


def _thread_encoder(encoder: RowEncoder) -> RowEncoder:
    """This thread's own copy of ``encoder`` (an encoder's buffers serve one thread at a time)."""
    copies: dict[int, tuple[RowEncoder, RowEncoder]] = _threads.__dict__.setdefault("copies", {})
    held = copies.get(id(encoder))
    if held is None or held[0] is not encoder:
        held = copies[id(encoder)] = (encoder, encoder.copy())  # holding encoder keeps its id unique
    return held[1]


def _native_zstd() -> bool:
    """Whether the extension compresses batches itself (it found libzstd)."""
    return native.speedups is not None and native.speedups.zstd_version() is not None


def encode_piece(
    builder: EventBuilder,
    relation_oid: int,
    data: bytes,
    piece: tuple[int, int, int],
    sequence_start: Seq,
    *,
    partitions: int,
    ts_us: int,
    compression: Compression = "none",
) -> EncodedPiece:
    """The snapshot events of ``data[start:end]`` as file-log batches (thread-safe; see the module docstring).

    Byte-identical to what :meth:`EventBuilder.snapshot_records` builds and the file log encodes
    (``tests/unit/native/test_native.py``); a row the native pass hands back takes that Python
    path alone, and the native pass goes on after it. With ``compression`` the batches' records
    are compressed here, in the encoder thread (the codec releases the GIL), so compression
    overlaps the COPY reads and the appends.
    """
    start, end, _rows = piece
    lsn, index = sequence_start.commit_lsn, sequence_start.txn_index
    shared, head, pre, tail = builder.snapshot_pieces(relation_oid, lsn, ts_us=ts_us)
    if shared is None:
        msg = "encode_piece needs the table's native encoder"
        raise ValueError(msg)
    encoder = _thread_encoder(shared)
    now_ms = time.time_ns() // 1_000_000
    # The extension compresses inside its pass (without the GIL, no plain copy for Python) when it
    # has libzstd; else the batches come back plain and are compressed here.
    level = ZSTD_LEVEL if compression == "zstd" and _native_zstd() else None
    out: EncodedPiece = []
    at = start
    while at < end:
        at, index, batches = encoder.copy_batches(data, at, end, head, pre, tail, index, partitions, now_ms, level)
        encoded = []
        for partition, found in enumerate(batches):
            if found is None:
                continue
            batch = EncodedBatch(found[0], found[1], now_ms, found[3])
            if level is None:
                batch = batch.compressed(compression)
            encoded.append(PartitionBatch(partition, batch, lsn, found[2]))
        if encoded:
            out.append(encoded)
        if at >= end:
            break
        line_end = data.find(b"\n", at, end)
        line_end = end if line_end < 0 else line_end
        rows = parse_copy_text(data[at:line_end])
        with _python_rows:  # the shared encoder and the Python converters, one thread at a time
            out.append(builder.snapshot_records(relation_oid, rows, Seq(lsn, index), ts_us=ts_us))
        index += len(rows)
        at = line_end + 1
    return out
