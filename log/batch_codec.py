"""The on-disk record batch of the file backend: encoding, header parsing, CRC check, decoding.

A batch is one atomic append. Layout (little-endian)::

    header  length u32 | crc u32 | magic 4s | attributes u16 | base_offset i64
            | last_offset_delta u32 | record_count u32 | max_timestamp i64
    records record_count x ( offset_delta u32 | timestamp i64 | key_len i32 | value_len i32
                             | headers_len u32 | key | value | headers )
    headers repeated ( name_len u16 | name utf-8 | value_len u32 | value )

``length`` is the whole batch including the header. ``crc`` is CRC-32 (zlib) of the
``length`` field followed by every byte after the ``crc`` field, so a batch whose
length, header or records changed fails the check. A length of -1 marks a null key
or value (a tombstone). Compaction may drop records from a batch but keeps
``base_offset`` and ``last_offset_delta``, so offsets are never renumbered.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from typing import NamedTuple

from capture import native
from log.base import Record, StoredRecord

MAGIC = b"HWB1"
HEADER = struct.Struct("<II4sHqIIq")
HEADER_SIZE = HEADER.size
HEADER_CRC = struct.Struct("<I")
_HEADER_PLACEHOLDER = bytes(HEADER_SIZE)
RECORD = struct.Struct("<Iqiii")
RECORD_SIZE = RECORD.size
_HEADER_NAME = struct.Struct("<H")
_HEADER_VALUE = struct.Struct("<I")
_NULL = -1
#: Byte position of the magic inside a batch (resynchronisation searches for it).
MAGIC_POSITION = 8
#: Batches larger than this are treated as damaged rather than read into memory.
MAX_BATCH_BYTES = 1 << 31


class BatchHeader(NamedTuple):
    """The fixed header of one batch."""

    length: int
    crc: int
    base_offset: int
    last_offset_delta: int
    record_count: int
    max_timestamp: int

    @property
    def last_offset(self) -> int:
        """Offset of the batch's last record as appended (kept through compaction)."""
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        """The offset that follows this batch."""
        return self.base_offset + self.last_offset_delta + 1


def encode_headers(headers: Sequence[tuple[str, bytes]]) -> bytes:
    """Encode record headers (name, value) pairs."""
    parts: list[bytes] = []
    for name, value in headers:
        raw = name.encode()
        parts += (_HEADER_NAME.pack(len(raw)), raw, _HEADER_VALUE.pack(len(value)), value)
    return b"".join(parts)


def decode_headers(buf: bytes | memoryview) -> tuple[tuple[str, bytes], ...]:
    """Inverse of :func:`encode_headers`."""
    out: list[tuple[str, bytes]] = []
    pos, end = 0, len(buf)
    while pos < end:
        (name_len,) = _HEADER_NAME.unpack_from(buf, pos)
        pos += 2
        name = bytes(buf[pos : pos + name_len]).decode()
        pos += name_len
        (value_len,) = _HEADER_VALUE.unpack_from(buf, pos)
        pos += 4
        out.append((name, bytes(buf[pos : pos + value_len])))
        pos += value_len
    return tuple(out)


def encode_batch(base_offset: int, records: Sequence[Record], now_ms: int) -> tuple[bytearray, int]:
    """Encode ``records`` as one batch starting at ``base_offset``; return it and its max timestamp.

    Records without a timestamp get ``now_ms``.
    """
    if _native is not None:
        encoded = _native.encode_batch(base_offset, records, now_ms)
        if encoded is not None:  # None: a record has headers (or odd types); the Python encoder below
            batch, max_ts = encoded
            view = memoryview(batch)
            HEADER_CRC.pack_into(batch, 4, zlib.crc32(view[8:], zlib.crc32(view[:4])))
            view.release()
            return batch, max_ts
    return _encode_batch_python(base_offset, records, now_ms)


#: The extension (the batch encoded in C, one copy of each record), or None. :func:`_encode_batch_python`
#: defines the bytes.
_native = native.speedups


def _encode_batch_python(base_offset: int, records: Sequence[Record], now_ms: int) -> tuple[bytearray, int]:
    pack = RECORD.pack
    parts: list[bytes] = []
    append = parts.append
    max_ts = -(1 << 63)
    for delta, record in enumerate(records):
        key, value, ts = record.key, record.value, record.timestamp_ms
        if ts is None:
            ts = now_ms
        max_ts = max(max_ts, ts)
        hdr = encode_headers(record.headers) if record.headers else b""
        append(pack(delta, ts, _NULL if key is None else len(key), _NULL if value is None else len(value), len(hdr)))
        if key:
            append(key)
        if value:
            append(value)
        if hdr:
            append(hdr)
    return seal_batch(base_offset, len(records) - 1, len(records), max_ts, parts), max_ts


def seal_batch(
    base_offset: int, last_offset_delta: int, record_count: int, max_timestamp: int, records: Sequence[bytes]
) -> bytearray:
    """Join encoded records behind a header and its CRC (one copy of the records)."""
    batch = bytearray().join((_HEADER_PLACEHOLDER, *records))
    HEADER.pack_into(batch, 0, len(batch), 0, MAGIC, 0, base_offset, last_offset_delta, record_count, max_timestamp)
    view = memoryview(batch)
    HEADER_CRC.pack_into(batch, 4, zlib.crc32(view[8:], zlib.crc32(view[:4])))
    return batch


def parse_header(buf: bytes | memoryview, pos: int = 0) -> BatchHeader | None:
    """The header at ``pos``, or ``None`` if the bytes there cannot start a batch."""
    if len(buf) - pos < HEADER_SIZE:
        return None
    length, crc, magic, _attrs, base, last_delta, count, max_ts = HEADER.unpack_from(buf, pos)
    if magic != MAGIC or length < HEADER_SIZE or length > MAX_BATCH_BYTES or base < 0 or count > last_delta + 1:
        return None
    return BatchHeader(length, crc, base, last_delta, count, max_ts)


def crc_ok(buf: bytes | memoryview, pos: int, header: BatchHeader) -> bool:
    """Whether the batch at ``pos`` (fully inside ``buf``) matches its CRC."""
    view = memoryview(buf)
    crc = zlib.crc32(view[pos : pos + 4])
    return zlib.crc32(view[pos + 8 : pos + header.length], crc) == header.crc


def decode_records(
    buf: bytes,
    pos: int,
    header: BatchHeader,
    *,
    topic: str,
    partition: int,
    min_offset: int,
    out: list[StoredRecord],
    max_records: int,
    max_bytes: int,
) -> int:
    """Append the checked batch's records with offset >= ``min_offset`` to ``out``; return their bytes.

    Stops early, returning -1, once ``out`` holds ``max_records`` or the next record would
    take the bytes past ``max_bytes`` (a non-empty ``out`` only: a read returns at least one).
    """
    # The hot path of every read: one unpack and two slices per record, no generator.
    unpack = RECORD.unpack_from
    base = header.base_offset
    append = out.append
    used = 0
    room = max_records - len(out)
    p = pos + HEADER_SIZE
    for _ in range(header.record_count):
        delta, ts, klen, vlen, hlen = unpack(buf, p)
        start = p
        p += RECORD_SIZE
        key = None
        if klen >= 0:
            key = buf[p : p + klen]
            p += klen
        value = None
        if vlen >= 0:
            value = buf[p : p + vlen]
            p += vlen
        headers: tuple[tuple[str, bytes], ...] = ()
        if hlen:
            headers = decode_headers(buf[p : p + hlen])
            p += hlen
        if base + delta < min_offset:
            continue
        used += p - start
        if used > max_bytes and out:
            return -1
        append(StoredRecord(topic, partition, base + delta, ts, key, value, headers))
        room -= 1
        if room <= 0:
            return -1
    return used
