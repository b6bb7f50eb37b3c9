"""The consumer API: read topics as a member of a consumer group, commit, seek, and watch lag.

Open one with :func:`log.factory.open_consumer`; both backends implement :class:`Consumer`
(the file backend in :mod:`log.file.consumer`, Kafka in :mod:`log.kafka.group_consumer`)::

    with open_consumer(config, "billing") as consumer:
        consumer.subscribe(["shop.public.orders"])
        while running:
            for record in consumer.poll(timeout_s=1.0):
                handle(record)
            consumer.commit()

Contract, for both backends:

* **Membership.** Members of a group heartbeat (a background thread does); every
  partition of the subscribed topics is owned by exactly one live member. A member
  joining, leaving (:meth:`Consumer.close`) or dying (no heartbeat for
  ``session_timeout_ms``) rebalances the group. A partition leaves a live owner only at
  that owner's next :meth:`Consumer.poll` (after ``on_revoke``), so two live members never
  read it at once: commit what you processed before polling again.
* **Positions.** A newly owned partition starts at the group's committed offset (with an
  :class:`~log.offset_store.OffsetStore`: at the checkpoint the store holds), else at the
  earliest or latest offset (``auto_offset_reset``). A poll returns records of owned
  partitions, each partition's in offset order.
* **Commits.** :meth:`Consumer.commit` records the positions after what poll returned
  (or the offsets given) as the group's next offsets. A member that lost a partition
  (its lease ended, or the group moved it) gets :class:`~log.errors.FencedMemberError`
  and nothing is recorded; it rejoins at its next poll.
* **Exactly once** (LogHub's checkpoint-with-result): with an offset store, the result and
  the checkpoint are written in one transaction of the consumer's own store
  (:func:`log.offset_store.commit_with_output`); a new owner claims the partition in the
  store first, after which the store refuses the previous owner's writes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from log.base import READ_MAX_RECORDS, Log, StoredRecord, TopicPartition
from log.errors import UnknownTopicError

if TYPE_CHECKING:
    from log.offset_store import OffsetStore

AutoOffsetReset = Literal["earliest", "latest"]
#: Called with the partitions a member gained (``on_assign``) or is about to lose (``on_revoke``).
PartitionsCallback = Callable[[frozenset[TopicPartition]], None]


@dataclass(frozen=True, slots=True)
class ConsumerSettings:
    """How a member takes part in its group, and where it starts without a commit.

    ``session_timeout_ms``: a member silent this long is dead and loses its partitions;
    ``heartbeat_interval_ms``: how often the background thread renews the lease;
    ``max_poll_interval_ms``: a member that does not poll this long leaves the group;
    ``max_poll_records``: the most records one poll returns.
    """

    session_timeout_ms: int = 6000
    heartbeat_interval_ms: int = 1000
    max_poll_interval_ms: int = 300_000
    auto_offset_reset: AutoOffsetReset = "earliest"
    max_poll_records: int = READ_MAX_RECORDS

    def __post_init__(self) -> None:
        if not 0 < self.heartbeat_interval_ms < self.session_timeout_ms:
            msg = (
                f"heartbeat_interval_ms ({self.heartbeat_interval_ms}) must be positive and below "
                f"session_timeout_ms ({self.session_timeout_ms})"
            )
            raise ValueError(msg)
        if self.max_poll_records < 1 or self.max_poll_interval_ms < 1:
            msg = "max_poll_records and max_poll_interval_ms must be positive"
            raise ValueError(msg)


@runtime_checkable
class Consumer(Protocol):
    """A reader of topics: a member of a group (:meth:`subscribe`) or of given partitions (:meth:`assign`)."""

    #: The consumer group (``None``: a reader of assigned partitions that cannot commit).
    group: str | None

    @property
    def member_id(self) -> str:
        """This member's id in its group (a new one after it lost its membership and rejoined)."""
        ...

    def subscribe(
        self,
        topics: Sequence[str],
        *,
        on_assign: PartitionsCallback | None = None,
        on_revoke: PartitionsCallback | None = None,
    ) -> None:
        """Join the group reading ``topics``; callbacks run inside :meth:`poll`."""
        ...

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Read exactly ``partitions``, without group membership (commits, if any, are not fenced)."""
        ...

    def poll(self, timeout_s: float = 1.0, *, max_records: int | None = None) -> list[StoredRecord]:
        """Records of owned partitions after their positions; waits up to ``timeout_s`` for the first."""
        ...

    def commit(self, offsets: Mapping[TopicPartition, int] | None = None) -> None:
        """Record next offsets (default: the positions after everything polled) for the group."""
        ...

    def checkpoints(self, offsets: Mapping[TopicPartition, int] | None = None) -> dict[TopicPartition, Checkpoint]:
        """Next offsets (default: the positions) with each partition's ownership token, for an offset store."""
        ...

    def assignment(self) -> frozenset[TopicPartition]:
        """The partitions this member reads now."""
        ...

    def position(self, partition: TopicPartition) -> int:
        """The offset the next poll reads from in ``partition``."""
        ...

    def seek(self, partition: TopicPartition, offset: int) -> None:
        """Read ``partition`` from ``offset`` on."""
        ...

    def seek_to_time(self, timestamp_ms: int, partitions: Iterable[TopicPartition] | None = None) -> None:
        """Read each partition (default: all assigned) from its first record at or after ``timestamp_ms``."""
        ...

    def committed(self, partition: TopicPartition) -> int | None:
        """The group's committed next offset for ``partition`` (``None``: never committed)."""
        ...

    def lag(self) -> dict[TopicPartition, int]:
        """Records after the position, per assigned partition."""
        ...

    def close(self) -> None:
        """Leave the group (its partitions move to the others at once) and release resources. Idempotent."""
        ...

    def __enter__(self) -> Consumer: ...

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...


class PositionedReads:
    """What both backends' consumers do alike with their positions and the log (a mixin).

    A consumer class sets ``group``, ``_log`` and ``_positions`` (next offset per assigned partition).
    """

    group: str | None
    settings: ConsumerSettings
    _log: Log
    _positions: dict[TopicPartition, int]
    _store: OffsetStore[Any] | None

    def assignment(self) -> frozenset[TopicPartition]:
        """The partitions this member reads now."""
        return frozenset(self._positions)

    def position(self, partition: TopicPartition) -> int:
        """The offset the next poll reads from in ``partition``."""
        return self._positions[self._check_assigned(partition)]

    def seek(self, partition: TopicPartition, offset: int) -> None:
        """Read ``partition`` from ``offset`` on."""
        raise NotImplementedError

    def seek_to_time(self, timestamp_ms: int, partitions: Iterable[TopicPartition] | None = None) -> None:
        """Read each partition from its first record at or after ``timestamp_ms`` (its end if none)."""
        for tp in list(self._positions) if partitions is None else partitions:
            found = self._log.offset_for_time(tp.topic, tp.partition, timestamp_ms)
            self.seek(tp, self._log.end_offset(tp.topic, tp.partition) if found is None else found)

    def _check_assigned(self, partition: TopicPartition) -> TopicPartition:
        if partition not in self._positions:
            msg = f"{partition.topic}/{partition.partition} is not assigned to this consumer"
            raise ValueError(msg)
        return partition

    def lag(self) -> dict[TopicPartition, int]:
        """Records after the position, per assigned partition."""
        return {
            tp: max(0, self._log.end_offset(tp.topic, tp.partition) - position)
            for tp, position in sorted(self._positions.items())
        }

    def committed(self, partition: TopicPartition) -> int | None:
        """The group's committed next offset for ``partition``."""
        if self.group is None:
            return None
        return self._log.committed(self.group, partition.topic).get(partition.partition)

    def _start_positions(
        self, partitions: Sequence[TopicPartition], stored: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, int]:
        """Where reading starts: the offset store's position, else the group's commit, else the reset policy."""
        positions: dict[TopicPartition, int] = {}
        committed: dict[str, dict[int, int]] = {}
        for tp in partitions:
            if tp in stored:
                positions[tp] = stored[tp]
                continue
            if self.group is not None and self._store is None:
                if tp.topic not in committed:
                    committed[tp.topic] = self._log.committed(self.group, tp.topic)
                if tp.partition in committed[tp.topic]:
                    positions[tp] = committed[tp.topic][tp.partition]
                    continue
            if self.settings.auto_offset_reset == "earliest":
                positions[tp] = self._log.beginning_offset(tp.topic, tp.partition)
            else:
                positions[tp] = self._log.end_offset(tp.topic, tp.partition)
        return positions


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A partition's next offset, stamped with the ownership token of the member that read up to it."""

    offset: int
    owner: str


# -- describing groups --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GroupMember:
    """A member as its group's coordinator knows it."""

    member_id: str
    client: str
    assignment: tuple[TopicPartition, ...]
    #: Milliseconds until its lease ends (file backend), ``None`` where the broker keeps it.
    lease_left_ms: int | None = None


@dataclass(frozen=True, slots=True)
class PartitionProgress:
    """One partition's committed offset, end offset and lag for a group."""

    topic: str
    partition: int
    committed: int | None
    end: int
    lag: int
    owner: str | None = None


@dataclass(frozen=True, slots=True)
class GroupDescription:
    """What ``headwater log groups GROUP`` shows."""

    group: str
    state: str
    generation: int | None
    members: tuple[GroupMember, ...]
    partitions: tuple[PartitionProgress, ...]


@runtime_checkable
class DescribesGroups(Protocol):
    """A log that can list its consumer groups and describe one (both backends)."""

    def list_groups(self) -> list[str]:
        """Names of the groups the log knows (members or commits), sorted."""
        ...

    def describe_group(self, group: str) -> GroupDescription:
        """Members, assignment, committed offsets and lag; :class:`~log.errors.UnknownGroupError` if unknown."""
        ...


def partition_progress(
    log: Log, group: str, topics: Iterable[str], owners: Mapping[TopicPartition, str] | None = None
) -> list[PartitionProgress]:
    """Committed offset, end and lag of every partition of ``topics`` (those still there) for ``group``."""
    rows: list[PartitionProgress] = []
    for topic in sorted(set(topics)):
        try:
            partitions = log.describe_topic(topic).partitions
        except UnknownTopicError:
            continue
        committed = log.committed(group, topic)
        for number in range(partitions):
            end = log.end_offset(topic, number)
            done = committed.get(number)
            start = done if done is not None else log.beginning_offset(topic, number)
            owner = (owners or {}).get(TopicPartition(topic, number))
            rows.append(PartitionProgress(topic, number, done, end, max(0, end - start), owner))
    return rows
