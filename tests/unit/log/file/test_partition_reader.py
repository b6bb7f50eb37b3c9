"""A read stopping inside a compressed batch keeps its plain records for the next, only for the same bytes."""

import shutil

from log.base import Record, TopicSpec
from log.file import batch_codec, partition_reader
from log.file.backend import FileLog
from log.file.segment import list_segments


def _fill(root, tag):
    log = FileLog(root, compression="zstd")
    log.create_topic(TopicSpec("t", partitions=1))
    # Fixed timestamps: two fills then differ only in their tag's byte, so their compressed
    # batches have the same length (stamped "now", a loaded machine's clock ticking during one
    # fill and not the other changed it: 3079 against 2963 bytes, seen in CI).
    records = [
        Record(b"k%03d" % i, b"%s-%03d " % (tag, i) * 20, timestamp_ms=1_700_000_000_000 + i) for i in range(100)
    ]
    log.append("t", 0, records)
    return log


def _chunks(log, size):
    out, offset = [], 0
    while chunk := log.read("t", 0, offset, max_records=size):
        out.extend(chunk)
        offset = chunk[-1].offset + 1
    return out


def test_reads_in_chunks_decompress_a_batch_once(tmp_path, monkeypatch):
    log = _fill(tmp_path / "log", b"a")
    whole = log.read("t", 0, 0, max_records=1000)
    calls = []
    decompress = batch_codec._zstd_decompress
    monkeypatch.setattr(batch_codec, "_zstd_decompress", lambda *a: calls.append(1) or decompress(*a))
    assert _chunks(log, 7) == whole
    assert [r.offset for r in whole] == list(range(100))
    assert len(calls) == 1
    log.close()


def test_a_batch_larger_than_the_bound_is_not_kept(tmp_path, monkeypatch):
    log = _fill(tmp_path / "log", b"a")  # ~16 kB decompressed
    whole = log.read("t", 0, 0, max_records=1000)
    monkeypatch.setattr(partition_reader, "HELD_MAX_BYTES", 4096)
    calls = []
    decompress = batch_codec._zstd_decompress
    monkeypatch.setattr(batch_codec, "_zstd_decompress", lambda *a: calls.append(1) or decompress(*a))
    assert _chunks(log, 50) == whole
    assert len(calls) == 2  # decompressed by each read
    log.close()


def test_a_batch_rewritten_in_place_is_read_again(tmp_path):
    log = _fill(tmp_path / "a", b"a")
    other = _fill(tmp_path / "b", b"b")
    first = log.read("t", 0, 0, max_records=7)  # stops inside the batch: its plain records are held
    assert first[0].value.startswith(b"a-000")
    [(_, mine)] = list_segments(tmp_path / "a" / "t" / "0")
    [(_, theirs)] = list_segments(tmp_path / "b" / "t" / "0")
    # Same offsets, same length, other bytes (as a rewrite of the segment could leave).
    assert mine.stat().st_size == theirs.stat().st_size
    shutil.copyfile(theirs, mine)
    rest = log.read("t", 0, 7, max_records=1000)
    assert [r.offset for r in rest] == list(range(7, 100))
    assert all(r.value.startswith(b"b-") for r in rest)
    log.close()
    other.close()
