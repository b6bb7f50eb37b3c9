"""The topics one source writes: their partition counts and their creation."""

from __future__ import annotations

from capture.transaction_records import transaction_topic
from core.log_config import LogConfig
from log.base import Log, TopicSpec, end_offsets
from log.errors import UnknownTopicError
from log.shards import hash_partitions
from log.topics import SCHEMAS_TOPIC, is_quarantine_topic, message_topic


class SourceTopics:
    """Creates a source's topics as they are first written, and knows their partition counts.

    Counts are cached in :attr:`counts` (topics never shrink, and capture is their only
    writer): ``_headwater.schemas`` has one partition, every other topic ``log.partitions``.
    They are the counts Kafka's partitioner spreads keys over: for a topic that was split
    or merged (:mod:`log.shards`) the partitions it was created with, so capture names a
    key's first partition and the file log appends to the open one covering it now.
    """

    def __init__(self, log: Log, config: LogConfig, source: str) -> None:
        self.log = log
        self.config = config
        self.source = source
        #: Partition counts of the topics seen so far, by topic.
        self.counts: dict[str, int] = {}
        self._event_streams = {message_topic(source), transaction_topic(source)}

    def partitions(self, topic: str) -> int:
        """The partition count of an existing ``topic``."""
        count = self.counts.get(topic)
        if count is None:
            count = self.counts[topic] = hash_partitions(self.log, topic, self.log.describe_topic(topic).partitions)
        return count

    def planned_partitions(self, topic: str) -> int:
        """The partition count ``topic`` has, or will have once :meth:`ensure` creates it."""
        count = self.counts.get(topic)
        if count is not None:
            return count
        try:
            return self.partitions(topic)
        except UnknownTopicError:
            return self._new_topic_partitions(topic)

    def _new_topic_partitions(self, topic: str) -> int:
        return 1 if topic == SCHEMAS_TOPIC else self.config.partitions

    def ensure(self, topic: str) -> int:
        """Create ``topic`` unless it exists; return its partition count."""
        count = self.counts.get(topic)
        if count is not None:
            return count
        cfg = self.config
        spec = TopicSpec(
            name=topic,
            partitions=self._new_topic_partitions(topic),
            # Quarantine keeps every bad record, the message and transaction topics every record
            # (their keys, a prefix or a transaction id, are not rows); table topics keep the latest
            # image per key.
            compacted=not is_quarantine_topic(topic) and topic not in self._event_streams,
            min_compaction_lag_ms=cfg.min_compaction_lag_s * 1000,
            delete_retention_ms=cfg.delete_retention_s * 1000,
        )
        self.log.create_topic(spec, exist_ok=True)
        return self.partitions(topic)

    def of_source(self) -> list[str]:
        """The source's topics that exist now (``<source>.*``)."""
        prefix = f"{self.source}."
        return [t for t in self.log.list_topics() if t.startswith(prefix)]

    def end_offsets(self, topic: str) -> dict[int, int]:
        """End offset per partition; empty for a topic not created yet (it holds nothing)."""
        try:
            return end_offsets(self.log, topic)
        except UnknownTopicError:
            return {}
