"""The previous-image lookup that fills unchanged TOAST values after a restart (a cache miss)."""

from __future__ import annotations

import orjson

from capture.postgres.events.previous_images import LogImages
from log.base import Record, TopicSpec
from log.file.backend import FileLog
from log.partitioner import partition_for

TOPIC = "src.public.items"
KEY = b'{"region":3,"id":953}'


def event(op: str, after: dict | None, commit_lsn: int, txn_index: int) -> bytes:
    source = {"commit_lsn": commit_lsn, "txn_index": txn_index}
    return orjson.dumps({"before": None, "after": after, "op": op, "source": source})


def lookup(log: FileLog, before: tuple[int, int]) -> dict | None:
    return LogImages(log, lambda topic: 3)(TOPIC, KEY, before)


def test_records_of_the_change_being_rebuilt_and_later_ones_are_not_its_previous_image(tmp_path):
    # A crash between the per-partition appends of one flush left this key change's delete of
    # the old key (and a later re-insert) in the log; rebuilding the change must still find
    # the image from before it, not the delete (seen as a quarantined change under SIGKILLs).
    log = FileLog(tmp_path / "log")
    log.create_topic(TopicSpec(TOPIC, partitions=3, compacted=True))
    partition = partition_for(KEY, 3)
    log.append(TOPIC, partition, [Record(KEY, event("c", {"id": 953, "doc": "first"}, 100, 2))])
    log.append(TOPIC, partition, [Record(KEY, event("u", {"id": 953, "doc": "second"}, 150, 0))])
    log.append(TOPIC, partition, [Record(KEY, event("d", None, 200, 3)), Record(KEY, None)])
    log.append(TOPIC, partition, [Record(KEY, event("c", {"id": 953, "doc": "later"}, 300, 0))])

    assert lookup(log, (200, 3)) == {"id": 953, "doc": "second"}
    assert lookup(log, (150, 0)) == {"id": 953, "doc": "first"}
    assert lookup(log, (100, 2)) is None
    assert lookup(log, (250, 0)) is None  # deleted before 250: there is no previous row
    assert lookup(log, (400, 0)) == {"id": 953, "doc": "later"}


def test_on_a_split_topic_the_newest_partition_of_the_keys_chain_is_looked_at_first(tmp_path):
    log = FileLog(tmp_path / "log")
    log.create_topic(TopicSpec(TOPIC, partitions=3, compacted=True))
    partition = partition_for(KEY, 3)
    log.append(TOPIC, partition, [Record(KEY, event("c", {"id": 953, "doc": "parent"}, 100, 0))])
    log.split_partition(TOPIC, partition)
    log.append(TOPIC, partition, [Record(KEY, event("u", {"id": 953, "doc": "child"}, 200, 0))])
    shards = log.shard_map(TOPIC)
    assert log.end_offset(TOPIC, shards.route(KEY)) == 1
    assert lookup(log, (300, 0)) == {"id": 953, "doc": "child"}
    assert lookup(log, (200, 0)) == {"id": 953, "doc": "parent"}
    assert lookup(log, (100, 0)) is None
