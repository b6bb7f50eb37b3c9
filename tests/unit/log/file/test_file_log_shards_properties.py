"""Property tests: the file log's state machine with split, merge and the cleaner's pass, per-key order checked.

The companion of ``test_file_log_properties.py`` (one partition, crashes): here a topic of
two partitions is appended to by key, split, merged, cleaned and reopened in any order. After
every step each key's records, read along its chain of partitions (parents first), are in the
order they were written; before any clean they are exactly the records written; a clean keeps
at least each key's latest record; sealed partitions never grow.
"""

import os
import shutil
import tempfile
from pathlib import Path

from harness.topics import partition_records
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from log.base import Record, TopicSpec, append_keyed
from log.cleaner import Cleaner
from log.file.backend import FileLog
from log.partitioner import partition_for

TOPIC = "shards"
KEYS = [b"a", b"b", b"c", b"d", b"e", b"f", b"g", None]


class ShardedFileLogMachine(RuleBasedStateMachine):
    @initialize()
    def open(self):
        self.dir = Path(tempfile.mkdtemp(prefix="hw-shards-"))
        self.log = FileLog(self.dir, fsync="never", segment_bytes=512)
        self.log.create_topic(TopicSpec(TOPIC, partitions=2, min_compaction_lag_ms=0, delete_retention_ms=10**12))
        self.reader = FileLog(self.dir)  # another process's view
        self.written: dict[bytes | None, list[int]] = {}
        self.held: dict[bytes | None, list[int]] = {}
        self.counter = 0
        self.sealed: dict[int, int] = {}

    def teardown(self):
        if hasattr(self, "log"):
            self.log.close()
            self.reader.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    def read_chains(self, log):
        shards = log.shard_map(TOPIC)
        count = log.describe_topic(TOPIC).partitions
        per_partition = {p: partition_records(log, TOPIC, p) for p in range(count)}
        got: dict[bytes | None, list[int]] = {}
        for key in KEYS:
            chain = [partition_for(key, 2)] if shards is None else shards.chain(key)
            got[key] = [int(r.value) for p in chain for r in per_partition[p] if r.key == key]
        # A plain reader going through partitions in number order sees the same per-key sequences.
        plain: dict[bytes | None, list[int]] = {}
        for p in range(count):
            for r in per_partition[p]:
                plain.setdefault(r.key, []).append(int(r.value))
        assert {k: v for k, v in got.items() if v} == plain
        return got

    @rule(keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=15))
    def append(self, keys):
        records = []
        for key in keys:
            records.append(Record(key, b"%d" % self.counter))
            self.written.setdefault(key, []).append(self.counter)
            self.held.setdefault(key, []).append(self.counter)
            self.counter += 1
        append_keyed(self.log, TOPIC, records)

    def open_shards(self):
        shards = self.log.shard_map(TOPIC)
        if shards is None:
            return [(0, 0, 2**30), (1, 2**30, 2**31)]
        return [(s.number, s.lo, s.hi) for s in shards.open_shards()]

    @rule(pick=st.integers(0, 100), cut=st.floats(0.01, 0.99), other=st.booleans())
    def split(self, pick, cut, other):
        opened = self.open_shards()
        number, lo, hi = opened[pick % len(opened)]
        if hi - lo < 2:
            return
        at = min(hi - 1, max(lo + 1, lo + int((hi - lo) * cut)))
        shards = (self.reader if other else self.log).split_partition(TOPIC, number, at=at)
        self.sealed[number] = shards.shard(number).sealed_end
        assert self.sealed[number] == self.log.end_offset(TOPIC, number)

    @precondition(lambda self: len(self.open_shards()) > 1)
    @rule(pick=st.integers(0, 100), other=st.booleans())
    def merge(self, pick, other):
        opened = self.open_shards()
        i = pick % (len(opened) - 1)
        first, second = opened[i][0], opened[i + 1][0]
        shards = (self.reader if other else self.log).merge_partitions(TOPIC, second, first)
        for number in (first, second):
            self.sealed[number] = shards.shard(number).sealed_end

    @rule()
    def clean(self):
        Cleaner(self.log).run_once()
        got = self.read_chains(self.log)
        for key, values in self.held.items():
            kept = got.get(key, [])
            it = iter(values)
            assert all(v in it for v in kept), (key, kept, values)  # a subsequence, in order
            if values:
                assert kept and kept[-1] == values[-1]  # the latest per key stays
        self.held = {k: v for k, v in got.items() if v}

    @rule()
    def reopen(self):
        self.log.close()
        self.log = FileLog(self.dir, fsync="never", segment_bytes=512)

    @invariant()
    def every_key_in_order(self):
        if not hasattr(self, "log"):
            return
        got = self.read_chains(self.reader)
        assert {k: v for k, v in got.items() if v} == {k: v for k, v in self.held.items() if v}
        for number, end in self.sealed.items():
            assert self.reader.end_offset(TOPIC, number) == end


ShardedFileLogMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("HW_PROP_EXAMPLES", "25")),
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestShardedFileLogAgainstModel = ShardedFileLogMachine.TestCase
