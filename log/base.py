"""The :class:`Log` protocol: topics of partitions of records, the centre of Headwater.

Both backends (:class:`log.file.backend.FileLog` and :class:`log.kafka.backend.KafkaLog`)
implement it and pass one conformance suite (``tests/integration/log/test_conformance.py``).

Contract, for every backend:

* **Ordering.** Within a partition, records keep the order in which they were
  appended; offsets are int64, start at 0 and grow by one per record. Compaction
  and retention remove records but never renumber the ones that stay, so a read
  may skip offsets.
* **Atomicity.** :meth:`Log.append` writes one batch to one partition; a reader
  sees either all of the batch or none of it.
* **Durability.** When :meth:`Log.append` returns, the batch survives a crash of the
  writer (file backend: fsynced, unless the topic's fsync policy says ``never``;
  Kafka: ``acks=all``). Callers acknowledge upstream only after append returns.
* **Keys.** Callers that route by key use :func:`log.partitioner.partition_for`, which
  equals Kafka's default partitioner, so both backends place a key alike. On the file
  backend a topic's partitions can be split and merged (:mod:`log.shards`): the log then
  appends each record to the open partition covering its key, and a key's records live in
  a chain of partitions that readers read parents first.
* **Compaction.** A compacted topic keeps at least the latest record per key. Records
  younger than ``min_compaction_lag_ms`` are never removed, and tombstones (null
  value) are removed only ``delete_retention_ms`` after compaction first saw them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol, runtime_checkable

from log.partitioner import partition_for
from log.shards import hash_partitions

DAY_MS = 24 * 3600 * 1000
#: How much a :meth:`Log.read` returns at most unless told: records, and about this many bytes.
READ_MAX_RECORDS = 10_000
READ_MAX_BYTES = 16 * 1024 * 1024


class TopicPartition(NamedTuple):
    """A partition of a topic."""

    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class Record:
    """A record to append. ``value=None`` is a tombstone; ``timestamp_ms=None`` means now."""

    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp_ms: int | None = None


class StoredRecord(NamedTuple):
    """A record read back from the log, with its position (immutable).

    A named tuple rather than a frozen dataclass: every read builds one per record, and a
    tuple is built in a quarter of the time (the file backend's reads, consumer polls).
    """

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """How a topic is laid out and cleaned.

    ``compacted`` topics keep the latest record per key (Kafka ``cleanup.policy=compact``);
    other topics delete whole segments older than ``retention_ms`` or beyond
    ``retention_bytes`` per partition (``None``: keep forever).
    """

    name: str
    partitions: int = 3
    compacted: bool = True
    retention_ms: int | None = None
    retention_bytes: int | None = None
    min_compaction_lag_ms: int = 7 * DAY_MS
    delete_retention_ms: int = DAY_MS
    config: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class AppendResult:
    """Where an appended batch landed: offsets ``base_offset .. last_offset`` of one partition."""

    topic: str
    partition: int
    base_offset: int
    last_offset: int


@dataclass(frozen=True, slots=True)
class CompactionResult:
    """What one compaction pass did to a topic."""

    topic: str
    records_before: int
    records_after: int
    bytes_before: int
    bytes_after: int


@runtime_checkable
class Log(Protocol):
    """A set of partitioned, append-only topics (see the module docstring for the contract)."""

    def create_topic(self, spec: TopicSpec, *, exist_ok: bool = True) -> None:
        """Create a topic; with ``exist_ok`` an existing topic is left as it is."""
        ...

    def delete_topic(self, name: str) -> None:
        """Delete a topic and all its records."""
        ...

    def list_topics(self) -> list[str]:
        """Names of all topics, internal ones included, sorted."""
        ...

    def describe_topic(self, name: str) -> TopicSpec:
        """The topic's spec; :class:`~log.errors.UnknownTopicError` if it does not exist."""
        ...

    def append(self, topic: str, partition: int, records: Sequence[Record]) -> AppendResult:
        """Append ``records`` to one partition atomically and durably; return their offsets."""
        ...

    def read(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_records: int = READ_MAX_RECORDS,
        max_bytes: int = READ_MAX_BYTES,
    ) -> list[StoredRecord]:
        """Read records at or after ``offset`` in offset order.

        At most ``max_records`` and about ``max_bytes`` (at least one record if any is
        there); empty at the end of the partition. Batches appended by other processes
        become visible without reopening.
        """
        ...

    def beginning_offset(self, topic: str, partition: int) -> int:
        """The lowest offset still held (retention may have removed earlier ones)."""
        ...

    def end_offset(self, topic: str, partition: int) -> int:
        """The offset the next appended record will get (Kafka's high watermark)."""
        ...

    def clean_offset(self, topic: str, partition: int) -> int:
        """Return the offset from which every record is still held.

        Before it, compaction may have removed superseded versions; full-history
        readers (SCD2 backfills, reprocessing) start at or after it.
        """
        ...

    def offset_for_time(self, topic: str, partition: int, timestamp_ms: int) -> int | None:
        """The earliest offset whose timestamp is at or after ``timestamp_ms``; ``None`` if none."""
        ...

    def commit(self, group: str, offsets: Mapping[TopicPartition, int]) -> None:
        """Record a consumer group's next offsets to read (durable, like :meth:`append`)."""
        ...

    def committed(self, group: str, topic: str) -> dict[int, int]:
        """The group's committed next offsets for the topic's partitions (absent: never committed)."""
        ...

    def compact(self, topic: str) -> CompactionResult:
        """Run one compaction (compacted topics) or retention (other topics) pass now."""
        ...

    def close(self) -> None:
        """Release files, locks and connections. Idempotent."""
        ...


def end_offsets(log: Log, topic: str) -> dict[int, int]:
    """End offsets of every partition of ``topic``."""
    spec = log.describe_topic(topic)
    return {p: log.end_offset(topic, p) for p in range(spec.partitions)}


def lag(log: Log, group: str, topic: str) -> dict[int, int]:
    """Records per partition that ``group`` has not yet committed past."""
    committed = log.committed(group, topic)
    return {p: end - committed.get(p, log.beginning_offset(topic, p)) for p, end in end_offsets(log, topic).items()}


def append_keyed(log: Log, topic: str, records: Iterable[Record]) -> list[AppendResult]:
    """Route records by key with Kafka's partitioner; one atomic batch per partition, in order.

    On a split topic (:mod:`log.shards`) the partitioner spreads keys over the partitions the
    topic was created with, and the log appends each to the open partition covering it now.
    """
    partitions = hash_partitions(log, topic, log.describe_topic(topic).partitions)
    by_partition: dict[int, list[Record]] = {}
    for record in records:
        by_partition.setdefault(partition_for(record.key, partitions), []).append(record)
    return [log.append(topic, p, batch) for p, batch in sorted(by_partition.items())]
