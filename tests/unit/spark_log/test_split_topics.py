"""The Spark data source's micro-batches over a split topic: children wait for their parents' sealed ends."""

from log.base import Record, TopicSpec, append_keyed
from log.file.backend import FileLog
from spark_log.data_source import current_ends, hold_children
from spark_log.offsets import LogPosition, admit, offset_ranges

KEYS = 11


def test_micro_batches_read_every_key_in_the_order_written(tmp_path):
    log = FileLog(tmp_path / "log", fsync="never")
    log.create_topic(TopicSpec("t", partitions=2))
    written = 0

    def write(n):
        nonlocal written
        append_keyed(log, "t", [Record(b"k%d" % (i % KEYS), b"%d" % i) for i in range(written, written + n)])
        written += n

    write(100)
    log.split_partition("t", 0)
    write(100)
    log.merge_partitions("t", 2, 3)
    log.split_partition("t", 1)
    write(100)
    begin = LogPosition.of({("t", 0): 0, ("t", 1): 0})
    seen: list[int] = []
    for _ in range(200):
        available = hold_children(log, ["t"], begin, current_ends(log, ["t"]))
        end = admit(begin, available, 37)
        for r in offset_ranges(begin, end, split_records=1000):
            seen.extend(int(rec.value) for rec in log.read("t", r.partition, r.start, max_records=r.end - r.start))
        if end == begin:
            break
        # One micro-batch's ranges are read in parallel: check order across batches only.
        begin = end
    assert sorted(seen) == list(range(written))
    # Within a batch a key comes from one partition (offset order), and batches are in order.
    for k in range(KEYS):
        mine = [v for v in seen if v % KEYS == k]
        assert mine == sorted(mine)
    log.close()


def test_a_child_is_held_at_its_start_until_a_batch_starts_at_its_parents_end(tmp_path):
    log = FileLog(tmp_path / "log", fsync="never")
    log.create_topic(TopicSpec("t", partitions=1))
    append_keyed(log, "t", [Record(b"%d" % i, b"x") for i in range(10)])
    log.split_partition("t", 0)
    append_keyed(log, "t", [Record(b"%d" % i, b"y") for i in range(10)])
    ends = current_ends(log, ["t"])
    held = hold_children(log, ["t"], LogPosition.of({("t", 0): 0}), ends)
    assert held.as_dict() == {("t", 0): 10, ("t", 1): 0, ("t", 2): 0}
    free = hold_children(log, ["t"], LogPosition.of({("t", 0): 10}), ends)
    assert free.as_dict() == ends.as_dict()
    log.close()
