"""The thin, swappable Kafka client layer under :class:`log.kafka.backend.KafkaLog`.

:class:`KafkaClient` is the small interface KafkaLog needs and the base of its two
implementations, one over kafka-python (:mod:`log.kafka.kafka_python_client`, the
default) and one over confluent-kafka (:mod:`log.kafka.confluent_client`), chosen by
``KafkaConfig.client``. The base does what both do alike (clients created on first use,
the error guard, topic creation and deletion, the broker probe, a failed append's
clean-up, the read loop); each implementation makes its library's calls. Both pass the
same conformance suite. Implementations translate their library's errors into
:class:`~log.errors.LogUnavailableError` (transient) and
:class:`~log.errors.UnknownTopicError`; the Log contract lives in KafkaLog, not here.

Batch atomicity rests on one invariant both implementations keep: **one append is
one record batch in one produce request.** The broker appends a record batch to a
partition as a unit (one CRC, one base offset; fetches return whole batches), so a
reader sees all of it or none. Producers therefore linger until the explicit
flush and are allowed batches as large as ``max_batch_bytes``; a batch that would
not fit is refused before anything is sent. (Kafka transactions were measured and
rejected: tansu shows aborted records to ``read_committed`` readers, and on Kafka
they would only help readers that opt into ``read_committed``.)
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Literal, TypeVar

from core.log_config import KafkaConfig
from log.base import Record, StoredRecord
from log.consumer import ConsumerSettings
from log.errors import LogAuthenticationError, LogError, LogUnavailableError, UnknownTopicError

ClientName = Literal["kafka-python", "confluent-kafka"]

#: ``list_offset`` specs, as in Kafka's ListOffsets API (anything else is a timestamp in ms).
EARLIEST = -2
LATEST = -1

#: librdkafka's ceiling for ``batch.num.messages``; KafkaLog refuses larger appends on both clients.
MAX_BATCH_RECORDS = 1_000_000

#: Record-batch header (61 bytes) plus slack for varint growth.
BATCH_OVERHEAD = 128
#: Upper bound of one record's framing: length, attributes, deltas, key/value lengths.
RECORD_OVERHEAD = 32

#: The producer holds records until the explicit flush of an append, so no part of a
#: batch leaves while the rest is being added (flushing ignores the linger).
LINGER_MS = 60_000
#: How long a reader's fetch waits at the broker for records.
FETCH_MAX_WAIT_MS = 50
#: Slice of a poll, longer than ``FETCH_MAX_WAIT_MS`` so each slice sees a fresh fetch
#: response (and with it a fresh high watermark).
POLL_SLICE_S = 0.15
#: Group consumers' session settings (see :meth:`KafkaClient._new_group_consumer`).
GROUP_SESSION_TIMEOUT_MS = 6000
GROUP_HEARTBEAT_INTERVAL_MS = 2000
#: The action an append's errors name: a failed or unconfirmed produce may still have stored the batch.
APPEND_UNSURE = "append, the batch may or may not be in the log"

AdminT = TypeVar("AdminT")
ProducerT = TypeVar("ProducerT")
ConsumerT = TypeVar("ConsumerT")


def estimated_batch_bytes(records: Sequence[Record]) -> int:
    """An upper bound of the encoded size of ``records`` as one uncompressed record batch."""
    size = BATCH_OVERHEAD
    for r in records:
        size += RECORD_OVERHEAD + len(r.key or b"") + len(r.value or b"")
        for name, value in r.headers:
            size += 10 + len(name.encode()) + len(value)
    return size


@dataclass(frozen=True, slots=True)
class ConfigValue:
    """A topic config as the broker reports it; ``override`` when set on the topic itself."""

    value: str
    override: bool


@dataclass(frozen=True, slots=True)
class ClientSettings:
    """What KafkaLog asks of every client implementation."""

    config: KafkaConfig
    #: Bound of every broker round trip and of a produce's flush.
    timeout_s: float = 30.0
    #: Largest append (encoded); producers and topics are configured to take it as one batch.
    max_batch_bytes: int = 16 * 1024 * 1024
    client_id: str = "headwater"

    @property
    def bootstrap_servers(self) -> str:
        """The configured bootstrap servers (safe to print: no credentials)."""
        return self.config.bootstrap_servers

    @property
    def timeout_ms(self) -> int:
        """``timeout_s`` in milliseconds."""
        return int(self.timeout_s * 1000)

    @property
    def delivery_timeout_ms(self) -> int:
        """How long a produced record may wait for its acknowledgement: the linger and two round trips."""
        return LINGER_MS + 2 * self.timeout_ms

    @property
    def fetch_max_bytes(self) -> int:
        """A reader's fetch response bound: room for the largest append."""
        return max(64 * 1024 * 1024, self.max_batch_bytes)

    @property
    def partition_fetch_max_bytes(self) -> int:
        """A reader's per-partition fetch bound: room for the largest append."""
        return max(8 * 1024 * 1024, self.max_batch_bytes)


class OffsetOutOfRange(Exception):
    """The reader's position lies outside the partition (retention removed it, or past the end)."""


@dataclass(frozen=True, slots=True)
class MemberInfo:
    """A group member as DescribeGroups reports it (tansu 0.6 reports ids only, no assignment)."""

    member_id: str
    client: str
    assignment: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """A group's state (``Stable``, ``Empty``, ``Dead``, ...) and members, per DescribeGroups."""

    state: str
    members: tuple[MemberInfo, ...]


class KafkaClient(ABC, Generic[AdminT, ProducerT, ConsumerT]):
    """The operations KafkaLog needs from a Kafka client library, and what both implementations share.

    An admin client, a producer, a reader (assigns partitions, never joins a group) and a
    consumer per group are created on first use. Every library call runs inside
    :meth:`_guard`, which turns the library's errors into log errors.
    """

    #: The library's exceptions :meth:`_guard` translates (anything else passes through).
    library_errors: ClassVar[tuple[type[BaseException], ...]] = ()

    def __init__(self, settings: ClientSettings, common: dict[str, Any]) -> None:
        self.settings = settings
        #: Library settings every client gets: servers, client id, timeouts, security.
        self._common = common
        self._admin: AdminT | None = None
        self._producer: ProducerT | None = None
        self._reader: ConsumerT | None = None
        self._groups: dict[str, ConsumerT] = {}
        #: (topic, partition, offset) the reader's next poll continues from.
        self._position: tuple[str, int, int] | None = None

    # -- the interface KafkaLog uses ------------------------------------------------

    @abstractmethod
    def topics(self) -> dict[str, int]:
        """Topic name → partition count from cluster metadata; never auto-creates a topic."""

    def create_topic(self, name: str, partitions: int, configs: Mapping[str, str]) -> bool:
        """Create a topic; ``False`` if it already existed."""
        try:
            with self._guard("create topic"):
                self._create_topic(name, partitions, configs)
        except LogError as exc:
            if exc.__cause__ is not None and self._already_exists(exc.__cause__):
                return False
            raise
        return True

    def delete_topic(self, name: str) -> bool:
        """Delete a topic; ``False`` if it did not exist."""
        try:
            with self._guard("delete topic", name):
                self._delete_topic(name)
        except UnknownTopicError:
            return False
        return True

    @abstractmethod
    def topic_configs(self, name: str) -> dict[str, ConfigValue]:
        """Every config the broker reports for the topic."""

    @abstractmethod
    def alter_topic_configs(self, name: str, configs: Mapping[str, str]) -> None:
        """Set these configs of the topic (others keep their values)."""

    def reports_broker_configs(self) -> bool:
        """Whether DescribeConfigs of a broker returns anything (Apache Kafka always does)."""
        admin = self._admin_client()
        with self._guard("describe cluster"):
            broker = self._any_broker_id(admin)
        try:
            with self._guard("describe broker configs"):
                return self._has_broker_configs(admin, broker)
        except LogError as exc:
            if exc.__cause__ is not None and self._refused_authorization(exc.__cause__):
                return True  # a secured Apache Kafka; only it has broker configs to protect
            raise

    @abstractmethod
    def produce(self, topic: str, partition: int, records: Sequence[Record]) -> tuple[int, int]:
        """Write ``records`` as one record batch (acks=all, idempotent); return (base, last) offsets."""

    def fetch(
        self, topic: str, partition: int, offset: int, max_records: int, wait_s: float
    ) -> list[StoredRecord] | None:
        """Records at or after ``offset``, waiting at most ``wait_s`` for the first.

        ``[]`` when a fetch response's high watermark shows ``offset`` is the end;
        ``None`` when nothing arrived in time and the end is not confirmed (a slow
        or unreachable broker): the caller asks ListOffsets, which raises if down.
        """
        reader = self._reader_client()
        deadline = time.monotonic() + wait_s
        with self._guard("read", topic):
            if self._position != (topic, partition, offset):
                self._seek(reader, topic, partition, offset)
                self._position = (topic, partition, offset)
            while True:
                left = deadline - time.monotonic()
                timeout_s = max(0.0, min(left, POLL_SLICE_S))
                try:
                    records = self._poll(reader, topic, partition, offset, max_records=max_records, timeout_s=timeout_s)
                except OffsetOutOfRange:
                    beginning = self.list_offset(topic, partition, EARLIEST)
                    if beginning is not None and offset < beginning:
                        self._seek(reader, topic, partition, beginning)
                        continue
                    self._position = None
                    return []
                if records:
                    self._position = (topic, partition, records[-1].offset + 1)
                    return records
                if records is None:
                    # The high watermark of the latest fetch response (correct even on
                    # tansu, whose ListOffsets is not) says whether more is coming.
                    end = self._fetched_end(reader, topic, partition)
                    if end is not None and end <= offset:
                        return []
                    if left <= 0:
                        return None

    def fetched_end(self, topic: str, partition: int) -> int | None:
        """The partition's high watermark by the reader's latest fetch response (``None``: none said)."""
        return self._fetched_end(self._reader_client(), topic, partition)

    @abstractmethod
    def list_offset(self, topic: str, partition: int, spec: int) -> int | None:
        """ListOffsets for EARLIEST, LATEST or a timestamp (ms); ``None`` if no record qualifies."""

    @abstractmethod
    def commit(self, group: str, offsets: Mapping[tuple[str, int], int]) -> None:
        """Commit next offsets for ``group`` through its coordinator, without joining the group."""

    @abstractmethod
    def committed(self, group: str, topic: str, partitions: int) -> dict[int, int]:
        """The group's committed next offsets for the topic's partitions that have one."""

    @abstractmethod
    def list_groups(self) -> list[str]:
        """Consumer groups the cluster lists (ListGroups; tansu 0.6 lists none)."""

    @abstractmethod
    def describe_group(self, group: str) -> GroupInfo:
        """The group's state and members as the broker reports them (DescribeGroups)."""

    @abstractmethod
    def group_offsets(self, group: str) -> dict[tuple[str, int], int]:
        """Every committed next offset of ``group`` (OffsetFetch for all its partitions)."""

    def close(self) -> None:
        """Close every client; idempotent."""
        consumers = [consumer for consumer in (self._reader, *self._groups.values()) if consumer is not None]
        admin, self._admin = self._admin, None
        self._close_producer()
        self._reader = None
        self._groups.clear()
        self._position = None
        for consumer in consumers:
            self._close_consumer(consumer)
        if admin is not None:
            self._close_admin(admin)

    def guard(self, action: str, topic: str | None = None) -> AbstractContextManager[None]:
        """:meth:`_guard` for code beside the client that calls the same library (the group consumer)."""
        return self._guard(action, topic)

    @abstractmethod
    def new_member(self, group: str | None, settings: ConsumerSettings) -> ConsumerT:
        """A consumer that joins ``group`` when it subscribes (auto commit off), with the member ``settings``."""

    # -- shared machinery ------------------------------------------------------------

    @contextmanager
    def _guard(self, action: str, topic: str | None = None) -> Iterator[None]:
        """Run library calls: their errors become log errors (``topic``: the one the calls are about)."""
        try:
            yield
        except LogError:
            raise
        except self.library_errors as exc:
            raise self._log_error(exc, action, topic) from exc

    @contextmanager
    def _producing(self, topic: str) -> Iterator[ProducerT]:
        """The producer, for one append under its guard; a failed append discards the producer."""
        producer = self._producer_client()
        try:
            with self._guard(APPEND_UNSURE, topic):
                yield producer
        except LogError:
            # Records still queued must not reach the log after we reported failure.
            self._discard_producer()
            raise

    def _admin_client(self) -> AdminT:
        if self._admin is None:
            self._admin = self._new_admin()
        return self._admin

    def _producer_client(self) -> ProducerT:
        if self._producer is None:
            self._producer = self._new_producer()
        return self._producer

    def _reader_client(self) -> ConsumerT:
        if self._reader is None:
            self._reader = self._new_reader()
        return self._reader

    def _group_client(self, group: str) -> ConsumerT:
        consumer = self._groups.get(group)
        if consumer is None:
            consumer = self._groups[group] = self._new_group_consumer(group)
        return consumer

    # -- what each library does its own way --------------------------------------------

    @abstractmethod
    def _log_error(self, exc: BaseException, action: str, topic: str | None) -> LogError:
        """The log error that a library error raised during ``action`` means."""

    @abstractmethod
    def _new_admin(self) -> AdminT:
        """An admin client."""

    @abstractmethod
    def _new_producer(self) -> ProducerT:
        """An idempotent acks=all producer that sends one append as one record batch (see the module docstring)."""

    @abstractmethod
    def _new_reader(self) -> ConsumerT:
        """A consumer that only assigns partitions, reports an offset outside the log, and never commits."""

    @abstractmethod
    def _new_group_consumer(self, group: str) -> ConsumerT:
        """A consumer of ``group`` that only commits and reads commits (it never joins the group).

        Its session settings (``GROUP_SESSION_TIMEOUT_MS``) keep tansu's group coordinator
        from its ~23 s default join wait should a join ever happen.
        """

    @abstractmethod
    def _create_topic(self, name: str, partitions: int, configs: Mapping[str, str]) -> None:
        """CreateTopics for one topic, waiting for the answer."""

    @abstractmethod
    def _already_exists(self, exc: BaseException) -> bool:
        """Whether a library error says the topic to create exists."""

    @abstractmethod
    def _delete_topic(self, name: str) -> None:
        """DeleteTopics for one topic, waiting for the answer."""

    @abstractmethod
    def _any_broker_id(self, admin: AdminT) -> str:
        """The id of a broker of the cluster."""

    @abstractmethod
    def _has_broker_configs(self, admin: AdminT, broker: str) -> bool:
        """Whether DescribeConfigs of ``broker`` returns any config."""

    @abstractmethod
    def _refused_authorization(self, exc: BaseException) -> bool:
        """Whether a library error is the broker refusing an operation to this client."""

    @abstractmethod
    def _discard_producer(self) -> None:
        """Drop the producer so that records still queued in it never reach the log."""

    @abstractmethod
    def _seek(self, reader: ConsumerT, topic: str, partition: int, offset: int) -> None:
        """Make the reader's next poll read the partition from ``offset``."""

    @abstractmethod
    def _poll(
        self, reader: ConsumerT, topic: str, partition: int, offset: int, *, max_records: int, timeout_s: float
    ) -> list[StoredRecord] | None:
        """What one poll of at most ``timeout_s`` brought: records at or after ``offset``.

        ``None`` when nothing arrived (the caller checks the end and its deadline), ``[]``
        when only something else did (poll again now); :class:`OffsetOutOfRange` when the
        position lies outside the partition.
        """

    @abstractmethod
    def _fetched_end(self, reader: ConsumerT, topic: str, partition: int) -> int | None:
        """The partition's end by the latest fetch response (its high watermark); ``None`` if none said."""

    @abstractmethod
    def _close_producer(self) -> None:
        """Close the producer (at the end of the client: nothing of a failed append is queued)."""

    @abstractmethod
    def _close_consumer(self, consumer: ConsumerT) -> None:
        """Close a consumer, ignoring errors."""

    def _close_admin(self, admin: AdminT) -> None:
        """Close the admin client, ignoring errors (nothing to do where dropping it is enough)."""


def unavailable(settings: ClientSettings, action: str, reason: str) -> LogUnavailableError:
    """A one-line transient error naming the bootstrap servers (never credentials)."""
    reason = " ".join(reason.split())[:160]
    return LogUnavailableError(
        f"Kafka at {settings.bootstrap_servers} is unavailable ({action}: {reason}); "
        "check that the brokers are up and reachable, the operation can be retried"
    )


def authentication_failed(settings: ClientSettings, action: str, reason: str) -> LogAuthenticationError:
    """A one-line permanent error: the broker refused our login; names the user, never the password."""
    config = settings.config
    if config.sasl_password is not None:
        reason = reason.replace(config.sasl_password.get_secret_value(), "***")
    reason = " ".join(reason.split())[:200]
    who = (
        f"SASL user {config.sasl_username!r} ({config.sasl_mechanism or 'no mechanism'})"
        if config.sasl_username is not None
        else f"the client (security_protocol {config.security_protocol})"
    )
    return LogAuthenticationError(
        f"Kafka at {settings.bootstrap_servers} refused {who} ({action}: {reason}); check security_protocol, "
        "sasl_mechanism, sasl_username, sasl_password and the ssl_* files under log.kafka in headwater.yaml"
    )


def open_client(settings: ClientSettings, name: ClientName) -> KafkaClient[Any, Any, Any]:
    """The implementation for ``name``; its library is imported only when chosen."""
    if name == "confluent-kafka":
        from log.kafka.confluent_client import ConfluentClient

        return ConfluentClient(settings)
    from log.kafka.kafka_python_client import KafkaPythonClient

    return KafkaPythonClient(settings)
