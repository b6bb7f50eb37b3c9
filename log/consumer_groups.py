"""Consumer-group offsets kept in the compacted internal topic ``_headwater.offsets``.

Each commit appends one batch with a record per partition, keyed by
``[group, topic, partition]`` (JSON) with value ``{"offset": n}``; the latest record
of a key wins, so compaction keeps exactly the current offsets. A process keeps the
folded state in memory and refreshes it from the topic before answering, so commits
made by other processes are seen.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

import orjson

from log.base import Log, Record, TopicPartition, TopicSpec
from log.topics import OFFSETS_TOPIC

#: One partition keeps every group's commits in one order.
OFFSETS_SPEC = TopicSpec(name=OFFSETS_TOPIC, partitions=1, compacted=True, min_compaction_lag_ms=0)


def offsets_key(group: str, topic: str, partition: int) -> bytes:
    """The record key of a group's offset for one partition."""
    return orjson.dumps([group, topic, partition])


class ConsumerOffsets:
    """Commit and look up consumer-group offsets through a :class:`~log.base.Log`."""

    def __init__(self, log: Log) -> None:
        self._log = log
        self._lock = threading.Lock()
        self._position = 0
        self._offsets: dict[tuple[str, str], dict[int, int]] = {}
        self._created = False

    def _ensure_topic(self) -> None:
        if not self._created:
            self._log.create_topic(OFFSETS_SPEC, exist_ok=True)
            self._created = True

    def commit(self, group: str, offsets: Mapping[TopicPartition, int]) -> None:
        """Durably record ``group``'s next offsets (one atomic batch)."""
        if not offsets:
            return
        records = [
            Record(offsets_key(group, tp.topic, tp.partition), orjson.dumps({"offset": offset}))
            for tp, offset in offsets.items()
        ]
        with self._lock:
            self._ensure_topic()
            self._log.append(OFFSETS_TOPIC, 0, records)

    def committed(self, group: str, topic: str) -> dict[int, int]:
        """The latest committed offsets of ``group`` for ``topic``'s partitions."""
        with self._lock:
            self._ensure_topic()
            self._refresh()
            return dict(self._offsets.get((group, topic), {}))

    def groups(self) -> dict[str, set[str]]:
        """Every group that committed an offset still held → the topics it committed for."""
        with self._lock:
            self._ensure_topic()
            self._refresh()
            found: dict[str, set[str]] = {}
            for (group, topic), offsets in self._offsets.items():
                if offsets:
                    found.setdefault(group, set()).add(topic)
            return found

    def _refresh(self) -> None:
        while True:
            batch = self._log.read(OFFSETS_TOPIC, 0, self._position)
            if not batch:
                return
            for record in batch:
                if record.key is not None:
                    group, topic, partition = orjson.loads(record.key)
                    entry = self._offsets.setdefault((group, topic), {})
                    if record.value is None:
                        entry.pop(partition, None)
                    else:
                        entry[partition] = int(orjson.loads(record.value)["offset"])
            self._position = batch[-1].offset + 1
