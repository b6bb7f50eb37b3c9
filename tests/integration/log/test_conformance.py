"""One conformance suite for the :class:`~log.base.Log` protocol, run against every backend.

Fixtures (``conftest.py``): ``any_log`` (a Log of each backend), ``open_log`` (another
view of the same store, as another process would have) and ``topic_name`` (unique).
"""

import time

import pytest
from harness.topics import make_topic, partition_records

from log.base import (
    AppendResult,
    Log,
    Record,
    TopicPartition,
    TopicSpec,
    append_keyed,
    end_offsets,
    lag,
)
from log.errors import UnknownTopicError
from log.partitioner import partition_for

pytestmark = pytest.mark.integration

T0 = 1_700_000_000_000


def test_backend_is_a_log(any_log):
    assert isinstance(any_log, Log)


def test_create_list_describe_delete(any_log, topic_name):
    spec = TopicSpec(topic_name, partitions=3, compacted=True)
    any_log.create_topic(spec)
    any_log.create_topic(spec)  # exist_ok by default
    assert topic_name in any_log.list_topics()
    assert any_log.list_topics() == sorted(any_log.list_topics())
    described = any_log.describe_topic(topic_name)
    assert (described.name, described.partitions, described.compacted) == (topic_name, 3, True)
    other = TopicSpec(topic_name + "-plain", partitions=2, compacted=False)
    any_log.create_topic(other)
    assert any_log.describe_topic(other.name).compacted is False
    any_log.delete_topic(other.name)
    assert other.name not in any_log.list_topics()


def test_unknown_topic_is_an_error(any_log, topic_name):
    missing = topic_name + "-missing"
    with pytest.raises(UnknownTopicError):
        any_log.describe_topic(missing)
    with pytest.raises(UnknownTopicError):
        any_log.append(missing, 0, [Record(b"k", b"v")])
    with pytest.raises(UnknownTopicError):
        any_log.read(missing, 0, 0)


def test_empty_partition_offsets(any_log, topic_name):
    make_topic(any_log, topic_name, partitions=2)
    assert any_log.read(topic_name, 0, 0) == []
    assert any_log.end_offset(topic_name, 1) == 0
    assert any_log.beginning_offset(topic_name, 1) == 0
    assert end_offsets(any_log, topic_name) == {0: 0, 1: 0}


def test_append_returns_contiguous_offsets_and_reads_keep_order(any_log, topic_name):
    make_topic(any_log, topic_name)
    first = any_log.append(topic_name, 0, [Record(b"k%d" % i, b"v%d" % i, (), T0 + i) for i in range(5)])
    second = any_log.append(topic_name, 0, [Record(b"k%d" % i, b"w%d" % i, (), T0 + 10 + i) for i in range(3)])
    assert first == AppendResult(topic_name, 0, 0, 4)
    assert second == AppendResult(topic_name, 0, 5, 7)
    records = partition_records(any_log, topic_name, 0, offset=0)
    assert [r.offset for r in records] == list(range(8))
    assert [r.value for r in records] == [b"v0", b"v1", b"v2", b"v3", b"v4", b"w0", b"w1", b"w2"]
    assert all((r.topic, r.partition) == (topic_name, 0) for r in records)
    assert [r.offset for r in any_log.read(topic_name, 0, 6)] == [6, 7]
    assert any_log.read(topic_name, 0, 8) == []
    assert (any_log.beginning_offset(topic_name, 0), any_log.end_offset(topic_name, 0)) == (0, 8)


def test_read_bounds(any_log, topic_name):
    make_topic(any_log, topic_name)
    any_log.append(topic_name, 0, [Record(b"k", b"x" * 1000) for _ in range(50)])
    assert [r.offset for r in any_log.read(topic_name, 0, 10, max_records=5)] == [10, 11, 12, 13, 14]
    assert len(any_log.read(topic_name, 0, 0, max_bytes=1)) == 1  # at least one record
    bounded = any_log.read(topic_name, 0, 0, max_bytes=10_000)
    assert 1 <= len(bounded) < 50
    assert [r.offset for r in bounded] == list(range(len(bounded)))


def test_tombstones_null_keys_headers_and_timestamps(any_log, topic_name):
    make_topic(any_log, topic_name)
    before = int(time.time() * 1000)
    any_log.append(
        topic_name,
        0,
        [
            Record(b"k", b"v", (("reason", b"bad \x00 bytes"), ("trace", b"1")), T0),
            Record(b"k", None, (), T0 + 1),
            Record(None, b"keyless", (), T0 + 2),
            Record(b"now", b"stamped by the log"),
        ],
    )
    after = int(time.time() * 1000)
    records = partition_records(any_log, topic_name, 0, offset=0)
    assert [(r.key, r.value) for r in records] == [
        (b"k", b"v"),
        (b"k", None),
        (None, b"keyless"),
        (b"now", b"stamped by the log"),
    ]
    assert records[0].headers == (("reason", b"bad \x00 bytes"), ("trace", b"1"))
    assert records[1].headers == ()
    assert [r.timestamp_ms for r in records[:3]] == [T0, T0 + 1, T0 + 2]
    assert before - 1000 <= records[3].timestamp_ms <= after + 1000


def test_offset_for_time(any_log, topic_name):
    make_topic(any_log, topic_name)
    any_log.append(topic_name, 0, [Record(b"k", b"v", (), T0 + 100 * i) for i in range(10)])
    assert any_log.offset_for_time(topic_name, 0, 0) == 0
    assert any_log.offset_for_time(topic_name, 0, T0 + 350) == 4
    assert any_log.offset_for_time(topic_name, 0, T0 + 400) == 4
    assert any_log.offset_for_time(topic_name, 0, T0 + 900) == 9
    assert any_log.offset_for_time(topic_name, 0, T0 + 901) is None


def test_another_view_sees_new_batches_without_reopening(any_log, open_log, topic_name):
    make_topic(any_log, topic_name)
    reader = open_log()
    assert reader.read(topic_name, 0, 0) == []
    any_log.append(topic_name, 0, [Record(b"a", b"1"), Record(b"b", b"2")])
    assert [r.value for r in partition_records(reader, topic_name, 0, offset=0)] == [b"1", b"2"]
    any_log.append(topic_name, 0, [Record(b"c", b"3")])
    assert [r.value for r in reader.read(topic_name, 0, 2)] == [b"3"]
    assert reader.end_offset(topic_name, 0) == 3


def test_consumer_group_commit_committed_and_lag(any_log, topic_name):
    make_topic(any_log, topic_name, partitions=2)
    group = topic_name + "-group"
    any_log.append(topic_name, 0, [Record(b"a", b"1")] * 6)
    any_log.append(topic_name, 1, [Record(b"b", b"1")] * 3)
    assert any_log.committed(group, topic_name) == {}
    assert lag(any_log, group, topic_name) == {0: 6, 1: 3}
    any_log.commit(group, {TopicPartition(topic_name, 0): 2})
    any_log.commit(group, {TopicPartition(topic_name, 0): 4, TopicPartition(topic_name, 1): 3})
    assert any_log.committed(group, topic_name) == {0: 4, 1: 3}
    assert lag(any_log, group, topic_name) == {0: 2, 1: 0}
    assert any_log.committed(group + "-other", topic_name) == {}


def test_commits_are_visible_to_another_view(any_log, open_log, topic_name):
    make_topic(any_log, topic_name)
    group = topic_name + "-group"
    any_log.commit(group, {TopicPartition(topic_name, 0): 7})
    assert open_log().committed(group, topic_name) == {0: 7}


def test_append_keyed_routes_like_partition_for(any_log, topic_name):
    make_topic(any_log, topic_name, partitions=3)
    records = [Record(b"customer-%d" % i, b"v%d" % i) for i in range(30)] + [Record(None, b"keyless")]
    results = append_keyed(any_log, topic_name, records)
    assert [r.partition for r in results] == sorted({partition_for(r.key, 3) for r in records})
    for partition in range(3):
        held = partition_records(any_log, topic_name, partition, offset=0)
        expected = [r for r in records if partition_for(r.key, 3) == partition]
        assert [(r.key, r.value) for r in held] == [(r.key, r.value) for r in expected]


def test_compaction_keeps_the_latest_record_per_key(any_log, topic_name):
    if not getattr(any_log, "supports_compaction", True):
        pytest.skip(f"{type(any_log).__name__} reports that its store cannot compact")
    make_topic(any_log, topic_name, compacted=True, min_compaction_lag_ms=0, delete_retention_ms=0)
    written = []
    for round_ in range(5):
        batch = [Record(b"key-%d" % k, b"round-%d" % round_, (), T0 + round_) for k in range(4)]
        any_log.append(topic_name, 0, batch)
        written.extend(batch)
    any_log.append(topic_name, 0, [Record(None, b"keyless", (), T0 + 9)])
    written.append(Record(None, b"keyless", (), T0 + 9))
    result = any_log.compact(topic_name)
    assert result.topic == topic_name
    assert result.records_after <= result.records_before
    held = partition_records(any_log, topic_name, 0, offset=0)
    # Nothing is renumbered or altered; the latest of every key and keyless records remain.
    for record in held:
        original = written[record.offset]
        assert (record.key, record.value, record.timestamp_ms) == (original.key, original.value, original.timestamp_ms)
    offsets = {r.offset for r in held}
    latest = {r.key: n for n, r in enumerate(written) if r.key is not None}
    assert set(latest.values()) <= offsets
    assert len(written) - 1 in offsets
    assert any_log.end_offset(topic_name, 0) == len(written)
    assert 0 <= any_log.clean_offset(topic_name, 0) <= len(written)
