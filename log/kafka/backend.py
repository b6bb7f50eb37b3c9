"""The ``kafka`` log backend: the :class:`~log.base.Log` protocol over a Kafka-protocol cluster.

The Kafka client library is behind :mod:`log.kafka.clients` (kafka-python by default,
confluent-kafka selectable); this module maps the Log contract onto it:

* **Atomicity**: an append is produced as one record batch in one produce request
  (see :mod:`log.kafka.clients`), which a broker writes to the partition as a unit.
* **Durability**: ``acks=all`` with an idempotent producer; append returns after the
  flush has every record acknowledged.
* **Topics**: created with ``cleanup.policy=compact`` (compacted) or ``delete`` plus
  ``retention.ms``/``retention.bytes``, and ``min.compaction.lag.ms`` and
  ``delete.retention.ms`` always; :meth:`KafkaLog.describe_topic` reads them back
  from the broker (DescribeConfigs), so no side store of specs is needed.
* **Compaction** is the broker's: :meth:`KafkaLog.compact` does not remove anything,
  and :meth:`KafkaLog.clean_offset` is the beginning offset, because Kafka does not
  expose its cleaner point; full-history readers on Kafka rely on
  ``min.compaction.lag.ms`` keeping every version younger than it.

The ``tansu`` broker (the Kafka-compatible broker of the test environment) is
detected (it reports no broker configs) and has two answers worked around here,
each where it is used: ListOffsets(latest) and ListOffsets(timestamp). It does not
compact at all, so :attr:`KafkaLog.supports_compaction` is ``False`` on it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from core.log_config import KafkaConfig
from log.base import (
    READ_MAX_BYTES,
    READ_MAX_RECORDS,
    AppendResult,
    CompactionResult,
    Record,
    StoredRecord,
    TopicPartition,
    TopicSpec,
)
from log.consumer import GroupDescription, GroupMember, partition_progress
from log.errors import (
    BatchTooLargeError,
    InvalidTopicNameError,
    LogError,
    LogUnavailableError,
    TopicExistsError,
    UnknownGroupError,
    UnknownPartitionError,
    UnknownTopicError,
)
from log.kafka.clients import (
    EARLIEST,
    LATEST,
    MAX_BATCH_RECORDS,
    ClientName,
    ClientSettings,
    KafkaClient,
    estimated_batch_bytes,
    open_client,
)
from log.topic_policy import TopicPolicies, cleanup_policy
from log.topics import validate_group_name, validate_topic_name

logger = logging.getLogger(__name__)

BrokerKind = Literal["auto", "kafka", "tansu"]

#: Kafka's own default when a topic does not say (``min.compaction.lag.ms``).
_KAFKA_MIN_COMPACTION_LAG_MS = 0
_KAFKA_DELETE_RETENTION_MS = 24 * 3600 * 1000
#: Topic configs KafkaLog derives from TopicSpec fields; anything else is ``TopicSpec.config``.
_MANAGED = frozenset(
    {
        "cleanup.policy",
        "retention.ms",
        "retention.bytes",
        "min.compaction.lag.ms",
        "delete.retention.ms",
        "max.message.bytes",
    }
)
_SCAN_CHUNK = 10_000


class KafkaLog:
    """Topics on a Kafka-protocol cluster (Apache Kafka, or tansu in tests)."""

    def __init__(
        self,
        config: KafkaConfig,
        *,
        client: ClientName | None = None,
        broker: BrokerKind = "auto",
        timeout_s: float = 30.0,
        read_wait_s: float = 2.0,
        max_batch_bytes: int = 16 * 1024 * 1024,
        policies: TopicPolicies | None = None,
    ) -> None:
        """Connect lazily to ``config.bootstrap_servers`` with ``client`` (default: ``config.client``).

        ``broker="auto"`` probes whether the cluster is tansu on first need;
        ``timeout_s`` bounds every broker round trip and flush; ``read_wait_s`` bounds
        how long a read waits for records it knows exist; ``policies`` (``log.topics``)
        replace parts of the specs of topics created here, and of existing topics' configs
        when the cleaner aligns them (:meth:`align_topic_configs`).
        """
        self._policies = policies or TopicPolicies()
        self.config = config
        self.client_name: ClientName = client or config.client
        self.max_batch_bytes = max_batch_bytes
        self._settings = ClientSettings(config=config, timeout_s=timeout_s, max_batch_bytes=max_batch_bytes)
        self._client: KafkaClient[Any, Any, Any] = open_client(self._settings, self.client_name)
        self._broker = broker
        self._read_wait_s = read_wait_s
        #: How long the end of a tansu partition may be unreadable below its high watermark before that
        #: range is taken for offsets tansu allocated but does not hold (see :meth:`_readable_end`).
        self.gap_wait_s = max(60.0, 2 * timeout_s)
        #: (topic, partition) -> (readable end, high watermark) of such a range, while the watermark stays.
        self._gaps: dict[tuple[str, int], tuple[int, int]] = {}
        self._partitions: dict[str, int] = {}
        #: Records fetched but held back by ``max_bytes``: (topic, partition, next offset, records).
        self._pending: tuple[str, int, int, list[StoredRecord]] | None = None
        self._closed = False

    def __repr__(self) -> str:
        return f"KafkaLog({self.config.bootstrap_servers!r}, client={self.client_name!r})"

    def __enter__(self) -> KafkaLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def client(self) -> KafkaClient[Any, Any, Any]:
        """The client library behind this log (the group consumer uses the same library and error guard)."""
        return self._client

    # -- broker kind -------------------------------------------------------------

    @property
    def is_tansu(self) -> bool:
        """Whether the cluster is tansu: Apache Kafka always reports its broker configs, tansu none."""
        if self._broker == "auto":
            self._broker = "kafka" if self._client.reports_broker_configs() else "tansu"
        return self._broker == "tansu"

    @property
    def supports_compaction(self) -> bool:
        """Whether the broker compacts compacted topics (tansu does not)."""
        return not self.is_tansu

    # -- topics --------------------------------------------------------------------

    def create_topic(self, spec: TopicSpec, *, exist_ok: bool = True) -> None:
        """Create a topic with its cleanup configs; with ``exist_ok`` an existing one is left as it is.

        Internal names (``_headwater.*``) are accepted here, as by the file backend;
        user-facing layers reject them.
        """
        validate_topic_name(spec.name, internal=True)
        spec = self._policies.apply(spec)
        if spec.partitions < 1:
            raise InvalidTopicNameError(spec.name, f"a topic needs at least one partition, not {spec.partitions}")
        created = self._client.create_topic(spec.name, spec.partitions, self._topic_configs(spec))
        if not created and not exist_ok:
            raise TopicExistsError(spec.name)
        self._partitions.pop(spec.name, None)

    def _topic_configs(self, spec: TopicSpec) -> dict[str, str]:
        configs = {"max.message.bytes": str(self.max_batch_bytes), **spec.config}
        configs.update(
            {
                "cleanup.policy": cleanup_policy(spec),
                "retention.ms": str(-1 if spec.retention_ms is None else spec.retention_ms),
                "retention.bytes": str(-1 if spec.retention_bytes is None else spec.retention_bytes),
                "min.compaction.lag.ms": str(spec.min_compaction_lag_ms),
                "delete.retention.ms": str(spec.delete_retention_ms),
            }
        )
        return configs

    def align_topic_configs(self, topic: str) -> bool:
        """Make the topic's cleaning configs those of its ``log.topics`` entry; whether any changed.

        The broker then compacts and deletes by them (:class:`log.cleaner.AlignsTopicConfigs`).
        """
        current = self.describe_topic(topic)
        wanted = self._policies.apply(current)
        if wanted == current:
            return False
        desired = self._topic_configs(wanted)
        reported = {key: c.value for key, c in self._client.topic_configs(topic).items()}
        changed = {key: value for key, value in desired.items() if reported.get(key) != value}
        if changed:
            self._client.alter_topic_configs(topic, changed)
        return bool(changed)

    def delete_topic(self, name: str) -> None:
        """Delete a topic and its records; :class:`UnknownTopicError` if there is none."""
        self._partitions.pop(name, None)
        if self._pending is not None and self._pending[0] == name:
            self._pending = None
        if not self._client.delete_topic(name):
            raise UnknownTopicError(name)

    def list_topics(self) -> list[str]:
        """Names of all topics, Headwater's internal ones included, the broker's own (``__*``) not."""
        self._partitions = self._client.topics()
        return sorted(name for name in self._partitions if not name.startswith("__"))

    def describe_topic(self, name: str) -> TopicSpec:
        """The topic's spec, read back from the broker's metadata and topic configs."""
        partitions = self._partition_count(name, refresh=True)
        configs = self._client.topic_configs(name)
        values = {key: c.value for key, c in configs.items()}

        def number(key: str, default: int | None) -> int | None:
            raw = values.get(key)
            if raw is None or int(raw) < 0:
                return default if raw is None else None
            return int(raw)

        # tansu reports exactly the configs a topic was created with, all labelled
        # as defaults; Apache Kafka reports every config and marks the topic's own.
        extra = {k: c.value for k, c in configs.items() if k not in _MANAGED and (c.override or self.is_tansu)}
        return TopicSpec(
            name=name,
            partitions=partitions,
            compacted="compact" in values.get("cleanup.policy", "delete").split(","),
            retention_ms=number("retention.ms", None),
            retention_bytes=number("retention.bytes", None),
            min_compaction_lag_ms=number("min.compaction.lag.ms", _KAFKA_MIN_COMPACTION_LAG_MS) or 0,
            delete_retention_ms=number("delete.retention.ms", _KAFKA_DELETE_RETENTION_MS) or 0,
            config=extra,
        )

    def _partition_count(self, topic: str, *, refresh: bool = False) -> int:
        if refresh or topic not in self._partitions:
            # A metadata request for all topics: asking for one unknown topic by name
            # makes tansu (and brokers with auto.create.topics.enable) create it.
            self._partitions = self._client.topics()
        count = self._partitions.get(topic)
        if count is None:
            raise UnknownTopicError(topic)
        return count

    def _check_partition(self, topic: str, partition: int) -> None:
        count = self._partition_count(topic)
        if not 0 <= partition < count:
            count = self._partition_count(topic, refresh=True)
            if not 0 <= partition < count:
                raise UnknownPartitionError(topic, partition, count)

    # -- records -------------------------------------------------------------------

    def append(self, topic: str, partition: int, records: Sequence[Record]) -> AppendResult:
        """Produce ``records`` as one record batch to one partition, acks=all; return their offsets.

        An empty batch writes nothing and returns ``end .. end - 1``, as the file backend does.
        """
        self._check_partition(topic, partition)
        if not records:
            end = self.end_offset(topic, partition)
            return AppendResult(topic=topic, partition=partition, base_offset=end, last_offset=end - 1)
        size = estimated_batch_bytes(records)
        if len(records) > MAX_BATCH_RECORDS or size > self.max_batch_bytes:
            raise BatchTooLargeError(
                topic, partition, len(records), size, limit=self.max_batch_bytes, max_records=MAX_BATCH_RECORDS
            )
        base, last = self._client.produce(topic, partition, records)
        if base < 0:  # acknowledged without an offset (a "duplicate" answer): not proof it is stored
            msg = f"{topic}/{partition}: acknowledged without an offset, the batch may or may not be stored"
            raise LogUnavailableError(msg)
        if last - base + 1 != len(records):
            msg = f"{topic}/{partition}: {len(records)} records were acknowledged at offsets {base}..{last}"
            raise LogError(msg)
        return AppendResult(topic=topic, partition=partition, base_offset=base, last_offset=last)

    def read(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_records: int = READ_MAX_RECORDS,
        max_bytes: int = READ_MAX_BYTES,
    ) -> list[StoredRecord]:
        """Read records at or after ``offset`` (see :meth:`log.base.Log.read`)."""
        self._check_partition(topic, partition)
        if max_records <= 0:
            return []
        offset = max(offset, 0)
        pending = self._pending
        if pending is not None and pending[:3] == (topic, partition, offset):
            fetched = pending[3]
        else:
            fetched = self._fetch(topic, partition, offset, max_records)
        self._pending = None
        taken: list[StoredRecord] = []
        size = 0
        for record in fetched:
            size += len(record.key or b"") + len(record.value or b"")
            if len(taken) == max_records or (taken and size > max_bytes):
                break
            taken.append(record)
        if len(taken) < len(fetched):
            self._pending = (topic, partition, taken[-1].offset + 1, fetched[len(taken) :])
        return taken

    def _fetch(self, topic: str, partition: int, offset: int, max_records: int) -> list[StoredRecord]:
        deadline = time.monotonic() + self._settings.timeout_s
        while True:
            fetched = self._fetch_once(topic, partition, offset, max_records)
            if fetched is not None:
                return fetched
            # Nothing arrived and no fetch response confirmed the end: ask the broker
            # (this raises LogUnavailableError if it is gone) before calling it the end.
            # Below the end, an empty answer is never "no more records": tansu on s3://
            # answers fetches with no records for seconds after a restart (measured), and
            # readers take [] for the end (capture's tail, feeds' offset ranges).
            end = self.end_offset(topic, partition)
            if offset >= end:
                return []
            if time.monotonic() >= deadline:
                msg = (
                    f"{topic}/{partition}: the broker returned no records at offset {offset} (end {end}) "
                    f"within {self._settings.timeout_s:g}s; the read can be retried"
                )
                raise LogUnavailableError(msg)

    def _fetch_once(self, topic: str, partition: int, offset: int, max_records: int) -> list[StoredRecord] | None:
        """One fetch (see :meth:`KafkaClient.fetch`), past a gap of offsets on tansu.

        tansu (after SIGKILLs) can hold no batch for offsets it allocated to a failed batch,
        and answers a fetch that starts in such a gap with nothing, however long one asks,
        while a fetch that starts at the record before brings the batches after the gap
        (measured: stuck at 544 of 704 for minutes). So where a fetch brings nothing, the
        one before is fetched once and what lies at or after ``offset`` is taken.
        """
        fetched = self._client.fetch(topic, partition, offset, max_records, self._read_wait_s)
        if fetched is not None or offset == 0 or not self.is_tansu:
            return fetched
        before = self._client.fetch(topic, partition, offset - 1, max_records + 1, self._read_wait_s)
        after = [record for record in before or () if record.offset >= offset]
        return after or None

    def beginning_offset(self, topic: str, partition: int) -> int:
        """The lowest offset still held."""
        self._check_partition(topic, partition)
        return self._client.list_offset(topic, partition, EARLIEST) or 0

    def end_offset(self, topic: str, partition: int) -> int:
        """The offset the next appended record will get (the high watermark)."""
        self._check_partition(topic, partition)
        end = self._client.list_offset(topic, partition, LATEST) or 0
        if self.is_tansu:
            end = self._readable_end(topic, partition, end)
        return end

    def _readable_end(self, topic: str, partition: int, listed: int) -> int:
        """The end of what tansu lets a reader fetch, read from the records at and after ``listed - 1``.

        tansu 0.6 answers ListOffsets(latest) with the base offset of the partition's last
        record batch + 1, not the offset after its last record, and after a restart with
        stale numbers; so the end is read: records are fetched from ``listed - 1`` until a
        fetch response's high watermark confirms nothing follows. Below the high watermark a
        fetch that brings nothing is not the end (taking it for one made readers stop short:
        ``read up to 436, end offset 417``): after a restart tansu serves the newest records
        only after a while (~30 s at load 12, measured). It is asked again; only when the
        range stays unreadable for ``gap_wait_s`` is it taken for offsets tansu allocated to a
        batch it does not hold (seen after SIGKILLs: records up to 95, high watermark 98,
        nothing at 96 or 97 ever), which a reader could otherwise never pass: the readable
        end is then the end, remembered until the high watermark moves.
        """
        position = max(listed - 1, 0)
        deadline = time.monotonic() + self.gap_wait_s
        while True:
            records = self._fetch_once(topic, partition, position, _SCAN_CHUNK)
            if records:
                position = records[-1].offset + 1
                continue
            if records is not None:  # a fetch response's high watermark confirmed the end
                return max(listed, position)
            watermark = self._client.fetched_end(topic, partition)
            if watermark is not None and self._gaps.get((topic, partition)) == (position, watermark):
                return position
            if time.monotonic() >= deadline:
                if watermark is None:
                    msg = (
                        f"{topic}/{partition}: the broker confirmed no end offset at or after {position} "
                        f"within {self.gap_wait_s:g}s; it can be asked again"
                    )
                    raise LogUnavailableError(msg)
                logger.warning(
                    "%s/%s: offsets %d..%d below the high watermark stayed unreadable for %gs; "
                    "taking them for a batch the broker does not hold",
                    topic,
                    partition,
                    position,
                    watermark - 1,
                    self.gap_wait_s,
                )
                self._gaps[(topic, partition)] = (position, watermark)
                return position

    def clean_offset(self, topic: str, partition: int) -> int:
        """The beginning offset: Kafka does not expose how far its cleaner has compacted.

        Full-history readers on Kafka rely on ``min.compaction.lag.ms``: versions
        younger than it are never compacted away.
        """
        return self.beginning_offset(topic, partition)

    def offset_for_time(self, topic: str, partition: int, timestamp_ms: int) -> int | None:
        """The earliest offset whose timestamp is at or after ``timestamp_ms``; ``None`` if none."""
        self._check_partition(topic, partition)
        if not self.is_tansu:
            return self._client.list_offset(topic, partition, timestamp_ms)
        # tansu 0.6 answers ListOffsets(timestamp) from the partition's first batch
        # only (later timestamps get "none"), so scan the records instead: linear in
        # the partition, acceptable for the test broker.
        position = self.beginning_offset(topic, partition)
        while records := self._fetch(topic, partition, position, _SCAN_CHUNK):
            for record in records:
                if record.timestamp_ms >= timestamp_ms:
                    return record.offset
            position = records[-1].offset + 1
        return None

    # -- consumer groups -----------------------------------------------------------

    def commit(self, group: str, offsets: Mapping[TopicPartition, int]) -> None:
        """Commit the group's next offsets through its group coordinator (no group join)."""
        for tp, offset in offsets.items():
            self._check_partition(tp.topic, tp.partition)
            if offset < 0:
                msg = f"{tp.topic}/{tp.partition}: cannot commit negative offset {offset}"
                raise ValueError(msg)
        if offsets:
            self._client.commit(group, {(tp.topic, tp.partition): o for tp, o in offsets.items()})

    def committed(self, group: str, topic: str) -> dict[int, int]:
        """The group's committed next offsets for the topic's partitions (absent: never committed)."""
        return self._client.committed(group, topic, self._partition_count(topic, refresh=True))

    def list_groups(self) -> list[str]:
        """Groups the cluster lists (tansu 0.6 lists none: name the group to describe it)."""
        return self._client.list_groups()

    def describe_group(self, group: str) -> GroupDescription:
        """Members and assignment as the broker reports them; committed offsets and lag per partition."""
        validate_group_name(group)
        info = self._client.describe_group(group)
        offsets = self._client.group_offsets(group)
        if not info.members and not offsets:
            raise UnknownGroupError(group)
        members = tuple(
            GroupMember(m.member_id, m.client, tuple(TopicPartition(t, p) for t, p in m.assignment))
            for m in info.members
        )
        owners = {tp: m.member_id for m in members for tp in m.assignment}
        topics = {topic for topic, _ in offsets} | {tp.topic for tp in owners}
        progress = partition_progress(self, group, topics, owners)
        return GroupDescription(group, info.state.lower(), None, members, tuple(progress))

    # -- cleaning ------------------------------------------------------------------

    def compact(self, topic: str) -> CompactionResult:
        """Report the topic's size; compaction and retention run inside the broker, on its schedule.

        Records are counted as end - beginning per partition (an upper bound once
        the broker has compacted); bytes are not exposed by the protocol and read 0.
        """
        records = sum(
            self.end_offset(topic, p) - self.beginning_offset(topic, p)
            for p in range(self._partition_count(topic, refresh=True))
        )
        return CompactionResult(
            topic=topic, records_before=records, records_after=records, bytes_before=0, bytes_after=0
        )

    def close(self) -> None:
        """Close the client's connections. Idempotent."""
        if not self._closed:
            self._closed = True
            self._pending = None
            self._client.close()
