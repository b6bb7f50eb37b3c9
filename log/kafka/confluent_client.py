"""The :class:`~log.kafka.clients.KafkaClient` over confluent-kafka (librdkafka)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeoutError
from contextlib import suppress
from typing import Any, ClassVar, TypeVar

from confluent_kafka import (
    OFFSET_INVALID,
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

# confluent_kafka.admin re-exports these without __all__, which mypy --strict flags.
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewTopic,
    ResourceType,
)

from log.base import Record, StoredRecord
from log.consumer import ConsumerSettings
from log.errors import LogError, UnknownTopicError
from log.kafka.clients import (
    APPEND_UNSURE,
    EARLIEST,
    FETCH_MAX_WAIT_MS,
    GROUP_HEARTBEAT_INTERVAL_MS,
    GROUP_SESSION_TIMEOUT_MS,
    LATEST,
    LINGER_MS,
    MAX_BATCH_RECORDS,
    ClientSettings,
    ConfigValue,
    GroupInfo,
    KafkaClient,
    MemberInfo,
    OffsetOutOfRange,
    authentication_failed,
    unavailable,
)
from log.kafka.security import librdkafka_security

_LOCAL_UNKNOWN = {KafkaError._UNKNOWN_TOPIC, KafkaError._UNKNOWN_PARTITION}
#: librdkafka reports a refused login or TLS handshake only through ``error_cb``.
_LOGIN_FAILURES = {KafkaError._AUTHENTICATION, KafkaError._SSL}
_AUTHORIZATION_FAILURES = {KafkaError.CLUSTER_AUTHORIZATION_FAILED, KafkaError.TOPIC_AUTHORIZATION_FAILED}

_T = TypeVar("_T")


def _code(exc: BaseException) -> int | None:
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        return int(exc.args[0].code())
    return None


def _reason(exc: BaseException) -> str:
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        return str(exc.args[0].name())
    return type(exc).__name__


def _headers(raw: Any) -> tuple[tuple[str, bytes], ...]:
    items = raw.items() if isinstance(raw, dict) else (raw or ())
    return tuple((k, v.encode() if isinstance(v, str) else (v or b"")) for k, v in items)


def stored_record(message: Message) -> StoredRecord:
    """A fetched message (without an error) as a :class:`~log.base.StoredRecord`."""
    return StoredRecord(
        topic=str(message.topic()),
        partition=int(message.partition() or 0),
        offset=int(message.offset() or 0),
        timestamp_ms=int(message.timestamp()[1]),
        key=message.key(),
        value=message.value(),
        headers=_headers(message.headers()),
    )


class ConfluentClient(KafkaClient[AdminClient, Producer, Consumer]):
    """confluent-kafka admin, producer, reader and group consumers, created on first use."""

    library_errors: ClassVar[tuple[type[BaseException], ...]] = (
        KafkaException,
        FutureTimeoutError,
        BufferError,
        OSError,
    )

    def __init__(self, settings: ClientSettings) -> None:
        #: The last refused login (SASL or TLS) librdkafka reported; turns "transport failure" into its cause.
        self._login_failure: str | None = None
        common: dict[str, Any] = {
            "bootstrap.servers": settings.config.bootstrap_servers,
            "client.id": settings.client_id,
            "socket.timeout.ms": settings.timeout_ms,
            # librdkafka logs to stderr by default; KafkaLog reports errors itself.
            "log_level": 0,
            "error_cb": self._on_error,
            **librdkafka_security(settings.config),
        }
        super().__init__(settings, common)

    def _log_error(self, exc: BaseException, action: str, topic: str | None) -> LogError:
        code = _code(exc)
        if topic is not None and code == KafkaError.UNKNOWN_TOPIC_OR_PART:
            return UnknownTopicError(topic)
        if topic is not None and code in _LOCAL_UNKNOWN and topic not in self.topics():
            # librdkafka says "unknown partition" also when it merely has no
            # metadata (broker down); only the cluster's metadata can tell.
            return UnknownTopicError(topic)
        if self._admin is not None:
            self._admin.poll(0)  # serves error_cb, which librdkafka calls only from poll
        if self._login_failure is not None:
            return authentication_failed(self.settings, action, self._login_failure)
        return unavailable(self.settings, action, _reason(exc))

    def _on_error(self, error: KafkaError) -> None:
        if error.code() in _LOGIN_FAILURES:
            self._login_failure = str(error.str())

    def _result(self, future: Future[_T]) -> _T:
        return future.result(timeout=self.settings.timeout_s + 1)

    # -- clients ----------------------------------------------------------------------

    def _new_admin(self) -> AdminClient:
        return AdminClient(self._common)

    def _new_producer(self) -> Producer:
        size = self.settings.max_batch_bytes
        return Producer(
            {
                **self._common,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": LINGER_MS,
                # One append must leave as one message set: never cut by size or count.
                "batch.size": size,
                "message.max.bytes": size,
                "batch.num.messages": MAX_BATCH_RECORDS,
                "queue.buffering.max.messages": 2 * MAX_BATCH_RECORDS,
                "message.timeout.ms": self.settings.delivery_timeout_ms,
            }
        )

    def _new_reader(self) -> Consumer:
        fetch_bytes = self.settings.fetch_max_bytes
        return Consumer(
            {
                **self._common,
                # Required by librdkafka; the reader only assigns, it never joins or commits.
                "group.id": f"{self.settings.client_id}.reader",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                # An offset outside the log is reported, so read() can tell "retention
                # removed it" (start at the beginning) from "past the end" (empty).
                "auto.offset.reset": "error",
                # No transactions are used; do not depend on the last stable offset.
                "isolation.level": "read_uncommitted",
                "fetch.wait.max.ms": FETCH_MAX_WAIT_MS,
                "fetch.max.bytes": fetch_bytes,
                "max.partition.fetch.bytes": self.settings.partition_fetch_max_bytes,
                "receive.message.max.bytes": fetch_bytes + 1024 * 1024,
                "allow.auto.create.topics": False,
            }
        )

    def _new_group_consumer(self, group: str) -> Consumer:
        return Consumer(
            {
                **self._common,
                "group.id": group,
                "enable.auto.commit": False,
                "session.timeout.ms": GROUP_SESSION_TIMEOUT_MS,
                "heartbeat.interval.ms": GROUP_HEARTBEAT_INTERVAL_MS,
                "allow.auto.create.topics": False,
            }
        )

    def new_member(self, group: str | None, settings: ConsumerSettings) -> Consumer:
        """A consumer that joins ``group`` when it subscribes; it never commits or stores offsets by itself."""
        fetch_bytes = self.settings.fetch_max_bytes
        return Consumer(
            {
                **self._common,
                # librdkafka needs a group id even to only assign partitions.
                "group.id": group or f"{self.settings.client_id}.reader",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                # Start positions are chosen and assigned by the group consumer; this only covers a gap.
                "auto.offset.reset": settings.auto_offset_reset,
                "session.timeout.ms": settings.session_timeout_ms,
                "heartbeat.interval.ms": settings.heartbeat_interval_ms,
                "max.poll.interval.ms": settings.max_poll_interval_ms,
                "isolation.level": "read_uncommitted",
                "fetch.wait.max.ms": FETCH_MAX_WAIT_MS,
                "fetch.max.bytes": fetch_bytes,
                "max.partition.fetch.bytes": self.settings.partition_fetch_max_bytes,
                "receive.message.max.bytes": fetch_bytes + 1024 * 1024,
                "allow.auto.create.topics": False,
            }
        )

    # -- topics -----------------------------------------------------------------------

    def topics(self) -> dict[str, int]:
        """Topic name → partition count; metadata for all topics never auto-creates one."""
        with self._guard("list topics"):
            metadata = self._admin_client().list_topics(timeout=self.settings.timeout_s)
        return {name: len(t.partitions) for name, t in metadata.topics.items() if t.error is None}

    def _create_topic(self, name: str, partitions: int, configs: Mapping[str, str]) -> None:
        topic = NewTopic(name, num_partitions=partitions, config=dict(configs))
        futures = self._admin_client().create_topics(
            [topic], operation_timeout=self.settings.timeout_s, request_timeout=self.settings.timeout_s
        )
        self._result(futures[name])

    def _already_exists(self, exc: BaseException) -> bool:
        return _code(exc) == KafkaError.TOPIC_ALREADY_EXISTS

    def _delete_topic(self, name: str) -> None:
        futures = self._admin_client().delete_topics(
            [name], operation_timeout=self.settings.timeout_s, request_timeout=self.settings.timeout_s
        )
        self._result(futures[name])

    def topic_configs(self, name: str) -> dict[str, ConfigValue]:
        """Every config the broker reports for the topic."""
        resource = ConfigResource(ResourceType.TOPIC, name)
        with self._guard("describe topic configs", name):
            futures = self._admin_client().describe_configs([resource], request_timeout=self.settings.timeout_s)
            entries = self._result(next(iter(futures.values())))
        return {
            key: ConfigValue(str(entry.value), int(entry.source) == ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
            for key, entry in entries.items()
            if entry.value is not None
        }

    def alter_topic_configs(self, name: str, configs: Mapping[str, str]) -> None:
        """Set these configs of the topic (IncrementalAlterConfigs: the others stay)."""
        entries = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in configs.items()]
        resource = ConfigResource(ResourceType.TOPIC, name, incremental_configs=entries)
        with self._guard("alter topic configs", name):
            futures = self._admin_client().incremental_alter_configs([resource])
            self._result(futures[resource])

    def _any_broker_id(self, admin: AdminClient) -> str:
        return str(next(iter(admin.list_topics(timeout=self.settings.timeout_s).brokers)))

    def _has_broker_configs(self, admin: AdminClient, broker: str) -> bool:
        futures = admin.describe_configs(
            [ConfigResource(ResourceType.BROKER, broker)], request_timeout=self.settings.timeout_s
        )
        return bool(self._result(next(iter(futures.values()))))

    def _refused_authorization(self, exc: BaseException) -> bool:
        return _code(exc) in _AUTHORIZATION_FAILURES

    # -- records ----------------------------------------------------------------------

    def produce(self, topic: str, partition: int, records: Sequence[Record]) -> tuple[int, int]:
        """Write ``records`` as one message set; return (base, last) offsets."""
        offsets: list[int] = []
        errors: list[KafkaError] = []

        def delivered(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                errors.append(err)
            else:
                offset = msg.offset()
                offsets.append(-1 if offset is None or offset < 0 else int(offset))

        with self._producing(topic) as producer:
            for r in records:
                producer.produce(
                    topic,
                    value=r.value,
                    key=r.key,
                    partition=partition,
                    timestamp=r.timestamp_ms or 0,
                    headers=list(r.headers) or None,
                    on_delivery=delivered,
                )
            left = producer.flush(self.settings.timeout_s)
            if left:
                raise unavailable(
                    self.settings,
                    "append",
                    f"{left} records not acknowledged in time, the batch may or may not be in the log",
                )
            if errors:
                raise KafkaException(errors[0])
            offsets.sort()
            if offsets[0] < 0 or offsets[-1] - offsets[0] + 1 != len(records):
                # Acknowledged without (consecutive) offsets: tansu on s3:// answers a
                # retried batch so after a restart whether or not it holds it (measured).
                raise unavailable(self.settings, APPEND_UNSURE, "acknowledged without offsets")
        return offsets[0], offsets[-1]

    def _discard_producer(self) -> None:
        if self._producer is not None:
            producer, self._producer = self._producer, None
            producer.purge(in_queue=True, in_flight=True, blocking=False)
            producer.poll(0)

    def _seek(self, reader: Consumer, topic: str, partition: int, offset: int) -> None:
        reader.assign([TopicPartition(topic, partition, offset)])

    def _poll(
        self, reader: Consumer, topic: str, partition: int, offset: int, *, max_records: int, timeout_s: float
    ) -> list[StoredRecord] | None:
        first = reader.poll(timeout_s)
        if first is None:
            return None
        error = first.error()
        if error is not None:
            if error.code() == KafkaError._AUTO_OFFSET_RESET:
                raise OffsetOutOfRange
            if error.code() == KafkaError._PARTITION_EOF:
                return []
            raise KafkaException(error)
        messages = [first, *reader.consume(max_records - 1, timeout=0)] if max_records > 1 else [first]
        return self._stored(topic, partition, offset, messages)

    def _fetched_end(self, reader: Consumer, topic: str, partition: int) -> int | None:
        _, high = reader.get_watermark_offsets(TopicPartition(topic, partition), cached=True)
        return int(high) if high >= 0 else None

    @staticmethod
    def _stored(topic: str, partition: int, offset: int, messages: list[Message]) -> list[StoredRecord]:
        out: list[StoredRecord] = []
        for m in messages:
            error = m.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    continue
                raise KafkaException(error)
            at = int(m.offset() or 0)
            if at < offset or m.topic() != topic or m.partition() != partition:
                continue
            out.append(stored_record(m))
        return out

    def list_offset(self, topic: str, partition: int, spec: int) -> int | None:
        """ListOffsets for EARLIEST, LATEST or a timestamp (ms)."""
        reader = self._reader_client()
        with self._guard("list offsets", topic):
            if spec in (EARLIEST, LATEST):
                low, high = reader.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=self.settings.timeout_s, cached=False
                )
                return int(low if spec == EARLIEST else high)
            (found,) = reader.offsets_for_times(
                [TopicPartition(topic, partition, spec)], timeout=self.settings.timeout_s
            )
            if found.error is not None:
                raise KafkaException(found.error)
        return None if found.offset < 0 else int(found.offset)

    # -- consumer groups ----------------------------------------------------------------

    def commit(self, group: str, offsets: Mapping[tuple[str, int], int]) -> None:
        """Commit next offsets for ``group`` without joining it."""
        consumer = self._group_client(group)
        with self._guard("commit offsets"):
            consumer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()], asynchronous=False)

    def committed(self, group: str, topic: str, partitions: int) -> dict[int, int]:
        """The group's committed next offsets for the topic's partitions that have one."""
        consumer = self._group_client(group)
        with self._guard("fetch committed offsets", topic):
            found = consumer.committed(
                [TopicPartition(topic, p) for p in range(partitions)], timeout=self.settings.timeout_s
            )
        return {tp.partition: int(tp.offset) for tp in found if tp.offset >= 0 and tp.offset != OFFSET_INVALID}

    def list_groups(self) -> list[str]:
        """Consumer groups the cluster lists."""
        with self._guard("list consumer groups"):
            listed = self._result(self._admin_client().list_consumer_groups(request_timeout=self.settings.timeout_s))
        return sorted(str(g.group_id) for g in listed.valid)

    def describe_group(self, group: str) -> GroupInfo:
        """The group's state and members (DescribeGroups)."""
        with self._guard("describe consumer group"):
            futures = self._admin_client().describe_consumer_groups([group], request_timeout=self.settings.timeout_s)
            described = self._result(futures[group])
        members = tuple(
            MemberInfo(
                str(m.member_id),
                " ".join(x for x in (m.client_id, m.host) if x),
                tuple((str(tp.topic), int(tp.partition)) for tp in (m.assignment.topic_partitions or ())),
            )
            for m in described.members or ()
        )
        state = str(getattr(described.state, "name", described.state) or "DEAD")
        return GroupInfo(state.title(), members)

    def group_offsets(self, group: str) -> dict[tuple[str, int], int]:
        """Every committed next offset of ``group``."""
        with self._guard("fetch group offsets"):
            futures = self._admin_client().list_consumer_group_offsets(
                [ConsumerGroupTopicPartitions(group)], request_timeout=self.settings.timeout_s
            )
            found = self._result(futures[group])
        return {(str(tp.topic), int(tp.partition)): int(tp.offset) for tp in found.topic_partitions if tp.offset >= 0}

    def _close_producer(self) -> None:
        if self._producer is not None:
            self._producer.flush(0)
            self._producer = None

    def _close_consumer(self, consumer: Consumer) -> None:
        with suppress(KafkaException, RuntimeError):
            consumer.close()
