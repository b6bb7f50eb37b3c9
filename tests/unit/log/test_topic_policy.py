"""log.topic_policy: which log.topics entry applies to a topic, and what it changes in the spec."""

from core.log_config import TopicCleaningConfig
from log.base import Record, TopicSpec
from log.file.backend import FileLog
from log.topic_policy import TopicPolicies, cleanup_policy, configured_segment_bytes

DAY = 24 * 3600 * 1000


def test_the_exact_name_wins_else_the_first_matching_glob_internal_topics_only_by_name():
    policies = TopicPolicies(
        {
            "shop.*": TopicCleaningConfig(min_compaction_lag_ms=1),
            "shop.public.orders": TopicCleaningConfig(min_compaction_lag_ms=2),
            "*": TopicCleaningConfig(min_compaction_lag_ms=3),
        }
    )
    assert policies.entry("shop.public.orders").min_compaction_lag_ms == 2
    assert policies.entry("shop.public.customers").min_compaction_lag_ms == 1
    assert policies.entry("feed").min_compaction_lag_ms == 3
    assert policies.entry("_headwater.offsets") is None
    assert not TopicPolicies() and TopicPolicies().entry("x") is None


def test_an_entry_replaces_only_what_it_sets():
    spec = TopicSpec("t", partitions=3, min_compaction_lag_ms=7 * DAY, delete_retention_ms=DAY)
    both = TopicPolicies({"t": TopicCleaningConfig(cleanup="compact,delete", retention_ms=1000, segment_bytes=4096)})
    applied = both.apply(spec)
    assert (applied.compacted, applied.retention_ms, applied.min_compaction_lag_ms) == (True, 1000, 7 * DAY)
    assert cleanup_policy(applied) == "compact,delete" and configured_segment_bytes(applied) == 4096
    delete = TopicPolicies({"t": TopicCleaningConfig(cleanup="delete", retention_ms=-1)}).apply(spec)
    assert (delete.compacted, delete.retention_ms, cleanup_policy(delete)) == (False, None, "delete")
    compact = TopicPolicies({"t": TopicCleaningConfig(cleanup="compact")}).apply(applied)
    assert (compact.retention_ms, cleanup_policy(compact)) == (None, "compact")
    assert TopicPolicies({"other": TopicCleaningConfig(cleanup="delete")}).apply(spec) is spec


def test_the_file_backend_describes_and_rolls_topics_by_their_entry(tmp_path):
    policies = TopicPolicies({"small*": TopicCleaningConfig(segment_bytes=1024, min_compaction_lag_ms=0)})
    with FileLog(tmp_path, policies=policies) as log:
        log.create_topic(TopicSpec("small", partitions=1))
        assert log.describe_topic("small").min_compaction_lag_ms == 0
        for i in range(40):
            log.append("small", 0, [Record(b"k%d" % (i % 3), b"x" * 200)])
        segments = sorted((tmp_path / "small" / "0").glob("*.log"))
        assert len(segments) > 2  # rolled at ~1 KiB, not at the log's default 128 MiB
        result = log.compact("small")
        assert result.records_after < result.records_before
