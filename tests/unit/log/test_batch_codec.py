import zlib

import pytest

from log.base import Record
from log.batch_codec import (
    HEADER_SIZE,
    crc_ok,
    decode_headers,
    decode_records,
    encode_batch,
    encode_headers,
    parse_header,
    seal_batch,
)


def decode(data, min_offset=0):
    header = parse_header(data)
    assert header is not None
    assert crc_ok(data, 0, header)
    out = []
    decode_records(
        data, 0, header, topic="t", partition=2, min_offset=min_offset, out=out, max_records=100, max_bytes=1 << 30
    )
    return out


def test_round_trip_keeps_keys_values_headers_and_timestamps():
    records = [
        Record(b"k1", b"v1", (("a", b"1"), ("b", b"")), 1000),
        Record(None, b"keyless", (), 999),
        Record(b"k2", None, (), None),  # tombstone, timestamp "now"
        Record(b"", b"", (("\u00fcnicode", b"\x00\xff"),), 5),
    ]
    data, max_ts = encode_batch(40, records, now_ms=2000)
    assert max_ts == 2000
    header = parse_header(data)
    assert (header.base_offset, header.record_count, header.last_offset, header.max_timestamp) == (40, 4, 43, 2000)
    assert header.length == len(data)
    out = decode(data)
    assert [r.offset for r in out] == [40, 41, 42, 43]
    assert [(r.key, r.value, r.headers, r.timestamp_ms) for r in out] == [
        (b"k1", b"v1", (("a", b"1"), ("b", b"")), 1000),
        (None, b"keyless", (), 999),
        (b"k2", None, (), 2000),
        (b"", b"", (("\u00fcnicode", b"\x00\xff"),), 5),
    ]
    assert all((r.topic, r.partition) == ("t", 2) for r in out)


def test_min_offset_skips_earlier_records():
    data, _ = encode_batch(10, [Record(b"k", b"%d" % i) for i in range(5)], now_ms=1)
    assert [r.offset for r in decode(data, min_offset=13)] == [13, 14]


def test_headers_codec_round_trip():
    headers = (("x", b"1"), ("reason", b"bad \x00 bytes"))
    assert decode_headers(encode_headers(headers)) == headers


@pytest.mark.parametrize("position", [0, 5, 9, 12, 20, HEADER_SIZE + 3, -1])
def test_any_flipped_byte_fails_the_crc_or_the_header(position):
    data = bytearray(encode_batch(0, [Record(b"key", b"value" * 10)], now_ms=7)[0])
    data[position] ^= 0x41
    header = parse_header(bytes(data))
    assert header is None or header.length != len(data) or not crc_ok(bytes(data), 0, header)


def test_crc_covers_length_and_records():
    data = encode_batch(0, [Record(b"k", b"v")], now_ms=1)[0]
    header = parse_header(data)
    expected = zlib.crc32(data[8:], zlib.crc32(data[:4]))
    assert header.crc == expected


def test_parse_header_rejects_short_and_foreign_bytes():
    assert parse_header(b"") is None
    assert parse_header(b"\x00" * HEADER_SIZE) is None
    assert parse_header(b"x" * 100) is None


def test_sealed_sparse_batch_keeps_offset_span():
    # Compaction re-seals surviving records under the original base and last offset.
    data = seal_batch(100, 9, 0, 5, [])
    header = parse_header(data)
    assert (header.base_offset, header.last_offset, header.next_offset, header.record_count) == (100, 109, 110, 0)
    assert crc_ok(data, 0, header)


def test_decode_stops_at_record_and_byte_budgets_but_returns_at_least_one():
    data, _ = encode_batch(0, [Record(b"k", b"x" * 100) for _ in range(10)], now_ms=1)
    header = parse_header(data)
    out = []
    assert (
        decode_records(data, 0, header, topic="t", partition=0, min_offset=0, out=out, max_records=3, max_bytes=10**6)
        == -1
    )
    assert len(out) == 3
    out = []
    assert (
        decode_records(data, 0, header, topic="t", partition=0, min_offset=0, out=out, max_records=99, max_bytes=1)
        == -1
    )
    assert len(out) == 1
    out = []
    used = decode_records(
        data, 0, header, topic="t", partition=0, min_offset=8, out=out, max_records=99, max_bytes=10**6
    )
    assert [r.offset for r in out] == [8, 9] and used > 200
