"""Torn tails are truncated on open; damage anywhere else is an error naming file and byte.

A torn tail is what a writer that died mid-append leaves: its last batch was never
acknowledged, so the partition's recovery point does not cover it. ``write_batches``
and ``write_compressed`` leave that state with ``unacknowledged=1`` (see
test_recovery_point.py for damage inside acknowledged bytes).
"""

import logging
import os

import pytest
from harness.topics import partition_records

from log.base import Record
from log.errors import CorruptLogError
from log.file.backend import FileLog
from log.file.batch_codec import parse_header
from log.file.recovery_point import recovery_point_path
from log.file.segment import list_segments
from log.file.segment_index import index_path, time_index_path


def batch(i, n=5):
    return [Record(b"k%d" % j, b"batch-%d-%d" % (i, j) * 3) for j in range(n)]


def batch_positions(path):
    data = path.read_bytes()
    positions, pos = [], 0
    while pos < len(data):
        positions.append(pos)
        pos += parse_header(data, pos).length
    return positions


def write_batches(root, count, *, segment_bytes=1 << 20, unacknowledged=0, make=batch):
    """Append ``count`` batches; the last ``unacknowledged`` are left out of the recovery point.

    That is the state on disk of a writer that died right after writing them: the
    recovery point still says what a clean close after the others said.
    """
    from log.base import TopicSpec

    log = FileLog(root, segment_bytes=segment_bytes, compression="zstd" if make is compressible else "none")
    log.create_topic(TopicSpec("t", partitions=1))
    for i in range(count - unacknowledged):
        log.append("t", 0, make(i))
    log.close()
    point = recovery_point_path(root / "t" / "0")
    acknowledged = point.read_bytes()
    log = FileLog(root, segment_bytes=segment_bytes, compression="zstd" if make is compressible else "none")
    for i in range(count - unacknowledged, count):
        log.append("t", 0, make(i))
    log.close()
    point.write_bytes(acknowledged)
    return list_segments(root / "t" / "0")


def offsets(root):
    log = FileLog(root)
    try:
        return [r.offset for r in partition_records(log, "t", 0, offset=0)]
    finally:
        log.close()


@pytest.mark.parametrize("cut_into", [1, 10, 37, 60, -1])
def test_torn_tail_is_truncated_with_a_warning(tmp_path, caplog, cut_into):
    root = tmp_path / "log"
    [(_, path)] = write_batches(root, 4, unacknowledged=1)
    last = batch_positions(path)[-1]
    size = path.stat().st_size
    cut = last + cut_into if cut_into > 0 else size - 1
    os.truncate(path, cut)
    with caplog.at_level(logging.WARNING, logger="log.file.partition_writer"):
        log = FileLog(root)
        assert log.end_offset("t", 0) == 15
    assert path.stat().st_size == last
    assert any(str(path) in m and f"byte {last}" in m for m in caplog.messages)
    assert log.append("t", 0, batch(9)).base_offset == 15
    log.close()
    assert offsets(root) == list(range(20))


def test_garbage_after_last_batch_is_a_torn_tail(tmp_path, caplog):
    root = tmp_path / "log"
    [(_, path)] = write_batches(root, 3)
    size = path.stat().st_size
    with open(path, "ab") as fh:
        fh.write(b"\x00" * 100)  # e.g. a file system that extended the file but lost the data
    assert offsets(root) == list(range(15))
    assert path.stat().st_size == size


def test_reader_does_not_truncate_under_a_live_writer(tmp_path):
    root = tmp_path / "log"
    write_batches(root, 2)
    writer = FileLog(root)
    writer.append("t", 0, batch(2))
    [(_, path)] = list_segments(root / "t" / "0")
    with open(path, "ab") as fh:
        fh.write(b"\x01" * 10)  # what a reader sees while a write is in flight
    reader = FileLog(root)
    assert len(reader.read("t", 0, 0)) == 15
    assert path.stat().st_size > 0 and path.read_bytes().endswith(b"\x01" * 10)
    reader.close()
    writer.close()


@pytest.mark.parametrize("where", ["crc", "length", "magic"])
def test_corrupt_batch_in_the_middle_raises_naming_file_and_position(tmp_path, where):
    root = tmp_path / "log"
    [(_, path)] = write_batches(root, 5)
    victim = batch_positions(path)[2]
    data = bytearray(path.read_bytes())
    flip = {"crc": victim + 60, "length": victim + 1, "magic": victim + 9}[where]
    data[flip] ^= 0x5A
    path.write_bytes(bytes(data))
    log = FileLog(root)
    # Opening the partition checks its active segment: the damage is reported, not truncated.
    with pytest.raises(CorruptLogError) as info:
        log.read("t", 0, 0, max_records=100)
    assert info.value.path == str(path)
    assert info.value.position == victim
    assert str(path) in str(info.value) and f"byte {victim}" in str(info.value)
    with pytest.raises(CorruptLogError):
        log.append("t", 0, batch(99))
    assert path.read_bytes() == bytes(data)
    log.close()


def test_corrupt_batch_seen_by_a_reader_under_a_live_writer_raises(tmp_path):
    root = tmp_path / "log"
    write_batches(root, 5)
    writer = FileLog(root)
    writer.append("t", 0, batch(5))
    [(_, path)] = list_segments(root / "t" / "0")
    victim = batch_positions(path)[3]
    with open(path, "r+b") as fh:
        fh.seek(victim + 50)
        fh.write(b"\xff\xfe")
    reader = FileLog(root)
    assert [r.offset for r in reader.read("t", 0, 0, max_records=15)] == list(range(15))
    with pytest.raises(CorruptLogError) as info:
        reader.read("t", 0, 15)
    assert (info.value.path, info.value.position) == (str(path), victim)
    reader.close()
    writer.close()


def test_corrupt_tail_of_a_closed_segment_raises(tmp_path):
    root = tmp_path / "log"
    segments = write_batches(root, 30, segment_bytes=1024)
    assert len(segments) > 2
    _, closed = segments[0]
    last = batch_positions(closed)[-1]
    os.truncate(closed, last + 20)
    log = FileLog(root)
    with pytest.raises(CorruptLogError) as info:
        log.read("t", 0, 0, max_records=10_000)
    assert info.value.path == str(closed) and info.value.position == last
    log.close()


def test_missing_or_stale_indexes_are_rebuilt(tmp_path):
    root = tmp_path / "log"
    segments = write_batches(root, 200, segment_bytes=8 * 1024)
    expected = offsets(root)
    _, first = segments[0]
    index_path(first).unlink()
    time_index_path(first).write_bytes(b"")
    _, second = segments[1]
    index_path(second).write_bytes(index_path(segments[2][1]).read_bytes())  # someone else's index
    assert offsets(root) == expected
    log = FileLog(root)
    assert [r.offset for r in log.read("t", 0, segments[1][0] + 7, max_records=2)] == [
        segments[1][0] + 7,
        segments[1][0] + 8,
    ]
    log.close()


def compressible(i, n=50):
    return [Record(b"k%d" % j, b'{"after": {"id": %d, "batch": %d, "pad": "........"}}' % (j, i)) for j in range(n)]


def write_compressed(root, count, *, unacknowledged=0):
    [(_, path)] = write_batches(root, count, unacknowledged=unacknowledged, make=compressible)
    data = path.read_bytes()
    assert all(parse_header(data, pos).attributes & 0x07 == 4 for pos in batch_positions(path))
    return path


@pytest.mark.parametrize("cut_into", [1, 40, 45, -1])
def test_torn_compressed_tail_is_truncated_on_open(tmp_path, caplog, cut_into):
    root = tmp_path / "log"
    path = write_compressed(root, 4, unacknowledged=1)
    last = batch_positions(path)[-1]
    os.truncate(path, last + cut_into if cut_into > 0 else path.stat().st_size - 1)
    with caplog.at_level(logging.WARNING, logger="log.file.partition_writer"):
        log = FileLog(root, compression="zstd")
        assert log.end_offset("t", 0) == 150
    assert path.stat().st_size == last
    assert any(f"byte {last}" in m for m in caplog.messages)
    assert log.append("t", 0, compressible(9)).base_offset == 150
    log.close()
    assert offsets(root) == list(range(200))


def test_corrupted_compressed_batch_is_a_crc_error_not_a_codec_crash(tmp_path):
    root = tmp_path / "log"
    path = write_compressed(root, 5)
    victim = batch_positions(path)[2]
    data = bytearray(path.read_bytes())
    data[victim + 60] ^= 0x5A  # inside the zstd frame
    path.write_bytes(bytes(data))
    log = FileLog(root, compression="zstd")
    with pytest.raises(CorruptLogError) as info:
        log.read("t", 0, 0, max_records=1000)
    assert (info.value.path, info.value.position) == (str(path), victim)
    log.close()
