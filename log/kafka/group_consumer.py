"""The Kafka backend's :class:`~log.consumer.Consumer`: the broker's group protocol through the configured client.

Membership, heartbeats, assignment and fencing are the broker's (JoinGroup / SyncGroup /
Heartbeat; an OffsetCommit of a member that is no longer in the current generation is
refused). The client library runs the protocol and calls back into this class inside
:meth:`KafkaGroupConsumer.poll`; the library-specific part is in
:mod:`log.kafka.kafka_python_member` and :mod:`log.kafka.confluent_member`.

What this class adds, alike for both libraries: start positions chosen here (the offset
store's checkpoint, else the group's commit, else ``auto_offset_reset``) and sought on
assignment; the positions after what poll returned; ownership tokens for an offset store
(``<member id>/<assignment number>``: unique to one member holding one assignment, which
is all the store's equality check needs); lag and time lookups from
:class:`~log.kafka.backend.KafkaLog`, whose end offsets are trustworthy after a broker
restart; and the library's "not a member of this generation any more" errors turned into
:class:`~log.errors.FencedMemberError`.

The group protocol is eager on both libraries' default assignors (range, round robin):
every member gives up all its partitions at a rebalance and joins again, so a partition
never has two live owners. tansu (the test broker) needs ``session_timeout_ms`` of about
6 s, or a join waits ~23 s (``tests/harness/broker.py``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, Generic, TypeVar

from log.base import StoredRecord, TopicPartition
from log.consumer import Checkpoint, ConsumerSettings, PartitionsCallback, PositionedReads
from log.errors import FencedMemberError
from log.kafka.backend import KafkaLog
from log.offset_store import OffsetStore
from log.topics import validate_group_name

LibraryConsumer = TypeVar("LibraryConsumer")


class KafkaGroupConsumer(PositionedReads, ABC, Generic[LibraryConsumer]):
    """A consumer of a :class:`~log.kafka.backend.KafkaLog`'s cluster (see the module docstring)."""

    _log: KafkaLog

    def __init__(
        self,
        log: KafkaLog,
        group: str | None,
        settings: ConsumerSettings | None = None,
        *,
        offset_store: OffsetStore[Any] | None = None,
        owns_log: bool = False,
    ) -> None:
        self.group = None if group is None else validate_group_name(group)
        self.settings = settings or ConsumerSettings()
        self._log = log
        self._owns_log = owns_log
        self._store = offset_store
        self._on_assign: PartitionsCallback | None = None
        self._on_revoke: PartitionsCallback | None = None
        self._positions: dict[TopicPartition, int] = {}
        self._tokens: dict[TopicPartition, str] = {}
        self._assignments = 0
        #: The id the broker gave at the last assignment (the library forgets it when the member is fenced).
        self._last_member_id = ""
        self._subscribed = False
        self._consumer: LibraryConsumer = self._new_consumer()
        self._closed = False

    def __enter__(self) -> KafkaGroupConsumer[LibraryConsumer]:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @property
    def member_id(self) -> str:
        """This member's id as the broker gave it (the last one, after it lost its membership; '' before any)."""
        return self._member_id() or self._last_member_id

    # -- membership ---------------------------------------------------------------------------

    def subscribe(
        self,
        topics: Sequence[str],
        *,
        on_assign: PartitionsCallback | None = None,
        on_revoke: PartitionsCallback | None = None,
    ) -> None:
        """Join the group reading ``topics`` (each must exist); callbacks run inside :meth:`poll`."""
        if self.group is None:
            msg = "subscribe needs a consumer group; use assign() to read partitions without one"
            raise ValueError(msg)
        for topic in topics:
            self._log.describe_topic(topic)  # UnknownTopicError, one line
        self._on_assign, self._on_revoke = on_assign, on_revoke
        self._subscribed = True
        with self._log.client.guard("subscribe"):
            self._subscribe(list(dict.fromkeys(topics)))

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Read exactly ``partitions`` (no membership); they start at the group's commit or ``auto_offset_reset``."""
        wanted = list(dict.fromkeys(partitions))
        for tp in wanted:
            self._log.end_offset(tp.topic, tp.partition)  # Unknown topic or partition: one line
        self._positions = self._start_positions(wanted, {})
        with self._log.client.guard("assign"):
            self._assign(self._positions)

    def _assigned(self, partitions: frozenset[TopicPartition]) -> dict[TopicPartition, int]:
        """The library gained ``partitions``: claim them, choose their start positions (the library seeks there)."""
        self._assignments += 1
        member = self._last_member_id = self._member_id()
        tokens = {tp: f"{member}/{self._assignments}" for tp in partitions}
        claimed = self._store.claim(self.group or "", tokens) if self._store is not None else {}
        starts = self._start_positions(sorted(partitions), claimed)
        self._positions.update(starts)
        self._tokens.update(tokens)
        if self._on_assign is not None and partitions:
            self._on_assign(partitions)
        return starts

    def _revoked(self, partitions: frozenset[TopicPartition]) -> None:
        """The library is about to give up ``partitions`` (or lost them)."""
        mine = frozenset(tp for tp in partitions if tp in self._positions)
        if self._on_revoke is not None and mine:
            self._on_revoke(mine)
        for tp in partitions:
            self._positions.pop(tp, None)
            self._tokens.pop(tp, None)

    # -- reading ------------------------------------------------------------------------------

    def poll(self, timeout_s: float = 1.0, *, max_records: int | None = None) -> list[StoredRecord]:
        """Records of owned partitions after their positions; waits up to ``timeout_s`` for the first."""
        limit = max_records or self.settings.max_poll_records
        with self._log.client.guard("poll"):
            records = self._poll(max(timeout_s, 0.0), limit)
        kept: list[StoredRecord] = []
        for record in records:
            tp = TopicPartition(record.topic, record.partition)
            position = self._positions.get(tp)
            # Records of a partition given up meanwhile, or before a seek, are not this member's to return.
            if position is not None and record.offset >= position:
                kept.append(record)
                self._positions[tp] = record.offset + 1
        return kept

    def seek(self, partition: TopicPartition, offset: int) -> None:
        """Read ``partition`` from ``offset`` on."""
        self._check_assigned(partition)
        self._positions[partition] = max(offset, 0)
        with self._log.client.guard("seek"):
            self._seek(partition, self._positions[partition])

    # -- committing ---------------------------------------------------------------------------

    def checkpoints(self, offsets: Mapping[TopicPartition, int] | None = None) -> dict[TopicPartition, Checkpoint]:
        """Next offsets (default: the positions) with each partition's ownership token."""
        chosen = dict(self._positions) if offsets is None else dict(offsets)
        return {tp: Checkpoint(offset, self._token(tp)) for tp, offset in chosen.items()}

    def _token(self, tp: TopicPartition) -> str:
        token = self._tokens.get(tp)
        if token is None:
            if not self._subscribed and tp in self._positions:
                return "assigned"  # no membership: nothing to fence
            raise FencedMemberError(
                self.group or "-", self.member_id, tp.topic, tp.partition, "it is not assigned to this member"
            )
        return token

    def commit(self, offsets: Mapping[TopicPartition, int] | None = None) -> None:
        """Record next offsets (default: the positions) through the group's coordinator.

        :class:`FencedMemberError` when the broker no longer counts this member in the
        group's generation (its session ended or the group rebalanced without it).
        """
        if self.group is None:
            msg = "this consumer has no group to commit to"
            raise ValueError(msg)
        chosen = dict(self._positions) if offsets is None else dict(offsets)
        if not chosen:
            return
        for tp in chosen:
            self._token(tp)
        with self._log.client.guard("commit offsets"):
            try:
                self._commit(chosen)
            except Exception as exc:
                if not self._lost_membership(exc):
                    raise
                tp = min(chosen)
                reason = f"the broker refused the commit: {type(exc).__name__}"
                raise FencedMemberError(self.group, self.member_id, tp.topic, tp.partition, reason) from exc

    # -- closing ------------------------------------------------------------------------------

    def close(self) -> None:
        """Leave the group (a LeaveGroup: the others rebalance at once) and close the client. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._positions.clear()
        self._tokens.clear()
        self._close()
        if self._owns_log:
            self._log.close()

    # -- what each library does its own way ------------------------------------------------------

    @abstractmethod
    def _new_consumer(self) -> LibraryConsumer:
        """The library's consumer for ``self.group`` and ``self.settings`` (auto commit off)."""

    @abstractmethod
    def _member_id(self) -> str:
        """The member id the broker gave this consumer."""

    @abstractmethod
    def _subscribe(self, topics: list[str]) -> None:
        """Subscribe; on rebalances call :meth:`_revoked` / :meth:`_assigned` and seek to what it returns."""

    @abstractmethod
    def _assign(self, positions: Mapping[TopicPartition, int]) -> None:
        """Assign exactly these partitions, at these offsets."""

    @abstractmethod
    def _poll(self, timeout_s: float, max_records: int) -> list[StoredRecord]:
        """Up to ``max_records`` records, waiting at most ``timeout_s`` for the first."""

    @abstractmethod
    def _seek(self, partition: TopicPartition, offset: int) -> None:
        """Make the next poll read ``partition`` from ``offset``."""

    @abstractmethod
    def _commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        """Commit synchronously through the group coordinator, checked against the member's generation."""

    @abstractmethod
    def _lost_membership(self, exc: BaseException) -> bool:
        """Whether a library error says this member is no longer in the group's current generation."""

    @abstractmethod
    def _close(self) -> None:
        """Leave the group and close the library's consumer, ignoring errors."""
