"""The file backend's :class:`~log.consumer.Consumer`: group membership through the log directory.

Membership, balance and fencing are :class:`~log.file.group_coordinator.GroupCoordinator`'s;
this module is the member. A background thread renews the lease every
``heartbeat_interval_ms`` and keeps the latest view of what the member owns; every
:meth:`FileConsumer.poll` first applies that view in the caller's thread: partitions
the member lost are dropped (``on_revoke``), partitions the group wants elsewhere are
dropped and released to their next owner, newly owned ones start at their committed
position (``on_assign``). Then it reads the owned partitions, taking them in turn.

On a topic that was split or merged (:mod:`log.shards`) a member reads a child partition
only once each of its parents is drained: the group committed it to its sealed end (or
this member itself read it to there), as Kinesis' KCL waits for a parent shard's
``SHARD_END`` checkpoint. The child is owned meanwhile but yields no records, so every
key's records reach the application in the order they were written.

A member whose lease ended (it was paused or starved longer than its session timeout)
finds out from the coordinator, or from its own clock before it reads: it drops every
partition without reading further and rejoins under a new member id. Its commits in
between are refused (:class:`~log.errors.FencedMemberError`).
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any

from log.base import StoredRecord, TopicPartition
from log.consumer import Checkpoint, ConsumerSettings, PartitionsCallback, PositionedReads
from log.errors import FencedMemberError, UnknownTopicError
from log.file.backend import FileLog
from log.file.group_coordinator import GroupCoordinator, MemberView
from log.offset_store import OffsetStore, ReadsOffsets
from log.topics import validate_group_name

logger = logging.getLogger(__name__)

#: How long an idle poll sleeps between looks at the partitions (no change notification on files).
_IDLE_SLEEP_S = (0.005, 0.01, 0.02, 0.05)


def _client() -> str:
    """Who the member is, for ``headwater log groups``: process, host and (shortened) command line."""
    command = " ".join([os.path.basename(sys.argv[0]), *sys.argv[1:]]) if sys.argv else sys.executable
    return f"pid {os.getpid()} on {socket.gethostname()} ({command[:80]})"


class FileConsumer(PositionedReads):
    """A :class:`~log.consumer.Consumer` of a :class:`~log.file.backend.FileLog` (see the module docstring)."""

    _log: FileLog

    def __init__(
        self,
        log: FileLog,
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
        self._member_id = f"member-{uuid.uuid4().hex[:12]}"
        self._coordinator: GroupCoordinator | None = None
        self._topics: tuple[str, ...] = ()
        self._on_assign: PartitionsCallback | None = None
        self._on_revoke: PartitionsCallback | None = None
        #: Owned (or assigned) partitions → next offset to read.
        self._positions: dict[TopicPartition, int] = {}
        #: Owned partitions → the epoch they were granted under (group members only).
        self._epochs: dict[TopicPartition, int] = {}
        self._applied_generation = -1
        self._turn = 0
        #: Partitions whose parents (split topics) are known drained: readable from now on.
        self._ready: set[TopicPartition] = set()
        # Shared with the heartbeat thread, under _lock.
        self._lock = threading.Lock()
        self._view: MemberView | None = None
        self._renewed = 0.0
        self._gone = False
        self._last_poll = time.monotonic()
        self._stop = threading.Event()
        self._heartbeats: threading.Thread | None = None
        self._closed = False

    @property
    def member_id(self) -> str:
        """This member's id (a new one after it lost its membership and rejoined)."""
        return self._member_id

    def __enter__(self) -> FileConsumer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

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
        self._topics = tuple(dict.fromkeys(topics))
        self._on_assign, self._on_revoke = on_assign, on_revoke
        self._coordinator = GroupCoordinator(self._log.root, self.group, self._partition_count)
        self._join()
        if self._heartbeats is None:
            self._heartbeats = threading.Thread(target=self._heartbeat_loop, name="headwater-heartbeat", daemon=True)
            self._heartbeats.start()

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Read exactly ``partitions`` (no membership); they start at the group's commit or ``auto_offset_reset``."""
        wanted = list(dict.fromkeys(partitions))
        for tp in wanted:
            spec = self._log.describe_topic(tp.topic)
            if not 0 <= tp.partition < spec.partitions:
                self._log.end_offset(tp.topic, tp.partition)  # UnknownPartitionError, one line
        self._positions = self._start_positions(wanted, {})

    def _partition_count(self, topic: str) -> int | None:
        try:
            return self._log.describe_topic(topic).partitions
        except UnknownTopicError:
            return None

    def _join(self) -> None:
        assert self._coordinator is not None
        view = self._coordinator.join(self._member_id, self._topics, self.settings.session_timeout_ms, _client())
        with self._lock:
            self._view, self._renewed, self._gone = view, time.monotonic(), False
        self._applied_generation = -1

    def _heartbeat_loop(self) -> None:
        interval = self.settings.heartbeat_interval_ms / 1000
        while not self._stop.wait(interval):
            coordinator = self._coordinator
            if coordinator is None:
                continue
            if time.monotonic() - self._last_poll > self.settings.max_poll_interval_ms / 1000:
                # The application stopped polling: let the others take the partitions.
                with self._lock:
                    member, self._gone = self._member_id, True
                coordinator.leave(member)
                continue
            try:
                self._heartbeat()
            except OSError as exc:  # a full or failing disk: the lease runs out unless a later one works
                logger.warning("consumer group %s: heartbeat failed: %s", self.group, exc)

    def _heartbeat(self) -> None:
        """Renew the lease and take the coordinator's latest view (either thread)."""
        assert self._coordinator is not None
        with self._lock:
            member = self._member_id
        view = self._coordinator.heartbeat(member)
        self._take(member, view)

    def _take(self, member: str, view: MemberView | None) -> None:
        with self._lock:
            if member != self._member_id:
                return  # rejoined meanwhile: the view is of the old member
            if view is None:
                self._gone = True
                return
            self._renewed = time.monotonic()
            if self._view is None or view.generation >= self._view.generation:
                self._view = view

    def _sync(self) -> None:
        """Apply the latest view of what this member owns (see the module docstring)."""
        if self._coordinator is None:
            return
        with self._lock:
            view, renewed, gone = self._view, self._renewed, self._gone
        if gone or time.monotonic() - renewed > self.settings.session_timeout_ms / 1000:
            self._drop(frozenset(self._epochs))
            with self._lock:
                self._member_id = f"member-{uuid.uuid4().hex[:12]}"
            self._join()
            with self._lock:
                view = self._view
        assert view is not None
        if view.generation == self._applied_generation:
            return
        lost = frozenset(tp for tp, epoch in self._epochs.items() if view.owned.get(tp) != epoch)
        self._drop(lost)
        while view.revoking:
            # Wanted elsewhere: stop reading it, then hand it over (everything polled
            # before this poll was processed, and committed if the application commits).
            self._drop(frozenset(tp for tp in view.revoking if tp in self._epochs))
            member = self._member_id
            released = self._coordinator.release(member, view.revoking)
            self._take(member, released)
            if released is None:
                return
            view = released
        gained = {tp: epoch for tp, epoch in view.owned.items() if tp not in self._epochs and tp not in view.revoking}
        if gained:
            tokens = {tp: self._token(epoch) for tp, epoch in gained.items()}
            claimed = self._store.claim(self.group or "", tokens) if self._store is not None else {}
            self._positions.update(self._start_positions(sorted(gained), claimed))
            self._epochs.update(gained)
            if self._on_assign is not None:
                self._on_assign(frozenset(gained))
        self._applied_generation = view.generation

    def _drop(self, partitions: frozenset[TopicPartition]) -> None:
        if not partitions:
            return
        if self._on_revoke is not None:
            self._on_revoke(partitions)
        for tp in partitions:
            self._epochs.pop(tp, None)
            self._positions.pop(tp, None)

    def _token(self, epoch: int) -> str:
        """The partition's ownership token for an offset store: epochs are unique within the group."""
        return f"{self._member_id}@{epoch}"

    # -- reading ------------------------------------------------------------------------------

    def poll(self, timeout_s: float = 1.0, *, max_records: int | None = None) -> list[StoredRecord]:
        """Records of owned partitions after their positions; waits up to ``timeout_s`` for the first."""
        limit = max_records or self.settings.max_poll_records
        deadline = time.monotonic() + max(timeout_s, 0.0)
        idle = 0
        while True:
            self._last_poll = time.monotonic()
            self._sync()
            records = self._read(limit)
            now = time.monotonic()
            if records or now >= deadline:
                return records
            time.sleep(min(_IDLE_SLEEP_S[min(idle, len(_IDLE_SLEEP_S) - 1)], deadline - now))
            idle += 1

    def _read(self, limit: int) -> list[StoredRecord]:
        owned = sorted(self._positions)
        if not owned:
            return []
        self._turn = (self._turn + 1) % len(owned)
        out: list[StoredRecord] = []
        for tp in owned[self._turn :] + owned[: self._turn]:
            room = limit - len(out)
            if room <= 0:
                break
            if tp not in self._ready and not self._parents_drained(tp):
                continue
            batch = self._log.read(tp.topic, tp.partition, self._positions[tp], max_records=room)
            if batch:
                out.extend(batch)
                self._positions[tp] = batch[-1].offset + 1
        return out

    def _parents_drained(self, tp: TopicPartition) -> bool:
        """Whether every parent of ``tp`` (a split topic's child) was processed to its sealed end."""
        shards = self._log.shard_map(tp.topic)
        if shards is not None:
            for number in shards.parents(tp.partition):
                parent = shards.shard(number)
                assert parent.sealed_end is not None
                if not self._drained(TopicPartition(tp.topic, number), parent.sealed_end):
                    return False
        self._ready.add(tp)
        return True

    def _drained(self, parent: TopicPartition, end: int) -> bool:
        position = self._positions.get(parent)
        if position is not None and position >= end:
            return True  # owned here and read to its end (polled before anything of the child)
        if self._log.beginning_offset(parent.topic, parent.partition) >= end:
            return True  # nothing left in it (it was empty when sealed)
        if self.group is None:
            return False
        if isinstance(self._store, ReadsOffsets):
            done = self._store.stored(self.group, parent)
        else:
            done = self._log.committed(self.group, parent.topic).get(parent.partition)
        return done is not None and done >= end

    def seek(self, partition: TopicPartition, offset: int) -> None:
        """Read ``partition`` from ``offset`` on."""
        self._positions[self._check_assigned(partition)] = max(offset, 0)

    # -- committing ---------------------------------------------------------------------------

    def checkpoints(self, offsets: Mapping[TopicPartition, int] | None = None) -> dict[TopicPartition, Checkpoint]:
        """Next offsets (default: the positions) with each partition's ownership token."""
        chosen = dict(self._positions) if offsets is None else dict(offsets)
        out: dict[TopicPartition, Checkpoint] = {}
        for tp, offset in chosen.items():
            epoch = self._owned_epoch(tp)
            out[tp] = Checkpoint(offset, self._token(epoch))
        return out

    def _owned_epoch(self, tp: TopicPartition) -> int:
        epoch = self._epochs.get(tp)
        if epoch is None:
            if self._coordinator is None and tp in self._positions:
                return 0  # assigned without membership: nothing to fence
            raise FencedMemberError(
                self.group or "-", self._member_id, tp.topic, tp.partition, "it is not assigned to this member"
            )
        return epoch

    def commit(self, offsets: Mapping[TopicPartition, int] | None = None) -> None:
        """Record next offsets (default: the positions after everything polled) for the group.

        :class:`FencedMemberError` if this member no longer owns one of the partitions
        (nothing is recorded then).
        """
        if self.group is None:
            msg = "this consumer has no group to commit to"
            raise ValueError(msg)
        chosen = dict(self._positions) if offsets is None else dict(offsets)
        if not chosen:
            return
        epochs = {tp: self._owned_epoch(tp) for tp in chosen}
        if self._coordinator is None:
            self._log.commit(self.group, chosen)
            return
        try:
            with self._coordinator.fenced(self._member_id, epochs):
                self._log.commit(self.group, chosen)
        except FencedMemberError:
            # Learn now what this member still owns, so the next poll reads none of what it lost.
            self._heartbeat()
            self._applied_generation = -1
            raise

    # -- closing ------------------------------------------------------------------------------

    def close(self) -> None:
        """Leave the group (partitions move to the others at once); stop the heartbeat thread. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._heartbeats is not None:
            self._heartbeats.join()
        if self._coordinator is not None:
            try:
                self._coordinator.leave(self._member_id)
            except OSError as exc:
                logger.warning("consumer group %s: leaving failed (the lease will run out): %s", self.group, exc)
        self._positions.clear()
        self._epochs.clear()
        if self._owns_log:
            self._log.close()
