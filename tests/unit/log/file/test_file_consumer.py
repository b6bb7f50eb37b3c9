"""log.file.consumer.FileConsumer: subscribe, poll, commit, seek, lag; hand-over between members; offset stores."""

import time

import pytest

from log.base import Record, TopicPartition, TopicSpec, append_keyed
from log.consumer import ConsumerSettings
from log.errors import FencedMemberError, UnknownGroupError, UnknownTopicError
from log.file.backend import FileLog
from log.file.consumer import FileConsumer
from log.offset_store import SqliteOffsetStore, commit_with_output

FAST = ConsumerSettings(session_timeout_ms=600, heartbeat_interval_ms=100)


@pytest.fixture
def root(tmp_path):
    with FileLog(tmp_path / "log") as log:
        log.create_topic(TopicSpec("t", partitions=4))
        append_keyed(log, "t", [Record(b"k%d" % i, b"%d" % i, timestamp_ms=1000 + i) for i in range(100)])
    return tmp_path / "log"


def member(root, group="g", settings=FAST, **kwargs):
    return FileConsumer(FileLog(root), group, settings, owns_log=True, **kwargs)


def drain(consumer, until=None, timeout_s=5.0):
    got, deadline = [], time.monotonic() + timeout_s
    while time.monotonic() < deadline and (until is None or len(got) < until):
        got.extend(consumer.poll(timeout_s=0.05))
        if until is None and not got:
            continue
        if until is None:
            break
    return got


def test_a_lone_member_reads_everything_in_order_and_commits(root):
    with member(root) as consumer:
        consumer.subscribe(["t"])
        records = drain(consumer, until=100)
        assert len(records) == 100
        for p in range(4):
            offsets = [r.offset for r in records if r.partition == p]
            assert offsets == list(range(len(offsets)))
        assert all(n == 0 for n in consumer.lag().values())
        consumer.commit()
        assert sum(consumer.committed(TopicPartition("t", p)) for p in range(4)) == 100
    with member(root) as again:  # a new member resumes at the commit
        again.subscribe(["t"])
        assert again.poll(timeout_s=0.2) == []
        assert again.lag() == dict.fromkeys(again.assignment(), 0)


def test_two_members_split_the_partitions_and_the_second_starts_at_the_commit(root):
    a, b = member(root), member(root)
    try:
        a.subscribe(["t"])
        first = drain(a, until=100)
        a.commit()
        b.subscribe(["t"])
        deadline = time.monotonic() + 5
        while (len(a.assignment()) != 2 or len(b.assignment()) != 2) and time.monotonic() < deadline:
            assert a.poll(timeout_s=0.05) == [] and b.poll(timeout_s=0.05) == []  # nothing read twice
        assert a.assignment() | b.assignment() == {TopicPartition("t", p) for p in range(4)}
        assert not a.assignment() & b.assignment()
        assert len(first) == 100
        with FileLog(root) as log:
            description = log.describe_group("g")
        assert description.state == "stable" and len(description.members) == 2
        assert sum(p.lag for p in description.partitions) == 0
        a.close()  # leaves: b takes everything at once
        deadline = time.monotonic() + 5
        while len(b.assignment()) != 4 and time.monotonic() < deadline:
            assert b.poll(timeout_s=0.05) == []
        assert len(b.assignment()) == 4
    finally:
        a.close()
        b.close()


def test_a_member_whose_lease_ended_cannot_commit_and_rejoins(root):
    slow = member(root, settings=ConsumerSettings(session_timeout_ms=300, heartbeat_interval_ms=100))
    other = member(root)
    try:
        slow.subscribe(["t"])
        drain(slow, until=100)
        old_id = slow.member_id
        slow._stop.set()  # its heartbeats stop, as in a paused process
        slow._heartbeats.join()
        other.subscribe(["t"])
        time.sleep(0.5)
        assert len(drain(other, until=100)) == 100  # nothing was committed: the new owner reads it all
        other.commit()
        with pytest.raises(FencedMemberError) as refused:
            slow.commit()
        assert "no longer owns" in str(refused.value) and "\n" not in str(refused.value)
        assert slow.poll(timeout_s=0.1) == []  # it drops what it had and rejoins under a new id
        assert slow.member_id != old_id
    finally:
        slow.close()
        other.close()


def test_seek_by_offset_and_by_time(root):
    tp = TopicPartition("t", 0)
    with member(root, group=None) as reader:
        reader.assign([tp])
        everything = drain(reader, until=1)
        everything += drain(reader, timeout_s=0.2)
        reader.seek(tp, 5)
        assert reader.poll(timeout_s=0.1)[0].offset == 5
        seventh = next(r for r in everything if r.offset == 7)
        reader.seek_to_time(seventh.timestamp_ms)
        assert reader.position(tp) == 7
        reader.seek_to_time(10**12)  # after every record: the end
        assert reader.position(tp) == everything[-1].offset + 1
        assert reader.lag() == {tp: 0}
        with pytest.raises(ValueError, match="no group"):
            reader.commit()
    with member(root, settings=ConsumerSettings(auto_offset_reset="latest")) as latest:
        latest.subscribe(["t"])
        assert latest.poll(timeout_s=0.2) == []


def test_unknown_topics_and_groups_are_one_line(root):
    with member(root) as consumer, pytest.raises(UnknownTopicError, match="does not exist"):
        consumer.subscribe(["nope"])
    with FileLog(root) as log, pytest.raises(UnknownGroupError, match="headwater log groups"):
        log.describe_group("never")


def test_exactly_once_with_an_offset_store_fences_the_previous_owner(root, tmp_path):
    store = SqliteOffsetStore(tmp_path / "out.sqlite")
    store.connection.execute("CREATE TABLE out (p INTEGER, o INTEGER)")
    a = member(root, offset_store=store)
    try:
        a.subscribe(["t"])
        records = drain(a, until=100)
        with store.transaction() as db:
            db.executemany("INSERT INTO out VALUES (?, ?)", [(r.partition, r.offset) for r in records[:50]])
            commit_with_output(a, store, db, {TopicPartition(r.topic, r.partition): r.offset + 1 for r in records[:50]})
        # Another member claims every partition (as after a's lease ended): a's next save is refused.
        owners = {TopicPartition("t", p): "other@99" for p in range(4)}
        positions = store.claim("g", owners)
        assert sum(positions.values()) > 0
        with pytest.raises(FencedMemberError), store.transaction() as db:
            db.executemany("INSERT INTO out VALUES (?, ?)", [(r.partition, r.offset) for r in records[50:]])
            commit_with_output(a, store, db)
        assert store.connection.execute("SELECT count(*) FROM out").fetchone()[0] == 50  # rolled back
    finally:
        a.close()
        store.close()
