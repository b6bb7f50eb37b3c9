"""The records of file-log batches decoded straight into Arrow columns (the file backend's columnar read).

A reader that turns records into Arrow anyway (the ``headwater_log`` Spark source) reads
an offset range as :class:`RecordColumns` instead of a ``StoredRecord`` per record:
offsets, timestamps, keys and values straight from the batches' bytes. The records are
exactly those :meth:`log.base.Log.read` gives for the same offsets (compacted gaps,
tombstones, null keys, batches straddling the range ends, retention); record headers are
not carried (no columnar reader needs them).

:func:`decode_columns` decodes the plain records sections of checked batches; the
extension (``native``) does it in C, :func:`_decode_columns_python` is its twin
and defines the result (same bytes, ``tests/unit/log/file/test_column_decoder.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]  # no stubs

import native
from log.columns import RecordColumns
from log.file.batch_codec import RECORD

_INT32_MAX = (1 << 31) - 1


class RecordsSection(NamedTuple):
    """The plain records of one checked batch: ``buffer[start:stop]`` holds ``records`` records."""

    buffer: bytes | bytearray | memoryview
    start: int
    stop: int
    records: int
    base_offset: int


class DecodedColumns(NamedTuple):
    """What :func:`decode_columns` returns: the selected records as Arrow buffers.

    ``next_offset`` is where a following read goes on (-1: every section was read to its
    end). Validity bitmaps are ``None`` when nothing is null.
    """

    rows: int
    next_offset: int
    offsets: bytes
    timestamps_ms: bytes
    key_validity: bytes | None
    key_offsets: bytes
    key_data: bytes
    value_validity: bytes | None
    value_offsets: bytes
    value_data: bytes


def decode_columns(
    sections: Sequence[RecordsSection], *, min_offset: int, end_offset: int, max_records: int, max_bytes: int
) -> DecodedColumns:
    """The records of ``sections`` with ``min_offset <= offset < end_offset``, as column buffers.

    The same selection as :func:`log.file.batch_codec.decode_records` (records in order, at most
    ``max_records``, stopping before the record that takes the bytes past ``max_bytes``
    unless nothing was selected yet), which also stops at ``end_offset``. Records whose
    bytes run past their section raise ValueError.
    """
    if _native is not None:
        return DecodedColumns(*_native.decode_columns(sections, min_offset, end_offset, max_records, max_bytes))
    return _decode_columns_python(sections, min_offset, end_offset, max_records, max_bytes)


_native = native.speedups


def _decode_columns_python(
    sections: Sequence[RecordsSection], min_offset: int, end_offset: int, max_records: int, max_bytes: int
) -> DecodedColumns:
    unpack = RECORD.unpack_from
    offsets: list[int] = []
    timestamps: list[int] = []
    keys: list[bytes | None] = []
    values: list[bytes | None] = []
    used = 0
    next_offset = -1 if max_records > 0 else min_offset
    for section in sections if max_records > 0 else ():
        buf = memoryview(section.buffer)
        if section.start < 0 or section.stop < section.start or section.stop > len(buf) or section.records < 0:
            msg = f"batch at offset {section.base_offset}: its section lies outside its buffer"
            raise ValueError(msg)
        stop = section.stop
        p = section.start
        done = False
        for _ in range(section.records):
            if stop - p < RECORD.size:
                _overrun(section)
            delta, ts, klen, vlen, hlen = unpack(buf, p)
            start = p
            p += RECORD.size
            if klen < -1 or vlen < -1 or max(klen, 0) + max(vlen, 0) + hlen > stop - p:
                _overrun(section)
            key = None if klen < 0 else bytes(buf[p : p + klen])
            p += max(klen, 0)
            value = None if vlen < 0 else bytes(buf[p : p + vlen])
            p += max(vlen, 0) + hlen
            offset = section.base_offset + delta
            if offset < min_offset:
                continue
            if offset >= end_offset:
                next_offset, done = end_offset, True
                break
            used += p - start
            if used > max_bytes and offsets:
                next_offset, done = offset, True
                break
            offsets.append(offset)
            timestamps.append(ts)
            keys.append(key)
            values.append(value)
            if len(offsets) >= max_records:
                next_offset, done = offset + 1, True
                break
        if done:
            break
    key_validity, key_offsets, key_data = _binary_buffers(keys)
    value_validity, value_offsets, value_data = _binary_buffers(values)
    return DecodedColumns(
        len(offsets),
        next_offset,
        np.array(offsets, np.int64).tobytes(),
        np.array(timestamps, np.int64).tobytes(),
        key_validity,
        key_offsets,
        key_data,
        value_validity,
        value_offsets,
        value_data,
    )


def _overrun(section: RecordsSection) -> None:
    msg = f"batch at offset {section.base_offset}: its records run past the batch's end"
    raise ValueError(msg)


def _binary_buffers(items: list[bytes | None]) -> tuple[bytes | None, bytes, bytes]:
    """Arrow's validity bitmap (``None`` without nulls), int32 offsets and data of a binary column."""
    data = b"".join(item for item in items if item is not None)
    if len(data) > _INT32_MAX:
        msg = "the selected keys or values exceed 2 GiB: read fewer bytes at once"
        raise ValueError(msg)
    lengths = np.array([0 if item is None else len(item) for item in items], np.int64)
    offsets = np.zeros(len(items) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    validity = None
    if any(item is None for item in items):
        valid = np.array([item is not None for item in items], np.bool_)
        validity = np.packbits(valid, bitorder="little").tobytes()
    return validity, offsets.tobytes(), data


def record_columns(topic: str, partition: int, decoded: DecodedColumns) -> RecordColumns:
    """Arrow arrays over the decoded buffers (no copy)."""
    n = decoded.rows
    validity = [decoded.key_validity, decoded.value_validity]
    key_bitmap, value_bitmap = (None if bits is None else pa.py_buffer(bits) for bits in validity)
    return RecordColumns(
        topic,
        partition,
        pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(decoded.offsets)]),
        pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(decoded.timestamps_ms)]),
        pa.Array.from_buffers(
            pa.binary(), n, [key_bitmap, pa.py_buffer(decoded.key_offsets), pa.py_buffer(decoded.key_data)]
        ),
        pa.Array.from_buffers(
            pa.binary(), n, [value_bitmap, pa.py_buffer(decoded.value_offsets), pa.py_buffer(decoded.value_data)]
        ),
    )
