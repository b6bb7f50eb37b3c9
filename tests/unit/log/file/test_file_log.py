import subprocess
import sys
import textwrap

import pytest

from log.base import Log, Record, TopicSpec
from log.errors import (
    InvalidTopicNameError,
    TopicExistsError,
    UnknownPartitionError,
    UnknownTopicError,
    WriterLockedError,
)
from log.file.backend import FileLog
from log.file.segment import list_segments
from log.topics import OFFSETS_TOPIC, SCHEMAS_TOPIC


def records(n, prefix=b"v", key=b"k"):
    return [Record(key + b"%d" % (i % 3), prefix + b"%d" % i, (("i", b"%d" % i),), 1000 + i) for i in range(n)]


def test_file_log_is_a_log(file_log):
    assert isinstance(file_log, Log)


def test_topics_create_list_describe_delete(file_log):
    spec = TopicSpec("a.b-c_d", partitions=3, compacted=False, retention_ms=5, config={"x": "y"})
    file_log.create_topic(spec)
    file_log.create_topic(TopicSpec("a.b-c_d", partitions=7))  # exist_ok: left as it is
    file_log.create_topic(TopicSpec(SCHEMAS_TOPIC, partitions=1))  # internal names pass here
    assert file_log.list_topics() == [SCHEMAS_TOPIC, "a.b-c_d"]
    assert file_log.describe_topic("a.b-c_d") == spec
    with pytest.raises(TopicExistsError):
        file_log.create_topic(TopicSpec("a.b-c_d"), exist_ok=False)
    file_log.delete_topic("a.b-c_d")
    assert file_log.list_topics() == [SCHEMAS_TOPIC]
    with pytest.raises(UnknownTopicError):
        file_log.describe_topic("a.b-c_d")


@pytest.mark.parametrize("name", ["", "a/b", "..", ".", "x" * 250, "sp ace", "ü"])
def test_invalid_topic_names_are_refused(file_log, name):
    with pytest.raises(InvalidTopicNameError):
        file_log.create_topic(TopicSpec(name))


def test_unknown_topic_and_partition(file_log, topic):
    with pytest.raises(UnknownTopicError):
        file_log.append("nope", 0, records(1))
    with pytest.raises(UnknownTopicError):
        file_log.read("nope", 0, 0)
    with pytest.raises(UnknownTopicError):
        file_log.delete_topic("nope")
    with pytest.raises(UnknownPartitionError):
        file_log.append(topic, 2, records(1))
    with pytest.raises(UnknownPartitionError):
        file_log.end_offset(topic, -1)


def test_append_returns_contiguous_offsets_and_read_returns_them_in_order(file_log, topic):
    first = file_log.append(topic, 0, records(5))
    second = file_log.append(topic, 0, records(3, prefix=b"w"))
    assert (first.base_offset, first.last_offset, second.base_offset, second.last_offset) == (0, 4, 5, 7)
    assert file_log.append(topic, 0, []).base_offset == 8
    out = file_log.read(topic, 0, 0)
    assert [r.offset for r in out] == list(range(8))
    assert out[5].value == b"w0" and out[5].headers == (("i", b"0"),) and out[5].timestamp_ms == 1000
    assert file_log.read(topic, 0, 6) == out[6:]
    assert file_log.read(topic, 0, 8) == []
    assert file_log.read(topic, 1, 0) == []
    assert (file_log.beginning_offset(topic, 0), file_log.end_offset(topic, 0)) == (0, 8)
    assert (file_log.beginning_offset(topic, 1), file_log.end_offset(topic, 1)) == (0, 0)


def test_read_bounds(file_log, topic):
    file_log.append(topic, 0, [Record(b"k", b"x" * 100) for _ in range(20)])
    assert len(file_log.read(topic, 0, 0, max_records=7)) == 7
    assert len(file_log.read(topic, 0, 0, max_bytes=1)) == 1  # at least one record
    assert 2 <= len(file_log.read(topic, 0, 0, max_bytes=400)) <= 4


def test_segments_roll_and_reads_cross_them(file_log, topic):
    for i in range(40):
        file_log.append(topic, 0, records(10, prefix=b"batch%d-" % i))
    directory = file_log.root / topic / "0"
    assert len(list_segments(directory)) >= 4
    out = file_log.read(topic, 0, 0, max_records=1000)
    assert [r.offset for r in out] == list(range(400))
    assert [r.offset for r in file_log.read(topic, 0, 237, max_records=3)] == [237, 238, 239]


def test_offset_for_time(file_log, topic):
    for i in range(30):
        file_log.append(topic, 0, [Record(b"k", b"v" * 200, (), 10_000 + i * 10 + j) for j in range(5)])
    assert file_log.offset_for_time(topic, 0, 0) == 0
    assert file_log.offset_for_time(topic, 0, 10_000 + 7 * 10 + 3) == 7 * 5 + 3
    assert file_log.offset_for_time(topic, 0, 10_000 + 29 * 10 + 4) == 149
    assert file_log.offset_for_time(topic, 0, 10**13) is None
    assert file_log.offset_for_time(topic, 1, 0) is None


def test_offset_for_time_with_out_of_order_timestamps(file_log, topic):
    file_log.append(topic, 0, [Record(b"k", b"a", (), 500), Record(b"k", b"b", (), 100), Record(b"k", b"c", (), 300)])
    assert file_log.offset_for_time(topic, 0, 200) == 0
    file_log.append(topic, 1, [Record(b"k", b"a", (), 100), Record(b"k", b"b", (), 300), Record(b"k", b"c", (), 200)])
    assert file_log.offset_for_time(topic, 1, 250) == 1


def test_another_instance_sees_new_batches_without_reopening(file_log, topic, tmp_path):
    reader = FileLog(tmp_path / "log")
    try:
        assert reader.read(topic, 0, 0) == []
        file_log.append(topic, 0, records(3))
        assert [r.offset for r in reader.read(topic, 0, 0)] == [0, 1, 2]
        for _ in range(20):
            file_log.append(topic, 0, records(10))  # rolls segments under the reader
        assert len(reader.read(topic, 0, 0, max_records=10_000)) == 203
        assert reader.end_offset(topic, 0) == 203
    finally:
        reader.close()


def test_second_writer_in_same_process_is_refused(file_log, topic, tmp_path):
    file_log.append(topic, 0, records(1))
    other = FileLog(tmp_path / "log")
    try:
        with pytest.raises(WriterLockedError) as info:
            other.append(topic, 0, records(1))
        assert f"pid {__import__('os').getpid()}" in info.value.holder
        other.append(topic, 1, records(1))  # another partition is free
    finally:
        other.close()
    file_log.close()
    reopened = FileLog(tmp_path / "log")
    assert reopened.append(topic, 0, records(1)).base_offset == 1
    reopened.close()


def test_second_writer_process_gets_error_naming_the_holder(file_log, topic, tmp_path):
    script = textwrap.dedent(
        f"""
        import sys
        from pathlib import Path
        from log.base import Record
        from log.file.backend import FileLog
        log = FileLog(Path({str(tmp_path / "log")!r}))
        log.append({topic!r}, 0, [Record(b"k", b"v")])
        print("holding", flush=True)
        sys.stdin.read()
        """
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", script, "--holder-marker"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "holding"
        with pytest.raises(WriterLockedError) as info:
            file_log.append(topic, 0, records(1))
        assert f"pid {holder.pid}" in info.value.holder
        assert "--holder-marker" in str(info.value)
    finally:
        holder.stdin.close()
        holder.wait(timeout=10)
    # The lock dies with its holder.
    assert file_log.append(topic, 0, records(1)).base_offset == 1


def test_internal_topics_accept_writers_from_many_instances(file_log, tmp_path):
    file_log.create_topic(TopicSpec(OFFSETS_TOPIC, partitions=1))
    other = FileLog(tmp_path / "log")
    try:
        file_log.append(OFFSETS_TOPIC, 0, records(2))
        assert other.append(OFFSETS_TOPIC, 0, records(2)).base_offset == 2
        assert file_log.append(OFFSETS_TOPIC, 0, records(1)).base_offset == 4
    finally:
        other.close()


def test_recreated_topic_is_a_new_topic(file_log, topic):
    file_log.append(topic, 0, records(5))
    file_log.delete_topic(topic)
    file_log.create_topic(TopicSpec(topic, partitions=1))
    assert file_log.end_offset(topic, 0) == 0
    assert file_log.append(topic, 0, records(1)).base_offset == 0


def test_close_is_idempotent(file_log, topic):
    file_log.append(topic, 0, records(1))
    file_log.close()
    file_log.close()
    assert len(file_log.read(topic, 0, 0)) == 1


def test_topic_recreated_by_another_instance_is_seen_as_new(file_log, topic, tmp_path):
    file_log.append(topic, 0, records(5))
    other = FileLog(tmp_path / "log")
    try:
        other.delete_topic(topic)
        other.create_topic(TopicSpec(topic, partitions=1))
        assert file_log.describe_topic(topic).partitions == 1
        assert file_log.append(topic, 0, records(2)).base_offset == 0
        assert [r.offset for r in other.read(topic, 0, 0)] == [0, 1]
    finally:
        other.close()
