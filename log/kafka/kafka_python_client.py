"""The :class:`~log.kafka.clients.KafkaClient` over kafka-python (Headwater's default Kafka client)."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from typing import Any

import kafka.errors as kerrors
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType
from kafka.structs import OffsetAndMetadata

from log.base import Record, StoredRecord
from log.errors import LogError, UnknownTopicError
from log.kafka.clients import (
    EARLIEST,
    LATEST,
    ClientSettings,
    ConfigValue,
    kafka_python_security,
    unavailable,
)

#: The producer holds records until the explicit flush of an append, so the sender
#: thread never ships the first half of a batch while the second is being added.
_LINGER_MS = 60_000
#: Slice of a poll, longer than ``fetch_max_wait_ms`` so each slice sees a fresh
#: fetch response (and with it a fresh high watermark).
_POLL_SLICE_S = 0.15
_FETCH_MAX_WAIT_MS = 50


class KafkaPythonClient:
    """kafka-python admin, producer, reader and group consumers, created on first use."""

    def __init__(self, settings: ClientSettings) -> None:
        self.settings = settings
        timeout_ms = int(settings.timeout_s * 1000)
        self._common: dict[str, Any] = {
            "bootstrap_servers": settings.config.bootstrap_servers.split(","),
            "client_id": settings.client_id,
            "request_timeout_ms": timeout_ms,
            "bootstrap_timeout_ms": timeout_ms,
            **kafka_python_security(settings.config),
        }
        self._admin: KafkaAdminClient | None = None
        self._producer: KafkaProducer | None = None
        self._reader: KafkaConsumer | None = None
        self._groups: dict[str, KafkaConsumer] = {}
        #: (topic, partition, offset) the reader's next poll continues from.
        self._position: tuple[str, int, int] | None = None

    @contextmanager
    def _guard(self, action: str, topic: str | None = None) -> Iterator[None]:
        try:
            yield
        except LogError:
            raise
        except kerrors.UnknownTopicOrPartitionError as exc:
            if topic is None:
                raise unavailable(self.settings, action, type(exc).__name__) from exc
            raise UnknownTopicError(topic) from exc
        except (kerrors.KafkaError, OSError) as exc:
            raise unavailable(self.settings, action, type(exc).__name__) from exc

    def _admin_client(self) -> KafkaAdminClient:
        if self._admin is None:
            self._admin = KafkaAdminClient(**self._common)
        return self._admin

    def _producer_client(self) -> KafkaProducer:
        if self._producer is None:
            size = self.settings.max_batch_bytes
            timeout_ms = int(self.settings.timeout_s * 1000)
            self._producer = KafkaProducer(
                **self._common,
                acks="all",
                enable_idempotence=True,
                linger_ms=_LINGER_MS,
                # One append must fit one batch: the accumulator starts a new batch
                # (and the sender may split one on MESSAGE_TOO_LARGE) otherwise.
                batch_size=size,
                max_request_size=size,
                max_block_ms=timeout_ms,
                delivery_timeout_ms=_LINGER_MS + 2 * timeout_ms,
                allow_auto_create_topics=False,
            )
        return self._producer

    def _reader_client(self) -> KafkaConsumer:
        if self._reader is None:
            self._reader = KafkaConsumer(
                **self._common,
                group_id=None,
                enable_auto_commit=False,
                # An offset outside the log raises, so read() can tell "retention
                # removed it" (start at the beginning) from "past the end" (empty).
                auto_offset_reset="none",
                fetch_max_wait_ms=_FETCH_MAX_WAIT_MS,
                max_partition_fetch_bytes=max(8 * 1024 * 1024, self.settings.max_batch_bytes),
                fetch_max_bytes=max(64 * 1024 * 1024, self.settings.max_batch_bytes),
                allow_auto_create_topics=False,
            )
        return self._reader

    def _group_client(self, group: str) -> KafkaConsumer:
        consumer = self._groups.get(group)
        if consumer is None:
            # Manual commits never join the group, but the session settings keep
            # tansu's group coordinator from its ~23 s default join wait should a
            # join ever happen.
            consumer = KafkaConsumer(
                **self._common,
                group_id=group,
                enable_auto_commit=False,
                session_timeout_ms=6000,
                heartbeat_interval_ms=2000,
                allow_auto_create_topics=False,
            )
            self._groups[group] = consumer
        return consumer

    def topics(self) -> dict[str, int]:
        """Topic name → partition count; a metadata request for all topics never auto-creates one."""
        with self._guard("list topics"):
            described = self._admin_client().describe_topics()
        return {t["name"]: len(t["partitions"]) for t in described if t.get("error_code", 0) == 0}

    def create_topic(self, name: str, partitions: int, configs: Mapping[str, str]) -> bool:
        """Create a topic; ``False`` if it already existed."""
        request = {name: {"num_partitions": partitions, "replication_factor": -1, "configs": dict(configs)}}
        try:
            with self._guard("create topic"):
                self._admin_client().create_topics(request, wait_for_metadata=True)
        except LogError as exc:
            if isinstance(exc.__cause__, kerrors.TopicAlreadyExistsError):
                return False
            raise
        return True

    def delete_topic(self, name: str) -> bool:
        """Delete a topic; ``False`` if it did not exist."""
        try:
            with self._guard("delete topic", name):
                self._admin_client().delete_topics([name])
        except UnknownTopicError:
            return False
        return True

    def topic_configs(self, name: str) -> dict[str, ConfigValue]:
        """Every config the broker reports for the topic."""
        resource = ConfigResource(ConfigResourceType.TOPIC, name)
        with self._guard("describe topic configs", name):
            described = self._admin_client().describe_configs([resource], config_filter="all")
        entries = described.get("topic", {}).get(name, {})
        return {
            key: ConfigValue(str(entry["value"]), entry.get("config_source") == "DYNAMIC_TOPIC_CONFIG")
            for key, entry in entries.items()
            if entry.get("value") is not None
        }

    def reports_broker_configs(self) -> bool:
        """Whether DescribeConfigs of a broker returns anything."""
        admin = self._admin_client()
        with self._guard("describe cluster"):
            cluster = admin.describe_cluster()
        broker = str(cluster["brokers"][0]["broker_id"])
        try:
            with self._guard("describe broker configs"):
                described = admin.describe_configs(
                    [ConfigResource(ConfigResourceType.BROKER, broker)], config_filter="all"
                )
        except LogError as exc:
            if isinstance(exc.__cause__, kerrors.AuthorizationError):
                return True  # a secured Apache Kafka; only it has broker configs to protect
            raise
        return bool(described.get("broker", {}).get(broker))

    def produce(self, topic: str, partition: int, records: Sequence[Record]) -> tuple[int, int]:
        """Write ``records`` as one record batch; return (base, last) offsets."""
        producer = self._producer_client()
        try:
            with self._guard("append, the batch may or may not be in the log", topic):
                futures = [
                    producer.send(
                        topic,
                        key=r.key,
                        value=r.value,
                        partition=partition,
                        timestamp_ms=r.timestamp_ms,
                        headers=list(r.headers),
                    )
                    for r in records
                ]
                producer.flush(timeout=self.settings.timeout_s)
                offsets = [f.get(timeout=0).offset for f in futures]
                if offsets[0] < 0:
                    # DUPLICATE_SEQUENCE_NUMBER is taken as success without an offset; tansu
                    # answers it after a restart for batches it does not hold (measured).
                    raise unavailable(self.settings, "append, the batch may or may not be in the log", "no offset")
        except LogError:
            # Records still queued must not reach the log after we reported failure.
            self._discard_producer()
            raise
        # kafka-python re-binds a record's future when it splits a batch (after
        # MESSAGE_TOO_LARGE); one shared produce future proves one record batch.
        if len({id(getattr(f, "_produce_future", None)) for f in futures}) != 1:
            msg = f"{topic}/{partition}: the producer split a batch of {len(records)} records; raise max.message.bytes"
            raise LogError(msg)
        return offsets[0], offsets[-1]

    def _discard_producer(self) -> None:
        if self._producer is not None:
            producer, self._producer = self._producer, None
            # close() flushes first, which fails while records are queued, and then
            # leaves the producer open (its __del__ retries noisily). Force-closing
            # the sender thread aborts the queued batches so they never reach the log.
            sender = getattr(producer, "_sender", None)
            if sender is not None:
                sender.force_close()
                sender.join(self.settings.timeout_s)
            with suppress(kerrors.KafkaError, OSError):
                producer.close(timeout=0)

    def fetch(
        self, topic: str, partition: int, offset: int, max_records: int, wait_s: float
    ) -> list[StoredRecord] | None:
        """Records at or after ``offset``, waiting at most ``wait_s``; ``[]`` at the end, ``None`` if unsure."""
        reader = self._reader_client()
        tp = TopicPartition(topic, partition)
        deadline = time.monotonic() + wait_s
        with self._guard("read", topic):
            if self._position != (topic, partition, offset):
                if reader.assignment() != {tp}:
                    reader.assign([tp])
                reader.seek(tp, offset)
                self._position = (topic, partition, offset)
            while True:
                left = deadline - time.monotonic()
                try:
                    polled = reader.poll(
                        timeout_ms=int(max(0.0, min(left, _POLL_SLICE_S)) * 1000), max_records=max_records
                    )
                except kerrors.OffsetOutOfRangeError:
                    beginning = self.list_offset(topic, partition, EARLIEST)
                    if beginning is not None and offset < beginning:
                        reader.seek(tp, beginning)
                        continue
                    self._position = None
                    return []
                batch = [r for r in polled.get(tp, ()) if r.offset >= offset]
                if batch:
                    self._position = (topic, partition, batch[-1].offset + 1)
                    return [
                        StoredRecord(
                            topic=topic,
                            partition=partition,
                            offset=r.offset,
                            timestamp_ms=r.timestamp,
                            key=r.key,
                            value=r.value,
                            headers=tuple((k, bytes(v)) for k, v in (r.headers or ())),
                        )
                        for r in batch
                    ]
                # The high watermark of the latest fetch response (correct even on
                # tansu, whose ListOffsets is not) says whether more is coming.
                highwater = reader.highwater(tp)
                if highwater is not None and highwater <= offset:
                    return []
                if left <= 0:
                    return None

    def list_offset(self, topic: str, partition: int, spec: int) -> int | None:
        """ListOffsets for EARLIEST, LATEST or a timestamp (ms)."""
        reader = self._reader_client()
        tp = TopicPartition(topic, partition)
        with self._guard("list offsets", topic):
            if spec == EARLIEST:
                return int(reader.beginning_offsets([tp])[tp])
            if spec == LATEST:
                return int(reader.end_offsets([tp])[tp])
            found = reader.offsets_for_times({tp: spec})[tp]
        return None if found is None else int(found.offset)

    def commit(self, group: str, offsets: Mapping[tuple[str, int], int]) -> None:
        """Commit next offsets for ``group`` without joining it."""
        consumer = self._group_client(group)
        with self._guard("commit offsets"):
            consumer.commit({TopicPartition(t, p): OffsetAndMetadata(o, "", -1) for (t, p), o in offsets.items()})

    def committed(self, group: str, topic: str, partitions: int) -> dict[int, int]:
        """The group's committed next offsets for the topic's partitions that have one."""
        consumer = self._group_client(group)
        result: dict[int, int] = {}
        with self._guard("fetch committed offsets", topic):
            for p in range(partitions):
                offset = consumer.committed(TopicPartition(topic, p))
                if offset is not None and offset >= 0:
                    result[p] = int(offset)
        return result

    def close(self) -> None:
        """Close every client; idempotent."""
        clients: list[Any] = [self._reader, self._admin, *self._groups.values()]
        self._discard_producer()
        self._reader = self._admin = None
        self._groups.clear()
        self._position = None
        for client in clients:
            if client is not None:
                with suppress(kerrors.KafkaError, OSError):
                    client.close()
