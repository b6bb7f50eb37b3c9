"""The embedded ``file`` backend of :class:`~log.base.Log`: topics as directories on one machine.

Layout under ``root``::

    <topic>/topic.json                        the TopicSpec
    <topic>/shards.json, shards.lock          the partition map after a split or merge (log.file.shard_store)
    <topic>/<partition>/<base:020d>.log       segments of CRC-checked batches (log.file.batch_codec)
    <topic>/<partition>/<base:020d>.index     sparse offset index      (log.file.segment_index)
    <topic>/<partition>/<base:020d>.timeindex sparse time index
    <topic>/<partition>/writer.lock           one writer per partition (log.file.writer_lock)
    <topic>/<partition>/cleaner-checkpoint.json  compaction progress   (log.file.compaction)
    <topic>/<partition>/recovery-point        acknowledged end of the active segment (log.file.recovery_point)

Any number of processes may open the same root. A partition's writer lock is taken at
the first append and kept until :meth:`FileLog.close`; internal topics (``_headwater.*``,
written by every process, e.g. consumer offsets) take it around each append instead.
A torn tail left by a crashed writer is truncated (with a warning) when a partition is
first opened while no writer holds it, and always before a new writer appends.
Once a topic was split or merged (:mod:`log.shards`), every append batch is routed by
key to the open partitions covering the keys, whatever partition the caller named, under
the lock that orders appends against a seal (:mod:`log.file.shard_store`).
Appended batches store their records zstd-compressed when ``compression="zstd"`` (the
default, ``log.file.compression``) and that is smaller; readers take either kind.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Literal

from log.base import (
    READ_MAX_BYTES,
    READ_MAX_RECORDS,
    AppendResult,
    CompactionResult,
    Record,
    StoredRecord,
    TopicPartition,
    TopicSpec,
)
from log.cleaner import TopicUsage
from log.consumer import GroupDescription, GroupMember, partition_progress
from log.consumer_groups import ConsumerOffsets
from log.errors import TopicExistsError, UnknownGroupError, UnknownPartitionError, UnknownTopicError
from log.file.batch_codec import Compression, EncodedBatch, decode_records, encode_batch, parse_header
from log.file.compaction import CleanerCheckpoint, clean_partition, cleaning_due, partition_usage
from log.file.encoded_appends import EncodedAppends
from log.file.group_coordinator import GroupCoordinator, list_group_names
from log.file.partition import Partition
from log.file.shard_store import TopicShards
from log.file.topic_store import (
    SPEC_NAME,
    create_topic_directory,
    delete_topic_directory,
    list_topic_names,
    partition_directory,
    read_spec,
    topic_directory,
)
from log.shards import ShardError, ShardMap
from log.topic_policy import TopicPolicies, configured_segment_bytes
from log.topics import INTERNAL_PREFIX

if TYPE_CHECKING:
    from log.columns import RecordColumns

DEFAULT_SEGMENT_BYTES = 128 * 1024 * 1024


def _now_ms() -> int:
    return int(time.time() * 1000)


def _decoded(topic: str, batch: EncodedBatch) -> list[Record]:
    """The records of a natively encoded batch (to route them one by one: split topics only)."""
    data = bytes(encode_batch(0, batch, 0)[0])
    header = parse_header(data, 0)
    assert header is not None
    stored: list[StoredRecord] = []
    decode_records(
        data,
        0,
        header,
        topic=topic,
        partition=0,
        min_offset=0,
        out=stored,
        max_records=len(batch) + 1,
        max_bytes=1 << 62,  # no byte limit: every record of the batch (compressed ones may expand a lot)
    )
    if len(stored) != len(batch):
        msg = f"an encoded batch for {topic} holds {len(stored)} records, not {len(batch)}"
        raise ValueError(msg)
    return [Record(r.key, r.value, r.headers, r.timestamp_ms) for r in stored]


class _OpenTopic:
    """A topic as this process opened it; a recreated topic (new ``topic.json`` identity) is a new one."""

    def __init__(self, spec: TopicSpec, identity: tuple[int, int], shards: TopicShards) -> None:
        self.base_spec = spec
        self.identity = identity
        self.partitions: dict[int, Partition] = {}
        #: The partition map and append lock; ``None`` for internal topics (never split).
        self.shards: TopicShards | None = None if spec.name.startswith(INTERNAL_PREFIX) else shards
        self._spec_for: tuple[ShardMap | None, TopicSpec] = (None, spec)

    @property
    def spec(self) -> TopicSpec:
        """The spec, with the partition count of the current map (sealed partitions included)."""
        shards = self.shards.current() if self.shards is not None else None
        if shards is None:
            return self.base_spec
        seen, spec = self._spec_for
        if seen is not shards:
            spec = replace(self.base_spec, partitions=shards.count)
            self._spec_for = (shards, spec)
        return spec

    def close(self) -> None:
        for partition in self.partitions.values():
            partition.close()
        if self.shards is not None:
            self.shards.close()


class FileLog(EncodedAppends):
    """A :class:`~log.base.Log` stored in files under ``root`` (see the module docstring)."""

    #: The conformance suite's compaction tests run against this backend.
    supports_compaction = True

    def __init__(
        self,
        root: Path,
        *,
        fsync: Literal["always", "never"] = "always",
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        compression: Compression = "zstd",
        policies: TopicPolicies | None = None,
    ) -> None:
        """Open the log under ``root``; ``policies`` (``log.topics``) replace parts of topics' specs."""
        if segment_bytes <= 0:
            msg = f"segment_bytes must be positive, not {segment_bytes}"
            raise ValueError(msg)
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._fsync = fsync == "always"
        self._segment_bytes = segment_bytes
        self._policies = policies or TopicPolicies()
        #: How appended batches store their records (``log.file.compression``).
        self.compression: Compression = compression
        self._lock = threading.RLock()
        self._topics: dict[str, _OpenTopic] = {}
        self._spec_paths: dict[str, str] = {}
        self._offsets = ConsumerOffsets(self)

    def __enter__(self) -> FileLog:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- topics -----------------------------------------------------------------------

    def _open_topic(self, name: str) -> _OpenTopic:
        spec_path = self._spec_paths.get(name)
        if spec_path is None:  # validated and joined once per name: this runs at every append and read
            spec_path = self._spec_paths[name] = str(topic_directory(self.root, name) / SPEC_NAME)
        try:
            st = os.stat(spec_path)
        except (FileNotFoundError, NotADirectoryError):
            st = None
        # Inode numbers are reused; the change time (set when the topic's spec was written,
        # never after: splits add partition directories beside it) tells a recreated topic
        # from the one this process opened.
        identity = (st.st_ino, st.st_ctime_ns) if st is not None else (-1, -1)
        with self._lock:
            opened = self._topics.get(name)
            if opened is not None and opened.identity == identity:
                return opened
            if opened is not None:
                opened.close()
                del self._topics[name]
            if st is None:
                raise UnknownTopicError(name)
            directory = topic_directory(self.root, name)
            opened = _OpenTopic(
                self._policies.apply(read_spec(self.root, name)), identity, TopicShards(directory, name)
            )
            self._topics[name] = opened
            return opened

    def _partition(self, topic: str, partition: int, opened: _OpenTopic | None = None) -> Partition:
        if opened is None:
            opened = self._open_topic(topic)
        found = opened.partitions.get(partition)
        if found is not None:
            return found
        count = opened.spec.partitions
        if not 0 <= partition < count:
            raise UnknownPartitionError(topic, partition, count)
        with self._lock:
            found = opened.partitions.get(partition)
            if found is None:
                found = Partition(
                    partition_directory(topic_directory(self.root, topic), partition),
                    topic,
                    partition,
                    fsync=self._fsync,
                    segment_bytes=configured_segment_bytes(opened.spec) or self._segment_bytes,
                    shared_writer=topic.startswith(INTERNAL_PREFIX),
                    compression=self.compression,
                )
                found.recover_if_unlocked()
                opened.partitions[partition] = found
            return found

    def create_topic(self, spec: TopicSpec, *, exist_ok: bool = True) -> None:
        """Create a topic; with ``exist_ok`` an existing topic is left as it is.

        Internal names (``_headwater.*``) are accepted here; user-facing layers reject them.
        """
        if not create_topic_directory(self.root, spec) and not exist_ok:
            raise TopicExistsError(spec.name)

    def delete_topic(self, name: str) -> None:
        """Delete a topic and all its records."""
        topic_directory(self.root, name)
        with self._lock:
            opened = self._topics.pop(name, None)
            if opened is not None:
                opened.close()
        delete_topic_directory(self.root, name)

    def list_topics(self) -> list[str]:
        """Names of all topics, internal ones included, sorted."""
        return list_topic_names(self.root)

    def describe_topic(self, name: str) -> TopicSpec:
        """The topic's spec, with the ``log.topics`` entry that applies to it; :class:`UnknownTopicError` if none."""
        return self._open_topic(name).spec

    # -- records ----------------------------------------------------------------------

    def append(self, topic: str, partition: int, records: Sequence[Record]) -> AppendResult:
        """Append ``records`` to one partition atomically and durably; return their offsets.

        On a topic that was split or merged the records go to the open partitions covering
        their keys (:mod:`log.shards`), whichever partition is named: one atomic batch per
        partition, in order; the result is the named partition's part if it got one, else
        the first part.
        """
        opened = self._open_topic(topic)
        if opened.shards is None:
            return self._partition(topic, partition, opened).append(records)
        with opened.shards.appending() as shards:
            if shards is None:
                return self._partition(topic, partition, opened).append(records)
            shards.shard(partition)  # UnknownPartitionError, one line
            return self._append_routed(opened, topic, partition, shards, records)

    def _append_routed(
        self, opened: _OpenTopic, topic: str, named: int, shards: ShardMap, records: Sequence[Record]
    ) -> AppendResult:
        if isinstance(records, EncodedBatch):
            records = _decoded(topic, records)
        targets = shards.route_all([r.key for r in records])
        if not records or all(t == targets[0] for t in targets):
            target = targets[0] if records else shards.open_for(0)
            return self._partition(topic, target, opened).append(records)
        parts: dict[int, list[Record]] = {}
        for record, target in zip(records, targets, strict=True):
            parts.setdefault(target, []).append(record)
        results = [self._partition(topic, target, opened).append(part) for target, part in sorted(parts.items())]
        return next((r for r in results if r.partition == named), results[0])

    def read(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_records: int = READ_MAX_RECORDS,
        max_bytes: int = READ_MAX_BYTES,
    ) -> list[StoredRecord]:
        """Read records at or after ``offset`` in offset order (see :meth:`log.base.Log.read`)."""
        return self._partition(topic, partition).read(max(offset, 0), max_records, max_bytes)

    def read_columns(
        self,
        topic: str,
        partition: int,
        offset: int,
        end: int,
        *,
        max_records: int = READ_MAX_RECORDS,
        max_bytes: int = READ_MAX_BYTES,
    ) -> tuple[RecordColumns, int]:
        """The records :meth:`read` gives, those before ``end``, as Arrow columns; and the offset to go on from.

        Read ``[start, end)`` by calling again at the returned offset until it reaches ``end``
        or stays where it was (nothing more held). See :mod:`log.file.column_decoder`.
        """
        return self._partition(topic, partition).read_columns(max(offset, 0), end, max_records, max_bytes)

    def beginning_offset(self, topic: str, partition: int) -> int:
        """The lowest offset still held (the end offset when the partition is empty)."""
        part = self._partition(topic, partition)
        first = part.read(0, 1, 1)
        return first[0].offset if first else part.end_offset()

    def end_offset(self, topic: str, partition: int) -> int:
        """The offset the next appended record will get."""
        return self._partition(topic, partition).end_offset()

    def clean_offset(self, topic: str, partition: int) -> int:
        """The offset from which every record is still held (0 before the first compaction)."""
        part = self._partition(topic, partition)
        spec = self._open_topic(topic).spec
        if not spec.compacted:
            return self.beginning_offset(topic, partition)
        compacted_to = CleanerCheckpoint.load(part.directory).clean_offset
        if spec.retention_ms is None and spec.retention_bytes is None:
            return compacted_to
        return max(compacted_to, self.beginning_offset(topic, partition))

    def offset_for_time(self, topic: str, partition: int, timestamp_ms: int) -> int | None:
        """The earliest offset whose timestamp is at or after ``timestamp_ms``; ``None`` if none."""
        return self._partition(topic, partition).offset_for_time(timestamp_ms)

    # -- elastic shards (log.shards.ElasticShards) -------------------------------------

    def shard_map(self, topic: str) -> ShardMap | None:
        """The topic's partition map, or ``None`` if it was never split or merged."""
        opened = self._open_topic(topic)
        return None if opened.shards is None else opened.shards.current()

    def split_partition(self, topic: str, partition: int, *, at: int | None = None) -> ShardMap:
        """Seal ``partition`` at its end offset and create two children covering its range (``at``: the cut)."""
        opened = self._splittable(topic)
        assert opened.shards is not None
        (opened.shards.current() or ShardMap.initial(topic, opened.base_spec.partitions)).split(partition, 0, at)
        with opened.shards.changing() as current:
            shards = current or ShardMap.initial(topic, opened.base_spec.partitions)
            shards.split(partition, 0, at)  # again under the lock: ShardError before anything is written
            opened.shards.create_children([shards.count, shards.count + 1])
            with opened.shards.sealing():
                changed = shards.split(partition, self._sealed_end(topic, shards, partition), at)
                opened.shards.write(changed)
        return changed

    def merge_partitions(self, topic: str, first: int, second: int) -> ShardMap:
        """Seal two adjacent open partitions at their end offsets and create one child covering both."""
        opened = self._splittable(topic)
        assert opened.shards is not None
        (opened.shards.current() or ShardMap.initial(topic, opened.base_spec.partitions)).check_merge(first, second)
        with opened.shards.changing() as current:
            shards = current or ShardMap.initial(topic, opened.base_spec.partitions)
            shards.check_merge(first, second)  # again under the lock: ShardError before anything is written
            opened.shards.create_children([shards.count])
            with opened.shards.sealing():
                ends = {p: self._sealed_end(topic, shards, p) for p in (first, second)}
                changed = shards.merge(first, second, ends)
                opened.shards.write(changed)
        return changed

    def _splittable(self, topic: str) -> _OpenTopic:
        opened = self._open_topic(topic)
        if opened.shards is None:
            msg = f"{topic} is an internal topic: its partitions are never split or merged"
            raise ShardError(msg)
        return opened

    def _sealed_end(self, topic: str, shards: ShardMap, partition: int) -> int:
        shards.shard(partition)  # UnknownPartitionError, one line
        # Under the exclusive append lock no append is in flight: the end is final.
        return self._partition(topic, partition).end_offset()

    # -- consumer groups --------------------------------------------------------------

    def commit(self, group: str, offsets: Mapping[TopicPartition, int]) -> None:
        """Record a consumer group's next offsets to read (durable, like :meth:`append`)."""
        self._offsets.commit(group, offsets)

    def committed(self, group: str, topic: str) -> dict[int, int]:
        """The group's committed next offsets for the topic's partitions."""
        return self._offsets.committed(group, topic)

    def list_groups(self) -> list[str]:
        """Groups with members (a state file) or committed offsets, sorted."""
        return sorted(set(list_group_names(self.root)) | set(self._offsets.groups()))

    def describe_group(self, group: str) -> GroupDescription:
        """Live members, their partitions, and every partition's committed offset and lag."""
        state = GroupCoordinator(self.root, group, lambda _topic: None).state()
        committed_topics = self._offsets.groups().get(group, set())
        if state is None and not committed_topics:
            raise UnknownGroupError(group)
        now = _now_ms()
        members: list[GroupMember] = []
        owners: dict[TopicPartition, str] = {}
        topics = set(committed_topics)
        generation = None
        moving = False
        if state is not None:
            generation = state.generation
            live = {name: m for name, m in state.members.items() if m.deadline_ms >= now}
            for tp, own in state.partitions.items():
                if own.owner in live:
                    owners[tp] = own.owner
                    moving = moving or own.next is not None
            for name, m in sorted(live.items()):
                topics.update(m.topics)
                assigned = tuple(sorted(tp for tp, owner in owners.items() if owner == name))
                members.append(GroupMember(name, m.client, assigned, m.deadline_ms - now))
        status = "empty" if not members else "rebalancing" if moving else "stable"
        progress = partition_progress(self, group, topics, owners)
        return GroupDescription(group, status, generation, tuple(members), tuple(progress))

    # -- cleaning ---------------------------------------------------------------------

    def compact(self, topic: str) -> CompactionResult:
        """Run one compaction (compacted topics) and/or retention pass now."""
        result = self.clean(topic)
        assert result is not None
        return result

    def clean(
        self, topic: str, *, holds: Mapping[int, int] | None = None, only_if_due: bool = False
    ) -> CompactionResult | None:
        """One cleaning pass over the topic's partitions (:class:`log.cleaner.CleansItself`).

        ``holds``: per partition, the offset nothing at or after which is removed.
        ``only_if_due``: skip partitions where a pass could remove nothing new
        (:func:`log.file.compaction.cleaning_due`); ``None`` when every one was skipped.
        """
        spec = self._open_topic(topic).spec  # every partition, sealed ones too
        now = _now_ms()
        before_records = after_records = before_bytes = after_bytes = 0
        ran = False
        for number in range(spec.partitions):
            segments = self._partition(topic, number).segments
            hold = (holds or {}).get(number)
            if only_if_due and not cleaning_due(segments, now, hold=hold):
                continue
            done = clean_partition(segments, spec, now, hold=hold)
            ran = True
            before_records += done.records_before
            after_records += done.records_after
            before_bytes += done.bytes_before
            after_bytes += done.bytes_after
        if not ran and only_if_due:
            return None
        return CompactionResult(topic, before_records, after_records, before_bytes, after_bytes)

    def usage(self, topic: str) -> TopicUsage:
        """Bytes on disk and dirty bytes of the topic (:class:`log.cleaner.ReportsUsage`)."""
        spec = self._open_topic(topic).spec
        size = closed = dirty = 0
        for number in range(spec.partitions):
            part = partition_usage(self._partition(topic, number).segments)
            size, closed, dirty = size + part.size, closed + part.closed, dirty + part.dirty
        return TopicUsage(topic, size, closed, dirty if spec.compacted else 0)

    def close(self) -> None:
        """Release writer locks and files. Idempotent."""
        with self._lock:
            for opened in self._topics.values():
                opened.close()
            self._topics.clear()
