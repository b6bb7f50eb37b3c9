"""capture.position.ResumePoint on a topic that was split: an event counts as stored along its key's chain."""

from __future__ import annotations

import orjson

from capture.position import ResumePoint
from log.base import Record, TopicPartition, TopicSpec
from log.file.backend import FileLog
from log.partitioner import partition_for
from log.sequence import Lsn, Sequence

TOPIC = "src.public.items"


def event(commit_lsn: int) -> bytes:
    return orjson.dumps({"op": "u", "source": {"commit_lsn": commit_lsn, "txn_index": 0}})


def test_a_key_counts_as_stored_where_its_chain_holds_it_and_only_there(tmp_path):
    log = FileLog(tmp_path / "log")
    log.create_topic(TopicSpec(TOPIC, partitions=1))
    log.append(TOPIC, 0, [Record(b"a", event(100)), Record(b"b", event(110))])
    shards = log.split_partition(TOPIC, 0)
    # Find two keys that the split sent to different children.
    low = next(k for k in (b"%d" % i for i in range(100)) if shards.route(k) == 1)
    high = next(k for k in (b"%d" % i for i in range(100)) if shards.route(k) == 2)
    log.append(TOPIC, 0, [Record(low, event(300))])  # the child of ``low`` holds 300; ``high``'s child nothing
    resume = ResumePoint.load(log, [TOPIC])
    home = TopicPartition(TOPIC, partition_for(low, 1))
    assert resume.already_stored(home, Sequence(300, 0), low)
    assert resume.already_stored(home, Sequence(110, 0), high)  # the sealed parent holds up to 110
    assert not resume.already_stored(home, Sequence(300, 0), high)  # a crash before high's child got it
    assert not resume.already_stored(home, Sequence(301, 0), low)
    log.close()


def test_capture_re_sent_after_a_restart_on_a_split_topic_writes_each_event_once(tmp_path):
    """The appender on a split topic: native grouping (second run), the restart's per-record check (third)."""
    import threading

    from capture.appender import Appender
    from capture.records import OutRecord
    from capture.source_topics import SourceTopics
    from capture.stats import CaptureStats
    from core.log_config import LogConfig

    topic = "src.public.t"
    keys = [b'{"id":%d}' % i for i in range(12)]

    def records(first, last):
        return [OutRecord(topic, keys[n % 12], event(n), n, 0) for n in range(first, last)]

    def appender(log):
        topics = SourceTopics(log, LogConfig(partitions=2), "src")
        stats = CaptureStats(Lsn(0))
        return Appender("src", log, topics, stats, threading.Event(), retry_s=0.1, on_flushed=lambda: None)

    log = FileLog(tmp_path / "log", fsync="never")
    first = appender(log)
    first.records.extend(records(100, 160))
    first.flush(ResumePoint.load(log, [topic]), None)
    log.split_partition(topic, 1)
    log.split_partition(topic, 0)
    log.merge_partitions(topic, 2, 5)
    # The second run (restart) appends 160..200, then "crashes" before acknowledging: the
    # source re-sends from 150; the third run must skip 150..199 and write 200..230.
    second = appender(log)
    second.records.extend(records(160, 200))
    second.flush(ResumePoint.load(log, [topic]), None)
    log.close()  # the restart
    log = FileLog(tmp_path / "log", fsync="never")
    third = appender(log)
    third.records.extend(records(150, 230))
    third.flush(ResumePoint.load(log, [topic]), None)
    shards = log.shard_map(topic)
    for key in keys:
        seen = [
            orjson.loads(r.value)["source"]["commit_lsn"]
            for p in shards.chain(key)
            for r in log.read(topic, p, 0, max_records=10_000)
            if r.key == key
        ]
        assert seen == [n for n in range(100, 230) if keys[n % 12] == key], key
    log.close()
