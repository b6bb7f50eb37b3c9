"""The group consumer over kafka-python (:class:`~log.kafka.group_consumer.KafkaGroupConsumer`)."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import suppress
from typing import Any

import kafka.errors as kerrors
from kafka import KafkaConsumer
from kafka import TopicPartition as KafkaTopicPartition
from kafka.consumer.subscription_state import ConsumerRebalanceListener
from kafka.structs import OffsetAndMetadata

from log.base import StoredRecord, TopicPartition
from log.kafka.group_consumer import KafkaGroupConsumer

#: The broker's (or the client's own) word that this member is not in the group's current generation.
_LOST = (
    kerrors.CommitFailedError,
    kerrors.IllegalGenerationError,
    kerrors.UnknownMemberIdError,
    kerrors.RebalanceInProgressError,
    kerrors.FencedInstanceIdError,
)


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    """kafka-python calls it inside ``poll`` around a rebalance."""

    def __init__(self, owner: KafkaPythonMember) -> None:
        self._owner = owner

    def on_partitions_revoked(self, revoked: Any) -> None:
        self._owner._revoked(frozenset(TopicPartition(tp.topic, tp.partition) for tp in revoked))

    def on_partitions_assigned(self, assigned: Any) -> None:
        starts = self._owner._assigned(frozenset(TopicPartition(tp.topic, tp.partition) for tp in assigned))
        for tp, offset in starts.items():
            self._owner._consumer.seek(KafkaTopicPartition(tp.topic, tp.partition), offset)

    def on_partitions_lost(self, lost: Any) -> None:
        self.on_partitions_revoked(lost)


class KafkaPythonMember(KafkaGroupConsumer[KafkaConsumer]):
    """A group member through kafka-python's ``KafkaConsumer`` (its own heartbeat thread)."""

    def _new_consumer(self) -> KafkaConsumer:
        consumer: KafkaConsumer = self._log.client.new_member(self.group, self.settings)
        return consumer

    def _member_id(self) -> str:
        return str(self._consumer.group_metadata().member_id or "")

    def _subscribe(self, topics: list[str]) -> None:
        self._consumer.subscribe(topics, listener=_Listener(self))

    def _assign(self, positions: Mapping[TopicPartition, int]) -> None:
        self._consumer.assign([KafkaTopicPartition(tp.topic, tp.partition) for tp in positions])
        for tp, offset in positions.items():
            self._consumer.seek(KafkaTopicPartition(tp.topic, tp.partition), offset)

    def _poll(self, timeout_s: float, max_records: int) -> list[StoredRecord]:
        polled = self._consumer.poll(timeout_ms=int(timeout_s * 1000), max_records=max_records)
        return [
            StoredRecord(
                topic=r.topic,
                partition=r.partition,
                offset=r.offset,
                timestamp_ms=r.timestamp,
                key=r.key,
                value=r.value,
                headers=tuple((k, bytes(v)) for k, v in (r.headers or ())),
            )
            for records in polled.values()
            for r in records
        ]

    def _seek(self, partition: TopicPartition, offset: int) -> None:
        self._consumer.seek(KafkaTopicPartition(partition.topic, partition.partition), offset)

    def _commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        self._consumer.commit(
            {KafkaTopicPartition(tp.topic, tp.partition): OffsetAndMetadata(o, "", -1) for tp, o in offsets.items()}
        )

    def _lost_membership(self, exc: BaseException) -> bool:
        return isinstance(exc, _LOST)

    def _close(self) -> None:
        with suppress(kerrors.KafkaError, OSError):
            self._consumer.close(autocommit=False)
