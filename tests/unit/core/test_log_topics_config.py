"""``log.topics`` and ``log.cleaner_interval_s`` in headwater.yaml: valid entries, and one-line errors."""

from pathlib import Path

import pytest

from core.config import parse_config
from core.errors import ConfigError

SOURCE = Path("headwater.yaml")


def config(topics):
    return parse_config({"project": "p", "log": {"topics": topics}}, SOURCE)


def test_entries_by_name_and_glob():
    parsed = config(
        {
            "shop.*": {"cleanup": "delete, compact", "retention_ms": 3_600_000, "segment_bytes": 65536},
            "shop.public.audit": {"cleanup": "delete", "retention_ms": -1},
            "feed_[ab]": {"min_compaction_lag_ms": 0, "delete_retention_ms": 1000},
        }
    )
    assert parsed.log.topics["shop.*"].cleanup == "compact,delete"
    assert parsed.log.topics["shop.public.audit"].retention_ms == -1
    assert list(parsed.log.topics) == ["shop.*", "shop.public.audit", "feed_[ab]"]  # file order: first glob wins
    assert parse_config({"project": "p"}, SOURCE).log.topics == {}


@pytest.mark.parametrize(
    ("topics", "message"),
    [
        ({"shop *": {}}, "log.topics: 'shop *' is not a topic name or glob"),
        ({"t": {"cleanup": "compakt"}}, "log.topics.t.cleanup: must be 'compact', 'delete' or 'compact,delete'"),
        ({"t": {"cleanup": "compact", "retention_ms": 5}}, "retention_ms and retention_bytes apply only with"),
        ({"t": {"retention_ms": -5}}, "log.topics.t.retention_ms: Input should be greater than or equal to -1"),
        ({"t": {"segment_bytes": 10}}, "log.topics.t.segment_bytes: Input should be greater than or equal to 1024"),
        ({"t": {"min_compaction_lag": 10}}, "log.topics.t.min_compaction_lag: unknown key"),
    ],
)
def test_bad_entries_are_one_line_naming_the_field(topics, message):
    with pytest.raises(ConfigError) as error:
        config(topics)
    assert message in str(error.value)
    assert str(error.value).startswith("headwater.yaml: log.topics") and "\n" not in str(error.value)


def test_cleaner_interval_must_be_positive():
    with pytest.raises(ConfigError, match=r"log\.cleaner_interval_s"):
        parse_config({"project": "p", "log": {"cleaner_interval_s": 0}}, SOURCE)
