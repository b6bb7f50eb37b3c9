"""Build the configured :class:`~log.base.Log` backend, and consumers of it, from the project config."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from log.base import Log
from log.consumer import Consumer, ConsumerSettings
from log.file.backend import FileLog
from log.kafka.backend import KafkaLog
from log.topic_policy import TopicPolicies

if TYPE_CHECKING:
    from core.config import ProjectConfig
    from log.offset_store import OffsetStore


def open_log(config: ProjectConfig) -> Log:
    """The log backend ``config.log.backend`` names: the embedded file log or Kafka, with ``log.topics`` applied.

    A Kafka client library is loaded only when a KafkaLog is built (:func:`log.kafka.clients.open_client`).
    """
    policies = TopicPolicies(config.log.topics)
    if config.log.backend == "kafka":
        return KafkaLog(config.log.kafka, policies=policies)
    return FileLog(
        config.home_dir / "log",
        fsync=config.log.file.fsync,
        segment_bytes=config.log.file.segment_bytes,
        compression=config.log.file.compression,
        policies=policies,
    )


def consumer_of(
    log: Log,
    group: str | None,
    settings: ConsumerSettings | None = None,
    *,
    offset_store: OffsetStore[Any] | None = None,
    owns_log: bool = False,
) -> Consumer:
    """A :class:`~log.consumer.Consumer` of ``log`` for ``group`` (``None``: assigned partitions only).

    With ``owns_log`` the consumer closes ``log`` when it closes.
    """
    if isinstance(log, KafkaLog):
        # Each member module loads only its own client library.
        if log.client_name == "confluent-kafka":
            from log.kafka.confluent_member import ConfluentMember

            return ConfluentMember(log, group, settings, offset_store=offset_store, owns_log=owns_log)
        from log.kafka.kafka_python_member import KafkaPythonMember

        return KafkaPythonMember(log, group, settings, offset_store=offset_store, owns_log=owns_log)
    if isinstance(log, FileLog):
        from log.file.consumer import FileConsumer

        return FileConsumer(log, group, settings, offset_store=offset_store, owns_log=owns_log)
    msg = f"no consumer for a {type(log).__name__}"
    raise TypeError(msg)


def open_consumer(
    config: ProjectConfig,
    group: str | None,
    settings: ConsumerSettings | None = None,
    *,
    offset_store: OffsetStore[Any] | None = None,
) -> Consumer:
    """A consumer of the configured log for ``group``, over its own connection (closed with it)."""
    return consumer_of(open_log(config), group, settings, offset_store=offset_store, owns_log=True)
