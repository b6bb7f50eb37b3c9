"""Elastic shards on the file backend: routing by the partition map, seals, split/merge refusals."""

import threading

import pytest
from harness.topics import partition_records

from log.base import Record, TopicSpec, append_keyed
from log.errors import UnknownPartitionError
from log.file.backend import FileLog
from log.file.batch_codec import HEADER_SIZE, EncodedBatch, encode_batch
from log.shards import ShardError


def keyed(n, tag=b""):
    return [Record(str(i).encode(), tag + str(i).encode()) for i in range(n)]


def test_appends_after_a_split_go_to_the_children_by_range(file_log, topic):
    append_keyed(file_log, topic, keyed(60))
    end = file_log.end_offset(topic, 0)
    shards = file_log.split_partition(topic, 0)
    assert file_log.describe_topic(topic).partitions == 4
    assert shards.shard(0).sealed_end == end
    append_keyed(file_log, topic, keyed(60, b"second-"))
    assert file_log.end_offset(topic, 0) == end  # nothing lands in the sealed parent
    for number in (2, 3):
        for record in partition_records(file_log, topic, number):
            assert shards.route(record.key) == number
    # The caller's partition does not matter: every record goes where its key's range is open.
    file_log.append(topic, 0, [Record(b"7", b"named-0")])
    assert partition_records(file_log, topic, shards.route(b"7"))[-1].value == b"named-0"


def test_another_process_sees_the_map_and_routes_by_it(file_log, topic, tmp_path):
    other = FileLog(tmp_path / "log", fsync="never")
    try:
        other.append(topic, 0, keyed(1))  # opens the topic before the split
        file_log.split_partition(topic, 0)
        sealed_end = file_log.end_offset(topic, 0)
        other.append(topic, 0, keyed(40))
        assert other.end_offset(topic, 0) == sealed_end
        assert other.describe_topic(topic).partitions == 4
        assert sum(other.end_offset(topic, p) for p in (2, 3)) > 0
    finally:
        other.close()


def test_merge_then_split_again(file_log, topic):
    file_log.split_partition(topic, 1)  # 2, 3
    shards = file_log.merge_partitions(topic, 3, 2)
    assert shards.shard(4).parents == (2, 3)
    shards = file_log.split_partition(topic, 4, at=shards.shard(4).lo + 5)
    assert (shards.shard(5).hi - shards.shard(5).lo) == 5
    append_keyed(file_log, topic, keyed(50))
    assert all(file_log.end_offset(topic, p) == 0 for p in (1, 2, 3, 4))


def test_bad_splits_and_merges_are_one_line_and_change_nothing(file_log, topic):
    file_log.split_partition(topic, 0)
    before = file_log.shard_map(topic)
    cases = [
        (lambda: file_log.split_partition(topic, 0), ShardError, "sealed"),
        (lambda: file_log.split_partition(topic, 9), UnknownPartitionError, "not 9"),
        (lambda: file_log.merge_partitions(topic, 2, 1), ShardError, "not adjacent"),
        (lambda: file_log.merge_partitions(topic, 0, 1), ShardError, "sealed"),
        (lambda: file_log.split_partition(topic, 1, at=0), ShardError, "outside"),
    ]
    for call, error, text in cases:
        with pytest.raises(error, match=text) as caught:
            call()
        assert "\n" not in str(caught.value)
    assert file_log.shard_map(topic) == before
    assert sorted(p.name for p in (file_log.root / topic).iterdir() if p.is_dir()) == ["0", "1", "2", "3"]


def test_internal_topics_are_never_split(file_log):
    file_log.create_topic(TopicSpec("_headwater.schemas", partitions=1))
    with pytest.raises(ShardError, match="internal topic"):
        file_log.split_partition("_headwater.schemas", 0)


def test_encoded_batches_are_routed_record_by_record(file_log, topic):
    file_log.split_partition(topic, 0)
    records = keyed(30)
    data, max_ts = encode_batch(0, records, 123)
    encoded = EncodedBatch(bytearray(HEADER_SIZE) + data[HEADER_SIZE:], len(records), max_ts)
    file_log.append_encoded(topic, 0, encoded)
    shards = file_log.shard_map(topic)
    got = {r.key: (p, r.value) for p in range(4) for r in partition_records(file_log, topic, p)}
    assert {k: v for k, (_, v) in got.items()} == {r.key: r.value for r in records}
    assert all(shards.route(k) == p for k, (p, _) in got.items())


def test_no_record_lands_in_a_sealed_partition_while_a_writer_appends(file_log, topic):
    stop = threading.Event()
    written = []

    def writer():
        i = 0
        while not stop.is_set():
            append_keyed(file_log, topic, [Record(str(i % 13).encode(), str(i).encode())])
            written.append(i)
            i += 1

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        while len(written) < 20:
            pass
        shards = file_log.split_partition(topic, 0)
        while len(written) < 60:
            pass
        shards = file_log.merge_partitions(topic, 2, 3)
        while len(written) < 100:
            pass
    finally:
        stop.set()
        thread.join()
    for sealed in (0, 2, 3):
        assert file_log.end_offset(topic, sealed) == shards.shard(sealed).sealed_end
    # Every key's values, read along its chain of partitions, are in the order written.
    for k in range(13):
        key = str(k).encode()
        seen = [int(r.value) for p in shards.chain(key) for r in partition_records(file_log, topic, p) if r.key == key]
        assert seen == sorted(seen) and seen == [i for i in written if i % 13 == k]


def test_a_compressed_encoded_batch_that_expands_a_lot_is_routed_whole(tmp_path):
    log = FileLog(tmp_path / "log", fsync="never", compression="zstd")
    log.create_topic(TopicSpec("t", partitions=1))
    log.split_partition("t", 0)
    records = [Record(b"%d" % i, b"x" * 5000) for i in range(200)]  # compresses far more than 64x
    data, max_ts = encode_batch(0, records, 123)
    encoded = EncodedBatch(bytearray(HEADER_SIZE) + data[HEADER_SIZE:], len(records), max_ts).compressed("zstd")
    log.append_encoded("t", 0, encoded)
    assert sum(log.end_offset("t", p) for p in (1, 2)) == 200
    log.close()
