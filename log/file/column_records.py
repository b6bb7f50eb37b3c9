"""Records given as Arrow columns (the file backend's columnar write), and their file-log batches.

A :class:`ColumnRecords` is a key column, a value column and a delete flag per row, all
records carrying the same headers: each row is the record ``(key, value, headers)``, and a
delete row is followed by its tombstone ``(key, None, headers)``. Read as a sequence it is
exactly those :class:`~log.base.Record` objects (what a Kafka log appends);
:meth:`ColumnRecords.partition_batches` gives instead, per partition (Kafka's murmur2 of the
key, as :func:`log.partitioner.partitions_for`), an :class:`~log.file.batch_codec.EncodedBatch`
whose bytes are the ones the file log writes for those records, built by the extension from
the Arrow buffers (``native/batch_columns.c``) or by :func:`_column_batches_python`,
which defines them (``tests/unit/log/file/test_column_records.py``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import overload

import pyarrow as pa  # type: ignore[import-untyped]  # no stubs
import pyarrow.compute as pc  # type: ignore[import-untyped]

import native
from log.base import Record
from log.file.batch_codec import HEADER_SIZE, RECORD, EncodedBatch, encode_headers
from log.partitioner import partitions_for

#: The extension, or None (``HEADWATER_NATIVE=0``, no compiler): the Python twin builds the batches.
_native = native.speedups
_NULL = -1


def _column(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    """One contiguous string/binary array (chunks joined; a null-typed column as null strings)."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks() if values.num_chunks != 1 else values.chunk(0)
    if pa.types.is_null(values.type):
        values = values.cast(pa.string())
    if not (
        pa.types.is_string(values.type)
        or pa.types.is_binary(values.type)
        or pa.types.is_large_string(values.type)
        or pa.types.is_large_binary(values.type)
    ):
        msg = f"record keys and values must be string or binary columns, not {values.type}"
        raise TypeError(msg)
    return values


class ColumnRecords(Sequence[Record]):
    """The records of key/value/delete columns that share one set of headers (see the module docstring).

    ``len()`` counts records: one per row plus one tombstone per delete. Indexing or
    iterating builds the :class:`Record` objects (once); :meth:`partition_batches` does not.
    """

    __slots__ = ("_records", "deletes", "headers", "keys", "values")

    def __init__(
        self,
        keys: pa.Array | pa.ChunkedArray,
        values: pa.Array | pa.ChunkedArray,
        deletes: pa.Array | pa.ChunkedArray | None,
        headers: tuple[tuple[str, bytes], ...],
    ) -> None:
        self.keys = _column(keys)
        self.values = _column(values)
        if len(self.keys) != len(self.values):
            msg = f"{len(self.keys)} keys but {len(self.values)} values"
            raise ValueError(msg)
        #: Per row: a delete (a tombstone follows it); a null flag is no delete.
        self.deletes: pa.Array | None = None
        if deletes is not None:
            flags = pc.fill_null(deletes, False)
            self.deletes = flags.combine_chunks() if isinstance(flags, pa.ChunkedArray) else flags
            if len(self.deletes) != len(self.keys):
                msg = f"{len(self.keys)} rows but {len(self.deletes)} delete flags"
                raise ValueError(msg)
        self.headers = headers
        self._records: list[Record] | None = None

    @property
    def rows(self) -> int:
        """Rows (records without the tombstones)."""
        return len(self.keys)

    @property
    def delete_count(self) -> int:
        """Rows that are deletes (each followed by a tombstone)."""
        if self.deletes is None:
            return 0
        return int(pc.sum(self.deletes).as_py() or 0)

    def __len__(self) -> int:
        return self.rows + self.delete_count

    @overload
    def __getitem__(self, index: int) -> Record: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Record]: ...
    def __getitem__(self, index: int | slice) -> Record | Sequence[Record]:
        return self.records()[index]

    def __iter__(self) -> Iterator[Record]:
        return iter(self.records())

    def records(self) -> list[Record]:
        """The records as :class:`Record` objects (built on first use)."""
        if self._records is None:
            keys, values, deletes = _pylists(self)
            headers = self.headers
            out: list[Record] = []
            append = out.append
            for key, value, delete in zip(keys, values, deletes, strict=True):
                append(Record(key, value, headers))
                if delete:
                    append(Record(key, None, headers))
            self._records = out
        return self._records

    def partition_batches(
        self, partitions: int, now_ms: int, scratch: BatchScratch | None = None
    ) -> list[EncodedBatch | None]:
        """Per partition, its records (timestamp ``now_ms``) as a batch the file log appends; None where none.

        With ``scratch`` the batches are built in its buffers where it can (see :class:`BatchScratch`).
        """
        if partitions <= 0:
            msg = "partitions must be positive"
            raise ValueError(msg)
        if not self.rows:
            return [None] * partitions
        headers = encode_headers(self.headers)
        if _native is None:
            return _column_batches_python(self, partitions, headers, now_ms)
        deletes = None
        if self.deletes is not None:
            flags = self.deletes.cast(pa.uint8())  # one byte per row, as the extension reads them
            deletes = memoryview(flags.buffers()[1])[flags.offset :]
        buffers = None if scratch is None else scratch.buffers_for(partitions)
        found = _native.column_batches(
            self.rows, _buffers(self.keys), _buffers(self.values), deletes, partitions, headers, now_ms, buffers
        )
        if scratch is not None:
            scratch.trim()
        return [None if entry is None else EncodedBatch(entry[0], entry[1], now_ms) for entry in found]


class BatchScratch:
    """Buffers that :meth:`ColumnRecords.partition_batches` builds batches in from call to call.

    A fresh multi-MiB buffer costs its page faults (more than encoding the records into it).
    A buffer is reused only while nothing but this scratch holds it (the extension checks), so
    a batch still referenced is never overwritten. At most ``max_bytes`` are kept between
    calls. One user at a time (a thread's own).
    """

    __slots__ = ("buffers", "max_bytes")

    def __init__(self, max_bytes: int = 256 << 20) -> None:
        self.buffers: list[bytearray | None] = []
        self.max_bytes = max_bytes

    def buffers_for(self, partitions: int) -> list[bytearray | None]:
        """One slot per partition (the extension puts a new buffer where it could not reuse one)."""
        if len(self.buffers) != partitions:
            self.buffers = [None] * partitions
        return self.buffers

    def trim(self) -> None:
        """Let go of the buffers when they hold more than ``max_bytes``."""
        if sum(len(b) for b in self.buffers if b is not None) > self.max_bytes:
            self.buffers = [None] * len(self.buffers)


def _buffers(array: pa.Array) -> tuple[pa.Buffer | None, pa.Buffer, pa.Buffer | bytes, int, bool]:
    """``(validity, offsets, data, offset, wide)`` of a string/binary array, as the extension reads them."""
    validity, offsets, data = array.buffers()[:3]
    if array.null_count == 0:
        validity = None
    wide = pa.types.is_large_string(array.type) or pa.types.is_large_binary(array.type)
    return validity, offsets, b"" if data is None else data, array.offset, wide


def _pylists(records: ColumnRecords) -> tuple[list[bytes | None], list[bytes | None], list[bool]]:
    keys = records.keys.cast(pa.large_binary()).to_pylist()
    values = records.values.cast(pa.large_binary()).to_pylist()
    deletes = [False] * len(keys) if records.deletes is None else records.deletes.to_pylist()
    return keys, values, deletes


def _column_batches_python(
    records: ColumnRecords, partitions: int, headers: bytes, now_ms: int
) -> list[EncodedBatch | None]:
    """What ``column_batches`` of the extension builds (the twin that defines the bytes)."""
    keys, values, deletes = _pylists(records)
    pack = RECORD.pack
    hlen = len(headers)
    parts: list[list[bytes]] = [[bytes(HEADER_SIZE)] for _ in range(partitions)]
    counts = [0] * partitions
    for key, value, delete, partition in zip(keys, values, deletes, partitions_for(keys, partitions), strict=True):
        out = parts[partition]
        klen = _NULL if key is None else len(key)
        for record_value in (value, None) if delete else (value,):
            vlen = _NULL if record_value is None else len(record_value)
            out.append(pack(counts[partition], now_ms, klen, vlen, hlen))
            counts[partition] += 1
            if key:
                out.append(key)
            if record_value:
                out.append(record_value)
            if headers:
                out.append(headers)
    return [
        EncodedBatch(bytearray().join(parts[p]), counts[p], now_ms) if counts[p] else None for p in range(partitions)
    ]
