"""The thin, swappable Kafka client layer under :class:`log.kafka.backend.KafkaLog`.

:class:`KafkaClient` is the small interface KafkaLog needs; it is implemented once
over kafka-python (:mod:`log.kafka.kafka_python_client`, the default) and once over
confluent-kafka (:mod:`log.kafka.confluent_client`), chosen by ``KafkaConfig.client``.
Both pass the same conformance suite. Implementations translate their library's
errors into :class:`~log.errors.LogUnavailableError` (transient) and
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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from core.config import KafkaConfig
from log.base import Record, StoredRecord
from log.errors import LogAuthenticationError, LogUnavailableError

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


class KafkaClient(Protocol):
    """The operations KafkaLog needs from a Kafka client library."""

    settings: ClientSettings

    def topics(self) -> dict[str, int]:
        """Topic name → partition count from cluster metadata; never auto-creates a topic."""
        ...

    def create_topic(self, name: str, partitions: int, configs: Mapping[str, str]) -> bool:
        """Create a topic; ``False`` if it already existed."""
        ...

    def delete_topic(self, name: str) -> bool:
        """Delete a topic; ``False`` if it did not exist."""
        ...

    def topic_configs(self, name: str) -> dict[str, ConfigValue]:
        """Every config the broker reports for the topic."""
        ...

    def reports_broker_configs(self) -> bool:
        """Whether DescribeConfigs of a broker returns anything (Apache Kafka always does)."""
        ...

    def produce(self, topic: str, partition: int, records: Sequence[Record]) -> tuple[int, int]:
        """Write ``records`` as one record batch (acks=all, idempotent); return (base, last) offsets."""
        ...

    def fetch(
        self, topic: str, partition: int, offset: int, max_records: int, wait_s: float
    ) -> list[StoredRecord] | None:
        """Records at or after ``offset``, waiting at most ``wait_s`` for the first.

        ``[]`` when a fetch response's high watermark shows ``offset`` is the end;
        ``None`` when nothing arrived in time and the end is not confirmed (a slow
        or unreachable broker): the caller asks ListOffsets, which raises if down.
        """
        ...

    def list_offset(self, topic: str, partition: int, spec: int) -> int | None:
        """ListOffsets for EARLIEST, LATEST or a timestamp (ms); ``None`` if no record qualifies."""
        ...

    def commit(self, group: str, offsets: Mapping[tuple[str, int], int]) -> None:
        """Commit next offsets for ``group`` through its coordinator, without joining the group."""
        ...

    def committed(self, group: str, topic: str, partitions: int) -> dict[int, int]:
        """The group's committed next offsets for the topic's partitions that have one."""
        ...

    def close(self) -> None:
        """Close every connection; idempotent."""
        ...


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


def kafka_python_security(config: KafkaConfig) -> dict[str, Any]:
    """KafkaConfig's security settings as kafka-python keyword arguments."""
    options: dict[str, Any] = {"security_protocol": config.security_protocol}
    if config.sasl_mechanism is not None:
        options["sasl_mechanism"] = config.sasl_mechanism
    if config.sasl_username is not None:
        options["sasl_plain_username"] = config.sasl_username
    if config.sasl_password is not None:
        # Unwrapped only here, at the client boundary; never logged or put in messages.
        options["sasl_plain_password"] = config.sasl_password.get_secret_value()
    for key in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
        value = getattr(config, key)
        if value is not None:
            options[key] = value
    return options


def librdkafka_security(config: KafkaConfig) -> dict[str, Any]:
    """KafkaConfig's security settings as librdkafka (confluent-kafka) properties."""
    options: dict[str, Any] = {"security.protocol": config.security_protocol.lower()}
    if config.sasl_mechanism is not None:
        options["sasl.mechanism"] = config.sasl_mechanism
    if config.sasl_username is not None:
        options["sasl.username"] = config.sasl_username
    if config.sasl_password is not None:
        # Unwrapped only here, at the client boundary; never logged or put in messages.
        options["sasl.password"] = config.sasl_password.get_secret_value()
    for key, prop in (
        ("ssl_cafile", "ssl.ca.location"),
        ("ssl_certfile", "ssl.certificate.location"),
        ("ssl_keyfile", "ssl.key.location"),
    ):
        value = getattr(config, key)
        if value is not None:
            options[prop] = value
    return options


def open_client(settings: ClientSettings, name: ClientName) -> KafkaClient:
    """The implementation for ``name``; its library is imported only when chosen."""
    if name == "confluent-kafka":
        from log.kafka.confluent_client import ConfluentClient

        return ConfluentClient(settings)
    from log.kafka.kafka_python_client import KafkaPythonClient

    return KafkaPythonClient(settings)
