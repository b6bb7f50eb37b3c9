"""Consumer-group membership on the file backend: one state file per group, changed under an ``flock``.

Layout under the log's root (``+`` starts no topic name, so no topic can collide)::

    +groups/<group>.json   the group's state (replaced whole)
    +groups/<group>.lock   held (flock) while one process reads, changes and writes the state

The state holds a generation (bumped by every change of membership or ownership), the
last epoch handed out, the members (subscribed topics, lease deadline, who they are)
and each partition's owner, epoch and the member it is to move to (``next``).

Rules, applied under the lock by whichever process calls (there is no coordinator process):

* **Leases.** A member's lease ends ``session_timeout_ms`` after its last heartbeat; a
  member whose lease ended is removed by the next caller and loses its partitions at once.
* **Balance.** After every change of membership, partitions are balanced over the live
  members (:func:`log.group_assignment.balance`). A partition without a live owner gets
  its new owner at once; one whose owner is alive is only marked ``next`` and changes
  hands when that owner releases it (at its next poll, after it committed what it
  processed) or when its lease ends, so two live members never hold it at once.
* **Fencing.** Each change of hands gives the partition a new epoch, its fencing token
  (a counter of the group, never reused: the state file is fsynced whenever an epoch
  is handed out). :meth:`GroupCoordinator.fenced` checks, under the lock, that a member
  is alive and still owns each partition at the epoch it was polled under; the commit
  appends its offsets inside that block, so a paused member whose partition moved can
  no longer commit.

Wall-clock times (``time.time``) are compared across processes of one machine. A member
frozen while it holds the lock (a heartbeat or a commit: milliseconds) holds up the
group's other members until it resumes or dies; the kernel drops the lock of a dead one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from core.durable_files import replace_file
from log.base import TopicPartition
from log.errors import FencedMemberError
from log.group_assignment import balance
from log.topics import validate_group_name

GROUPS_DIRECTORY = "+groups"
_STATE_SUFFIX = ".json"
_LOCK_SUFFIX = ".lock"


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(slots=True)
class Member:
    """A live member as the state file records it."""

    topics: tuple[str, ...]
    deadline_ms: int
    session_timeout_ms: int
    client: str


@dataclass(slots=True)
class Ownership:
    """Who owns a partition, under which epoch, and to whom it is to move (``next``)."""

    owner: str
    epoch: int
    next: str | None = None


@dataclass(slots=True)
class GroupState:
    """The whole state file of a group."""

    generation: int = 0
    epoch: int = 0
    members: dict[str, Member] = field(default_factory=dict)
    partitions: dict[TopicPartition, Ownership] = field(default_factory=dict)

    def encode(self) -> bytes:
        """The state file's bytes."""
        partitions: dict[str, dict[str, dict[str, object]]] = {}
        for tp, own in sorted(self.partitions.items()):
            partitions.setdefault(tp.topic, {})[str(tp.partition)] = {
                "owner": own.owner,
                "epoch": own.epoch,
                "next": own.next,
            }
        return orjson.dumps(
            {
                "generation": self.generation,
                "epoch": self.epoch,
                "members": {
                    name: {
                        "topics": list(m.topics),
                        "deadline_ms": m.deadline_ms,
                        "session_timeout_ms": m.session_timeout_ms,
                        "client": m.client,
                    }
                    for name, m in sorted(self.members.items())
                },
                "partitions": partitions,
            },
            option=orjson.OPT_INDENT_2,
        )

    @classmethod
    def decode(cls, data: bytes) -> GroupState:
        """Inverse of :meth:`encode`."""
        raw = orjson.loads(data)
        return cls(
            generation=int(raw["generation"]),
            epoch=int(raw["epoch"]),
            members={
                name: Member(tuple(m["topics"]), int(m["deadline_ms"]), int(m["session_timeout_ms"]), str(m["client"]))
                for name, m in raw["members"].items()
            },
            partitions={
                TopicPartition(topic, int(number)): Ownership(str(o["owner"]), int(o["epoch"]), o.get("next"))
                for topic, numbers in raw["partitions"].items()
                for number, o in numbers.items()
            },
        )


@dataclass(frozen=True, slots=True)
class MemberView:
    """What one member owns: each partition's epoch, and those it must release (wanted elsewhere)."""

    generation: int
    owned: dict[TopicPartition, int]
    revoking: frozenset[TopicPartition]


def list_group_names(root: Path) -> list[str]:
    """Groups that have a state file under the log's ``root``, sorted."""
    directory = root / GROUPS_DIRECTORY
    if not directory.is_dir():
        return []
    return sorted(
        name.removesuffix(_STATE_SUFFIX)
        for name in os.listdir(directory)
        if name.endswith(_STATE_SUFFIX) and not name.startswith(".")
    )


class GroupCoordinator:
    """Membership, assignment and fencing of one group, through its state file (see the module docstring).

    ``partition_count`` gives a topic's partitions, or ``None`` once it is gone.
    """

    def __init__(self, root: Path, group: str, partition_count: Callable[[str], int | None]) -> None:
        self.group = validate_group_name(group)
        self._directory = root / GROUPS_DIRECTORY
        self._state_path = self._directory / f"{group}{_STATE_SUFFIX}"
        self._lock_path = self._directory / f"{group}{_LOCK_SUFFIX}"
        self._partition_count = partition_count

    # -- the member's calls ---------------------------------------------------------------

    def join(self, member: str, topics: tuple[str, ...], session_timeout_ms: int, client: str) -> MemberView:
        """Add ``member`` (lease from now) subscribed to ``topics``; rebalance."""
        with self._changing() as state:
            now = _now_ms()
            self._expire(state, now)
            state.members[member] = Member(topics, now + session_timeout_ms, session_timeout_ms, client)
            state.generation += 1
            self._rebalance(state)
            return self._view(state, member)

    def heartbeat(self, member: str) -> MemberView | None:
        """Extend ``member``'s lease; its current view, or ``None`` if its lease already ended (it must rejoin)."""
        with self._changing() as state:
            now = _now_ms()
            self._expire(state, now)
            found = state.members.get(member)
            if found is None:
                return None
            found.deadline_ms = now + found.session_timeout_ms
            return self._view(state, member)

    def release(self, member: str, partitions: frozenset[TopicPartition]) -> MemberView | None:
        """``member`` stopped reading ``partitions``: hand each to its next owner; ``None`` if ``member`` is gone."""
        with self._changing() as state:
            now = _now_ms()
            self._expire(state, now)
            for tp in sorted(partitions):
                own = state.partitions.get(tp)
                if own is not None and own.owner == member:
                    self._hand_over(state, tp, own.next)
            self._rebalance(state)
            found = state.members.get(member)
            if found is None:
                return None
            found.deadline_ms = now + found.session_timeout_ms
            return self._view(state, member)

    def leave(self, member: str) -> None:
        """Remove ``member`` now (a clean close); its partitions go to the others at once."""
        with self._changing() as state:
            self._expire(state, _now_ms())
            if state.members.pop(member, None) is None:
                return
            state.generation += 1
            for tp, own in sorted(state.partitions.items()):
                if own.owner == member:
                    self._hand_over(state, tp, own.next)
            self._rebalance(state)

    @contextlib.contextmanager
    def fenced(self, member: str, epochs: Mapping[TopicPartition, int]) -> Iterator[None]:
        """Run the block under the group's lock if ``member`` is alive and owns each partition at its epoch.

        Otherwise raise :class:`FencedMemberError` naming the first partition it lost; the
        block (a commit's append) does not run.
        """
        with self._changing() as state:
            now = _now_ms()
            self._expire(state, now)
            alive = member in state.members
            for tp, epoch in sorted(epochs.items()):
                own = state.partitions.get(tp)
                if not alive:
                    reason = "its lease ended: it did not heartbeat within its session timeout"
                elif own is None or own.owner != member or own.epoch != epoch:
                    reason = f"the group gave it to another member (generation {state.generation})"
                else:
                    continue
                raise FencedMemberError(self.group, member, tp.topic, tp.partition, reason)
            yield

    # -- reading ----------------------------------------------------------------------------

    def state(self) -> GroupState | None:
        """The group's state now (expired members still listed until a member calls); ``None`` if none."""
        try:
            return GroupState.decode(self._state_path.read_bytes())
        except FileNotFoundError:
            return None

    # -- under the lock -----------------------------------------------------------------------

    @contextlib.contextmanager
    def _changing(self) -> Iterator[GroupState]:
        """The state, under the lock; written back if the block changed it (fsynced when an epoch was handed out)."""
        self._directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            before = self.state()
            state = GroupState() if before is None else GroupState.decode(before.encode())
            yield state
            if state != before:
                # Lease renewals need no fsync (a machine crash ends every lease anyway);
                # an epoch must never be handed out twice, so one that was is made durable.
                durable = before is None or state.epoch != before.epoch
                replace_file(self._state_path, state.encode(), durable=durable)
        finally:
            os.close(fd)

    def _expire(self, state: GroupState, now: int) -> None:
        """Remove members whose lease ended; their partitions go to their next owners, or are rebalanced."""
        dead = {name for name, m in state.members.items() if m.deadline_ms < now}
        if not dead:
            return
        for name in dead:
            del state.members[name]
        state.generation += 1
        for tp, own in sorted(state.partitions.items()):
            if own.owner in dead:
                self._hand_over(state, tp, own.next)
            elif own.next in dead:
                own.next = None
        self._rebalance(state)

    @staticmethod
    def _hand_over(state: GroupState, tp: TopicPartition, to: str | None) -> None:
        """Give ``tp`` to live member ``to`` under a new epoch, or leave it ownerless for the rebalance."""
        if to is not None and to in state.members:
            state.epoch += 1
            state.partitions[tp] = Ownership(to, state.epoch)
        else:
            del state.partitions[tp]
        state.generation += 1

    def _rebalance(self, state: GroupState) -> None:
        """Balance the subscribed partitions over the live members (see the module docstring)."""
        subscriptions = {name: frozenset(m.topics) for name, m in state.members.items()}
        counts: dict[str, int] = {}
        for topic in sorted({t for m in state.members.values() for t in m.topics}):
            count = self._partition_count(topic)
            if count is not None:
                counts[topic] = count
        owners = {tp: own.owner for tp, own in state.partitions.items()}
        wanted = balance(subscriptions, counts, owners)
        changed = False
        for tp in [tp for tp in state.partitions if tp not in wanted]:
            del state.partitions[tp]  # its topic is gone, or nobody subscribes to it any more
            changed = True
        for tp, member in sorted(wanted.items()):
            own = state.partitions.get(tp)
            if own is None:
                state.epoch += 1
                state.partitions[tp] = Ownership(member, state.epoch)
                changed = True
            elif own.owner == member and own.next is not None:
                own.next = None
                changed = True
            elif member not in (own.owner, own.next):
                own.next = member
                changed = True
        if changed:
            state.generation += 1

    @staticmethod
    def _view(state: GroupState, member: str) -> MemberView:
        owned = {tp: own.epoch for tp, own in state.partitions.items() if own.owner == member}
        revoking = frozenset(tp for tp, own in state.partitions.items() if own.owner == member and own.next)
        return MemberView(state.generation, owned, revoking)
