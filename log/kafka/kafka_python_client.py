"""The :class:`~log.kafka.clients.KafkaClient` over kafka-python (Headwater's default Kafka client)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import suppress
from typing import Any, ClassVar

import kafka.errors as kerrors
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType
from kafka.structs import OffsetAndMetadata

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
    ClientSettings,
    ConfigValue,
    GroupInfo,
    KafkaClient,
    MemberInfo,
    OffsetOutOfRange,
    unavailable,
)
from log.kafka.security import kafka_python_security


class _Admin(KafkaAdminClient):  # type: ignore[misc]
    """kafka-python's admin client, without decoding a described group's authorized operations.

    tansu 0.6 answers DescribeGroups with operation bits kafka-python cannot map (``15 is
    not a valid ACLOperation``), and nothing here needs the operations.
    """

    def _process_acl_operations(self, obj: dict[str, Any]) -> dict[str, Any]:
        obj.pop("authorized_operations", None)
        return obj


class KafkaPythonClient(KafkaClient[KafkaAdminClient, KafkaProducer, KafkaConsumer]):
    """kafka-python admin, producer, reader and group consumers, created on first use."""

    library_errors: ClassVar[tuple[type[BaseException], ...]] = (kerrors.KafkaError, OSError)

    def __init__(self, settings: ClientSettings) -> None:
        common: dict[str, Any] = {
            "bootstrap_servers": settings.config.bootstrap_servers.split(","),
            "client_id": settings.client_id,
            "request_timeout_ms": settings.timeout_ms,
            "bootstrap_timeout_ms": settings.timeout_ms,
            **kafka_python_security(settings.config),
        }
        super().__init__(settings, common)

    def _log_error(self, exc: BaseException, action: str, topic: str | None) -> LogError:
        if isinstance(exc, kerrors.UnknownTopicOrPartitionError) and topic is not None:
            return UnknownTopicError(topic)
        return unavailable(self.settings, action, type(exc).__name__)

    # -- clients ----------------------------------------------------------------------

    def _new_admin(self) -> KafkaAdminClient:
        return _Admin(**self._common)

    def _new_producer(self) -> KafkaProducer:
        size = self.settings.max_batch_bytes
        return KafkaProducer(
            **self._common,
            acks="all",
            enable_idempotence=True,
            linger_ms=LINGER_MS,
            # One append must fit one batch: the accumulator starts a new batch
            # (and the sender may split one on MESSAGE_TOO_LARGE) otherwise.
            batch_size=size,
            max_request_size=size,
            max_block_ms=self.settings.timeout_ms,
            delivery_timeout_ms=self.settings.delivery_timeout_ms,
            allow_auto_create_topics=False,
        )

    def _new_reader(self) -> KafkaConsumer:
        return KafkaConsumer(
            **self._common,
            group_id=None,
            enable_auto_commit=False,
            # An offset outside the log raises, so read() can tell "retention
            # removed it" (start at the beginning) from "past the end" (empty).
            auto_offset_reset="none",
            fetch_max_wait_ms=FETCH_MAX_WAIT_MS,
            max_partition_fetch_bytes=self.settings.partition_fetch_max_bytes,
            fetch_max_bytes=self.settings.fetch_max_bytes,
            allow_auto_create_topics=False,
        )

    def _new_group_consumer(self, group: str) -> KafkaConsumer:
        return KafkaConsumer(
            **self._common,
            group_id=group,
            enable_auto_commit=False,
            session_timeout_ms=GROUP_SESSION_TIMEOUT_MS,
            heartbeat_interval_ms=GROUP_HEARTBEAT_INTERVAL_MS,
            allow_auto_create_topics=False,
        )

    def new_member(self, group: str | None, settings: ConsumerSettings) -> KafkaConsumer:
        """A consumer that joins ``group`` when it subscribes; it never commits by itself."""
        return KafkaConsumer(
            **{**self._common, "request_timeout_ms": max(self.settings.timeout_ms, settings.session_timeout_ms + 5000)},
            group_id=group,
            enable_auto_commit=False,
            # Start positions are chosen and sought by the group consumer; this only covers a gap.
            auto_offset_reset=settings.auto_offset_reset,
            session_timeout_ms=settings.session_timeout_ms,
            heartbeat_interval_ms=settings.heartbeat_interval_ms,
            max_poll_interval_ms=settings.max_poll_interval_ms,
            max_poll_records=settings.max_poll_records,
            fetch_max_wait_ms=FETCH_MAX_WAIT_MS,
            max_partition_fetch_bytes=self.settings.partition_fetch_max_bytes,
            fetch_max_bytes=self.settings.fetch_max_bytes,
            allow_auto_create_topics=False,
        )

    # -- topics -----------------------------------------------------------------------

    def topics(self) -> dict[str, int]:
        """Topic name → partition count; a metadata request for all topics never auto-creates one."""
        with self._guard("list topics"):
            described = self._admin_client().describe_topics()
        return {t["name"]: len(t["partitions"]) for t in described if t.get("error_code", 0) == 0}

    def _create_topic(self, name: str, partitions: int, configs: Mapping[str, str]) -> None:
        request = {name: {"num_partitions": partitions, "replication_factor": -1, "configs": dict(configs)}}
        self._admin_client().create_topics(request, wait_for_metadata=True)

    def _already_exists(self, exc: BaseException) -> bool:
        return isinstance(exc, kerrors.TopicAlreadyExistsError)

    def _delete_topic(self, name: str) -> None:
        self._admin_client().delete_topics([name])

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

    def alter_topic_configs(self, name: str, configs: Mapping[str, str]) -> None:
        """Set these configs of the topic (AlterConfigs with the topic's other overrides kept)."""
        current = {k: c.value for k, c in self.topic_configs(name).items() if c.override}
        resource = ConfigResource(ConfigResourceType.TOPIC, name, configs={**current, **configs})
        with self._guard("alter topic configs", name):
            self._admin_client().alter_configs([resource])

    def _any_broker_id(self, admin: KafkaAdminClient) -> str:
        return str(admin.describe_cluster()["brokers"][0]["broker_id"])

    def _has_broker_configs(self, admin: KafkaAdminClient, broker: str) -> bool:
        described = admin.describe_configs([ConfigResource(ConfigResourceType.BROKER, broker)], config_filter="all")
        return bool(described.get("broker", {}).get(broker))

    def _refused_authorization(self, exc: BaseException) -> bool:
        return isinstance(exc, kerrors.AuthorizationError)

    # -- records ----------------------------------------------------------------------

    def produce(self, topic: str, partition: int, records: Sequence[Record]) -> tuple[int, int]:
        """Write ``records`` as one record batch; return (base, last) offsets."""
        with self._producing(topic) as producer:
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
                raise unavailable(self.settings, APPEND_UNSURE, "no offset")
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

    def _seek(self, reader: KafkaConsumer, topic: str, partition: int, offset: int) -> None:
        tp = TopicPartition(topic, partition)
        if reader.assignment() != {tp}:
            reader.assign([tp])
        reader.seek(tp, offset)

    def _poll(
        self, reader: KafkaConsumer, topic: str, partition: int, offset: int, *, max_records: int, timeout_s: float
    ) -> list[StoredRecord] | None:
        tp = TopicPartition(topic, partition)
        try:
            polled = reader.poll(timeout_ms=int(timeout_s * 1000), max_records=max_records)
        except kerrors.OffsetOutOfRangeError:
            raise OffsetOutOfRange from None
        batch = [r for r in polled.get(tp, ()) if r.offset >= offset]
        if not batch:
            return None
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

    def _fetched_end(self, reader: KafkaConsumer, topic: str, partition: int) -> int | None:
        highwater: int | None = reader.highwater(TopicPartition(topic, partition))
        return highwater

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

    # -- consumer groups ----------------------------------------------------------------

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

    def list_groups(self) -> list[str]:
        """Consumer groups the cluster lists."""
        with self._guard("list consumer groups"):
            listed = self._admin_client().list_groups()
        return sorted(str(g["group_id"]) for g in listed)

    def describe_group(self, group: str) -> GroupInfo:
        """The group's state and members (DescribeGroups)."""
        with self._guard("describe consumer group"):
            described: dict[str, Any] = self._admin_client().describe_groups([group])[group]
        members = []
        for m in described.get("members", ()):
            assignment = m.get("member_assignment")
            partitions = getattr(assignment, "assignment", None) or ()
            members.append(
                MemberInfo(
                    str(m["member_id"]),
                    " ".join(x for x in (m.get("client_id"), m.get("client_host")) if x),
                    tuple((str(topic), int(p)) for topic, numbers in partitions for p in numbers),
                )
            )
        return GroupInfo(str(described.get("group_state") or "Dead"), tuple(members))

    def group_offsets(self, group: str) -> dict[tuple[str, int], int]:
        """Every committed next offset of ``group``."""
        with self._guard("fetch group offsets"):
            found = self._admin_client().list_group_offsets({group: None}).get(group, {})
        return {(tp.topic, tp.partition): int(o.offset) for tp, o in found.items() if o.offset >= 0}

    def _close_producer(self) -> None:
        self._discard_producer()

    def _close_consumer(self, consumer: KafkaConsumer) -> None:
        with suppress(kerrors.KafkaError, OSError):
            consumer.close()

    def _close_admin(self, admin: KafkaAdminClient) -> None:
        with suppress(kerrors.KafkaError, OSError):
            admin.close()
