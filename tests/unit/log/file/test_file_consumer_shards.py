"""Consumer groups over a topic that is split and merged while it is written: per-key order holds."""

import threading
import time

from log.base import Record, TopicPartition, TopicSpec, append_keyed
from log.consumer import ConsumerSettings
from log.file.backend import FileLog
from log.file.consumer import FileConsumer
from log.offset_store import SqliteOffsetStore, commit_with_output

FAST = ConsumerSettings(session_timeout_ms=1500, heartbeat_interval_ms=100)
KEYS = 17


def written_value(i):
    return Record(b"k%d" % (i % KEYS), b"%d" % i)


def test_a_child_is_read_only_after_its_parent_is_committed_to_its_sealed_end(tmp_path):
    with FileLog(tmp_path / "log", fsync="never") as log:
        log.create_topic(TopicSpec("t", partitions=1))
        append_keyed(log, "t", [written_value(i) for i in range(10)])
        log.split_partition("t", 0)
        append_keyed(log, "t", [written_value(i) for i in range(10, 30)])
        # A member owning only the children (parent assigned elsewhere) reads nothing of them yet.
        children = FileConsumer(log, "g", FAST)
        children.assign([TopicPartition("t", 1), TopicPartition("t", 2)])
        assert children.poll(timeout_s=0.1) == []
        parent = FileConsumer(log, "g", FAST)
        parent.assign([TopicPartition("t", 0)])
        assert len(parent.poll(timeout_s=0.1)) == 10
        assert children.poll(timeout_s=0.1) == []  # read, not committed yet
        parent.commit()
        got = []
        deadline = time.monotonic() + 5
        while len(got) < 20 and time.monotonic() < deadline:
            got.extend(children.poll(timeout_s=0.1))
        assert sorted(int(r.value) for r in got) == list(range(10, 30))
        # A reader of every partition (no group) reads the parent first by itself.
        alone = FileConsumer(log, None, FAST)
        alone.assign([TopicPartition("t", p) for p in (2, 1, 0)])
        order = []
        deadline = time.monotonic() + 5
        while len(order) < 30 and time.monotonic() < deadline:
            order.extend(int(r.value) for r in alone.poll(timeout_s=0.1, max_records=3))
        for k in range(KEYS):
            mine = [v for v in order if v % KEYS == k]
            assert mine == sorted(mine)


def run_member(root, group, stop, processed, lock, store_path=None):
    store = SqliteOffsetStore(store_path) if store_path else None
    with FileConsumer(FileLog(root, fsync="never"), group, FAST, offset_store=store, owns_log=True) as consumer:
        consumer.subscribe(["t"])
        while not stop.is_set():
            batch = consumer.poll(timeout_s=0.05, max_records=7)
            with lock:
                processed.extend((r.key, int(r.value)) for r in batch)
            if batch:
                if store is None:
                    consumer.commit()
                else:
                    with store.transaction() as tx:
                        commit_with_output(consumer, store, tx)
    if store is not None:
        store.close()


def check_split_merge_under_load(tmp_path, store_path=None):
    root = tmp_path / "log"
    with FileLog(root, fsync="never") as log:
        log.create_topic(TopicSpec("t", partitions=2))
    stop = threading.Event()
    processed: list[tuple[bytes, int]] = []
    lock = threading.Lock()
    members = [
        threading.Thread(target=run_member, args=(root, "g", stop, processed, lock, store_path)) for _ in range(2)
    ]
    for m in members:
        m.start()
    total = 0
    with FileLog(root, fsync="never") as writer, FileLog(root) as admin:
        for step in range(6):
            append_keyed(writer, "t", [written_value(i) for i in range(total, total + 150)])
            total += 150
            if step == 1:
                admin.split_partition("t", 0)
            elif step == 2:
                admin.split_partition("t", 1)
            elif step == 3:
                admin.merge_partitions("t", 2, 3)
            elif step == 4:
                admin.split_partition("t", 6)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with lock:
                if len(processed) >= total:
                    break
            time.sleep(0.05)
    stop.set()
    for m in members:
        m.join()
    by_key: dict[bytes, list[int]] = {}
    for key, value in processed:
        by_key.setdefault(key, []).append(value)
    for k in range(KEYS):
        assert by_key[b"k%d" % k] == [i for i in range(total) if i % KEYS == k]


def test_two_members_keep_every_keys_order_across_splits_and_merges(tmp_path):
    check_split_merge_under_load(tmp_path)


def test_members_with_an_offset_store_wait_for_the_stored_parent_checkpoint(tmp_path):
    check_split_merge_under_load(tmp_path, tmp_path / "offsets.sqlite")
