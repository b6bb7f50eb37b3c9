"""Consumer-group offsets in ``_headwater.offsets`` (log.consumer_groups) on the file backend."""

from log.base import Record, TopicPartition, TopicSpec, lag
from log.consumer_groups import offsets_key
from log.file.backend import FileLog
from log.topics import OFFSETS_TOPIC


def test_commit_and_committed_latest_wins(file_log, topic):
    assert file_log.committed("g", topic) == {}
    file_log.commit("g", {TopicPartition(topic, 0): 3, TopicPartition(topic, 1): 1})
    file_log.commit("g", {TopicPartition(topic, 0): 7})
    file_log.commit("other", {TopicPartition(topic, 0): 100})
    assert file_log.committed("g", topic) == {0: 7, 1: 1}
    assert file_log.committed("other", topic) == {0: 100}
    assert file_log.committed("g", "elsewhere") == {}
    assert OFFSETS_TOPIC in file_log.list_topics()


def test_commits_are_shared_between_processes_views_and_survive_reopen(file_log, topic, tmp_path):
    other = FileLog(tmp_path / "log")
    try:
        file_log.commit("g", {TopicPartition(topic, 0): 2})
        assert other.committed("g", topic) == {0: 2}
        other.commit("g", {TopicPartition(topic, 0): 5})  # a second writer of the internal topic
        assert file_log.committed("g", topic) == {0: 5}
    finally:
        other.close()
    file_log.close()
    reopened = FileLog(tmp_path / "log")
    assert reopened.committed("g", topic) == {0: 5}
    reopened.close()


def test_lag_counts_from_the_committed_offset_or_the_beginning(file_log, topic):
    file_log.append(topic, 0, [Record(b"a", b"1")] * 10)
    file_log.append(topic, 1, [Record(b"b", b"1")] * 4)
    assert lag(file_log, "g", topic) == {0: 10, 1: 4}
    file_log.commit("g", {TopicPartition(topic, 0): 6})
    assert lag(file_log, "g", topic) == {0: 4, 1: 4}


def test_offsets_topic_compacts_to_the_latest_commit(file_log, topic):
    for n in range(300):
        file_log.commit("g", {TopicPartition(topic, 0): n, TopicPartition(topic, 1): n * 2})
    spec = file_log.describe_topic(OFFSETS_TOPIC)
    assert spec.compacted and spec.partitions == 1
    result = file_log.compact(OFFSETS_TOPIC)
    assert result.records_after < result.records_before
    clean = file_log.clean_offset(OFFSETS_TOPIC, 0)
    assert clean > 0
    held = [r.offset for r in file_log.read(OFFSETS_TOPIC, 0, 0, max_records=10_000)]
    # Before the clean offset nothing superseded is left (the active segment is never compacted).
    assert [o for o in held if o < clean] == []
    assert offsets_key("g", topic, 0) == b'["g","orders",0]'
    fresh = FileLog(file_log.root)
    assert fresh.committed("g", topic) == {0: 299, 1: 598}
    fresh.close()


def test_committed_sees_a_topic_created_later(tmp_path):
    log = FileLog(tmp_path / "log")
    log.commit("g", {TopicPartition("t", 0): 1})
    log.create_topic(TopicSpec("t", partitions=1))
    assert log.committed("g", "t") == {0: 1}
    log.close()
