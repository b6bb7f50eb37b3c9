"""A sink's dead-letter topic: the records its target refused for good, with the reason, kept forever.

``headwater.sink.<name>.dead_letter`` (not compacted, no retention unless ``log.topics``
says so). Each record keeps the original key and value; headers name why
(``headwater.error``), the sink, and where the record came from (``headwater.topic``,
``headwater.partition``, ``headwater.offset``), so it can be inspected with
``headwater log tail`` and replayed by hand.
"""

from __future__ import annotations

from collections.abc import Sequence

from log.base import Log, Record, TopicSpec, append_keyed
from log.topics import ERROR_HEADER, dead_letter_topic
from sinks.records import Rejection


class DeadLetters:
    """Appends a sink's rejections to its dead-letter topic (durably, before the sink moves past them)."""

    def __init__(self, log: Log, sink: str, partitions: int) -> None:
        self.topic = dead_letter_topic(sink)
        self._log = log
        self._sink = sink
        self._partitions = partitions
        self._created = False
        self.count = 0

    def append(self, rejections: Sequence[Rejection]) -> None:
        """Store ``rejections``; returns once the log holds them."""
        if not rejections:
            return
        if not self._created:
            self._log.create_topic(TopicSpec(self.topic, self._partitions, compacted=False), exist_ok=True)
            self._created = True
        records = [
            Record(
                rejection.record.key,
                rejection.record.value,
                headers=(
                    (ERROR_HEADER, rejection.reason.encode()),
                    ("headwater.sink", self._sink.encode()),
                    ("headwater.topic", rejection.record.topic.encode()),
                    ("headwater.partition", str(rejection.record.partition).encode()),
                    ("headwater.offset", str(rejection.record.offset).encode()),
                ),
            )
            for rejection in rejections
        ]
        append_keyed(self._log, self.topic, records)
        self.count += len(records)
