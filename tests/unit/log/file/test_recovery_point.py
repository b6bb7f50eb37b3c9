"""The recovery point: bytes of the active segment acknowledged before a crash are never forgiven.

A writer that dies is a forked child that appends and leaves with ``os._exit`` (no close,
as after SIGKILL: the kernel drops its writer lock). Damage is done to the files between
runs, as bit rot or a stray write would.
"""

import logging
import os
import shutil

import pytest
from harness.topics import partition_records

from log.base import Record, TopicSpec
from log.errors import CorruptLogError
from log.file import partition_writer
from log.file.backend import FileLog
from log.file.recovery_point import RecoveryPoint, load_recovery_point, recovery_point_path
from log.file.segment import list_segments
from tests.unit.log.file.test_file_log_recovery import batch, batch_positions


def partition_dir(root):
    return root / "t" / "0"


def active(root):
    return list_segments(partition_dir(root))[-1]


def create(root, **options):
    with FileLog(root, **options) as log:
        log.create_topic(TopicSpec("t", partitions=1, min_compaction_lag_ms=0, delete_retention_ms=0))


def append_and_close(root, batches, first=0, **options):
    with FileLog(root, **options) as log:
        for i in range(first, first + batches):
            log.append("t", 0, batch(i))


def die_after_appending(root, record_batches, *, interval=None, **options):
    """Append ``record_batches`` to t/0 in a child process that then dies without closing the log."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            if interval is not None:
                partition_writer.RECOVERY_POINT_INTERVAL_S = interval
            log = FileLog(root, **options)
            for records in record_batches:
                log.append("t", 0, records)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def append_and_die(root, batches, first=0, *, interval=None, **options):
    die_after_appending(root, [batch(i) for i in range(first, first + batches)], interval=interval, **options)


def offsets(root):
    with FileLog(root) as log:
        return [r.offset for r in partition_records(log, "t", 0, offset=0)]


def flip(path, position):
    with open(path, "r+b") as fh:
        fh.seek(position)
        byte = fh.read(1)
        fh.seek(position)
        fh.write(bytes([byte[0] ^ 0x5A]))


@pytest.fixture
def root(tmp_path):
    root = tmp_path / "log"
    create(root)
    return root


# -- what is recorded ---------------------------------------------------------------------------


def test_clean_close_records_the_end_of_the_active_segment(root):
    append_and_close(root, 4)
    _, path = active(root)
    assert load_recovery_point(partition_dir(root)) == RecoveryPoint(0, path.stat().st_ino, path.stat().st_size)


def test_appends_update_it_lazily_not_with_a_second_fsync_each(root, monkeypatch):
    synced = []
    real = os.fdatasync
    monkeypatch.setattr(partition_writer.os, "fdatasync", lambda fd: (synced.append(fd), real(fd))[1])
    with FileLog(root) as log:
        for i in range(20):
            log.append("t", 0, batch(i))
        assert len(synced) == 20  # one per append: the point waits for RECOVERY_POINT_INTERVAL_S
        assert load_recovery_point(partition_dir(root)) is None
    assert len(synced) == 21  # the clean close


def test_an_append_after_the_interval_moves_it_to_the_acknowledged_end(root, monkeypatch):
    monkeypatch.setattr(partition_writer, "RECOVERY_POINT_INTERVAL_S", 0.0)
    _, path = active(root)
    with FileLog(root) as log:
        for i in range(3):
            log.append("t", 0, batch(i))
            assert load_recovery_point(partition_dir(root)).end == path.stat().st_size


def test_readers_never_create_or_write_it(root):
    append_and_close(root, 3)
    recovery_point_path(partition_dir(root)).unlink()  # a log from before recovery points
    assert offsets(root) == list(range(15))  # opening recovers the partition, as a reader
    assert not recovery_point_path(partition_dir(root)).exists()


def test_fsync_never_writes_no_recovery_point(root):
    append_and_close(root, 3, fsync="never")
    assert not recovery_point_path(partition_dir(root)).exists()


# -- damage before it is an error, and nothing is truncated ---------------------------------------


@pytest.mark.parametrize("batches", [4, 1])
def test_damage_inside_acknowledged_bytes_of_the_active_segment_raises_and_truncates_nothing(root, batches):
    append_and_close(root, batches)
    _, path = active(root)
    victim = batch_positions(path)[-1]  # nothing valid follows it: without the point, a torn tail
    flip(path, victim + 30)
    damaged = path.read_bytes()
    log = FileLog(root)
    with pytest.raises(CorruptLogError) as info:
        log.read("t", 0, 0)
    message = str(info.value)
    assert (info.value.path, info.value.position) == (str(path), victim)
    assert f"byte {victim}" in message and "acknowledged" in message
    assert str(recovery_point_path(path.parent)) in message and "\n" not in message
    with pytest.raises(CorruptLogError):
        log.append("t", 0, batch(99))
    log.close()
    assert path.read_bytes() == damaged


@pytest.mark.parametrize("cut", ["mid batch", "at a batch boundary", "empty"])
def test_an_active_segment_cut_short_of_the_recovery_point_raises(root, cut):
    append_and_close(root, 4)
    _, path = active(root)
    last = batch_positions(path)[-1]
    size = {"mid batch": last + 17, "at a batch boundary": last, "empty": 0}[cut]
    os.truncate(path, size)
    with FileLog(root) as log, pytest.raises(CorruptLogError, match=f"the file was cut to {size} bytes") as info:
        log.end_offset("t", 0)
    assert info.value.path == str(path)
    assert path.stat().st_size == size


def test_a_missing_active_segment_named_by_the_recovery_point_raises(tmp_path):
    root = tmp_path / "log"
    create(root, segment_bytes=1024)
    append_and_close(root, 30, segment_bytes=1024)
    base, path = active(root)
    assert base > 0 and load_recovery_point(partition_dir(root)).segment_base == base
    for suffix in (".log", ".index", ".timeindex"):
        path.with_suffix(suffix).unlink()
    with FileLog(root) as log, pytest.raises(CorruptLogError, match="missing") as info:
        log.read("t", 0, 0, max_records=10_000)
    assert info.value.path == str(path)


# -- at or after it, a torn tail as before --------------------------------------------------------


def test_a_torn_unacknowledged_tail_after_the_recovery_point_is_truncated(root, caplog):
    append_and_close(root, 3)
    acknowledged = load_recovery_point(partition_dir(root)).end
    append_and_die(root, 2, first=3)  # dies within the interval: its batches are past the point
    assert load_recovery_point(partition_dir(root)).end == acknowledged
    _, path = active(root)
    last = batch_positions(path)[-1]
    assert last > acknowledged
    os.truncate(path, last + 11)  # the second batch was cut by the crash
    with caplog.at_level(logging.WARNING, logger="log.file.partition_writer"):
        assert offsets(root) == list(range(20))
    assert path.stat().st_size == last
    assert any("truncating torn tail" in m and f"byte {last}" in m for m in caplog.messages)


def test_a_torn_batch_right_at_the_recovery_point_is_truncated(root):
    append_and_close(root, 2)
    append_and_die(root, 1, first=2)
    _, path = active(root)
    acknowledged = load_recovery_point(partition_dir(root)).end
    assert batch_positions(path)[-1] == acknowledged
    flip(path, acknowledged + 40)
    assert offsets(root) == list(range(10))
    assert path.stat().st_size == acknowledged


def test_a_writer_killed_after_the_interval_leaves_its_acknowledged_batches_strict(root):
    append_and_die(root, 3, interval=0.0)
    _, path = active(root)
    assert load_recovery_point(partition_dir(root)).end == path.stat().st_size
    flip(path, batch_positions(path)[-1] + 30)
    with pytest.raises(CorruptLogError):
        offsets(root)


# -- no usable recovery point: the old behaviour -------------------------------------------------


@pytest.mark.parametrize("state", ["missing", "garbage", "torn record", "another file"])
def test_without_a_usable_recovery_point_a_damaged_tail_is_truncated(root, caplog, state):
    append_and_close(root, 4)
    _, path = active(root)
    point = recovery_point_path(partition_dir(root))
    if state == "missing":
        point.unlink()
    elif state == "garbage":
        point.write_bytes(b"not a recovery point at all, just bytes")
    elif state == "torn record":
        point.write_bytes(point.read_bytes()[:20])
    else:  # restored from a backup: the same name, another file
        copy = path.with_name("restored")
        shutil.copyfile(path, copy)
        os.replace(copy, path)
    last = batch_positions(path)[-1]
    flip(path, last + 30)
    with caplog.at_level(logging.WARNING):
        assert offsets(root) == list(range(15))
    assert path.stat().st_size == last
    assert any("truncating torn tail" in m for m in caplog.messages)


# -- roll, compaction, topic deletion -------------------------------------------------------------


def test_a_roll_moves_the_recovery_point_to_the_new_segment(tmp_path):
    root = tmp_path / "log"
    create(root, segment_bytes=1024)
    append_and_die(root, 30, segment_bytes=1024)  # rolls several times, never closes
    segments = list_segments(partition_dir(root))
    assert len(segments) > 2
    base, path = segments[-1]
    point = load_recovery_point(partition_dir(root))
    assert (point.segment_base, point.segment_inode) == (base, path.stat().st_ino)
    assert point.end <= path.stat().st_size
    assert offsets(root) == list(range(150))


def test_compaction_keeps_the_recovery_point_valid(tmp_path):
    root = tmp_path / "log"
    create(root, segment_bytes=1024)
    with FileLog(root, segment_bytes=1024) as log:
        for i in range(40):
            log.append("t", 0, [Record(b"same-key", b"v%d" % i)] * 3)
        before = load_recovery_point(partition_dir(root))
        log.compact("t")
        assert load_recovery_point(partition_dir(root)) == before  # compaction never writes it
        log.append("t", 0, [Record(b"same-key", b"last")])
    point = load_recovery_point(partition_dir(root))
    base, path = active(root)
    assert (point.segment_base, point.segment_inode, point.end) == (base, path.stat().st_ino, path.stat().st_size)
    with FileLog(root, segment_bytes=1024) as log:
        log.compact("t")
        log.append("t", 0, [Record(b"other", b"x")])
        held = log.read("t", 0, 0, max_records=1000)
    assert [r.value for r in held][-2:] == [b"last", b"x"]
    # Still strict after all that: damage before the point is reported.
    _, path = active(root)
    flip(path, batch_positions(path)[-1] + 20)
    with pytest.raises(CorruptLogError):
        offsets(root)


def test_a_writer_of_a_deleted_topic_never_writes_into_the_recreated_one(root):
    writer = FileLog(root)
    for i in range(5):
        writer.append("t", 0, batch(i))
    with FileLog(root) as admin:
        admin.delete_topic("t")
        admin.create_topic(TopicSpec("t", partitions=1))
        admin.append("t", 0, batch(100, n=1))
    writer.close()  # saves its point through its open file: into the deleted directory
    point = load_recovery_point(partition_dir(root))
    _, path = active(root)
    assert point == RecoveryPoint(0, path.stat().st_ino, path.stat().st_size)
    assert offsets(root) == [0]
