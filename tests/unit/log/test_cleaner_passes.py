"""log.cleaner on the file backend: passes only when due, holds, schema versions kept, usage, full-history checks."""

import pytest

from core.log_config import TopicCleaningConfig
from log.base import Record, TopicSpec
from log.cleaner import Cleaner
from log.errors import IncompleteHistoryError
from log.file.backend import FileLog
from log.history import require_full_history
from log.topic_policy import TopicPolicies
from log.topics import SCHEMAS_TOPIC


@pytest.fixture
def log(tmp_path):
    with FileLog(tmp_path, segment_bytes=1024) as opened:
        yield opened


def fill(log, topic, n, keys=5, partition=0):
    for i in range(n):
        log.append(topic, partition, [Record(b"k%d" % (i % keys), b"v%d" % i + b"." * 100)])


def test_a_pass_runs_only_when_it_could_remove_something_new(log):
    log.create_topic(TopicSpec("c", partitions=1, min_compaction_lag_ms=0, delete_retention_ms=0))
    cleaner = Cleaner(log)
    assert cleaner.run_once() == []  # one active segment: nothing to clean
    fill(log, "c", 60)
    [done] = cleaner.run_once()
    assert done.result.records_after < done.result.records_before == 60
    assert "->" in done.describe()
    assert cleaner.run_once() == []  # nothing new since
    fill(log, "c", 30)  # new closed segments
    assert [d.topic for d in cleaner.run_once()] == ["c"]


def test_holds_keep_what_a_reader_has_not_read(log):
    log.create_topic(TopicSpec("c", partitions=1, min_compaction_lag_ms=0))
    fill(log, "c", 90)
    cleaner = Cleaner(log, holds=lambda topic: {0: 20})
    cleaner.run_once()
    assert log.clean_offset("c", 0) <= 20
    held = [r.offset for r in log.read("c", 0, 0, max_records=1000)]
    assert set(range(20, 90)) <= set(held)
    assert Cleaner(log, holds=lambda topic: {0: 20}).run_once() == []  # the same hold: not due
    moved = Cleaner(log, holds=lambda topic: {0: 80}).run_once()  # the reader moved on: due again
    assert moved and log.clean_offset("c", 0) > 20


def test_schema_versions_are_never_cleaned(log):
    log.create_topic(TopicSpec(SCHEMAS_TOPIC, partitions=1, min_compaction_lag_ms=0))
    fill(log, SCHEMAS_TOPIC, 60, keys=1)
    assert Cleaner(log).run_once() == []
    assert len(log.read(SCHEMAS_TOPIC, 0, 0, max_records=1000)) == 60


def test_compact_and_delete_and_usage(tmp_path):
    entry = TopicCleaningConfig(cleanup="compact,delete", retention_ms=1, min_compaction_lag_ms=0)
    policies = TopicPolicies({"c": entry})
    with FileLog(tmp_path, segment_bytes=1024, policies=policies) as log:
        log.create_topic(TopicSpec("c", partitions=1))
        fill(log, "c", 60)
        before = log.usage("c")
        assert before.dirty_ratio == 1.0 and before.bytes > before.closed_bytes > 0
        Cleaner(log).run_once()
        after = log.usage("c")
        assert after.bytes < before.bytes and after.dirty_ratio == 0.0
        assert log.beginning_offset("c", 0) > 0  # retention deleted the old segments
        assert log.clean_offset("c", 0) >= log.beginning_offset("c", 0)


def test_full_history_is_refused_in_one_line_after_compaction(log):
    log.create_topic(TopicSpec("c", partitions=2, min_compaction_lag_ms=0))
    fill(log, "c", 60)
    require_full_history(log, "c", {0: 0, 1: 0}, what="a rebuild", remedy="do something else")
    log.compact("c")
    clean = log.clean_offset("c", 0)
    with pytest.raises(IncompleteHistoryError) as refused:
        require_full_history(log, "c", {0: 0, 1: 0}, what="a rebuild", remedy="do something else")
    message = str(refused.value)
    assert f"offset {clean} on" in message and "a rebuild needs offset 0; do something else" in message
    assert "\n" not in message and refused.value.partition == 0
    require_full_history(log, "c", {0: clean, 1: 0}, what="a later rebuild", remedy="-")
