import struct
import zlib

import crc32c as crc32c_package
import pytest
from hypothesis import given
from hypothesis import strategies as st

import native
from log.base import Record
from log.file import batch_codec
from log.file.batch_codec import (
    ATTR_CRC32C,
    HEADER,
    HEADER_SIZE,
    EncodedBatch,
    crc32c_python,
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


def test_crc_is_crc32c_of_length_and_everything_after_the_crc_field():
    data = encode_batch(0, [Record(b"k", b"v")], now_ms=1)[0]
    header = parse_header(data)
    assert header.attributes == ATTR_CRC32C
    assert header.crc == crc32c_package.crc32c(data[8:], crc32c_package.crc32c(data[:4]))


def _zlib_batch(base_offset, records, now_ms):
    """A batch as the first format wrote it (attributes 0, zlib CRC-32): built here, not by the codec."""
    parts = []
    for delta, record in enumerate(records):
        key, value = record.key, record.value
        parts.append(struct.pack("<Iqiii", delta, now_ms, len(key), len(value), 0) + key + value)
    body = b"".join(parts)
    header = HEADER.pack(HEADER_SIZE + len(body), 0, b"HWB1", 0, base_offset, len(records) - 1, len(records), now_ms)
    data = bytearray(header + body)
    struct.pack_into("<I", data, 4, zlib.crc32(data[8:], zlib.crc32(data[:4])))
    return bytes(data)


def test_batches_of_the_first_format_with_zlib_crc_still_read():
    data = _zlib_batch(7, [Record(b"k1", b"v1"), Record(b"k2", b"v2")], now_ms=5)
    header = parse_header(data)
    assert header.attributes == 0
    assert [(r.offset, r.key, r.value, r.timestamp_ms) for r in decode(data)] == [
        (7, b"k1", b"v1", 5),
        (8, b"k2", b"v2", 5),
    ]
    damaged = bytearray(data)
    damaged[-1] ^= 1
    assert not crc_ok(bytes(damaged), 0, parse_header(bytes(damaged)))
    # The same bytes claiming CRC-32C fail: the attribute picks the check.
    relabelled = bytearray(data)
    struct.pack_into("<H", relabelled, 12, ATTR_CRC32C)
    assert not crc_ok(bytes(relabelled), 0, parse_header(bytes(relabelled)))


def test_old_format_segment_reads_through_the_file_log_and_takes_new_appends(tmp_path):
    from log.base import TopicSpec
    from log.file.backend import FileLog

    log = FileLog(tmp_path / "log", fsync="always")
    log.create_topic(TopicSpec("t", partitions=1))
    log.close()
    segment = tmp_path / "log" / "t" / "0" / "00000000000000000000.log"
    assert segment.exists()
    segment.write_bytes(_zlib_batch(0, [Record(b"a", b"1"), Record(b"b", b"2")], now_ms=3))
    log = FileLog(tmp_path / "log", fsync="always")
    try:
        log.append("t", 0, [Record(b"c", b"3")])
        assert [(r.offset, r.key) for r in log.read("t", 0, 0)] == [(0, b"a"), (1, b"b"), (2, b"c")]
    finally:
        log.close()


def test_unknown_attribute_bits_are_no_batch():
    data = bytearray(encode_batch(0, [Record(b"k", b"v")], now_ms=1)[0])
    struct.pack_into("<H", data, 12, ATTR_CRC32C | 0x0001)
    assert parse_header(bytes(data)) is None


@given(st.binary(max_size=300), st.integers(0, 2**32 - 1), st.integers(0, 40))
def test_crc32c_implementations_agree(data, value, cut):
    expected = crc32c_package.crc32c(data, value)
    assert crc32c_python(data, value) == expected
    assert batch_codec.crc32c(data, value) == expected
    assert crc32c_python(data[cut:], crc32c_python(data[:cut], value)) == expected  # chained as zlib.crc32
    if native.speedups is not None:
        assert native.speedups.crc32c(data, value) == expected
        assert native.speedups.crc32c(data, value, True) == expected  # the portable tables


def test_crc32c_of_large_inputs_hardware_and_tables():
    data = bytes(range(256)) * 4099  # > 64 KiB: the GIL is released
    expected = crc32c_package.crc32c(data)
    assert batch_codec.crc32c(data, 0) == expected
    if native.speedups is not None:
        assert native.speedups.crc32c(memoryview(data)[3:], 0, True) == crc32c_package.crc32c(data[3:])


def test_encoded_batch_seals_as_encode_batch_writes(monkeypatch):
    records = [Record(b"k%d" % i, b"value %d" % i, (), 1234) for i in range(5)]
    expected, _ = encode_batch(50, records, now_ms=1)
    body = expected[HEADER_SIZE:]
    for use_native in (True, False):
        if not use_native:
            monkeypatch.setattr(batch_codec, "_native", None)
        encoded = EncodedBatch(bytearray(HEADER_SIZE) + body, 5, 1234)
        assert len(encoded) == 5
        assert encode_batch(50, encoded, now_ms=99) == (expected, 1234)
        # sealed again at another base (an append retried after a failure)
        assert parse_header(encode_batch(60, encoded, now_ms=99)[0]).base_offset == 60


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


# -- compressed batches (attributes bits 0-2 = 4: zstd) -------------------------------------

_records = st.lists(
    st.builds(
        Record,
        st.none() | st.binary(max_size=40),
        st.none() | st.binary(max_size=300) | st.sampled_from([b"x" * 500, b'{"after": {"id": 1}}' * 20]),
        st.lists(st.tuples(st.text(max_size=8), st.binary(max_size=20)), max_size=2).map(tuple),
        st.none() | st.integers(min_value=0, max_value=1 << 50),
    ),
    min_size=1,
    max_size=40,
)


@given(records=_records, base=st.integers(min_value=0, max_value=1 << 40))
def test_compressed_batches_round_trip(records, base):
    plain, plain_ts = encode_batch(base, records, now_ms=77)
    data, max_ts = encode_batch(base, records, now_ms=77, compression="zstd")
    header = parse_header(bytes(data))
    assert max_ts == plain_ts and header.length == len(data)
    # Stored compressed exactly when that is smaller; either way the records read back the same.
    assert bool(header.attributes & batch_codec.ATTR_CODEC) == (len(data) < len(plain))
    if header.attributes & batch_codec.ATTR_CODEC:
        assert header.attributes == ATTR_CRC32C | batch_codec.CODEC_ZSTD
    assert decode(bytes(data)) == decode(bytes(plain))
    assert (header.base_offset, header.record_count, header.max_timestamp) == (base, len(records), max_ts)


def _compressible(n, base=0):
    return [Record(b"key-%d" % i, b'{"before": null, "after": {"id": %d, "name": "same"}}' % i) for i in range(n)]


def test_compressed_batch_keeps_a_plain_header_and_is_smaller():
    records = _compressible(200)
    plain, _ = encode_batch(5, records, now_ms=1)
    data, _ = encode_batch(5, records, now_ms=1, compression="zstd")
    assert len(data) * 4 < len(plain)
    assert bytes(data[8:12]) == b"HWB1"
    assert struct.unpack_from("<H", data, 12)[0] == ATTR_CRC32C | 4  # Kafka's zstd codec number
    assert [r.offset for r in decode(bytes(data), min_offset=150)] == list(range(150, 205))


def test_a_batch_that_would_not_shrink_is_stored_plain():
    data, _ = encode_batch(0, [Record(b"k", b"v")], now_ms=1, compression="zstd")
    assert parse_header(bytes(data)).attributes == ATTR_CRC32C


def test_corrupted_compressed_batch_fails_its_crc_before_any_decompression():
    data, _ = encode_batch(0, _compressible(100), now_ms=1, compression="zstd")
    assert parse_header(bytes(data)).attributes & batch_codec.ATTR_CODEC
    for position in (HEADER_SIZE + 1, HEADER_SIZE + 6, len(data) // 2, len(data) - 1):
        damaged = bytearray(data)
        damaged[position] ^= 0x40
        header = parse_header(bytes(damaged))
        assert header is not None and not crc_ok(bytes(damaged), 0, header)


def test_a_compressed_batch_that_passes_its_crc_but_does_not_decompress_is_a_value_error():
    # Only a writer bug makes one: the reader says so instead of crashing in the codec.
    data, _ = encode_batch(0, _compressible(100), now_ms=1, compression="zstd")
    wrong = bytearray(data)
    struct.pack_into("<I", wrong, HEADER_SIZE, 12345)  # a wrong plain length, CRC recomputed
    struct.pack_into("<I", wrong, 4, batch_codec.batch_crc(wrong, len(wrong), ATTR_CRC32C | 4))
    with pytest.raises(ValueError, match="do not decompress"):
        decode(bytes(wrong))


def test_unknown_codec_is_no_batch():
    data = bytearray(encode_batch(0, _compressible(50), now_ms=1, compression="zstd")[0])
    for codec in (1, 2, 3, 5, 7):  # gzip, snappy, lz4, and numbers no codec has
        struct.pack_into("<H", data, 12, ATTR_CRC32C | codec)
        assert parse_header(bytes(data)) is None


def test_encoded_batch_compressed_seals_like_the_record_path():
    records = _compressible(60)
    plain, _ = encode_batch(0, records, now_ms=1)
    body = bytes(plain[HEADER_SIZE:])
    encoded = EncodedBatch(bytearray(HEADER_SIZE) + body, 60, 1).compressed("zstd")
    assert encoded.codec == batch_codec.CODEC_ZSTD
    assert encoded.compressed("zstd") is encoded
    sealed = encode_batch(40, encoded, now_ms=99)[0]
    assert sealed == encode_batch(40, records, now_ms=1, compression="zstd")[0]
    assert [r.offset for r in decode(bytes(sealed))] == list(range(40, 100))
    assert EncodedBatch(bytearray(HEADER_SIZE) + body, 60, 1).compressed("none").codec == 0


def test_plain_zlib_and_compressed_batches_read_from_one_segment(tmp_path):
    from log.base import TopicSpec
    from log.file.backend import FileLog

    root = tmp_path / "log"
    FileLog(root, compression="none").create_topic(TopicSpec("t", partitions=1))
    segment = root / "t" / "0" / "00000000000000000000.log"
    segment.write_bytes(_zlib_batch(0, [Record(b"a", b"1"), Record(b"b", b"2")], now_ms=3))
    plain = FileLog(root, compression="none")
    plain.append("t", 0, _compressible(30))
    plain.close()
    log = FileLog(root, compression="zstd")
    try:
        log.append("t", 0, _compressible(30))
        attributes = []
        data, pos = segment.read_bytes(), 0
        while pos < len(data):
            header = parse_header(data, pos)
            attributes.append(header.attributes)
            pos += header.length
        assert attributes == [0, ATTR_CRC32C, ATTR_CRC32C | 4]
        got = log.read("t", 0, 0, max_records=1000)
        assert [r.offset for r in got] == list(range(62))
        assert [r.key for r in got[2:]] == [r.key for r in _compressible(30)] * 2
        at = got[40].timestamp_ms
        assert log.offset_for_time("t", 0, at) == min(r.offset for r in got if r.timestamp_ms >= at)
    finally:
        log.close()


NATIVE_ZSTD = native.speedups is not None and native.speedups.zstd_version() is not None


@pytest.mark.skipif(not NATIVE_ZSTD, reason="the extension found no libzstd (libzstd.so.1): pyarrow's codec only")
@given(st.binary(max_size=5000), st.integers(1, 40))
def test_the_extensions_zstd_frames_and_pyarrows_read_each_other(data, repeat):
    import pyarrow as pa

    plain = data * repeat
    codec = pa.Codec("zstd", compression_level=batch_codec.ZSTD_LEVEL)
    mine = native.speedups.zstd_compress(plain, batch_codec.ZSTD_LEVEL)
    theirs = codec.compress(plain, asbytes=True)
    assert codec.decompress(mine, decompressed_size=len(plain), asbytes=True) == plain
    assert native.speedups.zstd_decompress(theirs, len(plain)) == plain
    assert native.speedups.zstd_decompress(mine, len(plain)) == plain
    for wrong in (len(plain) + 1, max(len(plain) - 1, 0) if plain else 1):
        with pytest.raises(ValueError):
            native.speedups.zstd_decompress(mine, wrong)
    with pytest.raises(ValueError):
        native.speedups.zstd_decompress(b"no frame", 10)
