"""The consumer API's contract on every backend (file, file-plain, kafka-python, confluent-kafka).

One member per group here; membership under rebalances and failures is in
``test_consumer_groups.py`` (real processes).
"""

from __future__ import annotations

import time

import pytest

from log.base import Record, TopicPartition, TopicSpec
from log.consumer import Consumer, ConsumerSettings
from log.errors import UnknownTopicError
from log.factory import consumer_of

#: tansu joins take about half the session timeout (tests/harness/broker.py).
SETTINGS = ConsumerSettings(session_timeout_ms=6000, heartbeat_interval_ms=500)


def poll_until(consumer: Consumer, count: int, timeout_s: float = 60.0) -> list:
    got: list = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count and time.monotonic() < deadline:
        got.extend(consumer.poll(timeout_s=0.5))
    return got


def test_subscribe_poll_commit_seek_and_lag(open_log, topic_name):
    log = open_log()
    log.create_topic(TopicSpec(topic_name, partitions=2))
    for p in range(2):
        log.append(topic_name, p, [Record(b"k%d" % i, b"%d" % i, (("h", b"x"),), 1_000 + i) for i in range(10)])
    group = f"g-{topic_name}"
    with consumer_of(open_log(), group, SETTINGS) as consumer:
        consumer.subscribe([topic_name])
        records = poll_until(consumer, 20)
        assert sorted((r.partition, r.offset) for r in records) == [(p, o) for p in range(2) for o in range(10)]
        assert all(r.headers == (("h", b"x"),) and r.topic == topic_name for r in records)
        for p in range(2):
            offsets = [r.offset for r in records if r.partition == p]
            assert offsets == sorted(offsets)
        assert consumer.assignment() == {TopicPartition(topic_name, 0), TopicPartition(topic_name, 1)}
        assert consumer.lag() == dict.fromkeys(consumer.assignment(), 0)
        consumer.commit({TopicPartition(topic_name, 0): 4})
        consumer.commit({TopicPartition(topic_name, 1): 10})
        assert log.committed(group, topic_name) == {0: 4, 1: 10}
        assert consumer.committed(TopicPartition(topic_name, 0)) == 4
        tp = TopicPartition(topic_name, 0)
        consumer.seek(tp, 7)
        assert [r.offset for r in poll_until(consumer, 3)] == [7, 8, 9]
        consumer.seek_to_time(1_005, [tp])
        assert consumer.position(tp) == 5
        assert consumer.lag()[tp] == 5
    with consumer_of(open_log(), group, SETTINGS) as again:  # resumes at the commits
        again.subscribe([topic_name])
        assert sorted((r.partition, r.offset) for r in poll_until(again, 6)) == [(0, o) for o in range(4, 10)]


def test_assign_reads_without_a_group_and_unknown_topics_are_refused(open_log, topic_name):
    log = open_log()
    log.create_topic(TopicSpec(topic_name, partitions=2))
    log.append(topic_name, 1, [Record(b"k", b"%d" % i) for i in range(5)])
    with consumer_of(open_log(), None, SETTINGS) as reader:
        reader.assign([TopicPartition(topic_name, 1)])
        assert [r.offset for r in poll_until(reader, 5)] == [0, 1, 2, 3, 4]
        with pytest.raises(ValueError, match="no group"):
            reader.commit()
    with consumer_of(open_log(), "g", SETTINGS) as consumer, pytest.raises(UnknownTopicError):
        consumer.subscribe([topic_name + "-missing"])
