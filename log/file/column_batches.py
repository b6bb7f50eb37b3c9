"""The file log's batches of :class:`~log.column_records.ColumnRecords`, built from the Arrow buffers.

Per partition (Kafka's murmur2 of the key, as :func:`log.partitioner.partitions_for`), an
:class:`~log.file.batch_codec.EncodedBatch` whose bytes are the ones the file log writes for
those records, built by the extension from the Arrow buffers (``native/batch_columns.c``) or by
:func:`_column_batches_python`, which defines them (``tests/unit/log/file/test_column_batches.py``).
"""

from __future__ import annotations

import pyarrow as pa  # type: ignore[import-untyped]  # no stubs

import native
from log.column_records import ColumnRecords, pylists
from log.file.batch_codec import HEADER_SIZE, RECORD, EncodedBatch, encode_headers
from log.partitioner import partitions_for

#: The extension, or None (``HEADWATER_NATIVE=0``, no compiler): the Python twin builds the batches.
_native = native.speedups
_NULL = -1


def column_batches(
    records: ColumnRecords, partitions: int, now_ms: int, scratch: BatchScratch | None = None
) -> list[EncodedBatch | None]:
    """Per partition, its records (timestamp ``now_ms``) as a batch the file log appends; None where none.

    With ``scratch`` the batches are built in its buffers where it can (see :class:`BatchScratch`).
    """
    if partitions <= 0:
        msg = "partitions must be positive"
        raise ValueError(msg)
    if not records.rows:
        return [None] * partitions
    headers = encode_headers(records.headers)
    if _native is None:
        return _column_batches_python(records, partitions, headers, now_ms)
    deletes = None
    if records.deletes is not None:
        flags = records.deletes.cast(pa.uint8())  # one byte per row, as the extension reads them
        deletes = memoryview(flags.buffers()[1])[flags.offset :]
    buffers = None if scratch is None else scratch.buffers_for(partitions)
    found = _native.column_batches(
        records.rows, _buffers(records.keys), _buffers(records.values), deletes, partitions, headers, now_ms, buffers
    )
    if scratch is not None:
        scratch.trim()
    return [None if entry is None else EncodedBatch(entry[0], entry[1], now_ms) for entry in found]


class BatchScratch:
    """Buffers that :func:`column_batches` builds batches in from call to call.

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


def _column_batches_python(
    records: ColumnRecords, partitions: int, headers: bytes, now_ms: int
) -> list[EncodedBatch | None]:
    """What ``column_batches`` of the extension builds (the twin that defines the bytes)."""
    keys, values, deletes = pylists(records)
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
