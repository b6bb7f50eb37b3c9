"""Where capture resumes: the last sequence the log already holds, per partition.

The agent acknowledges an LSN to Postgres only after every event up to it is
durable in the log, so on restart Postgres re-sends from at or before the last
acknowledged commit. Events of one transaction may span several partitions that
were appended one after another; a crash between those appends leaves some
partitions with the transaction and some without. Skipping an event exactly when
its partition already holds a sequence at or past it therefore writes every event
once: within a partition, events are appended in sequence order.

On a topic that was split or merged (:mod:`log.shards`) a key's events live in a chain
of partitions (the sealed parents, then the open child), appended one after another in
sequence order; an event is skipped when any partition of its key's chain holds a
sequence at or past it.
"""

from __future__ import annotations

from collections.abc import Iterable

import orjson

from capture.records import SEQUENCE_HEADER
from log.base import Log, StoredRecord, TopicPartition
from log.sequence import Sequence
from log.shards import ShardMap, shard_map_of

# How far back from a partition's end to look for the last change event; records
# without a sequence (tombstones) sit between events, never more than one in a row.
_TAIL_WINDOW = 8


def _sequence_of(record: StoredRecord) -> Sequence | None:
    for name, header in record.headers:
        if name == SEQUENCE_HEADER:  # BEGIN/END records: no source block
            commit_lsn, txn_index = header.split(b":")
            return Sequence(int(commit_lsn), int(txn_index))
    value = record.value
    if value is None:
        return None
    source = orjson.loads(value).get("source")
    if not source or "commit_lsn" not in source:
        return None
    return Sequence(int(source["commit_lsn"]), int(source["txn_index"]))


def read_between(log: Log, topic: str, partition: int, first: int, end: int) -> list[StoredRecord]:
    """Every record of ``[first, end)``: one read may return fewer (tansu on s3:// sends a batch per fetch)."""
    records: list[StoredRecord] = []
    while first < end and (batch := log.read(topic, partition, first, max_records=end - first)):
        records.extend(r for r in batch if r.offset < end)
        first = batch[-1].offset + 1
    return records


def last_sequence(log: Log, topic: str, partition: int) -> Sequence | None:
    """The highest sequence stored in one partition (``None`` when it holds no event)."""
    end = log.end_offset(topic, partition)
    start = log.beginning_offset(topic, partition)
    window = _TAIL_WINDOW
    while end > start:
        first = max(start, end - window)
        records = read_between(log, topic, partition, first, end)
        for record in reversed(records):
            sequence = _sequence_of(record)
            if sequence is not None:
                return sequence
        end = first
        window *= 4
    return None


class ResumePoint:
    """Per-partition high-water sequences, loaded once at start and advanced on append."""

    def __init__(self, last: dict[TopicPartition, Sequence], shards: dict[str, ShardMap] | None = None) -> None:
        self._last = {where: (s.commit_lsn, s.txn_index) for where, s in last.items()}
        self._highest = max(self._last.values(), default=None)
        #: Partition maps of the topics that were split or merged, as loaded.
        self._shards = dict(shards or {})

    @classmethod
    def load(cls, log: Log, topics: Iterable[str]) -> ResumePoint:
        """Read the tail of every partition of ``topics`` that exist."""
        existing = set(log.list_topics())
        last: dict[TopicPartition, Sequence] = {}
        shards: dict[str, ShardMap] = {}
        for topic in topics:
            if topic not in existing:
                continue
            found = shard_map_of(log, topic)
            if found is not None:
                shards[topic] = found
            for partition in range(log.describe_topic(topic).partitions):  # sealed partitions too
                sequence = last_sequence(log, topic, partition)
                if sequence is not None:
                    last[TopicPartition(topic, partition)] = sequence
        return cls(last, shards)

    def refresh(self, log: Log, topics: Iterable[str]) -> None:
        """Re-read the partitions' tails: an append that failed may still have landed (Kafka)."""
        loaded = ResumePoint.load(log, topics)
        self._shards.update(loaded._shards)
        for where, (commit_lsn, txn_index) in loaded._last.items():
            self.advance_to(where, commit_lsn, txn_index)

    def may_hold(self, commit_lsn: int, txn_index: int) -> bool:
        """False when no partition holds ``(commit_lsn, txn_index)`` or anything after it.

        Events leave the agent in sequence order, so once this is False for the first
        pending event, no later one needs :meth:`already_stored` (the per-record check
        only runs right after a restart).
        """
        return self._highest is not None and (commit_lsn, txn_index) <= self._highest

    def already_stored(self, where: TopicPartition, sequence: Sequence, key: bytes | None = None) -> bool:
        """True when ``where`` (or, on a split topic, the chain of ``key``'s partitions) holds ``sequence``.

        ``where`` is the partition the key was routed to by Kafka's partitioner over the
        topic's first partitions, a member of the key's chain.
        """
        shards = self._shards.get(where.topic)
        if shards is None:
            held = self._last.get(where)
        else:
            found = [self._last.get(TopicPartition(where.topic, p)) for p in shards.chain(key)]
            found.append(self._last.get(where))
            held = max((h for h in found if h is not None), default=None)
        return held is not None and (sequence.commit_lsn, sequence.txn_index) <= held

    def advance(self, where: TopicPartition, sequence: Sequence) -> None:
        """Record that ``sequence`` is now durable in ``where``."""
        self.advance_to(where, sequence.commit_lsn, sequence.txn_index)

    def advance_to(self, where: TopicPartition, commit_lsn: int, txn_index: int) -> None:
        """Record that ``(commit_lsn, txn_index)`` is now durable in ``where``."""
        at = (commit_lsn, txn_index)
        held = self._last.get(where)
        if held is None or held < at:
            self._last[where] = at
            if self._highest is None or self._highest < at:
                self._highest = at

    def highest(self) -> Sequence | None:
        """The highest sequence stored anywhere (the snapshot/stream boundary check uses it)."""
        return None if self._highest is None else Sequence(*self._highest)
