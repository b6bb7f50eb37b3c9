"""COPY OUT on a source connection: a table chunk's rows as they arrive.

Drives libpq directly (blocking reads, as pg_dump does), or through the extension's reads
when it is built: psycopg's Copy iterator costs a generator round trip per message, more
than the rest of a snapshot row's work. Stopping a read early drains the COPY, so the
connection stays usable. Errors are psycopg's own (``error_from_result``).
"""

from __future__ import annotations

from collections.abc import Generator, Iterator, Sequence
from types import ModuleType
from typing import Any

import psycopg
import psycopg.errors
from psycopg import pq, sql

from capture.postgres.registration.row_filters import condition_sql
from capture.postgres.snapshot import copy_text
from capture.postgres.snapshot.copy_text import CopyRows
from capture.postgres.snapshot.plan import Chunk
from capture.postgres.streaming.connection import libpq_speedups, pgconn_pointer
from capture.read_ahead import ReadAhead

#: COPY data parsed and appended at a time.
BATCH_BYTES = 4 << 20
#: The first native COPY read of a chunk: the encoders start on it while the rest arrives.
FIRST_BLOCK_BYTES = 1 << 20


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
    condition = condition_sql(chunk.condition)
    if condition is not None:
        where = sql.SQL("{} AND {}").format(where, condition)
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
        # The blocks are read one ahead, in a thread that alone drives the connection until it ends.
        ahead = ReadAhead(_native_copy_blocks(native, conn, query, copy_text.PIECE_BYTES), name="snapshot-copy-reader")
        try:
            for read, pieces, blank in ahead:
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
        finally:
            ahead.close()  # stopped early: the thread ends and the COPY is drained there
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
