"""The columnar read of the file backend (log.file.column_decoder): native decoder == Python twin == Log.read."""

import struct
import time
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import native
from log.base import Record, TopicSpec
from log.file import column_decoder
from log.file.backend import FileLog
from log.file.batch_codec import (
    HEADER,
    HEADER_SIZE,
    RECORD,
    crc_ok,
    encode_headers,
    parse_header,
    records_section,
    seal_batch,
)
from log.file.column_decoder import RecordsSection, decode_columns, record_columns
from log.file.segment import list_segments

HOUR = 3600 * 1000

needs_native = pytest.mark.skipif(
    native.speedups is None, reason="the extension is off (HEADWATER_NATIVE=0) or not built"
)


def _record_bytes(delta, ts, key, value, headers):
    hdr = encode_headers(headers)
    return (
        RECORD.pack(delta, ts, -1 if key is None else len(key), -1 if value is None else len(value), len(hdr))
        + (key or b"")
        + (value or b"")
        + hdr
    )


def _batch(base, rows, codec):
    """A sealed batch of ``rows`` (delta, ts, key, value, headers): plain, zstd, or the first format's zlib CRC."""
    parts = [_record_bytes(*row) for row in rows]
    last_delta = rows[-1][0]
    max_ts = max(row[1] for row in rows)
    if codec == "zlib":
        body = b"".join(parts)
        data = bytearray(HEADER.pack(HEADER_SIZE + len(body), 0, b"HWB1", 0, base, last_delta, len(rows), max_ts))
        data += body
        struct.pack_into("<I", data, 4, zlib.crc32(data[8:], zlib.crc32(data[:4])))
        return bytes(data)
    return bytes(seal_batch(base, last_delta, len(rows), max_ts, parts, compression=codec))


def _sections(batches):
    """Check and open each batch as decode_columns takes it (zstd ones decompressed)."""
    buf = b"".join(batches)
    out, pos = [], 0
    while pos < len(buf):
        header = parse_header(buf, pos)
        assert header is not None and crc_ok(buf, pos, header)
        data, start = records_section(buf, pos, header)
        stop = pos + header.length if data is buf else len(data)
        out.append(RecordsSection(data, start, stop, header.record_count, header.base_offset))
        pos += header.length
    return out


def _reference(batches_rows, min_offset, end_offset, max_records, max_bytes):
    """What the columnar decoder must select, written plainly."""
    rows, used, next_offset = [], 0, -1
    for base, batch in batches_rows:
        for delta, ts, key, value, headers in batch:
            offset = base + delta
            if offset < min_offset:
                continue
            if offset >= end_offset:
                return rows, end_offset
            used += len(_record_bytes(delta, ts, key, value, headers))
            if used > max_bytes and rows:
                return rows, offset
            rows.append((offset, ts, key, value))
            if len(rows) >= max_records:
                return rows, offset + 1
    return rows, next_offset


def _rows(decoded):
    columns = record_columns("t", 0, decoded)
    return list(
        zip(
            columns.offsets.to_pylist(),
            columns.timestamps_ms.to_pylist(),
            columns.keys.to_pylist(),
            columns.values.to_pylist(),
            strict=True,
        )
    )


maybe_bytes = st.one_of(st.none(), st.binary(max_size=12), st.just(b"x" * 80))  # x * 80: zstd stores it smaller
header_lists = st.lists(st.tuples(st.text(max_size=4), st.binary(max_size=4)), max_size=2)


@st.composite
def batch_lists(draw):
    """Batches with ascending offsets, gaps inside (as compaction leaves) and between them."""
    batches, base = [], draw(st.integers(0, 5))
    for _ in range(draw(st.integers(0, 4))):
        rows, delta = [], 0
        for _ in range(draw(st.integers(1, 6))):
            delta += draw(st.integers(0, 3))
            ts = draw(st.integers(-(1 << 40), 1 << 45))
            rows.append((delta, ts, draw(maybe_bytes), draw(maybe_bytes), draw(header_lists)))
            delta += 1
        codec = draw(st.sampled_from(["none", "zstd", "zlib"]))
        batches.append((base, rows, codec))
        base += rows[-1][0] + 1 + draw(st.integers(0, 3))
    return batches


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batches=batch_lists(),
    min_offset=st.integers(0, 30),
    span=st.integers(0, 40),
    max_records=st.integers(0, 30),
    max_bytes=st.integers(0, 400),
)
def test_native_and_python_decoders_select_the_same_records(batches, min_offset, span, max_records, max_bytes):
    sections = _sections([_batch(base, rows, codec) for base, rows, codec in batches])
    end_offset = min_offset + span
    python = column_decoder._decode_columns_python(sections, min_offset, end_offset, max_records, max_bytes)
    expected_rows, expected_next = _reference(
        [(base, rows) for base, rows, _ in batches], min_offset, end_offset, max_records, max_bytes
    )
    if max_records == 0:
        expected_rows, expected_next = [], min_offset
    assert _rows(python) == expected_rows
    assert python.next_offset == expected_next
    if native.speedups is not None:
        assert native.speedups.decode_columns(sections, min_offset, end_offset, max_records, max_bytes) == tuple(python)


def test_columns_are_arrow_arrays_with_nulls_where_keys_and_values_are_missing():
    rows = [(0, 5, None, b'{"a":1}', ()), (1, 6, b"k", None, (("h", b"v"),)), (3, 7, b"", b"", ())]
    decoded = decode_columns(
        _sections([_batch(10, rows, "none")]), min_offset=0, end_offset=100, max_records=100, max_bytes=1 << 20
    )
    columns = record_columns("t", 2, decoded)
    assert len(columns) == 3
    assert columns.offsets.to_pylist() == [10, 11, 13]
    assert columns.keys.to_pylist() == [None, b"k", b""]
    assert columns.values.to_pylist() == [b'{"a":1}', None, b""]
    assert decoded.next_offset == -1
    records = columns.to_records()
    assert [(r.topic, r.partition, r.offset, r.timestamp_ms) for r in records] == [
        ("t", 2, 10, 5),
        ("t", 2, 11, 6),
        ("t", 2, 13, 7),
    ]


@pytest.mark.parametrize("decoder", ["python", pytest.param("native", marks=needs_native)])
def test_records_running_past_their_section_are_refused(decoder):
    batch = _batch(0, [(0, 1, b"key", b"value", ())], "none")
    header = parse_header(batch)
    cut = RecordsSection(batch, HEADER_SIZE, header.length - 2, 1, 0)
    decode = (
        native.speedups.decode_columns if decoder == "native" else column_decoder._decode_columns_python  # type: ignore[union-attr]
    )
    with pytest.raises(ValueError, match="batch at offset 0: its records run past the batch's end"):
        decode([cut], 0, 10, 10, 1 << 20)


# --------------------------------------------------------------------------- FileLog.read_columns


def read_all_columns(log, topic, partition, start, end, chunk):
    """``[start, end)`` through read_columns, as read_range loops over read."""
    rows, offset, calls = [], start, 0
    while offset < end:
        columns, resume = log.read_columns(topic, partition, offset, end, max_records=chunk)
        calls += 1
        assert len(columns) <= chunk
        rows += [(r.offset, r.timestamp_ms, r.key, r.value) for r in columns.to_records()]
        if resume <= offset:
            break
        offset = resume
    return rows


def read_all_records(log, topic, partition, start, end):
    records = log.read(topic, partition, start, max_records=1_000_000, max_bytes=1 << 40)
    return [(r.offset, r.timestamp_ms, r.key, r.value) for r in records if r.offset < end]


def _fill(log, topic, batches, ts=1_700_000_000_000):
    for b in range(batches):
        batch = []
        for j in range(1 + b % 7):
            n = b * 10 + j
            key = None if n % 11 == 0 else b"key-%d" % (n % 9)
            value = None if n % 5 == 0 else b'{"n": %d}' % n + b"." * (n % 30)
            batch.append(Record(key, value, (("hw", b"%d" % n),) if n % 3 == 0 else (), ts + n))
        log.append(topic, 0, batch)


def test_read_columns_gives_the_records_read_gives(file_log):
    file_log.create_topic(TopicSpec("c", partitions=1, min_compaction_lag_ms=0, delete_retention_ms=HOUR))
    _fill(file_log, "c", 60)
    file_log.compact("c")  # keeps the latest per key: gaps inside and between batches, segments merged
    _fill(file_log, "c", 5, ts=1_800_000_000_000)
    end = file_log.end_offset("c", 0)
    assert len(read_all_records(file_log, "c", 0, 0, end)) < end  # compaction left gaps
    for start, stop, chunk in [(0, end, 10_000), (0, end, 1), (3, end - 4, 7), (17, 18, 5), (end, end, 3), (0, 1, 1)]:
        assert read_all_columns(file_log, "c", 0, start, stop, chunk) == read_all_records(file_log, "c", 0, start, stop)


def test_read_columns_before_retention_starts_at_the_first_record_held(file_log):
    file_log.create_topic(TopicSpec("r", partitions=1, compacted=False, retention_ms=HOUR))
    now = int(time.time() * 1000)
    for i in range(40):
        file_log.append("r", 0, [Record(b"k", b"x" * 50, (), now - 2 * HOUR if i < 20 else now) for _ in range(5)])
    file_log.compact("r")
    first = file_log.beginning_offset("r", 0)
    assert first > 0
    assert list_segments(file_log.root / "r" / "0")[0][0] == first
    rows = read_all_columns(file_log, "r", 0, 0, 200, 33)
    assert [row[0] for row in rows] == list(range(first, 200))
    assert rows == read_all_records(file_log, "r", 0, 0, 200)


def test_read_columns_stops_at_the_end_of_the_partition(file_log, topic):
    file_log.append(topic, 1, [Record(b"a", b"1"), Record(b"b", b"2")])
    columns, resume = file_log.read_columns(topic, 1, 1, 1 << 40)
    assert (columns.offsets.to_pylist(), resume) == ([1], 2)
    columns, resume = file_log.read_columns(topic, 1, 2, 1 << 40)
    assert (len(columns), resume) == (0, 2)
    columns, resume = file_log.read_columns(topic, 0, 0, 10)
    assert (len(columns), resume) == (0, 0)


def test_first_format_batches_read_as_columns(tmp_path):
    root = tmp_path / "log"
    FileLog(root, compression="none").create_topic(TopicSpec("t", partitions=1))
    segment = root / "t" / "0" / "00000000000000000000.log"
    segment.write_bytes(_batch(0, [(0, 3, b"a", b"1", ()), (1, 3, b"b", None, ())], "zlib"))
    log = FileLog(root, compression="zstd")
    try:
        log.append("t", 0, [Record(b"c", b"3" * 200, (), 9), Record(None, b"4" * 200, (), 9)])
        assert parse_header(segment.read_bytes()).attributes == 0
        assert read_all_columns(log, "t", 0, 0, 4, 10) == [
            (0, 3, b"a", b"1"),
            (1, 3, b"b", None),
            (2, 9, b"c", b"3" * 200),
            (3, 9, None, b"4" * 200),
        ]
    finally:
        log.close()
