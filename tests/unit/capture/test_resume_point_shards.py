"""capture.position.ResumePoint on a topic that was split: an event counts as stored along its key's chain."""

from __future__ import annotations

import orjson

from capture.position import ResumePoint
from log.base import Record, TopicPartition, TopicSpec
from log.file.backend import FileLog
from log.partitioner import partition_for
from log.sequence import Sequence

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
