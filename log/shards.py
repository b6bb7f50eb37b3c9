"""Elastic shards: each partition of a topic owns a range of the key hash; partitions split and merge.

As in Alibaba LogHub (and Kinesis), a partition of a file-log topic can be **split**
into two children covering its range, and two partitions with adjacent ranges can be
**merged** into one child. The parent is *sealed* at that moment: its end offset is
recorded and nothing is appended to it again. New records go to the open partition
whose range covers their key, so a key's records live in a chain of partitions
(parent, then child, then grandchild...), each holding a contiguous stretch of them.

**Positions.** A key's position in the hash space is taken from Kafka's partitioner so
that, before any split, routing equals :func:`log.partitioner.partition_for` exactly:
with ``n`` hash partitions (the partition count the topic was created with) and
``h = murmur2(key) & 0x7fffffff``, the position is ``(h % n) * width + h // n`` where
``width = ceil(2**31 / n)``; so partition ``i`` covers ``[i * width, (i + 1) * width)``
and partitions ``0 .. n-1`` tile ``[0, n * width)``. A null key has position 0 (Kafka's
partitioner pins it to partition 0 too).

**Numbers.** Children get the next free partition numbers, so a partition's number is
always above its parents'; a key's chain of partitions is in number order, and a
reader that reads partitions one after another in number order, each to its end,
reads every key in order. Parallel readers wait for parents (see :meth:`ShardMap.parents`).

This module is the model (pure, shared by every reader); the file backend stores the
map (``log/file/shard_store.py``); the Kafka backend refuses to split (README).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any, Protocol, runtime_checkable

from core.errors import PermanentError
from log.errors import LogError, UnknownPartitionError
from log.partitioner import murmur2

HASH_LIMIT = 1 << 31


class ShardError(LogError, PermanentError):
    """A split or merge that cannot be done (sealed partition, ranges not adjacent, bad hash...)."""


@dataclass(frozen=True, slots=True)
class Shard:
    """One partition's place in the map: its hash range ``[lo, hi)``, family, and sealed end."""

    number: int
    lo: int
    hi: int
    parents: tuple[int, ...] = ()
    children: tuple[int, ...] = ()
    #: The end offset recorded when the partition was sealed (``None``: open, takes appends).
    sealed_end: int | None = None

    @property
    def is_open(self) -> bool:
        """Whether appends still go to this partition."""
        return self.sealed_end is None

    def covers(self, position: int) -> bool:
        """Whether ``position`` is in this partition's range."""
        return self.lo <= position < self.hi

    def to_json(self) -> dict[str, Any]:
        """The map file's entry of this partition."""
        return {
            "partition": self.number,
            "lo": self.lo,
            "hi": self.hi,
            "parents": list(self.parents),
            "children": list(self.children),
            "sealed_end": self.sealed_end,
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Shard:
        """Inverse of :meth:`to_json`."""
        end = raw.get("sealed_end")
        return cls(
            int(raw["partition"]),
            int(raw["lo"]),
            int(raw["hi"]),
            tuple(int(p) for p in raw.get("parents", ())),
            tuple(int(c) for c in raw.get("children", ())),
            None if end is None else int(end),
        )


def width_of(hash_partitions: int) -> int:
    """How much of the hash space each of ``hash_partitions`` initial partitions covers."""
    return -(-HASH_LIMIT // hash_partitions)


def key_position(key: bytes | None, hash_partitions: int) -> int:
    """The key's position in the hash space of a topic created with ``hash_partitions`` (module docstring)."""
    if key is None:
        return 0
    h = murmur2(key) & 0x7FFFFFFF
    return (h % hash_partitions) * width_of(hash_partitions) + h // hash_partitions


@dataclass(frozen=True, slots=True)
class ShardMap:
    """Every partition of a topic with its range, parents, children and sealed end (module docstring)."""

    topic: str
    hash_partitions: int
    shards: tuple[Shard, ...]
    #: Bumped by every split and merge.
    version: int = 0

    @classmethod
    def initial(cls, topic: str, partitions: int) -> ShardMap:
        """The map of a topic that was never split: partition ``i`` covers the keys Kafka's partitioner gives ``i``."""
        width = width_of(partitions)
        return cls(topic, partitions, tuple(Shard(i, i * width, (i + 1) * width) for i in range(partitions)))

    @property
    def count(self) -> int:
        """How many partitions the topic has (sealed ones included): numbers ``0 .. count-1``."""
        return len(self.shards)

    @property
    def space(self) -> int:
        """The end of the hash space: positions are in ``[0, space)``."""
        return self.hash_partitions * width_of(self.hash_partitions)

    @property
    def is_split(self) -> bool:
        """Whether any partition was ever split or merged."""
        return self.count != self.hash_partitions

    def shard(self, number: int) -> Shard:
        """The partition ``number``; :class:`UnknownPartitionError` if the topic has none such."""
        if not 0 <= number < self.count:
            raise UnknownPartitionError(self.topic, number, self.count)
        return self.shards[number]

    def open_shards(self) -> list[Shard]:
        """The partitions that take appends, by range."""
        return sorted((s for s in self.shards if s.is_open), key=lambda s: s.lo)

    def position(self, key: bytes | None) -> int:
        """The key's position in this topic's hash space."""
        return key_position(key, self.hash_partitions)

    def open_for(self, position: int) -> int:
        """The open partition whose range covers ``position``."""
        for shard in self.shards:
            if shard.is_open and shard.covers(position):
                return shard.number
        msg = f"topic {self.topic!r}: no open partition covers hash {position} (damaged partition map)"
        raise ShardError(msg)

    def route(self, key: bytes | None) -> int:
        """The open partition a new record with ``key`` goes to."""
        return self.open_for(self.position(key))

    def route_all(self, keys: Iterable[bytes | None]) -> list[int]:
        """:meth:`route` of every key (ranges looked up once per distinct position)."""
        opened = self.open_shards()
        los = [s.lo for s in opened]
        out = []
        for key in keys:
            at = bisect_right(los, self.position(key)) - 1
            out.append(opened[at].number)
        return out

    def chain(self, key: bytes | None) -> list[int]:
        """Every partition that ever held ``key``'s records, oldest first (ascending numbers)."""
        position = self.position(key)
        return [s.number for s in self.shards if s.covers(position)]

    def parents(self, number: int) -> tuple[int, ...]:
        """The partitions a reader must finish (to their sealed ends) before reading ``number``."""
        return self.shard(number).parents

    # -- changes ---------------------------------------------------------------------------

    def split(self, number: int, end_offset: int, at: int | None = None) -> ShardMap:
        """Seal ``number`` at ``end_offset`` and add two children covering ``[lo, at)`` and ``[at, hi)``."""
        shard = self.shard(number)
        if not shard.is_open:
            msg = (
                f"partition {self.topic}/{number} is sealed (split or merged already, ends at offset "
                f"{shard.sealed_end}); split one of its open descendants {self._open_below(number)} instead"
            )
            raise ShardError(msg)
        if shard.hi - shard.lo < 2:
            msg = f"partition {self.topic}/{number} covers a single hash ({shard.lo}): it cannot be split"
            raise ShardError(msg)
        at = (shard.lo + shard.hi) // 2 if at is None else at
        if not shard.lo < at < shard.hi:
            msg = (
                f"--at {at} is outside partition {self.topic}/{number}'s hash range: "
                f"give a hash with {shard.lo} < HASH < {shard.hi}"
            )
            raise ShardError(msg)
        low, high = self.count, self.count + 1
        shards = list(self.shards)
        shards[number] = replace(shard, children=(low, high), sealed_end=end_offset)
        shards.append(Shard(low, shard.lo, at, parents=(number,)))
        shards.append(Shard(high, at, shard.hi, parents=(number,)))
        return replace(self, shards=tuple(shards), version=self.version + 1)

    def check_merge(self, first: int, second: int) -> tuple[Shard, Shard]:
        """The two partitions to merge, lower range first; :class:`ShardError` when they cannot be."""
        if first == second:
            msg = f"cannot merge partition {self.topic}/{first} with itself: name two adjacent open partitions"
            raise ShardError(msg)
        a, b = sorted((self.shard(first), self.shard(second)), key=lambda s: s.lo)
        for s in (a, b):
            if not s.is_open:
                msg = (
                    f"partition {self.topic}/{s.number} is sealed (ends at offset {s.sealed_end}); "
                    f"merge open partitions only: {self._describe_open()}"
                )
                raise ShardError(msg)
        if a.hi != b.lo:
            msg = (
                f"partitions {self.topic}/{a.number} [{a.lo}, {a.hi}) and {b.number} [{b.lo}, {b.hi}) are not "
                f"adjacent; merge neighbours: {self._describe_open()}"
            )
            raise ShardError(msg)
        return a, b

    def merge(self, first: int, second: int, ends: dict[int, int]) -> ShardMap:
        """Seal ``first`` and ``second`` (at ``ends``) and add one child covering both ranges."""
        a, b = self.check_merge(first, second)
        child = self.count
        shards = list(self.shards)
        for s in (a, b):
            shards[s.number] = replace(s, children=(child,), sealed_end=ends[s.number])
        shards.append(Shard(child, a.lo, b.hi, parents=tuple(sorted((a.number, b.number)))))
        return replace(self, shards=tuple(shards), version=self.version + 1)

    def _open_below(self, number: int) -> list[int]:
        found: list[int] = []
        stack = list(self.shards[number].children)
        while stack:
            s = self.shards[stack.pop()]
            if s.is_open:
                found.append(s.number)
            stack.extend(s.children)
        return sorted(set(found))

    def _describe_open(self) -> str:
        return ", ".join(f"{s.number} [{s.lo}, {s.hi})" for s in self.open_shards())

    # -- the file ---------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """The map file's content."""
        return {
            "topic": self.topic,
            "hash_partitions": self.hash_partitions,
            "version": self.version,
            "partitions": [s.to_json() for s in self.shards],
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> ShardMap:
        """Inverse of :meth:`to_json`."""
        shards = tuple(Shard.from_json(s) for s in raw["partitions"])
        if [s.number for s in shards] != list(range(len(shards))):
            msg = f"topic {raw.get('topic')!r}: damaged partition map (partitions not numbered 0..n-1)"
            raise ShardError(msg)
        return cls(str(raw["topic"]), int(raw["hash_partitions"]), shards, int(raw.get("version", 0)))


@runtime_checkable
class ElasticShards(Protocol):
    """A log whose partitions split and merge (the file backend; see the module docstring)."""

    def shard_map(self, topic: str) -> ShardMap | None:
        """The topic's partition map now, or ``None`` if it was never split or merged."""
        ...

    def split_partition(self, topic: str, partition: int, *, at: int | None = None) -> ShardMap:
        """Seal ``partition`` (recording its end) and create two children covering its range."""
        ...

    def merge_partitions(self, topic: str, first: int, second: int) -> ShardMap:
        """Seal two adjacent open partitions and create one child covering both ranges."""
        ...


#: Why the Kafka backend refuses to split and merge (README, "Elastic shards"; docs/architecture.md).
KAFKA_REFUSAL = (
    "the Kafka backend cannot split or merge partitions: Kafka can only add partitions, which moves most "
    "keys to another partition and breaks their order (3 -> 4 partitions moves 75% of keys), and ordered "
    "client-side expansion (KIP-253) is not implemented; use the file backend (log.backend: file) for elastic shards"
)


def elastic(log: object) -> ElasticShards:
    """``log`` as a log with elastic shards; :class:`ShardError` saying why not (the Kafka backend)."""
    if not isinstance(log, ElasticShards):
        raise ShardError(KAFKA_REFUSAL)
    return log


def shard_map_of(log: object, topic: str) -> ShardMap | None:
    """The topic's partition map if ``log`` has elastic shards and the topic was ever split; else ``None``."""
    if isinstance(log, ElasticShards):
        return log.shard_map(topic)
    return None


def hash_partitions(log: object, topic: str, partitions: int) -> int:
    """How many partitions Kafka's partitioner spreads ``topic``'s keys over (``partitions`` unless split).

    A writer that routes with :func:`log.partitioner.partition_for` over this count names a
    partition that covered the key at some time; the file log then appends to the open
    partition that covers it now.
    """
    found = shard_map_of(log, topic)
    return partitions if found is None else found.hash_partitions
