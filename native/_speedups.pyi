"""Native hot path of capture and the file log (C extension; see native/__init__.py)."""

from collections.abc import Callable, Sequence
from typing import Any

def murmur2(data: bytes, /) -> int:
    """Kafka's murmur2 of ``data`` (signed 32-bit)."""

def partition_for(key: bytes | None, n: int, /) -> int:
    """Kafka's partition of ``key`` among ``n`` (``None`` -> 0)."""

def partitions(keys: Sequence[bytes | None], n: int, /) -> list[int]:
    """Kafka's partition of each key among ``n`` (``None`` -> 0)."""

def encode_batch(base_offset: int, records: Sequence[Any], now_ms: int, /) -> tuple[bytearray, int] | None:
    """A file-log batch (CRC-32C) and its max timestamp; None if a record needs the Python encoder."""

def crc32c(data: bytes | bytearray | memoryview, value: int = 0, portable: bool = False, /) -> int:
    """CRC-32C of ``data`` chained from ``value`` (SSE4.2, or the C tables when ``portable``)."""

def seal_batch_header(batch: bytearray, base_offset: int, count: int, max_timestamp: int, /) -> None:
    """Fill the header placeholder and CRC-32C of a batch of ``count`` records in place."""

def configure(insert: type, update: type, delete: type, unchanged: object, /) -> None:
    """The message classes :func:`decode_change` builds and the unchanged-TOAST marker."""

def decode_change(data: bytes, in_stream: bool, /) -> Any:
    """An Insert, Update or Delete message; None for any other or a malformed message."""

def read_tuple(data: bytes, pos: int, unchanged: object, /) -> tuple[tuple[Any, ...], int] | None:
    """The pgoutput TupleData at ``pos`` and the position after it; None if malformed."""

class RowEncoder:
    """Text tuples of one relation -> row-image JSON and key JSON."""

    def __init__(
        self,
        kinds: tuple[int, ...],
        params: tuple[int, ...],
        emit: tuple[bool, ...],
        names_json: tuple[bytes, ...],
        converters: tuple[Callable[[str], Any], ...],
        key_columns: tuple[int, ...],
        dumps: Callable[[Any], bytes],
        unchanged: object,
        /,
    ) -> None: ...
    def encode(self, values: tuple[Any, ...], /) -> tuple[bytes, bytes | None] | None:
        """``(after_json, key_json)``, or None when the Python path must handle the row."""
    def copy_records(
        self,
        data: bytes,
        pos: int,
        head: bytes,
        pre: bytes,
        tail: bytes,
        index: int,
        lsn: int,
        topic: str,
        record_type: type,
        out: list[Any],
        /,
    ) -> tuple[int, int]:
        """Snapshot records of COPY text from byte ``pos``: ``(pos, index)`` of the first row left to Python."""
    def copy_batches(
        self,
        data: bytes,
        pos: int,
        end: int,
        head: bytes,
        pre: bytes,
        tail: bytes,
        index: int,
        nparts: int,
        now_ms: int,
        level: int | None = None,
        /,
    ) -> tuple[int, int, list[tuple[bytearray, int, int, int] | None]]:
        """Snapshot records of COPY text ``data[pos:end]`` as one batch body per partition (GIL released).

        ``(pos, index, batches)``: ``pos`` is the first row left to Python (``end`` when none);
        ``batches[p]`` is ``(batch, count, last_index, codec)``. With a zstd ``level`` (and
        :func:`zstd_version` not None) a batch's records are stored compressed (codec 4) when
        that is smaller.
        """
    def copy(self) -> RowEncoder:
        """A RowEncoder of the same configuration with its own buffers (one per thread)."""
    def events(
        self,
        changes: list[Any],
        lsns: list[int],
        pos: int,
        relation_oid: int,
        pieces: tuple[bytes, ...],
        index: int,
        order: int,
        commit: int,
        topic: str,
        record_type: type,
        out: list[Any],
        images: dict[bytes, bytes] | None,
        old_images: dict[bytes, bytes] | None,
        limit: int,
        /,
    ) -> tuple[int, int, int]:
        """Records of the run of simple changes from ``pos``: ``(consumed, index, order)`` after it."""

def bind_libpq(version: int, message_type: type, /) -> bool:
    """Find psycopg's loaded libpq (its PQlibVersion equals ``version``); False if none is loaded."""

def zstd_version() -> int | None:
    """The version number of the libzstd ``copy_batches`` compresses with; None: it leaves that to Python."""

def copy_chunk(
    conn_ptr: int, max_bytes: int, piece_bytes: int = 0, /
) -> tuple[bytes, int, list[tuple[int, int, int]] | None, bool]:
    """COPY OUT rows read blocking, concatenated until ``max_bytes``: ``(data, status, pieces, blank)``.

    Status 1 more, -1 ended, -2 failed. ``pieces``: ``copy_pieces(data, piece_bytes)`` (None when
    ``piece_bytes`` is 0 or a message is no whole line); ``blank``: a row is an empty line.
    """

def wal_frames(conn_ptr: int, max_frames: int, /) -> tuple[list[Any], int, int]:
    """Buffered COPY BOTH frames (XLogData as ``message_type``, others bytes), the others' count, a status.

    Status 0: nothing more buffered, 1: ``max_frames`` reached, -1: ended, -2: failed.
    """

def take_changes(frames: list[Any], pos: int, changes: list[Any], lsns: list[int], /) -> int:
    """Decoded Insert/Update/Delete frames from ``pos`` appended (as feed would): the index of the first other."""

def group_records(records: list[Any], counts: dict[str, int], /) -> dict[str, list[list[Any]]] | str | None:
    """Records per topic and partition (Kafka's partitioner); a topic missing from ``counts``; None: Python decides."""

# log_columns.c: file-log record batches -> Arrow-ready column buffers (read side of derived feeds)

def decode_columns(
    parts: Sequence[tuple[Any, int, int, int, int]],
    min_offset: int,
    end_offset: int,
    max_records: int,
    max_bytes: int,
    /,
) -> tuple[Any, ...]:
    """The records of the plain records sections ``parts`` as column buffers; see log/file/column_decoder.py.

    (count, next_offset, offsets, timestamps_ms, key_validity, key_offsets, key_data, value_validity,
    value_offsets, value_data).
    """

def scan_envelopes(value_offsets: Any, value_data: Any, first: int, count: int, /) -> tuple[Any, ...] | None:
    """Envelope columns and before/after JSON streams (28 buffers); None: Python decides (envelope_scanner)."""

# batch_columns.c: Arrow columns -> file-log record batches (write side of derived feeds)

def column_batches(
    n: int,
    keys: tuple[Any, ...],
    values: tuple[Any, ...],
    deletes: Any,
    partitions: int,
    headers: Any,
    now_ms: int,
    scratch: list[bytearray] | None,
    /,
) -> list[tuple[Any, int] | None]:
    """Per partition the encoded batch and its record count (None: no rows); see log/file/column_batches.py."""

def event_ops(values: list[bytes], /) -> bytes: ...
def sink_records(records: list[Any], record_type: type, /) -> list[Any] | None: ...
def copy_text(values: list[bytes], names: list[bytes], kinds: bytes, /) -> bytes | None: ...
def copy_arrays(text: bytes, count: int, /) -> list[str] | None: ...
def decode_records(
    buf: bytes | memoryview,
    pos: int,
    count: int,
    base: int,
    min_offset: int,
    topic: str,
    partition: int,
    record_type: type,
    room: int,
    max_bytes: int,
    held: int,
    /,
) -> tuple[list[Any], int] | None: ...
def binlog_rows(
    body: bytes, pos: int, op: int, plan: bytes, labels: tuple[tuple[str, ...] | None, ...], /
) -> list[tuple[list[Any] | None, list[Any] | None]] | None:
    """The ``(before, after)`` images of a MySQL row event (op 0 insert, 1 delete, 2 update) per ``plan``.

    None: the Python readers decode the event (capture/mysql/binlog/rows.py).
    """

def binlog_events(
    changes: list[Any],
    pos: int,
    shape: object,
    names: tuple[bytes, ...],
    emit: bytes,
    key: tuple[int, ...],
    skipped: int,
    dumps: Callable[[Any], bytes],
    pieces: tuple[bytes, ...],
    commit: int,
    index: int,
    order: int,
    topic: str,
    record_type: type,
    out: list[Any],
    limit: int,
    /,
) -> tuple[int, int, int]:
    """The records of the run of MySQL row changes of ``shape`` from ``pos``: ``(consumed, index, order)`` after it.

    See capture/mysql/events.py (EventBuilder.records is the twin).
    """
