"""The :class:`~log.kafka.clients.KafkaClient` over confluent-kafka (librdkafka)."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeoutError
from contextlib import contextmanager, suppress
from typing import Any, TypeVar

from confluent_kafka import OFFSET_INVALID, Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

# confluent_kafka.admin re-exports these without __all__, which mypy --strict flags.
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    ConfigResource,
    ConfigSource,
    NewTopic,
    ResourceType,
)

from log.base import Record, StoredRecord
from log.errors import LogError, UnknownTopicError
from log.kafka.clients import (
    EARLIEST,
    LATEST,
    MAX_BATCH_RECORDS,
    ClientSettings,
    ConfigValue,
    authentication_failed,
    librdkafka_security,
    unavailable,
)

#: The producer holds records until the explicit flush of an append, so no message
#: set leaves before the whole batch is queued (``flush`` ignores linger).
_LINGER_MS = 60_000
_POLL_SLICE_S = 0.15
_FETCH_MAX_WAIT_MS = 50
_LOCAL_UNKNOWN = {KafkaError._UNKNOWN_TOPIC, KafkaError._UNKNOWN_PARTITION}
#: librdkafka reports a refused login or TLS handshake only through ``error_cb``.
_LOGIN_FAILURES = {KafkaError._AUTHENTICATION, KafkaError._SSL}

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


class ConfluentClient:
    """confluent-kafka admin, producer, reader and group consumers, created on first use."""

    def __init__(self, settings: ClientSettings) -> None:
        self.settings = settings
        self._timeout_ms = int(settings.timeout_s * 1000)
        self._common: dict[str, Any] = {
            "bootstrap.servers": settings.config.bootstrap_servers,
            "client.id": settings.client_id,
            "socket.timeout.ms": self._timeout_ms,
            # librdkafka logs to stderr by default; KafkaLog reports errors itself.
            "log_level": 0,
            "error_cb": self._on_error,
            **librdkafka_security(settings.config),
        }
        #: The last refused login (SASL or TLS) librdkafka reported; turns "transport failure" into its cause.
        self._login_failure: str | None = None
        self._admin: AdminClient | None = None
        self._producer: Producer | None = None
        self._reader: Consumer | None = None
        self._groups: dict[str, Consumer] = {}
        self._position: tuple[str, int, int] | None = None

    @contextmanager
    def _guard(self, action: str, topic: str | None = None) -> Iterator[None]:
        try:
            yield
        except LogError:
            raise
        except (KafkaException, FutureTimeoutError, BufferError, OSError) as exc:
            code = _code(exc)
            if topic is not None and code == KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise UnknownTopicError(topic) from exc
            if topic is not None and code in _LOCAL_UNKNOWN and topic not in self.topics():
                # librdkafka says "unknown partition" also when it merely has no
                # metadata (broker down); only the cluster's metadata can tell.
                raise UnknownTopicError(topic) from exc
            if self._admin is not None:
                self._admin.poll(0)  # serves error_cb, which librdkafka calls only from poll
            if self._login_failure is not None:
                raise authentication_failed(self.settings, action, self._login_failure) from exc
            raise unavailable(self.settings, action, _reason(exc)) from exc

    def _on_error(self, error: KafkaError) -> None:
        if error.code() in _LOGIN_FAILURES:
            self._login_failure = str(error.str())

    def _result(self, future: Future[_T]) -> _T:
        return future.result(timeout=self.settings.timeout_s + 1)

    def _admin_client(self) -> AdminClient:
        if self._admin is None:
            self._admin = AdminClient(self._common)
        return self._admin

    def _producer_client(self) -> Producer:
        if self._producer is None:
            size = self.settings.max_batch_bytes
            self._producer = Producer(
                {
                    **self._common,
                    "acks": "all",
                    "enable.idempotence": True,
                    "linger.ms": _LINGER_MS,
                    # One append must leave as one message set: never cut by size or count.
                    "batch.size": size,
                    "message.max.bytes": size,
                    "batch.num.messages": MAX_BATCH_RECORDS,
                    "queue.buffering.max.messages": 2 * MAX_BATCH_RECORDS,
                    "message.timeout.ms": _LINGER_MS + 2 * self._timeout_ms,
                }
            )
        return self._producer

    def _reader_client(self) -> Consumer:
        if self._reader is None:
            fetch_bytes = max(64 * 1024 * 1024, self.settings.max_batch_bytes)
            self._reader = Consumer(
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
                    "fetch.wait.max.ms": _FETCH_MAX_WAIT_MS,
                    "fetch.max.bytes": fetch_bytes,
                    "max.partition.fetch.bytes": max(8 * 1024 * 1024, self.settings.max_batch_bytes),
                    "receive.message.max.bytes": fetch_bytes + 1024 * 1024,
                    "allow.auto.create.topics": False,
                }
            )
        return self._reader

    def _group_client(self, group: str) -> Consumer:
        consumer = self._groups.get(group)
        if consumer is None:
            # Manual commits never join the group; the session settings keep tansu's
            # coordinator from its ~23 s default join wait should a join ever happen.
            consumer = Consumer(
                {
                    **self._common,
                    "group.id": group,
                    "enable.auto.commit": False,
                    "session.timeout.ms": 6000,
                    "heartbeat.interval.ms": 2000,
                    "allow.auto.create.topics": False,
                }
            )
            self._groups[group] = consumer
        return consumer

    def topics(self) -> dict[str, int]:
        """Topic name → partition count; metadata for all topics never auto-creates one."""
        with self._guard("list topics"):
            metadata = self._admin_client().list_topics(timeout=self.settings.timeout_s)
        return {name: len(t.partitions) for name, t in metadata.topics.items() if t.error is None}

    def create_topic(self, name: str, partitions: int, configs: Mapping[str, str]) -> bool:
        """Create a topic; ``False`` if it already existed."""
        topic = NewTopic(name, num_partitions=partitions, config=dict(configs))
        try:
            with self._guard("create topic"):
                futures = self._admin_client().create_topics(
                    [topic], operation_timeout=self.settings.timeout_s, request_timeout=self.settings.timeout_s
                )
                self._result(futures[name])
        except LogError as exc:
            if exc.__cause__ is not None and _code(exc.__cause__) == KafkaError.TOPIC_ALREADY_EXISTS:
                return False
            raise
        return True

    def delete_topic(self, name: str) -> bool:
        """Delete a topic; ``False`` if it did not exist."""
        try:
            with self._guard("delete topic", name):
                futures = self._admin_client().delete_topics(
                    [name], operation_timeout=self.settings.timeout_s, request_timeout=self.settings.timeout_s
                )
                self._result(futures[name])
        except UnknownTopicError:
            return False
        return True

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

    def reports_broker_configs(self) -> bool:
        """Whether DescribeConfigs of a broker returns anything."""
        admin = self._admin_client()
        with self._guard("describe cluster"):
            broker = str(next(iter(admin.list_topics(timeout=self.settings.timeout_s).brokers)))
        try:
            with self._guard("describe broker configs"):
                futures = admin.describe_configs(
                    [ConfigResource(ResourceType.BROKER, broker)], request_timeout=self.settings.timeout_s
                )
                entries = self._result(next(iter(futures.values())))
        except LogError as exc:
            if exc.__cause__ is not None and _code(exc.__cause__) in {
                KafkaError.CLUSTER_AUTHORIZATION_FAILED,
                KafkaError.TOPIC_AUTHORIZATION_FAILED,
            }:
                return True  # a secured Apache Kafka; only it has broker configs to protect
            raise
        return bool(entries)

    def produce(self, topic: str, partition: int, records: Sequence[Record]) -> tuple[int, int]:
        """Write ``records`` as one message set; return (base, last) offsets."""
        producer = self._producer_client()
        offsets: list[int] = []
        errors: list[KafkaError] = []

        def delivered(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                errors.append(err)
            else:
                offset = msg.offset()
                offsets.append(-1 if offset is None or offset < 0 else int(offset))

        try:
            with self._guard("append, the batch may or may not be in the log", topic):
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
                    raise unavailable(
                        self.settings, "append, the batch may or may not be in the log", "acknowledged without offsets"
                    )
        except LogError:
            # Records still queued must not reach the log after we reported failure.
            self._discard_producer()
            raise
        return offsets[0], offsets[-1]

    def _discard_producer(self) -> None:
        if self._producer is not None:
            producer, self._producer = self._producer, None
            producer.purge(in_queue=True, in_flight=True, blocking=False)
            producer.poll(0)

    def fetch(
        self, topic: str, partition: int, offset: int, max_records: int, wait_s: float
    ) -> list[StoredRecord] | None:
        """Records at or after ``offset``, waiting at most ``wait_s``; ``[]`` at the end, ``None`` if unsure."""
        reader = self._reader_client()
        deadline = time.monotonic() + wait_s
        with self._guard("read", topic):
            if self._position != (topic, partition, offset):
                reader.assign([TopicPartition(topic, partition, offset)])
                self._position = (topic, partition, offset)
            while True:
                left = deadline - time.monotonic()
                first = reader.poll(max(0.0, min(left, _POLL_SLICE_S)))
                if first is None:
                    # The high watermark of the latest fetch response (correct even on
                    # tansu, whose ListOffsets is not) says whether more is coming.
                    _, high = reader.get_watermark_offsets(TopicPartition(topic, partition), cached=True)
                    if 0 <= high <= offset:
                        return []
                    if left <= 0:
                        return None
                    continue
                error = first.error()
                if error is not None:
                    if error.code() == KafkaError._AUTO_OFFSET_RESET:
                        beginning = self.list_offset(topic, partition, EARLIEST)
                        if beginning is not None and offset < beginning:
                            reader.assign([TopicPartition(topic, partition, beginning)])
                            continue
                        self._position = None
                        return []
                    if error.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise KafkaException(error)
                messages = [first, *reader.consume(max_records - 1, timeout=0)] if max_records > 1 else [first]
                out = self._stored(topic, partition, offset, messages)
                if out:
                    self._position = (topic, partition, out[-1].offset + 1)
                    return out

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
            key, value = m.key(), m.value()
            out.append(
                StoredRecord(
                    topic=topic,
                    partition=partition,
                    offset=at,
                    timestamp_ms=int(m.timestamp()[1]),
                    key=key,
                    value=value,
                    headers=_headers(m.headers()),
                )
            )
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

    def close(self) -> None:
        """Close every client; idempotent."""
        consumers = [self._reader, *self._groups.values()]
        self._reader = None
        self._groups.clear()
        self._position = None
        self._admin = None
        if self._producer is not None:
            self._producer.flush(0)
            self._producer = None
        for consumer in consumers:
            if consumer is not None:
                with suppress(KafkaException, RuntimeError):
                    consumer.close()
