"""Property tests: the file backend against an in-memory model, with simulated crashes.

A crash is simulated by closing the log and truncating its last segment at a random
byte: every batch wholly before the cut must survive intact, the cut batch and
everything after it must disappear whole, and appends must continue from there.
"""

import os
import shutil
import tempfile
from pathlib import Path

from harness.topics import partition_records
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from log.base import Record, TopicSpec
from log.cleaner import Cleaner
from log.file.backend import FileLog
from log.file.batch_codec import parse_header
from log.file.segment import list_segments

TOPIC = "prop"
KEYS = [b"a", b"b", b"c", b"d", None]

records_strategy = st.lists(
    st.builds(
        Record,
        key=st.sampled_from(KEYS),
        value=st.one_of(st.none(), st.binary(max_size=120)),
        headers=st.lists(st.tuples(st.sampled_from(["h", "x-y"]), st.binary(max_size=8)), max_size=2).map(tuple),
        timestamp_ms=st.integers(min_value=0, max_value=2**41),
    ),
    min_size=1,
    max_size=12,
)


def as_tuple(record):
    return (record.offset, record.key, record.value, record.headers, record.timestamp_ms)


class FileLogMachine(RuleBasedStateMachine):
    @initialize()
    def open(self):
        self.dir = Path(tempfile.mkdtemp(prefix="hw-prop-"))
        self.log = FileLog(self.dir, fsync="never", segment_bytes=1024)
        self.log.create_topic(TopicSpec(TOPIC, partitions=1, min_compaction_lag_ms=0, delete_retention_ms=10**12))
        self.reader = FileLog(self.dir)
        self.model = []  # (offset, key, value, headers, timestamp) still held
        self.end = 0

    def teardown(self):
        if hasattr(self, "log"):
            self.log.close()
            self.reader.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    def held(self, log):
        return [as_tuple(r) for r in partition_records(log, TOPIC, 0, offset=0)]

    @rule(records=records_strategy)
    def append(self, records):
        result = self.log.append(TOPIC, 0, records)
        assert result.base_offset == self.end
        assert result.last_offset == self.end + len(records) - 1
        for i, r in enumerate(records):
            self.model.append((self.end + i, r.key, r.value, r.headers, r.timestamp_ms))
        self.end += len(records)

    @rule(
        at=st.integers(min_value=0, max_value=400),
        max_records=st.integers(min_value=1, max_value=50),
        other=st.booleans(),
    )
    def read(self, at, max_records, other):
        log = self.reader if other else self.log
        expected = [m for m in self.model if m[0] >= at][:max_records]
        assert [as_tuple(r) for r in log.read(TOPIC, 0, at, max_records=max_records)] == expected

    @rule()
    def compact(self):
        listing = list_segments(self.dir / TOPIC / "0")
        active_base = listing[-1][0]
        latest = {m[1]: m[0] for m in self.model if m[1] is not None}
        self.log.compact(TOPIC)
        held = self.held(self.log)
        model = {m[0]: m for m in self.model}
        for entry in held:
            assert model[entry[0]] == entry  # nothing invented or renumbered
        held_offsets = {h[0] for h in held}
        for offset, key, *_ in self.model:
            must_stay = key is None or latest[key] == offset or offset >= active_base
            if must_stay:
                assert offset in held_offsets, offset
        assert self.log.clean_offset(TOPIC, 0) <= active_base
        self.model = held

    @rule(hold=st.one_of(st.none(), st.integers(min_value=0, max_value=400)))
    def clean(self, hold):
        """The background cleaner's pass (only when due), never past a reader's hold."""
        active_base = list_segments(self.dir / TOPIC / "0")[-1][0]
        latest = {m[1]: m[0] for m in self.model if m[1] is not None}
        Cleaner(self.log, holds=None if hold is None else (lambda _topic: {0: hold})).run_once()
        held = self.held(self.log)
        model = {m[0]: m for m in self.model}
        assert all(model[entry[0]] == entry for entry in held)
        held_offsets = {h[0] for h in held}
        for offset, key, *_ in self.model:
            if key is None or latest[key] == offset or offset >= active_base or (hold is not None and offset >= hold):
                assert offset in held_offsets, offset
        self.model = held

    @precondition(lambda self: self.end > 0)
    @rule(fraction=st.floats(min_value=0.0, max_value=1.0))
    def crash_and_reopen(self, fraction):
        self.log.close()
        self.reader.close()
        listing = list_segments(self.dir / TOPIC / "0")
        base, path = listing[-1]
        data = path.read_bytes()
        cut = int(len(data) * fraction)
        surviving_end = base
        pos = 0
        survivors = set()
        while pos < len(data):
            header = parse_header(data, pos)
            if pos + header.length <= cut:
                survivors.update(range(header.base_offset, header.next_offset))
                surviving_end = header.next_offset
            pos += header.length
        os.truncate(path, cut)
        self.model = [m for m in self.model if m[0] < base or m[0] in survivors]
        self.end = surviving_end
        self.log = FileLog(self.dir, fsync="never", segment_bytes=1024)
        self.reader = FileLog(self.dir)
        assert self.held(self.reader) == self.model
        assert self.log.end_offset(TOPIC, 0) == self.end

    @rule()
    def clean_reopen(self):
        self.log.close()
        self.log = FileLog(self.dir, fsync="never", segment_bytes=1024)

    @invariant()
    def end_offset_matches(self):
        if hasattr(self, "log"):
            assert self.reader.end_offset(TOPIC, 0) == self.end


FileLogMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("HW_PROP_EXAMPLES", "25")),
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestFileLogAgainstModel = FileLogMachine.TestCase
