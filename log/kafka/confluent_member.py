"""The group consumer over confluent-kafka (:class:`~log.kafka.group_consumer.KafkaGroupConsumer`)."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import suppress

from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka import TopicPartition as KafkaTopicPartition

from log.base import StoredRecord, TopicPartition
from log.kafka.confluent_client import stored_record
from log.kafka.group_consumer import KafkaGroupConsumer

#: The broker's (or librdkafka's) word that this member is not in the group's current generation.
_LOST = {
    KafkaError.ILLEGAL_GENERATION,
    KafkaError.UNKNOWN_MEMBER_ID,
    KafkaError.REBALANCE_IN_PROGRESS,
    KafkaError.FENCED_INSTANCE_ID,
    KafkaError._ASSIGNMENT_LOST,
}


def _ours(partitions: list[KafkaTopicPartition]) -> frozenset[TopicPartition]:
    return frozenset(TopicPartition(tp.topic, tp.partition) for tp in partitions)


class ConfluentMember(KafkaGroupConsumer[Consumer]):
    """A group member through librdkafka's ``Consumer`` (its own background threads heartbeat)."""

    def _new_consumer(self) -> Consumer:
        consumer: Consumer = self._log.client.new_member(self.group, self.settings)
        return consumer

    def _member_id(self) -> str:
        try:
            return str(self._consumer.memberid() or "")
        except (KafkaException, RuntimeError):
            return ""

    def _subscribe(self, topics: list[str]) -> None:
        self._consumer.subscribe(
            topics, on_assign=self._on_assign_cb, on_revoke=self._on_revoke_cb, on_lost=self._on_lost_cb
        )

    def _on_assign_cb(self, consumer: Consumer, partitions: list[KafkaTopicPartition]) -> None:
        starts = self._assigned(_ours(partitions))
        # Assigning here (with offsets) replaces librdkafka's own assign after the callback.
        consumer.assign([KafkaTopicPartition(tp.topic, tp.partition, offset) for tp, offset in starts.items()])

    def _on_revoke_cb(self, consumer: Consumer, partitions: list[KafkaTopicPartition]) -> None:
        self._revoked(_ours(partitions))
        consumer.unassign()

    def _on_lost_cb(self, consumer: Consumer, partitions: list[KafkaTopicPartition]) -> None:
        self._on_revoke_cb(consumer, partitions)

    def _assign(self, positions: Mapping[TopicPartition, int]) -> None:
        self._consumer.assign([KafkaTopicPartition(tp.topic, tp.partition, o) for tp, o in positions.items()])

    def _poll(self, timeout_s: float, max_records: int) -> list[StoredRecord]:
        messages = self._consumer.consume(max_records, timeout=0)
        if not messages:
            first = self._consumer.poll(timeout_s)
            if first is None:
                return []
            messages = [first, *self._consumer.consume(max_records - 1, timeout=0)] if max_records > 1 else [first]
        out: list[StoredRecord] = []
        for message in messages:
            error = message.error()
            if error is None:
                out.append(stored_record(message))
            elif error.code() != KafkaError._PARTITION_EOF:
                raise KafkaException(error)
        return out

    def _seek(self, partition: TopicPartition, offset: int) -> None:
        self._consumer.seek(KafkaTopicPartition(partition.topic, partition.partition, offset))

    def _commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        self._consumer.commit(
            offsets=[KafkaTopicPartition(tp.topic, tp.partition, o) for tp, o in offsets.items()], asynchronous=False
        )

    def _lost_membership(self, exc: BaseException) -> bool:
        if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
            return exc.args[0].code() in _LOST
        return False

    def _close(self) -> None:
        with suppress(KafkaException, RuntimeError):
            self._consumer.close()
