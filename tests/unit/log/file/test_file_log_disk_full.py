"""A failed append (disk full) leaves nothing of its batch behind, and the next append works."""

import errno
import os

import pytest
from harness.topics import partition_records

from log.base import Record, TopicSpec
from log.errors import LogUnavailableError
from log.file import partition_writer
from log.file.backend import FileLog


def batch(i: int, n: int = 50) -> list[Record]:
    return [Record(b"k%d" % j, b"value-%d-%d" % (i, j) * 20) for j in range(n)]


def segment_bytes(root) -> int:
    return sum(p.stat().st_size for p in (root / "t" / "0").glob("*.log"))


def all_values(log: FileLog) -> list[bytes]:
    return [r.value for r in partition_records(log, "t", 0, offset=0)]


@pytest.fixture
def log(tmp_path):
    file_log = FileLog(tmp_path / "log", segment_bytes=1 << 20)
    file_log.create_topic(TopicSpec("t", partitions=1))
    yield file_log
    file_log.close()


def test_enospc_hook_fails_the_append_truncates_and_the_next_append_works(log, tmp_path, monkeypatch):
    flag = tmp_path / "disk-full"
    monkeypatch.setattr(partition_writer, "_ENOSPC_FLAG_FILE", str(flag))
    log.append("t", 0, batch(0))
    size = segment_bytes(tmp_path / "log")
    flag.touch()
    for attempt in range(3):
        with pytest.raises(LogUnavailableError, match="No space left on device") as caught:
            log.append("t", 0, batch(1))
        assert isinstance(caught.value.__cause__, OSError)
        assert caught.value.__cause__.errno == errno.ENOSPC
        assert segment_bytes(tmp_path / "log") == size, f"half a batch stayed on disk (attempt {attempt})"
        assert log.end_offset("t", 0) == 50
    flag.unlink()
    result = log.append("t", 0, batch(1))
    assert (result.base_offset, result.last_offset) == (50, 99)
    expected = [r.value for r in batch(0) + batch(1)]
    assert all_values(log) == expected
    # A fresh reader (another process would open it the same way) sees the same records.
    with FileLog(tmp_path / "log") as other:
        assert all_values(other) == expected


def test_failed_fsync_cuts_the_batch_and_its_index_entries(log, tmp_path, monkeypatch):
    log.append("t", 0, batch(0, n=200))  # > 4 KiB: the next batch gets an index entry
    directory = tmp_path / "log" / "t" / "0"
    before = {p.name: p.stat().st_size for p in directory.iterdir() if p.suffix in (".log", ".index", ".timeindex")}

    def full(_fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(partition_writer.os, "fdatasync", full)
    with pytest.raises(LogUnavailableError):
        log.append("t", 0, batch(1))
    after = {p.name: p.stat().st_size for p in directory.iterdir() if p.suffix in (".log", ".index", ".timeindex")}
    assert after == before
    monkeypatch.undo()
    log.append("t", 0, batch(2))
    assert all_values(log) == [r.value for r in batch(0, n=200) + batch(2)]
